"""`specdec bench`: prompt formats, the metric arithmetic on hand-made results, the report and plots of a tiny run."""

from __future__ import annotations

import gzip
import json
import re
import sys

import pytest
import torch

from specdec.bench.memory import PeakMemory
from specdec.bench.metrics import first_difference, summarize
from specdec.bench.prompts import PromptCase, load_prompts
from specdec.bench.report import markdown, paired_ratio, speed_summary_from_results, target_notes
from specdec.bench.runner import MethodRun
from specdec.cli import main
from specdec.errors import SpecdecError
from specdec.records.stats import GenerationStats


def spec_bench_file(path, records):
    path.write_text("".join(json.dumps(r) + "\n" for r in records))
    return path


def test_spec_bench_prompts_group_mt_bench_and_take_turns(tmp_path):
    records = [{"question_id": i, "category": c, "turns": [f"q{i}", f"q{i} again"]}
               for i, c in enumerate(["writing", "writing", "coding", "qa", "qa", "qa"])]
    path = spec_bench_file(tmp_path / "p.jsonl", records)
    cases = load_prompts(str(path))
    assert [(c.category, c.subcategory) for c in cases][:3] == [("mt_bench", "writing"), ("mt_bench", "writing"),
                                                                ("mt_bench", "coding")]
    assert cases[0].turns == ("q0", "q0 again")
    # two per category: MT-bench round-robin over its sub-categories (one writing, one coding)
    assert [c.id for c in load_prompts(str(path), per_category=2)] == ["0", "2", "3", "4"]
    assert [c.id for c in load_prompts(str(path), categories=["coding"])] == ["2"]
    assert load_prompts(str(path), max_turns=1)[0].turns == ("q0",)
    with pytest.raises(SpecdecError, match=r"no prompts of categories \['rag'\]"):
        load_prompts(str(path), categories=["rag"])


@pytest.mark.parametrize("line,ok", [('{"category": "qa", "turns": ["hi"]}', True), ('{"category": "qa"}', False),
                                     ('{"category": "qa", "turns": []}', False), ("not json", False),
                                     ('{"category": "qa", "turns": [3]}', False), ('{"category": 3, "turns": ["hi"]}', False),
                                     ('{"category": {"qa": 1}, "turns": ["hi"]}', False), ('{"category": "", "turns": ["hi"]}', False)])
def test_spec_bench_records_are_checked(tmp_path, line, ok):
    path = tmp_path / "p.jsonl"
    path.write_text(line + "\n")
    if ok:
        assert load_prompts(str(path))[0].turns == ("hi",)
    else:
        with pytest.raises(SpecdecError, match="p.jsonl:1 is not a Spec-Bench record"):
            load_prompts(str(path))


def test_text_and_humaneval_prompts(tmp_path):
    path = tmp_path / "p.txt"
    path.write_text("first prompt\n\n  second prompt  \n")
    assert [(c.category, c.turns) for c in load_prompts(str(path))] == [("text", ("first prompt",)), ("text", ("second prompt",))]
    humaneval = load_prompts("humaneval", per_category=3)
    assert [c.id for c in humaneval] == ["HumanEval/0", "HumanEval/1", "HumanEval/2"]
    assert "def has_close_elements" in humaneval[0].turns[0]
    with pytest.raises(SpecdecError, match="does not exist"):
        load_prompts(str(tmp_path / "missing.txt"))


def test_the_starter_prompts_ship_with_the_package():
    cases = load_prompts("starter")
    assert len(cases) == 12
    categories = ["mt_bench", "translation", "summarization", "qa", "math_reasoning", "rag"]
    assert {c: sum(case.category == c for case in cases) for c in categories} == {c: 2 for c in categories}
    assert all(case.turns and all(turn.strip() for turn in case.turns) for case in cases)


@pytest.mark.parametrize("name,data,message", [
    ("photo.txt", b"\x89PNG\r\n\x1a\n\x00\x00\x00\rIHDR", "is not UTF-8 text (byte 0x89 at offset 0)"),
    ("prompts.txt", gzip.compress(b"a prompt\n"), "is not UTF-8 text (byte 0x8b at offset 1)"),
    ("prompts.jsonl", gzip.compress(b'{"category": "qa", "turns": ["hi"]}\n'), "is not UTF-8 text (byte 0x8b at offset 1)"),
    ("latin1.txt", "café au lait\n".encode("latin-1"), "is not UTF-8 text (byte 0xe9 at offset 3)"),
    ("nul.txt", b"first prompt\nsec\x00ond\n", "is not a text file (a NUL byte at offset 16)"),
], ids=["png", "gzip", "gzip-jsonl", "latin-1", "nul"])
def test_a_prompts_file_that_is_not_text_is_refused(tmp_path, name, data, message):
    path = tmp_path / name
    path.write_bytes(data)
    with pytest.raises(SpecdecError) as err:
        load_prompts(str(path))
    assert str(err.value).startswith(f"prompts file {path} {message}: give a Spec-Bench .jsonl file, a UTF-8 text file")


