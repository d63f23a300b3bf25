"""The cost model's numbers and its arithmetic: T(k), D_d(γ), T(B, N) and the predicted speed-up.

The policy prices every choice by the cost table as measured and cached (`measure.py`): T(k), D_d(γ)
and T(B, N), interpolated, nothing else; a pass at the row's context L where the table was timed at
two context lengths: T(k, L) = T(k) + per_context(k) · (L − context), at least CONTEXT_FLOOR · T(k)
(attention reads every cached token for every new one, so on a CPU a wide pass grows dearer beside a
one-token pass as the context grows). So its choices do not depend on how long this process's rounds
happened to take.

The engine still reports the time of every round it runs and its context (`observe_round`) and of
every proposal (`observe_draft`); `Calibration` keeps, per size, how much dearer than the table at
its context real rounds were on average (a round also pays for acceptance and commit), and what
they took. Two readers use it:

- the analysis of a run (`control/analysis.py`: the bench's and `explain`'s predictions) prices
  passes by the mean seconds of every round observed of their size (`observed_pass`), so that its
  "predicted × plain" compares like with like;
- the drift check (`drift`): where, over at least DRIFT_MIN_ROUNDS rounds of a size, real rounds cost
  more than DRIFT_BOUND times (or less than 1 / DRIFT_BOUND of) what the table's shape says beside
  plain rounds, or a drafter's proposals did against the passes, the table no longer describes the
  machine: the engine drops the cached file, and the next start measures again (announced).

Calibrations live in memory only; `to_json` / `from_json` are what the cache file (`cache.py`) keeps.
"""

from __future__ import annotations

from dataclasses import dataclass, field

FORMAT_VERSION = 5  # 5: proposals timed after a target pass; 4: passes at two context lengths (`per_context`); 3: spreads kept
# beside it, busy measurements not cached; 2: drafters re-measured once a chain's catch-up computed one
# row of draft logits


@dataclass
class DraftCost:
    per_call: float  # seconds spent once per proposal (a lookup's search, a model reading the last token)
    per_token: float  # seconds per drafted token (one draft-model step)
    per_catch_up: float = 0.0  # seconds per committed token a model reads first, not having read it yet

    def seconds(self, gamma: int, caught_up: int = 0) -> float:
        """D(γ) of a proposal that first reads `caught_up` committed tokens it had not read
        (`Drafter.catch_up_tokens`: rounds it did not draft, the tokens the last round accepted)."""
        return self.per_call + self.per_token * gamma + self.per_catch_up * caught_up if gamma else 0.0


CONTEXT_FLOOR = 0.25  # a pass priced at a short context costs at least this share of the table's figure
RATIO_LIMITS = (0.25, 4.0)  # an observed / table ratio outside this is clipped (a stall, a page fault)
DRIFT_BOUND = 1.5  # real rounds of a size this much dearer (or cheaper) than the table's shape: measure again...
DRIFT_MIN_ROUNDS = 100  # ...once that many rounds of the size (and of plain rounds, or proposals) say so
MIN_OBSERVED_ROUNDS = 8  # rounds of a size before their mean seconds price it in a run's analysis (`observed_pass`)
DRIFT_NEGLIGIBLE = 0.05  # a drafter's drift moves no prediction while it adds less than this share of T(1) a
# proposal (an EAGLE-3 head's few ms beside an 8B-class pass: measuring the whole table again would cost minutes)


@dataclass
class Calibration:
    """What real calls cost beside the table, as means over every observation: for each size k (the k
    of a target pass T(k), or the γ of a drafter's proposal D(γ)) the mean ratio r = observed seconds /
    table seconds (the table at the call's context), each clipped to RATIO_LIMITS first, so that a
    stall moves a mean little, and the seconds the clipped ratios stand for. The analysis of a run
    prices each size's rounds by their mean seconds (`mean_seconds`: what they cost over the run);
    the drift check compares a size's mean ratio with the reference size's (1: a plain round, a
    one-token proposal). Nothing here reaches the policy."""

    reference: int = 1
    sums: dict[int, list[float]] = field(default_factory=dict)  # k → [Σ r, observations]
    seconds: dict[int, float] = field(default_factory=dict)  # k → Σ r · price: the clipped seconds of its calls

    def observe(self, tokens: int, seconds: float, price: float) -> None:
        """A call of size `tokens` took `seconds` where the table's price (at its context) was `price`."""
        ratio = min(max(seconds / price, RATIO_LIMITS[0]), RATIO_LIMITS[1])
        seen = self.sums.setdefault(tokens, [0.0, 0.0])
        seen[0] += ratio
        seen[1] += 1
        self.seconds[tokens] = self.seconds.get(tokens, 0.0) + ratio * price

    def mean_seconds(self, tokens: int) -> float | None:
        """What calls of size k took on average (each clipped as its ratio is), or None if none was seen."""
        return self.seconds[tokens] / self.sums[tokens][1] if tokens in self.sums else None

    def count(self, tokens: int) -> int:
        """Calls of size k observed."""
        return int(self.sums.get(tokens, (0.0, 0))[1])

    def lifetime_ratio(self, tokens: int) -> float:
        """The mean r of size k; where k was never observed, that of the reference size, or of every
        size (1 before any observation)."""
        for key in (tokens, self.reference):
            if key in self.sums:
                total, count = self.sums[key]
                return total / count
        return self.overall()

    def factor(self, tokens: int) -> float:
        """What size k cost over the reference size, beyond the table's shape."""
        return self.lifetime_ratio(tokens) / self.lifetime_ratio(self.reference)

    def drifted_sizes(self) -> dict[int, float]:
        """{k: factor(k)} for the sizes whose factor is beyond DRIFT_BOUND either way, each over at least
        DRIFT_MIN_ROUNDS observations of k and of the reference size."""
        if self.sums.get(self.reference, [0, 0])[1] < DRIFT_MIN_ROUNDS:
            return {}
        return {k: self.factor(k) for k, (_, count) in sorted(self.sums.items())
                if k != self.reference and count >= DRIFT_MIN_ROUNDS
                and not 1 / DRIFT_BOUND <= self.factor(k) <= DRIFT_BOUND}

    @property
    def observations(self) -> float:
        return sum(count for _, count in self.sums.values())

    def overall(self) -> float:
        """The mean r over every observation of every size (1 before any)."""
        total, count = map(sum, zip(*self.sums.values())) if self.sums else (0.0, 0.0)
        return total / count if count else 1.0


