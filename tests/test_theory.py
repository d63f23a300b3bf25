"""The seed formulas, against their closed forms and a Monte-Carlo simulation of i.i.d. acceptance."""

from __future__ import annotations

import pytest
import torch

from specdec.errors import ConfigError
from specdec.theory import best_gamma, expected_speedup, expected_tokens_per_pass


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
