"""What `specdec bench` writes: a terminal table, a Markdown report, PNG plots, raw JSON lines.

The report states measured results. With `specdec bench --targets` (this project's own benchmark,
`make bench`) it also states plainly where a measured number falls below a target set by an issue:
    our plain decoding ≥ 1.3× transformers' generate                           (issue 2)
    each drafter's auto γ within 5% of its best fixed γ, never < 0.95× plain   (issue 3)
    EAGLE tree MAT ≥ 3.0                                                       (issue 4)
    with llama.cpp: our plain decoding ≥ 1.0×, the best auto γ drafter ≥ 1.5× (issue 14)
    the `auto` policy ≥ 0.98× plain when sampling, ≥ 0.97× the best single drafter
    run beside it (any γ) when greedy; a drafter's γ = auto ≥ 0.97× its best
    fixed γ when greedy                                                        (issues 30, 51)
`python -m specdec.bench.report RESULTS.jsonl` checks a finished run's targets again (speeds only).
"""

from __future__ import annotations

import json
import math
import statistics
from pathlib import Path

from specdec.bench.metrics import (HF_GENERATE, LLAMA_CPP, PLAIN, PREDICTION_TOLERANCE, baseline_of, predicted_cell,
                                   speedup_key)
from specdec.terminal import figures_table, plural

PLAIN_OVER_HF_TARGET = 1.3
AUTO_WITHIN = 0.95
EAGLE_MAT_TARGET = 3.0
PLAIN_OVER_LLAMA_CPP_TARGET = 1.0  # issue 14: our plain decoding at least llama.cpp's, same GGUF
BEST_OVER_LLAMA_CPP_TARGET = 1.5  # issue 14: the best drafter with γ = auto
AUTO_OVER_PLAIN_SAMPLING = 0.98  # issues 30, 51: `auto` against plain decoding when sampling
AUTO_OVER_BEST_GREEDY = 0.97  # issue 51: greedy `auto` against the best single drafter, fixed γ included
GAMMA_AUTO_OVER_FIXED = 0.97  # issue 51: a drafter with γ = auto against its own best fixed γ (greedy)


def raw_rows(rows: list[dict]) -> list[dict]:
    """Rows as JSON-ready dicts: per prompt, temperature and method, every repeat's numbers."""
    out = []
    for row in rows:
        case = row["case"]
        out.append({
            "id": case.id, "category": case.category, "subcategory": case.subcategory, "turns": len(case.turns),
            "temperature": row["temperature"],
            "methods": {name: {"tokens_per_second": [round(r, 3) for r in run.rates],
                               "seconds": [round(s, 4) for s in run.seconds], "new_tokens": run.new_tokens,
                               "stats": run.stats.to_dict() if run.stats else None,
                               "peak_memory_bytes": run.peak_memory_bytes, **_endpoint_fields(run)}
                        for name, run in row["runs"].items()},
        })
    return out


def _endpoint_fields(run) -> dict:
    """An endpoint's URL, each request's time to first token, and its first answer (its tokens are not seen)."""
    if not run.endpoint:
        return {}
    return {"endpoint": run.endpoint, "time_to_first_token_seconds": [round(t, 4) for t in run.first_token_seconds],
            "text": run.text}


def paired_ratio(a: dict, b: dict, threshold: float) -> str:
    """For a miss: method a's tokens per second over b's, prompt by prompt (the same prompts, run
    side by side), their mean ± standard error, and whether the target's threshold lies within two
    standard errors of the mean (then this run cannot tell the miss from the machine's noise)."""
    rates_a, rates_b = a.get("tokens_per_second"), b.get("tokens_per_second")
    if not rates_a or not rates_b or len(rates_a) != len(rates_b) or len(rates_a) < 2 or 0 in rates_b:
        return ""
    ratios = [x / y for x, y in zip(rates_a, rates_b)]
    mean, error = statistics.mean(ratios), statistics.stdev(ratios) / math.sqrt(len(ratios))
    verdict = "within two standard errors of" if mean + 2 * error >= threshold else "beyond two standard errors below"
    return (f" (per prompt {mean:.2f} ± {error:.2f} standard error over {len(ratios)} prompts: "
            f"{verdict} {threshold:.2f})")


