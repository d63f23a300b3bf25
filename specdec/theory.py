"""The seed formulas of speculative decoding (Leviathan et al. 2022), with i.i.d. acceptance α.

    E[tokens per target pass] = (1 − α^(γ+1)) / (1 − α)
    speed-up                  = (1 − α^(γ+1)) / ((1 − α)(γc + 1))

where γ is the number of drafted tokens per round and c the cost of one draft step relative to one
target pass. The formula charges a verification pass over γ+1 tokens the same as a one-token pass;
on hardware where it is not free, `verify_cost` (the cost of that pass relative to one-token pass)
replaces the 1.
"""

from __future__ import annotations

from specdec.errors import ConfigError


def _check(alpha: float, gamma: int, c: float = 0.0) -> None:
    if not 0 <= alpha <= 1:
        raise ConfigError(f"alpha (acceptance rate) must be in [0, 1], got {alpha}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ConfigError(f"gamma must be a whole number >= 0, got {gamma}")
    if c < 0:
        raise ConfigError(f"c (draft cost / target cost) must be >= 0, got {c}")


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """Expected tokens committed per target pass, the bonus token included."""
    _check(alpha, gamma)
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-clock speed-up over plain decoding."""
    _check(alpha, gamma, c)
    return expected_tokens_per_pass(alpha, gamma) / (gamma * c + verify_cost)


def best_gamma(alpha: float, c: float, max_gamma: int = 16, verify_cost: float = 1.0) -> tuple[int, float]:
    """The γ in [1, max_gamma] with the highest expected speed-up (the smallest such γ), and that speed-up."""
    candidates = ((g, expected_speedup(alpha, g, c, verify_cost)) for g in range(1, max_gamma + 1))
    return max(candidates, key=lambda x: x[1])
