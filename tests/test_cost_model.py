"""The cost model: measured on a tiny model, cached per machine and model, read back; the breakdown's arithmetic."""

from __future__ import annotations

import json

import pytest

from specdec.control import cost_model
from specdec.control.analysis import drafter_breakdown
from specdec.control.cost_model import CostModel, DraftCost, load_or_measure, measure
from specdec.drafters import EarlyExitDrafter, PromptLookupDrafter, build_drafters
from specdec.errors import ConfigError
from specdec.records.stats import GenerationStats
from specdec.control.theory import expected_tokens_per_pass


@pytest.fixture
def costs_dir(tmp_path, monkeypatch):
    monkeypatch.setenv("SPECDEC_COSTS_DIR", str(tmp_path))
    return tmp_path


def drafters_measured(monkeypatch, describe) -> list:
    """From now on, `describe(drafter)` of every drafter whose draft cost is measured, in order."""
    measured, real = [], measure.measure_draft_cost

    def counting(model, drafter, *args, **kwargs):
        measured.append(describe(drafter))
        return real(model, drafter, *args, **kwargs)

    monkeypatch.setattr(measure, "measure_draft_cost", counting)
    return measured


def test_measured_once_then_read_from_the_cache(tiny_target, costs_dir, monkeypatch):
    lookup, early = PromptLookupDrafter(), EarlyExitDrafter(tiny_target, 1)
    first = load_or_measure(tiny_target, [lookup], max_gamma=4, repeats=2)
    assert sorted(first.pass_seconds) == [1, 2, 3, 4, 5] and all(t > 0 for t in first.pass_seconds.values())
    files = list(costs_dir.glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["key"] == first.key

    def no_measuring(*args, **kwargs):
        raise AssertionError("measured again")

    monkeypatch.setattr(measure, "measure_pass_costs", no_measuring)
    again = load_or_measure(tiny_target, [lookup], max_gamma=4)
    assert again.pass_seconds == first.pass_seconds
    # a new drafter is measured (it alone) and added; the pass costs and the lookup's draft cost stay as
    # cached (counted, not compared: which of two 2-repeat timings is larger is for the benchmarks)
    measured_drafters = drafters_measured(monkeypatch, lambda drafter: drafter.name)
    with_early = load_or_measure(tiny_target, [lookup, early], max_gamma=4, repeats=2)
    assert measured_drafters == ["early:1"] and set(with_early.draft_costs) == {"ngram", "early:1"}
    assert with_early.draft_costs["ngram"] == first.draft_costs["ngram"]
    assert with_early.pass_seconds == first.pass_seconds


class HeadLike(PromptLookupDrafter):
    """A drafter with weights of its own, named as a head is: its digest stands for the head file's."""

    def __init__(self, digest: str) -> None:
        super().__init__()
        self.name, self.digest = "eagle3", digest

    def weights_digest(self) -> str:
        return self.digest


def test_a_changed_head_gets_its_own_measured_draft_cost(tiny_target, costs_dir, monkeypatch):
    """Draft costs are kept with the weights they were measured with: the same name with other weights is
    measured again (issue 30: a new head was priced as the old one); the same weights are read back.
    Negative control: a drafter without weights (digest None) is never re-measured."""
    measured = drafters_measured(monkeypatch, lambda drafter: (drafter.name, drafter.weights_digest()))
    load_or_measure(tiny_target, [HeadLike("aaa"), PromptLookupDrafter()], max_gamma=2, repeats=1)
    assert measured == [("eagle3", "aaa"), ("ngram", None)]
    load_or_measure(tiny_target, [HeadLike("aaa"), PromptLookupDrafter()], max_gamma=2, repeats=1)
    assert len(measured) == 2  # same weights: read from the cache
    changed = load_or_measure(tiny_target, [HeadLike("bbb"), PromptLookupDrafter()], max_gamma=2, repeats=1)
    assert measured[2:] == [("eagle3", "bbb")] and changed.draft_weights == {"eagle3": "bbb"}


def test_a_model_drafters_catch_up_is_measured_and_a_cost_cached_without_one_measured_again(
        tiny_target, draft_model, costs_dir, monkeypatch):
    """A draft model reads what it has not read before drafting (`catch_up_tokens`): its cost per such
    token is measured (from fresh starts) and cached beside its other costs, and a lookup's is 0. A
    cache file written before catch-ups were priced has its draft costs measured again, the pass
    costs read back (the control: the same file with them is read whole)."""
    from specdec.drafters import DraftModelDrafter

    drafters = [PromptLookupDrafter(), DraftModelDrafter(draft_model, tiny_target)]
    first = load_or_measure(tiny_target, drafters, max_gamma=2, repeats=1)
    path = costs_dir / f"{first.key}.json"
    cached = json.loads(path.read_text())["draft_costs"]
    assert cached["ngram"]["per_catch_up"] == 0.0 and cached[drafters[1].name]["per_catch_up"] >= 0.0
    measured = drafters_measured(monkeypatch, lambda drafter: drafter.name)
    monkeypatch.setattr(measure, "measure_pass_costs", lambda *a, **k: pytest.fail("pass costs measured again"))
    load_or_measure(tiny_target, drafters, max_gamma=2, repeats=1)
    assert measured == []  # the control
    old = json.loads(path.read_text())
    for cost in old["draft_costs"].values():
        del cost["per_catch_up"]
    path.write_text(json.dumps(old))
    again = load_or_measure(tiny_target, drafters, max_gamma=2, repeats=1)
    assert measured == ["ngram", drafters[1].name] and again.pass_seconds == first.pass_seconds


def test_module_digest_follows_the_weights(tiny_target):
    import torch

    from specdec.drafters.base import module_digest

    layer = torch.nn.Linear(4, 3)
    before = module_digest(layer)
    assert module_digest(layer) == before
    with torch.no_grad():
        layer.weight[0, 0] += 1e-3
    assert module_digest(layer) != before


def test_a_corrupt_cache_file_is_measured_again(tiny_target, costs_dir):
    first = load_or_measure(tiny_target, [], max_gamma=2, repeats=1)
    path = costs_dir / f"{first.key}.json"
    path.write_text("{not json")
    again = load_or_measure(tiny_target, [], max_gamma=2, repeats=1)
    assert json.loads(path.read_text())["key"] == again.key


def test_the_key_depends_on_the_model(tiny_target, tiny_draft_folder):
    from specdec.runtime import load_model

    other = load_model(str(tiny_draft_folder))
    assert cost_model.cost_key(tiny_target)[0] != cost_model.cost_key(other)[0]


def test_pass_cost_interpolation_and_extrapolation():
    costs = CostModel({1: 1.0, 2: 1.5, 4: 2.0, 5: 1.8})
    assert costs.target_pass(3) == pytest.approx(1.75)
    assert costs.target_pass(5) == 1.8  # measured values are kept as measured, even a dip
    assert costs.target_pass(7) == pytest.approx(1.8 + 0.2 * 2)  # mean growth per token over 1..5, ≥ 0
    assert CostModel({1: 2.0, 2: 1.0}).target_pass(4) == 1.0  # never extrapolated downwards


def test_rounds_observed_correct_the_measured_curve():
    costs = CostModel({1: 1.0, 2: 1.5, 4: 2.0, 5: 1.8})
    assert costs.target_pass(4) == costs.measured_pass(4) == 2.0  # nothing observed: as measured
    for _ in range(200):  # real plain steps cost 1.3, real 4-token rounds 2.4 (T(4)/T(1): 2.0 measured, 1.85 real)
        costs.observe_round(1, 1.3)
        costs.observe_round(4, 2.4)
    assert costs.target_pass(1) == pytest.approx(1.3, rel=0.01)
    assert costs.target_pass(4) == pytest.approx(2.4, rel=0.01)
    # a size never observed takes the plain round's correction, 1.3, times what the other sizes cost
    # beyond the measured shape relative to it (here only 4 tokens: 1.2 / 1.3)
    assert costs.target_pass(2) == pytest.approx(1.5 * 1.2, rel=0.01)
    assert costs.measured_pass(4) == 2.0 and "calibration" not in costs.to_json()  # never cached
    costs.observe_round(1, 1e6)  # a stall is clipped to 4× the measured time, one observation of ~33
    assert costs.target_pass(1) < 1.45
    costs.observe_round(1, 0.0)  # a zero-time round (a clock without resolution) is ignored
    assert costs.calibration.observations == pytest.approx(sum(0.97 ** i for i in range(401)))


def test_calibration_forgets_what_the_machine_no_longer_does():
    costs = CostModel({1: 1.0, 2: 1.5})
    for _ in range(100):
        costs.observe_round(2, 3.0)
    for _ in range(150):
        costs.observe_round(2, 1.5)
    assert costs.target_pass(2) == pytest.approx(1.5, rel=0.05)


def test_a_rare_size_keeps_its_relative_cost_when_the_level_moves():
    """A size seen rarely is priced at its cost relative to a plain round, at today's level: on a short
    prompt one round in ten verifies 3 drafts (4 tokens) and costs 1.4 plain rounds; on a long one
    every round costs 1.5× more and no 4-token round is seen for 200 rounds, yet T(4) / T(1) stays
    1.4 (one running ratio per size priced them at the short prompt's level: 1.4 / 1.5 of a plain
    round, a loss judged a gain)."""
    costs = CostModel({1: 1.0, 4: 1.0})
    for _ in range(100):  # the short prompt
        for _ in range(9):
            costs.observe_round(1, 1.0)
        costs.observe_round(4, 1.4)
    for _ in range(200):  # the long prompt, plain rounds only
        costs.observe_round(1, 1.5)
    assert costs.target_pass(1) == pytest.approx(1.5, rel=0.01)
    assert costs.target_pass(4) / costs.target_pass(1) == pytest.approx(1.4, rel=0.01)
    for _ in range(200):  # a 4-token round turns out as cheap as a plain one: its factor follows
        for _ in range(9):
            costs.observe_round(1, 1.5)
        costs.observe_round(4, 1.5)
    assert costs.target_pass(4) / costs.target_pass(1) == pytest.approx(1.0, rel=0.01)


def test_a_runs_analysis_prices_its_passes_by_the_whole_run_not_its_last_rounds():
    """A run whose 100 first 4-token rounds cost 1.4 plain rounds and whose 100 last cost 1.0: the
    analysis (`observed_pass`) prices T(4) / T(1) at the mean over all of them, 1.2 (each factor
    counted against the level of its time), while the policy's running price has moved to the last
    rounds' (within 5% of 1.0: the control, what the analysis read at a run's end before, and a
    prediction that moved with the last prompt)."""
    costs = CostModel({1: 1.0, 4: 1.0})
    for ratio, repeats in ((1.4, 100), (1.0, 100)):
        for _ in range(repeats):
            for _ in range(9):
                costs.observe_round(1, 1.0)
            costs.observe_round(4, ratio)
    lifetime = costs.observed_pass(4) / costs.observed_pass(1)
    assert lifetime == pytest.approx(1.2, rel=0.01)
    assert costs.target_pass(4) / costs.target_pass(1) == pytest.approx(1.0, rel=0.05)  # the control
    costs.calibrate = False  # calibration off: the measured curve
    assert costs.observed_pass(4) == costs.measured_pass(4) == 1.0


def test_proposals_observed_correct_the_draft_costs():
    costs = CostModel({1: 1.0, 2: 1.5}, {"draft": DraftCost(0.01, 0.1), "ngram": DraftCost(0.0, 0.0)})
    assert costs.draft_seconds("draft", 3) == pytest.approx(0.31)  # nothing observed: as measured
    for _ in range(200):  # real proposals of 3 tokens cost twice the fit, of 1 token the fit
        costs.observe_draft("draft", 3, 0.62)
        costs.observe_draft("draft", 1, 0.11)
    # within 5%: the measured fit keeps a weight of 1 (a factor of 1) against ~33 faded observations
    assert costs.draft_seconds("draft", 3) == pytest.approx(0.62, rel=0.05)
    assert costs.draft_seconds("draft", 1) == pytest.approx(0.11, rel=0.05)
    # an unseen γ takes the correction of one-token proposals, 1, times what the others cost beyond
    # the fit relative to them (here γ = 3: 2; within 2%: with γ = 1 and 3 in turn the level, which
    # γ = 3's proposals also inform, settles slowly)
    assert costs.draft_seconds("draft", 5) == pytest.approx(0.51 * 2, rel=0.02)
    assert costs.target_pass(1) == 1.0 and costs.calibration.observations == 0  # passes are apart
    costs.observe_draft("ngram", 4, 1e-5)  # a drafter measured as free has no ratio to take
    assert costs.draft_seconds("ngram", 4) == 0.0 and "ngram" not in costs.draft_calibration
    costs.observe_draft("draft", 3, 1e3)  # clipped like a pass: one stall moves the ratio little
    assert costs.draft_seconds("draft", 3) < 0.62 * 1.05
    assert "draft_calibration" not in costs.to_json()  # never cached


def test_breakdown_arithmetic_on_hand_made_stats():
    stats = GenerationStats(drafter="ngram")
    # 10 rounds: 6 drafted 3 tokens (accepting 2, 2, 1, 0, 3, 3 → 11), 4 drafted none
    for accepted in (2, 2, 1, 0, 3, 3):
        stats.record_round(3, accepted, drafter="ngram", gamma=4, committed=accepted + 1,
                           draft_seconds=0.001, verify_seconds=0.1)
    for _ in range(4):
        stats.record_round(0, 0, drafter="ngram", gamma=4, committed=1, draft_seconds=0.001, verify_seconds=0.05)
    costs = CostModel({k: 0.05 * (1 + 0.5 * (k - 1)) for k in range(1, 10)}, {"ngram": DraftCost(0.0, 0.005)})
    [row] = drafter_breakdown(stats, costs, plain_tokens_per_second=20.0)
    # c, d: the run's own draft seconds (0.001 a round, 10 rounds) per drafted token and per round, over T(1) = 0.05
    alpha, f, c, d, v = 11 / 18, 0.6, 0.01 / 18 / 0.05, 0.01 / 10 / 0.05, 2.5
    assert row["gamma"] == 3 and row["drafting_share"] == f and row["alpha"] == pytest.approx(alpha, abs=1e-4)
    assert row["c"] == pytest.approx(c, abs=1e-4) and row["draft_per_round"] == pytest.approx(d, abs=1e-4)
    assert row["verify_cost"] == pytest.approx(v)
    cost = f * v + (1 - f) + d
    # per position: reached 6, 5, 4 times, accepted 5, 4, 2 times → α₁ = 5/6, β = 6/9 (run-aware)
    assert row["acceptance_model"] == "run-aware"
    assert row["alpha_first"] == pytest.approx(5 / 6, abs=1e-4) and row["alpha_then"] == pytest.approx(2 / 3, abs=1e-4)
    runs = 1 + 5 / 6 * (1 - (2 / 3) ** 3) / (1 / 3)
    assert row["predicted_speedup"] == pytest.approx((f * runs + 1 - f) / cost, abs=1e-3)
    assert row["iid_speedup"] == pytest.approx((f * expected_tokens_per_pass(alpha, 3) + 1 - f) / cost, abs=1e-3)
    assert row["costed_speedup"] == pytest.approx((f * (1 + 11 / 6) + 1 - f) / cost, abs=1e-3)
    assert row["measured_speedup"] == pytest.approx(21 / (10 * 0.001 + 0.6 + 0.2) / 20, abs=1e-3)
    assert row["baseline"] == "plain run"


def test_auto_drafter_specs(tiny_target):
    pool = build_drafters("auto", tiny_target)
    assert [d.name for d in pool] == ["suffix"]  # the tiny model has 2 layers: no early exit; no head shipped
    assert [d.name for d in build_drafters("auto:ngram:3, early:1", tiny_target)] == ["ngram:2-3", "early:1"]
    for bad in ("auto:ngram,none", "auto:ngram,", "auto:auto"):
        with pytest.raises(ConfigError, match="auto"):
            build_drafters(bad, tiny_target)


def test_rows_are_measured_for_a_server_and_cached(tiny_target, costs_dir):
    """max_batch > 1 adds T(B rows) − T(1 row of B tokens) for B = 2, 4 and one-row points T(B) past
    the verification sizes; `covers` still asks for every k up to the largest verification pass."""
    plain = load_or_measure(tiny_target, [], max_gamma=2, repeats=2)
    assert plain.row_seconds == {} and sorted(plain.pass_seconds) == [1, 2, 3]
    served = load_or_measure(tiny_target, [], max_gamma=2, repeats=2, max_batch=4)
    assert sorted(served.row_seconds) == [2, 4] and all(v >= 0 for v in served.row_seconds.values())
    assert sorted(served.pass_seconds) == [1, 2, 3, 4] and served.pass_seconds[3] == plain.pass_seconds[3]
    assert cost_model.covers(served, 4) and not cost_model.covers(served, 5)
    again = load_or_measure(tiny_target, [], max_gamma=2, max_batch=4)  # from the cache, nothing measured
    assert again.row_seconds == served.row_seconds and again.pass_seconds == served.pass_seconds
    wider = load_or_measure(tiny_target, [], max_gamma=6, repeats=2, max_batch=4)  # 5..7 were never measured
    assert cost_model.covers(wider, 7)


def test_measuring_more_sizes_adds_them_and_drops_nothing(tiny_target, costs_dir, monkeypatch):
    """A wider γ measures only the pass sizes not yet known; the rows' costs, the drafters' costs and
    the sizes already measured stay (a server's row costs once vanished here, pricing extra rows at 0)."""
    lookup = PromptLookupDrafter()
    served = load_or_measure(tiny_target, [lookup], max_gamma=2, repeats=1, max_batch=4)
    rows, drafts, passes = dict(served.row_seconds), dict(served.draft_costs), dict(served.pass_seconds)
    measure_passes = measure.measure_pass_costs
    asked = []

    def recording(net, context, sizes, repeats):
        asked.append(list(sizes))
        return measure_passes(net, context, sizes, repeats)

    monkeypatch.setattr(measure, "measure_pass_costs", recording)
    wider = load_or_measure(tiny_target, [lookup], max_gamma=6, repeats=1, max_batch=4)
    assert asked == [[5, 6, 7]]
    assert wider.row_seconds == rows and wider.draft_costs == drafts
    assert all(wider.pass_seconds[k] == v for k, v in passes.items()) and cost_model.covers(wider, 7)
    from_disk = load_or_measure(tiny_target, [lookup], max_gamma=6, max_batch=4)  # the file has all of it
    assert from_disk.row_seconds == rows and sorted(from_disk.pass_seconds) == sorted(wider.pass_seconds)
    in_use = CostModel.from_json(wider.to_json())
    in_use.observe_round(2, 10 * in_use.pass_seconds[2])  # calibrated by rounds, in memory only
    kept = load_or_measure(tiny_target, [lookup], max_gamma=7, repeats=1, max_batch=4, known=in_use)
    assert kept is in_use and asked[-1] == [8] and kept.target_pass(2) > wider.target_pass(2)
