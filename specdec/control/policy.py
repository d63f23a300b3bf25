"""Each round's drafter and draft length, chosen from the acceptance estimates and the cost table.

For drafter d, with α_i its estimate of P(draft position i accepted | positions < i were)
(`acceptance.py`), and B rows sharing the pass (1: a request alone):

    E_d(γ)    = 1 + Σ_{i=1..γ} Π_{j≤i} α_j                               tokens a round commits
    S_d(γ; B) = (E_d(γ) + B − 1) / B · T(B, B) / (T(B, B + n_d(γ)) + D_d(γ))    predicted speed-up

n_d(γ) is the number of draft tokens verified (γ for a chain, the node count for a token tree of
depth γ), T(B, N) the cost table's time of a pass over B rows holding N tokens, at the row's context
(the tokens in its cache: attention makes wide passes dearer as it grows), and D_d(γ) its time for
d to draft γ tokens (`control/cost_model/`), a model drafter's including the committed tokens it
would read first (`choose(behind=)`, the rounds it sat out). With i.i.d. α, B = 1 and T(k) = T(1)
this is the seed formula (1 − α^(γ+1)) / ((1 − α)(γc + 1)). Once the batch's pass is compute-bound,
extra tokens cost what they weigh and S falls below 1: speculation fades out as the batch fills.

The rule, each round:

1. Lookups (`DrafterTraits.looks_up`: n-gram, suffix), which cost almost nothing to ask, are asked
   first for up to max γ tokens, and each proposal becomes an offer: its prefix with the best S,
   computed from the acceptance seen after matches of the same length in the same text (one
   estimate per source and match length: the request's own text and a corpus of other texts predict
   very different acceptance). Of a proposal matched in both texts (`Draft.alternative`), the one
   with the better offer. The model drafters (the others) are weighed by their own estimates at
   every γ.
2. The candidate with the largest S above 1 drafts: a lookup where the text repeats itself, a model
   where it does not. With γ fixed by hand, the best drafter at that γ drafts, whatever S says.
3. Where none predicts a gain, a drafter due for a probe drafts (`explorer.py`: the schedule, from
   what a probe could lose and whether the drafter could gain, and its worst case); otherwise the
   round is plain.
4. A chain drafter that says how sure it is of each token (`stops_early`: an EAGLE-3 chain) drafts
   while one more token could pay (`keep_drafting`: S(k + 1), the next token as likely as the best
   confidence bucket, above S(k)), from the acceptance seen at each confidence (`acceptance.py`).

Model drafters predicted to lose are weighed again only after REWEIGH_AFTER rounds, when one's probe
falls due, or when the batch's size changed (predicting them costs ~50 µs, ~1% of a 135M round).

The choice reads the acceptance estimates (fed the accepted counts, nothing else), the round count,
what the lookups proposed and the cost table as cached: never a clock. The engine's timing of real
rounds goes to the cost model's calibration, which the analysis of a run and the table's drift check
read (`cost_model/model.py`), not the choice. So a greedy request's rounds depend on its tokens and
the cost table alone: the same prompt gives the same rounds in any process, whatever ran before it
or however busy the machine was. A new request on the same engine with the same settings and
temperature starts from the acceptance the last one ended with, its recent evidence halved
(`continue_from`), and from its probe schedule.

None of this touches exactness: every round is verified by the same lossless rule whatever γ and
drafter were chosen, and the choice depends only on the past (a lookup's proposal depends only on
the committed tokens, and which prefix is kept only on its length and match length; whether a chain
drafts token k + 1 only on the tokens before it). How the rule came about, and the allowance it
replaced: docs/bench/POLICY-HISTORY.md.
"""

from __future__ import annotations

import dataclasses
import functools
from collections.abc import Callable
from dataclasses import dataclass

from specdec.control.acceptance import ConfidenceAcceptance, PositionAcceptance
from specdec.control.cost_model import CostModel
from specdec.control.explorer import Explorer, longest_rest, probe_interval
from specdec.drafters.base import REQUEST, Draft

FREE_SHARE = 0.02  # a drafter whose longest draft costs at most this share of a one-token pass is "free"
MATCH_BUCKETS = 6  # lookups' acceptance is kept apart by match length 0, 1, ... 6 (6 = 6 or more)
CARRY = 0.5  # share of its evidence a request's policy passes on to the next request on the same engine
DECISION_LOG_LIMIT = 200
REWEIGH_AFTER = 8  # rounds before model drafters all predicted to lose are weighed again (a probe due: at once)


