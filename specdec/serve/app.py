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
import hmac
import json
import time
import uuid
from collections.abc import AsyncIterator, Callable
from dataclasses import dataclass, field

import uvicorn
from fastapi import FastAPI, Request
from fastapi.responses import JSONResponse, Response, StreamingResponse
from prometheus_client import CONTENT_TYPE_LATEST
from starlette.exceptions import HTTPException as StarletteHTTPException

from specdec.drafters.base import Drafter
from specdec.engine import AUTO, Engine, GenerationConfig
from specdec.errors import ContextLengthError, SpecdecError
from specdec.runtime.loading import LanguageModel
from specdec.sampling import SamplingParams
from specdec.serve.bodies import ON_LOOP_BYTES, ApiError, error_body, parse
from specdec.serve.memory import cache_bytes_per_slot, default_budget
from specdec.serve.metrics import ServerMetrics
from specdec.batch import cache_slots, row_max_len
from specdec.cost_model import BATCH_SIZES, best_batch
from specdec.drafters.suffix import SuffixDrafter
from specdec.serve.scheduler import CacheTooLarge, Job, Scheduler, ServerBroken, ServerBusy, Update
from specdec.serve.schema import ChatCompletionRequest, CompletionRequest, Speculation
from specdec.stats import GenerationStats

ROUTES = ("/v1/chat/completions", "/v1/completions", "/v1/models", "/health", "/metrics")
MIN_BODY_BYTES = 1 << 20
BODY_BYTES_PER_CONTEXT_TOKEN = 32  # a prompt that fills the context, as JSON text or token ids, with room to spare
SHUTDOWN_MARGIN_SECONDS = 1.0  # after the grace period: for the requests it ended to send their last bytes


@dataclass
class ServeSettings:
    model_id: str
    api_key: str | None = None
    max_pending: int = 16  # requests running or waiting; past it, 429
    default_max_tokens: int = 256  # when a request gives no max_tokens (capped by the context's room)
    gamma: int | str = AUTO  # the default when a request says nothing
    max_gamma: int = 8
    max_body_bytes: int | None = None  # past it, 413; None: BODY_BYTES_PER_CONTEXT_TOKEN × context, at least 1 MiB
    max_batch: int | None = None  # requests decoded together; None: chosen from the measured costs (`best_batch`)
    share_learning: bool = False  # drafters that learn from outputs (suffix) learn from every client's: off by default
    kv_memory: int | None = None  # bytes the rows' KV caches may hold together; None: memory.default_budget at start
    api_docs: bool = False  # serve /docs, /redoc and /openapi.json (FastAPI's pages; /docs loads its scripts from a CDN)


RETRY_AFTER_SECONDS = 1  # what a 429 tells the client to wait


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 429 else None
    return JSONResponse(error_body(message, code, param, kind), status_code=status, headers=headers)


def busy(service: Service, message: str) -> ApiError:
    service.metrics.rejected.inc()
    return ApiError(429, message, code="server_busy", kind="rate_limit_error")


