"""`specdec explain`: the page's data agrees with the run, the page is self-contained, and a real
headless Chromium steps through it with the keyboard and reads the text the run produced."""

from __future__ import annotations

import json
import re

import pytest
from browser import launch, needs_chromium

from specdec.cli import main
from specdec.drafters import PromptLookupDrafter
from specdec.decode.engine import Engine, GenerationConfig
from specdec.explain.command import build_page_data
from specdec.explain.page import render_page
from specdec.explain.summary import run_summary, worked_example
from specdec.sampling import SamplingParams
from specdec.control.theory import expected_tokens_per_pass
from specdec.tree import TokenTree

PROMPT = "t5 t9 t12 t7 t5 t9 t12 t7 t5 t9"


def page_data(tiny_target, compare=True):
    engine = Engine(tiny_target, PromptLookupDrafter(max_ngram=3, min_ngram=1))
    ids = tiny_target.tokenizer.encode(PROMPT)
    return build_page_data(engine, ids, GenerationConfig(max_new_tokens=30, gamma=3, ignore_eos=True), compare, "tiny")


def test_page_data_agrees_with_the_run(tiny_target):
    data = page_data(tiny_target)
    rounds, summary = data["rounds"], data["summary"]
    assert "".join(t for r in rounds for t in r["texts"] + [r["tail"]]) == data["text"]
    assert all(len(r["kinds"]) == len(r["committed"]) == len(r["texts"]) for r in rounds)  # what the page colours by
    assert len(rounds) == summary["rounds"] + 1 and summary["new_tokens"] == 30
    assert sum(r["accepted"] for r in rounds) == summary["accepted"]
    assert sum(len(r["positions"]) for r in rounds) == summary["drafted"] > 0
    assert summary["mat"] == pytest.approx(30 / summary["target_passes"])
    assert summary["speedup"] == pytest.approx(summary["tokens_per_second"] / summary["plain_tokens_per_second"])
    assert summary["worked_example"] and summary["breakdown"][0]["drafter"] == "ngram:1-3"


def test_worked_example_fills_in_the_formulas():
    row = {"drafter": "ngram", "alpha": 0.6, "gamma": 4, "verified_tokens": 4, "c": 0.001, "verify_cost": 1.5,
           "drafting_share": 0.5, "predicted_speedup": 1.23, "measured_speedup": 1.1, "baseline": "plain run"}
    lines = worked_example(row, {"mat": 1.8})
    e = expected_tokens_per_pass(0.6, 4)
    assert f"= {e:.2f}." in lines[1]
    assert f"= {e / (4 * 0.001 + 1):.2f}×" in lines[2] and f"= {e / (4 * 0.001 + 1.5):.2f}×" in lines[3]
    assert "a pass over γ + 1 = 5 tokens" in lines[3]
    assert "f = 0.50" in lines[4] and "1.23×" in lines[4] and "MAT 1.80" in lines[5] and "1.10×" in lines[5]
    tree_lines = worked_example({**row, "verified_tokens": 10}, {"mat": 1.8})  # a tree 4 deep, 10 nodes
    assert "a pass over its 10 nodes + 1 = 11 tokens" in tree_lines[3]


def test_page_is_self_contained_and_escapes_the_run_text(tiny_target):
    data = page_data(tiny_target, compare=False)
    data["rounds"][1]["texts"][0] = "see https://example.org </script><b>bold</b>"  # text a model could write
    page = render_page(data)
    assert "http" not in page.lower()  # nothing to fetch, and no link to anywhere
    assert not re.search(r"<(link|img|iframe)\b|src=|@import|url\(", page, re.IGNORECASE)
    assert page.count("</script>") == 2 and "<b>bold</b>" not in page
    embedded = page.split('id="run-data">')[1].split("</script>")[0]
    assert json.loads(embedded)["rounds"][1]["texts"][0].startswith("see https://example.org")


def test_explain_command_writes_the_page(tmp_path, tiny_folder, capsys):
    out = tmp_path / "run.html"
    code = main(["explain", PROMPT, "--model", str(tiny_folder), "--raw", "--drafter", "ngram", "--max-new-tokens", "12",
                 "-o", str(out)])
    assert code == 0, capsys.readouterr().err
    assert "wrote" in capsys.readouterr().out and out.read_text().startswith("<!DOCTYPE html>")
    assert main(["explain", PROMPT, "--model", str(tiny_folder), "-o", str(tmp_path / "run.txt")]) == 1
    assert "should be an .html file" in capsys.readouterr().err


def tree_engine(tiny_target):
    from random_heads import random_eagle_head

    from specdec.drafters import EagleDrafter

    return Engine(tiny_target, EagleDrafter(tiny_target, random_eagle_head(tiny_target), name="eagle-tree",
                                            tree_budget=10, top_k=3))


def tree_page_data(tiny_target, sampling: SamplingParams | None = None):
    ids = tiny_target.tokenizer.encode(PROMPT)
    config = GenerationConfig(max_new_tokens=30, gamma=3, sampling=sampling or SamplingParams(), ignore_eos=True)
    return build_page_data(tree_engine(tiny_target), ids, config, False, "tiny")


