"""Issue 51's targets over the bench processes of this folder, and their spread across the runs.

    .venv/bin/python docs/bench/policy-51-d/targets.py docs/bench/policy-51-d/run-1 docs/bench/policy-51-d/run-2 ...

Each method's × plain is the report's (mean over the prompts of median tokens/s over plain's median);
the rounds each method drafted and accepted are compared between the runs, prompt by prompt, and
the first run's `auto` is split by drafter.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

from specdec.bench.report import speed_summary_from_results

FIXED = ("ngram γ=3", "suffix γ=2", "suffix γ=3")


def main() -> None:
    runs = [Path(arg) for arg in sys.argv[1:]]
    lines = {run: [json.loads(line) for line in (run / "results.jsonl").read_text().splitlines()] for run in runs}
    summaries = {run: speed_summary_from_results(rows) for run, rows in lines.items()}
    methods = list(summaries[runs[0]]["0"]["methods"])
    print("| method | " + " | ".join(f"T = {t}, {run.name}" for t in ("0", "1") for run in runs) + " | spread T = 0 | spread T = 1 |")
    print("| --- |" + " ---: |" * (2 * len(runs) + 2))
    for name in methods:
        cells, spreads = [], []
        for t in ("0", "1"):
            values = [summaries[run][t]["methods"][name]["speedup_vs_plain"] for run in runs]
            cells += [f"{v:.3f}" for v in values]
            spreads.append(f"{max(values) / min(values) - 1:+.1%}")
        print(f"| {name} | " + " | ".join(cells + spreads) + " |")
    print()
    print("| target | " + " | ".join(run.name for run in runs) + " |")
    print("| --- |" + " --- |" * len(runs))
    rows = {"greedy auto / best fixed γ (≥ 0.97)": [], "suffix γ auto / its best fixed γ (≥ 0.97)": [],
            "auto × plain at T = 1 (≥ 0.98)": []}
    for run in runs:
        greedy, sampled = summaries[run]["0"]["methods"], summaries[run]["1"]["methods"]
        x = {n: greedy[n]["speedup_vs_plain"] for n in greedy}
        best = max(FIXED, key=x.get)
        best_suffix = max(("suffix γ=2", "suffix γ=3"), key=x.get)
        rows["greedy auto / best fixed γ (≥ 0.97)"].append((x["auto"] / x[best], 0.97, best))
        rows["suffix γ auto / its best fixed γ (≥ 0.97)"].append((x["suffix"] / x[best_suffix], 0.97, best_suffix))
        rows["auto × plain at T = 1 (≥ 0.98)"].append((sampled["auto"]["speedup_vs_plain"], 0.98, ""))
    for label, values in rows.items():
        print(f"| {label} | " + " | ".join(f"{v:.3f}{f' (vs {b})' if b else ''}: {'met' if v >= bound else 'MISSED'}"
                                           for v, bound, b in values) + " |")
    print()
    differing = 0
    for index, first in enumerate(lines[runs[0]]):
        for run in runs[1:]:
            other = lines[run][index]
            for name, method in first["methods"].items():
                if "stats" not in method or not method["stats"]:
                    continue
                a, b = method["stats"], other["methods"][name]["stats"]
                if (a["drafted"], a["accepted"], a["target_passes"]) != (b["drafted"], b["accepted"], b["target_passes"]):
                    differing += 1
                    print(f"differs: {run.name}, T={first['temperature']:g}, prompt {first['id']}, {name}")
    rows_compared = sum(1 for line in lines[runs[0]] for m in line["methods"].values() if m.get("stats"))
    print(f"{rows_compared} (temperature, prompt, method) rows of {runs[0].name} compared with each other run: "
          f"{differing} differ in drafted, accepted or target passes")
    print()
    auto_by_drafter(lines[runs[0]], runs[0].name)


def auto_by_drafter(rows: list[dict], run: str) -> None:
    """`auto`'s rounds by drafter over the prompts of one run, each temperature: rounds, tokens drafted
    and accepted, and the seconds its draft and verification took (all repeats together)."""
    print(f"`auto` by drafter, {run} (all prompts and repeats):")
    print("| T | drafter | rounds | drafted | accepted | draft + verify s |")
    print("| --- | --- | ---: | ---: | ---: | ---: |")
    for temperature in sorted({row["temperature"] for row in rows}):
        totals: dict[str, list[float]] = {}
        for row in rows:
            if row["temperature"] != temperature:
                continue
            for name, part in row["methods"]["auto"]["stats"]["by_drafter"].items():
                total = totals.setdefault(name, [0, 0, 0, 0.0])
                for i, key in enumerate(("drafting_rounds", "drafted", "accepted")):
                    total[i] += part[key]
                total[3] += part["draft_seconds"] + part["verify_seconds"]
        for name, (rounds, drafted, accepted, seconds) in sorted(totals.items()):
            if name != "plain":
                print(f"| {temperature:g} | {name} | {rounds} | {drafted} | {accepted} | {seconds:.2f} |")


if __name__ == "__main__":
    main()
