"""Tokenizer and chat template, read from a Hugging Face folder without importing transformers.

`tokenizer.json` goes to the `tokenizers` library; the chat template (from `chat_template.jinja` or
`tokenizer_config.json`) is rendered in a sandboxed Jinja environment, as transformers does.
`IncrementalDetokenizer` turns a growing list of ids into text pieces for streaming without
splitting multi-byte characters.
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path

from specdec.errors import ModelLoadError, SpecdecError


class Tokenizer:
    def __init__(self, folder: Path) -> None:
        from tokenizers import Tokenizer as FastTokenizer

        path = folder / "tokenizer.json"
        if not path.exists():
            raise ModelLoadError(f"{folder} has no tokenizer.json; a model folder needs its tokenizer")
        try:
            self._tok = FastTokenizer.from_file(str(path))
        except Exception as err:
            raise ModelLoadError(f"cannot read {path}: {err}") from None
        config_path = folder / "tokenizer_config.json"
        config = json.loads(config_path.read_text()) if config_path.exists() else {}
        self.bos_token = _token_text(config.get("bos_token"))
        self.eos_token = _token_text(config.get("eos_token"))
        template_path = folder / "chat_template.jinja"
        self.chat_template: str | None = (
            template_path.read_text() if template_path.exists() else config.get("chat_template")
        )
        if isinstance(self.chat_template, list):  # named templates: take the default one
            named = {t["name"]: t["template"] for t in self.chat_template}
            self.chat_template = named.get("default")
        self.vocab_size = self._tok.get_vocab_size(with_added_tokens=True)

    def token_id(self, text: str | None) -> int | None:
        return None if text is None else self._tok.token_to_id(text)

    def vocab(self) -> dict[str, int]:
        return self._tok.get_vocab(with_added_tokens=True)

    def encode(self, text: str, add_special_tokens: bool = True) -> list[int]:
        return self._tok.encode(text, add_special_tokens=add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Render a conversation with the model's template and encode it (no extra special tokens)."""
        if not self.chat_template:
            raise SpecdecError("this model has no chat template, so it takes plain text only: use "
                               "`specdec generate --raw PROMPT`, or /v1/completions on the server")
        text = _compile(self.chat_template).render(
            messages=messages,
            add_generation_prompt=add_generation_prompt,
            bos_token=self.bos_token or "",
            eos_token=self.eos_token or "",
        )
        return self.encode(text, add_special_tokens=False)


def _token_text(token) -> str | None:
    if isinstance(token, dict):
        return token.get("content")
    return token


def _compile(template: str):
    from jinja2.exceptions import TemplateError
    from jinja2.sandbox import ImmutableSandboxedEnvironment

    def raise_exception(message):
        raise TemplateError(message)

    def tojson(value, indent=None):
        return json.dumps(value, indent=indent, ensure_ascii=False)

    env = ImmutableSandboxedEnvironment(trim_blocks=True, lstrip_blocks=True)
    env.filters["tojson"] = tojson
    env.globals["raise_exception"] = raise_exception
    env.globals["strftime_now"] = lambda fmt: datetime.now().strftime(fmt)
    return env.from_string(template)


class IncrementalDetokenizer:
    """Feed ids as they are committed; get back the new text each time (possibly empty).

    Decodes the whole sequence and emits the new suffix, holding back text while it ends in an
    incomplete UTF-8 character (shown by the replacement character).
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.emitted = ""

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        text = self.tokenizer.decode(self.ids)
        if text.endswith("\ufffd"):
            return ""
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece

    def flush(self) -> str:
        text = self.tokenizer.decode(self.ids)
        piece = text[len(self.emitted):] if text.startswith(self.emitted) else ""
        self.emitted = text
        return piece
