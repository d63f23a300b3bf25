"""The benchmark loop: every method on every prompt, interleaved, with warm-up and repeats.

For each prompt, temperature and repeat, every method runs once, one after the other, so that
drift of a shared machine hits all methods alike. The order turns by one place from one repeat to
the next (A B C, B C A, C A B), so that each method runs first in turn and a method's repeats lie
M − 2 runs apart or more (M methods): a slow minute of the machine falls on one repeat of a method,
which the median over repeats sets aside. (Reversing the order each repeat, as this loop once did,
ran the last method of one repeat first in the next: a slow minute took two of its three repeats.)
The direction reverses from one prompt to the next, so that no method always runs right after the
same other method (`run_order`). A conversation (a prompt with two turns) feeds
each method's own first answer back before the second turn; its time and tokens are the sum over
turns. Sampled runs give every method the same seed per prompt and repeat. A drafter that learns
from its outputs (suffix) learns a prompt's answers only once all its runs are done: every repeat
and temperature of a prompt drafts from the same memory (the answers to the prompts before it), so
repeats repeat and the sampled runs do not draft from the greedy answer (`--ask-twice` measures a
repeated request on purpose). An endpoint (a server,
endpoint.py) is given the chat messages, not token ids: its server applies its own chat template.
A baseline runs in a process of its own (child.py); if it fails, its rows are left out of every
prompt, the others go on, and `failures` says what happened.
"""

from __future__ import annotations

import statistics
import time
from dataclasses import dataclass, field

import torch

from specdec.bench.memory import PeakMemory
from specdec.bench.prompts import PromptCase
from specdec.errors import BaselineFailed
from specdec.sampling import SamplingParams
from specdec.records.stats import GenerationStats

ENDPOINT = "endpoint"  # the kind of a method that is a running server (endpoint.py): given messages, not ids


@dataclass
class MethodRun:
    """One method on one prompt at one temperature: its repeats."""

    token_ids: list[int]  # the first repeat's new tokens, all turns (compared with plain when greedy)
    rates: list[float]  # tokens per second of each repeat
    seconds: list[float]
    new_tokens: list[int]
    stats: GenerationStats | None  # this project's methods (an endpoint's, if reported): all turns and repeats merged
    peak_memory_bytes: int | None  # the peak during the method's runs, as PeakMemory measures it (endpoints: None)
    text: str = ""  # the first repeat's answers, all turns (an endpoint's are compared by text)
    first_token_seconds: list[float] = field(default_factory=list)  # endpoints: each request's time to first token
    endpoint: str | None = None  # an endpoint's URL


@dataclass
class CaseRun:
    """One method on one prompt: all turns."""

    token_ids: list[int]  # an endpoint's: [] (its tokens are counted, not seen)
    text: str
    new_tokens: int
    seconds: float  # spent generating (an endpoint's: request sent → end of stream; a baseline's: in its process)
    stats: list[GenerationStats]  # per turn, where reported
    first_token_seconds: list[float]  # endpoints: per turn
    peak_memory_bytes: int | None = None  # a baseline's, measured in its own process


def chat_ids(tokenizer, messages: list[dict]) -> list[int]:
    if tokenizer.chat_template:
        return tokenizer.apply_chat_template(messages)
    return tokenizer.encode("\n".join(m["content"] for m in messages))


def run_case(method, case: PromptCase, tokenizer, sampling: SamplingParams, max_new_tokens: int) -> CaseRun:
    messages, run = [], CaseRun([], "", 0, 0.0, [], [])
    for turn in case.turns:
        messages.append({"role": "user", "content": turn})
        prompt = list(messages) if method.kind == ENDPOINT else chat_ids(tokenizer, messages)
        start = time.perf_counter()
        output = method.generate(prompt, max_new_tokens, sampling)
        run.seconds += output.seconds if output.seconds is not None else time.perf_counter() - start
        if output.peak_memory_bytes is not None:
            run.peak_memory_bytes = max(run.peak_memory_bytes or 0, output.peak_memory_bytes)
        text = output.text if output.text is not None else tokenizer.decode(output.token_ids, skip_special_tokens=True)
        run.token_ids += output.token_ids
        run.text += text
        run.new_tokens += output.new_tokens if output.new_tokens is not None else len(output.token_ids)
        if output.stats is not None:
            run.stats.append(output.stats)
        if output.first_token_seconds is not None:
            run.first_token_seconds.append(output.first_token_seconds)
        messages.append({"role": "assistant", "content": text})
    return run