def _chain(gamma: int) -> int:
    return gamma


@dataclass(frozen=True)
class DrafterTraits:
    """What the policy knows of a drafter, in one place."""

    name: str
    verified: Callable[[int], int] = _chain  # γ → draft tokens in the verification pass (a tree: its nodes)
    stops_early: bool = False  # drafts while `keep_drafting` says its confidence pays
    looks_up: bool = False  # proposes what followed a match in the text (asked before the choice, if free)

    @classmethod
    def of(cls, drafter) -> DrafterTraits:
        """The traits of a `Drafter`."""
        return cls(drafter.name, drafter.verified_tokens, drafter.stops_early, drafter.looks_up)


@dataclass(frozen=True)
class RoundPlan:
    drafter: int | None  # index into the engine's drafters; None: a plain round
    gamma: int  # tokens to draft (0 for a plain round)
    predicted_speedup: float  # S of this choice (1.0 for a plain round)
    explanation: str | Callable[[], str]  # why, or what writes it when asked: few rounds' reasons are read
    proposal: Draft | None = None  # a lookup's plan: the tokens of its proposal to verify (γ of them)

    @property
    def reason(self) -> str:
        """Why this plan, in words (written when first read: read it before the policy observes the
        round, whose estimates it quotes; `settled`)."""
        return self.explanation if isinstance(self.explanation, str) else self.explanation()

    def settled(self) -> RoundPlan:
        """The same plan with its reason written now."""
        return self if isinstance(self.explanation, str) else dataclasses.replace(self, explanation=self.reason)


class FixedPolicy:
    """γ fixed by hand, one drafter: every round drafts `gamma` tokens."""

    def __init__(self, gamma: int) -> None:
        self.plan = RoundPlan(0, gamma, float("nan"), f"γ = {gamma} fixed by hand")
        self.decisions: list[dict] = []

    asks_first: list[int] = []  # no drafter is asked before the choice

    def choose(self, rows: int = 1, proposals: dict | None = None, behind: dict[int, int] | None = None,
               context: int | None = None) -> RoundPlan:
        return self.plan  # γ fixed by hand: nothing to weigh

    def keep_drafting(self, plan: RoundPlan, rows: int = 1) -> None:
        return None  # γ fixed by hand: every token of it is drafted

    def observe(self, plan: RoundPlan, drafted: int, accepted: int, match_length: int = 0,
                confidence: list[float] | None = None, caught_up: int = 0, source: str = REQUEST) -> None:
        pass