def auto_gamma_rows(methods) -> list[str]:
    """This project's drafter rows that ran with γ = auto: "SPEC γ=auto", or a bare spec."""
    return [name for name in methods if "endpoint" not in methods[name] and (name.endswith(" γ=auto") or (
        " γ=" not in name and name not in (PLAIN, LLAMA_CPP) and not name.startswith("hf-")))]


def target_notes(summary: dict) -> list[str]:
    """One line per target checked: met or missed, with the numbers; a per-category miss says whether
    it stands out of the noise between prompts (`paired_ratio`)."""
    notes = []
    for temperature, result in summary.items():
        methods = result["methods"]
        if temperature == "0" and HF_GENERATE in methods:
            ratio = methods[PLAIN]["speedup_vs_hf_generate"]
            verdict = "met" if ratio >= PLAIN_OVER_HF_TARGET else "MISSED"
            notes.append(f"T={temperature}: our plain decoding is {ratio:.2f}× transformers' generate "
                         f"(target ≥ {PLAIN_OVER_HF_TARGET}×): {verdict}")
        if LLAMA_CPP in methods:
            ratio = methods[PLAIN]["speedup_vs_llama_cpp"]
            verdict = "met" if ratio >= PLAIN_OVER_LLAMA_CPP_TARGET else "MISSED"
            notes.append(f"T={temperature}: our plain decoding is {ratio:.2f}× llama.cpp's on the same GGUF "
                         f"(target ≥ {PLAIN_OVER_LLAMA_CPP_TARGET}×): {verdict}")
            drafted = auto_gamma_rows(methods)
            if drafted:
                best = max(drafted, key=lambda n: methods[n]["speedup_vs_llama_cpp"])
                ratio = methods[best]["speedup_vs_llama_cpp"]
                verdict = "met" if ratio >= BEST_OVER_LLAMA_CPP_TARGET else "MISSED"
                notes.append(f"T={temperature}: our best drafter with γ = auto ({best}) is {ratio:.2f}× llama.cpp's "
                             f"plain decoding (target ≥ {BEST_OVER_LLAMA_CPP_TARGET}×): {verdict}")
        for name in methods:
            if name in auto_gamma_rows(methods):
                spec = name.removesuffix(" γ=auto")  # a bare drafter spec ran with γ = auto
                fixed = [n for n in methods if n.startswith(spec + " γ=") and n != name]
                for category, entry in result["by_category"].items():
                    auto = entry["methods"][name]["speedup_vs_plain"]
                    if fixed:
                        best_name = max(fixed, key=lambda n: entry["methods"][n]["speedup_vs_plain"])
                        best = entry["methods"][best_name]["speedup_vs_plain"]
                        if auto < AUTO_WITHIN * best:
                            noise = paired_ratio(entry["methods"][name], entry["methods"][best_name], AUTO_WITHIN)
                            notes.append(f"T={temperature}, {category}: {name} is {auto:.2f}× plain, below 95% of "
                                         f"{best_name} ({best:.2f}×): MISSED{noise}")
                    if auto < AUTO_WITHIN:
                        noise = paired_ratio(entry["methods"][name], entry["methods"].get(PLAIN, {}), AUTO_WITHIN)
                        notes.append(f"T={temperature}, {category}: {name} is {auto:.2f}× plain, more than 5% "
                                     f"slower than plain decoding: MISSED{noise}")
            if name.split(":")[0].removesuffix(" γ=auto") == "auto" and "speedup_vs_plain" in methods[name]:
                notes += auto_policy_notes(temperature, result, name)
            elif temperature == "0" and name in auto_gamma_rows(methods) and "speedup_vs_plain" in methods[name]:
                notes += gamma_auto_notes(result, name)
            if name.startswith("eagle") and "mean_accepted_tokens" in methods[name]:
                mat = methods[name]["mean_accepted_tokens"]
                verdict = "met" if mat >= EAGLE_MAT_TARGET else "MISSED"
                notes.append(f"T={temperature}: {name} MAT {mat:.2f} (target ≥ {EAGLE_MAT_TARGET}): {verdict}")
    return notes


