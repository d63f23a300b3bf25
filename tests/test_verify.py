"""Chain verification: greedy rule, fast path = reference, and the exact one-round distribution.

The distribution test. A toy "model" whose next-token logits depend on the previous token (one table
for the target, one for the draft, per position) gives p_i(· | x_{i-1}) and q_i(· | x_{i-1}), processed
by `logits_to_probs` with the setting under test. One round drafts γ = 2 tokens from q (or, for a
point-mass proposal, the draft's argmax) and verifies them. The round emits a sequence of 1 to γ+1
tokens; its exact law under speculative sampling is

    P(x_1..x_j accepted, then y) = Π_{i≤j} min(p_i(x_i), q_i(x_i)) · max(0, p_{j+1}(y) − q_{j+1}(y))   (j < γ)
    P(all γ accepted, then bonus y) = Π_{i≤γ} min(p_i(x_i), q_i(x_i)) · p_{γ+1}(y)

(q = one-hot(draft) for a point-mass proposal). Its first-token marginal is exactly p_1 (checked to
the round-off of the float32 distributions, `LAW_ROUND_OFF`), the lossless property. 200,000 rounds are sampled with the implementation and compared with
the exact law by a chi-square test at ALPHA = 1e-3 (false-positive rate 0.1% per test). The same
test with a verifier that accepts everything, and with one that resamples rejections from p, must
fail (p < 1e-3): the negative controls.
"""

from __future__ import annotations

import itertools

import numpy as np
import pytest
import torch

from specdec.sampling import SamplingParams, logits_to_probs
from specdec.decode.verify import point_mass_sample, speculative_sample, verify_greedy
from reference_verify import speculative_sample_reference
from stat_helpers import ALPHA, accept_everything, gof_pvalue, residual_from_p
from tolerances import U32, law_normalisation_error, normalisation_error

VOCAB, GAMMA, SAMPLES = 6, 2, 200_000
SETTINGS = [
    SamplingParams(temperature=0.5),
    SamplingParams(temperature=1.0),
    SamplingParams(temperature=1.5),
    SamplingParams(temperature=1.0, top_k=3),
    SamplingParams(temperature=1.0, top_p=0.8),
    SamplingParams(temperature=0.7, top_k=4, top_p=0.9),
]
# How far from 1 the toy round's law may sum, and its first-token marginal lie from p_1: per level a
# float32 distribution over VOCAB, and max(0, p − q) rounded once (≤ 2u over the level)
LAW_ROUND_OFF = normalisation_error(VOCAB, GAMMA + 1) + (GAMMA + 1) * 2 * U32


