"""Predicted next to what its rounds did: the acceptance models, fed with a run's own numbers.

For each drafter that drafted in a run:
    α          accepted / drafted over its rounds (drafted: draft positions, a tree's depth)
    γ          the mean number of draft positions it proposed in the rounds where it proposed any, rounded
    f          the share of its rounds where it proposed any (a lookup with no match proposes none,
               and that round is a plain step)
    c          its draft seconds in the run per drafted token, relative to plain decoding's seconds per
               token (below), the unit of every figure here
    d          its draft seconds in the run per round, in that unit: what its proposals cost,
               those that found nothing included (a lookup is asked in rounds it does not draft in)
    n          the mean number of draft tokens its passes verified, rounded (a chain: γ; a tree: its nodes)
    v          the cost of a pass over n+1 tokens, in that unit, as the engine's rounds of that size
               cost on average over its life (`CostModel.observed_pass`: the measured curve,
               calibrated by every round it observed; the policy prices by the table alone)
    predicted  (f·E + (1 − f)) / (f·v + (1 − f)·u + d), u this engine's one-token pass (as v): the
               drafting rounds at E tokens each, plain steps for the rest, where E is the acceptance
               model's tokens per drafting round, averaged over the draft lengths the run proposed. The model (`acceptance_model`) is
               run-aware where the run kept counts per position: E = 1 + α₁(1 − β^γ)/(1 − β) with α₁
               the first position's acceptance and β the later positions' given the one before was
               (`theory.fit_runs`); the seed's i.i.d. E = (1 − α^(γ+1)) / (1 − α) otherwise, and
               always as `iid_speedup` beside it
    costed     the same with E replaced by the measured 1 + accepted / drafting rounds: what the
               cost model predicts given the acceptance as it happened (`costed` vs `measured`
               checks the cost model alone; `predicted` vs `costed` the acceptance model)
    its rounds tokens its rounds committed per second, over plain decoding's tokens per second
               (`measured_speedup`): a share of the run, not the run's speed-up, which counts the
               prefill and every round

Plain decoding's rate (in its rounds: the prefill left out) is, by preference, that of a plain run
beside (`--compare`, a benchmark), else that of this run's own plain rounds (at least
MIN_PLAIN_ROUNDS of them), else 1 / T(1) from the cost model; the row says which. Every figure above
is in plain decoding's seconds per token at that rate, and a plain round of this run costs this
engine's observed T(1) in those units. The whole run's prediction (`predicted_speedup`) adds the
prefill, as the run took it, to both sides: the speed-up it is checked against is a whole run's.
"""

from __future__ import annotations

from specdec.control.cost_model import CostModel
from specdec.records.stats import GenerationStats
from specdec.control.theory import expected_tokens_per_pass, fit_runs

MIN_PLAIN_ROUNDS = 8


def rounds_rate(tallies) -> float:
    """Tokens per second of some rounds (`RoundTally`s): what they committed over their draft and
    verify seconds, the prefill left out (0 where they took no time)."""
    tallies = list(tallies)
    seconds = sum(t.draft_seconds + t.verify_seconds for t in tallies)
    return sum(t.committed for t in tallies) / seconds if seconds else 0.0


def plain_rate(stats: GenerationStats, costs: CostModel, plain: GenerationStats | None = None) -> tuple[float, str]:
    """(plain decoding's tokens per second in its rounds, the prefill left out; where that number
    comes from): a plain run's beside, else this run's own plain rounds, else the cost model's T(1)."""
    beside = rounds_rate(plain.by_drafter.values()) if plain is not None else 0.0
    if beside:
        return beside, "plain run"
    rounds = stats.by_drafter.get("plain")
    if rounds and rounds.rounds >= MIN_PLAIN_ROUNDS and rounds.verify_seconds > 0:
        return rounds_rate([rounds]), "plain rounds of this run"
    return 1 / costs.observed_pass(1), "cost model T(1)"


