"""Predicted next to measured: the seed formula, fed with a run's own numbers, beside what it did.

For each drafter that drafted in a run:
    α          accepted / drafted over its rounds (drafted: draft positions, a tree's depth)
    γ          the mean number of draft positions it proposed in the rounds where it proposed any, rounded
    f          the share of its rounds where it proposed any (a lookup with no match proposes none,
               and that round is a plain step)
    c          its measured draft cost per token, relative to a one-token target pass T(1)
    n          the mean number of draft tokens its passes verified, rounded (a chain: γ; a tree: its nodes)
    v          the measured cost of a pass over n+1 tokens, relative to T(1)
    predicted  (f·E + (1 − f)) / (f·(γc + v) + (1 − f)),  E = (1 − α^(γ+1)) / (1 − α):
               the seed formula for the rounds that drafted, plain steps for the rest
    costed     the same with E replaced by the measured 1 + accepted / drafting rounds: what the
               cost model predicts given the acceptance as it happened (acceptance is not i.i.d.
               across positions, so this and `predicted` differ; `costed` vs `measured` checks
               the cost model alone)
    measured   tokens its rounds committed per second, over plain decoding's tokens per second

Plain decoding's rate is, by preference, the one measured side by side (`plain_tokens_per_second`,
e.g. from `--compare` or a benchmark), else that of this run's own plain rounds (at least
MIN_PLAIN_ROUNDS of them), else 1 / T(1) from the cost model; the row says which.
"""

from __future__ import annotations

from specdec.cost_model import CostModel
from specdec.stats import GenerationStats
from specdec.theory import expected_tokens_per_pass

MIN_PLAIN_ROUNDS = 8


def plain_rate(stats: GenerationStats, costs: CostModel, measured: float | None = None) -> tuple[float, str]:
    """(plain decoding's tokens per second, where that number comes from)."""
    if measured:
        return measured, "plain run"
    plain = stats.by_drafter.get("plain")
    if plain and plain.rounds >= MIN_PLAIN_ROUNDS and plain.verify_seconds > 0:
        return plain.committed / (plain.draft_seconds + plain.verify_seconds), "plain rounds of this run"
    return 1 / costs.target_pass(1), "cost model T(1)"


def _tally_model(name: str, tally, costs: CostModel) -> dict:
    """The seed formula's inputs and outputs for one drafter's rounds (per round, in one-token passes)."""
    one_pass = costs.target_pass(1)
    gamma = max(1, round(tally.drafted / tally.drafting_rounds))
    verified = max(1, round(tally.verified_tokens / tally.drafting_rounds))
    share = tally.drafting_rounds / tally.rounds
    alpha = tally.accepted / tally.drafted
    c = costs.draft_seconds(name, gamma) / gamma / one_pass if name in costs.draft_costs else 0.0
    verify = costs.target_pass(verified + 1) / one_pass
    return {
        "gamma": gamma, "verified_tokens": verified, "share": share, "alpha": alpha, "c": c, "verify": verify,
        "cost": share * (gamma * c + verify) + (1 - share),
        "predicted_tokens": share * expected_tokens_per_pass(alpha, gamma) + (1 - share),
        "costed_tokens": share * (1 + tally.accepted / tally.drafting_rounds) + (1 - share),
    }


def predicted_speedup(stats: GenerationStats, costs: CostModel) -> float | None:
    """The seed formula for a whole run (or merged runs): every drafter's rounds as in the
    breakdown, plain rounds at one token per one-token pass; the prefill left out. None if nothing drafted."""
    tokens = cost = 0.0
    for name, tally in stats.by_drafter.items():
        if name != "plain" and tally.drafting_rounds:
            model = _tally_model(name, tally, costs)
            tokens += tally.rounds * model["predicted_tokens"]
            cost += tally.rounds * model["cost"]
        else:
            tokens += tally.rounds
            cost += tally.rounds
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
            "alpha": round(m["alpha"], 4), "c": round(m["c"], 4), "verify_cost": round(m["verify"], 3),
            "tokens_per_round": round(tally.committed / tally.rounds, 3),
            "predicted_speedup": round(m["predicted_tokens"] / m["cost"], 3),
            "costed_speedup": round(m["costed_tokens"] / m["cost"], 3),
            "measured_speedup": round(tally.committed / seconds / rate, 3) if seconds else None,
            "baseline": baseline,
        })
    return rows