def test_utf8_text_still_loads(tmp_path):
    text = tmp_path / "p.txt"
    text.write_text("Übersetze: café, naïve, 東京\n", encoding="utf-8")
    assert load_prompts(str(text))[0].turns == ("Übersetze: café, naïve, 東京",)
    marked = tmp_path / "p.jsonl"  # a byte-order mark, as some editors write one
    marked.write_bytes(b"\xef\xbb\xbf" + json.dumps({"category": "qa", "turns": ["hi"]}).encode() + b"\n")
    assert load_prompts(str(marked))[0].turns == ("hi",)


def test_bench_names_a_binary_prompts_file(tmp_path, capsys):
    path = tmp_path / "photo.txt"
    path.write_bytes(b"\x89PNG\r\n\x1a\n\x00\x00")
    assert main(["bench", "--prompts", str(path), "--out-dir", str(tmp_path / "out")]) == 1
    assert f"specdec: error: prompts file {path} is not UTF-8 text" in capsys.readouterr().err


def test_first_difference():
    assert first_difference([1, 2, 3], [1, 2, 3]) is None
    assert first_difference([1, 2, 3], [1, 5, 3]) == 1
    assert first_difference([1, 2], [1, 2, 3]) == 2


def run(rates, ids, drafted=0, accepted=0, passes=1, tokens=1):
    stats = None
    if passes:
        stats = GenerationStats(drafter="x", new_tokens=tokens, target_passes=passes, drafted=drafted, accepted=accepted,
                                total_seconds=1.0, draft_seconds=0.1, verify_seconds=0.8)
    return MethodRun(ids, rates, [1.0] * len(rates), [len(ids)] * len(rates), stats, None)


def test_metric_arithmetic_on_hand_made_rows():
    a, b = PromptCase("a", "x", ("p",)), PromptCase("b", "y", ("p",))
    rows = [
        {"case": a, "temperature": 0.0, "runs": {"hf-generate": run([5.0], [1, 2], passes=0),
                                                 "plain": run([10.0, 12.0, 11.0], [1, 2], tokens=10, passes=10),
                                                 "ngram": run([22.0], [1, 2], drafted=10, accepted=5, tokens=10, passes=5)}},
        {"case": b, "temperature": 0.0, "runs": {"hf-generate": run([10.0], [3, 4], passes=0),
                                                 "plain": run([10.0], [3, 4], tokens=10, passes=10),
                                                 "ngram": run([10.0], [3, 9], drafted=10, accepted=1, tokens=10, passes=9)}},
    ]
    result = summarize(rows)["0"]
    ngram = result["methods"]["ngram"]
    assert ngram["speedup_vs_plain"] == pytest.approx((22 / 11 + 10 / 10) / 2)  # plain's median of 3 repeats is 11
    assert ngram["speedup_vs_hf_generate"] == pytest.approx((22 / 5 + 10 / 10) / 2)
    assert ngram["tokens_per_second"] == {"median": 16.0, "p25": 13.0, "p75": 19.0}
    assert ngram["mean_accepted_tokens"] == pytest.approx(20 / 14, abs=1e-4)  # the summary rounds it to 4 decimals
    assert ngram["acceptance_rate"] == 0.3
    assert ngram["identical"] == 1 and ngram["first_differences"] == [{"prompt": "b", "position": 1}]
    assert ngram["draft_share"] == pytest.approx(0.1) and ngram["verify_share"] == pytest.approx(0.8)
    assert result["by_category"]["x"]["methods"]["ngram"]["speedup_vs_plain"] == pytest.approx(2.0)
    assert "mean_accepted_tokens" not in result["methods"]["hf-generate"]


def timed_run(tokens: int, prefill: float, decoding: float) -> MethodRun:
    """One repeat of `tokens` new tokens: `prefill` seconds, then `decoding` seconds of passes."""
    total = prefill + decoding
    stats = GenerationStats(drafter="x", new_tokens=tokens, target_passes=tokens, total_seconds=total,
                            prefill_seconds=prefill, verify_seconds=decoding)
    return MethodRun(list(range(tokens)), [tokens / total], [total], [tokens], stats, None)


