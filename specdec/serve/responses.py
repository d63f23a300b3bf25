"""What the server answers: OpenAI error responses, and an admitted request's updates shaped as one
JSON response or as server-sent events, each with `usage` and the `speculation` report."""

from __future__ import annotations

import asyncio
import json
import time
import uuid
from collections.abc import AsyncIterator

from fastapi import Request
from fastapi.responses import JSONResponse

from specdec.serve.bodies import ApiError, error_body
from specdec.serve.scheduler import Job, Update
from specdec.serve.service import Service
from specdec.records.stats import GenerationStats

RETRY_AFTER_SECONDS = 1  # what a 429 tells the client to wait


def error_response(status: int, message: str, code: str | None = None, param: str | None = None,
                   kind: str = "invalid_request_error") -> JSONResponse:
    headers = {"Retry-After": str(RETRY_AFTER_SECONDS)} if status == 429 else None
    return JSONResponse(error_body(message, code, param, kind), status_code=status, headers=headers)


def speculation_report(stats: GenerationStats) -> dict:
    return {"drafter": stats.drafter, "target_passes": stats.target_passes, "drafted_tokens": stats.drafted,
            "accepted_tokens": stats.accepted, "mean_accepted_tokens": round(stats.mean_accepted_tokens, 4),
            "acceptance_rate": round(stats.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in stats.acceptance_per_position]}


def usage(stats: GenerationStats) -> dict:
    """OpenAI's usage; `prompt_tokens_details.cached_tokens`: the prompt tokens taken from the prefix cache."""
    return {"prompt_tokens": stats.prompt_tokens, "completion_tokens": stats.new_tokens,
            "total_tokens": stats.prompt_tokens + stats.new_tokens,
            "prompt_tokens_details": {"cached_tokens": stats.reused_prompt_tokens}}


async def _client_left(request: Request) -> None:
    """Returns when the client has closed the connection (its body was read already, so receive waits for that)."""
    while (await request.receive())["type"] != "http.disconnect":
        pass


class Reply:
    """One admitted request's reply: reads the worker's updates and shapes them as OpenAI responses."""

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
