"""The OpenAI-compatible HTTP API: routes, the OpenAI error format, API keys, streaming.

    POST /v1/chat/completions, POST /v1/completions   (streaming by server-sent events, or not)
    GET /v1/models, GET /health, GET /metrics         (Prometheus text format)

Every error is an OpenAI error object {"error": {"message", "type", "param", "code"}} with a 4xx
status that says what to fix (429 when the queue is full); a 500 means a bug. Every response
carries, beside `usage`, a `speculation` object: what speculative decoding did for this request.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator
from dataclasses import dataclass, field

from fastapi import FastAPI, Request
from fastapi.exceptions import RequestValidationError
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.drafters.base import Drafter
from specdec.engine import AUTO, Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.runtime.loading import LanguageModel
from specdec.sampling import SamplingParams
from specdec.serve.metrics import ServerMetrics
from specdec.serve.scheduler import Job, Scheduler, ServerBusy, Update
from specdec.serve.schema import ChatCompletionRequest, CompletionRequest, Speculation
from specdec.stats import GenerationStats

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
DISCONNECT_POLL_SECONDS = 0.5


@dataclass
class ServeSettings:
    model_id: str
    api_key: str | None = None
    max_pending: int = 16  # requests running or waiting; past it, 429
    default_max_tokens: int = 256  # when a request gives no max_tokens (capped by the context's room)
    gamma: int | str = AUTO  # the default when a request says nothing
    max_gamma: int = 8


RETRY_AFTER_SECONDS = 1  # what a 429 tells the client to wait


class ApiError(Exception):
    def __init__(self, status: int, message: str, code: str | None = None, param: str | None = None,
                 kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.code, self.param, self.kind = status, message, code, param, kind


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 429 else None
    return JSONResponse({"error": {"message": message, "type": kind, "param": param, "code": code}}, status_code=status,
                        headers=headers)


@dataclass
class Service:
    """The loaded target and drafters, an engine per drafter choice, the line of requests, the metrics."""

    target: LanguageModel
    drafters: list[Drafter]
    settings: ServeSettings
    metrics: ServerMetrics = field(default_factory=ServerMetrics)
    scheduler: Scheduler | None = None  # made from settings.max_pending when not given
    _engines: dict[tuple[str, ...], Engine] = field(default_factory=dict)

    def __post_init__(self) -> None:
        if self.scheduler is None:
            self.scheduler = Scheduler(self.settings.max_pending, on_change=self.metrics.queue)
        self.by_name = {d.name: d for d in self.drafters}
        self.default = Engine(self.target, self.drafters)
        self._engines[tuple(self.by_name)] = self.default

    def prepare(self) -> None:
        """Measure (or read) the cost model now, so that no request pays for it."""
        if self.drafters:
            self.default.costs(self.settings.max_gamma)

    def engine(self, names: tuple[str, ...]) -> Engine:
        if names not in self._engines:
            self._engines[names] = Engine(self.target, [self.by_name[n] for n in names], cost_model=self.default.cost_model)
        return self._engines[names]

    def plan(self, spec: Speculation | None) -> tuple[Engine, int | str, int]:
        """A request's speculation settings → (engine, γ, max γ), refusing what cannot be honoured."""
        spec = spec or Speculation()
        gamma = spec.gamma if spec.gamma is not None else self.settings.gamma
        max_gamma = spec.max_gamma if spec.max_gamma is not None else self.settings.max_gamma
        if not spec.enabled or spec.drafter == "none":
            if spec.gamma is not None or (spec.drafter not in (None, "none")):
                raise ApiError(400, "speculation.enabled is false: leave out drafter and gamma", param="speculation")
            return self.engine(()), 1, max_gamma
        if spec.drafter in (None, "auto"):
            names = tuple(self.by_name)
        elif spec.drafter in self.by_name:
            names = (spec.drafter,)
        else:
            raise ApiError(400, f"speculation.drafter '{spec.drafter}' is not loaded on this server; choose one of: "
                                f"{', '.join(['auto', 'none', *self.by_name])} (start the server with --drafter to load others)",
                           param="speculation.drafter")
        if not names and spec.gamma is not None:
            raise ApiError(400, "this server runs without a drafter: leave out speculation.gamma", param="speculation.gamma")
        # a γ past the prepared cost curve is measured by the engine on the worker thread, never here
        return self.engine(names), gamma, max_gamma


