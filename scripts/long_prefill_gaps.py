"""Short streams beside a long prefill: the gaps between their tokens while an 8k-token prompt goes in.

    specdec serve --model FILE.gguf --drafter none --max-batch 16 --port 8200 &
    python scripts/long_prefill_gaps.py --url http://127.0.0.1:8200 --long-tokens 8000

`--short` streaming clients send short completions one after another (`--short-tokens` new tokens,
greedy); once they all stream, one client sends a completion whose prompt is `--long-tokens` token
ids. Every gap between two chunks of a short stream is recorded, and those that fall between the
long request's start and its first token (its prefill) are reported apart: count, median, p99, max.
The last line is one JSON object.
"""

from __future__ import annotations

import argparse
import json
import statistics
import threading
import time

import httpx
import numpy as np


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--short", type=int, default=4, help="short streaming clients")
    parser.add_argument("--short-tokens", type=int, default=32)
    parser.add_argument("--long-tokens", type=int, default=8000)
    args = parser.parse_args()
    model = httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
    stop, gaps, lock = threading.Event(), [], threading.Lock()  # gaps: (time of the later chunk, gap)

    def short_client(seed: int) -> None:
        body = {"model": model, "prompt": f"Count slowly: {seed}, {seed + 1},", "max_tokens": args.short_tokens,
                "temperature": 0, "stream": True}
        with httpx.Client(base_url=args.url, timeout=600) as http:
            while not stop.is_set():
                last = None
                with http.stream("POST", "/v1/completions", json=body) as response:
                    for line in response.iter_lines():
                        if not line.startswith("data: "):
                            continue
                        now = time.perf_counter()
                        if last is not None:
                            with lock:
                                gaps.append((now, now - last))
                        last = now

    threads = [threading.Thread(target=short_client, args=(i,), daemon=True) for i in range(args.short)]
    for thread in threads:
        thread.start()
    time.sleep(5)  # the short streams are under way
    ids = [int(t) for t in np.random.default_rng(0).integers(100, 40000, size=args.long_tokens)]
    started = time.perf_counter()
    first_token = None
    with httpx.stream("POST", args.url + "/v1/completions", timeout=900,
                      json={"model": model, "prompt": ids, "max_tokens": 8, "temperature": 0, "stream": True}) as response:
        for line in response.iter_lines():
            if line.startswith("data: ") and first_token is None and '"text": ""' not in line:
                first_token = time.perf_counter()
    ended = time.perf_counter()
    stop.set()
    for thread in threads:
        thread.join(timeout=120)
    during = sorted(g for t, g in gaps if started <= t <= (first_token or ended))
    before = sorted(g for t, g in gaps if t < started)
    result = {"long_tokens": args.long_tokens, "short_clients": args.short,
              "long_time_to_first_token_s": round((first_token or ended) - started, 2),
              "gaps_during_prefill": summary(during), "gaps_before": summary(before)}
    print(json.dumps(result))


def summary(gaps: list[float]) -> dict:
    if not gaps:
        return {"count": 0}
    return {"count": len(gaps), "median_s": round(statistics.median(gaps), 3),
            "p99_s": round(gaps[min(len(gaps) - 1, int(0.99 * len(gaps)))], 3), "max_s": round(gaps[-1], 3)}


if __name__ == "__main__":
    main()