def auto_policy_notes(temperature: str, result: dict, name: str) -> list[str]:
    """Issue 51's line for an `auto` row: sampling, its speed-up over plain decoding; greedy, over the
    best single drafter run beside it, any γ (none: no line); each with the per-prompt paired ratio,
    whose standard error says whether this run can tell a miss (or a pass) from the machine's noise."""
    methods = result["methods"]
    auto = methods[name]["speedup_vs_plain"]
    if temperature != "0":
        verdict = "met" if auto >= AUTO_OVER_PLAIN_SAMPLING else "MISSED"
        return [f"T={temperature}: {name} is {auto:.3f}× plain decoding (target ≥ {AUTO_OVER_PLAIN_SAMPLING}×): "
                f"{verdict}{paired_ratio(per_prompt(result, name), per_prompt(result, PLAIN), AUTO_OVER_PLAIN_SAMPLING)}"]
    singles = [n for n in methods if _ours(methods, n) and n.split(":")[0].split(" γ=")[0] != "auto"]
    if not singles:
        return []
    best = max(singles, key=lambda n: methods[n]["speedup_vs_plain"])
    ratio = auto / methods[best]["speedup_vs_plain"]
    verdict = "met" if ratio >= AUTO_OVER_BEST_GREEDY else "MISSED"
    return [f"T={temperature}: {name} is {ratio:.3f}× the best single drafter, {best} ({auto:.3f}× against "
            f"{methods[best]['speedup_vs_plain']:.3f}× plain; target ≥ {AUTO_OVER_BEST_GREEDY}×): {verdict}"
            f"{paired_ratio(per_prompt(result, name), per_prompt(result, best), AUTO_OVER_BEST_GREEDY)}"]


def gamma_auto_notes(result: dict, name: str) -> list[str]:
    """Issue 51's line for a single drafter's γ = auto row, greedy: against its own best fixed γ."""
    methods = result["methods"]
    spec = name.removesuffix(" γ=auto")
    fixed = [n for n in methods if n.startswith(spec + " γ=") and n != name and "speedup_vs_plain" in methods[n]]
    if not fixed or spec.split(":")[0] == "auto":
        return []
    best = max(fixed, key=lambda n: methods[n]["speedup_vs_plain"])
    auto, theirs = methods[name]["speedup_vs_plain"], methods[best]["speedup_vs_plain"]
    verdict = "met" if auto >= GAMMA_AUTO_OVER_FIXED * theirs else "MISSED"
    return [f"T=0: {name} is {auto / theirs:.3f}× its best fixed γ, {best} ({auto:.3f}× against {theirs:.3f}× "
            f"plain; target ≥ {GAMMA_AUTO_OVER_FIXED}×): {verdict}"
            f"{paired_ratio(per_prompt(result, name), per_prompt(result, best), GAMMA_AUTO_OVER_FIXED)}"]


def per_prompt(result: dict, method: str) -> dict:
    """A method's tokens per second, prompt by prompt (category by category)."""
    return {"tokens_per_second": [rate for category in sorted(result["by_category"])
                                  for rate in result["by_category"][category]["methods"][method]["tokens_per_second"]]}


def _ours(methods: dict, name: str) -> bool:
    """Whether a row is one of this project's drafters (not plain, a baseline or an endpoint)."""
    return ("endpoint" not in methods[name] and "speedup_vs_plain" in methods[name]
            and name not in (PLAIN, LLAMA_CPP) and not name.startswith("hf-"))


