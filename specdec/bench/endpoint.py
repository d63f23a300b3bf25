"""`specdec bench --endpoint URL`: a running OpenAI-compatible server as one of the methods compared.

Each request is a streamed chat completion (POST /v1/chat/completions with `stream_options:
{"include_usage": true}`), timed by the runner from sending it to the stream's end; the first
non-empty text gives the time to first token. New tokens are the server's `usage.completion_tokens`,
or, from a server that sends no usage, the streamed chunks that carry text (one token each on vLLM
and llama-server; `specdec serve` sends a round's tokens in one chunk, but it always sends usage).
Speculative statistics are read from the stream when the server puts them there:
    specdec serve   `speculation` on the last chunk: drafter, target passes, drafted and accepted tokens
    llama-server    `timings.draft_n` and `timings.draft_n_accepted` (drafted and accepted; no passes, so no MAT)
Other servers give none in the stream (see docs/bench/ENDPOINT.md); their rows have no MAT and no α.
The endpoint's own answer text is fed back as the assistant turn of a conversation.
"""

from __future__ import annotations

import json
import time

import httpx

from specdec.bench.methods import Output
from specdec.bench.runner import ENDPOINT
from specdec.errors import SpecdecError
from specdec.sampling import SamplingParams
from specdec.records.stats import GenerationStats

TIMEOUT = httpx.Timeout(600.0, connect=10.0)  # a long answer on a slow server, but a dead address fails fast


def base_url(url: str) -> str:
    """http://host:8000, http://host:8000/ and http://host:8000/v1 all name the same server."""
    url = url.strip().rstrip("/")
    if not url.startswith(("http://", "https://")):
        raise SpecdecError(f"--endpoint {url}: give an http:// or https:// URL, e.g. http://127.0.0.1:8000")
    return url.removesuffix("/v1")


def _fail(label: str, what: str, fix: str) -> SpecdecError:
    return SpecdecError(f"endpoint {label}: {what}; {fix}")


def _check_status(label: str, response: httpx.Response, route: str) -> None:
    if response.status_code in (401, 403):
        raise _fail(label, f"the server refused the API key (HTTP {response.status_code} on {route})",
                    "pass the key it was started with: --api-key KEY")
    if response.status_code != 200:
        detail = response.text[:200].replace("\n", " ")
        raise _fail(label, f"HTTP {response.status_code} on {route}: {detail}",
                    "check the URL (the server's base, e.g. http://host:8000), the model name and the server's log")


