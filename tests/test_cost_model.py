"""The cost model: measured on a tiny model, cached per machine and model, read back; the breakdown's arithmetic."""

from __future__ import annotations

import json
import re

import pytest

from specdec.control import cost_model
from specdec.control.analysis import drafter_breakdown
from specdec.control.cost_model import CostModel, DraftCost, load_or_measure, measure
from specdec.control.cost_model.model import DRIFT_MIN_ROUNDS
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


def test_each_timed_proposal_follows_a_target_pass(tiny_target, monkeypatch):
    """In real rounds a target pass runs between two proposals and evicts the drafter's weights from
    the CPU caches (an EAGLE-3 head's proposal took 1.25× its back-to-back time after one on the
    default model): the measurement times each proposal, catch-ups included, right after a one-token
    target pass, as rounds do (here: early exit's proposals)."""
    events = []
    forward, early = tiny_target.net.forward, EarlyExitDrafter(tiny_target, 1)
    propose = early.propose
    monkeypatch.setattr(tiny_target.net, "forward", lambda ids, cache, **kw: (events.append(ids.shape[1]),
                                                                              forward(ids, cache, **kw))[1])
    monkeypatch.setattr(early, "propose", lambda *a, **kw: (events.append("propose"), propose(*a, **kw))[1])
    measure.measure_draft_cost(tiny_target, early, context=40, max_gamma=3, repeats=2)
    proposals = [i for i, event in enumerate(events) if event == "propose"]
    assert len(proposals) == 2 * (2 + 1)  # 1 and max γ, each a warm-up and 2 repeats (early exit: no catch-up)
    assert all(events[i - 1] == 1 for i in proposals)  # a one-token target pass right before each


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


def test_a_pass_is_priced_at_its_context_where_two_lengths_were_measured():
    """With `per_context` (seconds a pass adds per cached token), T(k, L) = T(k) + slope(k) · (L − the
    table's context), interpolated across sizes as T(k) is, and at least CONTEXT_FLOOR of T(k); without
    it, or asked for no context, T(k) as measured. Kept in the cache file."""
    from specdec.control.cost_model.model import CONTEXT_FLOOR

    costs = CostModel({1: 1.0, 2: 1.2, 4: 1.6}, context=256, per_context={1: 0.001, 2: 0.002, 4: 0.004})
    assert costs.target_pass(2) == 1.2 and costs.target_pass(2, 256) == 1.2
    assert costs.target_pass(2, 1256) == pytest.approx(1.2 + 2.0)
    assert costs.target_pass(3, 1256) == pytest.approx(1.4 + 3.0)  # both interpolated between 2 and 4
    assert costs.target_pass(1, 0) == pytest.approx(1.0 - 0.256)  # shorter: cheaper, linearly
    assert costs.target_pass(4, 0) == pytest.approx(1.6 - 1.024)
    steep = CostModel({1: 1.0}, context=256, per_context={1: 0.01})
    assert steep.target_pass(1, 0) == CONTEXT_FLOOR * 1.0  # (1 − 2.56 would be under the floor)
    flat = CostModel({1: 1.0, 2: 1.2}, context=256)
    assert flat.target_pass(2, 5000) == 1.2  # no slopes measured: as the table has it
    again = CostModel.from_json(costs.to_json())
    assert again.context == 256 and again.per_context == costs.per_context


def test_rounds_that_cost_what_their_context_says_have_not_drifted():
    """4-token rounds after 1,200 cached tokens cost 2.7× a plain round there, where the table (at 256)
    says 1.5×: priced at their context, as the table's two lengths say, they have not drifted. The
    control, the same table without its slopes: they have (on an AVX2 host 9-token passes were flagged
    at 1.74× this way, and the table measured again for nothing)."""
    def drift(per_context: dict) -> list[str]:
        costs = CostModel({1: 1.0, 4: 1.5}, context=256, per_context=per_context)
        with_slopes = CostModel({1: 1.0, 4: 1.5}, context=256, per_context={1: 1e-3, 4: 4e-3})
        for _ in range(DRIFT_MIN_ROUNDS):
            costs.observe_round(1, with_slopes.target_pass(1, 1200), 1200)
            costs.observe_round(4, with_slopes.target_pass(4, 1200), 1200)
        return costs.drift()

    assert drift({1: 1e-3, 4: 4e-3}) == []
    assert drift({}) != []