def _fmt(value, spec: str = ".2f", suffix: str = "") -> str:
    return "–" if value is None else f"{value:{spec}}{suffix}"  # – : not measured, or nothing to measure


def baseline_heading(result: dict) -> str:
    """How the report names what speed-ups are over: plain decoding, or the first endpoint."""
    baseline = result.get("baseline", PLAIN)
    return "plain" if baseline == PLAIN else baseline


def identity_heading(methods: dict) -> str:
    """What greedy outputs are compared with: plain decoding's tokens, the first endpoint's text, or both."""
    endpoints = [name for name, m in methods.items() if "endpoint" in m]
    if not endpoints:
        return "plain"
    return endpoints[0] if len(endpoints) == len(methods) else f"plain (endpoints: {endpoints[0]})"


def print_tables(summary: dict, console) -> None:
    """The terminal's table per temperature (80 columns: short headings), then one legend for them."""
    legend = {}  # heading → what it means, in the order first shown
    for temperature, result in summary.items():
        methods = result["methods"]
        has_hf, has_llama = HF_GENERATE in methods, LLAMA_CPP in methods
        has_ttft = any("time_to_first_token_seconds" in m for m in methods.values())
        has_alone = any("decoding_alone" in m for m in methods.values())
        baseline, key = baseline_heading(result), speedup_key(result["baseline"])
        over = f"×{baseline}" if len(baseline) <= 8 else "×base"  # an endpoint's label can be long
        columns = {"tokens/s": "median over prompts",
                   **({"TTFT s": "median time to first token"} if has_ttft else {}),
                   **({"×hf": "speed-up over transformers' generate"} if has_hf else {}),
                   **({"×llama": "speed-up over llama.cpp's plain decoding"} if has_llama else {}),
                   over: f"speed-up over {'plain decoding' if baseline == PLAIN else baseline}",
                   **({"×dec": "× plain over the decoding alone (after the prefill), for methods whose answers "
                                  "differ in length from plain decoding's on some prompts (--ignore-eos evens them)"}
                      if has_alone else {}),
                   "predicted": f"the ×{PLAIN} the models predict from the run's α, γ and measured costs "
                                f"(⚠: more than {PREDICTION_TOLERANCE:.0%} off)",
                   "MAT": "tokens per target pass", "α": "accepted / drafted",
                   **({"same": f"prompts whose greedy output is identical to {identity_heading(methods)}'s"}
                      if temperature == "0" else {})}
        for heading, meaning in columns.items():
            legend.setdefault(heading, meaning)
        mode = "greedy" if temperature == "0" else f"T = {temperature}"
        table = figures_table(f"{plural(result['prompts'], 'prompt')}, {mode}", "method", list(columns))
        for name, m in methods.items():
            cells = [name, *method_cells(m, key, has_ttft, has_hf, has_llama, spread=False, alone=has_alone)]
            if temperature == "0":
                cells.append(f"{m['identical']}/{result['prompts']}")
            table.add_row(*cells)
        console.print(table)
    if legend:
        console.print("[dim]" + "; ".join(f"{heading}: {meaning}" for heading, meaning in legend.items())
                      + ". Speed-ups are means of per-prompt ratios of tokens per second; report.md has more.[/dim]",
                      highlight=False, soft_wrap=False)


