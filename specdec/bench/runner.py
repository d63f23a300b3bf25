"""The benchmark loop: every method on every prompt, interleaved, with warm-up and repeats.

For each prompt, temperature and repeat, every method runs once, one after the other, so that
drift of a shared machine hits all methods alike. A conversation (a prompt with two turns) feeds
each method's own first answer back before the second turn; its time and tokens are the sum over
turns. Sampled runs give every method the same seed per prompt and repeat.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass

import torch

from specdec.bench.memory import PeakMemory
from specdec.bench.prompts import PromptCase
from specdec.sampling import SamplingParams
from specdec.stats import GenerationStats


@dataclass
class MethodRun:
    """One method on one prompt at one temperature: its repeats."""

    token_ids: list[int]  # the first repeat's new tokens, all turns (compared with plain when greedy)
    rates: list[float]  # tokens per second of each repeat
    seconds: list[float]
    new_tokens: list[int]
    stats: GenerationStats | None  # this project's methods: all turns and repeats merged
    peak_memory_bytes: int | None  # the peak during the method's runs, as PeakMemory measures it


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages)
    return tokenizer.encode("\n".join(m["content"] for m in messages))


def run_case(method, case: PromptCase, tokenizer, sampling: SamplingParams, max_new_tokens: int):
    """(new ids of all turns, seconds spent generating, per-turn stats)."""
    messages, ids, seconds, stats = [], [], 0.0, []
    for turn in case.turns:
        messages.append({"role": "user", "content": turn})
        prompt_ids = chat_ids(tokenizer, messages)
        start = time.perf_counter()
        output = method.generate(prompt_ids, max_new_tokens, sampling)
        seconds += time.perf_counter() - start
        ids += output.token_ids
        if output.stats is not None:
            stats.append(output.stats)
        messages.append({"role": "assistant", "content": tokenizer.decode(output.token_ids, skip_special_tokens=True)})
    return ids, seconds, stats


def run_bench(cases: list[PromptCase], methods_at: dict[float, list], tokenizer, max_new_tokens: int,
              repeats: int, device: torch.device, progress=None, on_row=None) -> list[dict]:
    """Rows, one per prompt and temperature: {"case": ..., "temperature": t, "runs": {method name: MethodRun}};
    `on_row(row)` sees each as soon as it is complete (the command writes it down at once).
    `progress(done, number, case, temperature, method_name)` is told before each run starts: the runs
    done so far, then the prompt (the `number`-th of `cases`, from 1), temperature and method to run."""
    memory = PeakMemory(device)
    warm = PromptCase("warm-up", "warm-up", ("Hello",))
    for temperature, methods in methods_at.items():  # first calls pay allocations, lazy imports, cost models
        for method in methods:
            run_case(method, warm, tokenizer, SamplingParams(temperature=temperature, seed=0), 8)
    rows, done = [], 0
    for number, case in enumerate(cases):
        for temperature, methods in methods_at.items():
            collected: dict[str, dict] = {m.name: {"ids": None, "rates": [], "seconds": [], "tokens": [], "stats": [],
                                                   "peak": None} for m in methods}
            for repeat in range(repeats):
                sampling = SamplingParams(temperature=temperature, seed=1000 * number + repeat)
                for method in methods:
                    if progress:
                        progress(done, number + 1, case, temperature, method.name)
                    memory.reset()
                    ids, seconds, stats = run_case(method, case, tokenizer, sampling, max_new_tokens)
                    slot = collected[method.name]
                    peak = memory.peak()
                    if peak is not None:
                        slot["peak"] = max(slot["peak"] or 0, peak)
                    slot["ids"] = ids if slot["ids"] is None else slot["ids"]
                    slot["rates"].append(len(ids) / seconds if seconds else 0.0)
                    slot["seconds"].append(seconds)
                    slot["tokens"].append(len(ids))
                    slot["stats"] += stats
                    done += 1
            rows.append({"case": case, "temperature": temperature, "runs": {
                name: MethodRun(s["ids"], s["rates"], s["seconds"], s["tokens"],
                                GenerationStats.merge(s["stats"]) if s["stats"] else None, s["peak"])
                for name, s in collected.items()}})
            if on_row:
                on_row(rows[-1])
    return rows


def median_rate(run: MethodRun) -> float:
    return statistics.median(run.rates)
