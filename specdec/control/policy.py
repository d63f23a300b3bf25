"""Each round's drafter and draft length, chosen from measured costs and the running acceptance.

For drafter d, with α_i its running estimate of P(draft position i accepted | positions < i were):

    E_d(γ) = 1 + Σ_{i=1..γ} Π_{j≤i} α_j                 expected tokens a round commits
    S_d(γ) = E_d(γ) · T(1) / (T(n_d(γ)+1) + D_d(γ))     predicted speed-up over plain decoding

n_d(γ) is the number of draft tokens verified: γ for a chain, the node count for a token tree of
depth γ (whose α_i is then the rate at which the walk down the tree goes one level deeper).
T(k) is the measured time of a target pass over k tokens and D_d(γ) the measured time to draft γ
tokens (`control/cost_model/`). With i.i.d. α and T(k) = T(1) this is the seed formula
(1 − α^(γ+1)) / ((1 − α)(γc + 1)); here the measured cost curve replaces "a pass costs 1" and a
per-position α replaces the i.i.d. one (acceptance is not independent of position).

In a batch of B rows the pass is shared, and what counts is the batch's goodput (tokens committed
per second over all rows). A row weighs its choice against the others decoding plainly:

    S_d(γ; B) = (E_d(γ) + B − 1) / B · T(B, B) / (T(B, B + n_d(γ)) + D_d(γ))

with T(B, N) the measured time of a pass over B rows holding N tokens in all (`control/cost_model/`);
for B = 1 it is S_d(γ) above. Once the pass is compute-bound, extra tokens cost what they weigh
and S falls below 1: speculation fades out as the batch fills, and comes back as it empties.

The policy picks the (d, γ) with the largest S. A model drafter's D_d(γ) includes reading the
committed tokens it has not read (the rounds it sat out: `choose(behind=)`, from
`Drafter.catch_up_tokens`, priced by the cost model's `per_catch_up`), so one that rested long is
weighed with the catch-up it would pay first. When even that is below 1, speculation is predicted
to lose: it decodes plainly, and comes back later with one probe round (which refreshes α) after a
cool-down that doubles while probes keep losing (8, 16, ... 128 rounds) and resets once one pays.
A drafter that even the prior predicts to lose (a costly one) is first probed after 8 plain rounds.
While the model drafters (all but the lookups asked first) are all predicted to lose, they are
weighed again only after REWEIGH_AFTER (8) rounds, or at once when a probe is due or the batch's
size changed (the pass's price with it): their estimates
move slowly while they rest (fading, and the catch-up growing), and predicting them every round
cost ~50 µs, ~1% of a 135M round, which `auto` paid at T = 1 beside lookups that barely pay. A
drafter that turns out to pay is noticed at most 8 rounds late.

What speculation may lose is capped, whatever the estimates say. Each of the D drafters has an
allowance (`bank`, in one-token passes) that every round adds LOSS_SHARE / D to (0.5% of a pass a
round in all), that each of its speculative rounds adds what it gained to or takes what it lost from
against plain decoding, as the cost model prices them (its pass and draft, (T(B, B + n) + D) / T(B, B),
against the (accepted + B) / B passes' worth of tokens it committed; a model drafter's D includes
reading the committed tokens it had not read, which after a long rest is most of a probe's cost), and
that asking it (a lookup) takes what its proposal cost from, as priced when asked; once the round
is observed, what its planning took beyond the asks' prices (`observe(planning_seconds=)`: the asks
and the choice, timed by the row; on the 135M model 0.05–0.1 ms, 1–2% of its round, where the
tight-loop price of a suffix lookup is 0.01 ms) is taken from the drafters weighed (asked or
predicted) in equal parts, since a round that weighs none plans nothing (it is plain at once); gains bank at most LOSS_BANK (16) passes, and it starts at
LOSS_START (2). A drafter whose allowance is below zero is neither asked nor chosen, probes and
retries included; the others go on, so a model drafter that lost does not stop a lookup that pays.
Each round of a drafter that loses halves the rate at which its allowance refills, down to
REFILL_FLOOR (1/8) of its share; a round that gains restores it: a drafter that keeps losing (a model
drafter whose probes never pay at this temperature) is probed 8 times less often, and one that
gains now and then (a lookup) refills at its full share.
So from the engine's first round, over n rounds speculation loses at most 0.005·n one-token passes,
plus D · LOSS_START, plus each drafter's one worst round (the one that took its allowance below
zero): at most 0.5% of plain decoding's time beyond those constants, and over long runs where no
round of a drafter pays, its share of that falls to an eighth; over rounds that begin later, it
may also give back what the allowances banked of earlier gains (at most D · LOSS_BANK). (The share
was 1%; with the planning's own cost, ~1% of a 6 ms round of the 135M model, that left `auto` up to
2-3% behind the best single lookup where no model drafter pays. The bank held 6 passes: greedy
suffix rounds of the 135M model swing an allowance by up to ~7 passes within a prompt, so a bad
stretch spent a lookup that had gained 50-200 passes on each prompt before, and at a refill of
0.5%/3 of a pass a round `auto`'s suffix stayed spent for whole prompts, 381 rounds of 164 and
242, where suffix alone drafted; at 16 the allowance stayed above 9 passes on every prompt.) The allowances
carry on to the next request with the same settings and temperature (`continue_from`), so short
requests do not each start with fresh ones; where a drafter has not paid for a while, its probes wait
for its allowance, which makes them rarer the more they lose.

Lookup drafters (n-gram, suffix: `Drafter.looks_up`) cost nothing to ask (a "free" drafter: its
longest draft costs under 2% of a one-token pass), and what they propose comes with the length of
the match behind it, which says a lot about whether it will be accepted. So every round, before the
choice, each free lookup is asked for up to max_gamma tokens, and its proposal becomes an offer: the
k tokens (none: no offer) with the best S computed from the acceptance seen after matches of the
same length (a running estimate per match length, with the same prior). The round then takes the
best of the offers and the model drafters' predictions: a lookup where the text repeats itself, a
model where it does not (choosing a lookup by its average acceptance instead would spend the rounds
where it finds no match on plain decoding). While the others are predicted to lose, an offer that
pays is taken before any probe, and only plain rounds count towards the next probe. An offer of
nothing (that would not pay even alone in the pass) fades that match length's recent evidence by
`memory` towards its long-run value, and the long-run one by LONG_MEMORY towards the prior, so a
match length given up on is retried only after some hundreds of proposals (and within the allowance). The proposals depend
only on the committed tokens, and which prefix is kept only on their length and match length, so
choosing by them keeps every round exact.

A model that drafts a chain (an EAGLE-3 head) says how sure it is at each position it drafts, and on
Spec-Bench that confidence predicts acceptance well (docs/bench/eagle3-v2-128: 0.11 accepted below
0.2, 0.95 above 0.9). Such a drafter (`stops_early`) is asked for up to max_gamma tokens and drafts
while `keep_drafting` says one more token could pay: with â(c) the acceptance seen after tokens of
confidence c (a running estimate per confidence bucket, each starting at its bucket's centre), the
chain so far is expected to commit E_k = 1 + Σ_{i≤k} Π_{j≤i} â(c_j), and it goes on while
S(k + 1) with one more token as likely as the best bucket's beats S(k). Whether token k + 1 is
drafted depends only on the tokens before it, so a sampled chain stays exact (each drafted token is
still drawn from q given what precedes it); the whole chain is verified (no `trim` by confidence:
keeping token j for the sake of a confident token after it would make j's inclusion depend on j
itself, and bias the acceptance test).

α_i is a running, forgetting estimate: each observation of position i counts 1 and older ones are
discounted by `memory` per observation; it shrinks (weight 1) towards the estimate of the position
before it, and the first position's towards a long-run estimate of it that forgets far more slowly
(LONG_MEMORY), which itself shrinks towards the prior (`prior`, weight 1); a position never drafted
yet takes the estimate of the position before it. A
drafter passed over while another drafts forgets its recent evidence (`idle_memory`) towards its own
long-run value, not towards the prior: one that lost for long is not retried because it was idle. A new request on the same engine starts from the estimates the last one
ended with, their evidence halved (`continue_from`). None of this touches exactness: every round is verified by the
same lossless rule whatever γ and drafter were chosen, and the choice depends only on the past.
"""