def test_a_sampled_answer_stopped_early_is_compared_over_its_decoding_alone():
    """Both decode at 100 tokens/s after a 1 s prefill; the method's sampled answer on prompt a ended
    after 20 tokens where plain decoding's ran to 100. Over the whole request that reads as
    (20 / 1.2) / (100 / 2) = 0.33× on a; over the decoding alone it is 1.0× on both prompts, which the
    summary and the report give beside it. Control: the same run with equal lengths reports nothing
    of the kind (the whole-time ratio is then fair)."""
    a, b = PromptCase("a", "x", ("p",)), PromptCase("b", "x", ("p",))
    rows = [{"case": a, "temperature": 1.0, "runs": {"plain": timed_run(100, 1.0, 1.0), "ngram": timed_run(20, 1.0, 0.2)}},
            {"case": b, "temperature": 1.0, "runs": {"plain": timed_run(100, 1.0, 1.0), "ngram": timed_run(100, 1.0, 1.0)}}]
    result = summarize(rows)["1"]
    ngram = result["methods"]["ngram"]
    assert ngram["speedup_vs_plain"] == pytest.approx(((20 / 1.2) / 50 + 1) / 2, abs=1e-4)  # rounded to 4 decimals
    assert ngram["decoding_alone"] == {"speedup_vs_plain": 1.0, "lengths_differ": 1}
    text = markdown(summarize(rows), {})
    assert "Over the decoding alone" in text and "ngram 1.00× (1 of 2)" in text
    table = terminal_table(summarize(rows))
    assert "×dec" in table and re.search(r"ngram .* 0\.67 .* 1\.00 ", table)  # whole-time, then decoding alone
    assert re.search(r"plain .* 1\.00 .* – ", table)  # plain's own row: nothing to compare over decoding alone
    rows[0]["runs"]["ngram"] = timed_run(100, 1.0, 1.0)
    same = summarize(rows)
    assert "decoding_alone" not in same["1"]["methods"]["ngram"] and "decoding alone" not in markdown(same, {})
    assert "×dec" not in terminal_table(same)


def terminal_table(summary: dict) -> str:
    from io import StringIO

    from rich.console import Console

    from specdec.bench.report import print_tables

    buffer = StringIO()
    print_tables(summary, Console(file=buffer, width=200))
    return buffer.getvalue()


def test_targets_are_reported_plainly():
    summary = {"0": {"methods": {"plain": {"speedup_vs_hf_generate": 1.2}, "hf-generate": {}},
                     "by_category": {"qa": {"methods": {"d γ=2": {"speedup_vs_plain": 1.5},
                                                        "d γ=auto": {"speedup_vs_plain": 1.3}}},
                                     "rag": {"methods": {"d γ=2": {"speedup_vs_plain": 0.9},
                                                         "d γ=auto": {"speedup_vs_plain": 0.92}}}}}}
    summary["0"]["methods"].update({"d γ=2": {}, "d γ=auto": {}, "e": {}})  # e: a bare spec, γ = auto
    summary["0"]["by_category"]["rag"]["methods"]["e"] = {"speedup_vs_plain": 0.8}
    summary["0"]["by_category"]["qa"]["methods"]["e"] = {"speedup_vs_plain": 1.0}
    notes = target_notes(summary)
    assert any("rag: e is 0.80× plain, more than 5% slower than plain decoding: MISSED" in n for n in notes)
    assert any("1.20× transformers' generate (target ≥ 1.3×): MISSED" in n for n in notes)
    assert any("qa: d γ=auto is 1.30× plain, below 95% of d γ=2 (1.50×): MISSED" in n for n in notes)
    assert any("rag: d γ=auto is 0.92× plain, more than 5% slower than plain decoding: MISSED" in n for n in notes)
    assert not any("rag: d γ=auto is 0.92× plain, below 95%" in n for n in notes)  # 0.92 ≥ 0.95 × 0.90


def test_the_auto_policy_targets_from_a_finished_run():
    """Issue 51's lines, checked again from results.jsonl rows: greedy, `auto` against the best single
    drafter beside it, any γ (suffix γ=3: (1.35 + 1.2) / 2 = 1.275× plain; auto (1.24 + 1.15) / 2 =
    1.195×: 0.937, missed), and suffix with γ = auto against its best fixed γ (1.25 / 1.275 = 0.980,
    met); sampling, `auto` against plain (0.99×, met). A run with llama.cpp gets its overall ratios too."""
    def line(case, category, temperature, rates):
        return {"id": case, "category": category, "temperature": temperature,
                "methods": {name: {"tokens_per_second": [rate]} for name, rate in rates.items()}}

    rows = [line("1", "qa", 0.0, {"plain": 10.0, "ngram": 12.0, "suffix": 13.0, "suffix γ=3": 13.5, "auto": 12.4,
                                  "llama.cpp": 5.0}),
            line("2", "rag", 0.0, {"plain": 10.0, "ngram": 11.0, "suffix": 12.0, "suffix γ=3": 12.0, "auto": 11.5,
                                   "llama.cpp": 5.0}),
            line("1", "qa", 1.0, {"plain": 10.0, "ngram": 10.0, "suffix": 10.0, "auto": 9.9, "llama.cpp": 5.0}),
            line("2", "rag", 1.0, {"plain": 10.0, "ngram": 10.0, "suffix": 10.0, "auto": 9.9, "llama.cpp": 5.0})]
    summary = speed_summary_from_results(rows)
    assert summary["0"]["methods"]["auto"]["speedup_vs_plain"] == pytest.approx((1.24 + 1.15) / 2)
    assert summary["0"]["methods"]["plain"]["speedup_vs_llama_cpp"] == pytest.approx(2.0)
    notes = target_notes(summary)
    assert any(n.startswith("T=0: auto is 0.937× the best single drafter, suffix γ=3 (1.195× against 1.275× plain; "
                            "target ≥ 0.97×): MISSED (per prompt 0.94 ± 0.02") for n in notes), notes
    assert any(n.startswith("T=0: suffix is 0.980× its best fixed γ, suffix γ=3 (1.250× against 1.275× plain; "
                            "target ≥ 0.97×): met") for n in notes), notes
    assert any(n.startswith("T=1: auto is 0.990× plain decoding (target ≥ 0.98×): met") for n in notes), notes
    assert any("our plain decoding is 2.00× llama.cpp's" in n for n in notes), notes


