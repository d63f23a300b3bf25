"""One backend on one GGUF file, measured as a user meets it: load, prefill, decode, pass costs, memory.

    python scripts/size_bench.py specdec FILE.gguf        # specdec's lean runtime (the file as stored)
    python scripts/size_bench.py llama.cpp FILE.gguf      # llama.cpp through llama-cpp-python

Both run the same loop on the same token ids: a prompt of `--prompt-tokens` ids prefilled in one
pass, then `--new-tokens` greedy one-token passes (argmax of the logits, the end token ignored, so
random-weight files decode as long as real ones), then passes over k = 1..16 new tokens after the
prompt (`--repeats`, median). Threads: `--threads` (default 2). The last line is one JSON object:
load_s, prefill_tok_s, decode_tok_s, t1_ms, tk_over_t1 {k: T(k)/T(1)}, peak_rss_mb. Run the two
backends in turn, in separate processes (`scripts/size_table.py` does), so that each one's peak
memory is its own.
"""

from __future__ import annotations

import argparse
import json
import resource
import statistics
import time

import numpy as np

SIZES = list(range(1, 17))


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("backend", choices=["specdec", "llama.cpp"])
    parser.add_argument("gguf")
    parser.add_argument("--prompt-tokens", type=int, default=128)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--threads", type=int, default=2)
    parser.add_argument("--no-costs", action="store_true", help="skip the T(k) passes")
    parser.add_argument("--kv-cache", default="auto", help="specdec's cache: auto (float16) | float32")
    args = parser.parse_args()
    prompt = [int(t) for t in np.random.default_rng(0).integers(100, 40000, size=args.prompt_tokens)]
    run = run_specdec if args.backend == "specdec" else run_llama_cpp
    result = run(args, prompt)
    result["peak_rss_mb"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024, 1)
    result.update(backend=args.backend, file=args.gguf)
    print(json.dumps(result))


def timed_loop(prefill, step, k_pass, prompt: list[int], args) -> dict:
    """prefill(ids) -> last logits; step(id) -> logits; k_pass(ids) -> None after rolling back to the prompt."""
    start = time.perf_counter()
    logits = prefill(prompt)
    prefill_s = time.perf_counter() - start
    token = int(np.argmax(logits))
    start = time.perf_counter()
    for _ in range(args.new_tokens):
        token = int(np.argmax(step(token)))
    decode_s = time.perf_counter() - start
    result = {"prefill_tok_s": round(len(prompt) / prefill_s, 1), "decode_tok_s": round(args.new_tokens / decode_s, 2)}
    if not args.no_costs:
        costs = {}
        for k in SIZES:
            times = []
            for _ in range(args.repeats):
                start = time.perf_counter()
                k_pass(prompt[:k])
                times.append(time.perf_counter() - start)
            costs[k] = statistics.median(times)
        result["t1_ms"] = round(costs[1] * 1000, 2)
        result["tk_over_t1"] = {k: round(costs[k] / costs[1], 2) for k in SIZES}
    return result


def run_specdec(args, prompt: list[int]) -> dict:
    import torch

    torch.set_num_threads(args.threads)
    from specdec.runtime import load_model

    start = time.perf_counter()
    model = load_model(args.gguf, kv_cache=args.kv_cache)
    load_s = time.perf_counter() - start
    net = model.net
    cache = net.new_cache(len(prompt) + args.new_tokens + 20)

    def prefill(ids):
        return net.forward(torch.tensor([ids]), cache, last_only=True)[0, -1].numpy()

    def step(token):
        return net.forward(torch.tensor([[token]]), cache, last_only=True)[0, -1].numpy()

    def k_pass(ids):
        cache.truncate(len(prompt))
        net.forward(torch.tensor([ids]), cache)

    return {"load_s": round(load_s, 2), "weights": model.weights.summary(), "kv_cache": str(net.cache_dtype()),
            **timed_loop(prefill, step, k_pass, prompt, args)}


def run_llama_cpp(args, prompt: list[int]) -> dict:
    from llama_cpp import Llama

    start = time.perf_counter()
    llm = Llama(args.gguf, n_ctx=len(prompt) + args.new_tokens + 32, n_threads=args.threads,
                n_threads_batch=args.threads, n_batch=512, logits_all=True, verbose=False)
    load_s = time.perf_counter() - start

    def prefill(ids):
        llm.eval(ids)
        return llm.scores[llm.n_tokens - 1]

    def step(token):
        llm.eval([token])
        return llm.scores[llm.n_tokens - 1]

    def k_pass(ids):
        llm.n_tokens = len(prompt)
        llm._ctx.kv_cache_seq_rm(-1, len(prompt), -1)
        llm.eval(ids)

    return {"load_s": round(load_s, 2), **timed_loop(prefill, step, k_pass, prompt, args)}


if __name__ == "__main__":
    main()