from __future__ import annotations

import bisect
import functools
from collections.abc import Callable
from dataclasses import dataclass

from specdec.control.cost_model import CostModel
from specdec.control.theory import expected_tokens_by_position

COOLDOWN_FIRST = 8  # plain rounds before the first probe after speculation stopped paying
COOLDOWN_MAX = 128
FREE_SHARE = 0.02  # a drafter whose longest draft costs at most this share of a one-token pass is "free"
MATCH_BUCKETS = 6  # lookups' acceptance is kept apart by match length 0, 1, ... 6 (6 = 6 or more)
CARRY = 0.5  # share of its evidence a request's policy passes on to the next request on the same engine
DECISION_LOG_LIMIT = 200
CONFIDENCE_EDGES = (0.2, 0.4, 0.6, 0.8, 0.9)  # buckets of a drafter's confidence in a token: [0, 0.2), ... [0.9, 1]
LONG_MEMORY = 0.995  # the long-run estimate's forgetting per observation (some 200 observations kept)
LOSS_SHARE = 0.005  # speculation may lose this share of a one-token pass per round (its allowance)...
LOSS_BANK = 16.0  # ...plus what gains banked, at most this many one-token passes...
LOSS_START = 2.0  # ...starting from this many (so that the first rounds' luck does not stop it at once)
REWEIGH_AFTER = 8  # rounds before model drafters all predicted to lose are weighed again (a probe due: at once)
REFILL_FLOOR = 0.125  # each losing round of a drafter halves its allowance's refill, down to this share of it