def test_a_miss_says_whether_it_stands_out_of_the_noise():
    """Per prompt ratios 0.80, 0.82, 0.78 (mean 0.80, standard error 0.012): a real miss; ratios
    0.70, 1.00, 0.85, 1.05 (mean 0.90 ± 0.08): 0.95 lies within two standard errors."""
    steady = {"a": {"tokens_per_second": [8.0, 8.2, 7.8]}, "b": {"tokens_per_second": [10.0, 10.0, 10.0]}}
    noisy = {"a": {"tokens_per_second": [7.0, 10.0, 8.5, 10.5]}, "b": {"tokens_per_second": [10.0] * 4}}
    assert paired_ratio(steady["a"], steady["b"], 0.95) == (
        " (per prompt 0.80 ± 0.01 standard error over 3 prompts: beyond two standard errors below 0.95)")
    assert "0.90 ± 0.08 standard error over 4 prompts: within two standard errors of 0.95" in paired_ratio(
        noisy["a"], noisy["b"], 0.95)
    assert paired_ratio({"tokens_per_second": [1.0]}, {"tokens_per_second": [1.0]}, 0.95) == ""  # one prompt: no spread


def test_a_prediction_beyond_ten_percent_is_flagged():
    from specdec.bench.metrics import predicted_cell

    assert predicted_cell({"predicted_speedup": 1.07, "prediction_error": -0.1439, "off_prediction": True}) == "1.07 ⚠-14%"
    assert predicted_cell({"predicted_speedup": 1.25, "prediction_error": 0.04, "off_prediction": False}) == "1.25"
    assert predicted_cell({"predicted_speedup": None}) == "–"


def test_a_tiny_bench_writes_report_plots_and_raw_results(tmp_path, tiny_folder, capsys):
    prompts = spec_bench_file(tmp_path / "p.jsonl", [
        {"question_id": 1, "category": "qa", "turns": ["t5 t9 t12 t5 t9"]},
        {"question_id": 2, "category": "writing", "turns": ["t7 t8 t7 t8", "t3 t4"]},
    ])
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--drafter", "ngram", "--drafter", "suffix@1,3",
                 "--gamma", "2,auto", "--temperature", "0,1", "--max-new-tokens", "6", "--out-dir", str(out), "--targets", "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    summary = json.loads(captured.out.strip().splitlines()[-1])["summary"]
    greedy = summary["0"]
    assert list(greedy["methods"]) == ["hf-generate", "hf-lookup", "plain", "ngram γ=2", "ngram γ=auto",
                                       "suffix γ=1", "suffix γ=3"]  # one row per (drafter, γ), none lost
    assert all(m["identical"] == 2 for m in greedy["methods"].values())  # every method, greedy: plain's tokens
    assert set(greedy["by_category"]) == {"qa", "mt_bench"}
    assert greedy["methods"]["ngram γ=2"]["predicted_speedup"] is not None
    for temperature in ("0", "1"):  # every predicted row, greedy and T = 1, carries its check against the measurement
        for m in summary[temperature]["methods"].values():
            if m.get("predicted_speedup") is not None:
                # all three rounded to 4 decimals: a/b − 1 moves by ≲ 5e-5·(1 + (1 + a/b)/b), under 1e-3 for b ≥ 0.2, a/b ≤ 3
                assert m["prediction_error"] == pytest.approx(m["predicted_speedup"] / m["speedup_vs_plain"] - 1, abs=1e-3)
                assert m["off_prediction"] == (abs(m["prediction_error"]) > 0.10)
    assert "identical" not in summary["1"]["methods"]["plain"]
    report = (out / "report.md").read_text()
    assert "## greedy (2 prompts)" in report and "## temperature 1 (2 prompts)" in report
    assert "## Targets" in report and "transformers' generate (target ≥ 1.3×): " in report  # --targets
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    assert len(rows) == 4 and [r["turns"] for r in rows] == [1, 1, 2, 2]  # per prompt, then per temperature
    assert all(m["peak_memory_mb"] > 0 for m in greedy["methods"].values())  # Linux: the process's peak RSS
    assert "peak memory" in report
    for name in ("speedup_by_category.png", "acceptance_by_position.png", "predicted_vs_measured.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert not (out / "results.partial.jsonl").exists()  # everything is in results.jsonl
    rebuilt = speed_summary_from_results(rows)  # what `python -m specdec.bench.report results.jsonl` checks
    for temperature, result in summary.items():
        for category, entry in result["by_category"].items():
            for name, method in entry["methods"].items():
                again = rebuilt[temperature]["by_category"][category]["methods"][name]
                # (the summary rounds speed-ups to 4 decimals)
                assert again["speedup_vs_plain"] == pytest.approx(method["speedup_vs_plain"], rel=1e-3, abs=1e-4)
                assert again["tokens_per_second"] == pytest.approx(method["tokens_per_second"], rel=1e-3)


def test_a_stopped_bench_keeps_the_prompts_it_finished(tmp_path, tiny_folder, capsys, monkeypatch):
    from specdec.bench import runner

    prompts = spec_bench_file(tmp_path / "p.jsonl", [{"question_id": i + 1, "category": "qa", "turns": [f"t{5 + i} t9 t12"]}
                                                     for i in range(3)])
    calls, real_run_case = [], runner.run_case

    def stop_during_the_third_prompt(*args, **kwargs):
        calls.append(1)
        if len(calls) == 2 + 2 * 2 + 1:  # the warm-up of 2 methods, 2 prompts × 2 methods, then Ctrl-C
            raise KeyboardInterrupt
        return real_run_case(*args, **kwargs)

    monkeypatch.setattr(runner, "run_case", stop_during_the_third_prompt)
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--no-transformers",
                 "--max-new-tokens", "4", "--out-dir", str(out)])
    assert code == 130 and "results.partial.jsonl" in capsys.readouterr().out
    rows = [json.loads(line) for line in (out / "results.partial.jsonl").read_text().splitlines()]
    assert [r["id"] for r in rows] == ["1", "2"] and not (out / "results.jsonl").exists()
    monkeypatch.setattr(runner, "run_case", real_run_case)  # run again into the same folder, to the end
    assert main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--no-transformers",
                 "--max-new-tokens", "4", "--out-dir", str(out)]) == 0
    kept = list(out.glob("results.partial-*.jsonl"))  # the stopped run's rows were set aside, not lost
    assert len(kept) == 1 and [json.loads(line)["id"] for line in kept[0].read_text().splitlines()] == ["1", "2"]
    assert "results.partial-" in capsys.readouterr().out and not (out / "results.partial.jsonl").exists()


