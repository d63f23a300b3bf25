"""Sampling transforms against transformers' logits processors, and argument validation."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from stat_helpers import ALPHA, gof_pvalue
from tolerances import U32, normalisation_error

from specdec.errors import ConfigError
from specdec.sampling import SamplingParams, argmax, logits_to_probs, sample


def transformers_probs(logits, temperature, top_k, top_p):
    from transformers import TemperatureLogitsWarper, TopKLogitsWarper, TopPLogitsWarper

    scores = TemperatureLogitsWarper(temperature)(None, logits.clone())
    if top_k:
        scores = TopKLogitsWarper(top_k)(None, scores)
    if top_p < 1:
        scores = TopPLogitsWarper(top_p)(None, scores)
    return scores.softmax(-1)


@pytest.mark.parametrize("temperature,top_k,top_p", [
    (1.0, 0, 1.0), (0.5, 0, 1.0), (1.5, 5, 1.0), (1.0, 0, 0.9), (0.7, 10, 0.5), (1.0, 1, 1.0), (2.0, 0, 0.05),
])
def test_matches_transformers_warpers(temperature, top_k, top_p):
    logits = torch.randn(8, 50, generator=torch.Generator().manual_seed(0)) * 3  # [B, V]
    ours = logits_to_probs(logits, SamplingParams(temperature=temperature, top_k=top_k, top_p=top_p))
    ref = transformers_probs(logits, temperature, top_k, top_p)
    V = logits.shape[-1]  # probabilities (≤ 1) of two float32 softmaxes over V, each within (V + 1)·u of exact
    assert torch.allclose(ours, ref, rtol=0, atol=normalisation_error(V, 2) + 2 * U32)  # (+ the shift by the max)
    assert ((ours.sum(-1) - 1).abs() <= normalisation_error(V) + (V - 1) * U32).all()  # (+ this sum's own round-off)


def test_greedy_is_a_point_mass_on_the_argmax():
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0]])
    probs = logits_to_probs(logits, SamplingParams(temperature=0))
    assert probs.tolist() == [[0.0, 1.0, 0.0, 0.0]]  # ties go to the lowest id


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16, torch.float16, torch.float64])
def test_argmax_gives_torchs_ids(dtype):
    """The fast CPU argmax gives torch.argmax(-1)'s ids: random rows, strided views, 1-d and 3-d
    shapes, ties (the lowest id), NaN (the first one) and -inf rows."""
    gen = torch.Generator().manual_seed(0)
    scores = (torch.randn(3, 9, 4096, generator=gen) * 4).to(dtype)  # [B, k+1, V]
    scores[0, 0, [7, 3000]] = 1e4  # a tie at the top
    scores[1, 2, [11, 20]] = float("nan")
    scores[2, 3] = float("-inf")
    for case in (scores, scores[0, 0], scores[:, ::2], scores.transpose(0, 1), scores[..., ::3]):
        ours = argmax(case)
        assert ours.dtype == torch.long and ours.shape == case.shape[:-1]
        assert torch.equal(ours, case.argmax(-1))
    assert int(argmax(scores[0, 0])) == 7  # the lowest of the tied ids


@pytest.mark.parametrize("temperature", [1e-6, 1e-40, 1e-300])
def test_a_tiny_temperature_tends_to_the_argmax_without_overflow(temperature):
    """Found by the server's fuzz test: logits / 1e-124 overflowed to inf and softmax gave nan."""
    logits = torch.tensor([[0.1, 3.0, 3.0, -1.0], [5.0, -2.0, 1.0, 4.999]])
    for params in (SamplingParams(temperature=temperature), SamplingParams(temperature=temperature, top_p=0.9, top_k=3)):
        probs = logits_to_probs(logits, params)
        assert torch.isfinite(probs).all()
        assert probs[0].tolist() == [0.0, 0.5, 0.5, 0.0]  # the tied maxima share the mass
        assert probs[1, 0] == 1.0 or temperature == 1e-6 and probs[1, 0] > 0.99


@pytest.mark.parametrize("kwargs,message", [
    ({"temperature": -0.1}, "temperature"),
    ({"temperature": float("nan")}, "temperature"),
    ({"temperature": float("inf")}, "temperature"),
    ({"top_p": 0.0}, "top_p"),
    ({"top_p": 1.5}, "top_p"),
    ({"top_k": -1}, "top_k"),
])
def test_bad_settings_are_refused(kwargs, message):
    with pytest.raises(ConfigError, match=message):
        SamplingParams(**kwargs)


def test_seeded_generators_repeat():
    a = torch.rand(5, generator=SamplingParams(temperature=1, seed=11).generator())
    b = torch.rand(5, generator=SamplingParams(temperature=1, seed=11).generator())
    assert torch.equal(a, b)


DRAWS = 200_000  # per goodness-of-fit test below; each fails a correct sampler with probability ALPHA


def _weights() -> torch.Tensor:
    """Unnormalised weights over 40 tokens: some zero (never to be drawn), a wide spread of sizes."""
    weights = torch.rand(40, generator=torch.Generator().manual_seed(3)) ** 3
    weights[[0, 7, 8, 39]] = 0.0
    return weights * 5.0


def _draw_counts(draw) -> np.ndarray:
    weights = _weights()
    generator = torch.Generator().manual_seed(0)
    tokens = torch.cat([draw(weights.expand(10_000, -1), generator) for _ in range(DRAWS // 10_000)])
    return np.bincount(tokens.numpy(), minlength=weights.numel())


def test_sample_draws_the_normalised_weights():
    weights = _weights()
    counts = _draw_counts(sample)
    assert counts[weights.numpy() == 0].sum() == 0
    # normalised in float32: a sum of the weights, then a division each
    assert gof_pvalue(counts, (weights / weights.sum()).numpy(), normalised_within=normalisation_error(weights.numel())) > ALPHA


def test_negative_control_an_off_by_one_interval_fails():
    """Intervals (cdf[i-1], cdf[i]] instead of [cdf[i-1], cdf[i]) would still be right; shifting the
    draw to the next token is not, and the same test must catch it."""
    def shifted(probs, generator):
        return (sample(probs, generator) + 1) % probs.shape[-1]

    assert gof_pvalue(_draw_counts(shifted), (_weights() / _weights().sum()).numpy(),
                      normalised_within=normalisation_error(_weights().numel())) < ALPHA


def test_the_largest_uniform_draws_the_last_token_with_weight(monkeypatch):
    """u = 1 − 2^-53, the largest float64 below 1: u * total stays below the total, so the draw is
    the last token with weight, never a trailing zero (nor an index past the vocabulary)."""
    probs = torch.tensor([[0.2, 0.3, 0.25, 0.0, 0.0], [0.1, 0.0, 0.0, 0.0, 0.65], [0.0, 3.0, 0.0, 0.0, 0.0]])
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.full((3, 1), 1 - 2.0**-53, dtype=torch.float64))
    assert sample(probs, torch.Generator()).tolist() == [2, 4, 1]
    monkeypatch.setattr(torch, "rand", lambda *a, **k: torch.zeros(3, 1, dtype=torch.float64))
    assert sample(probs, torch.Generator()).tolist() == [0, 0, 1]  # u = 0: the first token with weight
