"""The draft length written into the launch file.

Rule: `--gamma` if given; otherwise γ = theory.best_gamma(α, c, γ_max) with α the mean of the head's
last validation α per depth (head.json history[-1]["alpha_per_depth"]), c = ASSUMED_COST_RATIO (one
draft step over one target pass: assumed, not measured on the engine), and γ_max = MAX_GAMMA for
EAGLE-3, the number of heads for Medusa. The seed formula assumes i.i.d. acceptance.
"""

from __future__ import annotations

from specdec.errors import ConfigError
from specdec.control.theory import best_gamma

ASSUMED_COST_RATIO = 0.1  # a one-layer head's step on a GPU engine, where launch overheads dominate it
MAX_GAMMA = 8


def choose_gamma(meta: dict, gamma: int | None, max_gamma: int) -> tuple[int, str]:
    """(γ, the sentence saying how it was chosen)."""
    if gamma is not None:
        if not 1 <= gamma <= max_gamma:
            raise ConfigError(f"--gamma must be in [1, {max_gamma}] for this head, got {gamma}")
        return gamma, f"γ = {gamma}, given with --gamma"
    history = meta.get("history") or [{}]
    alphas = history[-1].get("alpha_per_depth") if isinstance(history[-1], dict) else None
    if not alphas:
        raise ConfigError("head.json records no validation α per depth (history[-1].alpha_per_depth) to choose γ "
                          "from; give one with --gamma N")
    alpha = sum(alphas) / len(alphas)
    best, speedup = best_gamma(alpha, ASSUMED_COST_RATIO, max_gamma)
    return best, (f"γ = {best}: specdec.control.theory.best_gamma(α = {alpha:.3f}, the mean of the last validation's α per "
                  f"depth {alphas}; c = {ASSUMED_COST_RATIO}, an assumed draft step / target pass; γ ≤ {max_gamma}), "
                  f"expected speed-up {speedup:.2f}× if acceptance were i.i.d.")
