"""The cost model's numbers and its arithmetic: T(k), D_d(γ), T(B, N) and the predicted speed-up.

The measured curve (`measure.py`) is a tight loop at one context length; a real round also pays for
acceptance, commit and detokenizing, at the request's own context length. In the 30-prompt benchmark
a round verifying 3.3 tokens cost 1.28 plain rounds where the curve said 1.8. So the engine reports
the time of every round it runs (`observe_round`), and `target_pass` scales the measured T(k) by a
running level (how much dearer than measured rounds are now) times a factor for that k
(`Calibration`): the shape comes from the measurement until the run's own rounds of that size say
otherwise. Draft costs are calibrated the same way, per
drafter and γ, from the seconds the engine's `propose` calls take (`observe_draft`). The analysis of a
run (`control/analysis.py`: the bench's and `explain`'s predictions) prices passes by the means of
every round observed (`observed_pass`), not by the recent ones the policy needs. Calibrations
live in memory only; `to_json` / `from_json` are what the cache file (`cache.py`) keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMAT_VERSION = 2  # 2: drafters re-measured once a chain's catch-up computed one row of draft logits


@dataclass
class DraftCost:
    per_call: float  # seconds spent once per proposal (a lookup's search, a model reading the last token)
    per_token: float  # seconds per drafted token (one draft-model step)
    per_catch_up: float = 0.0  # seconds per committed token a model reads first, not having read it yet

    def seconds(self, gamma: int, caught_up: int = 0) -> float:
        """D(γ) of a proposal that first reads `caught_up` committed tokens it had not read
        (`Drafter.catch_up_tokens`: rounds it did not draft, the tokens the last round accepted)."""
        return self.per_call + self.per_token * gamma + self.per_catch_up * caught_up if gamma else 0.0


CALIBRATION_MEMORY = 0.97  # weight an observation keeps per later one (the level: of any size; a factor: of its size)
CALIBRATION_PRIOR = 1.0  # observations' worth of weight the measured curve starts with (fading like theirs)
RATIO_LIMITS = (0.25, 4.0)  # an observed / measured ratio outside this is clipped (a stall, a page fault)
FACTOR_LIMITS = (0.5, 2.0)  # and a ratio over the level, for a size's factor


@dataclass
class RunningRatio:
    """A running mean that forgets by CALIBRATION_MEMORY per observation, starting at 1 with the
    weight of CALIBRATION_PRIOR observations, which fades as theirs do."""

    total: float = 0.0  # discounted Σ of the observations
    count: float = 0.0  # discounted number of observations
    prior: float = CALIBRATION_PRIOR  # the weight left to the starting value of 1

    def add(self, value: float) -> None:
        self.total = self.total * CALIBRATION_MEMORY + value
        self.count = self.count * CALIBRATION_MEMORY + 1
        self.prior *= CALIBRATION_MEMORY

    @property
    def mean(self) -> float:
        return self.mean_from(1.0)

    def mean_from(self, start: float) -> float:
        """The running mean had it started at `start` (a value the caller keeps up to date)."""
        return (self.total + self.prior * start) / (self.count + self.prior)


@dataclass
class Calibration:
    """Running correction of a measured curve by what real calls cost: ratio(k) = level · factor(k),
    observed seconds over measured seconds for size k. A size is the k of a target pass T(k), or the
    γ of a drafter's proposal D(γ); the `reference` size (1: a plain round, a one-token proposal) has
    a factor of 1.

    - level: the reference size's running ratio, from every observation of any size k as r / factor(k):
      how much dearer than measured a plain round is now (a longer context, a slower machine today);
      it moves within some 30 rounds, plain or not.
    - factor(k): the running mean of r / level over the observations of size k:
      what size k cost relative to the reference size at the time, beyond the measured shape; it
      forgets only when size k is observed again. It starts from the same mean over the
      observations of every size but the reference (what the extra rows and their acceptance cost
      beyond the measured shape, alike for all sizes), which a size never observed takes.

    Each starts at 1 (the measured curve) with the weight of CALIBRATION_PRIOR observations.

    Kept apart, a size seen rarely keeps its cost relative to a plain round while the level follows
    the plain rounds: with one running ratio per size, a 4-token round last seen on a short prompt was
    priced at that prompt's level on a long one. On the 135M model at T = 1 (most rounds plain), the
    sizes of lookups' rounds were priced 8-11% under what they cost beside the same prompt's plain
    rounds (acceptance over k + 1 positions, a pass over more rows after many one-row passes: neither
    is in the tight-loop measurement), and `auto` was judged to gain where it lost."""

    reference: int = 1
    per_size: dict[int, RunningRatio] = field(default_factory=dict)  # k → its factor
    beyond: RunningRatio = field(default_factory=RunningRatio)  # every size but the reference: their factor
    overall: RunningRatio = field(default_factory=RunningRatio)  # the level
    # the same, never forgetting (`lifetime_ratio`): [Σ, observations] of the level and of each size's factor
    lifetime_level: list[float] = field(default_factory=lambda: [0.0, 0.0])
    lifetime_factors: dict[int, list[float]] = field(default_factory=dict)

    def observe(self, tokens: int, ratio: float) -> None:
        ratio = min(max(ratio, RATIO_LIMITS[0]), RATIO_LIMITS[1])
        level, factor = self.level(), self.factor(tokens)
        self.overall.add(ratio / factor)
        self.lifetime_level[0] += ratio / factor
        self.lifetime_level[1] += 1
        if tokens != self.reference:
            relative = min(max(ratio / level, FACTOR_LIMITS[0]), FACTOR_LIMITS[1])
            self.per_size.setdefault(tokens, RunningRatio()).add(relative)
            self.beyond.add(relative)
            lifetime = self.lifetime_factors.setdefault(tokens, [0.0, 0.0])
            lifetime[0] += relative
            lifetime[1] += 1

    def level(self) -> float:
        return self.overall.mean

    def factor(self, tokens: int, shared: float | None = None) -> float:
        """factor(k) (`shared`: the mean over every size but the reference, when the caller has it)."""
        if tokens == self.reference:
            return 1.0
        shared = self.beyond.mean if shared is None else shared
        own = self.per_size.get(tokens)
        return own.mean_from(shared) if own else shared

    def ratio(self, tokens: int) -> float:
        return self.level() * self.factor(tokens)

    def lifetime_ratio(self, tokens: int) -> float:
        """level · factor(k) as the means of every observation so far, none forgotten (the current
        ones where there is none): what rounds of size k cost over a whole run, relative to the
        measured curve. The analysis of a run prices its rounds so; the running ratio is the price
        of the next round, and at a run's end it holds the last prompt's state (a factor last seen
        there, the level at its context length)."""
        total, count = self.lifetime_level
        level = total / count if count else self.level()
        if tokens == self.reference:
            return level
        seen = self.lifetime_factors.get(tokens)
        return level * (seen[0] / seen[1] if seen else self.factor(tokens))

    def ratios(self, sizes: range) -> list[float]:
        """ratio(k) for each k of `sizes`, the level and the shared factor computed once."""
        level, shared = self.level(), self.beyond.mean
        return [level * self.factor(size, shared) for size in sizes]

    @property
    def observations(self) -> float:
        return self.overall.count


@dataclass
class CostModel:
    pass_seconds: dict[int, float]  # tokens scored → median seconds of a target pass
    draft_costs: dict[str, DraftCost] = field(default_factory=dict)
    draft_weights: dict[str, str] = field(default_factory=dict)  # drafter name -> the weights its cost was measured with
    row_seconds: dict[int, float] = field(default_factory=dict)  # B → extra seconds of B rows over one (serving)
    key: str = ""
    description: dict = field(default_factory=dict)  # machine, model, when measured
    calibration: Calibration = field(default_factory=Calibration)  # T(k), from real rounds; never cached
    draft_calibration: dict[str, Calibration] = field(default_factory=dict)  # drafter → D(γ)'s; never cached
    calibrate: bool = True  # False: T(k), D(γ) stay as measured, so the policy's choices do not depend on timing

    def target_pass(self, tokens: int) -> float:
        """T(tokens): the measured curve scaled by what real rounds of this size cost (`Calibration`)."""
        return self.measured_pass(tokens) * self.calibration.ratio(tokens)

    def observed_pass(self, tokens: int) -> float:
        """T(tokens) as the rounds of this engine's life so far cost on average (`Calibration.lifetime_ratio`;
        as measured where calibration is off): how a run's analysis prices its passes."""
        return self.measured_pass(tokens) * (self.calibration.lifetime_ratio(tokens) if self.calibrate else 1.0)

    def observe_round(self, tokens: int, seconds: float) -> None:
        """A round that verified `tokens` tokens (1: a plain step) took `seconds`, draft excluded."""
        if self.calibrate and seconds > 0:
            self.calibration.observe(tokens, seconds / self.measured_pass(tokens))

    def measured_pass(self, tokens: int) -> float:
        """T(tokens) as measured (not smoothed: on a CPU, GEMM kernels make some sizes genuinely
        cheaper than smaller ones); past the measured sizes, extended linearly."""
        if tokens in self.pass_seconds:
            return self.pass_seconds[tokens]
        sizes = sorted(self.pass_seconds)
        if tokens < sizes[0]:
            return self.pass_seconds[sizes[0]]
        first, last = sizes[0], sizes[-1]
        if tokens > last:  # extrapolate with the mean growth per token over the measured range
            growth = (self.pass_seconds[last] - self.pass_seconds[first]) / (last - first) if last > first else 0.0
            return self.pass_seconds[last] + max(0.0, growth) * (tokens - last)
        below = max(s for s in sizes if s < tokens)
        above = min(s for s in sizes if s > tokens)
        slope = (self.pass_seconds[above] - self.pass_seconds[below]) / (above - below)
        return self.pass_seconds[below] + slope * (tokens - below)

    def observe_draft(self, drafter: str, gamma: int, seconds: float, caught_up: int = 0) -> None:
        """`drafter` took `seconds` to propose γ tokens in a real round, reading `caught_up` committed
        tokens first."""
        measured = self.draft_costs[drafter].seconds(gamma, caught_up)
        if self.calibrate and seconds > 0 and measured > 0:
            self.draft_calibration.setdefault(drafter, Calibration()).observe(gamma, seconds / measured)

    def draft_seconds(self, drafter: str, gamma: int, caught_up: int = 0) -> float:
        """D_drafter(γ): the measured fit scaled by what real proposals of this γ cost; with
        `caught_up`, of a proposal that first reads that many committed tokens."""
        calibration = self.draft_calibration.get(drafter)
        ratio = calibration.ratio(gamma) if calibration else 1.0
        return self.draft_costs[drafter].seconds(gamma, caught_up) * ratio

    def row_overhead(self, rows: int) -> float:
        """What `rows` separate rows cost beyond one row of as many tokens (0 for one row, or unmeasured)."""
        if rows <= 1 or not self.row_seconds:
            return 0.0
        points = {1: 0.0, **self.row_seconds}
        below = max(b for b in points if b <= rows)
        above = min((b for b in points if b >= rows), default=None)
        if above is None:  # past the measured sizes: the last measured cost per row
            return points[below] / (below - 1) * (rows - 1)
        if above == below:
            return points[below]
        return points[below] + (points[above] - points[below]) * (rows - below) / (above - below)

    def batch_pass(self, rows: int, tokens: int) -> float:
        """T(B, N): a pass over `rows` rows holding `tokens` tokens in all."""
        return self.target_pass(tokens) + self.row_overhead(rows)

    def predicted_speedup(self, drafter: str, gamma: int, expected_tokens: float, verified: int | None = None,
                          rows: int = 1) -> float:
        """Speed-up of the batch's goodput when one of its `rows` rows drafts γ tokens deep, verifies
        `verified` draft tokens (default γ: a chain; a tree verifies all its nodes) and commits
        `expected_tokens`, the others decoding plainly (`control/policy.py`); one row: over plain decoding."""
        verified = gamma if verified is None else verified
        seconds = self.batch_pass(rows, rows + verified) + self.draft_seconds(drafter, gamma)
        return (expected_tokens + rows - 1) / rows * self.batch_pass(rows, rows) / seconds

    def pass_prices(self, rows: int, largest: int) -> list[float]:
        """[T(B, B + n) for n = 0 .. largest]: a round's prices of passes, worked out once for all of
        its candidates (`predicted_speedups(passes=)`)."""
        ratios = self.calibration.ratios(range(rows, rows + largest + 1))
        overhead = self.row_overhead(rows)
        return [self.measured_pass(rows + n) * ratio + overhead for n, ratio in enumerate(ratios)]

    def draft_prices(self, drafter: str, largest: int, caught_up: int = 0) -> list[float]:
        """[D(γ) for γ = 1 .. largest], as `draft_seconds` gives each (reading `caught_up` tokens first)."""
        cost, calibration = self.draft_costs[drafter], self.draft_calibration.get(drafter)
        ratios = calibration.ratios(range(1, largest + 1)) if calibration else [1.0] * largest
        return [cost.seconds(gamma, caught_up) * ratio for gamma, ratio in enumerate(ratios, 1)]

    def predicted_speedups(self, drafter: str, expected_tokens: list[float], verified: list[int] | None = None,
                           rows: int = 1, passes: list[float] | None = None, caught_up: int = 0) -> list[float]:
        """`predicted_speedup` for γ = 1 .. len(expected_tokens) at once (`expected_tokens[γ − 1]` and
        `verified[γ − 1]` for each; default: chains): the policy asks this every round, for every
        drafter, so the round's `pass_prices` (for these rows, covering the largest pass) can be passed in.
        `caught_up`: committed tokens the drafter would read first (`Drafter.catch_up_tokens`), priced in."""
        gammas = len(expected_tokens)
        counts = list(range(1, gammas + 1)) if verified is None else verified[:gammas]
        passes = passes if passes is not None else self.pass_prices(rows, max(counts, default=0))
        plain = passes[0]
        return [(expected + rows - 1) / rows * plain / (passes[count] + draft)
                for expected, count, draft in zip(expected_tokens, counts, self.draft_prices(drafter, gammas, caught_up))]

    def to_json(self) -> dict:
        return {
            "version": FORMAT_VERSION,
            "key": self.key,
            "description": self.description,
            "pass_seconds": {str(k): v for k, v in sorted(self.pass_seconds.items())},
            "draft_costs": {name: {"per_call": c.per_call, "per_token": c.per_token, "per_catch_up": c.per_catch_up}
                            for name, c in self.draft_costs.items()},
            "row_seconds": {str(b): v for b, v in sorted(self.row_seconds.items())},
            "draft_weights": dict(sorted(self.draft_weights.items())),
        }

    @classmethod
    def from_json(cls, data: dict) -> CostModel:
        return cls(
            pass_seconds={int(k): float(v) for k, v in data["pass_seconds"].items()},
            # a draft cost from before catch-ups were priced is left out: measured again, with them
            draft_costs={n: DraftCost(float(c["per_call"]), float(c["per_token"]), float(c["per_catch_up"]))
                         for n, c in data["draft_costs"].items() if "per_catch_up" in c},
            row_seconds={int(b): float(v) for b, v in data.get("row_seconds", {}).items()},
            draft_weights={str(n): str(d) for n, d in data.get("draft_weights", {}).items()},
            key=data["key"],
            description=data.get("description", {}),
        )


def covers(costs: CostModel, largest: int) -> bool:
    """Whether T(k) was measured for every k up to `largest`."""
    return all(k in costs.pass_seconds for k in range(1, largest + 1))


def largest_pass(drafters: list, max_gamma: int) -> int:
    """Tokens in the largest verification pass: the last committed one and γ drafts, or a tree's nodes."""
    return 1 + max([max_gamma] + [d.max_nodes for d in drafters])


BATCH_SIZES = (2, 4, 8, 16, 32)  # rows at which T(B, N)'s per-row cost is measured


def best_batch(costs: CostModel, largest: int = max(BATCH_SIZES), share: float = 0.95) -> int:
    """The default bound on rows decoded together: the fewest measured rows whose plain decoding
    reaches `share` of the best measured throughput (B / T(B, B)); more rows would add latency to
    every row for little more throughput."""
    sizes = [1] + [b for b in sorted(costs.row_seconds) if b <= largest]
    throughput = {b: b / costs.batch_pass(b, b) for b in sizes}
    best = max(throughput.values())
    return min(b for b in sizes if throughput[b] >= share * best)
