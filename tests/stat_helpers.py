"""Goodness-of-fit helpers for the distribution tests, and the deliberately wrong verifiers.

`gof_pvalue` runs Pearson's chi-square test of observed counts against exact probabilities (which must
sum to 1 within the round-off of the float32 arithmetic that made them: `normalised_within`). Cells
whose expected count is below 5 are pooled into one cell (the usual validity rule); an observation
in a cell of probability 0 makes the p-value 0 outright. Under a correct sampler the p-value is
uniform on [0, 1], so a test that fails when p < `ALPHA` has a false-positive rate of `ALPHA` per
test (the runs are seeded, so a given run is reproducible).
"""

from __future__ import annotations

import numpy as np
import torch

from scipy.stats import chi2

from specdec.decode.verify import speculative_sample as RIGHT_CHAIN_RULE

ALPHA = 1e-3  # false-positive rate of each goodness-of-fit test


def gof_pvalue(observed: np.ndarray, probs: np.ndarray, min_expected: float = 5.0, *, normalised_within: float) -> float:
    """`normalised_within`: how far from 1 the float arithmetic that made `probs` may leave their sum
    (`tolerances.normalisation_error`); a law further off is no distribution."""
    observed = np.asarray(observed, dtype=np.float64)
    probs = np.asarray(probs, dtype=np.float64)
    assert abs(probs.sum() - 1) <= normalised_within, (probs.sum(), normalised_within)
    if observed[probs <= 0].sum() > 0:
        return 0.0
    n = observed.sum()
    expected = probs * n
    big = expected >= min_expected
    obs = list(observed[big])
    exp = list(expected[big])
    small_exp = expected[~big & (probs > 0)].sum()
    if small_exp > 0:
        obs.append(observed[~big].sum())
        exp.append(small_exp)
    obs, exp = np.array(obs), np.array(exp)
    stat = ((obs - exp) ** 2 / exp).sum()
    dof = len(obs) - 1
    return float(chi2.sf(stat, dof)) if dof > 0 else 1.0


def accept_everything(draft_tokens, p, q, generator, details=None):
    """A deliberately WRONG verifier (the negative control): it accepts every draft and draws the
    bonus from p. The distribution tests must fail with it."""
    batch, gamma = draft_tokens.shape
    bonus = torch.multinomial(p[:, gamma], 1, generator=generator).squeeze(1)
    return torch.full((batch,), gamma, device=p.device), bonus


def residual_from_p(draft_tokens, p, q, generator, details=None):
    """A subtler WRONG verifier: the right acceptance test, but a rejection resamples from p instead
    of norm(max(0, p - q)). Its output law is min(p, q) + P(reject)·p instead of p: it over-produces
    the tokens the draft favours (q ≥ p), and after a point-mass draft x is rejected it can draw x
    again. Where the residual equals p (a rejected point-mass draft with p(x) = 0, or q and p with
    disjoint supports) it is right, so it fails only tests whose drafts overlap the target's support."""
    num_accepted, _ = RIGHT_CHAIN_RULE(draft_tokens, p, q, generator)  # (bound at import: the tests patch the module's)
    rows = torch.arange(p.shape[0], device=p.device)
    redo = torch.multinomial(p[rows, num_accepted], 1, generator=generator).squeeze(1)
    return num_accepted, redo


def patch_chain_rule(monkeypatch, module, wrong) -> None:
    """Put the wrong chain rule `wrong` (as `speculative_sample` is called) in `module`'s place of both
    chain rules: `speculative_sample` and `point_mass_sample` (a lookup's point mass at T > 0, which
    computes p itself), so that every sampled chain round the engine verifies uses it."""
    from specdec.sampling import logits_to_probs

    def on_point_mass(draft_tokens, logits, params, generator, details=None):
        num_accepted, next_token = wrong(torch.tensor([draft_tokens]), logits_to_probs(logits[None], params), None,
                                         generator, details)
        return int(num_accepted[0]), int(next_token[0])

    monkeypatch.setattr(module, "speculative_sample", wrong)
    monkeypatch.setattr(module, "point_mass_sample", on_point_mass)


def tree_accept_first_children(tree, p, generator, details=None):
    """A deliberately WRONG tree verifier (the negative control): it walks down the first child of
    each node to a leaf, accepting all of them, and draws the next token from p there."""
    path, node = [], -1
    while tree.children(node):
        node = tree.children(node)[0]
        path.append(node)
    accepted = torch.tensor([path or [-1]] * p.shape[0], device=p.device)
    return accepted, torch.multinomial(p[:, path[-1] + 1 if path else 0], 1, generator=generator).squeeze(1)
