"""The request bodies the server accepts: OpenAI's chat and text completions, plus `speculation`.

Fields are strictly typed (a string where a number belongs is an error, not converted) and unknown
fields are refused, so that nothing a client sends is silently ignored. `speculation` is this
server's extension: {"enabled": bool, "drafter": name, "gamma": int | "auto", "max_gamma": int}.
"""

from __future__ import annotations

from typing import Annotated, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator

MAX_STOP_STRINGS = 4


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)


class Speculation(_Strict):
    """Per-request control of speculative decoding."""

    enabled: bool = True  # false: plain decoding for this request
    drafter: str | None = None  # one of the server's drafters (GET /v1/models lists them), "auto", or "none"
    gamma: Annotated[int, Field(ge=1, le=16)] | Literal["auto"] | None = None  # tokens drafted per round
    max_gamma: Annotated[int, Field(ge=1, le=16)] | None = None  # the largest γ "auto" may choose


class StreamOptions(_Strict):
    include_usage: bool = False


class _Sampling(_Strict):
    model: str
    max_tokens: Annotated[int, Field(ge=1)] | None = None
    temperature: Annotated[float, Field(ge=0, le=2)] = 1.0  # OpenAI's default; 0 = greedy
    top_p: Annotated[float, Field(gt=0, le=1)] = 1.0
    top_k: Annotated[int, Field(ge=0)] = 0  # an extension (vLLM has it too): 0 = off
    seed: Annotated[int, Field(ge=-(2**63), le=2**64 - 1)] | None = None  # what torch's generators take
    stop: str | list[str] | None = None
    n: Annotated[int, Field(ge=1, le=1)] = 1  # one choice per request
    stream: bool = False
    stream_options: StreamOptions | None = None
    speculation: Speculation | None = None

    @field_validator("stop")
    @classmethod
    def _stop_strings(cls, stop):
        strings = [stop] if isinstance(stop, str) else (stop or [])
        if len(strings) > MAX_STOP_STRINGS:
            raise ValueError(f"at most {MAX_STOP_STRINGS} stop strings, got {len(strings)}")
        if any(not s for s in strings):
            raise ValueError("stop strings must not be empty")
        return strings

    @property
    def stop_strings(self) -> tuple[str, ...]:
        return tuple(self.stop or ())


class TextPart(_Strict):
    type: Literal["text"]
    text: str


class ChatMessage(_Strict):
    role: Literal["system", "developer", "user", "assistant"]
    content: str | list[TextPart]
    name: str | None = None  # refused when given: the chat template is given role and content only

    @field_validator("name")
    @classmethod
    def _refuse_name(cls, name):
        if name is not None:
            raise ValueError("not supported: the chat template is given each message's role and content only; "
                             "put the speaker's name in the content instead")
        return name

    @property
    def text(self) -> str:
        return self.content if isinstance(self.content, str) else "".join(p.text for p in self.content)


class ChatCompletionRequest(_Sampling):
    messages: Annotated[list[ChatMessage], Field(min_length=1)]
    max_completion_tokens: Annotated[int, Field(ge=1)] | None = None  # the newer name of max_tokens

    @property
    def token_limit(self) -> int | None:
        return self.max_completion_tokens if self.max_completion_tokens is not None else self.max_tokens


class CompletionRequest(_Sampling):
    prompt: str | Annotated[list[str], Field(min_length=1, max_length=1)] | Annotated[list[int], Field(min_length=1)]

    @property
    def token_limit(self) -> int | None:
        return self.max_tokens
