"""The formulas of speculative decoding: the seed's i.i.d. acceptance, and acceptance that comes in runs.

The seed (Leviathan et al. 2022) takes every drafted token as accepted with the same chance α,
independently of the others:

    E[tokens per target pass] = (1 − α^(γ+1)) / (1 − α)
    speed-up                  = (1 − α^(γ+1)) / ((1 − α)(γc + 1))

where γ is the number of drafted tokens per round and c the cost of one draft step relative to one
target pass. The formula charges a verification pass over γ+1 tokens the same as a one-token pass;
on hardware where it is not free, `verify_cost` (the cost of that pass relative to a one-token pass)
replaces the 1.

Drafts are not i.i.d.: a lookup that found the text repeating is right for several tokens in a row
and wrong from the first token when it is not, and a model drafter that got the first token right is
more often right about the next. The run-aware form keeps two chances apart, α₁ that the first
drafted token is accepted and β that a later one is, given the one before it was:

    E[tokens per target pass] = 1 + α₁ (1 − β^γ) / (1 − β)

(i.i.d. is the case α₁ = β = α). Its two rates are read off a run's counts per position
(`fit_runs`): α₁ = accepted at position 1 / rounds that drafted, β = accepted / reached over the later
positions, where a position is reached when every one before it was accepted. The general form, one
rate per position (`expected_tokens_by_position`, E = 1 + Σ_i Π_{j≤i} α_j), is what the adaptive
policy runs on; the two-rate form is its smallest case that can describe runs and still say what a γ
not seen in the run would give.
"""

from __future__ import annotations

from dataclasses import dataclass

from specdec.errors import ConfigError


def _check(alpha: float, gamma: int, c: float = 0.0, name: str = "alpha (acceptance rate)") -> None:
    if not 0 <= alpha <= 1:
        raise ConfigError(f"{name} must be in [0, 1], got {alpha}")
    if not isinstance(gamma, int) or gamma < 0:
        raise ConfigError(f"gamma must be a whole number >= 0, got {gamma}")
    if c < 0:
        raise ConfigError(f"c (draft cost / target cost) must be >= 0, got {c}")


def expected_tokens_per_pass(alpha: float, gamma: int) -> float:
    """Expected tokens committed per target pass with i.i.d. acceptance α, the bonus token included."""
    _check(alpha, gamma)
    if alpha == 1:
        return gamma + 1.0
    return (1 - alpha ** (gamma + 1)) / (1 - alpha)


def expected_tokens_run_aware(first: float, then: float, gamma: int) -> float:
    """Expected tokens committed per target pass when the first drafted token is accepted with
    chance `first` (α₁) and each later one with chance `then` (β) given the one before it was."""
    _check(first, gamma, name="first (acceptance of the first drafted token)")
    _check(then, gamma, name="then (acceptance after an accepted token)")
    if gamma == 0:
        return 1.0
    runs_on = gamma if then == 1 else (1 - then ** gamma) / (1 - then)
    return 1 + first * runs_on


def expected_tokens_by_position(alphas: list[float]) -> float:
    """E = 1 + Σ_i Π_{j≤i} α_j, with α_j the chance that position j is accepted given those before were."""
    total, survive = 1.0, 1.0
    for alpha in alphas:
        survive *= alpha
        total += survive
    return total


def expected_speedup(alpha: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-clock speed-up over plain decoding (i.i.d. acceptance)."""
    _check(alpha, gamma, c)
    return expected_tokens_per_pass(alpha, gamma) / (gamma * c + verify_cost)


def expected_speedup_run_aware(first: float, then: float, gamma: int, c: float, verify_cost: float = 1.0) -> float:
    """Expected wall-clock speed-up over plain decoding with run-aware acceptance (α₁, β)."""
    _check(first, gamma, c)
    return expected_tokens_run_aware(first, then, gamma) / (gamma * c + verify_cost)


def best_gamma(alpha: float, c: float, max_gamma: int = 16, verify_cost: float = 1.0,
               then: float | None = None) -> tuple[int, float]:
    """The γ in [1, max_gamma] with the highest expected speed-up (the smallest such γ), and that
    speed-up; with `then`, acceptance is run-aware with α₁ = alpha and β = then."""
    def speedup(g: int) -> float:
        if then is None:
            return expected_speedup(alpha, g, c, verify_cost)
        return expected_speedup_run_aware(alpha, then, g, c, verify_cost)

    return max(((g, speedup(g)) for g in range(1, max_gamma + 1)), key=lambda x: x[1])


@dataclass(frozen=True)
class RunFit:
    """The run-aware rates read off a run: α₁ (first position), β (later positions, given the one
    before was accepted), and the evidence behind each."""

    first: float
    then: float
    rounds: int  # rounds that drafted at least one token: the evidence for α₁
    later_reached: int  # later positions reached: the evidence for β

    def expected_tokens(self, gamma: int) -> float:
        return expected_tokens_run_aware(self.first, self.then, gamma)


def fit_runs(reached: list[int], accepted: list[int]) -> RunFit | None:
    """α₁ and β from counts per draft position: `reached[i]` rounds drafted position i with every
    position before it accepted, `accepted[i]` of them accepted it. β pools the later positions; with
    none reached it takes α₁. None when no round drafted anything."""
    if len(reached) != len(accepted) or any(a > r or a < 0 for r, a in zip(reached, accepted)):
        raise ConfigError("fit_runs needs, per position, accepted <= reached (two lists of equal length)")
    if not reached or reached[0] == 0:
        return None
    first = accepted[0] / reached[0]
    later_reached, later_accepted = sum(reached[1:]), sum(accepted[1:])
    then = later_accepted / later_reached if later_reached else first
    return RunFit(first, then, reached[0], later_reached)
