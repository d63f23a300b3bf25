"""Request bodies: bytes → a validated request, or an `ApiError` that says what was wrong.

`parse` is plain, blocking Python: the routes run it on a worker thread for any body larger than
`ON_LOOP_BYTES`, so that a large body (half a million token ids, a long string) never holds the
event loop that every stream shares. The checks, in order: the Content-Type is JSON (415), the bytes
are UTF-8 (400 naming the byte), they parse as JSON (400: where the syntax breaks, a number past
Python's digit limit, nesting too deep), the value is an object of the route's schema (`schema.py`;
400 with `param` in the API's own field names), and every string is Unicode text (no lone
surrogates, which JSON's \\ud800 escapes can produce and no tokenizer takes).
"""

from __future__ import annotations

import json
import re

from pydantic import BaseModel, ValidationError

from specdec.terminal import plural

ON_LOOP_BYTES = 64 << 10  # bodies up to this size are parsed on the event loop (well under a millisecond)
SURROGATE_ESCAPE = re.compile(r"\\u[dD][89a-fA-F]")
TYPE_TAGS = {"str", "int", "float", "bool", "list", "dict", "none"}  # union members pydantic names in a location


class ApiError(Exception):
    """An error answered as an OpenAI error object with `status`."""

    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind


def error_body(message: str, code: str | None = None, param: str | None = None, kind: str = "invalid_request_error") -> dict:
    return {"error": {"message": message, "type": kind, "param": param, "code": code}}


def is_json(content_type: str | None) -> bool:
    media = (content_type or "").split(";")[0].strip().lower()
    return media == "application/json" or (media.startswith("application/") and media.endswith("+json"))


def parse(raw: bytes, content_type: str | None, schema: type[BaseModel]) -> BaseModel:
    """The request in `raw`, validated against `schema`; raises ApiError (415 or 400)."""
    if not is_json(content_type):
        raise ApiError(415, "the request body must be JSON: send Content-Type: application/json (this request's "
                            f"Content-Type is {content_type or 'missing'})", code="unsupported_media_type")
    try:
        text = raw.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise ApiError(400, f"the request body is not UTF-8 text (byte 0x{raw[exc.start]:02x} at offset {exc.start}); "
                            "send JSON encoded as UTF-8", code="invalid_encoding") from None
    try:
        value = json.loads(text)
    except json.JSONDecodeError as exc:
        raise ApiError(400, f"the request body is not valid JSON ({exc.msg} at line {exc.lineno}, column {exc.colno})",
                       code="invalid_json") from None
    except RecursionError:
        raise ApiError(400, "the request body is not valid JSON here: it is nested too deeply; send a flatter body",
                       code="invalid_json") from None
    except ValueError as exc:  # Python's bound on the digits of an integer
        raise ApiError(400, f"the request body holds a number too long to read ({exc}); send numbers of at most "
                            "a few dozen digits", code="invalid_json") from None
    if not isinstance(value, dict):
        raise ApiError(400, f"the request body must be a JSON object, not {type(value).__name__}", code="invalid_json")
    try:
        request = schema.model_validate(value)
    except ValidationError as exc:
        raise validation_error(exc) from None
    if SURROGATE_ESCAPE.search(text):  # only a \\uD800-\\uDFFF escape can put a lone surrogate in a UTF-8 body
        refuse_invalid_text(value)
    return request


def field_path(loc: tuple) -> str | None:
    """A pydantic error location in the API's field names: list indices kept, the names pydantic gives
    union members and constrained types ('str', 'constrained-int', 'list[int]', ...) dropped."""
    parts = [str(part) for part in loc if isinstance(part, int) or
             (re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", str(part)) and str(part) not in TYPE_TAGS)]
    return ".".join(parts) or None


def validation_error(exc: ValidationError) -> ApiError:
    """The first problem of a failed validation, named by its field; the count of the others."""
    errors = exc.errors()
    first = errors[0]
    param = field_path(first.get("loc", ()))
    kind = first.get("type")
    if kind == "extra_forbidden":
        message, code = f"{param}: unknown field; this server does not accept it (see docs/SERVER.md for the fields it takes)", "unknown_field"
    elif kind == "missing":
        message, code = f"{param}: required", "missing_field"
    elif kind == "value_error":
        message, code = f"{param}: {first['ctx']['error']}", "invalid_value"
    else:
        message, code = f"{param or 'body'}: {first.get('msg')}", "invalid_value"
    others = len({field_path(e.get("loc", ())) for e in errors[1:]} - {param})  # a union's members are one field
    if others:
        message += f" (and {plural(others, 'more field')} with problems)"
    return ApiError(400, message, code=code, param=param)


def refuse_invalid_text(value, path: str = "") -> None:
    """Refuse a string that is not Unicode text anywhere in a request body: JSON's "\\ud800" escape decodes
    to a lone surrogate, which no tokenizer and no UTF-8 encoder takes."""
    if isinstance(value, str):
        try:
            value.encode("utf-8")
        except UnicodeEncodeError as exc:
            raise ApiError(400, f"{path}: not valid Unicode text: lone surrogate U+{ord(value[exc.start]):04X} at "
                                f"character {exc.start}; send UTF-8 text", param=path, code="invalid_value") from None
    elif isinstance(value, dict):
        for key, item in value.items():
            refuse_invalid_text(item, f"{path}.{key}" if path else key)
    elif isinstance(value, list):
        for index, item in enumerate(value):
            refuse_invalid_text(item, f"{path}.{index}")