def test_passes_are_measured_at_two_contexts_and_their_slopes_kept(tiny_target, costs_dir, monkeypatch):
    """Where the model's window allows, passes are timed after COST_CONTEXT and after LONG_CONTEXT
    cached tokens and `per_context` is what each cached token added (here a timer that charges 1 ms
    per token and 10 µs per token per cached token: recovered exactly); a window too short for both:
    one length, no slopes."""
    def timings(net, context, sizes, repeats):
        return measure.Timings({k: [1e-3 * k + 1e-5 * k * context] * 3 for k in sizes})

    monkeypatch.setattr(measure, "measure_pass_costs", timings)
    monkeypatch.setattr(measure, "COST_CONTEXT", 32)
    monkeypatch.setattr(measure, "LONG_CONTEXT", 200)
    costs = load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1, cache=False)
    assert costs.context == 32 and costs.per_context == {k: pytest.approx(1e-5 * k) for k in (1, 2, 3)}
    assert costs.target_pass(2, 200) == pytest.approx(2e-3 + 2e-5 * 200)
    monkeypatch.setattr(measure, "LONG_CONTEXT", 100)  # 68 tokens further: under MIN_CONTEXT_SPAN
    assert load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1, cache=False).per_context == {}


def test_rounds_observed_calibrate_the_analysis_never_the_table():
    """Real rounds' times reach the calibration (what the analysis of a run prices by), never the
    table the policy prices by: T(k) stays as measured whatever the rounds took."""
    costs = CostModel({1: 1.0, 2: 1.5, 4: 2.0, 5: 1.8})
    for _ in range(200):  # real plain steps cost 1.3, real 4-token rounds 2.4 (T(4)/T(1): 2.0 measured, 1.85 real)
        costs.observe_round(1, 1.3)
        costs.observe_round(4, 2.4)
    assert costs.target_pass(1) == 1.0 and costs.target_pass(4) == 2.0  # the table, as measured
    assert costs.observed_pass(1) == pytest.approx(1.3)  # means of the ratios: rounding error only
    assert costs.observed_pass(4) == pytest.approx(2.4)
    assert costs.observed_pass(2) == pytest.approx(1.5 * (1.3 + 2.4 / 2) / 2)  # never observed: the mean ratio of all
    assert "calibration" not in costs.to_json()  # never cached
    level = costs.observed_pass(1)
    costs.observe_round(1, 1e6)  # a stall is clipped to 4× the table's time: one observation of 201
    assert costs.observed_pass(1) == pytest.approx((200 * 1.3 + 4.0) / 201)
    assert costs.observed_pass(1) < level * (1 + 3 / 200)
    costs.observe_round(1, 0.0)  # a zero-time round (a clock without resolution) is ignored
    assert costs.calibration.observations == 401


def test_a_size_seen_in_few_rounds_is_priced_from_every_round_not_its_own():
    """One plain round among 100 chain rounds once priced a whole run's analysis (T(1) 8.7 ms where
    plain decoding took 11.6): a size is priced by its own rounds from MIN_OBSERVED_ROUNDS of them on,
    before that by the table times the mean ratio of every round seen. Control: the same rounds with
    the lone plain round repeated MIN_OBSERVED_ROUNDS times are priced by their own mean."""
    from specdec.control.cost_model.model import MIN_OBSERVED_ROUNDS

    def observed(plain_rounds: int) -> float:
        costs = CostModel({1: 1.0, 3: 1.5})
        for _ in range(100):
            costs.observe_round(3, 1.8)  # 1.2× the table
        for _ in range(plain_rounds):
            costs.observe_round(1, 0.6)  # a fast one: 0.6× the table
        return costs.observed_pass(1)

    assert observed(1) == pytest.approx(1.0 * (100 * 1.2 + 0.6) / 101)
    assert observed(MIN_OBSERVED_ROUNDS) == pytest.approx(0.6)