def unavailable(message: str) -> ApiError:
    return ApiError(503, message, code="server_broken", kind="server_error")


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
            self.scheduler = Scheduler(self.settings.max_pending, on_change=self.metrics.queue,
                                       max_batch=self.settings.max_batch or 1, on_round=self.metrics.round)
        if not self.settings.share_learning:  # one client's text must not reach another's drafts
            for drafter in self.drafters:
                if isinstance(drafter, SuffixDrafter):
                    drafter.learn_outputs = False
        self.by_name = {d.name: d for d in self.drafters}
        self.default = Engine(self.target, self.drafters)
        self._engines[tuple(self.by_name)] = self.default
        self.max_body_bytes = (self.settings.max_body_bytes if self.settings.max_body_bytes is not None
                               else max(MIN_BODY_BYTES, BODY_BYTES_PER_CONTEXT_TOKEN * self.target.max_context))
        self.stopping = asyncio.Event()  # set when a shutdown's grace period is over
        self.slot_bytes = cache_bytes_per_slot(self.target.net)  # one token's keys and values, every layer
        self.prepared = False  # `prepare` ran: the engines measure nothing more

    def stop_requests(self) -> None:
        """The shutdown's grace period is over: end the requests in flight with an error their clients can read."""
        self.stopping.set()

    def prepare(self) -> None:
        """Measure (or read) the cost model now, so that no request pays for it, and choose the batch
        bound from it when the settings leave it open. From then on nothing is measured while serving:
        requests are held to the prepared bounds (`plan`), and an engine that would still need a cost
        refuses the request instead of pausing every stream to measure it."""
        if self.drafters or self.settings.max_batch is None:
            costs = self.default.costs(self.settings.max_gamma, max_batch=self.settings.max_batch or max(BATCH_SIZES))
            self.scheduler.max_batch = self.settings.max_batch or best_batch(costs)
        budget = self.settings.kv_memory if self.settings.kv_memory is not None else default_budget(self.target.net)
        self.scheduler.memory_budget = budget
        self.prepared = True
        for engine in self._engines.values():
            engine.may_measure = False

    def cache_bytes(self, engine: Engine, prompt_ids: list[int], config: GenerationConfig) -> int:
        """The KV cache a request's row will hold (as `Row` allocates it)."""
        max_len = row_max_len(len(prompt_ids), config.max_new_tokens, self.target.max_context)
        return cache_slots(max_len, engine.drafters) * self.slot_bytes

    def rows_that_fit(self, tokens: int) -> int | None:
        """How many rows of `tokens` tokens each fit the KV budget at once (None: no budget)."""
        budget = self.scheduler.memory_budget
        return None if budget is None else budget // (cache_slots(tokens, self.drafters) * self.slot_bytes)

    def engine(self, names: tuple[str, ...]) -> Engine:
        if names not in self._engines:
            engine = Engine(self.target, [self.by_name[n] for n in names], cost_model=self.default.cost_model)
            engine.may_measure = not self.prepared
            self._engines[names] = engine
        return self._engines[names]

    def plan(self, spec: Speculation | None) -> tuple[Engine, int | str, int]:
        """A request's speculation settings → (engine, γ, max γ), refusing what cannot be honoured."""
        spec = spec or Speculation()
        gamma = spec.gamma if spec.gamma is not None else self.settings.gamma
        max_gamma = spec.max_gamma if spec.max_gamma is not None else self.settings.max_gamma
        bound = self.settings.max_gamma  # what the server measured its costs for at start
        for name, value in (("gamma", spec.gamma), ("max_gamma", spec.max_gamma)):
            if isinstance(value, int) and value > bound:
                raise ApiError(400, f"speculation.{name} {value} is more than this server's bound of {bound} draft "
                                    f"tokens per round (its --max-gamma); send at most {bound}",
                               param=f"speculation.{name}")
        if not spec.enabled or spec.drafter == "none":
            if spec.gamma is not None or spec.max_gamma is not None or (spec.drafter not in (None, "none")):
                raise ApiError(400, "speculation.enabled is false: leave out drafter, gamma and max_gamma", param="speculation")
            return self.engine(()), 1, max_gamma
        if spec.drafter in (None, "auto"):
            names = tuple(self.by_name)
        elif spec.drafter in self.by_name:
            names = (spec.drafter,)
        else:
            raise ApiError(400, f"speculation.drafter '{spec.drafter}' is not loaded on this server; choose one of: "
                                f"{', '.join(['auto', 'none', *self.by_name])} (start the server with --drafter to load others)",
                           param="speculation.drafter")
        if not names and (spec.gamma is not None or spec.max_gamma is not None):
            raise ApiError(400, "this server runs without a drafter: leave out speculation.gamma and max_gamma",
                           param="speculation")
        if spec.max_gamma is not None and gamma != AUTO:
            source = "" if spec.gamma is not None else ", the server's default"
            raise ApiError(400, f"speculation.max_gamma only applies with gamma 'auto', and this request's gamma is "
                                f"{gamma}{source}: leave max_gamma out, or send gamma 'auto'", param="speculation.max_gamma")
        return self.engine(names), gamma, max_gamma


def speculation_report(stats: GenerationStats) -> dict:
    return {"drafter": stats.drafter, "target_passes": stats.target_passes, "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted, "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position]}


def usage(stats: GenerationStats) -> dict:
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens}


class GuardMiddleware:
    """API key on every route but /health, the bound on request bodies, and the request counter by route and
    status (pure ASGI: streams pass through)."""

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


