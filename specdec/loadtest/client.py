"""A bounded load test of a running server: many concurrent streaming clients, every answer checked.

Each prompt (and answer length) is first asked once, not streamed, greedy: that answer is the
reference (with `references_after`, asked once the timed requests are done). Then `clients`
concurrent clients stream greedy requests for the prompts in turn until `requests` have completed,
or for `duration` seconds; a request answered 429 (the queue is full) is counted and sent again after a back-off (0.1 s, doubling up to the server's Retry-After, with
jitter). Every streamed answer must equal its reference, text and token count alike: a lost,
duplicated or reordered token shows up as a mismatch. Options: a `speculation` setting sent with
every request (plain decoding, a fixed γ, "auto"), answer lengths drawn from several, and clients
that go away in the middle of a stream (`disconnect_share`), which must not disturb the others.
`run_load_curve` repeats the test at several numbers of clients and speculation settings. The
server's memory (resident set, from its /metrics) is read before and after.
Loopback servers only: it is a test, not a weapon.
"""

from __future__ import annotations

import asyncio
import json
import random
import statistics
import time
from dataclasses import dataclass, field
from urllib.parse import urlparse

import httpx

from specdec.errors import SpecdecError
from specdec.serve.addresses import is_loopback
from specdec.terminal import plural

FIRST_RETRY_SECONDS = 0.1  # a 429 is retried after this, doubling up to the server's Retry-After, with jitter
MEMORY_EVERY = 30.0  # seconds between readings of the server's memory in a run of a given duration


@dataclass
class LoadResult:
    completed: int = 0
    disconnected: int = 0  # streams this test abandoned on purpose
    busy_answers: int = 0  # 429s (retried)
    errors: list[str] = field(default_factory=list)  # anything else: status and message
    mismatches: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, request sent → [DONE]
    first_tokens: list[float] = field(default_factory=list)  # seconds, request sent → first text
    tokens: int = 0
    seconds: float = 0.0
    server_memory_bytes: tuple[float | None, float | None] = (None, None)  # resident set before, after
    memory_samples: list[tuple[float, float]] = field(default_factory=list)  # (seconds into the run, bytes)

    def summary(self) -> dict:
        def pct(values, q):
            return round(statistics.quantiles(values, n=100)[q - 1], 4) if len(values) > 1 else (values[0] if values else None)

        before, after = self.server_memory_bytes
        return {"completed": self.completed, "disconnected": self.disconnected, "busy_answers_429": self.busy_answers,
                "errors": len(self.errors),
                "first_errors": self.errors[:5], "mismatches": len(self.mismatches), "first_mismatches": self.mismatches[:5],
                "seconds": round(self.seconds, 2), "requests_per_second": round(self.completed / self.seconds, 3),
                "tokens_per_second": round(self.tokens / self.seconds, 2),
                "latency_seconds": {f"p{q}": pct(self.latencies, q) for q in (50, 90, 99)},
                "time_to_first_token_seconds": {f"p{q}": pct(self.first_tokens, q) for q in (50, 90, 99)},
                "server_memory_mb": {"before": before and round(before / 2**20, 1), "after": after and round(after / 2**20, 1),
                                     "samples": [[round(t, 1), round(b / 2**20, 1)] for t, b in self.memory_samples]}}


def _body(model: str, prompt: str, max_tokens: int, speculation: dict | None, **extra) -> dict:
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, **extra}
    return {**body, "speculation": speculation} if speculation is not None else body


async def _reference(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int,
                     speculation: dict | None) -> tuple[str, int]:
    response = await client.post("/v1/completions", json=_body(model, prompt, max_tokens, speculation))
    if response.status_code != 200:
        raise SpecdecError(f"the reference request failed: {response.status_code} {response.text[:300]}")
    body = response.json()
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


