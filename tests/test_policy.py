"""The adaptive policy on synthetic costs and simulated acceptance (no model involved)."""

from __future__ import annotations

import random

import pytest

from specdec.cost_model import CostModel, DraftCost
from specdec.policy import COOLDOWN_FIRST, COOLDOWN_MAX, AdaptivePolicy, PositionAcceptance
from specdec.theory import best_gamma, expected_tokens_per_pass


def costs(verify_growth: float = 0.0, **per_token: float) -> CostModel:
    """T(k) = 1 + verify_growth · (k − 1); drafter name → c (draft seconds per token, T(1) = 1)."""
    return CostModel({k: 1 + verify_growth * (k - 1) for k in range(1, 10)},
                     {name: DraftCost(0.0, c) for name, c in per_token.items()})


def run(policy: AdaptivePolicy, rates: dict[str, float], rounds: int, seed: int = 0) -> list:
    """Simulate rounds: each drafted token is accepted with its drafter's rate (i.i.d.)."""
    rng = random.Random(seed)
    plans = []
    for _ in range(rounds):
        plan = policy.choose()
        accepted = 0
        if plan.drafter is not None:
            while accepted < plan.gamma and rng.random() < rates[policy.names[plan.drafter]]:
                accepted += 1
        policy.observe(plan, plan.gamma, accepted)
        plans.append(plan)
    return plans


def test_estimates_start_at_the_prior_and_follow_the_evidence():
    acceptance = PositionAcceptance(prior=0.6, memory=0.9)
    assert acceptance.alphas(3) == [0.6, 0.6, 0.6]
    assert acceptance.expected_tokens(5) == pytest.approx(expected_tokens_per_pass(0.6, 5))
    for _ in range(50):
        acceptance.observe(drafted=2, accepted=2)
    first, second, third = acceptance.alphas(3)
    assert first > 0.95 and second > 0.95
    assert third == pytest.approx(second)  # never drafted: takes the estimate of the position before
    before = list(acceptance.drafted)
    acceptance.observe(drafted=3, accepted=0)
    assert acceptance.drafted[1:] == before[1:]  # positions after the rejection were not reached: no evidence
    for _ in range(100):
        acceptance.observe(drafted=2, accepted=0)
    # old evidence forgotten: the estimate falls to its floor, the prior's weight of 1 against the
    # 1 / (1 − memory) = 10 observations the memory keeps: 0.6 / 11
    assert acceptance.alphas(2)[0] == pytest.approx(0.6 / 11, abs=1e-3)


@pytest.mark.parametrize("alpha,c,growth", [(0.8, 0.1, 0.0), (0.6, 0.05, 0.0), (0.9, 0.02, 0.1), (0.5, 0.0, 0.3)])
def test_with_iid_acceptance_it_picks_the_seed_formulas_best_gamma(alpha, c, growth):
    """Before any evidence, α = prior for every position: the policy's choice must be the formula's."""
    policy = AdaptivePolicy(costs(growth, d=c), ["d"], max_gamma=8, prior=alpha)
    plan = policy.choose()
    # with T(γ+1) = 1 + growth·γ = (γc + 1 + growth·γ) − γc, the formula's verify cost is 1 + growth·γ
    candidates = [(g, expected_tokens_per_pass(alpha, g) / (g * c + 1 + growth * g)) for g in range(1, 9)]
    expected = max(candidates, key=lambda x: x[1])
    assert (plan.drafter, plan.gamma) == (0, expected[0])
    assert plan.predicted_speedup == pytest.approx(expected[1])
    if growth == 0:
        assert best_gamma(alpha, c, 8) == (expected[0], pytest.approx(expected[1]))


def test_high_acceptance_drafts_long():
    policy = AdaptivePolicy(costs(0.05, d=0.01), ["d"], max_gamma=8)
    plans = run(policy, {"d": 0.95}, rounds=60)
    assert all(p.gamma == 8 for p in plans[-20:]), [p.gamma for p in plans]


def test_a_losing_drafter_falls_back_to_plain_and_probes_with_growing_cooldowns():
    policy = AdaptivePolicy(costs(0.0, d=0.5), ["d"], max_gamma=8, prior=0.6)
    plans = run(policy, {"d": 0.0}, rounds=700)
    probes = [i for i, p in enumerate(plans) if p.drafter is not None]
    gaps = [b - a - 1 for a, b in zip(probes, probes[1:])]  # plain rounds between probes
    assert probes[0] == 0  # the first round measures the drafter
    assert gaps == [min(COOLDOWN_FIRST * 2**i, COOLDOWN_MAX) for i in range(len(gaps))]  # 8, 16, ... 128, 128...
    assert len(gaps) >= 5
    assert "best predicted" in plans[0].reason  # the prior (α 0.6) predicts a gain: first round drafts
    assert all("probe" in plans[i].reason and plans[i].predicted_speedup < 1 for i in probes[1:])


def test_a_drafter_the_prior_predicts_to_lose_is_first_probed_after_a_cooldown():
    policy = AdaptivePolicy(costs(0.0, d=0.9), ["d"], max_gamma=8, prior=0.6)
    plans = run(policy, {"d": 0.0}, rounds=30)
    assert [i for i, p in enumerate(plans) if p.drafter is not None] == [COOLDOWN_FIRST, 2 * COOLDOWN_FIRST + COOLDOWN_FIRST + 1]


def test_it_comes_back_when_the_drafter_starts_paying():
    policy = AdaptivePolicy(costs(0.0, d=0.3), ["d"], max_gamma=8)
    losing = run(policy, {"d": 0.0}, rounds=100)
    assert sum(p.drafter is None for p in losing[-50:]) > 40  # fell back while the drafter lost
    plans = run(policy, {"d": 1.0}, rounds=500, seed=1)
    assert all(p.drafter == 0 and p.predicted_speedup > 1 for p in plans[-50:])  # probes paid; it came back


def test_auto_picks_the_drafter_that_is_accepted_more():
    policy = AdaptivePolicy(costs(0.05, good=0.0, bad=0.0), ["bad", "good"], max_gamma=6)
    plans = run(policy, {"good": 0.8, "bad": 0.2}, rounds=300)
    late = plans[-100:]
    assert sum(p.drafter == 1 for p in late) >= 90
    assert any(p.drafter == 0 for p in plans)  # the other was tried


def test_auto_weighs_cost_against_acceptance():
    """A slightly better but much dearer drafter loses to a cheap one."""
    policy = AdaptivePolicy(costs(0.0, cheap=0.0, dear=0.6), ["dear", "cheap"], max_gamma=6)
    plans = run(policy, {"cheap": 0.6, "dear": 0.7}, rounds=300)
    assert sum(p.drafter == 1 for p in plans[-100:]) >= 90


def test_a_fixed_gamma_is_kept_even_when_it_loses():
    policy = AdaptivePolicy(costs(0.0, a=0.5, b=0.5), ["a", "b"], max_gamma=8, fixed_gamma=3)
    plans = run(policy, {"a": 0.0, "b": 0.1}, rounds=50)
    assert all(p.drafter is not None and p.gamma == 3 for p in plans)


def test_the_decision_log_records_changes_only():
    policy = AdaptivePolicy(costs(0.0, d=0.5), ["d"], max_gamma=8)
    plans = run(policy, {"d": 0.0}, rounds=40)
    changes = sum(1 for a, b in zip(plans, plans[1:]) if (a.drafter, a.gamma) != (b.drafter, b.gamma))
    assert len(policy.decisions) == changes + 1
