"""What the commands print for people, as a pipe sees it: every table within 80 columns with its
headings whole, no colour and no colour legend, one meaning of "speed-up" (the whole run's, over
plain decoding) with the per-drafter figure named apart and explained, MAT squared with the
accepted drafts, and counts in words ("1 prompt")."""

from __future__ import annotations

import io
import json
import re

import pytest
from browser import launch, needs_chromium

from specdec.cli import main
from specdec.records.stats import GenerationStats
from specdec.terminal import past_the_end, plural

PROMPT = "t5 t9 t12 t7 t5 t9 t12 t7 t5"
ANSI = "\x1b["
COLOUR_LEGEND = "legend: accepted draft"


@pytest.fixture(autouse=True)
def piped(monkeypatch):
    """No COLUMNS (rich then lays out 80 columns, as for a pipe) and nothing that makes rich see a terminal."""
    for name in ("COLUMNS", "FORCE_COLOR", "TTY_COMPATIBLE"):
        monkeypatch.delenv(name, raising=False)


def wide_lines(text: str, *prose: str) -> list[str]:
    """Lines past 80 columns, leaving out prose that may run on (lines starting with one of `prose`)."""
    return [line for line in text.splitlines() if len(line) > 80 and not line.startswith(prose)]


def headings(text: str, first: str) -> list[str]:
    """The headings of the table whose heading line starts with `first` (columns: two spaces or more apart)."""
    [line] = [line for line in text.splitlines() if line.startswith(first + "  ")]
    return re.split(r"\s{2,}", line.strip())


def one_line(text: str) -> str:
    return " ".join(text.split())


def generate(capsys, folder, *extra: str) -> tuple[dict, str]:
    """`specdec generate ... --json`: (the JSON line, everything else printed: the text and the tables)."""
    code = main(["generate", PROMPT, "--model", str(folder), "--raw", "--drafter", "auto:ngram,suffix", "--gamma", "3",
                 "--max-new-tokens", "40", "--json", *extra])
    out, err = capsys.readouterr()
    assert code == 0, err
    return json.loads(out), err


def test_generate_compare_piped(capsys, tiny_folder):
    result, err = generate(capsys, tiny_folder, "--compare")
    assert ANSI not in err and COLOUR_LEGEND not in err  # no colour, so no legend for it
    assert wide_lines(err, result["text"], "round ", "specdec: ") == []  # the text and the policy's log may run on
    assert "…" not in err
    assert headings(err, "drafter") == ["drafter", "rounds", "f", "γ", "α", "c", "v", "model", "costed", "its rounds"]
    # the per-drafter figure is not called a speed-up, and a legend says what it is; the speed-up is the whole run's
    legend = one_line(err)
    assert "its rounds: the tokens its rounds committed per second of those rounds" in legend
    assert "none is the speed-up, which is the whole run's" in legend
    [speedup] = [line for line in err.splitlines() if line.startswith("speed-up: ")]
    assert speedup.startswith(f"speed-up: {result['speedup']:.2f}× (the whole run: ")
    # MAT with the counts it comes from
    spec = result["speculative"]
    assert (f"MAT (tokens per pass)           {spec['mean_accepted_tokens']:.2f} = {spec['new_tokens']} tokens / "
            f"{spec['target_passes']} passes, prefill included") in err


def test_on_a_terminal_the_colours_and_their_legend_show(capsys, tiny_folder, monkeypatch):
    """The control for the test above: where rich sees a terminal, colour codes and the legend do appear."""
    monkeypatch.setenv("TTY_COMPATIBLE", "1")
    _, err = generate(capsys, tiny_folder)
    assert ANSI in err and COLOUR_LEGEND in re.sub(r"\x1b\[[0-9;?]*[A-Za-z]", "", err)


def test_accepted_drafts_past_the_end_are_explained():
    """The issue's run: drafted / accepted 4 / 2 beside MAT 1.00. Two passes (the prefill and one round)
    kept two tokens: the round's first accepted draft ended the text, and the draft and the
    target's token after it were dropped."""
    cut = GenerationStats("ngram", new_tokens=2, target_passes=2, drafted=4, accepted=2)
    assert f"{cut.mean_accepted_tokens:.2f}" == "1.00"
    assert past_the_end(cut).startswith("not kept: 2 tokens of the last round, after the end of the text")
    whole = GenerationStats("ngram", new_tokens=10, target_passes=4, drafted=9, accepted=6)  # 4 passes + 6 accepted
    assert past_the_end(whole) == ""
    assert past_the_end(GenerationStats("ngram", new_tokens=9, target_passes=4, drafted=9, accepted=6)).startswith(
        "not kept: 1 token of")


