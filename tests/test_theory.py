"""The formulas, against their closed forms and Monte-Carlo simulations: the seed's with i.i.d.
acceptance, the run-aware one with acceptance that comes in runs."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import ConfigError
from specdec.control.theory import (RunFit, best_gamma, expected_speedup, expected_speedup_run_aware, expected_tokens_by_position,
                            expected_tokens_per_pass, expected_tokens_run_aware, fit_runs)


def test_closed_forms():
    assert expected_tokens_per_pass(0.0, 5) == 1.0
    assert expected_tokens_per_pass(1.0, 5) == 6.0
    assert expected_tokens_per_pass(0.5, 2) == pytest.approx(1.75)
    assert expected_speedup(0.8, 4, 0.1) == pytest.approx((1 - 0.8**5) / (0.2 * 1.4))
    assert expected_speedup(0.8, 4, 0.1, verify_cost=2.0) == pytest.approx((1 - 0.8**5) / (0.2 * 2.4))


@pytest.mark.parametrize("alpha,gamma", [(0.3, 3), (0.7, 5), (0.9, 8)])
def test_tokens_per_pass_matches_simulation(alpha, gamma):
    """200,000 simulated rounds (each draft accepted with probability α until the first rejection);
    the standard error of the mean is below 0.01, the tolerance is 0.03 (> 3 standard errors)."""
    rounds = 200_000
    accepted = torch.rand(rounds, gamma, generator=torch.Generator().manual_seed(0)) < alpha
    tokens = accepted.long().cumprod(1).sum(1) + 1  # accepted drafts plus the bonus / correction
    assert tokens.float().mean().item() == pytest.approx(expected_tokens_per_pass(alpha, gamma), abs=0.03)


def test_best_gamma():
    assert best_gamma(0.8, 0.1, 12) == (6, pytest.approx(expected_speedup(0.8, 6, 0.1)))
    assert best_gamma(0.1, 0.5)[1] < 1  # a poor drafter that costs a lot: speculation loses


@pytest.mark.parametrize("args", [(-0.1, 3), (1.1, 3), (0.5, -1)])
def test_out_of_range(args):
    with pytest.raises(ConfigError):
        expected_tokens_per_pass(*args)


def simulate_runs(first: float, then: float, gamma: int, rounds: int, seed: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Rounds of γ drafted tokens whose acceptance comes in runs: the first is accepted with chance
    `first`, each later one with chance `then` if the one before was. Returns (tokens committed per
    round [rounds], accepted prefix length per round [rounds])."""
    draws = torch.rand(rounds, gamma, generator=torch.Generator().manual_seed(seed))  # [rounds, γ]
    chance = torch.full((gamma,), then)
    chance[0] = first
    accepted = (draws < chance).long().cumprod(1).sum(1)  # [rounds]: accepted until the first rejection
    return accepted + 1, accepted


def position_counts(accepted: torch.Tensor, gamma: int) -> tuple[list[int], list[int]]:
    """Per position i: rounds that reached it (every position before accepted), and that accepted it."""
    reached = [int((accepted >= i).sum()) for i in range(gamma)]
    took = [int((accepted >= i + 1).sum()) for i in range(gamma)]
    return reached, took


@pytest.mark.parametrize("first,then,gamma", [(0.3, 0.85, 4), (0.5, 0.9, 6), (0.2, 0.7, 8)])
def test_the_run_aware_form_matches_run_structured_acceptance_and_the_iid_form_does_not(first, then, gamma):
    """300,000 simulated rounds whose acceptance comes in runs. Over 100,000 rounds the mean tokens per
    round has a standard error below 0.011 in these cases (a round's tokens have a standard deviation
    below 3.5, at γ + 2 too); the tolerance of 0.05 is over 4.5 standard errors (false-positive
    chance under 1e-5 per check). The rates are fitted from the first half's counts (`fit_runs`), the
    prediction checked on the second half, at the simulated γ and at γ + 2, which the fit never saw.
    Negative control: the seed's i.i.d. formula with the pooled α (accepted / drafted) misses by more
    than 0.15 in every case (three times the tolerance)."""
    tokens, accepted = simulate_runs(first, then, gamma, 200_000, seed=1)
    fit = fit_runs(*position_counts(accepted[:100_000], gamma))
    # a rate fitted from ≥ 20,000 observations has a standard error ≤ √(0.25 / 20,000) ≈ 0.0035: 0.01 is ~3 of them
    assert fit.first == pytest.approx(first, abs=0.01) and fit.then == pytest.approx(then, abs=0.01)
    held_out = tokens[100_000:].float().mean().item()
    assert fit.expected_tokens(gamma) == pytest.approx(held_out, abs=0.05)
    assert expected_tokens_run_aware(first, then, gamma) == pytest.approx(held_out, abs=0.05)
    longer, _ = simulate_runs(first, then, gamma + 2, 100_000, seed=2)
    assert fit.expected_tokens(gamma + 2) == pytest.approx(longer.float().mean().item(), abs=0.05)
    pooled = accepted[:100_000].sum().item() / (100_000 * gamma)  # accepted / drafted, as the seed reads α
    assert abs(expected_tokens_per_pass(pooled, gamma) - held_out) > 0.15


def test_run_aware_closed_forms_and_errors():
    assert expected_tokens_run_aware(0.5, 0.5, 4) == pytest.approx(expected_tokens_per_pass(0.5, 4))  # i.i.d. case
    assert expected_tokens_run_aware(0.4, 1.0, 5) == pytest.approx(1 + 0.4 * 5)
    assert expected_tokens_run_aware(0.4, 0.9, 0) == 1.0
    assert expected_tokens_by_position([0.5, 0.5, 0.5]) == pytest.approx(expected_tokens_per_pass(0.5, 3))
    assert expected_speedup_run_aware(0.3, 0.85, 4, 0.01) == pytest.approx(expected_tokens_run_aware(0.3, 0.85, 4) / 1.04)
    assert best_gamma(0.3, 0.0, 8, verify_cost=1.0, then=0.9)[0] == 8  # free drafts, long runs: draft all
    assert fit_runs([0, 0], [0, 0]) is None
    assert fit_runs([10], [4]) == RunFit(0.4, 0.4, 10, 0)  # no later position reached: β takes α₁
    with pytest.raises(ConfigError, match="then"):
        expected_tokens_run_aware(0.5, 1.2, 3)
    with pytest.raises(ConfigError, match="accepted <= reached"):
        fit_runs([3, 2], [4, 1])