@dataclass(frozen=True)
class RoundPlan:
    drafter: int | None  # index into the engine's drafters; None: a plain round
    gamma: int  # tokens to draft (0 for a plain round)
    predicted_speedup: float  # S of this choice (1.0 for a plain round)
    explanation: str | Callable[[], str]  # why, or what writes it when asked: few rounds' reasons are read

    @property
    def reason(self) -> str:
        """Why this plan, in words (written when first read: read it before the policy observes the
        round, whose estimates it quotes; `settled`)."""
        return self.explanation if isinstance(self.explanation, str) else self.explanation()

    def settled(self) -> RoundPlan:
        """The same plan with its reason written now."""
        return self if isinstance(self.explanation, str) else RoundPlan(self.drafter, self.gamma,
                                                                         self.predicted_speedup, self.reason)


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
        out, total, survive = [], 1.0, 1.0
        for alpha in self.alphas(gamma):
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


class FixedPolicy:
    """γ fixed by hand, one drafter: every round drafts `gamma` tokens."""

    def __init__(self, gamma: int) -> None:
        self.plan = RoundPlan(0, gamma, float("nan"), f"γ = {gamma} fixed by hand")
        self.decisions: list[dict] = []

    asks_first: list[int] = []  # no drafter is asked before the choice

    def choose(self, rows: int = 1, proposals: dict | None = None, behind: dict[int, int] | None = None) -> RoundPlan:
        return self.plan  # γ fixed by hand: nothing to weigh

    def keep_drafting(self, plan: RoundPlan, rows: int = 1) -> None:
        return None  # γ fixed by hand: every token of it is drafted

    def observe(self, plan: RoundPlan, drafted: int, accepted: int, match_length: int = 0,
                confidence: list[float] | None = None, caught_up: int = 0, planning_seconds: float = 0.0) -> None:
        pass


