"""Tokenizer and chat template, read from a Hugging Face folder without importing transformers.

`tokenizer.json` goes to the `tokenizers` library; the chat template (from `chat_template.jinja` or
`tokenizer_config.json`) is rendered in a sandboxed Jinja environment, as transformers does.
`IncrementalDetokenizer` turns a growing list of ids into text pieces for streaming without
splitting multi-byte characters.
"""

from __future__ import annotations

import json
import re
from datetime import datetime
from functools import cached_property
from pathlib import Path

from specdec.errors import ModelLoadError, SpecdecError

STANDIN_BASE = 0xF0000  # Supplementary Private Use Area-A: stand-ins for special-token text inside messages


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
        return _encoding(self._tok, text, add_special_tokens).ids

    def decode(self, ids: list[int], skip_special_tokens: bool = True) -> str:
        return self._tok.decode(ids, skip_special_tokens=skip_special_tokens)

    def apply_chat_template(self, messages: list[dict[str, str]], add_generation_prompt: bool = True) -> list[int]:
        """Render a conversation with the model's template and encode it (no extra special tokens).

        Only the template's own markers become special tokens: special-token text inside a message
        (a user writing "<|im_end|><|im_start|>system") is encoded as plain text. Such text is hidden
        behind stand-in characters while the template renders, so that the special tokens found in
        the rendered text are the template's; the text between them is encoded with special tokens
        off. Messages without such text are encoded whole, exactly as transformers does.
        """
        if not self.chat_template:
            raise SpecdecError("this model has no chat template, so it takes plain text only: use "
                               "`specdec generate --raw PROMPT`, or /v1/completions on the server")
        special = self._special_text
        quoted = sorted({t for m in messages for t in special.findall(m["content"])}) if special else []
        if not quoted:
            return self.encode(self._render(messages, add_generation_prompt), add_special_tokens=False)
        standin = {token: chr(STANDIN_BASE + i) for i, token in enumerate(quoted)}
        hidden = [{**m, "content": special.sub(lambda match: standin[match.group()], m["content"])} for m in messages]
        text = self._render(hidden, add_generation_prompt)
        restore = {ord(char): token for token, char in standin.items()}
        ids, start = [], 0
        encoding = _encoding(self._tok, text, add_special_tokens=False)
        for token_id, (begin, end) in zip(encoding.ids, encoding.offsets):
            if token_id in self._special_tokens:
                ids += self._plain_ids(text[start:begin].translate(restore)) + [token_id]
                start = end
        return ids + self._plain_ids(text[start:].translate(restore))

    def _render(self, messages: list[dict[str, str]], add_generation_prompt: bool) -> str:
        """The template's text; a template that refuses the messages (`raise_exception`, e.g. roles
        out of the order it wants) or fails on them raises a SpecdecError saying so."""
        from jinja2.exceptions import TemplateError

        try:
            return _compile(self.chat_template).render(
                messages=messages,
                add_generation_prompt=add_generation_prompt,
                bos_token=self.bos_token or "",
                eos_token=self.eos_token or "",
            )
        except TemplateError as exc:
            raise SpecdecError(f"the model's chat template refused these messages: {exc}") from None

    @cached_property
    def _special_tokens(self) -> dict[int, str]:
        return {i: token.content for i, token in self._tok.get_added_tokens_decoder().items() if token.special}

    @cached_property
    def _special_text(self) -> re.Pattern | None:
        """Matches the text of any special token (the longest first); None when there are none."""
        texts = sorted(set(self._special_tokens.values()), key=len, reverse=True)
        return re.compile("|".join(map(re.escape, texts))) if texts else None

    @cached_property
    def _plain(self):
        """A copy of the tokenizer that encodes special-token text as ordinary text."""
        from tokenizers import Tokenizer as FastTokenizer

        plain = FastTokenizer.from_str(self._tok.to_str())
        plain.encode_special_tokens = True
        return plain

    def _plain_ids(self, text: str) -> list[int]:
        return _encoding(self._plain, text, add_special_tokens=False).ids if text else []


def _encoding(tok, text: str, add_special_tokens: bool):
    """`tok.encode(text)`, but with the GIL released while it works (encode_batch releases it, encode does
    not), so that a long prompt encoded on one thread does not stall the others (a server's event loop)."""
    return tok.encode_batch([text], add_special_tokens=add_special_tokens)[0]


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
    """Feed ids as they are committed; get back the new text each time (possibly empty), with constant
    work per token however long the output grows.

    Each push decodes a short window, the ids since `prefix` (a few tokens back), twice: without and
    with the ids not yet shown (from `read` on), and emits the difference; the window then moves on.
    Decoding from the same first id both times cancels what a decoder does at a text's start (a
    SentencePiece leading space), so the pieces add up to the decoding of all ids. Text that ends in
    an incomplete UTF-8 character (the replacement character) is held back until it completes.
    """

    def __init__(self, tokenizer: Tokenizer) -> None:
        self.tokenizer = tokenizer
        self.ids: list[int] = []
        self.prefix = 0  # the window's first id
        self.read = 0  # ids before this one are shown

    def push(self, new_ids: list[int]) -> str:
        self.ids.extend(new_ids)
        return self._advance(final=False)

    def flush(self) -> str:
        """Whatever is still held back (an incomplete character at the end: as the decoder renders it)."""
        return self._advance(final=True)

    def _advance(self, final: bool) -> str:
        shown = self.tokenizer.decode(self.ids[self.prefix:self.read])
        text = self.tokenizer.decode(self.ids[self.prefix:])
        if len(text) <= len(shown) or (text.endswith("\ufffd") and not final) or not text.startswith(shown):
            return ""
        self.prefix, self.read = self.read, len(self.ids)
        return text[len(shown):]
