"""A bounded load test of a running server: many concurrent streaming clients, every answer checked.

Each prompt is first asked once, not streamed, greedy: that answer is the reference. Then `clients`
concurrent clients stream greedy requests for the prompts in turn until `requests` have completed;
a request answered 429 (the queue is full) is counted and sent again after a back-off (0.1 s,
doubling up to the server's Retry-After, with jitter). Every
streamed answer must equal its prompt's reference, text and token count alike: a lost, duplicated
or reordered token shows up as a mismatch. Loopback servers only: it is a test, not a weapon.
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
from specdec.serve.command import is_loopback

FIRST_RETRY_SECONDS = 0.1  # a 429 is retried after this, doubling up to the server's Retry-After, with jitter


@dataclass
class LoadResult:
    completed: int = 0
    busy_answers: int = 0  # 429s (retried)
    errors: list[str] = field(default_factory=list)  # anything else: status and message
    mismatches: list[str] = field(default_factory=list)
    latencies: list[float] = field(default_factory=list)  # seconds, request sent → [DONE]
    first_tokens: list[float] = field(default_factory=list)  # seconds, request sent → first text
    tokens: int = 0
    seconds: float = 0.0

    def summary(self) -> dict:
        def pct(values, q):
            return round(statistics.quantiles(values, n=100)[q - 1], 4) if len(values) > 1 else (values[0] if values else None)

        return {"completed": self.completed, "busy_answers_429": self.busy_answers, "errors": len(self.errors),
                "first_errors": self.errors[:5], "mismatches": len(self.mismatches), "first_mismatches": self.mismatches[:5],
                "seconds": round(self.seconds, 2), "requests_per_second": round(self.completed / self.seconds, 3),
                "tokens_per_second": round(self.tokens / self.seconds, 2),
                "latency_seconds": {f"p{q}": pct(self.latencies, q) for q in (50, 90, 99)},
                "time_to_first_token_seconds": {f"p{q}": pct(self.first_tokens, q) for q in (50, 90, 99)}}


async def _reference(client: httpx.AsyncClient, model: str, prompt: str, max_tokens: int) -> tuple[str, int]:
    response = await client.post("/v1/completions", json={"model": model, "prompt": prompt, "max_tokens": max_tokens,
                                                          "temperature": 0})
    if response.status_code != 200:
        raise SpecdecError(f"the reference request failed: {response.status_code} {response.text[:300]}")
    body = response.json()
    return body["choices"][0]["text"], body["usage"]["completion_tokens"]


async def _stream_once(client, model, prompt, max_tokens) -> tuple[int, str, int | None, float | None, str]:
    """(status, text, completion tokens, seconds to first text, error text or a 429's Retry-After) of one
    streamed request."""
    start = time.perf_counter()
    body = {"model": model, "prompt": prompt, "max_tokens": max_tokens, "temperature": 0, "stream": True,
            "stream_options": {"include_usage": True}}
    texts, tokens, first = [], None, None
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
            if "error" in event:
                return 200, "".join(texts), tokens, first, f"stream error: {event['error']}"
            for choice in event["choices"]:
                if choice["text"] and first is None:
                    first = time.perf_counter() - start
                texts.append(choice["text"])
            if event.get("usage"):
                tokens = event["usage"]["completion_tokens"]
    return 200, "".join(texts), tokens, first, ""


async def run_load_test(base_url: str, model: str, prompts: list[str], clients: int, requests: int, max_tokens: int,
                        api_key: str | None = None, progress=None) -> LoadResult:
    host = urlparse(base_url).hostname or ""
    if not is_loopback(host):
        raise SpecdecError(f"the load test only runs against a loopback server, not {host}")
    if clients < 1 or requests < 1 or max_tokens < 1 or not prompts:
        raise SpecdecError("clients, requests and max_tokens must be >= 1, and there must be prompts")
    headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
    limits = httpx.Limits(max_connections=clients + 4, max_keepalive_connections=clients + 4)
    result = LoadResult()
    async with httpx.AsyncClient(base_url=base_url, headers=headers, timeout=600, limits=limits) as client:
        references = [await _reference(client, model, p, max_tokens) for p in prompts]
        next_request = 0
        started = time.perf_counter()

        async def worker():
            nonlocal next_request
            while next_request < requests:
                number = next_request
                next_request += 1
                prompt_index = number % len(prompts)
                wait = FIRST_RETRY_SECONDS
                while True:
                    sent = time.perf_counter()
                    status, text, tokens, first, error = await _stream_once(client, model, prompts[prompt_index], max_tokens)
                    if status != 429:
                        break
                    result.busy_answers += 1
                    await asyncio.sleep(wait * random.uniform(0.5, 1.5))
                    wait = min(2 * wait, float(error or 1))
                if status != 200 or error:
                    result.errors.append(f"request {number}: {status} {error}")
                    continue
                result.completed += 1
                result.latencies.append(time.perf_counter() - sent)
                if first is not None:
                    result.first_tokens.append(first)
                result.tokens += tokens or 0
                want_text, want_tokens = references[prompt_index]
                if text != want_text or tokens != want_tokens:
                    result.mismatches.append(f"request {number} (prompt {prompt_index}): {tokens} tokens {text[:60]!r}, "
                                             f"expected {want_tokens} tokens {want_text[:60]!r}")
                if progress:
                    progress()

        await asyncio.gather(*(worker() for _ in range(clients)))
        result.seconds = time.perf_counter() - started
        health = await client.get("/health")
        if health.status_code != 200 or health.json().get("status") != "ok":
            result.errors.append(f"unhealthy afterwards: {health.status_code} {health.text[:200]}")
    return result