def speculation_report(stats: GenerationStats) -> dict:
    return {"drafter": stats.drafter, "target_passes": stats.target_passes, "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted, "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position]}


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


def _validation_message(exc: RequestValidationError) -> tuple[str, str | None]:
    errors = exc.errors()
    first = errors[0]
    loc = [str(part) for part in first.get("loc", ()) if part != "body"]
    param = ".".join(loc) or None
    if first.get("type") == "json_invalid":
        return f"the request body is not valid JSON ({first.get('ctx', {}).get('error', first.get('msg'))})", None
    if first.get("type") == "missing" and not loc:
        return "the request body must be a JSON object", None
    if first.get("type") == "extra_forbidden":
        message = f"{param}: unknown field; this server does not accept it (see docs/SERVER.md for the fields it takes)"
    else:
        message = f"{param or 'body'}: {first.get('msg')}"
    if len(errors) > 1:
        message += f" (and {len(errors) - 1} more problem{'s' if len(errors) > 2 else ''})"
    return message, param


class GuardMiddleware:
    """API key on every route but /health, and the request counter by route and status (pure ASGI: streams pass through)."""

    def __init__(self, app, service: Service) -> None:
        self.app = app
        self.service = service

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        route = scope["path"] if scope["path"] in ROUTES else "other"
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
            return await self.app(scope, receive, counting_send)
        finally:
            self.service.metrics.requests.labels(route, str(status["code"])).inc()


def _key_matches(scope, key: str) -> bool:
    header = dict(scope.get("headers") or []).get(b"authorization", b"").decode("latin-1")
    scheme, _, given = header.partition(" ")
    return scheme.lower() == "bearer" and hmac.compare_digest(given.strip().encode(), key.encode())


def create_app(service: Service) -> FastAPI:
    app = FastAPI(title="specdec", description="OpenAI-compatible completions with speculative decoding",
                  lifespan=_lifespan(service))
    app.add_middleware(GuardMiddleware, service=service)

    @app.exception_handler(ApiError)
    async def _api_error(request: Request, exc: ApiError):
        return error_response(exc.status, exc.message, exc.code, exc.param, exc.kind)

    @app.exception_handler(RequestValidationError)
    async def _invalid(request: Request, exc: RequestValidationError):
        message, param = _validation_message(exc)
        return error_response(400, message, code="invalid_request", param=param)

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
    async def chat_completions(body: ChatCompletionRequest, request: Request):
        tokenizer = service.target.tokenizer
        if not tokenizer.chat_template:
            raise ApiError(400, "this model has no chat template; use POST /v1/completions with a plain prompt")
        messages = [{"role": "system" if m.role == "developer" else m.role, "content": m.text} for m in body.messages]
        try:
            prompt_ids = tokenizer.apply_chat_template(messages)
        except SpecdecError as exc:
            raise ApiError(400, f"messages: {exc}", param="messages") from exc
        return await _respond(service, body, prompt_ids, request, chat=True)

    @app.post("/v1/completions")
    async def completions(body: CompletionRequest, request: Request):
        prompt = body.prompt[0] if isinstance(body.prompt, list) and isinstance(body.prompt[0], str) else body.prompt
        if isinstance(prompt, str):
            if not prompt:
                raise ApiError(400, "prompt: empty; give some text to continue", param="prompt")
            prompt_ids = service.target.tokenizer.encode(prompt)
        else:
            prompt_ids = prompt
        return await _respond(service, body, prompt_ids, request, chat=False)

    return app


def _lifespan(service: Service):
    from contextlib import asynccontextmanager

    @asynccontextmanager
    async def lifespan(app):
        yield
        service.scheduler.close()  # shutdown: cancel what is still waiting or running

    return lifespan


def _config(service: Service, body, prompt_ids: list[int], engine: Engine, gamma, max_gamma) -> GenerationConfig:
    try:
        engine.check_prompt(prompt_ids)
    except SpecdecError as exc:
        raise ApiError(400, str(exc), code="context_length_exceeded", param="prompt") from exc
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


