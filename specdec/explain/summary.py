"""The summary panel: what the run did next to what the acceptance models predict from it."""

from __future__ import annotations

from specdec.control.analysis import drafter_breakdown
from specdec.control.cost_model import CostModel
from specdec.records.stats import GenerationStats
from specdec.terminal import past_the_end
from specdec.control.theory import expected_tokens_per_pass, expected_tokens_run_aware


def run_summary(stats: GenerationStats, costs: CostModel | None, plain: GenerationStats | None) -> dict:
    """Measured α, γ, MAT, speed-up; per drafter the formula's inputs and predictions; a worked example."""
    drafting_rounds = sum(t.drafting_rounds for name, t in stats.by_drafter.items() if name != "plain")
    out = {
        "new_tokens": stats.new_tokens, "target_passes": stats.target_passes, "rounds": stats.rounds,
        "drafted": stats.drafted, "accepted": stats.accepted, "verified_tokens": stats.verified_tokens,
        "alpha": stats.acceptance_rate, "mean_gamma": stats.drafted / drafting_rounds if drafting_rounds else 0.0,
        "mat": stats.mean_accepted_tokens, "past_the_end": past_the_end(stats), "tokens_per_second": stats.tokens_per_second,
        "plain_tokens_per_second": plain.tokens_per_second if plain else None,
        "speedup": stats.tokens_per_second / plain.tokens_per_second if plain and plain.tokens_per_second else None,
        "breakdown": [], "worked_example": [],
    }
    if costs is not None and stats.drafted:
        out["breakdown"] = drafter_breakdown(stats, costs, plain)
        main = max(out["breakdown"], key=lambda row: row["rounds"])
        out["worked_example"] = worked_example(main, out)
    return out


def worked_example(row: dict, measured: dict) -> list[str]:
    """The formulas (the seed's i.i.d. one, and the run-aware one where it applies) filled in with
    one drafter's numbers from the run, line by line."""
    alpha, gamma, c, v, f = row["alpha"], row["gamma"], row["c"], row["verify_cost"], row["drafting_share"]
    verified = row["verified_tokens"]  # a chain: γ; a tree: its nodes
    pass_tokens = f"γ + 1 = {gamma + 1}" if verified == gamma else f"its {verified} nodes + 1 = {verified + 1}"
    e = expected_tokens_per_pass(alpha, gamma)
    seed = e / (gamma * c + 1)
    costed = e / (gamma * c + v)
    lines = [
        f"{row['drafter']}: α = {alpha:.3f} (accepted / drafted), γ = {gamma} (mean draft positions per proposal, rounded), "
        f"c = {c:.4f} (draft cost per token / one target pass).",
        (f"Expected tokens per pass: E = (1 − α^(γ+1)) / (1 − α) = (1 − {alpha:.3f}^{gamma + 1}) / (1 − {alpha:.3f}) = {e:.2f}."
         if alpha < 1 else f"Expected tokens per pass: with α = 1 every draft is accepted, E = γ + 1 = {e:.2f}."),
        f"Seed formula: S = E / (γc + 1) = {e:.2f} / ({gamma} × {c:.4f} + 1) = {seed:.2f}×.",
        f"Here a pass over {pass_tokens} tokens costs v = {v:.2f} one-token passes: S = E / (γc + v) = "
        f"{e:.2f} / ({gamma} × {c:.4f} + {v:.2f}) = {costed:.2f}×.",
    ]
    if row.get("acceptance_model") == "run-aware":
        first, then = row["alpha_first"], row["alpha_then"]
        runs = expected_tokens_run_aware(first, then, gamma)
        lines.append(f"Acceptance comes in runs: α₁ = {first:.3f} (the first drafted token), β = {then:.3f} (a later one, "
                     f"given the one before was accepted): E = 1 + α₁(1 − β^γ)/(1 − β) = {runs:.2f}, "
                     f"S = E / (γc + v) = {runs / (gamma * c + v):.2f}× (the run-aware model, which the prediction uses).")
    model = "run-aware" if row.get("acceptance_model") == "run-aware" else "i.i.d."
    if f < 1:
        lines.append(f"It proposed something in f = {f:.2f} of its rounds (the rest were plain steps): "
                     f"(f·E + 1 − f) / (f·(γc + v) + 1 − f) = {row['predicted_speedup']:.2f}× "
                     f"({model} E, averaged over its draft lengths).")
    else:
        lines.append(f"Prediction ({model} E, averaged over its draft lengths): {row['predicted_speedup']:.2f}×.")
    lines.append(f"Measured: MAT {measured['mat']:.2f} tokens per pass over the whole run"
                 + (f"; this drafter's rounds committed tokens at {row['measured_speedup']:.2f}× plain decoding's rate "
                    f"({row['baseline']}; the run's speed-up, prefill and every round included, is in the summary)."
                    if row["measured_speedup"] is not None else "."))
    return lines