def test_a_tree_run_counts_drafted_positions_and_verified_nodes_apart(tiny_target):
    """"Drafted" means draft positions everywhere (a tree: its depth): the stats, the trace and the
    summary agree on it and on α; the nodes the passes verified are counted apart, and the breakdown
    prices a tree round's pass by them."""
    engine = tree_engine(tiny_target)
    config = GenerationConfig(max_new_tokens=30, gamma=3, ignore_eos=True, trace=True)
    result = engine.generate(tiny_target.tokenizer.encode(PROMPT), config)
    stats, rounds = result.stats, result.rounds
    tree_rounds = [r for r in rounds if r.tree]
    assert tree_rounds
    for r in tree_rounds:
        depths = TokenTree(r.tree.tokens, r.tree.parents).depths()
        assert r.drafted == max(depths) < r.verified_tokens == len(r.tree.tokens)
        assert all(pos.depth == depths[pos.node] for pos in r.positions)
    assert sum(r.drafted for r in rounds) == stats.drafted == sum(stats.drafted_per_position)
    assert sum(r.verified_tokens for r in rounds) == stats.verified_tokens > stats.drafted
    assert sum(r.accepted for r in rounds) == stats.accepted
    costs = engine.costs(config.max_gamma)
    summary = run_summary(stats, costs, None)
    assert (summary["drafted"], summary["verified_tokens"]) == (stats.drafted, stats.verified_tokens)
    assert summary["alpha"] == stats.accepted / stats.drafted
    [row] = summary["breakdown"]
    drafting_rounds = stats.by_drafter["eagle-tree"].drafting_rounds
    nodes = round(stats.verified_tokens / drafting_rounds)
    assert row["gamma"] == round(stats.drafted / drafting_rounds) < row["verified_tokens"] == nodes
    assert row["verify_cost"] == round(costs.target_pass(nodes + 1) / costs.target_pass(1), 3)


def test_tree_rounds_keep_their_whole_tree(tiny_target):
    """A tree round records every node; its accepted path is what the round committed before the target's token."""
    rounds = [r for r in tree_page_data(tiny_target)["rounds"] if r["tree"]]
    assert rounds and any(r["tree"]["path"] for r in rounds)
    for r in rounds:
        tree = r["tree"]
        assert len(tree["tokens"]) == len(tree["texts"]) == len(tree["parents"]) > len(tree["path"])
        assert all(-1 <= parent < i for i, parent in enumerate(tree["parents"]))
        parents_on_path = [tree["parents"][node] for node in tree["path"]]
        assert parents_on_path == ([-1] + tree["path"])[:len(tree["path"])]  # a path from the root down
        assert [tree["tokens"][node] for node in tree["path"]] == r["committed"][:r["accepted"]]


@needs_chromium
def test_a_headless_browser_draws_a_token_tree(tiny_target, tmp_path):
    from playwright.sync_api import sync_playwright

    data = tree_page_data(tiny_target)
    (tmp_path / "tree.html").write_text(render_page(data))
    index = next(i for i, r in enumerate(data["rounds"]) if r["tree"] and r["tree"]["path"])
    tree = data["rounds"][index]["tree"]
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page()
        page.goto((tmp_path / "tree.html").as_uri())
        assert page.locator("#tree .node").count() == 0  # the prefill has no tree
        for _ in range(index):
            page.keyboard.press("ArrowRight")
        assert page.locator("#tree .node").count() == len(tree["tokens"])
        assert page.locator("#tree .node.on-path").count() == len(tree["path"])

        # sampled: the acceptance column shows what the rule accepted each tested candidate with
        sampled = tree_page_data(tiny_target, SamplingParams(temperature=1.0, seed=5))
        (tmp_path / "sampled.html").write_text(render_page(sampled))
        index, r = next((i, r) for i, r in enumerate(sampled["rounds"]) if r["tree"] and any(
            pos["residual_top"] for pos in r["positions"]))  # a round where a child was tested after a rejected sibling
        page.goto((tmp_path / "sampled.html").as_uri())
        for _ in range(index):
            page.keyboard.press("ArrowRight")
        assert page.inner_text("#accept-header") == "accept prob. (after rejected siblings)"
        assert f"{r['verified_tokens']} nodes verified, {len(r['positions'])} of them tested" in page.inner_text("#round-title")
        cells = page.locator("#positions tr td:nth-child(5)").all_inner_texts()  # the acceptance column
        assert cells[:-1] == [f"{pos['accept_probability']:.3f}" for pos in r["positions"]]  # the last row: the next token
        browser.close()


@needs_chromium
def test_a_headless_browser_steps_through_the_rounds(tiny_target, tmp_path):
    from playwright.sync_api import sync_playwright

    data = page_data(tiny_target, compare=False)
    page_file = tmp_path / "run.html"
    page_file.write_text(render_page(data))
    rounds = data["rounds"]
    shown = "Array.from(document.querySelectorAll('#text span.out')).map(s => s.textContent).join('')"
    with sync_playwright() as p:
        browser = launch(p)
        page = browser.new_page(viewport={"width": 1280, "height": 900})
        page.goto(page_file.as_uri())
        assert page.inner_text("#round-counter") == f"Round 0 / {len(rounds) - 1}"
        assert page.evaluate(shown) == "".join(rounds[0]["texts"])  # the prefill's token only
        for step in (1, 2, 3):
            page.keyboard.press("ArrowRight")
            assert page.inner_text("#round-counter") == f"Round {step} / {len(rounds) - 1}"
            assert page.evaluate(shown) == "".join(t for r in rounds[:step + 1] for t in r["texts"])
            assert page.locator("#positions tr").count() == len(rounds[step]["positions"]) + 1
        page.keyboard.press("ArrowLeft")
        assert page.inner_text("#round-counter") == f"Round 2 / {len(rounds) - 1}"
        page.keyboard.press("End")
        assert page.evaluate(shown) == data["text"]
        assert page.inner_text("#worked").strip() == "Nothing was drafted, so there is nothing to fill in." or \
            "E = (1 − α^(γ+1))" in page.inner_text("#worked")
        page.screenshot(path=str(tmp_path / "explain.png"), full_page=True)
        browser.close()
    assert (tmp_path / "explain.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
