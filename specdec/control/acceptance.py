"""What the policy knows of a drafter's acceptance: running, forgetting estimates, by draft position
(`PositionAcceptance`: one per drafter, and one per match length of a lookup) and by the drafter's own
confidence in a token (`ConfidenceAcceptance`: a chain that stops early). They are fed the accepted
counts of the rounds a drafter drafted and nothing else (no timing), so what they say depends on the
tokens alone.

α_i is a running, forgetting estimate of P(draft position i accepted | positions < i were): each
observation of position i counts 1 and older ones are discounted by `memory` per observation; it
shrinks (weight 1) towards the estimate of the position before it, and the first position's towards a
long-run estimate of it that forgets far more slowly (LONG_MEMORY), which itself shrinks towards the
prior (weight 1); a position never drafted yet takes the estimate of the position before it. A
drafter passed over while another drafts forgets its recent evidence (`fade`) towards its own long-run
value, not towards the prior: one that lost for long is not retried because it was idle.

`hopeful_expected_tokens_up_to` reads the long-run estimate raised by HOPE standard errors (its
evidence and the prior's weight of 1 as the sample size) as every position's α: what the drafter
could plausibly do in the long run, whatever its last rounds said, which sets how often a drafter
predicted to lose is probed (`explorer.py`).
"""

from __future__ import annotations

import bisect

from specdec.control.theory import expected_tokens_by_position

CONFIDENCE_EDGES = (0.2, 0.4, 0.6, 0.8, 0.9)  # buckets of a drafter's confidence in a token: [0, 0.2), ... [0.9, 1]
LONG_MEMORY = 0.995  # the long-run estimate's forgetting per observation (some 200 observations kept)
HOPE = 1.0  # standard errors above its long-run estimate a drafter's hopeful acceptance lies (one-sided: ~16%)


class PositionAcceptance:
    """Running α per draft position, forgetting old evidence by `memory` per observation; each
    position's estimate shrinks (weight 1) towards the one before it, and the first position's towards
    a long-run estimate of it that forgets by LONG_MEMORY, itself shrunk towards the prior (weight 1)."""

    def __init__(self, prior: float = 0.6, memory: float = 0.9, positions: int = 16) -> None:
        self.prior = prior
        self.memory = memory
        self.accepted = [0.0] * positions  # recent evidence
        self.drafted = [0.0] * positions
        self.long = [0.0, 0.0]  # the first position's long-run evidence: [accepted, drafted]

    def observe(self, drafted: int, accepted: int) -> None:
        """A round drafted `drafted` tokens and the first `accepted` were accepted. Position i was
        reached (and is evidence for α_i, a conditional rate) only if every position before it was accepted."""
        for i in range(min(drafted, accepted + 1, len(self.drafted))):
            self.accepted[i] = self.accepted[i] * self.memory + (i < accepted)
            self.drafted[i] = self.drafted[i] * self.memory + 1
        if drafted:
            self.long = [self.long[0] * LONG_MEMORY + (accepted > 0), self.long[1] * LONG_MEMORY + 1]

    def fade(self, factor: float, long_factor: float = 1.0) -> None:
        """Discount the recent evidence by `factor` (a drafter not used this round drifts back to its
        own long-run value) and the long-run evidence by `long_factor` (towards the prior)."""
        self.accepted = [a * factor for a in self.accepted]
        self.drafted = [d * factor for d in self.drafted]
        self.long = [n * long_factor for n in self.long]

    def faded_copy(self, factor: float) -> PositionAcceptance:
        """A copy with its recent evidence discounted by `factor`; the long-run evidence is kept."""
        copy = PositionAcceptance(self.prior, self.memory, positions=len(self.drafted))
        copy.accepted, copy.drafted, copy.long = list(self.accepted), list(self.drafted), list(self.long)
        copy.fade(factor)
        return copy

    @property
    def long_run(self) -> float:
        """The first position's long-run estimate (the prior before any evidence)."""
        return (self.long[0] + self.prior) / (self.long[1] + 1)

    @property
    def hopeful_long_run(self) -> float:
        """The long-run estimate raised by HOPE standard errors (at most 1): with n observations (the
        prior counting as one), p + HOPE · √(p (1 − p) / n)."""
        p = self.long_run
        return min(1.0, p + HOPE * (p * (1 - p) / (self.long[1] + 1)) ** 0.5)

    def alphas(self, gamma: int) -> list[float]:
        """[α_1 .. α_γ]: each position's estimate, shrunk towards the position before (the first: its long-run value)."""
        out, previous = [], self.long_run
        for i in range(gamma):
            a, d = (self.accepted[i], self.drafted[i]) if i < len(self.drafted) else (0.0, 0.0)
            previous = (a + previous) / (d + 1)
            out.append(previous)
        return out

    def expected_tokens(self, gamma: int) -> float:
        """E(γ) = 1 + Σ_i Π_{j≤i} α_j."""
        return expected_tokens_by_position(self.alphas(gamma))

    def expected_tokens_up_to(self, gamma: int) -> list[float]:
        """[E(1) .. E(γ)] from one pass over the estimates."""
        return _expected_up_to(self.alphas(gamma))

    def hopeful_expected_tokens_up_to(self, gamma: int) -> list[float]:
        """[E(1) .. E(γ)] with every position accepted at the hopeful long-run rate."""
        return _expected_up_to([self.hopeful_long_run] * gamma)


