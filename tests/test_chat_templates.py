"""`--chat-template NAME|FILE`: the named turn formats render as their families' own templates do, a
file's template replaces the model's, and a bad name, a missing file or broken Jinja each get one line."""

from __future__ import annotations

import pytest

from specdec.errors import ConfigError, SpecdecError
from specdec.runtime.chat_templates import CHATML, GEMMA, read_chat_template
from specdec.runtime.tokenizer import _compile

CONVERSATION = [{"role": "system", "content": "Be brief."}, {"role": "user", "content": " Hi "},
                {"role": "assistant", "content": "Hello!"}, {"role": "user", "content": "Bye"}]


def render(template: str, messages: list[dict], generation_prompt: bool = True) -> str:
    return _compile(template).render(messages=messages, add_generation_prompt=generation_prompt, bos_token="<bos>",
                                     eos_token="<eos>")


def test_gemma_turns_as_gemmas_own_template_writes_them():
    """Gemma 3's template (its tokenizer_config.json) for text: the system text before the first user
    text, contents trimmed, the assistant as "model"."""
    assert render(GEMMA, CONVERSATION) == (
        "<bos><start_of_turn>user\nBe brief.\n\nHi<end_of_turn>\n<start_of_turn>model\nHello!<end_of_turn>\n"
        "<start_of_turn>user\nBye<end_of_turn>\n<start_of_turn>model\n")
    assert render(GEMMA, CONVERSATION[1:2], generation_prompt=False) == "<bos><start_of_turn>user\nHi<end_of_turn>\n"
    with pytest.raises(Exception, match="alternate"):  # control: two user turns in a row are refused, not merged
        render(GEMMA, [CONVERSATION[1], CONVERSATION[3]])


def test_chatml_turns():
    assert render(CHATML, CONVERSATION[:2]) == (
        "<|im_start|>system\nBe brief.<|im_end|>\n<|im_start|>user\n Hi <|im_end|>\n<|im_start|>assistant\n")


def test_a_file_or_a_name_and_clear_refusals(tmp_path):
    path = tmp_path / "t.jinja"
    path.write_text("{% for m in messages %}[{{ m['content'] }}]{% endfor %}")
    assert read_chat_template(str(path)) == path.read_text() and read_chat_template("gemma") == GEMMA
    with pytest.raises(ConfigError, match=r"--chat-template llama9: neither a template name \(chatml, gemma\) nor a file"):
        read_chat_template("llama9")
    path.write_text("{% for m in messages %}")
    with pytest.raises(ConfigError, match="not a valid Jinja template"):
        read_chat_template(str(path))
    assert issubclass(ConfigError, SpecdecError)  # so the command line prints one line, not a traceback
