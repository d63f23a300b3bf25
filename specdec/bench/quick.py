"""A side-by-side speed comparison on Spec-Bench prompts, greedy, one process.

    python -m specdec.bench.quick --prompts ../shared/workloads/spec_bench_dev.jsonl

Methods, run interleaved prompt by prompt (so that machine drift hits all alike), after one warm-up
generation each, `--repeats` times per prompt:
    hf-generate     transformers `generate`, greedy, on the same float32 weights
    hf-lookup       transformers assisted generation with prompt lookup (`prompt_lookup_num_tokens`)
    plain           this project's plain decoding
    DRAFTER         this project with each `--drafter` spec (default: ngram), e.g. early:8, suffix
For every prompt and method it records tokens per second (median over the repeats) and whether the
greedy output equals this project's plain decoding. Speed-ups are means of per-prompt ratios, as
Spec-Bench defines them. Prints a table, then one JSON summary as the last line.
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path

import torch

from specdec.drafters import build_drafter
from specdec.engine import Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.runtime import load_model


def load_spec_bench(path: Path, per_category: int) -> list[dict]:
    """First-turn prompts from a Spec-Bench JSON-lines file, `per_category` of each category, in file order."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise SpecdecError(f"cannot read prompts file {path}: {err.strerror}") from None
    taken: dict[str, int] = defaultdict(int)
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            category, text = item["category"], item["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecdecError(f"{path}:{number} is not a Spec-Bench record (question_id, category, turns)") from None
        if taken[category] < per_category:
            taken[category] += 1
            prompts.append({"id": item.get("question_id"), "category": category, "prompt": text})
    return prompts


class TransformersRunner:
    """transformers' own generate on the same weights: the baseline a user would otherwise pick."""

    def __init__(self, folder: Path, eos_token_ids: list[int], lookup_tokens: int = 0) -> None:
        from transformers import AutoModelForCausalLM

        self.model = AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32).eval()
        self.eos = eos_token_ids
        self.lookup_tokens = lookup_tokens

    def generate(self, prompt_ids: list[int], max_new_tokens: int) -> list[int]:
        extra = {"prompt_lookup_num_tokens": self.lookup_tokens} if self.lookup_tokens else {}
        with torch.inference_mode():
            out = self.model.generate(
                torch.tensor([prompt_ids]), attention_mask=torch.ones(1, len(prompt_ids), dtype=torch.long),
                max_new_tokens=max_new_tokens, do_sample=False, eos_token_id=self.eos, pad_token_id=self.eos[0],
                **extra,
            )
        return out[0, len(prompt_ids):].tolist()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--prompts", type=Path, required=True, help="Spec-Bench JSON-lines file")
    parser.add_argument("--model", default="smollm2-135m")
    parser.add_argument("--per-category", type=int, default=2)
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=int, default=4)
    parser.add_argument("--drafter", action="append", default=None,
                        help="a drafter spec as in `specdec generate --drafter` (repeatable; default: ngram)")
    parser.add_argument("--out", type=Path, default=None, help="write per-prompt results as JSON lines here")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SpecdecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def run(args) -> int:
    from rich.console import Console
    from rich.progress import Progress
    from rich.table import Table

    console = Console(stderr=True)
    prompts = load_spec_bench(args.prompts, args.per_category)
    target = load_model(args.model)
    config = GenerationConfig(max_new_tokens=args.max_new_tokens, gamma=args.gamma)
    plain_engine = Engine(target)
    drafted = {spec: Engine(target, build_drafter(spec, target)) for spec in args.drafter or ["ngram"]}
    hf = TransformersRunner(target.folder, target.eos_token_ids)
    hf_lookup = TransformersRunner(target.folder, target.eos_token_ids, lookup_tokens=args.gamma)

    def ours(engine):
        def run_once(ids):
            result = engine.generate(ids, config)
            return result.token_ids, {"mean_accepted_tokens": round(result.stats.mean_accepted_tokens, 3),
                                      "acceptance_rate": round(result.stats.acceptance_rate, 3)}
        return run_once

    methods = {
        "hf-generate": lambda ids: (hf.generate(ids, args.max_new_tokens), {}),
        "hf-lookup": lambda ids: (hf_lookup.generate(ids, args.max_new_tokens), {}),
        "plain": ours(plain_engine),
        **{spec: ours(engine) for spec, engine in drafted.items()},
    }
    warm = plain_engine.encode("Hello")
    for method in methods.values():  # warm-up: first-call costs (allocations, lazy imports)
        method(warm)

    rows = []
    with Progress(console=console) as progress:
        task = progress.add_task("benchmark", total=len(prompts) * args.repeats * len(methods))
        for item in prompts:
            ids = plain_engine.encode(item["prompt"])
            times: dict[str, list[float]] = defaultdict(list)
            outputs: dict[str, list[int]] = {}
            extras: dict[str, dict] = {}
            for _ in range(args.repeats):
                for name, method in methods.items():
                    start = time.perf_counter()
                    outputs[name], extras[name] = method(ids)
                    times[name].append(time.perf_counter() - start)
                    progress.advance(task)
            row = {**item, "prompt_tokens": len(ids)}
            for name in methods:
                seconds = statistics.median(times[name])
                row[name] = {
                    "new_tokens": len(outputs[name]),
                    "seconds": round(seconds, 4),
                    "tokens_per_second": round(len(outputs[name]) / seconds, 3),
                    "identical_to_plain": outputs[name] == outputs["plain"],
                    **extras[name],
                }
            rows.append(row)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))

    summary = summarize(rows, list(methods))
    table = Table(title=f"{len(rows)} prompts, {args.max_new_tokens} new tokens, median of {args.repeats}, greedy")
    for col in ("method", "tokens/s (median)", "× hf-generate", "× plain", "MAT", "identical to plain"):
        table.add_column(col, justify="right")
    for name, s in summary["methods"].items():
        mat = f"{s['mean_accepted_tokens']:.2f}" if "mean_accepted_tokens" in s else "-"
        table.add_row(name, f"{s['median_tokens_per_second']:.2f}", f"{s['speedup_vs_hf_generate']:.2f}",
                      f"{s['speedup_vs_plain']:.2f}", mat, f"{s['identical']}/{len(rows)}")
    Console().print(table)
    print(json.dumps(summary))
    return 0


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """Per method: median tokens/s, and speed-ups as means of per-prompt ratios (Spec-Bench's definition)."""
    out = {}
    for name in methods:
        rates = [r[name]["tokens_per_second"] for r in rows]
        out[name] = {
            "median_tokens_per_second": round(statistics.median(rates), 3),
            "speedup_vs_hf_generate": round(statistics.mean(r[name]["tokens_per_second"] / r["hf-generate"]["tokens_per_second"] for r in rows), 3),
            "speedup_vs_plain": round(statistics.mean(r[name]["tokens_per_second"] / r["plain"]["tokens_per_second"] for r in rows), 3),
            "identical": sum(r[name]["identical_to_plain"] for r in rows),
        }
        if "mean_accepted_tokens" in rows[0][name]:
            out[name]["mean_accepted_tokens"] = round(statistics.mean(r[name]["mean_accepted_tokens"] for r in rows), 3)
    categories = sorted({r["category"] for r in rows})
    by_category = {
        c: {name: round(statistics.mean(r[name]["tokens_per_second"] / r["plain"]["tokens_per_second"]
                                        for r in rows if r["category"] == c), 3) for name in methods}
        for c in categories
    }
    return {"prompts": len(rows), "methods": out, "speedup_vs_plain_by_category": by_category}


if __name__ == "__main__":
    sys.exit(main())
