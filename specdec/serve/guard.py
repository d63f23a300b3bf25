"""The guard in front of every route (pure ASGI, so streams pass through untouched): the API key
(constant-time compare; /health is open), the Content-Encoding (only identity), the bound on the
body (by its Content-Length, or as it arrives), and the request counter by route and status."""

from __future__ import annotations

import hmac

from specdec.serve.responses import error_response
from specdec.serve.service import Service


class GuardMiddleware:
    """API key on every route but /health, the bound on request bodies, and the request counter by route and
    status (pure ASGI: streams pass through)."""

    def __init__(self, app, service: Service, routes: tuple[str, ...]) -> None:
        self.app = app
        self.service = service
        self.routes = routes  # counted by name; any other path as "other"

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in self.routes else "other"
        status = {"code": 500}

        async def counting_send(message):
            if message["type"] == "http.response.start":
                status["code"] = message["status"]
            await send(message)

        try:
            key = self.service.settings.api_key
            if key and scope["path"] != "/health" and not _key_matches(scope, key):
                response = error_response(401, "missing or wrong API key: send the header 'Authorization: Bearer KEY' "
                                               "with the key the server was started with", code="invalid_api_key")
                return await response(scope, receive, counting_send)
            encoding = dict(scope.get("headers") or []).get(b"content-encoding", b"identity").decode("latin-1")
            if encoding.strip().lower() != "identity":
                response = error_response(415, f"the request body is sent with Content-Encoding: {encoding}, which this "
                                               "server does not decode; send it uncompressed", code="unsupported_encoding")
                return await response(scope, receive, counting_send)
            limit = self.service.max_body_bytes
            body = await _read_body(scope, receive, limit)
            if body is None:
                response = error_response(413, f"the request body is larger than this server takes ({limit} bytes); "
                                               "send a shorter prompt, or start the server with a larger --max-body-bytes",
                                          code="request_too_large")
                return await response(scope, receive, counting_send)
            return await self.app(scope, _replay(body, receive), counting_send)
        finally:
            self.service.metrics.requests.labels(route, str(status["code"])).inc()


async def _read_body(scope, receive, limit: int) -> list[dict] | None:
    """The request body's messages, or None when it is over `limit` bytes: by its Content-Length, or as it comes."""
    declared = dict(scope.get("headers") or []).get(b"content-length", b"")
    if declared.isdigit() and int(declared) > limit:
        return None
    messages, size = [], 0
    while not messages or messages[-1].get("more_body"):
        messages.append(await receive())
        size += len(messages[-1].get("body", b""))
        if size > limit:
            return None
    return messages


def _replay(messages: list[dict], receive):
    """A `receive` that hands out the body already read, then waits on the client (for its disconnect)."""
    async def replayed():
        return messages.pop(0) if messages else await receive()

    return replayed


def _key_matches(scope, key: str) -> bool:
    header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())