async def _respond(service: Service, body, prompt_ids: list[int], request: Request, chat: bool):
    if body.model != service.settings.model_id:
        raise ApiError(404, f"model '{body.model}' is not served here; GET /v1/models lists: {service.settings.model_id}",
                       code="model_not_found", param="model")
    if body.stream_options is not None and not body.stream:
        raise ApiError(400, "stream_options is only allowed with stream: true", param="stream_options")
    engine, gamma, max_gamma = service.plan(body.speculation)
    config = _config(service, body, prompt_ids, engine, gamma, max_gamma)
    try:
        job = service.scheduler.submit(engine, prompt_ids, config)
    except ServerBusy as exc:
        service.metrics.rejected.inc()
        raise ApiError(429, str(exc), code="server_busy", kind="rate_limit_error") from exc
    run = _Run(service, job, time.perf_counter(), chat, service.settings.model_id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(run.events(include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await run.whole(request)


class _Run:
    """One admitted request: reads the worker's updates and shapes them as OpenAI responses."""

    def __init__(self, service: Service, job: Job, admitted: float, chat: bool, model: str) -> None:
        self.service, self.job, self.admitted, self.chat, self.model = service, job, admitted, chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.first_token_at: float | None = None
        self.finished = False

    async def updates(self, request: Request | None = None) -> AsyncIterator[Update]:
        """The worker's updates until the last; cancels the job if the reader stops early or the client leaves."""
        try:
            while True:
                try:
                    update = await asyncio.wait_for(self.job.updates.get(), DISCONNECT_POLL_SECONDS)
                except TimeoutError:
                    if request is not None and await request.is_disconnected():
                        return
                    continue
                if update.pieces and self.first_token_at is None:
                    self.first_token_at = time.perf_counter()
                if update.stats is not None:
                    self.finished = True
                    now = time.perf_counter()
                    self.service.metrics.finished(update.stats, now - self.admitted,
                                                  None if self.first_token_at is None else self.first_token_at - self.admitted)
                if update.error:
                    self.finished = True
                yield update
                if self.finished:
                    return
        finally:
            if not self.finished:
                self.service.scheduler.cancel(self.job)
                self.service.metrics.cancelled.inc()

    async def whole(self, request: Request) -> JSONResponse:
        texts, stats = [], None
        async for update in self.updates(request):
            if update.error:
                raise ApiError(400 if update.user_error else 500, update.error,
                               kind="invalid_request_error" if update.user_error else "server_error")
            texts.append("".join(p.text for p in update.pieces))
            stats = update.stats or stats
        if stats is None:  # the client went away; nobody reads this
            return error_response(499, "the client closed the connection")
        text = "".join(texts)
        choice = ({"index": 0, "message": {"role": "assistant", "content": text}} if self.chat
                  else {"index": 0, "text": text, "logprobs": None})
        choice["finish_reason"] = stats.finish_reason
        return JSONResponse({"id": self.id, "object": "chat.completion" if self.chat else "text_completion",
                             "created": self.created, "model": self.model, "choices": [choice],
                             "usage": usage(stats), "speculation": speculation_report(stats)})

    def _event(self, choices: list[dict], **extra) -> str:
        payload = {"id": self.id, "object": "chat.completion.chunk" if self.chat else "text_completion",
                   "created": self.created, "model": self.model, "choices": choices, **extra}
        return f"data: {json.dumps(payload)}\n\n"

    def _chunk(self, text: str | None, finish_reason: str | None = None, first: bool = False, **extra) -> str:
        if self.chat:
            delta = {"role": "assistant", "content": ""} if first else ({"content": text} if text is not None else {})
            choice = {"index": 0, "delta": delta, "finish_reason": finish_reason}
        else:
            choice = {"index": 0, "text": text or "", "logprobs": None, "finish_reason": finish_reason}
        return self._event([choice], **extra)

    async def events(self, include_usage: bool) -> AsyncIterator[str]:
        if self.chat:
            yield self._chunk(None, first=True)
        async for update in self.updates():
            if update.error:
                error = {"message": update.error, "type": "invalid_request_error" if update.user_error else "server_error"}
                yield f"data: {json.dumps({'error': error})}\n\n"
                break
            text = "".join(p.text for p in update.pieces)
            if text:
                yield self._chunk(text)
            if update.stats is not None:
                yield self._chunk(None, update.stats.finish_reason, speculation=speculation_report(update.stats))
                if include_usage:
                    yield self._event([], usage=usage(update.stats))
        yield "data: [DONE]\n\n"
