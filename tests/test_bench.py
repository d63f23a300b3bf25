"""The benchmark helpers: prompt loading, summary arithmetic, the pass-cost probe."""

from __future__ import annotations

import json

import pytest

from specdec.bench.pass_cost import measure_pass_costs
from specdec.bench.quick import auto_vs_fixed, load_spec_bench, main, summarize
from specdec.errors import SpecdecError


def test_load_spec_bench_takes_first_turns_per_category(tmp_path):
    path = tmp_path / "q.jsonl"
    records = [{"question_id": i, "category": "a" if i < 3 else "b", "turns": [f"q{i}", "follow-up"]} for i in range(5)]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    prompts = load_spec_bench(path, per_category=2)
    assert [(p["category"], p["prompt"]) for p in prompts] == [("a", "q0"), ("a", "q1"), ("b", "q3"), ("b", "q4")]
    assert [p["prompt"] for p in load_spec_bench(path, 5, categories=["b"])] == ["q3", "q4"]
    with pytest.raises(SpecdecError, match=r"no prompts of categories \['c'\]; it has \['a', 'b'\]"):
        load_spec_bench(path, 5, categories=["c"])
    path.write_text('{"category": "a"}\n')
    with pytest.raises(SpecdecError, match="q.jsonl:1"):
        load_spec_bench(path, 1)


def test_summary_speedups_are_means_of_per_prompt_ratios():
    def row(category, hf, plain, ngram):
        return {"category": category,
                "hf-generate": {"tokens_per_second": hf, "identical_to_plain": True},
                "plain": {"tokens_per_second": plain, "identical_to_plain": True},
                "ngram": {"tokens_per_second": ngram, "identical_to_plain": False, "mean_accepted_tokens": 1.5,
                          "drafted": 10, "accepted": 4}}
    rows = [row("x", 10, 20, 40), row("y", 10, 10, 10)]
    summary = summarize(rows, ["hf-generate", "plain", "ngram"])
    assert summary["methods"]["ngram"]["speedup_vs_plain"] == 1.5  # mean of 2.0 and 1.0
    assert summary["methods"]["ngram"]["speedup_vs_hf_generate"] == 2.5  # mean of 4.0 and 1.0
    assert summary["methods"]["plain"]["speedup_vs_hf_generate"] == 1.5
    assert summary["methods"]["ngram"]["identical"] == 0
    assert summary["methods"]["ngram"]["mean_accepted_tokens"] == 1.5
    assert summary["methods"]["ngram"]["acceptance_rate"] == 0.4  # 8 of 20 drafted, pooled over prompts
    assert summary["speedup_vs_plain_by_category"]["x"]["ngram"] == 2.0


def test_auto_against_the_best_fixed_gamma():
    by_category = {"x": {"plain": 1.0, "d γ=1": 1.2, "d γ=2": 1.5, "d γ=auto": 1.44},
                   "y": {"plain": 1.0, "d γ=1": 0.8, "d γ=2": 0.7, "d γ=auto": 0.94}}
    x, y = auto_vs_fixed(by_category, ["d"], [1, 2, "auto"])
    assert (x["best_gamma"], x["best_speedup"], x["auto_over_best"]) == (2, 1.5, 0.96)
    assert x["within_5pct_of_best"] and x["not_5pct_below_plain"]
    assert y["best_gamma"] == 1 and y["within_5pct_of_best"] and not y["not_5pct_below_plain"]


def test_a_small_grid_run_end_to_end(tmp_path, tiny_folder, capsys):
    prompts = tmp_path / "p.jsonl"
    prompts.write_text("".join(json.dumps({"question_id": i, "category": c, "turns": [f"t5 t9 t{i} t5 t9"]}) + "\n"
                               for i, c in enumerate(["a", "b"])))
    out = tmp_path / "rows.jsonl"
    code = main(["--prompts", str(prompts), "--model", str(tiny_folder), "--per-category", "1", "--max-new-tokens", "12",
                 "--repeats", "1", "--gamma", "1,3,auto", "--temperature", "0,1", "--no-transformers",
                 "--drafter", "ngram", "--drafter", "suffix@auto", "--out", str(out)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out.strip().splitlines()[-1])
    greedy, sampled = summary["temperatures"]["0.0"], summary["temperatures"]["1.0"]
    assert set(greedy["methods"]) == {"plain", "ngram γ=1", "ngram γ=3", "ngram γ=auto", "suffix γ=auto"}
    assert all(m["identical"] == 2 for m in greedy["methods"].values())
    assert "identical" not in sampled["methods"]["plain"]
    assert len(greedy["auto_vs_fixed"]) == 2  # one drafter, two categories
    assert len(out.read_text().splitlines()) == 4  # two prompts, two temperatures


def test_pass_cost_probe_measures_each_size(tiny_target):
    costs = measure_pass_costs(tiny_target.net, context=10, sizes=[1, 2, 4], repeats=2)
    assert list(costs) == [1, 2, 4] and all(seconds > 0 for seconds in costs.values())