def test_costs_table_piped_with_a_long_drafter_name(capsys, tiny_folder, tiny_draft_folder):
    code = main(["costs", "--model", str(tiny_folder), "--drafter", f"draft:{tiny_draft_folder}", "--max-gamma", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert len(f"draft:{tiny_draft_folder}") > 30  # too long for one line beside the figures
    assert ANSI not in out and "…" not in out
    assert wide_lines(out, "measured ") == []  # the line naming the cache file may run on
    assert headings(out, "drafter") == ["drafter", "per proposal (ms)", "per token (ms)", "c = per token / T(1)", "spread"]


LONG_CPU = "Intel(R) Xeon(R) Platinum 8480+ Processor, a model name as long as some hosts report"
DEEP = "a-temporary-folder-as-deep-as-some-hosts-make-them"  # beside pytest's own, a path longer than a line


def squashed(text: str) -> str:
    """The text without its white space: what is left of a wrapped or folded line, whatever the width."""
    return "".join(text.split())


def test_costs_table_piped_on_a_host_with_long_names(capsys, tiny_folder, tiny_draft_folder, tmp_path, monkeypatch):
    """The first table's title names the model's folder and the CPU: with a long CPU name (put in what
    the cost model reads of the host) and a folder longer than a line, it wraps within 80 columns,
    whole. Issue 50: 'target passes: <pytest tmp path> on Intel(R) Xeon(R) Processor' ran past 80."""
    import shutil

    from specdec.control.cost_model import cache

    describe = cache.machine_description
    monkeypatch.setattr(cache, "machine_description", lambda device: {**describe(device), "processor": LONG_CPU})
    model = tmp_path / DEEP / "tiny-llama"
    shutil.copytree(tiny_folder, model)
    assert len(str(model)) > 80  # no line holds it: it must fold
    code = main(["costs", "--model", str(model), "--drafter", f"draft:{tiny_draft_folder}", "--max-gamma", "2"])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ANSI not in out and "…" not in out
    assert wide_lines(out, "measured ") == []  # the line naming the cache file may run on
    lines = out.splitlines()
    top = next(i for i, line in enumerate(lines) if line.lstrip().startswith("┏"))  # the table's top edge
    title = squashed("".join(lines[:top]))  # whole, wrapped
    assert re.fullmatch(squashed(r"target passes after \d+ cached tokens: ") + re.escape(squashed(f"{model} on {LONG_CPU}")),
                        title), title


def test_run_summary_with_a_drafter_in_a_deep_folder_fits(tmp_path):
    """`generate`'s summary names the drafter (a folder, for a draft model or a head) in its title and
    in a row: both wrap within 80 columns, whole, not cut with an ellipsis."""
    from rich.console import Console

    from specdec.commands.show import summary

    drafter = f"draft:{tmp_path / DEEP / 'tiny-draft'}"
    assert len(drafter) > 80
    buffer = io.StringIO()
    stats = GenerationStats(drafter, new_tokens=10, target_passes=4, drafted=9, accepted=6)
    summary(stats, Console(file=buffer, soft_wrap=True), title=f"speculative ({drafter}, γ = auto)")
    text = buffer.getvalue()
    assert wide_lines(text) == [] and "…" not in text
    assert squashed(text).startswith(squashed(f"speculative ({drafter}, γ = auto)"))
    assert squashed(text).count(squashed(drafter)) == 2  # in the title and whole in its row


def test_bench_table_piped(capsys, tiny_folder, tmp_path):
    prompts = tmp_path / "p.txt"
    prompts.write_text("t5 t9 t12 t5 t9\n")
    out_dir = tmp_path / "out"
    code = main(["bench", "--model", str(tiny_folder), "--prompts", str(prompts), "--drafter", "ngram",
                 "--max-new-tokens", "4", "--out-dir", str(out_dir)])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert ANSI not in out and "…" not in out
    assert wide_lines(out, "wrote ") == []
    assert "1 prompt, greedy" in out.splitlines() and "1 prompts" not in out
    assert headings(out, "method") == ["method", "tokens/s", "×hf", "×plain", "predicted", "MAT", "α", "same"]
    assert "×plain: speed-up over plain decoding" in one_line(out)
    assert "## greedy (1 prompt)" in (out_dir / "report.md").read_text()


def test_bench_table_with_every_baseline_fits(capsys):
    """Every column at once: transformers, llama.cpp, an endpoint's time to first token, a flagged
    prediction and a long method name, which wraps; no heading or figure is cut."""
    from rich.console import Console

    from specdec.bench.report import print_tables

    def method(rate, **more):
        return {"tokens_per_second": {"median": rate, "p25": rate, "p75": rate}, "speedup_vs_hf_generate": rate / 22,
                "speedup_vs_llama_cpp": rate / 96, "speedup_vs_plain": rate / 182, "identical": 18,
                "predicted_speedup": None, **more}

    methods = {"hf-generate": method(22.1), "llama.cpp": method(95.7), "plain": method(182.1),
               "eagle3-chain γ=auto": method(1230.2, predicted_speedup=1.07, prediction_error=-0.1439,
                                             off_prediction=True, mean_accepted_tokens=1.52, acceptance_rate=0.41),
               "http://127.0.0.1:8000": method(150.3, time_to_first_token_seconds={"median": 0.123})}
    def table(temperature: str) -> str:
        buffer = io.StringIO()
        print_tables({temperature: {"prompts": 18, "baseline": "plain", "methods": methods}},
                     Console(file=buffer, soft_wrap=True))
        text = buffer.getvalue()
        assert wide_lines(text) == [] and "…" not in text
        return text

    text = table("0")
    assert headings(text, "method") == ["method", "tokens/s", "TTFT s", "×hf", "×llama", "×plain", "predicted", "MAT",
                                        "α", "same"]
    assert "1.07 ⚠-14%" in text and "1230.20" in text
    assert "×llama: speed-up over llama.cpp's plain decoding" in one_line(text)
    # sampled, where answers can differ in length: the decoding-alone column instead of "same"
    methods["eagle3-chain γ=auto"]["decoding_alone"] = {"speedup_vs_plain": 6.81, "lengths_differ": 3}
    text = table("1")
    assert headings(text, "method") == ["method", "tokens/s", "TTFT s", "×hf", "×llama", "×plain", "×dec", "predicted",
                                        "MAT", "α"]
    assert "6.81" in text and "×dec: × plain over the decoding alone" in one_line(text)


def test_counts_in_words(capsys, tiny_folder, tmp_path):
    assert plural(1, "prompt") == "1 prompt" and plural(2, "prompt") == "2 prompts" and plural(0, "round") == "0 rounds"
    assert plural(1, "pass", "passes") == "1 pass" and plural(3, "pass", "passes") == "3 passes"
    code = main(["explain", PROMPT, "--model", str(tiny_folder), "--raw", "--max-new-tokens", "1", "--no-compare",
                 "-o", str(tmp_path / "run.html")])
    out, err = capsys.readouterr()
    assert code == 0, err
    assert out.startswith("0 rounds, 1 token, MAT 1.00")


def explain_page(tiny_folder, tmp_path, capsys) -> tuple[str, dict]:
    page = tmp_path / "run.html"
    code = main(["explain", PROMPT, "--model", str(tiny_folder), "--raw", "--max-new-tokens", "20", "-o", str(page),
                 "--json"])
    out, err = capsys.readouterr()
    assert code == 0, err
    return page.read_text(), json.loads(out)["summary"]


def test_explain_page_names_the_per_drafter_figure_apart(tiny_folder, tmp_path, capsys):
    html, _ = explain_page(tiny_folder, tmp_path, capsys)
    assert "<th>its rounds</th>" in html and "<th>measured</th>" not in html
    assert "its rounds: the tokens its rounds committed per second of those rounds" in html
    assert "none is the speed-up above, which is the whole run's" in html


@needs_chromium
def test_explain_summary_shows_the_speedup_and_squares_mat_with_accepted(tiny_folder, tmp_path, capsys):
    from playwright.sync_api import sync_playwright

    from specdec.explain.page import render_page

    html, summary = explain_page(tiny_folder, tmp_path, capsys)
    data = json.loads(html.split('id="run-data">')[1].split("</script>")[0])
    cut_run = GenerationStats("ngram", new_tokens=2, target_passes=2, drafted=4, accepted=2)  # the run (above)
    data["summary"].update(new_tokens=2, target_passes=2, drafted=4, accepted=2, mat=1.0,
                           past_the_end=past_the_end(cut_run))
    cut = tmp_path / "cut.html"
    cut.write_text(render_page(data))
    rows = "Array.from(document.querySelectorAll('#summary-table tr')).map(r => r.innerText)"
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page()
        page.goto((tmp_path / "run.html").as_uri())
        shown = page.evaluate(rows)
        assert f"speed-up (the whole run over plain decoding, run side by side)\t{summary['speedup']:.2f}×" in shown
        assert (f"MAT (tokens per pass)\t{summary['mat']:.2f} = {summary['new_tokens']} tokens / "
                f"{summary['target_passes']} passes, prefill included") in shown
        dropped = summary["target_passes"] + summary["accepted"] - summary["new_tokens"]
        assert any(row.startswith("past the end") for row in shown) == (dropped > 0) == bool(summary["past_the_end"])
        page.goto(cut.as_uri())
        assert any(row.startswith("past the end\tnot kept: 2 tokens of the last round") for row in page.evaluate(rows))
        browser.close()