class EndpointMethod:
    """One OpenAI-compatible server; `connect` checks it answers and finds the model name to send."""

    kind = ENDPOINT

    def __init__(self, label: str, url: str, served_model: str | None = None, api_key: str | None = None) -> None:
        self.name = label
        self.url = base_url(url)
        self.served_model = served_model
        self.headers = {"Authorization": f"Bearer {api_key}"} if api_key else {}
        self.client = httpx.Client(base_url=self.url, headers=self.headers, timeout=TIMEOUT)
        self.tokens_from = "usage"  # "streamed chunks" once a response comes without usage

    def connect(self) -> None:
        """GET /v1/models: reachable, the key accepted, an OpenAI-compatible answer, the model served."""
        try:
            response = self.client.get("/v1/models")
        except httpx.HTTPError as err:
            raise _fail(self.name, f"cannot reach {self.url} ({type(err).__name__}: {err})",
                        "start the server or correct the URL") from None
        _check_status(self.name, response, "GET /v1/models")
        try:
            served = [m["id"] for m in response.json()["data"]]
        except (ValueError, KeyError, TypeError):
            raise _fail(self.name, "GET /v1/models did not answer an OpenAI model list",
                        "give the base URL of an OpenAI-compatible server (specdec serve, vLLM, SGLang, llama-server)"
                        ) from None
        if self.served_model is None:
            if len(served) != 1:
                raise _fail(self.name, f"the server lists {len(served)} models ({', '.join(served) or 'none'})",
                            "choose one with --served-model NAME")
            self.served_model = served[0]
        elif self.served_model not in served:
            raise _fail(self.name, f"the server does not serve the model '{self.served_model}'; it lists: "
                        f"{', '.join(served) or 'none'}", "choose one of these with --served-model")

    def generate(self, messages: list[dict], max_new_tokens: int, sampling: SamplingParams) -> Output:
        body = {"model": self.served_model, "messages": messages, "max_tokens": max_new_tokens,
                "stream": True, "stream_options": {"include_usage": True}, "temperature": sampling.temperature}
        if not sampling.greedy:
            body.update(top_p=sampling.top_p, seed=sampling.seed)
        try:
            return self._stream(body)
        except httpx.HTTPError as err:
            raise _fail(self.name, f"the request failed ({type(err).__name__}: {err})",
                        "check that the server is still running") from None

    def _stream(self, body: dict) -> Output:
        start = time.perf_counter()
        texts, chunks, first, usage, speculation, timings = [], 0, None, None, None, None
        with self.client.stream("POST", "/v1/chat/completions", json=body) as response:
            if response.status_code != 200:
                response.read()
                _check_status(self.name, response, "POST /v1/chat/completions")
            for line in response.iter_lines():
                if not line.startswith("data:"):
                    continue
                data = line[len("data:"):].strip()
                if data == "[DONE]":
                    break
                try:
                    event = json.loads(data)
                except json.JSONDecodeError:
                    raise _fail(self.name, f"the stream sent an event that is not JSON: {data[:100]!r}",
                                "give the base URL of an OpenAI-compatible server") from None
                if "error" in event:
                    raise _fail(self.name, f"the server ended the stream with an error: {event['error']}",
                                "see the server's log")
                for choice in event.get("choices") or []:
                    delta = choice.get("delta") or {}
                    piece = delta.get("content") or ""
                    if piece or delta.get("reasoning_content"):  # a reasoning model's thinking is tokens too
                        chunks += 1
                        first = first if first is not None else time.perf_counter() - start
                    texts.append(piece)
                usage = event.get("usage") or usage
                speculation = event.get("speculation") or speculation
                timings = event.get("timings") or timings
        if usage is None:
            self.tokens_from = "streamed chunks"
        new_tokens = usage["completion_tokens"] if usage else chunks
        prompt_tokens = usage.get("prompt_tokens", 0) if usage else 0
        return Output([], reported_stats(speculation, timings, new_tokens, prompt_tokens), text="".join(texts),
                      new_tokens=new_tokens, first_token_seconds=first)

    def close(self) -> None:
        self.client.close()


def reported_stats(speculation: dict | None, timings: dict | None, new_tokens: int,
                   prompt_tokens: int) -> GenerationStats | None:
    """What the server said speculation did for this request (counts only: no times, no per-position counts)."""
    if speculation:  # specdec serve
        return GenerationStats(drafter=speculation["drafter"], prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                               target_passes=speculation["target_passes"], drafted=speculation["drafted_tokens"],
                               accepted=speculation["accepted_tokens"])
    if timings and timings.get("draft_n"):  # llama-server: target passes are not reported
        return GenerationStats(drafter="llama.cpp draft", prompt_tokens=prompt_tokens, new_tokens=new_tokens,
                               drafted=timings["draft_n"], accepted=timings.get("draft_n_accepted", 0))
    return None


def per_endpoint(values: list[str] | None, count: int, option: str) -> list[str | None]:
    """An option given once (for every endpoint) or once per --endpoint, in order."""
    if not values:
        return [None] * count
    if len(values) == 1:
        return values * count
    if len(values) != count:
        raise SpecdecError(f"{option} was given {len(values)} times for {count} endpoints: give it once (for every "
                           "endpoint) or once per --endpoint, in the same order")
    return values


def connect_endpoints(args) -> list[EndpointMethod]:
    """The --endpoint methods, each checked (reachable, key, model) before anything is measured."""
    count = len(args.endpoint)
    if args.label and len(args.label) != count:
        raise SpecdecError(f"--label was given {len(args.label)} times for {count} endpoints: give it once per "
                           "--endpoint, in the same order")
    labels = args.label or [base_url(url) for url in args.endpoint]
    if len(set(labels)) != len(labels):
        raise SpecdecError("two endpoints would have the same name in the report: give each --endpoint its own --label")
    methods = [EndpointMethod(label, url, model, key) for label, url, model, key in zip(
        labels, args.endpoint, per_endpoint(args.served_model, count, "--served-model"),
        per_endpoint(args.api_key, count, "--api-key"))]
    for method in methods:
        method.connect()
    return methods