async def _stream_once(client, body: dict, leave_after: int | None = None) -> tuple[int, str, int | None, float | None, str]:
    """(status, text, completion tokens, seconds to first text, error text or a 429's Retry-After) of one
    streamed request; with `leave_after`, the client goes away after that many events (status 0). The
    tokens are the stream's `usage`; a server that sends none (llama-cpp-python's ignores
    `stream_options`) is taken to send one token a chunk, and its chunks with text are counted."""
    start = time.perf_counter()
    texts, tokens, first = [], None, None
    events = text_chunks = 0
    async with client.stream("POST", "/v1/completions", json=body) as response:
        if response.status_code == 429:
            return 429, "", None, None, response.headers.get("retry-after", "1")
        if response.status_code != 200:
            return response.status_code, "", None, None, (await response.aread()).decode()[:300]
        async for line in response.aiter_lines():
            if not line.startswith("data: "):
                continue
            data = line[len("data: "):]
            if data == "[DONE]":
                break
            event = json.loads(data)
            events += 1
            if leave_after is not None and events >= leave_after:
                return 0, "", None, first, "left on purpose"
            if "error" in event:
                return 200, "".join(texts), tokens, first, f"stream error: {event['error']}"
            for choice in event["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                text_chunks += bool(choice["text"])
                texts.append(choice["text"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return 200, "".join(texts), text_chunks if tokens is None else tokens, first, ""


async def server_memory(client: httpx.AsyncClient) -> float | None:
    """The server's resident set in bytes, from its /metrics (None if it does not say)."""
    try:
        text = (await client.get("/metrics")).text
    except httpx.HTTPError:
        return None
    for line in text.splitlines():
        if line.startswith("process_resident_memory_bytes "):
            return float(line.split()[1])
    return None


async def run_load_test(base_url: str, model: str, prompts: list[str], clients: int, requests: int, max_tokens: int,
                        api_key: str | None = None, progress=None, *, speculation: dict | None = None,
                        answer_lengths: list[int] | None = None, duration: float | None = None,
                        disconnect_share: float = 0.0, seed: int = 0, references_after: bool = False) -> LoadResult:
    """`requests` requests (or as many as fit in `duration` seconds) with answer lengths drawn from
    `answer_lengths` (default: all `max_tokens`); a `disconnect_share` of them leave mid-stream.
    `references_after`: the references are asked after the timed requests, not before, so that no
    timed request finds its whole prompt left in a prefix cache by its own reference."""
    host = urlparse(base_url).hostname or ""
    if not is_loopback(host):
        raise SpecdecError(f"the load test only runs against a loopback server, not {host}")
    lengths = answer_lengths or [max_tokens]
    if clients < 1 or requests < 1 or min(lengths) < 1 or not prompts:
        raise SpecdecError("clients, requests and max_tokens must be >= 1, and there must be prompts")
    if not 0 <= disconnect_share < 1:
        raise SpecdecError(f"the share of clients that leave must lie in [0, 1), got {disconnect_share}")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    result = LoadResult()
    rng = random.Random(seed)
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600, limits=limits) as client:
        async def ask_references() -> dict:
            return {(p, n): await _reference(client, model, prompts[p], n, speculation)
                    for p in range(len(prompts)) for n in lengths}

        references = {} if references_after else await ask_references()
        answers = []  # (request number, prompt index, answer length, text, tokens): checked at the end
        memory_before = await server_memory(client)
        next_request = 0
        started = time.perf_counter()

        def more() -> bool:
            return time.perf_counter() - started < duration if duration is not None else next_request < requests

        async def worker():
            nonlocal next_request
            while more():
                number = next_request
                next_request += 1
                prompt_index, length = number % len(prompts), rng.choice(lengths)
                leave_after = rng.randint(1, 4) if rng.random() < disconnect_share else None
                body = _body(model, prompts[prompt_index], length, speculation, stream=True,
                             stream_options={"include_usage": True})
                wait = FIRST_RETRY_SECONDS
                while True:
                    sent = time.perf_counter()
                    status, text, tokens, first, error = await _stream_once(client, body, leave_after)
                    if status != 429:
                        break
                    result.busy_answers += 1
                    await asyncio.sleep(wait * random.uniform(0.5, 1.5))
                    wait = min(2 * wait, float(error or 1))
                if status == 0:
                    result.disconnected += 1
                    continue
                if status != 200 or error:
                    result.errors.append(f"request {number}: {status} {error}")
                    continue
                result.completed += 1
                result.latencies.append(time.perf_counter() - sent)
                if first is not None:
                    result.first_tokens.append(first)
                result.tokens += tokens or 0
                answers.append((number, prompt_index, length, text, tokens))
                if progress:
                    progress()

        async def watch_memory():  # a sustained run: the server's resident set every MEMORY_EVERY seconds
            while more():
                await asyncio.sleep(MEMORY_EVERY)
                resident = await server_memory(client)
                if resident is not None:
                    result.memory_samples.append((time.perf_counter() - started, resident))

        watcher = asyncio.create_task(watch_memory()) if duration is not None else None
        await asyncio.gather(*(worker() for _ in range(clients)))
        if watcher:
            watcher.cancel()
        result.seconds = time.perf_counter() - started
        await asyncio.sleep(0.5)  # the rows of clients that left are dropped at the server's next round
        result.server_memory_bytes = (memory_before, await server_memory(client))
        health = await client.get("/health")
        if health.status_code != 200 or health.json().get("status") != "ok":
            result.errors.append(f"unhealthy afterwards: {health.status_code} {health.text[:200]}")
        if references_after:
            references = await ask_references()
        for number, prompt_index, length, text, tokens in sorted(answers):
            want_text, want_tokens = references[prompt_index, length]
            if text != want_text or tokens != want_tokens:
                result.mismatches.append(f"request {number} (prompt {prompt_index}): {plural(tokens, 'token')} "
                                         f"{text[:60]!r}, expected {plural(want_tokens, 'token')} {want_text[:60]!r}")
    return result


SPECULATION_SETTINGS = {"off": {"enabled": False}, "auto": {"gamma": "auto"}}  # else "γ=N": {"gamma": N}


def speculation_setting(name: str) -> dict:
    """"off", "auto" or a fixed γ ("4") → the request's `speculation` object."""
    if name in SPECULATION_SETTINGS:
        return SPECULATION_SETTINGS[name]
    if name.isdigit() and 1 <= int(name) <= 16:
        return {"gamma": int(name)}
    raise SpecdecError(f"speculation setting {name!r} is not 'off', 'auto' or a γ in 1..16")


async def run_load_curve(base_url: str, model: str, prompts: list[str], client_counts: list[int],
                         settings: list[str], requests_per_client: int, max_tokens: int, api_key: str | None = None,
                         progress=None, references_after: bool = False) -> list[dict]:
    """The load test at every number of clients and speculation setting: one summary each, with
    `requests_per_client` × clients requests (at least 8) per point."""
    points = []
    for clients in client_counts:
        for name in settings:
            result = await run_load_test(base_url, model, prompts, clients, max(8, requests_per_client * clients),
                                         max_tokens, api_key, speculation=speculation_setting(name),
                                         references_after=references_after)
            points.append({"clients": clients, "speculation": name, **result.summary()})
            if progress:
                progress(points[-1])
    return points
