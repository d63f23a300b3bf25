"""The OpenAI-compatible HTTP API: routes, the OpenAI error format, API keys, streaming.

    POST /v1/chat/completions, POST /v1/completions   (streaming by server-sent events, or not)
    GET /v1/models, GET /health, GET /metrics         (Prometheus text format)

Every error is an OpenAI error object {"error": {"message", "type", "param", "code"}} with a
4xx status that says what to fix (429 when the queue is full, 413 past the body bound, 415 for a
body not sent as JSON); a 500 means a bug; 503 ends the requests a shutdown's grace period did not
see finish (a stream gets an error event and [DONE]). Every response carries, beside `usage`, a
`speculation` object: what speculative decoding did for this request.

A request is checked cheaply first (model, speculation, room in the queue), then its prompt is
tokenized on a thread of its own (never on the event loop, never on the generation worker), then it
is queued. While it runs, the request watches for its client leaving and cancels its job at once.
"""

from __future__ import annotations

import asyncio
import time
from collections.abc import Callable

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.decode.engine import Engine, GenerationConfig
from specdec.errors import ContextLengthError, SpecdecError
from specdec.sampling import SamplingParams
from specdec.serve.bodies import ON_LOOP_BYTES, ApiError, parse
from specdec.serve.guard import GuardMiddleware
from specdec.serve.responses import Reply, error_response
from specdec.serve.scheduler import CacheTooLarge, ServerBroken, ServerBusy
from specdec.serve.schema import ChatCompletionRequest, CompletionRequest
from specdec.serve.service import Service

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
SHUTDOWN_MARGIN_SECONDS = 1.0  # after the grace period: for the requests it ended to send their last bytes


def busy(service: Service, message: str) -> ApiError:
    service.metrics.rejected.inc()
    return ApiError(429, message, code="server_busy", kind="rate_limit_error")


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="server_broken", kind="server_error")


def create_app(service: Service) -> FastAPI:
    docs = service.settings.api_docs
    app = FastAPI(title="specdec", description="OpenAI-compatible completions with speculative decoding",
                  lifespan=_lifespan(service), docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)
    app.add_middleware(GuardMiddleware, service=service, routes=ROUTES)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.kind)

    @app.exception_handler(StarletteHTTPException)
    async def _http(request: Request, exc: StarletteHTTPException):
        message = {404: f"no route {request.url.path}; this server has: {', '.join(ROUTES)}",
                   405: f"{request.method} is not allowed on {request.url.path}"}.get(exc.status_code, str(exc.detail))
        return error_response(exc.status_code, message, code="not_found" if exc.status_code == 404 else None)

    @app.exception_handler(Exception)
    async def _bug(request: Request, exc: Exception):
        return error_response(500, f"internal error ({type(exc).__name__}); this is a bug in specdec", kind="server_error")

    @app.get("/health")
    async def health():
        if service.scheduler.broken is not None:
            raise unavailable(f"unhealthy: {service.scheduler.broken}; restart the server")
        return {"status": "ok", "model": service.settings.model_id,
                "running": service.scheduler.running, "waiting": service.scheduler.waiting}

    @app.get("/metrics")
    async def metrics():
        return Response(service.metrics.render(), media_type=CONTENT_TYPE_LATEST)

    @app.get("/v1/models")
    async def models():
        return {"object": "list", "data": [{
            "id": service.settings.model_id, "object": "model", "created": 0, "owned_by": "specdec",
            "speculation": {"drafters": list(service.by_name), "gamma": service.settings.gamma,
                            "max_gamma": service.settings.max_gamma}}]}

    @app.post("/v1/chat/completions")
    async def chat_completions(request: Request):
        body = await _parsed(request, ChatCompletionRequest)
        tokenizer = service.target.tokenizer
        if not tokenizer.chat_template:
            raise ApiError(400, "this model has no chat template; use POST /v1/completions with a plain prompt")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in body.messages]

        def tokenize() -> list[int]:
            try:
                return tokenizer.apply_chat_template(messages)
            except SpecdecError as exc:
                raise ApiError(400, f"messages: {exc}", param="messages") from exc

        return await _respond(service, body, tokenize, request, chat=True)

    @app.post("/v1/completions")
    async def completions(request: Request):
        body = await _parsed(request, CompletionRequest)
        prompt = body.prompt[0] if isinstance(body.prompt, list) and isinstance(body.prompt[0], str) else body.prompt
        if prompt == "":
            raise ApiError(400, "prompt: empty; give some text to continue", param="prompt")
        tokenize = (lambda: service.target.tokenizer.encode(prompt)) if isinstance(prompt, str) else (lambda: prompt)
        return await _respond(service, body, tokenize, request, chat=False)

    return app


