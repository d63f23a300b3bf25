"""The benchmark helpers: prompt loading, summary arithmetic, the pass-cost probe."""

from __future__ import annotations

import json

import pytest

from specdec.bench.pass_cost import measure_pass_costs
from specdec.bench.quick import load_spec_bench, summarize
from specdec.errors import SpecdecError


def test_load_spec_bench_takes_first_turns_per_category(tmp_path):
    path = tmp_path / "q.jsonl"
    records = [{"question_id": i, "category": "a" if i < 3 else "b", "turns": [f"q{i}", "follow-up"]} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    prompts = load_spec_bench(path, per_category=2)
    assert [(p["category"], p["prompt"]) for p in prompts] == [("a", "q0"), ("a", "q1"), ("b", "q3"), ("b", "q4")]
    path.write_text('{"category": "a"}\n')
    with pytest.raises(SpecdecError, match="q.jsonl:1"):
        load_spec_bench(path, 1)


def test_summary_speedups_are_means_of_per_prompt_ratios():
    def row(category, hf, plain, ngram):
        return {"category": category,
                "hf-generate": {"tokens_per_second": hf, "identical_to_plain": True},
                "plain": {"tokens_per_second": plain, "identical_to_plain": True},
                "ngram": {"tokens_per_second": ngram, "identical_to_plain": False, "mean_accepted_tokens": 1.5}}
    rows = [row("x", 10, 20, 40), row("y", 10, 10, 10)]
    summary = summarize(rows, ["hf-generate", "plain", "ngram"])
    assert summary["methods"]["ngram"]["speedup_vs_plain"] == 1.5  # mean of 2.0 and 1.0
    assert summary["methods"]["ngram"]["speedup_vs_hf_generate"] == 2.5  # mean of 4.0 and 1.0
    assert summary["methods"]["plain"]["speedup_vs_hf_generate"] == 1.5
    assert summary["methods"]["ngram"]["identical"] == 0
    assert summary["methods"]["ngram"]["mean_accepted_tokens"] == 1.5
    assert summary["speedup_vs_plain_by_category"]["x"]["ngram"] == 2.0


def test_pass_cost_probe_measures_each_size(tiny_target):
    costs = measure_pass_costs(tiny_target.net, context=10, sizes=[1, 2, 4], repeats=2)
    assert list(costs) == [1, 2, 4] and all(seconds > 0 for seconds in costs.values())