def method_cells(m: dict, key: str, has_ttft: bool, has_hf: bool, has_llama: bool, spread: bool,
                 alone: bool = False) -> list[str]:
    """A method's cells from tokens/s to α, in the terminal's table and the report's (`spread`: the
    medians with their quartiles; `alone`: the × plain over the decoding alone after the × baseline)."""
    def timing(figures: dict | None, digits: int) -> str:
        if not figures:
            return "–"
        median = f"{figures['median']:.{digits}f}"
        return f"{median} [{figures['p25']:.{digits}f}, {figures['p75']:.{digits}f}]" if spread else median

    cells = [timing(m["tokens_per_second"], 2)]
    if has_ttft:
        cells.append(timing(m.get("time_to_first_token_seconds"), 3))
    if has_hf:
        cells.append(_fmt(m.get("speedup_vs_hf_generate")))
    if has_llama:
        cells.append(_fmt(m.get("speedup_vs_llama_cpp")))
    cells.append(_fmt(m[key]))
    if alone:
        cells.append(_fmt(m.get("decoding_alone", {}).get("speedup_vs_plain")))
    return cells + [predicted_cell(m), _fmt(m.get("mean_accepted_tokens")), _fmt(m.get("acceptance_rate"))]


def markdown(summary: dict, header: dict, targets: bool = False) -> str:
    """The report; `targets` adds the section of this project's targets, met or missed."""
    lines = ["# specdec bench report", ""]
    lines += [f"- {key}: {value}" for key, value in header.items()]
    lines.append("")
    for temperature, result in summary.items():
        mode = "greedy" if temperature == "0" else f"temperature {temperature}"
        methods = result["methods"]
        has_hf, has_llama = HF_GENERATE in methods, LLAMA_CPP in methods
        has_ttft = any("time_to_first_token_seconds" in m for m in methods.values())
        baseline, key = baseline_heading(result), speedup_key(result.get("baseline", PLAIN))
        lines += [f"## {mode} ({plural(result['prompts'], 'prompt')})", ""]
        cols = ["method", "tokens/s median [p25, p75]"] + (["first token s median [p25, p75]"] if has_ttft else []) + \
               (["× hf-generate"] if has_hf else []) + (["× llama.cpp"] if has_llama else []) + \
               [f"× {baseline}", "predicted × plain", "MAT", "α", "draft / verify share", "peak memory"] + \
               ([f"identical to {identity_heading(methods)}"] if temperature == "0" else [])
        lines += ["| " + " | ".join(cols) + " |", "| --- " + "| ---: " * (len(cols) - 1) + "|"]
        for name, m in methods.items():
            cells = [name, *method_cells(m, key, has_ttft, has_hf, has_llama, spread=True),
                     f"{m['draft_share']:.2f} / {m['verify_share']:.2f}" if "draft_share" in m else "–",
                      _fmt(m.get("peak_memory_mb"), ".0f", " MB")]
            if temperature == "0":
                cells.append(f"{m['identical']}/{result['prompts']}")
            lines.append("| " + " | ".join(cells) + " |")
        lines.append("")
        alone = {name: m["decoding_alone"] for name, m in methods.items() if "decoding_alone" in m}
        if alone:
            ratios = ", ".join(f"{name} {a['speedup_vs_plain']:.2f}× ({a['lengths_differ']} of {result['prompts']})"
                               for name, a in alone.items())
            lines += ["Answer lengths differ from plain decoding's on some prompts (an end-of-text token drawn at "
                      "another step), so \"× plain\" over the whole request weighs the prefill unevenly. Over the "
                      f"decoding alone (new tokens over the time after the prefill), × plain (prompts whose lengths "
                      f"differ): {ratios}. `--ignore-eos` gives every answer the same length.", ""]
        if any(m.get("off_prediction") for m in methods.values()):
            lines += [f"⚠: the prediction (the acceptance model on the run's α, γ and measured costs: run-aware where the run kept counts per position) is more than "
                      f"{PREDICTION_TOLERANCE:.0%} from the measured speed-up over plain decoding (the sign: predicted above or below).", ""]
        categories = list(result["by_category"])
        lines += [f"### {mode}: speed-up over {'plain decoding' if baseline == 'plain' else baseline} by category (MAT)", "",
                  "| method | " + " | ".join(f"{c} ({result['by_category'][c]['prompts']})" for c in categories) + " |",
                  "| --- " + "| ---: " * len(categories) + "|"]
        for name in methods:
            cells = []
            for c in categories:
                entry = result["by_category"][c]["methods"][name]
                mat = f" ({entry['mean_accepted_tokens']:.2f})" if "mean_accepted_tokens" in entry else ""
                cells.append(f"{entry[key]:.2f}{mat}")
            lines.append(f"| {name} | " + " | ".join(cells) + " |")
        lines.append("")
        positions = max((len(m.get("acceptance_per_position", [])) for m in methods.values()), default=0)
        if positions:
            lines += [f"### {mode}: acceptance by draft position", "",
                      "| method | " + " | ".join(str(i + 1) for i in range(positions)) + " |",
                      "| --- " + "| ---: " * positions + "|"]
            for name, m in methods.items():
                per = m.get("acceptance_per_position") or []
                if per:
                    lines.append(f"| {name} | " + " | ".join(f"{a:.2f}" for a in per) + " |" + " - |" * (positions - len(per)))
            lines.append("")
        mismatches = {n: m["first_differences"] for n, m in methods.items() if m.get("first_differences")}
        first_endpoint = next((n for n, m in methods.items() if "endpoint" in m), None)
        for name, diffs in mismatches.items():
            unit, reference = ("character", first_endpoint) if "endpoint" in methods[name] else ("token", "plain decoding")
            where = ", ".join(f"prompt {d['prompt']} at {unit} {d['position']}" for d in diffs)
            lines.append(f"**{name} differs from {reference}**: {where}")
        if mismatches:
            lines.append("")
    if targets:
        notes = target_notes(summary)
        lines += ["## Targets", ""] + [f"- {n}" for n in notes or ["no targets apply to the methods run"]] + [""]
    lines += ["Plots: `speedup_by_category.png`, `acceptance_by_position.png`, `predicted_vs_measured.png`.",
              "Raw per-prompt numbers: `results.jsonl`.", ""]
    return "\n".join(lines)


