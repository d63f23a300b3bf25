"""Numbers from benchmark rows: rates, speed-ups, MAT, acceptance, time shares, identity, predictions.

Definitions (Spec-Bench's where it has one):
    tokens per second   per prompt: the median over repeats of new tokens / generation seconds;
                        per method: the median over prompts, with the 25th and 75th percentiles
    speed-up over X     the mean over prompts of (method's tokens per second / X's), X = this
                        project's plain decoding, transformers' generate or llama.cpp; with endpoints
                        only (no local method), the first endpoint takes plain decoding's place
    time to first token endpoints: request sent → first streamed text, median and quartiles over requests
    MAT                 new tokens / target passes over all prompts, turns and repeats (prefill included)
    α per position      accepted / drafted at each draft position, pooled (share of rounds that
                        drafted position i and kept it)
    time shares         draft / verify / prefill seconds over total generation seconds
    identical           greedy runs: prompts whose new tokens equal plain decoding's; for the
                        others, the first differing position. Endpoints: whose answer text equals
                        the first endpoint's (their tokens are not seen), the position a character's
    predicted           `analysis.predicted_speedup` on the merged statistics and the cost model,
                        over plain decoding's merged rounds, the prefill on both sides;
                        prediction_error = predicted / measured × plain − 1, off_prediction when it is
                        beyond ±PREDICTION_TOLERANCE (the tables flag such rows)
"""

from __future__ import annotations

import statistics
from collections.abc import Sequence

from specdec.control.analysis import predicted_speedup
from specdec.bench.runner import median_rate
from specdec.records.stats import GenerationStats

PLAIN = "plain"
PREDICTION_TOLERANCE = 0.10  # a prediction further than 10% from the measured speed-up is flagged
HF_GENERATE = "hf-generate"
LLAMA_CPP = "llama.cpp"


def first_difference(a: Sequence, b: Sequence) -> int | None:
    """Index of the first position where two token lists (or texts) differ (None when equal)."""
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return None if len(a) == len(b) else min(len(a), len(b))


def quartiles(values: list[float]) -> tuple[float, float, float]:
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def mean_ratio(rows: list[dict], method: str, baseline: str) -> float:
    return statistics.mean(median_rate(r["runs"][method]) / median_rate(r["runs"][baseline]) for r in rows)


def endpoint_names(runs: dict) -> list[str]:
    return [name for name, run in runs.items() if run.endpoint]


def baseline_of(names, endpoints: list[str]) -> str:
    """What speed-ups are over: plain decoding, or the first endpoint when no local method ran."""
    return PLAIN if PLAIN in names else endpoints[0]


def speedup_key(baseline: str) -> str:
    return "speedup_vs_plain" if baseline == PLAIN else "speedup_vs_first_endpoint"


def _quartile_dict(values: list[float], digits: int) -> dict:
    q1, median, q3 = quartiles(values)
    return {"median": round(median, digits), "p25": round(q1, digits), "p75": round(q3, digits)}


def _stats_summary(merged: GenerationStats) -> dict:
    """MAT where the target passes are known, α where something was drafted, time shares where timed."""
    out = {}
    if merged.target_passes:
        out["mean_accepted_tokens"] = round(merged.mean_accepted_tokens, 4)
    out["acceptance_rate"] = round(merged.acceptance_rate, 4) if merged.drafted else None  # None: nothing drafted
    return out


def _differences(rows: list[dict], name: str) -> list[tuple[str, int | None]]:
    """(prompt, first differing position) against plain decoding's tokens, or an endpoint's text against the first endpoint's."""
    run = rows[0]["runs"][name]
    if run.endpoint:
        first = endpoint_names(rows[0]["runs"])[0]
        return [(r["case"].id, first_difference(r["runs"][name].text, r["runs"][first].text)) for r in rows]
    return [(r["case"].id, first_difference(r["runs"][name].token_ids, r["runs"][PLAIN].token_ids)) for r in rows]


def decoding_rate(stats: GenerationStats | None) -> float | None:
    """New tokens per second of the decoding alone (the time after the prefill), or None where the
    statistics carry no times (an endpoint's)."""
    if stats is None or stats.total_seconds <= stats.prefill_seconds:
        return None
    return stats.new_tokens / (stats.total_seconds - stats.prefill_seconds)


def decoding_alone(rows: list[dict], name: str) -> dict | None:
    """Where `name`'s answers and plain decoding's differ in length on some prompt (a sampled answer
    ends where an end-of-text token is drawn), the whole request's time weighs the prefill unevenly
    between them: then the mean per-prompt ratio of their decoding rates alone, and on how many
    prompts the lengths differ. None where they never differ or a rate is missing."""
    if name == PLAIN or any(PLAIN not in r["runs"] for r in rows):
        return None
    differ = sum(r["runs"][name].new_tokens != r["runs"][PLAIN].new_tokens for r in rows)
    rates = [(decoding_rate(r["runs"][name].stats), decoding_rate(r["runs"][PLAIN].stats)) for r in rows]
    if not differ or any(ours is None or not plain for ours, plain in rates):
        return None
    return {"speedup_vs_plain": round(statistics.mean(ours / plain for ours, plain in rates), 4),
            "lengths_differ": differ}