async def _parsed(request: Request, schema):
    """The request's body as `schema`: parsed on the event loop when small, on a thread when large."""
    raw = await request.body()
    content_type = request.headers.get("content-type")
    if len(raw) <= ON_LOOP_BYTES:
        return parse(raw, content_type, schema)
    return await asyncio.to_thread(parse, raw, content_type, schema)


def _lifespan(service: Service):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        yield
        service.scheduler.close()  # shutdown: cancel what is still waiting or running

    return lifespan


class GracefulServer(uvicorn.Server):
    """uvicorn serving `service`; at shutdown, the requests still in flight after `shutdown_timeout` seconds
    are ended with an error their clients can read (a stream: an error event and [DONE]; otherwise a 503)
    instead of having their connections cut."""

    def __init__(self, service: Service, host: str, port: int, shutdown_timeout: float, log_level: str = "info") -> None:
        super().__init__(uvicorn.Config(create_app(service), host=host, port=port, log_level=log_level,
                                        timeout_graceful_shutdown=shutdown_timeout + SHUTDOWN_MARGIN_SECONDS))
        self.service, self.shutdown_timeout = service, shutdown_timeout

    async def shutdown(self, sockets=None) -> None:
        asyncio.get_running_loop().call_later(self.shutdown_timeout, self.service.stop_requests)
        await super().shutdown(sockets)


def _config(service: Service, body, prompt_ids: list[int], engine: Engine, gamma, max_gamma) -> GenerationConfig:
    try:
        engine.check_prompt(prompt_ids)
    except ContextLengthError as exc:
        raise ApiError(400, str(exc), code="context_length_exceeded", param="prompt") from exc
    except SpecdecError as exc:  # empty, or token ids outside the vocabulary
        raise ApiError(400, str(exc), code="invalid_value", param="prompt") from exc
    room = service.target.max_context - len(prompt_ids)
    limit = body.token_limit
    if limit is None:
        limit = min(service.settings.default_max_tokens, room)
    elif limit > room:
        raise ApiError(400, f"max_tokens {limit} is more than the context has room for: the prompt takes {len(prompt_ids)} "
                            f"of the model's {service.target.max_context} tokens, so ask for at most {room}",
                       code="context_length_exceeded", param="max_tokens")
    sampling = SamplingParams(temperature=body.temperature, top_k=body.top_k, top_p=body.top_p, seed=body.seed)
    return GenerationConfig(max_new_tokens=limit, gamma=gamma, max_gamma=max_gamma, sampling=sampling,
                            stop=body.stop_strings)


async def _respond(service: Service, body, tokenize: Callable[[], list[int]], request: Request, chat: bool):
    """The cheap checks, then `tokenize` and the prompt's checks on a thread (a long prompt must not stall
    the streams), then the queue."""
    if body.model != service.settings.model_id:
        raise ApiError(404, f"model '{body.model}' is not served here; GET /v1/models lists: {service.settings.model_id}",
                       code="model_not_found", param="model")
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    engine, gamma, max_gamma = service.plan(body.speculation)
    try:
        service.scheduler.check_room()
    except ServerBusy as exc:
        raise busy(service, str(exc)) from None
    except ServerBroken as exc:
        raise unavailable(str(exc)) from None
    def prompt_and_config() -> tuple[list[int], GenerationConfig]:
        prompt_ids = tokenize()
        return prompt_ids, _config(service, body, prompt_ids, engine, gamma, max_gamma)

    prompt_ids, config = await asyncio.to_thread(prompt_and_config)
    try:
        largest, first = service.cache_bytes(engine, prompt_ids, config)
        job = service.scheduler.submit(engine, prompt_ids, config, cache_bytes=largest, first_bytes=first)
    except ServerBusy as exc:
        raise busy(service, str(exc)) from exc
    except ServerBroken as exc:
        raise unavailable(str(exc)) from None
    except CacheTooLarge as exc:
        mib = 1 << 20
        raise ApiError(400, f"this request's KV cache ({len(prompt_ids)} prompt tokens and up to {config.max_new_tokens} "
                            f"new ones: {exc.need / mib:.0f} MiB) is larger than all the server may hold "
                            f"({exc.budget / mib:.0f} MiB, --kv-memory); send a shorter prompt or a smaller max_tokens",
                       code="kv_memory_exceeded", param="max_tokens") from None
    run = Reply(service, job, time.perf_counter(), chat, service.settings.model_id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(run.events(request, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await run.whole(request)