def plots(summary: dict, out_dir: Path) -> list[Path]:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    written = []
    temperatures = list(summary)
    # 1. speed-up over plain by category and method
    fig, axes = plt.subplots(len(temperatures), 1, figsize=(10, 3.6 * len(temperatures)), squeeze=False)
    for ax, temperature in zip(axes[:, 0], temperatures):
        result = summary[temperature]
        categories = list(result["by_category"])
        baseline = result.get("baseline", PLAIN)
        names = [n for n in result["methods"] if n != baseline]
        width = 0.8 / max(len(names), 1)
        for i, name in enumerate(names):
            values = [result["by_category"][c]["methods"][name][speedup_key(baseline)] for c in categories]
            ax.bar([x + i * width for x in range(len(categories))], values, width, label=name)
        ax.axhline(1.0, color="black", linewidth=0.8)
        ax.set_xticks([x + width * (len(names) - 1) / 2 for x in range(len(categories))], categories, fontsize=8)
        ax.set_ylabel("× plain decoding" if baseline == PLAIN else f"× {baseline}")
        ax.set_title("greedy" if temperature == "0" else f"temperature {temperature}")
        if names:
            ax.legend(fontsize=7, ncol=3)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "speedup_by_category.png"))
    # 2. acceptance by draft position
    fig, ax = plt.subplots(figsize=(7, 4))
    for temperature in temperatures:
        for name, m in summary[temperature]["methods"].items():
            per = m.get("acceptance_per_position") or []
            if per:
                ax.plot(range(1, len(per) + 1), per, marker="o", label=f"{name} (T={temperature})")
    ax.set_xlabel("draft position")
    ax.set_ylabel("accepted / drafted")
    ax.set_ylim(0, 1)
    if ax.get_legend_handles_labels()[0]:
        ax.legend(fontsize=7)
    else:
        ax.text(0.5, 0.5, "nothing was drafted", ha="center", transform=ax.transAxes)
    fig.tight_layout()
    written.append(_save(fig, out_dir / "acceptance_by_position.png"))
    # 3. measured against predicted speed-up
    fig, ax = plt.subplots(figsize=(5, 5))
    points = [(m["predicted_speedup"], m["speedup_vs_plain"], f"{n} (T={t})")
              for t in temperatures for n, m in summary[t]["methods"].items() if m.get("predicted_speedup") is not None]
    for predicted, measured, label in points:
        ax.scatter(predicted, measured)
        ax.annotate(label, (predicted, measured), fontsize=6)
    if points:
        low = min(min(p, m) for p, m, _ in points) * 0.9
        high = max(max(p, m) for p, m, _ in points) * 1.1
        ax.plot([low, high], [low, high], color="gray", linewidth=0.8)
    ax.set_xlabel("predicted × plain (seed formula, measured α, γ, costs)")
    ax.set_ylabel("measured × plain")
    fig.tight_layout()
    written.append(_save(fig, out_dir / "predicted_vs_measured.png"))
    return written


