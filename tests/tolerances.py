"""Float tolerances stated from the arithmetic, so that they hold on any host, not only on the one a
test was first run on.

Two evaluations of the same float computation in different orders of operations (fused or split
projections, transformers' kernels or ours, one row or several, another CPU's vector width) differ
by round-off only. A float sum of n terms lies within γ_n·Σ|terms| of the exact sum (γ_n ≈ n·u, u =
eps/2 the unit round-off; Higham, Accuracy and Stability of Numerical Algorithms, §3.1), so two
orders of it differ by at most about n·eps·Σ|terms|. `round_off` takes the largest value compared as
the scale of the terms (Σ|terms| is larger where terms cancel; the worst case n·eps is pessimistic by
about √n for rounding errors of random sign, which covers that), so the bound is relative to the
values' magnitude and grows with the length of the sums. A stack of layers passes its values through
one longest sum per layer; the layers round independently, so their errors add in quadrature.

A float32 distribution normalised over n outcomes sums to 1 within (n + 1)·u (its sum of n terms,
then one division each), and a law built as products through several such distributions within the
sum of theirs: `normalisation_error`.
A float16 copy of a float32 value lies within u16·|value| of it: `kept_in_float16`.

Comparisons that must hold bit for bit (batch invariance, the lossless and greedy paths) use
torch.equal or ==, never these.
"""

from __future__ import annotations

import math

import torch

EPS32 = torch.finfo(torch.float32).eps  # 2^-23: the gap between 1 and the next float32
U32 = EPS32 / 2  # float32's unit round-off: one rounding errs by at most u, relatively


def round_off(reference: torch.Tensor, *sums: float, eps: float = EPS32) -> float:
    """How far two orders of the same float arithmetic may put a value that passed through sums of
    `sums` terms each (one per layer on the way): √(Σ n²)·eps·max|reference| over its finite values."""
    finite = reference[torch.isfinite(reference)]
    scale = finite.abs().max().item() if finite.numel() else 0.0
    return math.sqrt(sum(n * n for n in sums)) * eps * scale


def decoder_sums(config, positions: int = 0) -> tuple[int, ...]:
    """The longest sum of each layer of a decoder (a projection over the hidden size, the MLP's down
    projection over the intermediate size, or attention over `positions`), then the LM head's; for a
    `specdec.runtime.config.ModelConfig`."""
    longest = max(config.hidden_size, config.intermediate_size, positions)
    return (longest,) * config.num_layers + (config.hidden_size,)


def max_difference(a: torch.Tensor, b: torch.Tensor) -> float:
    """The largest |a − b| over the finite values; infinite where a and b are not finite at the same places."""
    finite = torch.isfinite(a) & torch.isfinite(b)
    if not torch.equal(torch.isfinite(a), torch.isfinite(b)):
        return math.inf
    return float((a[finite] - b[finite]).abs().max()) if finite.any() else 0.0


def normalisation_error(terms: int, levels: int = 1) -> float:
    """How far from 1 a float32 distribution over `terms` outcomes may sum ((terms + 1)·u), and a law
    that multiplies `levels` of them along each outcome (levels·(terms + 1)·u, to first order)."""
    return levels * (terms + 1) * U32


def law_normalisation_error(law: dict[tuple[int, ...], float]) -> float:
    """`normalisation_error` of a law over token sequences whose probabilities multiply float32
    distributions along each sequence: as many levels as its longest sequence, each over at most as
    many outcomes as any prefix continues with (its outcomes of probability 0 add exactly nothing)."""
    prefixes = {seq[:i + 1] for seq in law for i in range(len(seq))}
    continuations: dict[tuple[int, ...], int] = {}
    for prefix in prefixes:
        continuations[prefix[:-1]] = continuations.get(prefix[:-1], 0) + 1
    return normalisation_error(max(continuations.values()), max(map(len, law)))


U16 = torch.finfo(torch.float16).eps / 2  # float16's unit round-off (11 bits)


def kept_in_float16(stored: torch.Tensor, exact: torch.Tensor, *sums: int) -> bool:
    """`stored` is `exact` kept in float16 (rounded to nearest: within u16·|value| of it), `exact` being
    float32 values that another order of the same arithmetic may put `round_off(exact, *sums)` away."""
    r = round_off(exact, *sums)
    return bool(((stored.float() - exact).abs() <= U16 * (exact.abs() + r) + r).all())


def both_kept_in_float16(a: torch.Tensor, b: torch.Tensor, *sums: int) -> bool:
    """a and b are float16 copies of float32 values computed in two orders of the same arithmetic
    (`round_off` apart through `sums`): each within u16·|value| of its float32 value."""
    a, b = a.float(), b.float()
    r = round_off(b, *sums)
    return bool(((a - b).abs() <= U16 * (a.abs() + b.abs()) * (1 + 2 * U16) + r).all())
