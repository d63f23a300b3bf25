"""What a run did: passes, drafted and accepted tokens per position, times, and derived rates."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class RoundTally:
    """The rounds of one drafter (or of plain decoding) within a run."""

    rounds: int = 0
    drafting_rounds: int = 0  # rounds in which the drafter proposed at least one token
    drafted: int = 0  # draft positions (see GenerationStats)
    accepted: int = 0
    verified_tokens: int = 0  # draft tokens the passes verified (see GenerationStats)
    committed: int = 0  # tokens these rounds committed, bonus and corrections included
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0
    gammas: dict[int, int] = field(default_factory=dict)  # draft length asked for → rounds
    lengths: dict[int, int] = field(default_factory=dict)  # draft positions proposed → rounds that proposed any
    # per draft position i: rounds that drafted it with every position before it accepted, and of those
    # the rounds that accepted it (the run-aware acceptance's evidence: `theory.fit_runs`)
    reached: list[int] = field(default_factory=list)
    accepted_reached: list[int] = field(default_factory=list)

    def record(self, drafted: int, accepted: int) -> None:
        """The per-position evidence of one round that drafted `drafted` positions and accepted `accepted`."""
        if drafted:
            self.lengths[drafted] = self.lengths.get(drafted, 0) + 1
        grow = drafted - len(self.reached)
        self.reached.extend([0] * grow)
        self.accepted_reached.extend([0] * grow)
        for i in range(min(drafted, accepted + 1)):
            self.reached[i] += 1
            self.accepted_reached[i] += i < accepted

    def add(self, other: RoundTally) -> None:
        """Sum another tally (of the same drafter) into this one."""
        for key in ("rounds", "drafting_rounds", "drafted", "accepted", "verified_tokens", "committed", "draft_seconds",
                    "verify_seconds"):
            setattr(self, key, getattr(self, key) + getattr(other, key))
        for mine, theirs in ((self.gammas, other.gammas), (self.lengths, other.lengths)):
            for key, n in theirs.items():
                mine[key] = mine.get(key, 0) + n
        grow = len(other.reached) - len(self.reached)
        self.reached.extend([0] * grow)
        self.accepted_reached.extend([0] * grow)
        for i, (r, a) in enumerate(zip(other.reached, other.accepted_reached)):
            self.reached[i] += r
            self.accepted_reached[i] += a

    def to_dict(self) -> dict:
        return {"rounds": self.rounds, "drafting_rounds": self.drafting_rounds, "drafted": self.drafted, "accepted": self.accepted,
                "verified_tokens": self.verified_tokens, "committed": self.committed, "draft_seconds": round(self.draft_seconds, 4),
                "verify_seconds": round(self.verify_seconds, 4),
                "gammas": {str(g): n for g, n in sorted(self.gammas.items())},
                "lengths": {str(k): n for k, n in sorted(self.lengths.items())},
                "reached": list(self.reached), "accepted_reached": list(self.accepted_reached)}


@dataclass
class GenerationStats:
    """A run's counts and times.

    "Drafted" (overall, per position, per drafter) counts draft positions: a chain round drafts its
    length, a token tree round its depth (the tokens along its longest path). So α = accepted /
    drafted and α per position say how far down the draft the target went, for chains and trees
    alike, as the policy's estimates and the seed formula read them. What the verification passes
    paid for is counted apart as `verified_tokens`: the draft tokens they scored, a chain's length
    or a tree's node count."""

    drafter: str
    prompt_tokens: int = 0
    reused_prompt_tokens: int = 0  # of them, taken from the prefix cache instead of prefilled (decode/prefix_cache.py)
    new_tokens: int = 0
    target_passes: int = 0  # the prefill pass included: plain decoding has MAT = 1.00
    rounds: int = 0  # speculative rounds (target passes after the prefill)
    drafted: int = 0  # draft positions: a chain's length, a tree's depth
    accepted: int = 0
    verified_tokens: int = 0  # draft tokens verified: a chain's length, a tree's node count
    drafted_per_position: list[int] = field(default_factory=list)
    accepted_per_position: list[int] = field(default_factory=list)
    prefill_seconds: float = 0.0
    draft_seconds: float = 0.0
    verify_seconds: float = 0.0  # target passes after the prefill, and the acceptance test
    total_seconds: float = 0.0
    finish_reason: str = ""  # "stop" (end of sequence or stop string) or "length"
    by_drafter: dict[str, RoundTally] = field(default_factory=dict)  # "plain" for rounds that drafted nothing by choice
    decisions: list[dict] = field(default_factory=list)  # the adaptive policy's choices, when they changed

    def record_round(self, drafted: int, accepted: int, *, verified_tokens: int | None = None, drafter: str = "plain",
                     gamma: int = 0, committed: int = 0, draft_seconds: float = 0.0, verify_seconds: float = 0.0) -> None:
        """One round: `drafted` draft positions, the first `accepted` of them accepted; `verified_tokens`
        the draft tokens its pass verified (a tree's node count; None: a chain, = drafted)."""
        verified_tokens = drafted if verified_tokens is None else verified_tokens
        tally = self.by_drafter.setdefault(drafter, RoundTally())
        tally.rounds += 1
        tally.drafting_rounds += drafted > 0
        tally.drafted += drafted
        tally.accepted += accepted
        tally.verified_tokens += verified_tokens
        tally.committed += committed
        tally.draft_seconds += draft_seconds
        tally.verify_seconds += verify_seconds
        tally.gammas[gamma] = tally.gammas.get(gamma, 0) + 1
        tally.record(drafted, accepted)
        self.draft_seconds += draft_seconds
        self.verify_seconds += verify_seconds
        self.rounds += 1
        self.target_passes += 1
        self.drafted += drafted
        self.accepted += accepted
        self.verified_tokens += verified_tokens
        while len(self.drafted_per_position) < drafted:
            self.drafted_per_position.append(0)
            self.accepted_per_position.append(0)
        for i in range(drafted):
            self.drafted_per_position[i] += 1
            self.accepted_per_position[i] += i < accepted

    @classmethod
    def merge(cls, runs: list[GenerationStats]) -> GenerationStats:
        """Several runs' statistics as one (counts and times summed; rates follow), e.g. a benchmark's."""
        total = cls(drafter=runs[0].drafter if runs else "none")
        for run in runs:
            for name in ("prompt_tokens", "reused_prompt_tokens", "new_tokens", "target_passes", "rounds", "drafted", "accepted",
                         "verified_tokens", "prefill_seconds", "draft_seconds", "verify_seconds", "total_seconds"):
                setattr(total, name, getattr(total, name) + getattr(run, name))
            for i, (d, a) in enumerate(zip(run.drafted_per_position, run.accepted_per_position)):
                if i == len(total.drafted_per_position):
                    total.drafted_per_position.append(0)
                    total.accepted_per_position.append(0)
                total.drafted_per_position[i] += d
                total.accepted_per_position[i] += a
            for name, tally in run.by_drafter.items():
                total.by_drafter.setdefault(name, RoundTally()).add(tally)
        return total

    @property
    def mean_accepted_tokens(self) -> float:
        """MAT: new tokens per target pass, the bonus token included (plain decoding = 1.00)."""
        return self.new_tokens / self.target_passes if self.target_passes else 0.0

    @property
    def acceptance_rate(self) -> float:
        """Accepted / drafted over the whole run (0 when nothing was drafted)."""
        return self.accepted / self.drafted if self.drafted else 0.0

    @property
    def acceptance_per_position(self) -> list[float]:
        """α_i: of the rounds that drafted a token at position i, the share that accepted it."""
        return [a / d if d else 0.0 for a, d in zip(self.accepted_per_position, self.drafted_per_position)]

    @property
    def tokens_per_second(self) -> float:
        return self.new_tokens / self.total_seconds if self.total_seconds else 0.0

    def to_dict(self) -> dict:
        return {
            "drafter": self.drafter,
            "prompt_tokens": self.prompt_tokens,
            "reused_prompt_tokens": self.reused_prompt_tokens,
            "new_tokens": self.new_tokens,
            "target_passes": self.target_passes,
            "rounds": self.rounds,
            "drafted": self.drafted,
            "accepted": self.accepted,
            "verified_tokens": self.verified_tokens,
            "mean_accepted_tokens": round(self.mean_accepted_tokens, 4),
            "acceptance_rate": round(self.acceptance_rate, 4),
            "acceptance_per_position": [round(a, 4) for a in self.acceptance_per_position],
            "prefill_seconds": round(self.prefill_seconds, 4),
            "draft_seconds": round(self.draft_seconds, 4),
            "verify_seconds": round(self.verify_seconds, 4),
            "total_seconds": round(self.total_seconds, 4),
            "tokens_per_second": round(self.tokens_per_second, 3),
            "finish_reason": self.finish_reason,
            "by_drafter": {name: tally.to_dict() for name, tally in self.by_drafter.items()},
            "decisions": self.decisions,
        }