def warm_up(methods: list, tokenizer, temperature: float, failures: dict[str, str]) -> None:
    """Every method a short generation first: first calls pay allocations, lazy imports, cost models.
    A baseline that fails here goes into `failures`."""
    warm = PromptCase("warm-up", "warm-up", ("Hello",))
    for method in methods:
        if method.name in failures:
            continue
        try:
            run_case(method, warm, tokenizer, SamplingParams(temperature=temperature, seed=0), 8)
        except BaselineFailed as err:
            failures[method.name] = f"warming up: {err}"


def run_bench(cases: list[PromptCase], methods_at: dict[float, list], tokenizer, max_new_tokens: int,
              repeats: int, device: torch.device, seed: int = 0, progress=None, on_row=None,
              failures: dict[str, str] | None = None) -> list[dict]:
    """Rows, one per prompt and temperature: {"case": ..., "temperature": t, "runs": {method name: MethodRun}};
    `on_row(row)` sees each as soon as it is complete (the command writes it down at once). Sampled runs
    draw with seed `seed + 1000 * prompt index + repeat`, the same for every method.
    `progress(done, number, case, temperature, method_name)` is told before each run starts: the runs
    done so far, then the prompt (the `number`-th of `cases`, from 1), temperature and method to run.
    A baseline that fails (`BaselineFailed`) is left out of every row, earlier ones too, and `failures`
    gets its name and what happened."""
    failures = {} if failures is None else failures
    memory = PeakMemory(device)
    for temperature, methods in methods_at.items():
        warm_up(methods, tokenizer, temperature, failures)
    rows, done = [], 0
    # this project's methods (the baselines learn nothing), each once even if it runs at every temperature
    learners = {id(m): m for methods in methods_at.values() for m in methods if hasattr(m, "hold_learning")}.values()
    for number, case in enumerate(cases):
        for method in learners:
            method.hold_learning()
        for temperature, methods in methods_at.items():
            collected: dict[str, dict] = {m.name: {"first": None, "rates": [], "seconds": [], "tokens": [], "stats": [],
                                                   "peak": None, "ttft": []} for m in methods}
            for repeat in range(repeats):
                sampling = SamplingParams(temperature=temperature, seed=seed + 1000 * number + repeat)
                for method in run_order(methods, number, repeat):
                    if method.name in failures:
                        continue
                    if progress:
                        progress(done, number + 1, case, temperature, method.name)
                    memory.reset()
                    try:
                        run = run_case(method, case, tokenizer, sampling, max_new_tokens)
                    except BaselineFailed as err:
                        failures[method.name] = f"prompt {number + 1} ({case.id}): {err}"
                        for row in rows:
                            row["runs"].pop(method.name, None)
                        continue
                    slot = collected[method.name]
                    peak = run.peak_memory_bytes  # a baseline's own process
                    if peak is None and method.kind != ENDPOINT:  # a server's memory is not ours
                        peak = memory.peak()
                    if peak is not None:
                        slot["peak"] = max(slot["peak"] or 0, peak)
                    slot["first"] = slot["first"] or run
                    slot["rates"].append(run.new_tokens / run.seconds if run.seconds else 0.0)
                    slot["seconds"].append(run.seconds)
                    slot["tokens"].append(run.new_tokens)
                    slot["stats"] += run.stats
                    slot["ttft"] += run.first_token_seconds
                    done += 1
            rows.append({"case": case, "temperature": temperature, "runs": {
                m.name: MethodRun(s["first"].token_ids, s["rates"], s["seconds"], s["tokens"],
                                  GenerationStats.merge(s["stats"]) if s["stats"] else None, s["peak"], s["first"].text,
                                  s["ttft"], getattr(m, "url", None))
                for m, s in ((m, collected[m.name]) for m in methods if m.name not in failures)}})
            if on_row:
                on_row(rows[-1])
        for method in learners:
            method.release_learning()
    return rows


def run_order(methods: list, prompt: int, repeat: int) -> list:
    """The methods in the order of this prompt's (index from 0) repeat: as given for even prompts,
    reversed for odd ones, turned by `repeat` places."""
    ordered = list(methods) if prompt % 2 == 0 else list(reversed(methods))
    shift = repeat % len(ordered) if ordered else 0
    return ordered[shift:] + ordered[:shift]


def median_rate(run: MethodRun) -> float:
    return statistics.median(run.rates)
