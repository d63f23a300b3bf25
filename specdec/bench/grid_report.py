"""A Markdown report of a γ grid run of `specdec.bench.quick`, by Spec-Bench's six categories.

    python -m specdec.bench.grid_report docs/bench/policy-grid-results.jsonl > docs/bench/policy-grid-report.md

Reads the per-prompt JSON lines the grid run wrote (`--out`), pools MT-bench's eight
sub-categories into `mt_bench`, and prints, per temperature: each drafter's speed-up over plain
decoding (mean of per-prompt ratios) at every γ and with auto, per category and overall, its
acceptance and MAT; then auto against the best fixed γ and against plain, per category, with the
targets of issue 3 (auto within 5% of the best fixed γ; never more than 5% below plain).
"""

from __future__ import annotations

import json
import statistics
import sys
from collections import defaultdict
from pathlib import Path

from specdec.bench.prompts import MT_BENCH

AUTO_SUFFIX = " γ=auto"


def load_rows(path: Path) -> list[dict]:
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    for row in rows:
        row["group"] = "mt_bench" if row["category"] in MT_BENCH else row["category"]
    return rows


def speedup(rows: list[dict], method: str) -> float:
    return statistics.mean(r[method]["tokens_per_second"] / r["plain"]["tokens_per_second"] for r in rows)


def grid_methods(rows: list[dict]) -> dict[str, list[str]]:
    """Drafter spec → its methods in γ order (fixed γ ascending, then auto)."""
    specs: dict[str, list[str]] = defaultdict(list)
    for name in rows[0]:
        if isinstance(rows[0][name], dict) and " γ=" in name:
            specs[name.split(" γ=")[0]].append(name)
    for names in specs.values():
        names.sort(key=lambda n: (n.endswith(AUTO_SUFFIX), int(n.split("γ=")[1]) if not n.endswith(AUTO_SUFFIX) else 0))
    return specs


def report(rows: list[dict]) -> str:
    out = []
    for temperature in sorted({r["temperature"] for r in rows}):
        at = [r for r in rows if r["temperature"] == temperature]
        groups = sorted({r["group"] for r in at})
        counts = {g: sum(r["group"] == g for r in at) for g in groups}
        mode = "greedy" if temperature == 0 else f"temperature {temperature:g}"
        out.append(f"## {mode}: speed-up over plain decoding (mean of per-prompt ratios)\n")
        out.append("prompts per category: " + ", ".join(f"{g} {counts[g]}" for g in groups) + "\n")
        header = ["method", *groups, "all", "α", "MAT", "identical"]
        out.append("| " + " | ".join(header) + " |")
        out.append("| --- " + "| ---: " * (len(header) - 1) + "|")
        for spec, names in grid_methods(at).items():
            for name in names:
                drafted = sum(r[name]["drafted"] for r in at)
                alpha = sum(r[name]["accepted"] for r in at) / drafted if drafted else 0.0
                mat = statistics.mean(r[name]["mean_accepted_tokens"] for r in at)
                same = f"{sum(r[name]['identical_to_plain'] for r in at)}/{len(at)}" if temperature == 0 else "-"
                cells = [f"{speedup([r for r in at if r['group'] == g], name):.2f}" for g in groups]
                out.append(f"| {name} | " + " | ".join(cells) + f" | {speedup(at, name):.2f} | {alpha:.2f} | {mat:.2f} | {same} |")
        out.append("")
        out.append(f"### {mode}: auto against the best fixed γ and against plain\n")
        out.append("| drafter | category | best fixed γ | its speed-up | auto | auto / best | within 5% of best | ≥ 0.95× plain |")
        out.append("| --- | --- | ---: | ---: | ---: | ---: | --- | --- |")
        for spec, names in grid_methods(at).items():
            fixed = [n for n in names if not n.endswith(AUTO_SUFFIX)]
            auto = spec + AUTO_SUFFIX
            if not fixed or auto not in names:
                continue
            for group in [*groups, "all"]:
                subset = at if group == "all" else [r for r in at if r["group"] == group]
                best = max(fixed, key=lambda n: speedup(subset, n))
                best_speedup, auto_speedup = speedup(subset, best), speedup(subset, auto)
                ratio = auto_speedup / best_speedup
                out.append(f"| {spec} | {group} | {best.split('γ=')[1]} | {best_speedup:.2f} | {auto_speedup:.2f} | "
                           f"{ratio:.2f} | {'yes' if ratio >= 0.95 else 'NO'} | {'yes' if auto_speedup >= 0.95 else 'NO'} |")
        out.append("")
    return "\n".join(out)


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not Path(args[0]).is_file():
        print("usage: python -m specdec.bench.grid_report RESULTS.jsonl", file=sys.stderr)
        return 2
    print(report(load_rows(Path(args[0]))))
    return 0


if __name__ == "__main__":
    sys.exit(main())