def _save(fig, path: Path) -> Path:
    import matplotlib.pyplot as plt

    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def write_report(rows: list[dict], summary: dict, header: dict, out_dir: Path, targets: bool = False) -> list[Path]:
    out_dir.mkdir(parents=True, exist_ok=True)
    results = out_dir / "results.jsonl"
    results.write_text("".join(json.dumps(r) + "\n" for r in raw_rows(rows)))
    report = out_dir / "report.md"
    report.write_text(markdown(summary, header, targets))
    return [report, results, *plots(summary, out_dir)]


def speed_summary_from_results(lines: list[dict]) -> dict:
    """The speed part of a summary (per temperature and category: each method's per-prompt tokens
    per second and mean speed-up over plain; per temperature, each method's mean speed-up) rebuilt from results.jsonl rows, enough for
    `target_notes`: a finished run's targets can be checked again by newer code."""
    out: dict = {}
    for line in lines:
        result = out.setdefault(f"{line['temperature']:g}", {"methods": {}, "by_category": {}})
        methods = result["by_category"].setdefault(line["category"], {"methods": {}})["methods"]
        for name, run in line["methods"].items():
            result["methods"].setdefault(name, {"endpoint": run["endpoint"]} if "endpoint" in run else {})
            methods.setdefault(name, {"tokens_per_second": []})["tokens_per_second"].append(
                statistics.median(run["tokens_per_second"]))
    for result in out.values():
        result["by_category"] = dict(sorted(result["by_category"].items()))
        endpoints = [name for name, m in result["methods"].items() if "endpoint" in m]
        result["baseline"] = baseline_of(result["methods"], endpoints)
        key = speedup_key(result["baseline"])
        for entry in result["by_category"].values():
            baseline = entry["methods"][result["baseline"]]["tokens_per_second"]
            for method in entry["methods"].values():
                method[key] = statistics.mean(x / y for x, y in zip(method["tokens_per_second"], baseline))
        references = {key: result["baseline"], **{field: name for field, name in (
            ("speedup_vs_hf_generate", HF_GENERATE), ("speedup_vs_llama_cpp", LLAMA_CPP)) if name in result["methods"]}}
        for name, method in result["methods"].items():  # over all prompts: the mean of their ratios
            for field, reference in references.items():
                method[field] = statistics.mean(
                    x / y for entry in result["by_category"].values() for x, y in
                    zip(entry["methods"][name]["tokens_per_second"], entry["methods"][reference]["tokens_per_second"]))
    return out


if __name__ == "__main__":  # python -m specdec.bench.report RESULTS.jsonl: the targets of a finished run
    import sys

    if len(sys.argv) != 2:
        sys.exit("usage: python -m specdec.bench.report RESULTS.jsonl")
    rows = [json.loads(line) for line in Path(sys.argv[1]).read_text().splitlines() if line.strip()]
    print("\n".join(f"- {note}" for note in target_notes(speed_summary_from_results(rows))) or "no targets apply")