def test_a_default_bench_runs_the_starter_prompts_and_shows_each_step(tmp_path, tiny_folder, capsys, monkeypatch):
    """No --prompts: the starter set. No --targets, no --json: no verdicts, no JSON line. The
    progress bar names the prompt and method running."""
    from rich.progress import Progress

    descriptions, update = [], Progress.update

    def record(self, task, **kwargs):
        descriptions.append(kwargs.get("description"))
        update(self, task, **kwargs)

    monkeypatch.setattr(Progress, "update", record)
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_folder), "--per-category", "1", "--no-transformers",
                 "--max-new-tokens", "2", "--out-dir", str(out)])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    report = (out / "report.md").read_text()
    assert "- prompts: starter: 6" in report
    assert "## Targets" not in report and "target ≥" not in report and "MISSED" not in report
    assert '"summary"' not in captured.out
    assert descriptions[:3] == ["prompt 1 of 6 (1, mt_bench): plain", "prompt 1 of 6 (1, mt_bench): ngram",
                                "prompt 2 of 6 (3, translation): ngram"]  # the direction reverses from prompt to prompt
    assert descriptions[-1] == "prompt 6 of 6 (11, rag): plain"


def test_peak_memory_follows_an_allocation_and_resets():
    memory = PeakMemory(torch.device("cpu"))
    if memory.kind is None:
        pytest.skip("no /proc/self/clear_refs here")
    memory.reset()
    before = memory.peak()
    block = torch.ones(64 * 2**20 // 4)  # 64 MiB, touched
    during = memory.peak()
    del block
    memory.reset()
    after = memory.peak()
    assert during - before >= 60 * 2**20
    assert after < during - 60 * 2**20  # the reset forgot the freed block


@pytest.mark.parametrize("argv,message", [
    (["--gamma", "0"], "each gamma must be a whole number >= 1 or auto"),
    (["--temperature", "hot"], "expected comma-separated temperatures"),
    (["--repeats", "0"], "--repeats must be >= 1"),
    (["--prompts", "/nonexistent.txt"], "does not exist"),
])
def test_bad_bench_arguments(capsys, argv, message):
    args = ["bench", "--prompts", "humaneval", *argv] if "--prompts" not in argv else ["bench", *argv]
    assert main(args) in (1, 2)
    assert message in capsys.readouterr().err


def test_assisted_baseline_and_repeated_requests(tmp_path, tiny_folder, tiny_draft_folder, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("t5 t9 t12 t5 t9\n")
    out = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--drafter", f"draft:{tiny_draft_folder}",
                 "--drafter", "suffix", "--assistant", str(tiny_draft_folder), "--ask-twice", "--max-new-tokens", "8",
                 "--out-dir", str(out), "--json"])
    captured = capsys.readouterr()
    assert code == 0, captured.err
    greedy = json.loads(captured.out.strip().splitlines()[-1])["summary"]["0"]
    assert "hf-assisted" in greedy["methods"] and greedy["prompts"] == 2
    assert all(m["identical"] == 2 for m in greedy["methods"].values())
    ids = [json.loads(line)["id"] for line in (out / "results.jsonl").read_text().splitlines()]
    assert ids == ["1", "1 (again)"]


