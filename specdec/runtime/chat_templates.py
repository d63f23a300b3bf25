"""Chat templates for model files that carry none: `--chat-template NAME` or `--chat-template FILE`.

llama.cpp's server falls back to ChatML for such a file without saying so; specdec uses a file's own
template, and where there is none asks for one by name (a turn format of a family) or as a Jinja
file, rendered in the same sandbox as a file's own (tokenizer._compile). A template given this way
replaces the file's own.
"""

from __future__ import annotations

from pathlib import Path

from specdec.errors import ConfigError

# ChatML (Qwen, SmolLM, many fine-tunes): <|im_start|>role\n … <|im_end|>\n per message.
CHATML = (r"{% for message in messages %}{{ '<|im_start|>' + message['role'] + '\n' + message['content'] + '<|im_end|>\n' }}"
          r"{% endfor %}{% if add_generation_prompt %}{{ '<|im_start|>assistant\n' }}{% endif %}")

# Gemma's turns (Gemma 1–3): the BOS token, <start_of_turn>user|model\n … <end_of_turn>\n; a system
# message goes before the first user message's text, as Gemma's own template puts it; roles alternate.
GEMMA = (r"{{ bos_token }}{% if messages and messages[0]['role'] == 'system' %}"
         r"{% set prefix = messages[0]['content'] + '\n\n' %}{% set turns = messages[1:] %}"
         r"{% else %}{% set prefix = '' %}{% set turns = messages %}{% endif %}"
         r"{% for message in turns %}"
         r"{% if (message['role'] == 'user') != (loop.index0 % 2 == 0) %}"
         r"{{ raise_exception('Gemma wants the roles to alternate user, assistant, user, …') }}{% endif %}"
         r"{{ '<start_of_turn>' + ('model' if message['role'] == 'assistant' else message['role']) + '\n'"
         r" + (prefix if loop.first else '') + message['content'] | trim + '<end_of_turn>\n' }}"
         r"{% endfor %}{% if add_generation_prompt %}{{ '<start_of_turn>model\n' }}{% endif %}")

NAMED = {"chatml": CHATML, "gemma": GEMMA}


def read_chat_template(value: str) -> str:
    """The template `--chat-template` names: one of NAMED, or a Jinja file's text (checked to compile)."""
    from jinja2.exceptions import TemplateSyntaxError

    from specdec.runtime.tokenizer import _compile

    if value in NAMED:
        return NAMED[value]
    path = Path(value).expanduser()
    if not path.is_file():
        raise ConfigError(f"--chat-template {value}: neither a template name ({', '.join(NAMED)}) nor a file; "
                          "give a name, or the path of a Jinja chat template (e.g. a model's chat_template.jinja)")
    try:
        text = path.read_text(encoding="utf-8")
        _compile(text)
    except (OSError, UnicodeDecodeError) as err:
        raise ConfigError(f"--chat-template {value}: cannot read it as text ({err})") from None
    except TemplateSyntaxError as err:
        raise ConfigError(f"--chat-template {value}: not a valid Jinja template (line {err.lineno}: {err.message})") from None
    return text