def test_a_runs_analysis_prices_its_passes_by_the_whole_run_not_its_last_rounds():
    """A run whose 100 first 4-token rounds cost 1.4 plain rounds and whose 100 last cost 1.0: the
    analysis (`observed_pass`) prices T(4) / T(1) at the mean over all of them, 1.2. Calibration off:
    the table."""
    costs = CostModel({1: 1.0, 4: 1.0})
    for ratio, repeats in ((1.4, 100), (1.0, 100)):
        for _ in range(repeats):
            for _ in range(9):
                costs.observe_round(1, 1.0)
            costs.observe_round(4, ratio)
    assert costs.observed_pass(4) / costs.observed_pass(1) == pytest.approx(1.2)  # rounding error only
    costs.calibrate = False
    assert costs.observed_pass(4) == costs.target_pass(4) == 1.0


def test_proposals_observed_are_recorded_and_the_draft_costs_stay_as_measured():
    costs = CostModel({1: 1.0, 2: 1.5}, {"draft": DraftCost(0.01, 0.1), "ngram": DraftCost(0.0, 0.0)})
    for _ in range(200):  # real proposals of 3 tokens cost twice the fit, of 1 token the fit
        costs.observe_draft("draft", 3, 0.62)
        costs.observe_draft("draft", 1, 0.11)
    assert costs.draft_seconds("draft", 3) == pytest.approx(0.31)  # the table, as measured
    assert costs.draft_calibration["draft"].factor(3) == pytest.approx(2.0)  # rounding error only
    assert costs.calibration.observations == 0  # passes are apart
    costs.observe_draft("ngram", 4, 1e-5)  # a drafter measured as free has no ratio to take
    assert "ngram" not in costs.draft_calibration
    assert "draft_calibration" not in costs.to_json()  # never cached


def test_drift_is_reported_beyond_its_bound_over_enough_rounds():
    """4-token rounds that cost 2× what the table's shape says beside plain rounds, over
    DRIFT_MIN_ROUNDS rounds: the table has drifted, and so has a drafter 3× dearer than measured.
    Controls: one round fewer, or 1.4× (within DRIFT_BOUND), is no drift; nor is a drafter 3× dearer
    whose proposals cost under DRIFT_NEGLIGIBLE of a one-token pass all the same."""
    from specdec.control.cost_model.model import DRIFT_BOUND

    def after(rounds: int, factor: float) -> list[str]:
        costs = CostModel({1: 1.0, 4: 1.5})
        for _ in range(rounds):
            costs.observe_round(1, 1.0)
            costs.observe_round(4, 1.5 * factor)
        return costs.drift()

    assert DRIFT_BOUND == 1.5
    drifted = after(DRIFT_MIN_ROUNDS, 2.0)
    assert len(drifted) == 1 and "over 4 tokens cost 2.00×" in drifted[0]
    assert after(DRIFT_MIN_ROUNDS - 1, 2.0) == [] and after(DRIFT_MIN_ROUNDS, 1.4) == []
    costs = CostModel({1: 1.0}, {"draft": DraftCost(0.0, 0.1)})
    for _ in range(DRIFT_MIN_ROUNDS):
        costs.observe_round(1, 1.0)
        costs.observe_draft("draft", 1, 0.3)  # 3× its measured cost, beside passes as measured
    assert costs.drift() == ["draft's drafting cost 3.00× what the table says beside the passes"]
    cheap = CostModel({1: 1.0}, {"head": DraftCost(0.0, 0.005)})  # a proposal: 0.5% of a one-token pass
    for _ in range(DRIFT_MIN_ROUNDS):
        cheap.observe_round(1, 1.0)
        cheap.observe_draft("head", 4, 3 * 0.02)  # 3× the table, but 4% of a pass: no prediction moves
    assert cheap.drift() == []