def _expected_up_to(alphas: list[float]) -> list[float]:
    """[E(1) .. E(γ)] for these per-position acceptance rates: E(k) = 1 + Σ_{i≤k} Π_{j≤i} α_j."""
    out, total, survive = [], 1.0, 1.0
    for alpha in alphas:
        survive *= alpha
        total += survive
        out.append(total)
    return out


class ConfidenceAcceptance:
    """Running acceptance of drafted tokens by the drafter's confidence in them (`CONFIDENCE_EDGES`
    buckets), forgetting old evidence; each bucket starts at its centre (prior weight 1)."""

    def __init__(self, memory: float = 0.9) -> None:
        bounds = (0.0, *CONFIDENCE_EDGES, 1.0)
        self.centres = [(lo + hi) / 2 for lo, hi in zip(bounds, bounds[1:])]
        self.memory = memory
        self.accepted = [0.0] * len(self.centres)
        self.seen = [0.0] * len(self.centres)

    @staticmethod
    def bucket(confidence: float) -> int:
        return bisect.bisect_right(CONFIDENCE_EDGES, confidence)

    def rate(self, confidence: float) -> float:
        return self._rate(self.bucket(confidence))

    def best(self) -> float:
        return max(self._rate(i) for i in range(len(self.centres)))

    def _rate(self, i: int) -> float:  # bucket i's estimate: its evidence and its centre (weight 1)
        return (self.accepted[i] + self.centres[i]) / (self.seen[i] + 1)

    def outlook(self, confidence: list[float]) -> tuple[float, float]:
        """For a chain whose tokens have these confidences: (E = 1 + Σ_i Π_{j≤i} â(c_j), the tokens
        expected to be committed, and Π_j â(c_j), the chance that all of them are accepted)."""
        total, survive = 1.0, 1.0
        for c in confidence:
            survive *= self.rate(c)
            total += survive
        return total, survive

    def observe(self, confidence: list[float], accepted: int) -> None:
        """A chain with these confidences had its first `accepted` tokens accepted: every token the
        target reached (the accepted ones and the first rejected) is evidence for its bucket."""
        for i, c in enumerate(confidence[:accepted + 1]):
            b = self.bucket(c)
            self.accepted[b] = self.accepted[b] * self.memory + (i < accepted)
            self.seen[b] = self.seen[b] * self.memory + 1

    def faded_copy(self, factor: float) -> ConfidenceAcceptance:
        copy = ConfidenceAcceptance(self.memory)
        copy.accepted = [a * factor for a in self.accepted]
        copy.seen = [n * factor for n in self.seen]
        return copy
