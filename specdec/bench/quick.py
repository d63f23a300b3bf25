"""A side-by-side speed comparison on Spec-Bench prompts, in one process.

    python -m specdec.bench.quick --prompts ../shared/workloads/spec_bench_dev.jsonl
    python -m specdec.bench.quick --prompts ... --drafter ngram --drafter suffix --gamma 1,2,4,8,auto --temperature 0,1

Methods, run interleaved prompt by prompt (so that machine drift hits all alike), after one warm-up
generation each, `--repeats` times per prompt and temperature:
    hf-generate     transformers `generate` on the same float32 weights (greedy runs only)
    hf-lookup       transformers assisted generation with prompt lookup (greedy runs only)
    plain           this project's plain decoding
    DRAFTER γ=G     this project with each `--drafter` spec at each `--gamma` (a number or auto)
For every prompt and method it records tokens per second (median over the repeats), MAT and
acceptance, and for greedy runs whether the output equals this project's plain decoding. Sampled
runs use the same seed for every method. Speed-ups are means of per-prompt ratios, as Spec-Bench
defines them. With several γ, each drafter's `auto` is compared per category with its best fixed γ
and with plain decoding (the targets of issue 3: within 5% of the best, never 5% below plain).
Prints tables, then one JSON summary as the last line.
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
from specdec.engine import AUTO, Engine, GenerationConfig
from specdec.errors import SpecdecError
from specdec.runtime import load_model
from specdec.sampling import SamplingParams


def load_spec_bench(path: Path, per_category: int, categories: list[str] | None = None) -> list[dict]:
    """First-turn prompts from a Spec-Bench JSON-lines file, `per_category` of each category (or of
    the given ones), in file order."""
    try:
        lines = path.read_text().splitlines()
    except OSError as err:
        raise SpecdecError(f"cannot read prompts file {path}: {err.strerror}") from None
    taken: dict[str, int] = defaultdict(int)
    seen: set[str] = set()
    prompts = []
    for number, line in enumerate(lines, 1):
        if not line.strip():
            continue
        try:
            item = json.loads(line)
            category, text = item["category"], item["turns"][0]
        except (json.JSONDecodeError, KeyError, IndexError, TypeError):
            raise SpecdecError(f"{path}:{number} is not a Spec-Bench record (question_id, category, turns)") from None
        seen.add(category)
        if taken[category] < per_category and (not categories or category in categories):
            taken[category] += 1
            prompts.append({"id": item.get("question_id"), "category": category, "prompt": text})
    missing = set(categories or []) - seen
    if missing:
        raise SpecdecError(f"{path} has no prompts of categories {sorted(missing)}; it has {sorted(seen)}")
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
    parser.add_argument("--category", action="append", default=None, help="only these categories (repeatable)")
    parser.add_argument("--ask-twice", action="store_true",
                        help="send each prompt twice in a row (a repeated request: what a drafter that learns from its outputs is for)")
    parser.add_argument("--max-new-tokens", type=int, default=128)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--gamma", type=_gamma_list, default=[4], help="comma-separated: numbers >= 1 and/or auto (default: 4)")
    parser.add_argument("--temperature", type=_float_list, default=[0.0], help="comma-separated, 0 = greedy (default: 0)")
    parser.add_argument("--drafter", action="append", default=None,
                        help="a drafter spec as in `specdec generate --drafter` (repeatable; default: ngram); "
                             "SPEC@G1,G2 runs it at these γ only instead of --gamma")
    parser.add_argument("--no-transformers", action="store_true", help="leave out the transformers baselines")
    parser.add_argument("--out", type=Path, default=None, help="write per-prompt results as JSON lines here")
    args = parser.parse_args(argv)
    try:
        return run(args)
    except SpecdecError as err:
        print(f"error: {err}", file=sys.stderr)
        return 1


def _gamma_list(text: str) -> list:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part != AUTO and not (part.isdigit() and int(part) >= 1):
            raise argparse.ArgumentTypeError(f"each gamma must be a whole number >= 1 or auto, got '{part}'")
        out.append(part if part == AUTO else int(part))
    return out


def _float_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated numbers, got '{text}'") from None
    if any(v < 0 for v in values):
        raise argparse.ArgumentTypeError("temperatures must be >= 0")
    return values


def method_name(spec: str, gamma, gammas: list) -> str:
    return spec if len(gammas) == 1 else f"{spec} γ={gamma}"


def run(args) -> int:
    from rich.console import Console
    from rich.progress import Progress

    console = Console(stderr=True)
    prompts = load_spec_bench(args.prompts, args.per_category, args.category)
    if args.ask_twice:
        prompts = [dict(item, asked=n) for item in prompts for n in (1, 2)]
    target = load_model(args.model)
    grid = {}  # drafter spec → its γ values
    for text in args.drafter or ["ngram"]:
        spec, at, gammas = text.partition("@")
        grid[spec] = _gamma_list(gammas) if at else args.gamma
    specs = list(grid)
    plain_engine = Engine(target)
    # one engine (and drafter) per method: a drafter that learns from its outputs learns from its own
    engines = {"plain": (plain_engine, 1)}
    for spec, gammas in grid.items():
        for gamma in gammas:
            engines[method_name(spec, gamma, args.gamma)] = (Engine(target, build_drafter(spec, target)), gamma)
    hf_methods = {}
    if not args.no_transformers and 0.0 in args.temperature:
        hf = TransformersRunner(target.folder, target.eos_token_ids)
        lookup_gamma = next((g for g in args.gamma if g != AUTO), 4)
        hf_lookup = TransformersRunner(target.folder, target.eos_token_ids, lookup_tokens=lookup_gamma)
        hf_methods = {"hf-generate": hf, "hf-lookup": hf_lookup}

    def ours(name, ids, sampling):
        engine, gamma = engines[name]
        result = engine.generate(ids, GenerationConfig(max_new_tokens=args.max_new_tokens, gamma=gamma, sampling=sampling))
        stats = result.stats
        return result.token_ids, {"mean_accepted_tokens": round(stats.mean_accepted_tokens, 3),
                                  "acceptance_rate": round(stats.acceptance_rate, 3),
                                  "drafted": stats.drafted, "accepted": stats.accepted,
                                  "plain_rounds": stats.by_drafter["plain"].rounds if "plain" in stats.by_drafter else 0}

    warm = plain_engine.encode("Hello")
    for name in engines:  # warm-up: first-call costs (allocations, lazy imports, the cost model)
        ours(name, warm, SamplingParams())
    for runner in hf_methods.values():
        runner.generate(warm, 4)

    rows = []
    methods_at = {t: (list(hf_methods) if t == 0 else []) + list(engines) for t in args.temperature}
    total = len(prompts) * args.repeats * sum(len(m) for m in methods_at.values())
    with Progress(console=console) as progress:
        task = progress.add_task("benchmark", total=total)
        for number, item in enumerate(prompts):
            ids = plain_engine.encode(item["prompt"])
            for temperature in args.temperature:
                times: dict[str, list[float]] = defaultdict(list)
                outputs: dict[str, list[int]] = {}
                extras: dict[str, dict] = {}
                for repeat in range(args.repeats):
                    sampling = SamplingParams(temperature=temperature, seed=1000 * number + repeat)
                    for name in methods_at[temperature]:
                        start = time.perf_counter()
                        if name in hf_methods:
                            outputs[name], extras[name] = hf_methods[name].generate(ids, args.max_new_tokens), {}
                        else:
                            outputs[name], extras[name] = ours(name, ids, sampling)
                        times[name].append(time.perf_counter() - start)
                        progress.advance(task)
                row = {**item, "temperature": temperature, "prompt_tokens": len(ids)}
                for name in methods_at[temperature]:
                    seconds = statistics.median(times[name])
                    row[name] = {
                        "new_tokens": len(outputs[name]),
                        "seconds": round(seconds, 4),
                        "tokens_per_second": round(len(outputs[name]) / seconds, 3),
                        "identical_to_plain": outputs[name] == outputs["plain"] if temperature == 0 else None,
                        **extras[name],
                    }
                rows.append(row)
    if args.out:
        args.out.write_text("".join(json.dumps(r) + "\n" for r in rows))

    summary = {"prompts": len(prompts), "max_new_tokens": args.max_new_tokens, "repeats": args.repeats,
               "temperatures": {}}
    for temperature in args.temperature:
        at = [r for r in rows if r["temperature"] == temperature]
        result = summarize(at, methods_at[temperature])
        if any(g == AUTO for g in args.gamma) and len(args.gamma) > 1:
            full = [spec for spec in specs if grid[spec] == args.gamma]
            result["auto_vs_fixed"] = auto_vs_fixed(result["speedup_vs_plain_by_category"], full, args.gamma)
        summary["temperatures"][str(temperature)] = result
        print_tables(result, temperature, args)
    print(json.dumps(summary))
    return 0


def print_tables(result: dict, temperature: float, args) -> None:
    from rich.console import Console
    from rich.table import Table

    console = Console()
    mode = "greedy" if temperature == 0 else f"temperature {temperature}"
    table = Table(title=f"{result['prompts']} prompts, {args.max_new_tokens} new tokens, median of {args.repeats}, {mode}")
    columns = ["method", "tokens/s (median)", "× plain", "MAT", "α"]
    has_hf = "hf-generate" in result["methods"]
    if has_hf:
        columns.insert(2, "× hf-generate")
    if temperature == 0:
        columns.append("identical to plain")
    for col in columns:
        table.add_column(col, justify="right")
    for name, s in result["methods"].items():
        cells = [name, f"{s['median_tokens_per_second']:.2f}", f"{s['speedup_vs_plain']:.2f}",
                 f"{s['mean_accepted_tokens']:.2f}" if "mean_accepted_tokens" in s else "-",
                 f"{s['acceptance_rate']:.2f}" if "acceptance_rate" in s else "-"]
        if has_hf:
            cells.insert(2, f"{s['speedup_vs_hf_generate']:.2f}")
        if temperature == 0:
            cells.append(f"{s['identical']}/{result['prompts']}")
        table.add_row(*cells)
    console.print(table)
    for check in result.get("auto_vs_fixed", []):
        verdict = "ok" if check["within_5pct_of_best"] and check["not_5pct_below_plain"] else "MISSED"
        console.print(f"{check['drafter']:>10} {check['category']:<16} best fixed γ={check['best_gamma']} "
                      f"{check['best_speedup']:.2f}×, auto {check['auto_speedup']:.2f}× "
                      f"({check['auto_over_best']:.2f} of best): {verdict}", highlight=False)


def summarize(rows: list[dict], methods: list[str]) -> dict:
    """Per method: median tokens/s, and speed-ups as means of per-prompt ratios (Spec-Bench's definition)."""
    out = {}
    for name in methods:
        rates = [r[name]["tokens_per_second"] for r in rows]
        out[name] = {
            "median_tokens_per_second": round(statistics.median(rates), 3),
            "speedup_vs_plain": round(statistics.mean(r[name]["tokens_per_second"] / r["plain"]["tokens_per_second"] for r in rows), 3),
        }
        if "hf-generate" in rows[0]:
            out[name]["speedup_vs_hf_generate"] = round(statistics.mean(
                r[name]["tokens_per_second"] / r["hf-generate"]["tokens_per_second"] for r in rows), 3)
        if rows[0][name]["identical_to_plain"] is not None:
            out[name]["identical"] = sum(r[name]["identical_to_plain"] for r in rows)
        if "mean_accepted_tokens" in rows[0][name]:
            out[name]["mean_accepted_tokens"] = round(statistics.mean(r[name]["mean_accepted_tokens"] for r in rows), 3)
            drafted = sum(r[name]["drafted"] for r in rows)
            out[name]["acceptance_rate"] = round(sum(r[name]["accepted"] for r in rows) / drafted, 3) if drafted else 0.0
    categories = sorted({r["category"] for r in rows})
    by_category = {
        c: {name: round(statistics.mean(r[name]["tokens_per_second"] / r["plain"]["tokens_per_second"]
                                        for r in rows if r["category"] == c), 3) for name in methods}
        for c in categories
    }
    return {"prompts": len(rows), "methods": out, "speedup_vs_plain_by_category": by_category}


def auto_vs_fixed(by_category: dict, specs: list[str], gammas: list) -> list[dict]:
    """Per drafter and category: the best fixed γ's speed-up over plain, auto's, and the two targets."""
    fixed = [g for g in gammas if g != AUTO]
    checks = []
    for spec in specs:
        for category, speedups in by_category.items():
            best = max(fixed, key=lambda g: speedups[method_name(spec, g, gammas)])
            best_speedup = speedups[method_name(spec, best, gammas)]
            auto = speedups[method_name(spec, AUTO, gammas)]
            checks.append({"drafter": spec, "category": category, "best_gamma": best, "best_speedup": best_speedup,
                           "auto_speedup": auto, "auto_over_best": round(auto / best_speedup, 3),
                           "within_5pct_of_best": auto >= 0.95 * best_speedup, "not_5pct_below_plain": auto >= 0.95})
    return checks


if __name__ == "__main__":
    sys.exit(main())