def _tally_model(name: str, tally, costs: CostModel, one_pass: float) -> dict:
    """The acceptance models' inputs and outputs for one drafter's rounds, per round, in units of
    `one_pass`: plain decoding's seconds per token."""
    gamma = max(1, round(tally.drafted / tally.drafting_rounds))
    verified = max(1, round(tally.verified_tokens / tally.drafting_rounds))
    share = tally.drafting_rounds / tally.rounds
    alpha = tally.accepted / tally.drafted
    c = tally.draft_seconds / tally.drafted / one_pass
    draft = tally.draft_seconds / tally.rounds / one_pass  # per round, proposals that found nothing included
    verify = costs.observed_pass(verified + 1) / one_pass
    plain_step = costs.observed_pass(1) / one_pass  # a round it drafted nothing in: this engine's one-token pass
    lengths = tally.lengths or {gamma: tally.drafting_rounds}  # draft positions → rounds (older records: the mean)

    def mean_tokens(expected) -> float:  # tokens per drafting round, over the run's draft lengths
        return sum(n * expected(k) for k, n in lengths.items()) / sum(lengths.values())

    iid = mean_tokens(lambda k: expected_tokens_per_pass(alpha, k))
    fit = fit_runs(tally.reached, tally.accepted_reached) if tally.reached else None
    model = mean_tokens(fit.expected_tokens) if fit else iid
    cost = share * verify + (1 - share) * plain_step + draft
    return {
        "gamma": gamma, "verified_tokens": verified, "share": share, "alpha": alpha, "c": c, "draft": draft,
        "verify": verify,
        "cost": cost, "acceptance_model": "run-aware" if fit else "i.i.d.",
        "alpha_first": fit.first if fit else alpha, "alpha_then": fit.then if fit else alpha,
        "predicted_tokens": share * model + (1 - share),
        "iid_tokens": share * iid + (1 - share),
        "costed_tokens": share * (1 + tally.accepted / tally.drafting_rounds) + (1 - share),
    }


def predicted_speedup(stats: GenerationStats, costs: CostModel, plain: GenerationStats | None = None) -> float | None:
    """The prediction for a whole run (or merged runs), over plain decoding's rate (`plain_rate`):
    every drafter's rounds as in the breakdown (its acceptance model), plain rounds at this engine's
    one-token pass, and the prefill as this run took it on both sides (plain decoding prefills the
    same prompt): (P + N) / (P + N · cost / tokens), P the prefill and N the tokens its rounds
    committed, in plain tokens' seconds. None if nothing drafted."""
    if not stats.drafted:
        return None
    one_pass = 1 / plain_rate(stats, costs, plain)[0]
    tokens = cost = 0.0
    for name, tally in stats.by_drafter.items():
        if name != "plain" and tally.drafting_rounds:
            model = _tally_model(name, tally, costs, one_pass)
            tokens += tally.rounds * model["predicted_tokens"]
            cost += tally.rounds * model["cost"]
        else:  # plain rounds, with what asking the lookups cost in them
            tokens += tally.rounds
            cost += (tally.rounds * costs.observed_pass(1) + tally.draft_seconds) / one_pass
    if not cost:
        return None
    committed = sum(t.committed for t in stats.by_drafter.values())
    prefill = stats.prefill_seconds / one_pass
    return (prefill + committed) / (prefill + committed * cost / tokens)


def drafter_breakdown(stats: GenerationStats, costs: CostModel, plain: GenerationStats | None = None) -> list[dict]:
    """Per drafter: its rounds' inputs to the acceptance models, their predictions and what its rounds
    measured, each × plain decoding's rate in its rounds (`plain_rate`; `plain`: a plain run beside)."""
    rate, baseline = plain_rate(stats, costs, plain)
    rows = []
    for name, tally in stats.by_drafter.items():
        if name == "plain" or not tally.drafting_rounds:
            continue
        m = _tally_model(name, tally, costs, 1 / rate)
        measured = rounds_rate([tally])
        rows.append({
            "drafter": name, "rounds": tally.rounds, "drafting_share": round(m["share"], 3), "gamma": m["gamma"],
            "verified_tokens": m["verified_tokens"],
            "alpha": round(m["alpha"], 4), "c": round(m["c"], 4), "draft_per_round": round(m["draft"], 4),
            "verify_cost": round(m["verify"], 3),
            "acceptance_model": m["acceptance_model"], "alpha_first": round(m["alpha_first"], 4),
            "alpha_then": round(m["alpha_then"], 4),
            "tokens_per_round": round(tally.committed / tally.rounds, 3),
            "predicted_speedup": round(m["predicted_tokens"] / m["cost"], 3),
            "iid_speedup": round(m["iid_tokens"] / m["cost"], 3),
            "costed_speedup": round(m["costed_tokens"] / m["cost"], 3),
            "measured_speedup": round(measured / rate, 3) if measured else None,
            "baseline": baseline,
        })
    return rows
