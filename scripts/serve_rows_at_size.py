"""Many long requests at once: how many a server admits, and what its process holds meanwhile.

    specdec serve --model llama-3.1-8b-Q4_K_M.gguf --drafter none --max-batch 16 --max-queue 32 --port 8300 &
    python scripts/serve_rows_at_size.py --url http://127.0.0.1:8300 --pid $! --requests 16 --max-tokens 4000

Sends `--requests` streaming completions at once, each with a short prompt and `--max-tokens` new
tokens (so that each reserves a cache of about that many tokens), waits until every stream has sent
`--first-tokens` chunks or `--timeout` seconds pass, samples `/health` (running, waiting) and the
server's resident memory (/proc/PID/status, VmRSS; its peak VmHWM) each second, then closes every
stream. The last line is one JSON object: the requests that streamed, the most running at once, the
slowest /health answer, the peak resident memory, the seconds until every stream had its chunks.
"""

from __future__ import annotations

import argparse
import json
import threading
import time

import httpx


def resident_mib(pid: int) -> tuple[float, float]:
    """(VmRSS, VmHWM) of a process in MiB."""
    fields = dict(line.split(":", 1) for line in open(f"/proc/{pid}/status").read().splitlines() if ":" in line)
    return tuple(int(fields[name].split()[0]) / 1024 for name in ("VmRSS", "VmHWM"))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--url", default="http://127.0.0.1:8000")
    parser.add_argument("--pid", type=int, required=True, help="the server's process id (for its memory)")
    parser.add_argument("--requests", type=int, default=16)
    parser.add_argument("--max-tokens", type=int, default=4000)
    parser.add_argument("--first-tokens", type=int, default=3, help="chunks each stream sends before all are closed")
    parser.add_argument("--timeout", type=float, default=600)
    args = parser.parse_args()
    model = httpx.get(args.url + "/v1/models").json()["data"][0]["id"]
    chunks = [0] * args.requests
    statuses: list[int | None] = [None] * args.requests
    done = threading.Event()

    def client(i: int) -> None:
        body = {"model": model, "prompt": f"Request {i}: write a long story about the sea.", "stream": True,
                "max_tokens": args.max_tokens, "temperature": 0}
        with httpx.Client(base_url=args.url, timeout=args.timeout) as http:
            with http.stream("POST", "/v1/completions", json=body) as answer:
                statuses[i] = answer.status_code
                if answer.status_code != 200:
                    return
                for line in answer.iter_lines():
                    if line.startswith("data: ") and line != "data: [DONE]":
                        chunks[i] += 1
                    if done.is_set():
                        return  # closing the stream cancels the request

    start = time.perf_counter()
    threads = [threading.Thread(target=client, args=(i,), daemon=True) for i in range(args.requests)]
    for thread in threads:
        thread.start()
    samples = []
    while time.perf_counter() - start < args.timeout:
        asked = time.perf_counter()
        health = httpx.get(args.url + "/health", timeout=args.timeout).json()
        health_s = time.perf_counter() - asked
        rss, peak = resident_mib(args.pid)
        samples.append({"t": round(time.perf_counter() - start, 1), "health_s": round(health_s, 3), "running": health["running"],
                        "waiting": health["waiting"], "rss_mib": round(rss), "streams_started": sum(c > 0 for c in chunks)})
        print(json.dumps(samples[-1]), flush=True)
        if all(c >= args.first_tokens for c in chunks) or any(s not in (None, 200) for s in statuses):
            break
        time.sleep(1)
    all_streaming = round(time.perf_counter() - start, 1)
    done.set()
    for thread in threads:
        thread.join(timeout=60)
    print(json.dumps({"requests": args.requests, "max_tokens": args.max_tokens,
                      "streamed": sum(c >= args.first_tokens for c in chunks),
                      "statuses": sorted({s for s in statuses if s is not None}),
                      "most_running": max(s["running"] for s in samples),
                      "slowest_health_s": max(s["health_s"] for s in samples), "peak_rss_mib": round(resident_mib(args.pid)[1]),
                      "seconds_to_all_streaming": all_streaming}))


if __name__ == "__main__":
    main()