def test_llama_cpp_targets_are_reported():
    summary = {"0": {"methods": {"plain": {"speedup_vs_llama_cpp": 1.4}, "llama.cpp": {"speedup_vs_llama_cpp": 1.0},
                                 "ngram": {"speedup_vs_llama_cpp": 1.45}, "suffix": {"speedup_vs_llama_cpp": 1.2}},
                     "by_category": {}}}
    notes = target_notes(summary)
    assert any("our plain decoding is 1.40× llama.cpp's on the same GGUF (target ≥ 1.0×): met" in n for n in notes)
    assert any("best drafter with γ = auto (ngram) is 1.45× llama.cpp's plain decoding (target ≥ 1.5×): MISSED" in n
               for n in notes)


def test_llama_cpp_baseline_needs_its_package_and_a_gguf(tmp_path, tiny_folder, capsys, monkeypatch):
    prompts = tmp_path / "p.txt"
    prompts.write_text("t1 t2\n")
    argv = ["bench", "--prompts", str(prompts), "--no-transformers", "--baseline", "llama.cpp",
            "--out-dir", str(tmp_path / "out")]
    assert main([*argv, "--model", str(tiny_folder)]) == 1
    assert "runs a GGUF file" in capsys.readouterr().err
    monkeypatch.setitem(sys.modules, "llama_cpp", None)  # as if llama-cpp-python were not installed
    assert main(argv) == 1
    assert "needs llama-cpp-python: pip install llama-cpp-python" in capsys.readouterr().err


def test_a_finished_report_is_not_overwritten_without_force(tmp_path, tiny_folder, capsys):
    prompts = tmp_path / "p.txt"
    prompts.write_text("t1 t2 t3\n")
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("an earlier report")
    argv = ["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--no-transformers",
            "--max-new-tokens", "2", "--out-dir", str(out)]
    assert main(argv) == 1
    assert "already holds a report (report.md); pass --force" in capsys.readouterr().err
    assert (out / "report.md").read_text() == "an earlier report"
    assert main([*argv, "--force"]) == 0
    assert (out / "report.md").read_text().startswith("# specdec bench report")


def test_a_missing_prompts_file_is_named_before_the_output_folder(tmp_path, capsys):
    """Before, `bench --prompts missing.txt` first complained about the report already in the output folder."""
    out = tmp_path / "out"
    out.mkdir()
    (out / "report.md").write_text("an earlier report")
    assert main(["bench", "--prompts", str(tmp_path / "missing.txt"), "--out", str(out)]) == 1
    err = capsys.readouterr().err
    assert "missing.txt does not exist" in err and "already holds a report" not in err
    (tmp_path / "file").write_text("")
    assert main(["bench", "--prompts", "starter", "-o", str(tmp_path / "file")]) == 1
    assert "is a file; the report needs a folder" in capsys.readouterr().err


def test_bench_loads_with_the_model_options_of_the_other_commands(tmp_path, capsys, monkeypatch):
    import specdec.runtime

    asked = {}

    def record(spec, **kwargs):
        asked.update(kwargs, spec=spec)
        raise SpecdecError("stopped after the load was asked for")

    monkeypatch.setattr(specdec.runtime, "load_model", record)
    assert main(["bench", "--model", "m", "--dtype", "bfloat16", "--runtime", "transformers", "--out", str(tmp_path)]) == 1
    assert "stopped after the load" in capsys.readouterr().err
    assert asked["spec"] == "m" and asked["dtype"] == "bfloat16" and asked["runtime"] == "transformers"


def test_bench_seed_moves_the_sampled_runs_draws(tmp_path, tiny_folder, capsys, monkeypatch):
    from specdec.bench import runner

    seeds, real_run_case = [], runner.run_case

    def record(method, case, tokenizer, sampling, max_new_tokens):
        seeds.append((case.id, sampling.seed))
        return real_run_case(method, case, tokenizer, sampling, max_new_tokens)

    monkeypatch.setattr(runner, "run_case", record)
    prompts = tmp_path / "p.txt"
    prompts.write_text("t5 t9 t12\nt7 t8 t7\n")
    for seed in ("0", "5"):
        assert main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--no-transformers", "--temperature", "1",
                     "--max-new-tokens", "2", "--seed", seed, "--out", str(tmp_path / seed)]) == 0
        assert f"seed {seed}" in (tmp_path / seed / "report.md").read_text()
    timed = [s for s in seeds if s[0] != "warm-up"]
    assert timed == [("1", 0), ("1", 0), ("2", 1000), ("2", 1000), ("1", 5), ("1", 5), ("2", 1005), ("2", 1005)]