@dataclass
class CostModel:
    pass_seconds: dict[int, float]  # tokens scored → median seconds of a target pass after `context` cached tokens
    draft_costs: dict[str, DraftCost] = field(default_factory=dict)
    draft_weights: dict[str, str] = field(default_factory=dict)  # drafter name -> the weights its cost was measured with
    row_seconds: dict[int, float] = field(default_factory=dict)  # B → extra seconds of B rows over one (serving)
    context: int = 0  # cached tokens before the timed passes of pass_seconds
    # tokens scored → seconds a pass adds per cached token beyond `context` (from passes timed at two
    # context lengths: attention reads every cached token); empty: not measured, T(k) taken as flat
    per_context: dict[int, float] = field(default_factory=dict)
    key: str = ""
    description: dict = field(default_factory=dict)  # machine, model, when measured
    # the measurement's spread: size k → (p90 − p10) / median of its repeats; drafter → that of its proposals
    pass_spread: dict[int, float] = field(default_factory=dict)
    draft_spread: dict[str, float] = field(default_factory=dict)
    calibration: Calibration = field(default_factory=Calibration)  # T(k) in real rounds; never cached
    draft_calibration: dict[str, Calibration] = field(default_factory=dict)  # drafter → D(γ) in real rounds; never cached
    calibrate: bool = True  # False: real rounds are not recorded (the analysis prices by the table)
    dropped: bool = False  # its cached file was removed, having drifted (`measure.drop_if_drifted`): not written again

    def target_pass(self, tokens: int, context: int | None = None) -> float:
        """T(tokens) as the table has it (not smoothed: on a CPU, GEMM kernels make some sizes genuinely
        cheaper than smaller ones); past the measured sizes, extended linearly. With `context` (cached
        tokens before the pass) and `per_context` measured: T(tokens, context), linear in the context
        (what attention reads), at least CONTEXT_FLOOR of the table's figure."""
        seconds = along(self.pass_seconds, tokens)
        if context is None or not self.per_context:
            return seconds
        return max(seconds + max(0.0, along(self.per_context, tokens)) * (context - self.context),
                   CONTEXT_FLOOR * seconds)

    def observed_pass(self, tokens: int) -> float:
        """T(tokens) as the rounds of this engine's life so far cost on average; where fewer than
        MIN_OBSERVED_ROUNDS rounds of this size were seen (one round is noise: a single plain round
        priced a whole run's analysis 25% off), the table's figure times the mean ratio of every round
        seen; as the table has it where calibration is off. How a run's analysis prices its passes."""
        if not self.calibrate:
            return self.target_pass(tokens)
        if self.calibration.count(tokens) >= MIN_OBSERVED_ROUNDS:
            return self.calibration.mean_seconds(tokens)
        return self.target_pass(tokens) * self.calibration.overall()

    def observe_round(self, tokens: int, seconds: float, context: int | None = None) -> None:
        """A round that verified `tokens` tokens (1: a plain step) after `context` cached ones took
        `seconds`, draft excluded."""
        if self.calibrate and seconds > 0:
            self.calibration.observe(tokens, seconds, self.target_pass(tokens, context))

    def observe_draft(self, drafter: str, gamma: int, seconds: float, caught_up: int = 0) -> None:
        """`drafter` took `seconds` to propose γ tokens in a real round, reading `caught_up` committed
        tokens first."""
        measured = self.draft_costs[drafter].seconds(gamma, caught_up)
        if self.calibrate and seconds > 0 and measured > 0:
            self.draft_calibration.setdefault(drafter, Calibration()).observe(gamma, seconds, measured)

    def drift(self) -> list[str]:
        """What real rounds say the table gets wrong, beyond DRIFT_BOUND over at least DRIFT_MIN_ROUNDS
        rounds (`Calibration`): passes of a size against plain passes, or a drafter's proposals
        against the passes, where the difference is more than DRIFT_NEGLIGIBLE of a one-token pass.
        Empty: the table holds."""
        out = [f"passes over {k} tokens cost {factor:.2f}× what the table says beside one-token passes"
               for k, factor in self.calibration.drifted_sizes().items()]
        level = self.calibration.lifetime_ratio(1)
        for name, calibration in sorted(self.draft_calibration.items()):
            if calibration.observations >= DRIFT_MIN_ROUNDS:
                ratio = calibration.overall()
                observed = sum(calibration.seconds.values()) / calibration.observations  # a proposal's mean seconds
                excess = abs(observed * (1 - level / ratio))  # beyond what the passes' own level explains
                if not 1 / DRIFT_BOUND <= ratio / level <= DRIFT_BOUND and excess > DRIFT_NEGLIGIBLE * self.target_pass(1):
                    out.append(f"{name}'s drafting cost {ratio / level:.2f}× what the table says beside the passes")
        return out

    def draft_seconds(self, drafter: str, gamma: int, caught_up: int = 0) -> float:
        """D_drafter(γ) as the table has it; with `caught_up`, of a proposal that first reads that many
        committed tokens."""
        return self.draft_costs[drafter].seconds(gamma, caught_up)

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

    def batch_pass(self, rows: int, tokens: int, context: int | None = None) -> float:
        """T(B, N): a pass over `rows` rows holding `tokens` tokens in all (after `context` cached
        tokens each: the row the policy chooses for, its context standing for every row's)."""
        return self.target_pass(tokens, context) + self.row_overhead(rows)

    def predicted_speedup(self, drafter: str, gamma: int, expected_tokens: float, verified: int | None = None,
                          rows: int = 1, context: int | None = None) -> float:
        """Speed-up of the batch's goodput when one of its `rows` rows drafts γ tokens deep, verifies
        `verified` draft tokens (default γ: a chain; a tree verifies all its nodes) and commits
        `expected_tokens`, the others decoding plainly (`control/policy.py`); one row: over plain decoding."""
        verified = gamma if verified is None else verified
        seconds = self.batch_pass(rows, rows + verified, context) + self.draft_seconds(drafter, gamma)
        return (expected_tokens + rows - 1) / rows * self.batch_pass(rows, rows, context) / seconds

    def pass_prices(self, rows: int, largest: int, context: int | None = None) -> list[float]:
        """[T(B, B + n) for n = 0 .. largest] after `context` cached tokens: a round's prices of passes,
        worked out once for all of its candidates (`predicted_speedups(passes=)`)."""
        overhead = self.row_overhead(rows)
        return [self.target_pass(rows + n, context) + overhead for n in range(largest + 1)]

    def draft_prices(self, drafter: str, largest: int, caught_up: int = 0) -> list[float]:
        """[D(γ) for γ = 1 .. largest] (reading `caught_up` tokens first)."""
        cost = self.draft_costs[drafter]
        return [cost.seconds(gamma, caught_up) for gamma in range(1, largest + 1)]

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
            "pass_spread": {str(k): v for k, v in sorted(self.pass_spread.items())},
            "context": self.context,
            "per_context": {str(k): v for k, v in sorted(self.per_context.items())},
            "draft_costs": {name: {"per_call": c.per_call, "per_token": c.per_token, "per_catch_up": c.per_catch_up}
                            for name, c in self.draft_costs.items()},
            "draft_spread": dict(sorted(self.draft_spread.items())),
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
            pass_spread={int(k): float(v) for k, v in data.get("pass_spread", {}).items()},
            context=int(data.get("context", 0)),
            per_context={int(k): float(v) for k, v in data.get("per_context", {}).items()},
            draft_spread={str(n): float(v) for n, v in data.get("draft_spread", {}).items()},
        )


def along(table: dict[int, float], tokens: int) -> float:
    """table[tokens] for a size → figure table: measured sizes as measured, others interpolated
    linearly between their neighbours; below the smallest, its figure; past the largest, extended
    with the mean growth per token over the measured range, never downwards."""
    if tokens in table:
        return table[tokens]
    sizes = sorted(table)
    first, last = sizes[0], sizes[-1]
    if tokens < first:
        return table[first]
    if tokens > last:
        growth = (table[last] - table[first]) / (last - first) if last > first else 0.0
        return table[last] + max(0.0, growth) * (tokens - last)
    below = max(s for s in sizes if s < tokens)
    above = min(s for s in sizes if s > tokens)
    return table[below] + (table[above] - table[below]) / (above - below) * (tokens - below)


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