def create_app(service: Service) -> FastAPI:
    docs = service.settings.api_docs
    app = FastAPI(title="specdec", description="OpenAI-compatible completions with speculative decoding",
                  lifespan=_lifespan(service), docs_url="/docs" if docs else None,
                  redoc_url="/redoc" if docs else None, openapi_url="/openapi.json" if docs else None)
    app.add_middleware(GuardMiddleware, service=service)

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
        job = service.scheduler.submit(engine, prompt_ids, config, cache_bytes=service.cache_bytes(engine, prompt_ids, config))
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
    run = _Run(service, job, time.perf_counter(), chat, service.settings.model_id)
    if body.stream:
        include_usage = bool(body.stream_options and body.stream_options.include_usage)
        return StreamingResponse(run.events(request, include_usage), media_type="text/event-stream",
                                 headers={"Cache-Control": "no-cache"})
    return await run.whole(request)


async def _client_left(request: Request) -> None:
    """Returns when the client has closed the connection (its body was read already, so receive waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class _Run:
    """One admitted request: reads the worker's updates and shapes them as OpenAI responses."""

    def __init__(self, service: Service, job: Job, admitted: float, chat: bool, model: str) -> None:
        self.service, self.job, self.admitted, self.chat, self.model = service, job, admitted, chat, model
        self.id = ("chatcmpl-" if chat else "cmpl-") + uuid.uuid4().hex
        self.created = int(time.time())
        self.first_token_at: float | None = None
        self.finished = False

    async def updates(self, request: Request) -> AsyncIterator[Update]:
        """The worker's updates until the last. A failed generation raises ApiError, and so does the end of a
        shutdown's grace period (503). The job is cancelled when the reader stops early, when the client
        leaves (watched apart from the updates, which a running job sends every round), or at that 503."""
        left = asyncio.ensure_future(_client_left(request))
        stopping = asyncio.ensure_future(self.service.stopping.wait())
        update = asyncio.ensure_future(self.job.updates.get())
        try:
            while True:
                await asyncio.wait((update, left, stopping), return_when=asyncio.FIRST_COMPLETED)
                if not update.done():
                    if stopping.done():
                        raise ApiError(503, "the server is shutting down and this request did not finish within its "
                                            "grace period; send it again when the server is back",
                                       code="server_shutting_down", kind="server_error")
                    return  # the client left: nobody reads on
                yield self._record(update.result())
                if self.finished:
                    return
                update = asyncio.ensure_future(self.job.updates.get())
        finally:
            for task in (update, left, stopping):
                task.cancel()
            if not self.finished:
                self.service.scheduler.cancel(self.job)
                self.service.metrics.cancelled.inc()

    def _record(self, update: Update) -> Update:
        """Note the first token's time and a finished request's metrics; raise ApiError for a failed generation."""
        if update.pieces and self.first_token_at is None:
            self.first_token_at = time.perf_counter()
        if update.error:
            self.finished = True
            raise ApiError(400 if update.user_error else 500, update.error,
                           kind="invalid_request_error" if update.user_error else "server_error")
        if update.stats is not None:
            self.finished = True
            self.service.metrics.finished(update.stats, time.perf_counter() - self.admitted,
                                          None if self.first_token_at is None else self.first_token_at - self.admitted)
        return update

    async def whole(self, request: Request) -> JSONResponse:
        texts, stats = [], None
        async for update in self.updates(request):
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

    async def events(self, request: Request, include_usage: bool) -> AsyncIterator[str]:
        """Server-sent events; an error (a failed generation, a shutdown) is an OpenAI error object before [DONE]."""
        try:
            if self.chat:
                yield self._chunk(None, first=True)
            async for update in self.updates(request):
                text = "".join(p.text for p in update.pieces)
                if text:
                    yield self._chunk(text)
                if update.stats is not None:
                    yield self._chunk(None, update.stats.finish_reason, speculation=speculation_report(update.stats))
                    if include_usage:
                        yield self._event([], usage=usage(update.stats))
        except ApiError as exc:
            yield f"data: {json.dumps(error_body(exc.message, exc.code, exc.param, exc.kind))}\n\n"
        yield "data: [DONE]\n\n"