def test_a_drifted_table_is_dropped_from_the_cache_once(tiny_target, costs_dir, capsys):
    """Drift removes the cached file (the next start measures again, announced) and is reported once;
    a table that holds keeps its file (the control)."""
    from specdec.control.cost_model.model import DRIFT_MIN_ROUNDS

    costs = load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1)
    path = costs_dir / f"{costs.key}.json"
    assert measure.drop_if_drifted(costs) == [] and path.exists()  # the control
    for _ in range(DRIFT_MIN_ROUNDS):
        costs.observe_round(1, costs.target_pass(1))
        costs.observe_round(3, 3 * costs.target_pass(3))
    assert measure.drop_if_drifted(costs) and not path.exists()
    assert "the next start measures them again" in " ".join(capsys.readouterr().err.split())
    assert measure.drop_if_drifted(costs) == []  # once
    load_or_measure(tiny_target, [PromptLookupDrafter(), PromptLookupDrafter(3)], max_gamma=2, repeats=1, known=costs)
    assert not path.exists()  # adding to a dropped table does not write it back


def busy_then(settles_after: int, monkeypatch) -> list[int]:
    """measure_pass_costs replaced by one whose first `settles_after` calls have a repeat 3× its
    median (a busy machine), then none; returns a list that counts the calls."""
    calls = []

    def timings(net, context, sizes, repeats):
        calls.append(1)
        busy = len(calls) <= settles_after
        return measure.Timings({k: [1e-2 * k] * 8 + [3e-2 * k if busy else 1e-2 * k] for k in sizes})

    monkeypatch.setattr(measure, "measure_pass_costs", timings)
    return calls


def test_a_measurement_with_a_3x_outlier_is_measured_again_not_cached(tiny_target, costs_dir, monkeypatch, capsys):
    """A pass measurement in which one repeat took 3× its median is measured again (announced); one
    that never settles (MEASURE_TRIES times busy) is used but not cached. The control, a quiet
    machine: measured once and cached."""
    calls = busy_then(1, monkeypatch)
    costs = load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1)
    path = costs_dir / f"{costs.key}.json"
    assert len(calls) == 2 and path.exists() and costs.pass_seconds[2] == 2e-2
    said = " ".join(capsys.readouterr().err.split())  # (announcements wrap at the terminal's width)
    assert re.search(r"looked busy while measuring target passes after \d+ cached tokens \(1 once took 3\.0× its "
                     r"median\): measuring again", said), said
    path.unlink()
    calls = busy_then(measure.MEASURE_TRIES, monkeypatch)
    costs = load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1)
    assert len(calls) == measure.MEASURE_TRIES and not path.exists() and costs.pass_seconds[1] == 1e-2
    assert "not caching them" in " ".join(capsys.readouterr().err.split())
    calls = busy_then(0, monkeypatch)
    load_or_measure(tiny_target, [PromptLookupDrafter()], max_gamma=2, repeats=1)
    assert len(calls) == 1 and path.exists()  # the control
    spread = json.loads(path.read_text())["pass_spread"]
    assert set(spread) == {"1", "2", "3"} and all(v == 0.0 for v in spread.values())