class AdaptivePolicy:
    """Chooses the drafter and γ each round to maximise predicted speed-up; decodes plainly where none
    pays, probing the drafters now and then (module docstring: the rule)."""

    def __init__(self, costs: CostModel, drafters: list[DrafterTraits | str], max_gamma: int = 8,
                 fixed_gamma: int | None = None, prior: float = 0.6, memory: float = 0.9,
                 idle_memory: float = 0.98) -> None:
        self.costs = costs
        self.drafters = [d if isinstance(d, DrafterTraits) else DrafterTraits(d) for d in drafters]
        self.names = [d.name for d in self.drafters]
        self.gammas = [fixed_gamma] if fixed_gamma else list(range(1, max_gamma + 1))
        self.may_fall_back = fixed_gamma is None  # a γ fixed by hand is kept, even when it loses
        # per drafter: [n(1) .. n(max γ)], the draft tokens verified at each depth
        self.verified_counts = [[d.verified(gamma) for gamma in range(1, max(self.gammas) + 1)] for d in self.drafters]
        self.acceptance = [PositionAcceptance(prior, memory, positions=max(self.gammas)) for _ in self.drafters]
        # lookups: (source, match length) → α
        self.by_match: list[dict[tuple[str, int], PositionAcceptance]] = [{} for _ in self.drafters]
        self.by_confidence = [ConfidenceAcceptance(memory) for _ in self.drafters]
        one_pass = costs.target_pass(1)
        self.free = [costs.draft_seconds(d.name, max(self.gammas)) <= FREE_SHARE * one_pass for d in self.drafters]
        # free lookups, asked every round before the choice (with γ fixed by hand: chosen like the others)
        self.looks_first = [d.looks_up and free and self.may_fall_back for d, free in zip(self.drafters, self.free)]
        self.prior, self.memory, self.idle_memory = prior, memory, idle_memory
        self.explorer = Explorer(len(self.drafters))
        self.rounds = 0
        self.behind: dict[int, int] = {}  # this round's model drafters → committed tokens they would read first
        self.probing: int | None = None  # the drafter this round probes, if it is a probe
        self.hopes: dict[int, bool] = {}  # this round's model drafters → could they pay at their hopeful acceptance
        self.rows = 1  # rows sharing this round's pass
        self.context: int | None = None  # cached tokens before this round's pass (None: priced at the table's)
        self.weigh_models_at = 0  # the round from which the model drafters are weighed again (`REWEIGH_AFTER`)...
        self.judged_rows = 1  # ...or a round with other than the rows they were judged with
        self.decisions: list[dict] = []  # the choices, logged when they change

    def continue_from(self, earlier: AdaptivePolicy, keep: float = CARRY) -> None:
        """Start from what an earlier request on the same engine learned (same drafters and γs), its
        recent evidence discounted by `keep` (the long-run estimates kept whole): a new request begins
        near the acceptance seen lately, and its own rounds soon outweigh what it inherited. The probe
        schedule carries on too, so short requests do not each probe a model drafter at once; a lookup
        is due at its first proposal (`explorer.py`)."""
        if earlier.names != self.names or earlier.gammas != self.gammas:
            return
        self.acceptance = [a.faded_copy(keep) for a in earlier.acceptance]
        self.by_match = [{key: bucket.faded_copy(keep) for key, bucket in buckets.items()} for buckets in earlier.by_match]
        self.by_confidence = [c.faded_copy(keep) for c in earlier.by_confidence]
        self.explorer.carry_from(earlier.explorer, fresh=self.asks_first)  # a lookup: due on the new text

    @property
    def asks_first(self) -> list[int]:
        """The drafters (free lookups) whose proposals `choose` wants every round, asked for up to max γ."""
        return [index for index, first in enumerate(self.looks_first) if first]

    def _largest_pass(self) -> int:
        """The most draft tokens a candidate of this round can put in the pass: a lookup's longest
        proposal, or the largest tree of a model drafter."""
        return max([max(self.gammas), *(max(counts) for index, counts in enumerate(self.verified_counts)
                                        if not self.looks_first[index])])

    def predictions(self, rows: int = 1, passes: list[float] | None = None,
                    behind: dict[int, int] | None = None) -> list[tuple[float, int, int]]:
        """(S, drafter index, γ) for every candidate but the lookups asked first, with `rows` rows
        sharing the pass (`passes`: the round's `CostModel.pass_prices`; `behind`: as in `choose`)."""
        passes = passes if passes is not None else self.costs.pass_prices(rows, self._largest_pass(), self.context)
        behind = behind or {}
        out = []
        for index, name in enumerate(self.names):
            if self.looks_first[index]:
                continue
            expected = self.acceptance[index].expected_tokens_up_to(max(self.gammas))
            speedups = self.costs.predicted_speedups(name, expected, self.verified_counts[index], rows, passes,
                                                     behind.get(index, 0))
            out += [(speedups[gamma - 1], index, gamma) for gamma in self.gammas]
        return out

    def offer(self, index: int, draft: Draft, rows: int = 1,
              passes: list[float] | None = None) -> tuple[tuple[float, int, int], Draft] | None:
        """A lookup's proposal (a chain, and its alternative if it has one) as a candidate (S, index, k)
        and the proposal it is of: the prefix of k ≥ 1 tokens with the best predicted S, from the
        acceptance seen after matches as long as this one's in the same text (S may be below 1: the
        chooser then takes it only as a probe); None for an empty proposal."""
        best = None
        for choice in draft.choices():
            if not len(choice):
                continue
            if choice.parents is not None:
                raise ValueError(f"{self.names[index]} looks up chains; it proposed a tree")
            expected = self._bucket(index, choice.match_length, choice.source).expected_tokens_up_to(len(choice))
            prices = passes if passes is not None else self.costs.pass_prices(rows, len(choice), self.context)
            speedups = self.costs.predicted_speedups(self.names[index], expected, rows=rows, passes=prices)
            k = max(range(1, len(speedups) + 1), key=lambda k: (speedups[k - 1], -k))
            if best is None or speedups[k - 1] > best[0][0]:
                best = (speedups[k - 1], index, k), choice
        return best

    def worst_loss(self, index: int, gamma: int, rows: int = 1, passes: list[float] | None = None) -> float:
        """What a round of drafter `index` drafting γ deep loses if none of its tokens is accepted, in
        one-token passes of the batch as the cost table prices them (a model drafter's catch-up included)."""
        count = self.verified_counts[index][gamma - 1] if not self.looks_first[index] else gamma
        passes = passes if passes is not None else self.costs.pass_prices(rows, count, self.context)
        draft = 0.0 if self.looks_first[index] else self.costs.draft_seconds(self.names[index], gamma,
                                                                            self.behind.get(index, 0))
        return (passes[count] + draft) / passes[0] - 1

    def choose(self, rows: int = 1, proposals: dict | None = None, behind: dict[int, int] | None = None,
               context: int | None = None) -> RoundPlan:
        """This round's plan, for a row among `rows` sharing the pass (1: a request alone), with
        `context` tokens in its cache before the pass (passes are priced at it: `CostModel.target_pass`).
        `proposals`: what the drafters of `asks_first` proposed this round ({index: Draft}); when the
        plan takes one (or its alternative), `plan.proposal` holds the γ tokens of it to verify. `behind`: {index: committed tokens
        a model drafter would read first} (`Drafter.catch_up_tokens`; missing: 0), priced into its
        predictions, so that one that sat out many rounds is weighed with the catch-up it would pay."""
        self.rounds += 1
        self.rows = rows
        self.context = context
        self.explorer.tick()
        self.probing = None
        self.hopes = {}
        proposals = proposals or {}
        self.behind = behind or {}
        weigh_models = not self.may_fall_back or self.rounds >= self.weigh_models_at or rows != self.judged_rows
        found = any(len(draft) for draft in proposals.values())
        if not weigh_models and not found:  # most rounds of a lookup alone: its match is too short to propose
            plan = RoundPlan(None, 0, 1.0, self._nothing_found)
            self._log(plan)
            return plan
        passes = self.costs.pass_prices(rows, self._largest_pass(), context)  # the round's prices, for every candidate
        predictions = self.predictions(rows, passes, self.behind) if weigh_models else []
        weighed = {index: offer for index, draft in proposals.items() if (offer := self.offer(index, draft, rows, passes))}
        offers = [candidate for candidate, _ in weighed.values()]
        proposals = {index: proposal for index, (_, proposal) in weighed.items()}  # the one each offer is of
        best = self._best(predictions)
        offered = self._best(offers)
        # the reasons are written only if read (the decision log, a trace), before the round is observed
        why_best = functools.partial(self._why, *best) if best else None
        if best and not self.may_fall_back:  # γ fixed by hand: the best drafter at that γ, whatever S says
            plan = RoundPlan(best[1], best[2], best[0], lambda: f"best predicted at γ fixed by hand: {why_best()}")
        elif (overdue := self._overdue(predictions, offers, rows, passes)) is not None:
            plan = self._probe(overdue, proposals, rows, passes,
                               f"{longest_rest(self.hopeful(overdue[1], rows, passes))} rounds without drafting")
        elif best and best[0] >= 1 and not (offered and offered[0] > best[0]):
            speedup, index, gamma = best
            plan = RoundPlan(index, self._ask(index, gamma), speedup, lambda: f"best predicted: {why_best()}")
        elif offered and offered[0] >= 1:
            others = (lambda: f"better than {why_best()}") if best and best[0] >= 1 else \
                (lambda: f"no other drafter is predicted to beat plain decoding; the best: {why_best()}") if best \
                else (lambda: "no other drafter weighed")
            plan = self._lookup_plan(offered, proposals, others)
        else:  # nothing predicted to pay: a probe if one is due, else plain
            each = self._best_of_each(predictions + offers)
            due = [c for c in each if self.explorer.due(c[1], self.worst_loss(c[1], c[2], rows, passes),
                                                        self.hopeful(c[1], rows, passes))]
            probe = self._best(due)
            plan = (self._probe(probe, proposals, rows, passes, "its probe is due") if probe
                    else RoundPlan(None, 0, 1.0, self._plain_reason(each, rows, passes)))
        if predictions and best[0] < 1 and self.may_fall_back:  # weighed again in REWEIGH_AFTER rounds, or at a probe
            waits = [self.explorer.rounds_left(i, self.worst_loss(i, g, rows, passes), self.hopeful(i, rows, passes))
                     for _, i, g in self._best_of_each(predictions)]
            self.weigh_models_at = self.rounds + max(1, min(REWEIGH_AFTER, *waits))
            self.judged_rows = rows
        self._log(plan)
        return plan

    @staticmethod
    def _best(candidates: list[tuple[float, int, int]]) -> tuple[float, int, int] | None:
        """The candidate with the largest S (ties: the shorter draft, then the first drafter)."""
        return max(candidates, key=lambda c: (c[0], -c[2], -c[1])) if candidates else None

    def _best_of_each(self, candidates: list[tuple[float, int, int]]) -> list[tuple[float, int, int]]:
        """Each drafter's best candidate."""
        best: dict[int, tuple[float, int, int]] = {}
        for candidate in candidates:
            index = candidate[1]
            if index not in best or self._best([best[index], candidate]) is candidate:
                best[index] = candidate
        return list(best.values())

    def _overdue(self, predictions: list, offers: list, rows: int, passes: list[float]) -> tuple[float, int, int] | None:
        """The best candidate of a drafter that has rested its longest (`explorer.longest_rest`), if any.
        Whether it could pay is priced only for those past PROBE_MAX (no shorter rest is overdue)."""
        rested = [c for c in predictions + offers if self.explorer.overdue(c[1])]
        return self._best([c for c in rested if self.explorer.overdue(c[1], self.hopeful(c[1], rows, passes))])

    def hopeful(self, index: int, rows: int, passes: list[float]) -> bool:
        """Whether drafter `index` would beat plain decoding at some γ at its hopeful acceptance (its
        long-run estimate a standard error up, at every position: `acceptance.py`), at this round's
        prices, its catch-up aside (paid once, and priced in what its probe could lose): a model
        drafter that would not is probed DOUBT times less often (`explorer.py`). A lookup: always."""
        if self.looks_first[index]:
            return True
        if index not in self.hopes:
            expected = self.acceptance[index].hopeful_expected_tokens_up_to(max(self.gammas))
            speedups = self.costs.predicted_speedups(self.names[index], expected, self.verified_counts[index], rows,
                                                     passes)
            self.hopes[index] = max(speedups[gamma - 1] for gamma in self.gammas) >= 1
        return self.hopes[index]

    def _probe(self, candidate: tuple[float, int, int], proposals: dict, rows: int, passes: list[float],
               why: str) -> RoundPlan:
        """The plan that drafts `candidate` to check its estimate."""
        speedup, index, gamma = candidate
        self.probing = index
        rested, worst = self.explorer.since[index], self.worst_loss(index, gamma, rows, passes)
        hopeful = self.hopeful(index, rows, passes)
        doubt = "" if hopeful else " and would lose even at its hopeful acceptance"
        probing = (lambda: f"probe ({why}: {self.names[index]} rested {rested} rounds; one due every "
                           f"{probe_interval(worst, hopeful)}, as it could lose {worst:.2f} of a pass{doubt})")
        if index in proposals:
            return self._lookup_plan(candidate, proposals, probing)
        return RoundPlan(index, self._ask(index, gamma), speedup, lambda: f"{probing()}: {self._why(*candidate)}")

    def _lookup_plan(self, lookup: tuple[float, int, int], proposals: dict, why: Callable[[], str]) -> RoundPlan:
        """The plan that verifies the first k tokens of a lookup's proposal (`why`: the others' side)."""
        speedup, index, keep = lookup
        proposal = proposals[index]
        match, proposed = proposal.match_length, len(proposal)
        where = "earlier in the text" if proposal.source == REQUEST else f"in its {proposal.source}"
        return RoundPlan(index, keep, speedup, lambda: f"{self.names[index]} found the last {match} tokens {where}: "
                                                       f"verifying {keep} of the {proposed} tokens that followed "
                                                       f"them, predicted {speedup:.2f}× plain decoding ({why()})",
                         proposal.prefix(keep))

    def _ask(self, index: int, gamma: int) -> int:
        """A drafter that stops drafting by itself (`keep_drafting`) is asked for max γ."""
        return max(self.gammas) if self.drafters[index].stops_early and self.may_fall_back else gamma

    def keep_drafting(self, plan: RoundPlan, rows: int = 1) -> Callable[[list[float]], bool] | None:
        """For a drafter that `stops_early`: whether, after tokens of these confidences, one more
        could pay (S(k + 1), the next token as likely as the best confidence bucket, above S(k)).
        None: draft what the plan asks (γ fixed by hand, or another drafter)."""
        if plan.drafter is None or not self.drafters[plan.drafter].stops_early or not self.may_fall_back:
            return None
        name, estimates = self.names[plan.drafter], self.by_confidence[plan.drafter]
        best = estimates.best()

        def go_on(confidence: list[float]) -> bool:
            k, (expected, survive) = len(confidence), estimates.outlook(confidence)
            return (self.costs.predicted_speedup(name, k + 1, expected + survive * best, rows=rows, context=self.context)
                    > self.costs.predicted_speedup(name, k, expected, rows=rows, context=self.context))

        return go_on

    def _why(self, speedup: float, index: int, gamma: int) -> str:
        if self.looks_first[index]:  # an offer: its estimate is its match length's
            return f"{self.names[index]} verifying {gamma} of its proposal: predicted {speedup:.2f}× plain decoding"
        alphas = ", ".join(f"{a:.2f}" for a in self.acceptance[index].alphas(gamma))
        behind = self.behind.get(index, 0)
        reading = f", first reading the {behind} committed tokens it sat out" if behind else ""
        return (f"{self.names[index]} drafting {gamma}{reading}: predicted {speedup:.2f}× plain decoding "
                f"(chance of acceptance by position: {alphas})")

    def _plain_reason(self, each: list, rows: int, passes: list[float]) -> Callable[[], str]:
        """Why a plain round where each drafter's best candidate is in `each` (written when read)."""
        if not each:
            return self._nothing_found

        def reason() -> str:
            waits = ", ".join(f"{self.names[i]} in "
                              f"{self.explorer.rounds_left(i, self.worst_loss(i, g, rows, passes), self.hopeful(i, rows, passes))}"
                              for _, i, g in sorted(each, key=lambda c: c[1]))
            return (f"plain: nothing is predicted to beat plain decoding (the best: {self._why(*self._best(each))}); "
                    f"next probes: {waits} rounds")

        return reason

    def _bucket(self, index: int, match_length: int, source: str) -> PositionAcceptance:
        """Lookup `index`'s estimate after a match of this length found in `source` (its request's text
        or a corpus: the same match length predicts very different acceptance in each)."""
        key = (source, min(match_length, MATCH_BUCKETS))
        if key not in self.by_match[index]:
            self.by_match[index][key] = PositionAcceptance(self.prior, self.memory, positions=max(self.gammas))
        return self.by_match[index][key]

    def observe(self, plan: RoundPlan, drafted: int, accepted: int, match_length: int = 0,
                confidence: list[float] | None = None, caught_up: int = 0, source: str = REQUEST) -> None:
        """A round of `plan` drafted `drafted` tokens deep and `accepted` of them were; a lookup's
        proposal followed a match of `match_length` tokens found in `source`, a chain said `confidence`
        of each token.
        (`caught_up`, the committed tokens a model drafter read first, is part of the engine's
        interface; the choice priced it already.)"""
        if plan.drafter is None:
            return  # a plain round: no evidence, and nothing fades (coming back is the probes' job)
        self.explorer.drafted(plan.drafter)
        if self.probing == plan.drafter and drafted:  # a probe that paid, at the table's prices: another at once
            if accepted + 1 > 1 + self.worst_loss(plan.drafter, drafted, self.rows):
                self.explorer.fresh.add(plan.drafter)
        for index, acceptance in enumerate(self.acceptance):
            if index == plan.drafter:
                acceptance.observe(drafted, accepted)
                if self.drafters[index].stops_early and confidence:
                    self.by_confidence[index].observe(confidence, accepted)
                if self.looks_first[index] and drafted:
                    self._bucket(index, match_length, source).observe(drafted, accepted)
            else:
                acceptance.fade(self.idle_memory)

    def _nothing_found(self) -> str:
        """Why a plain round where no drafter had anything to weigh."""
        resting = [self.names[i] for i, first in enumerate(self.looks_first) if not first]
        rest = (f"; {', '.join(resting)}, predicted to lose, weighed again in "
                f"{self.weigh_models_at - self.rounds} rounds" if resting and self.rounds < self.weigh_models_at else "")
        return f"plain: no lookup found anything worth verifying{rest}"

    def _log(self, plan: RoundPlan) -> None:
        last = self.decisions[-1] if self.decisions else None
        choice = (self.names[plan.drafter] if plan.drafter is not None else "plain", plan.gamma)
        if last and (last["drafter"], last["gamma"]) == choice or len(self.decisions) >= DECISION_LOG_LIMIT:
            return
        self.decisions.append({"round": self.rounds, "drafter": choice[0], "gamma": plan.gamma,
                               "predicted_speedup": round(plan.predicted_speedup, 3), "reason": plan.reason})