def method_summary(rows: list[dict], name: str, costs=None) -> dict:
    baseline = baseline_of(rows[0]["runs"], endpoint_names(rows[0]["runs"]))
    out = {"tokens_per_second": _quartile_dict([median_rate(r["runs"][name]) for r in rows], 3),
           speedup_key(baseline): round(mean_ratio(rows, name, baseline), 4)}
    endpoint = rows[0]["runs"][name].endpoint
    if endpoint:
        out["endpoint"] = endpoint
        firsts = [t for r in rows for t in r["runs"][name].first_token_seconds]
        if firsts:
            out["time_to_first_token_seconds"] = _quartile_dict(firsts, 4)
    if HF_GENERATE in rows[0]["runs"]:
        out["speedup_vs_hf_generate"] = round(mean_ratio(rows, name, HF_GENERATE), 4)
    if LLAMA_CPP in rows[0]["runs"]:
        out["speedup_vs_llama_cpp"] = round(mean_ratio(rows, name, LLAMA_CPP), 4)
    stats = [r["runs"][name].stats for r in rows if r["runs"][name].stats is not None]
    if stats:
        merged = GenerationStats.merge(stats)
        out.update(_stats_summary(merged))
        out["acceptance_per_position"] = [round(a, 4) for a in merged.acceptance_per_position]
        total = merged.total_seconds
        if total:  # an endpoint's statistics carry counts, not times
            out.update({"draft_share": round(merged.draft_seconds / total, 4),
                        "verify_share": round(merged.verify_seconds / total, 4),
                        "prefill_share": round(merged.prefill_seconds / total, 4)})
        if costs is not None:
            plains = [r["runs"][PLAIN].stats for r in rows if PLAIN in r["runs"] and r["runs"][PLAIN].stats is not None]
            predicted = predicted_speedup(merged, costs, GenerationStats.merge(plains) if plains else None)
            out["predicted_speedup"] = round(predicted, 4) if predicted is not None else None
            measured = out.get("speedup_vs_plain")
            if predicted is not None and measured:
                error = predicted / measured - 1
                out["prediction_error"] = round(error, 4)
                out["off_prediction"] = abs(error) > PREDICTION_TOLERANCE
    peaks = [r["runs"][name].peak_memory_bytes for r in rows if r["runs"][name].peak_memory_bytes is not None]
    if peaks:
        out["peak_memory_mb"] = round(max(peaks) / 2**20, 1)
    alone = decoding_alone(rows, name)
    if alone is not None:
        out["decoding_alone"] = alone
    if rows[0]["temperature"] == 0:
        differences = _differences(rows, name)
        mismatched = [(case, pos) for case, pos in differences if pos is not None]
        out["identical"] = len(rows) - len(mismatched)
        out["first_differences"] = [{"prompt": case, "position": pos} for case, pos in mismatched[:10]]
    return out


def summarize(rows: list[dict], costs_by_method: dict | None = None) -> dict:
    """Per temperature: each method overall and per category."""
    costs_by_method = costs_by_method or {}
    out = {}
    for temperature in sorted({r["temperature"] for r in rows}):
        at = [r for r in rows if r["temperature"] == temperature]
        names = list(at[0]["runs"])
        baseline = baseline_of(names, endpoint_names(at[0]["runs"]))
        categories = sorted({r["case"].category for r in at})
        by_category = {}
        for category in categories:
            subset = [r for r in at if r["case"].category == category]
            by_category[category] = {"prompts": len(subset), "methods": {}}
            for name in names:
                entry = {speedup_key(baseline): round(mean_ratio(subset, name, baseline), 4),
                         "tokens_per_second": [round(median_rate(r["runs"][name]), 3) for r in subset]}  # prompt order
                if HF_GENERATE in names:
                    entry["speedup_vs_hf_generate"] = round(mean_ratio(subset, name, HF_GENERATE), 4)
                if LLAMA_CPP in names:
                    entry["speedup_vs_llama_cpp"] = round(mean_ratio(subset, name, LLAMA_CPP), 4)
                stats = [r["runs"][name].stats for r in subset if r["runs"][name].stats is not None]
                if stats:
                    entry.update(_stats_summary(GenerationStats.merge(stats)))
                by_category[category]["methods"][name] = entry
        out[f"{temperature:g}"] = {
            "prompts": len(at),
            "baseline": baseline,
            "methods": {name: method_summary(at, name, costs_by_method.get(name)) for name in names},
            "by_category": by_category,
        }
    return out


def predicted_cell(m: dict) -> str:
    """A table's predicted × plain: the figure, marked ⚠ where it is beyond the tolerance of the measurement."""
    predicted = m.get("predicted_speedup")
    if predicted is None:
        return "–"
    return f"{predicted:.2f}" + (f" ⚠{m['prediction_error']:+.0%}" if m.get("off_prediction") else "")
