"""Predicted next to what its rounds did: the acceptance models, fed with a run's own numbers.

For each drafter that drafted in a run:
    α          accepted / drafted over its rounds (drafted: draft positions, a tree's depth)
    γ          the mean number of draft positions it proposed in the rounds where it proposed any, rounded
    f          the share of its rounds where it proposed any (a lookup with no match proposes none,
               and that round is a plain step)
    c          its draft seconds in the run per drafted token, relative to a one-token target pass T(1)
    d          its draft seconds in the run per round, relative to T(1): what its proposals cost,
               those that found nothing included (a lookup is asked in rounds it does not draft in)
    n          the mean number of draft tokens its passes verified, rounded (a chain: γ; a tree: its nodes)
    v          the cost of a pass over n+1 tokens relative to T(1), both as the engine's rounds of those
               sizes cost on average over its life (`CostModel.observed_pass`: the measured curve,
               calibrated by every round it observed; the policy prices by the table alone)
    predicted  (f·E + (1 − f)) / (f·v + (1 − f) + d): the drafting rounds at E tokens each, plain
               steps for the rest, where E is the acceptance model's tokens per drafting round,
               averaged over the draft lengths the run proposed. The model (`acceptance_model`) is
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

Plain decoding's rate is, by preference, the one measured side by side (`plain_tokens_per_second`,
e.g. from `--compare` or a benchmark), else that of this run's own plain rounds (at least
MIN_PLAIN_ROUNDS of them), else 1 / T(1) from the cost model; the row says which.
"""

from __future__ import annotations

from specdec.control.cost_model import CostModel
from specdec.records.stats import GenerationStats
from specdec.control.theory import expected_tokens_per_pass, fit_runs

MIN_PLAIN_ROUNDS = 8


def plain_rate(stats: GenerationStats, costs: CostModel, measured: float | None = None) -> tuple[float, str]:
    """(plain decoding's tokens per second, where that number comes from)."""
    if measured:
        return measured, "plain run"
    plain = stats.by_drafter.get("plain")
    if plain and plain.rounds >= MIN_PLAIN_ROUNDS and plain.verify_seconds > 0:
        return plain.committed / (plain.draft_seconds + plain.verify_seconds), "plain rounds of this run"
    return 1 / costs.observed_pass(1), "cost model T(1)"


def _tally_model(name: str, tally, costs: CostModel) -> dict:
    """The acceptance models' inputs and outputs for one drafter's rounds (per round, in one-token passes)."""
    one_pass = costs.observed_pass(1)
    gamma = max(1, round(tally.drafted / tally.drafting_rounds))
    verified = max(1, round(tally.verified_tokens / tally.drafting_rounds))
    share = tally.drafting_rounds / tally.rounds
    alpha = tally.accepted / tally.drafted
    c = tally.draft_seconds / tally.drafted / one_pass
    draft = tally.draft_seconds / tally.rounds / one_pass  # per round, proposals that found nothing included
    verify = costs.observed_pass(verified + 1) / one_pass
    lengths = tally.lengths or {gamma: tally.drafting_rounds}  # draft positions → rounds (older records: the mean)

    def mean_tokens(expected) -> float:  # tokens per drafting round, over the run's draft lengths
        return sum(n * expected(k) for k, n in lengths.items()) / sum(lengths.values())

    iid = mean_tokens(lambda k: expected_tokens_per_pass(alpha, k))
    fit = fit_runs(tally.reached, tally.accepted_reached) if tally.reached else None
    model = mean_tokens(fit.expected_tokens) if fit else iid
    cost = share * verify + (1 - share) + draft
    return {
        "gamma": gamma, "verified_tokens": verified, "share": share, "alpha": alpha, "c": c, "draft": draft,
        "verify": verify,
        "cost": cost, "acceptance_model": "run-aware" if fit else "i.i.d.",
        "alpha_first": fit.first if fit else alpha, "alpha_then": fit.then if fit else alpha,
        "predicted_tokens": share * model + (1 - share),
        "iid_tokens": share * iid + (1 - share),
        "costed_tokens": share * (1 + tally.accepted / tally.drafting_rounds) + (1 - share),
    }


def predicted_speedup(stats: GenerationStats, costs: CostModel) -> float | None:
    """The prediction for a whole run (or merged runs): every drafter's rounds as in the breakdown
    (its acceptance model), plain rounds at one token per one-token pass; the prefill left out. None if nothing drafted."""
    tokens = cost = 0.0
    for name, tally in stats.by_drafter.items():
        if name != "plain" and tally.drafting_rounds:
            model = _tally_model(name, tally, costs)
            tokens += tally.rounds * model["predicted_tokens"]
            cost += tally.rounds * model["cost"]
        else:  # plain rounds, with what asking the lookups cost in them
            tokens += tally.rounds
            cost += tally.rounds + tally.draft_seconds / costs.observed_pass(1)
    return tokens / cost if stats.drafted and cost else None


def drafter_breakdown(stats: GenerationStats, costs: CostModel,
                      plain_tokens_per_second: float | None = None) -> list[dict]:
    rate, baseline = plain_rate(stats, costs, plain_tokens_per_second)
    rows = []
    for name, tally in stats.by_drafter.items():
        if name == "plain" or not tally.drafting_rounds:
            continue
        m = _tally_model(name, tally, costs)
        seconds = tally.draft_seconds + tally.verify_seconds
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
            "measured_speedup": round(tally.committed / seconds / rate, 3) if seconds else None,
            "baseline": baseline,
        })
    return rows