class AdaptivePolicy:
    """Chooses the drafter and γ each round to maximise predicted speed-up; falls back to plain."""

    def __init__(self, costs: CostModel, drafter_names: list[str], max_gamma: int = 8,
                 fixed_gamma: int | None = None, prior: float = 0.6, memory: float = 0.9,
                 idle_memory: float = 0.98, verified: list[Callable[[int], int]] | None = None,
                 stops_early: list[bool] | None = None, looks_up: list[bool] | None = None) -> None:
        self.costs = costs
        self.names = drafter_names
        # per drafter: γ → draft tokens in the verification pass (a tree verifies more than its depth)
        self.verified = verified or [lambda gamma: gamma] * len(drafter_names)  # default: chains
        self.gammas = [fixed_gamma] if fixed_gamma else list(range(1, max_gamma + 1))
        # per drafter: [n(1) .. n(max γ)], the draft tokens verified at each depth
        self.verified_counts = [[verified(gamma) for gamma in range(1, max(self.gammas) + 1)] for verified in self.verified]
        self.may_fall_back = fixed_gamma is None  # a γ fixed by hand is kept, even when it loses
        self.acceptance = [PositionAcceptance(prior, memory, positions=max(self.gammas)) for _ in drafter_names]
        self.by_match = [dict() for _ in drafter_names]  # lookups: match-length bucket → PositionAcceptance
        self.stops_early = stops_early or [False] * len(drafter_names)  # drafts while keep_drafting says so
        self.by_confidence = [ConfidenceAcceptance(memory) for _ in drafter_names]
        one_pass = costs.target_pass(1)
        self.free = [costs.draft_seconds(name, max(self.gammas)) <= FREE_SHARE * one_pass for name in drafter_names]
        # free lookups, asked every round before the choice (with γ fixed by hand: chosen like the others)
        self.looks_first = [bool(lookup) and free and self.may_fall_back
                            for lookup, free in zip(looks_up or [False] * len(drafter_names), self.free)]
        self.prior, self.memory = prior, memory
        self.idle_memory = idle_memory
        self.cooldown = COOLDOWN_FIRST
        self.plain_streak = 0  # rounds since speculation was last predicted to pay, or probed
        self.rounds = 0
        self.rows = 1  # rows sharing the pass in the round being planned
        # each drafter's allowance against plain decoding, in one-token passes: its share of LOSS_SHARE
        # a round, plus what its rounds gained (at most LOSS_BANK), less what they (and asking it) lost;
        # below 0 it is neither asked nor chosen
        self.bank = [LOSS_START] * len(drafter_names)
        self.refill = [1.0] * len(drafter_names)  # of each one's share of LOSS_SHARE: halved by a losing round
        self.asked: dict[int, float] = {}  # this round's lookups asked → what their asks were priced at (passes)
        self.weighed: list[int] = []  # this round's drafters asked or predicted: who the planning was for
        self.behind: dict[int, int] = {}  # this round's model drafters → committed tokens they would read first
        self.weigh_models_at = 0  # the round from which the model drafters are weighed again (`REWEIGH_AFTER`)...
        self.judged_rows = 1  # ...or a round with other than the rows they were judged with
        self.decisions: list[dict] = []  # the choices, logged when they change

    def continue_from(self, earlier: AdaptivePolicy, keep: float = CARRY) -> None:
        """Start from what an earlier request on the same engine learned (same drafters and γs), its
        evidence discounted by `keep`: a new request begins near the acceptance seen lately instead
        of at the prior, and its own rounds soon outweigh what it inherited. The probe schedule
        carries on too (the cooldown reached and the plain rounds since): a drafter that has been
        losing is not probed more often because requests are short."""
        if earlier.names != self.names or earlier.gammas != self.gammas:
            return
        self.acceptance = [a.faded_copy(keep) for a in earlier.acceptance]
        self.by_match = [{key: bucket.faded_copy(keep) for key, bucket in buckets.items()} for buckets in earlier.by_match]
        self.by_confidence = [c.faded_copy(keep) for c in earlier.by_confidence]
        self.cooldown, self.plain_streak = earlier.cooldown, earlier.plain_streak
        self.bank = list(earlier.bank)  # and so do the allowances: short requests do not each get fresh ones
        self.refill = list(earlier.refill)

    @property
    def asks_first(self) -> list[int]:
        """The drafters (lookups) whose proposals `choose` wants every round, asked for up to max γ;
        not one whose allowance is spent (asking costs time too)."""
        return [index for index, first in enumerate(self.looks_first) if first and self._allowed(index)]

    def _largest_pass(self) -> int:
        """The most draft tokens a candidate of this round can put in the pass: a lookup's longest
        proposal, or the largest tree of a model drafter that may draft."""
        return max([max(self.gammas), *(max(counts) for index, counts in enumerate(self.verified_counts)
                                         if not self.looks_first[index] and self._allowed(index))])

    def _allowed(self, index: int) -> bool:
        """Whether drafter `index` may draft: its allowance is not spent (a γ fixed by hand always may)."""
        return not self.may_fall_back or self.bank[index] >= 0

    def predictions(self, rows: int = 1, passes: list[float] | None = None,
                    behind: dict[int, int] | None = None) -> list[tuple[float, int, int]]:
        """(S, drafter index, γ) for every candidate but the lookups asked first, with `rows` rows
        sharing the pass (`passes`: the round's `CostModel.pass_prices`; `behind`: as in `choose`)."""
        passes = passes if passes is not None else self.costs.pass_prices(rows, self._largest_pass())
        behind = behind or {}
        out = []
        for index, name in enumerate(self.names):
            if self.looks_first[index] or not self._allowed(index):
                continue
            expected = self.acceptance[index].expected_tokens_up_to(max(self.gammas))
            speedups = self.costs.predicted_speedups(name, expected, self.verified_counts[index], rows, passes,
                                                     behind.get(index, 0))
            out += [(speedups[gamma - 1], index, gamma) for gamma in self.gammas]
        return out

    def offer(self, index: int, draft, rows: int = 1, passes: list[float] | None = None) -> tuple[float, int, int] | None:
        """A lookup's proposal (a chain) as a candidate (S, index, k): the k of its tokens worth
        verifying, from the acceptance seen after matches as long as this one's; None when no k
        predicts a gain. A match length that would not pay even alone in the pass fades its evidence,
        so that it is tried again later (a full batch, where nothing pays, leaves it as it is)."""
        if not len(draft):
            return None
        if draft.parents is not None:
            raise ValueError(f"{self.names[index]} looks up chains; it proposed a tree")
        best_k, best = self._best_prefix(index, draft, rows, passes)
        if best_k == 0:
            if rows == 1 or self._best_prefix(index, draft, 1)[0] == 0:  # recent evidence towards the long
                self._bucket(index, draft.match_length).fade(self.memory, LONG_MEMORY)  # run, it towards the prior
            return None
        return best, index, best_k

    def _best_prefix(self, index: int, draft, rows: int, passes: list[float] | None = None) -> tuple[int, float]:
        """(k, S): the prefix of a lookup's proposal with the best predicted S above 1, or (0, 1.0)."""
        expected = self._bucket(index, draft.match_length).expected_tokens_up_to(len(draft))
        best_k, best = 0, 1.0
        for k, speedup in enumerate(self.costs.predicted_speedups(self.names[index], expected, rows=rows, passes=passes), 1):
            if speedup > best:
                best_k, best = k, speedup
        return best_k, best

    def choose(self, rows: int = 1, proposals: dict | None = None, behind: dict[int, int] | None = None) -> RoundPlan:
        """This round's plan, for a row among `rows` sharing the pass (1: a request alone).
        `proposals`: what the drafters of `asks_first` proposed this round ({index: Draft}); when the
        plan takes one, its γ is how many of those tokens to verify. `behind`: {index: committed tokens
        a model drafter would read first} (`Drafter.catch_up_tokens`; missing: 0), priced into its
        predictions, so that one that sat out many rounds is weighed with the catch-up it would pay."""
        self.rounds += 1
        self.rows = rows
        self.behind = behind or {}
        share = LOSS_SHARE / len(self.names)
        self.bank = [min(bank + share * refill, LOSS_BANK) for bank, refill in zip(self.bank, self.refill)]
        self.asked = {}
        weigh_models = (not self.may_fall_back or self.rounds >= self.weigh_models_at
                        or self.plain_streak >= self.cooldown or rows != self.judged_rows)
        predicted = [i for i, first in enumerate(self.looks_first) if not first and self._allowed(i) and weigh_models]
        self.weighed = [*(proposals or {}), *predicted]
        if not predicted and not any(len(draft) for draft in (proposals or {}).values()):
            # nothing to weigh: no lookup was asked or none found anything, and no other drafter may
            # draft (most rounds of a lookup alone: its match is too short to propose)
            for index in proposals or {}:
                self.asked[index] = self._asking(index, self.costs.batch_pass(rows, rows))
                self.bank[index] -= self.asked[index]
            self.plain_streak += 1
            plan = RoundPlan(None, 0, 1.0, self._nothing_found)
            self._log(plan)
            return plan
        passes = self.costs.pass_prices(rows, self._largest_pass())  # the round's prices, for every candidate
        for index in proposals or {}:
            self.asked[index] = self._asking(index, passes[0])
            self.bank[index] -= self.asked[index]
        predictions = self.predictions(rows, passes, behind)
        offers = [offer for index, draft in (proposals or {}).items() if (offer := self.offer(index, draft, rows, passes))]
        best = max(predictions, key=lambda x: (x[0], -x[2])) if predictions else None
        offered = max(offers, key=lambda x: (x[0], -x[2])) if offers else None
        if best and best[0] < 1:  # predicted to lose: weighed again in REWEIGH_AFTER rounds, or for a probe
            self.weigh_models_at, self.judged_rows = self.rounds + REWEIGH_AFTER, rows
        # the reasons are written only if read (the decision log, a trace), before the round is observed
        why_best = functools.partial(self._why, *best) if best else None
        if best and (best[0] >= 1 or not self.may_fall_back):
            self.cooldown = COOLDOWN_FIRST
            self.plain_streak = 0
            if offered and offered[0] > best[0]:
                plan = self._lookup_plan(offered, proposals, lambda: f"better than {why_best()}")
            else:
                speedup, index, gamma = best
                plan = RoundPlan(index, self._ask(index, gamma), speedup, lambda: f"best predicted: {why_best()}")
        elif offered:  # the others are predicted to lose; a lookup's match pays
            losing = (lambda: f"no other drafter is predicted to beat plain decoding; the best: {why_best()}") if best \
                else (lambda: "no other drafter")
            plan = self._lookup_plan(offered, proposals, losing)
        elif best and self.plain_streak >= self.cooldown:
            self.cooldown = min(2 * self.cooldown, COOLDOWN_MAX)
            speedup, index, gamma = best
            streak, self.plain_streak = self.plain_streak, 0
            plan = RoundPlan(index, self._ask(index, gamma), speedup,
                             lambda: f"probe after {streak} plain rounds, to check the estimate again: {why_best()}")
        else:
            self.plain_streak += 1
            wait = self.cooldown - self.plain_streak + 1
            plan = RoundPlan(None, 0, 1.0, (lambda: f"plain: nothing is predicted to beat plain decoding (the best: "
                                                    f"{why_best()}); next check in {wait} rounds") if best
                             else self._nothing_found)
        self._log(plan)
        return plan

    def _lookup_plan(self, lookup: tuple[float, int, int], proposals: dict, why: Callable[[], str]) -> RoundPlan:
        """The plan that verifies the first k tokens of a lookup's proposal (`why`: the others' side)."""
        speedup, index, keep = lookup
        match, proposed = proposals[index].match_length, len(proposals[index])
        return RoundPlan(index, keep, speedup, lambda: f"{self.names[index]} found the last {match} tokens earlier in "
                                                       f"the text: verifying {keep} of the {proposed} tokens that "
                                                       f"followed them, predicted {speedup:.2f}× plain decoding ({why()})")

    def _ask(self, index: int, gamma: int) -> int:
        """A drafter that stops drafting by itself (`keep_drafting`) is asked for max γ."""
        return max(self.gammas) if self.stops_early[index] and self.may_fall_back else gamma

    def keep_drafting(self, plan: RoundPlan, rows: int = 1) -> Callable[[list[float]], bool] | None:
        """For a drafter that `stops_early`: whether, after tokens of these confidences, one more
        could pay (S(k + 1), the next token as likely as the best confidence bucket, above S(k)).
        None: draft what the plan asks (γ fixed by hand, or another drafter)."""
        if plan.drafter is None or not self.stops_early[plan.drafter] or not self.may_fall_back:
            return None
        name, estimates = self.names[plan.drafter], self.by_confidence[plan.drafter]
        best = estimates.best()

        def go_on(confidence: list[float]) -> bool:
            k, (expected, survive) = len(confidence), estimates.outlook(confidence)
            return (self.costs.predicted_speedup(name, k + 1, expected + survive * best, rows=rows)
                    > self.costs.predicted_speedup(name, k, expected, rows=rows))

        return go_on

    def _why(self, speedup: float, index: int, gamma: int) -> str:
        alphas = ", ".join(f"{a:.2f}" for a in self.acceptance[index].alphas(gamma))
        behind = self.behind.get(index, 0)
        reading = f", first reading the {behind} committed tokens it sat out" if behind else ""
        return (f"{self.names[index]} drafting {gamma}{reading}: predicted {speedup:.2f}× plain decoding "
                f"(chance of acceptance by position: {alphas})")

    def _bucket(self, index: int, match_length: int) -> PositionAcceptance:
        key = min(match_length, MATCH_BUCKETS)
        if key not in self.by_match[index]:
            self.by_match[index][key] = PositionAcceptance(self.prior, self.memory, positions=max(self.gammas))
        return self.by_match[index][key]

    def observe(self, plan: RoundPlan, drafted: int, accepted: int, match_length: int = 0,
                confidence: list[float] | None = None, caught_up: int = 0, planning_seconds: float = 0.0) -> None:
        """A round of `plan` drafted `drafted` tokens deep and `accepted` of them were; a lookup's
        proposal followed a match of `match_length` tokens, a chain said `confidence` of each token,
        a model drafter first read `caught_up` committed tokens it had not read, and asking the
        lookups and choosing took `planning_seconds` (0: not timed; the model drafter's own drafting
        excluded): what that took beyond the asks' prices is taken from the allowances of the
        drafters weighed (the lookups asked, the others predicted), in equal parts."""
        if self.weighed and planning_seconds > 0:
            beyond = planning_seconds / self.costs.batch_pass(self.rows, self.rows) - sum(self.asked.values())
            for index in self.weighed:
                self.bank[index] -= max(0.0, beyond) / len(self.weighed)
        if plan.drafter is None:
            return  # a plain round: no evidence, and nothing fades (coming back is the probes' job)
        loss = self._loss(plan.drafter, drafted, accepted, caught_up)
        self.bank[plan.drafter] = min(self.bank[plan.drafter] - loss, LOSS_BANK)
        self.refill[plan.drafter] = 1.0 if loss <= 0 else max(REFILL_FLOOR, self.refill[plan.drafter] / 2)
        for index, acceptance in enumerate(self.acceptance):
            if index == plan.drafter:
                acceptance.observe(drafted, accepted)
                if self.stops_early[index] and confidence:
                    self.by_confidence[index].observe(confidence, accepted)
                if self.looks_first[index] and drafted:
                    self._bucket(index, match_length).observe(drafted, accepted)
            else:
                acceptance.fade(self.idle_memory)

    def _loss(self, index: int, drafted: int, accepted: int, caught_up: int = 0) -> float:
        """What a round of drafter `index` cost beyond the tokens it committed, in one-token passes of
        the batch as the cost model prices them (negative: a gain). Its pass and draft took
        (T(B, B + n) + D) / T(B, B) plain passes (a lookup asked first: D was paid when asked,
        `_asking`; a model drafter's D includes reading the `caught_up` tokens it had not read, so a
        probe after a long rest pays for its catch-up) and committed (accepted + 1 + B − 1) / B passes' worth."""
        rows = self.rows
        draft = 0.0 if self.looks_first[index] else self.costs.draft_seconds(self.names[index], drafted, caught_up)
        seconds = self.costs.batch_pass(rows, rows + self.verified[index](drafted)) + draft
        return seconds / self.costs.batch_pass(rows, rows) - (accepted + rows) / rows

    def _asking(self, index: int, plain: float) -> float:
        """What asking lookup `index` for its proposal cost, in one-token passes of the batch (`plain`: T(B, B))."""
        return self.costs.draft_seconds(self.names[index], max(self.gammas)) / plain

    def _nothing_found(self) -> str:
        """Why a plain round where no drafter had anything to weigh."""
        resting = [self.names[i] for i, first in enumerate(self.looks_first) if not first and self._allowed(i)]
        rest = (f"; {', '.join(resting)}, predicted to lose, weighed again in "
                f"{self.weigh_models_at - self.rounds} rounds" if resting and self.rounds < self.weigh_models_at else "")
        return self._spent() or f"plain: no lookup found anything worth verifying{rest}"

    def _spent(self) -> str:
        """Why a plain round where some drafters' allowances are spent: "" when none is."""
        spent = [index for index in range(len(self.names)) if not self._allowed(index)]
        if not spent:
            return ""
        share = LOSS_SHARE / len(self.names)
        waits = ", ".join(f"{self.names[i]} in {-self.bank[i] / (share * self.refill[i]):.0f}" for i in spent)
        return (f"plain: speculation lost more than its allowance ({LOSS_SHARE:.1%} of a pass a round, shared "
                f"by the drafters) with {', '.join(self.names[i] for i in spent)}; rounds until each may draft again: {waits}")

    def _log(self, plan: RoundPlan) -> None:
        last = self.decisions[-1] if self.decisions else None
        choice = (self.names[plan.drafter] if plan.drafter is not None else "plain", plan.gamma)
        if last and (last["drafter"], last["gamma"]) == choice or len(self.decisions) >= DECISION_LOG_LIMIT:
            return
        self.decisions.append({"round": self.rounds, "drafter": choice[0], "gamma": plan.gamma,
                               "predicted_speedup": round(plan.predicted_speedup, 3), "reason": plan.reason})