def test_ignore_eos_makes_every_answer_as_long_as_asked(tmp_path, tiny_folder, capsys):
    """Sampled texts differ between methods, and so do their lengths: with --ignore-eos every method,
    transformers' too, makes exactly --max-new-tokens tokens for every prompt, so their rates compare
    the same work. Endpoints cannot be asked to, and say so."""
    prompts = spec_bench_file(tmp_path / "p.jsonl", [{"question_id": 1, "category": "qa", "turns": ["t5 t9 t12"]},
                                                     {"question_id": 2, "category": "rag", "turns": ["t7 t8 t7"]}])
    code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--drafter", "ngram", "--temperature", "1",
                 "--max-new-tokens", "12", "--ignore-eos", "--out", str(tmp_path / "out"), "--json"])
    assert code == 0, capsys.readouterr().err
    rows = [json.loads(line) for line in (tmp_path / "out" / "results.jsonl").read_text().splitlines()]
    lengths = {name: m["new_tokens"] for row in rows for name, m in row["methods"].items()}
    assert set(lengths) == {"hf-generate", "hf-lookup", "plain", "ngram"}
    assert all(n == [12] for n in lengths.values()), lengths
    assert main(["bench", "--endpoint", "http://127.0.0.1:9", "--ignore-eos", "--prompts", str(prompts)]) == 1
    assert "--ignore-eos has no standard field in the OpenAI API" in capsys.readouterr().err


def _suffix_rounds_per_case(target, cases, repeats):
    from specdec.bench.methods import SpecdecMethod
    from specdec.bench.runner import run_bench
    from specdec.decode.engine import Engine
    from specdec.drafters import build_drafters

    method = SpecdecMethod("suffix", Engine(target, build_drafters("suffix", target)), gamma=4)
    rows = run_bench(cases, {0.0: [method]}, target.tokenizer, 24, repeats, torch.device("cpu"))
    return [row["runs"]["suffix"].stats.rounds for row in rows]


def test_repeats_do_not_draft_from_the_answer_of_the_repeat_before(tiny_target, monkeypatch):
    """The suffix drafter learns its outputs. A prompt's repeats must each see the same memory (the
    prompts before it), or the second repeat drafts the first one's answer and the bench measures a
    cache hit: two repeats take twice the rounds of one. The prompt asked again as a new case does
    draft from it (what --ask-twice is for). Control: with nothing held, the second repeat of the
    first case already takes fewer rounds, and the test fails."""
    from specdec.bench.methods import SpecdecMethod

    first, again = PromptCase("1", "qa", ("t5 t9 t12",)), PromptCase("1 (again)", "qa", ("t5 t9 t12",))
    [one] = _suffix_rounds_per_case(tiny_target, [first], 1)
    assert one > 12  # the tiny model's answer to it is not in the prompt: little to draft from at first
    repeated, asked_again = _suffix_rounds_per_case(tiny_target, [first, again], 2)
    assert repeated == 2 * one
    assert asked_again < repeated / 2
    monkeypatch.setattr(SpecdecMethod, "hold_learning", lambda self: None)  # the control: learning as it comes
    assert _suffix_rounds_per_case(tiny_target, [first], 2)[0] < 2 * one


def test_the_methods_take_turns_at_running_first(tmp_path, tiny_folder, monkeypatch):
    """The order the methods run in turns by one place from one repeat to the next, so that each
    method runs first in turn and no two repeats of a method run back to back (a slow minute of the
    machine falls on one of them, which the median sets aside); the direction reverses from one
    prompt to the next, so that no method always runs right after the same other method. Control:
    the order reversed each repeat (this loop's old rule) runs the last method of one repeat first in
    the next, and the check fails."""
    from specdec.bench import runner

    order, real_run_case = [], runner.run_case

    def record(method, case, tokenizer, sampling, max_new_tokens):
        if case.id != "warm-up":
            order.append((case.id, method.name))
        return real_run_case(method, case, tokenizer, sampling, max_new_tokens)

    def bench() -> list:
        order.clear()
        assert main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--no-transformers",
                     "--drafter", "ngram", "--drafter", "suffix", "--max-new-tokens", "2", "--repeats", "3",
                     "--out", str(tmp_path / "out"), "--force"]) == 0
        return order[:]

    monkeypatch.setattr(runner, "run_case", record)
    prompts = tmp_path / "p.txt"
    prompts.write_text("t5 t9 t12\nt7 t8 t7\n")
    expected = [("1", m) for m in ("plain", "ngram", "suffix", "ngram", "suffix", "plain", "suffix", "plain", "ngram")] + \
               [("2", m) for m in ("suffix", "ngram", "plain", "ngram", "plain", "suffix", "plain", "suffix", "ngram")]
    assert bench() == expected
    for prompt in ("1", "2"):
        names = [name for case, name in expected if case == prompt]
        assert {names[0], names[3], names[6]} == {"plain", "ngram", "suffix"}  # each first once
        assert all(a != b for a, b in zip(names, names[1:]))  # never twice in a row
    monkeypatch.setattr(runner, "run_order", lambda methods, prompt, repeat:
                        list(methods) if (prompt + repeat) % 2 == 0 else list(reversed(methods)))
    reversed_each_repeat = bench()
    assert reversed_each_repeat != expected
    assert any(a == b for a, b in zip(reversed_each_repeat, reversed_each_repeat[1:]))  # suffix, suffix