def test_breakdown_arithmetic_on_hand_made_stats():
    stats = GenerationStats(drafter="ngram")
    # 10 rounds: 6 drafted 3 tokens (accepting 2, 2, 1, 0, 3, 3 → 11), 4 drafted none
    for accepted in (2, 2, 1, 0, 3, 3):
        stats.record_round(3, accepted, drafter="ngram", gamma=4, committed=accepted + 1,
                           draft_seconds=0.001, verify_seconds=0.1)
    for _ in range(4):
        stats.record_round(0, 0, drafter="ngram", gamma=4, committed=1, draft_seconds=0.001, verify_seconds=0.05)
    costs = CostModel({k: 0.05 * (1 + 0.5 * (k - 1)) for k in range(1, 10)}, {"ngram": DraftCost(0.0, 0.005)})
    plain = GenerationStats(drafter="none")
    for _ in range(20):  # a plain run beside: 20 tokens a second in its rounds
        plain.record_round(0, 0, committed=1, draft_seconds=0.0, verify_seconds=0.05)
    [row] = drafter_breakdown(stats, costs, plain)
    # c, d: the run's own draft seconds (0.001 a round, 10 rounds) per drafted token and per round, over T(1) = 0.05
    alpha, f, c, d, v = 11 / 18, 0.6, 0.01 / 18 / 0.05, 0.01 / 10 / 0.05, 2.5
    # the breakdown rounds rates to 4 decimals and speed-ups to 3 (`control/analysis.py`): abs= half a
    # unit of the last decimal, with room for float64 round-off
    assert row["gamma"] == 3 and row["drafting_share"] == f and row["alpha"] == pytest.approx(alpha, abs=5.1e-5)
    assert row["c"] == pytest.approx(c, abs=5.1e-5) and row["draft_per_round"] == pytest.approx(d, abs=5.1e-5)
    assert row["verify_cost"] == pytest.approx(v)
    cost = f * v + (1 - f) + d
    # per position: reached 6, 5, 4 times, accepted 5, 4, 2 times → α₁ = 5/6, β = 6/9 (run-aware)
    assert row["acceptance_model"] == "run-aware"
    assert row["alpha_first"] == pytest.approx(5 / 6, abs=5.1e-5) and row["alpha_then"] == pytest.approx(2 / 3, abs=5.1e-5)
    runs = 1 + 5 / 6 * (1 - (2 / 3) ** 3) / (1 / 3)
    assert row["predicted_speedup"] == pytest.approx((f * runs + 1 - f) / cost, abs=5.1e-4)
    assert row["iid_speedup"] == pytest.approx((f * expected_tokens_per_pass(alpha, 3) + 1 - f) / cost, abs=5.1e-4)
    assert row["costed_speedup"] == pytest.approx((f * (1 + 11 / 6) + 1 - f) / cost, abs=5.1e-4)
    assert row["measured_speedup"] == pytest.approx(21 / (10 * 0.001 + 0.6 + 0.2) / 20, abs=5.1e-4)
    assert row["baseline"] == "plain run"


def test_whole_run_prediction_counts_the_prefill_and_prices_against_the_plain_run():
    """The run's prediction is over plain decoding's measured rate in its rounds and counts the prefill
    on both sides (the bench's measured speed-up is over whole runs: a 300-token prompt was a third of
    the default model's time, which the rounds-only prediction left out, 12-30% high). Controls: no
    prefill gives the rounds' own ratio; a plain run twice as slow doubles the rounds' speed-up."""
    from specdec.control.analysis import predicted_speedup

    def run(prefill: float) -> GenerationStats:
        stats = GenerationStats(drafter="ngram")
        for _ in range(10):  # 10 rounds drafting 3, accepting all: 40 tokens at T(4) = 0.125 s a round
            stats.record_round(3, 3, verified_tokens=3, drafter="ngram", gamma=3, committed=4, draft_seconds=0.0,
                               verify_seconds=0.125)
        stats.prefill_seconds = prefill
        return stats

    costs = CostModel({k: 0.05 * (1 + 0.5 * (k - 1)) for k in range(1, 10)}, {"ngram": DraftCost(0.0, 0.0)})

    def plain(seconds: float) -> GenerationStats:
        stats = GenerationStats(drafter="none")
        for _ in range(20):
            stats.record_round(0, 0, committed=1, draft_seconds=0.0, verify_seconds=seconds)
        return stats

    rounds = 4 / (0.125 / 0.05)  # every draft accepted: 4 tokens a round, each round 2.5 plain tokens' time
    assert predicted_speedup(run(0.0), costs, plain(0.05)) == pytest.approx(rounds)
    assert predicted_speedup(run(0.0), costs, plain(0.1)) == pytest.approx(2 * rounds)
    p, n = 1.0 / 0.05, 40  # the prefill in plain tokens' time, the tokens the rounds committed
    assert predicted_speedup(run(1.0), costs, plain(0.05)) == pytest.approx((p + n) / (p + n / rounds))


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
    assert kept is in_use and asked[-1] == [8] and kept.observed_pass(2) > wider.observed_pass(2)  # calibration kept