class ToyRound:
    """Per-position, previous-token-dependent distributions for target (p) and draft (q)."""

    def __init__(self, params: SamplingParams, point_mass: bool, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        target_logits = torch.randn(GAMMA + 1, VOCAB, VOCAB, generator=gen) * 1.5  # [pos, prev, V]
        draft_logits = target_logits[:GAMMA] + torch.randn(GAMMA, VOCAB, VOCAB, generator=gen)  # [pos, prev, V]
        self.p = logits_to_probs(target_logits, params)  # [γ+1, prev, V]
        self.point_mass = point_mass
        if point_mass:
            self.q = torch.nn.functional.one_hot(draft_logits.argmax(-1), VOCAB).float()  # [γ, prev, V]
        else:
            self.q = logits_to_probs(draft_logits, params)  # [γ, prev, V]
        self.root = 0  # the token before the round

    def exact_law(self) -> dict[tuple[int, ...], float]:
        law = {}
        for j in range(GAMMA + 1):
            for seq in itertools.product(range(VOCAB), repeat=j + 1):
                prev, prob = self.root, 1.0
                for i in range(j):
                    x = seq[i]
                    prob *= min(float(self.p[i, prev, x]), float(self.q[i, prev, x]))
                    prev = x
                y = seq[j]
                if j < GAMMA:
                    prob *= max(0.0, float(self.p[j, prev, y] - self.q[j, prev, y]))
                else:
                    prob *= float(self.p[GAMMA, prev, y])
                law[seq] = prob
        return law

    def sample_rounds(self, verifier, n: int, seed: int) -> dict[tuple[int, ...], int]:
        gen = torch.Generator().manual_seed(seed)
        prev = torch.full((n,), self.root)
        drafts, p_rows, q_rows = [], [], []
        for i in range(GAMMA):
            q_i = self.q[i, prev]  # [N, V]
            x = torch.multinomial(q_i, 1, generator=gen).squeeze(1)  # point mass: always the argmax
            drafts.append(x)
            p_rows.append(self.p[i, prev])
            q_rows.append(q_i)
            prev = x
        p_rows.append(self.p[GAMMA, prev])
        draft = torch.stack(drafts, 1)  # [N, γ]
        p = torch.stack(p_rows, 1)  # [N, γ+1, V]
        q = None if self.point_mass else torch.stack(q_rows, 1)  # [N, γ, V]
        num_accepted, next_token = verifier(draft, p, q, gen)
        counts: dict[tuple[int, ...], int] = {}
        for row, n_acc, y in zip(draft.tolist(), num_accepted.tolist(), next_token.tolist()):
            key = (*row[:n_acc], y)
            counts[key] = counts.get(key, 0) + 1
        return counts


def pvalue(toy: ToyRound, verifier, seed: int = 1) -> float:
    law = toy.exact_law()
    counts = toy.sample_rounds(verifier, SAMPLES, seed)
    keys = list(law)
    unexpected = sum(c for k, c in counts.items() if k not in law)
    observed = np.array([counts.get(k, 0) for k in keys] + [unexpected])
    probs = np.array([law[k] for k in keys] + [0.0])
    return gof_pvalue(observed, probs, normalised_within=LAW_ROUND_OFF)


@pytest.mark.parametrize("point_mass", [False, True], ids=["q", "point-mass"])
@pytest.mark.parametrize("params", SETTINGS, ids=str)
def test_one_round_distribution_is_exact(params, point_mass):
    toy = ToyRound(params, point_mass)
    law = toy.exact_law()
    assert abs(sum(law.values()) - 1) <= LAW_ROUND_OFF
    first_token = np.zeros(VOCAB)
    for seq, prob in law.items():
        first_token[seq[0]] += prob
    assert np.allclose(first_token, toy.p[0, toy.root].numpy(), rtol=0, atol=LAW_ROUND_OFF)  # lossless: marginal is p_1
    assert pvalue(toy, speculative_sample) > ALPHA


@pytest.mark.parametrize("point_mass", [False, True], ids=["q", "point-mass"])
@pytest.mark.parametrize("wrong", [accept_everything, residual_from_p], ids=lambda f: f.__name__)
@pytest.mark.parametrize("params", [SETTINGS[0], SETTINGS[3]], ids=str)
def test_negative_control_fails(params, point_mass, wrong):
    assert pvalue(ToyRound(params, point_mass), wrong) < ALPHA


def plain_round_pvalue(position: int) -> float:
    """A plain round (γ = 0) over the toy's p: 200,000 next tokens drawn by `speculative_sample`
    from p[:, position] against the law p_1 (chi-square, false-positive rate ALPHA)."""
    toy = ToyRound(SETTINGS[1], point_mass=True)
    p = toy.p[:, toy.root][None].expand(SAMPLES, -1, -1)[:, position:]  # [N, 1 or more, V]
    num_accepted, next_token = speculative_sample(torch.zeros(SAMPLES, 0, dtype=torch.long), p, None,
                                                  torch.Generator().manual_seed(3))
    assert not num_accepted.any()
    observed = np.bincount(next_token.numpy(), minlength=VOCAB)
    return gof_pvalue(observed, toy.p[0, toy.root].double().numpy(), normalised_within=normalisation_error(VOCAB))


def test_a_plain_round_draws_from_p_1():
    """An empty draft samples the next token straight from p_1 (the fast path skips the residual)."""
    assert plain_round_pvalue(0) > ALPHA


def test_a_plain_round_drawing_from_another_position_fails():
    """Negative control: the same test on draws from p_2 (the wrong position) must fail."""
    assert plain_round_pvalue(1) < ALPHA


@pytest.mark.parametrize("use_q", [True, False])
@pytest.mark.parametrize("gamma", [0, 1, 4])
def test_fast_path_equals_reference(gamma, use_q):
    gen = torch.Generator().manual_seed(gamma)
    batch, vocab = 300, 7
    p = torch.softmax(torch.randn(batch, gamma + 1, vocab, generator=gen), -1)
    q = torch.softmax(torch.randn(batch, gamma, vocab, generator=gen), -1) if use_q else None
    source = q if use_q else torch.softmax(torch.randn(batch, gamma, vocab, generator=gen), -1)
    draft = torch.multinomial(source.reshape(-1, vocab), 1, generator=gen).reshape(batch, gamma) if gamma else torch.zeros(batch, 0, dtype=torch.long)
    fast = speculative_sample(draft, p, q, torch.Generator().manual_seed(7))
    slow = speculative_sample_reference(draft, p, q, torch.Generator().manual_seed(7))
    assert torch.equal(fast[0], slow[0]) and torch.equal(fast[1], slow[1])
    if gamma:
        assert 0 < fast[0].float().mean() < gamma  # both accepting and rejecting rows were exercised


POINT_MASS_SETTINGS = [SamplingParams(temperature=1.0), SamplingParams(temperature=0.7, top_p=0.9),
                       SamplingParams(temperature=1.3, top_k=20)]


def point_mass_cases(cases: int = 600):
    """Seeded rounds of a point-mass chain: (seed, draft tokens, logits [γ+1, V], params), γ 1..6, vocabularies
    of 7, 100 and 49,152 (the default model's), drafts drawn from p (so that runs of them are accepted)
    and one in five starting with p's least likely token (rejected at once)."""
    for seed in range(cases):
        gen = torch.Generator().manual_seed(seed)
        gamma, vocab = seed % 6 + 1, (7, 100, 49_152)[seed % 3]
        params = POINT_MASS_SETTINGS[(seed // 3) % 3] if vocab > 20 else POINT_MASS_SETTINGS[0]
        logits = torch.randn(gamma + 1, vocab, generator=gen) * 3  # [γ+1, V]
        p = logits_to_probs(logits, params)  # [γ+1, V]
        draft = torch.multinomial(p[:gamma], 1, generator=gen)[:, 0].tolist()
        if seed % 5 == 0:
            draft[0] = int(p[0].argmin())
        yield seed, draft, logits, params


@pytest.mark.slow
def test_point_mass_sample_equals_the_chain_rule_over_the_whole_p():
    """`point_mass_sample` (p only where the test reaches) returns what `speculative_sample` does over
    the whole processed p with q = None, seeded alike, bit for bit (the same uniforms, residual and
    draw), with the same uniforms and residual for the trace; 600 rounds, rejected at every position
    and accepted whole."""
    accepted, whole = set(), 0
    for seed, draft, logits, params in point_mass_cases():
        full_details, lazy_details = {}, {}
        n, token = speculative_sample(torch.tensor([draft]), logits_to_probs(logits[None], params), None,
                                      torch.Generator().manual_seed(seed), full_details)
        assert point_mass_sample(draft, logits, params, torch.Generator().manual_seed(seed), lazy_details) == \
            (int(n[0]), int(token[0])), seed
        assert all(torch.equal(full_details[key], lazy_details[key]) for key in ("uniforms", "residual")), seed
        accepted.add(int(n[0]))
        whole += int(n[0]) == len(draft)
    assert accepted == set(range(6)) and whole > 10  # rejections at every position, and whole chains accepted


def test_point_mass_sample_comparison_negative_control():
    """The same comparison must catch a rule that reads p one position late (the bonus position's
    logits repeated): it differs on many of the same rounds."""
    differ = 0
    for seed, draft, logits, params in point_mass_cases(200):
        n, token = speculative_sample(torch.tensor([draft]), logits_to_probs(logits[None], params), None,
                                      torch.Generator().manual_seed(seed))
        late = torch.cat([logits[1:], logits[-1:]])  # [γ+1, V]: p_{i+1} where p_i belongs
        differ += point_mass_sample(draft, late, params, torch.Generator().manual_seed(seed)) != (int(n[0]), int(token[0]))
    assert differ > 50


def test_greedy_accepts_longest_matching_prefix():
    logits = torch.full((3, 4, 10), -1.0)
    argmax = torch.tensor([[5, 6, 7, 8], [5, 6, 7, 8], [5, 6, 7, 8]])
    logits.scatter_(2, argmax[..., None], 1.0)
    draft = torch.tensor([[5, 6, 7], [5, 9, 7], [1, 6, 7]])
    n, nxt = verify_greedy(draft, logits)
    assert n.tolist() == [3, 1, 0]
    assert nxt.tolist() == [8, 6, 5]  # bonus after a full accept; the target's token at the mismatch


def test_point_mass_certain_target_always_accepts():
    p = torch.zeros(1, 3, 5)
    p[0, :, 2] = 1.0
    n, nxt = speculative_sample(torch.tensor([[2, 2]]), p, None, torch.Generator().manual_seed(0))
    assert n.item() == 2 and nxt.item() == 2


# --- a chain that stops by its confidence -----------------------------------------------------

class ToyChain:
    """A bigram target p[prev] and draft q[prev] over VOCAB tokens; generations of LENGTH tokens by
    rounds of `draft_chain` (γ ≤ 3) and `speculative_sample`, whose law is p's: Π p[x_{i-1}, x_i]."""

    LENGTH, MAX_GAMMA, THRESHOLD = 3, 3, 0.5

    def __init__(self, seed: int = 0) -> None:
        gen = torch.Generator().manual_seed(seed)
        target_logits = torch.randn(VOCAB, VOCAB, generator=gen) * 1.5  # [prev, V]
        self.draft_logits = target_logits + torch.randn(VOCAB, VOCAB, generator=gen) * 1.5  # [prev, V]
        self.p = torch.softmax(target_logits, -1)  # [prev, V]
        self.q = torch.softmax(self.draft_logits, -1)  # [prev, V]
        assert (self.q.max(-1).values < self.THRESHOLD).any() and (self.q.max(-1).values > self.THRESHOLD).any()

    def exact_law(self) -> dict[tuple[int, ...], float]:
        law = {}
        for seq in itertools.product(range(VOCAB), repeat=self.LENGTH):
            prob, prev = 1.0, 0
            for x in seq:
                prob, prev = prob * float(self.p[prev, x]), x
            law[seq] = prob
        return law

    def generate(self, gen: torch.Generator, keep_drafting=None, self_dependent_trim: bool = False) -> tuple[int, ...]:
        from specdec.drafters.base import draft_chain

        out = [0]  # the root
        params = SamplingParams(temperature=1.0)
        while len(out) <= self.LENGTH:
            draft = draft_chain(lambda ids: self.draft_logits[ids[-1]], [out[-1]], self.MAX_GAMMA, params, gen,
                                keep_drafting=keep_drafting or (lambda confidence: True))  # (confidences kept)
            k = len(draft)
            if self_dependent_trim:  # keep x_j only if the draft is sure after it: x_j's inclusion depends on x_j
                after = [*draft.confidence[1:], float(self.q[draft.tokens[-1]].max())]
                k = next((j for j, c in enumerate(after) if c < self.THRESHOLD), k)
            tokens = draft.tokens[:k]
            prevs = [out[-1], *tokens]
            p = self.p[prevs][None]  # [1, k + 1, V]
            accepted, next_token = speculative_sample(torch.tensor([tokens], dtype=torch.long).reshape(1, k), p,
                                                      draft.q[:k][None], gen)
            out += tokens[:int(accepted[0])] + [int(next_token[0])]
        return tuple(out[1:self.LENGTH + 1])


def chain_pvalue(runs: int, **how) -> float:
    toy, gen, counts = ToyChain(), torch.Generator().manual_seed(3), {}
    for _ in range(runs):
        key = toy.generate(gen, **how)
        counts[key] = counts.get(key, 0) + 1
    law = toy.exact_law()
    keys = list(law)
    return gof_pvalue(np.array([counts.get(k, 0) for k in keys]), np.array([law[k] for k in keys]),
                      normalised_within=law_normalisation_error(law))


CHAIN_RUNS = 20_000  # 216 cells; chi-square at ALPHA (false-positive rate 0.1 %)


@pytest.mark.slow
def test_a_chain_that_stops_by_its_confidence_keeps_the_target_law():
    """Drafting token k + 1 only while the draft was sure at position k (a decision on the tokens
    before k + 1, as `AdaptivePolicy.keep_drafting` makes): the law of whole generations is p's."""
    assert chain_pvalue(CHAIN_RUNS, keep_drafting=lambda confidence: confidence[-1] >= ToyChain.THRESHOLD) > ALPHA


@pytest.mark.slow
def test_a_chain_cut_by_the_confidence_after_a_token_is_biased():
    """Negative control: keeping x_j only if the draft is sure after it (so x_j's inclusion depends
    on x_j itself, as a trim by later confidences would) breaks the law, and the test sees it."""
    assert chain_pvalue(CHAIN_RUNS, self_dependent_trim=True) < ALPHA