@pytest.fixture
def stand_ins_importable(monkeypatch):
    """The baseline processes can import tests/baseline_standins.py."""
    import os
    from pathlib import Path

    here = str(Path(__file__).resolve().parent)
    monkeypatch.setenv("PYTHONPATH", os.pathsep.join(p for p in (here, os.environ.get("PYTHONPATH")) if p))


@pytest.mark.parametrize("die_at_call", [0, 3])
def test_a_baseline_that_kills_its_process_leaves_the_other_methods_rows_intact(tiny_target, stand_ins_importable,
                                                                              die_at_call):
    """A baseline runs in a process of its own: when it kills that process (SIGILL, as llama.cpp's
    AMX path did) at its third call (warm-up, then prompt 1's two repeats), both its methods leave
    every row, prompt 1's too, `failures` says how the process ended, and plain runs on. Control
    (die_at_call 0): the stand-ins answer in every row, their tokens as sent back, their time and
    memory measured in their own process."""
    from specdec.bench.child import BaselineProcess
    from specdec.bench.methods import SpecdecMethod
    from specdec.bench.runner import run_bench
    from specdec.decode.engine import Engine

    process = BaselineProcess("baseline_standins:stand_ins", {"die_at_call": die_at_call}, threads=1)
    try:
        methods = [*process.methods, SpecdecMethod("plain", Engine(tiny_target), 1)]
        cases = [PromptCase("1", "qa", ("t5 t9 t12",)), PromptCase("2", "qa", ("t7 t8",))]
        failures: dict[str, str] = {}
        rows = run_bench(cases, {0.0: methods}, tiny_target.tokenizer, 5, 2, torch.device("cpu"), failures=failures)
    finally:
        process.close()
    assert len(rows) == 2 and all("plain" in row["runs"] for row in rows)
    if die_at_call:
        assert all(set(row["runs"]) == {"plain"} for row in rows)
        assert set(failures) == {"hf-generate", "hf-lookup"}
        assert failures["hf-generate"].startswith("prompt 1 (1): its process ended while generating")
        assert "killed by SIGILL" in failures["hf-generate"] and "had ended (killed by SIGILL" in failures["hf-lookup"]
    else:
        assert failures == {} and all(set(row["runs"]) == {"hf-generate", "hf-lookup", "plain"} for row in rows)
        for row in rows:
            run = row["runs"]["hf-generate"]
            assert len(set(run.token_ids)) == 1 and len(run.token_ids) == 5  # the prompt's last token, repeated
            assert all(0 < s < 5 for s in run.seconds) and run.peak_memory_bytes > 0


def test_a_bench_whose_baseline_dies_at_once_still_writes_its_report(tmp_path, tiny_folder, capsys, monkeypatch,
                                                                    stand_ins_importable):
    """The transformers baselines' process dies at its first call: `specdec bench` exits 0 with its
    own methods' rows, report and results, and the report says which baselines failed and how. A
    baseline that cannot even start is one line too. Control: the same bench with baselines that
    answer has their rows (the first test of this file covers the real ones)."""
    import specdec.bench.command

    prompts = spec_bench_file(tmp_path / "p.jsonl", [{"question_id": 1, "category": "qa", "turns": ["t5 t9 t12 t5 t9"]}])
    for factory, expected in (("dying_at_first_call", {"plain", "ngram"}),
                              ("failing_to_start", {"plain", "ngram"}),
                              ("stand_ins", {"plain", "ngram", "hf-generate", "hf-lookup"})):
        monkeypatch.setattr(specdec.bench.command, "TRANSFORMERS_BASELINES", f"baseline_standins:{factory}")
        folder = tmp_path / factory
        code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--drafter", "ngram",
                     "--max-new-tokens", "4", "--out-dir", str(folder)])
        out, err = capsys.readouterr()
        assert code == 0, err
        rows = [json.loads(line) for line in (folder / "results.jsonl").read_text().splitlines()]
        assert set(rows[0]["methods"]) == expected
        report = (folder / "report.md").read_text()
        if factory == "dying_at_first_call":
            assert "- failed: hf-generate: warming up: its process ended while generating" in report
            assert "killed by SIGILL" in report and "- failed: hf-lookup: " in report
        elif factory == "failing_to_start":
            assert "- failed: transformers: failed while starting: RuntimeError: no such model file" in report
            assert "the bench goes on without it" in out + err
        else:
            assert "failed:" not in report
