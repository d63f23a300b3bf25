"""`specdec plan`: expected tokens per pass and speed-up from α, γ and c (the formulas, no model)."""

from __future__ import annotations

import json

from specdec.errors import SpecdecError
from specdec.options import add_json_arg


def add_arguments(plan) -> None:
    plan.add_argument("--alpha", type=float, required=True,
                      help="acceptance rate per drafted token, in [0, 1] (with --then: of the first drafted token)")
    plan.add_argument("--then", type=float, default=None,
                      help="run-aware acceptance: the chance a later drafted token is accepted given the one before "
                           "was (default: i.i.d., the seed formula)")
    plan.add_argument("--c", type=float, required=True, help="cost of one draft step / cost of one target pass")
    plan.add_argument("--gamma", type=int, default=None, help="a draft length to evaluate (default: show 1..max)")
    plan.add_argument("--max-gamma", type=int, default=12, help="the longest draft shown (default: 12)")
    plan.add_argument("--verify-cost", type=float, default=1.0,
                      help="cost of a target pass over γ+1 tokens / a one-token pass (default 1, as in the formula)")
    add_json_arg(plan, "the table")


def run(args, console) -> int:
    from rich.table import Table

    from specdec.control.theory import (best_gamma, expected_speedup, expected_speedup_run_aware, expected_tokens_per_pass,
                                expected_tokens_run_aware)

    if args.max_gamma < 1:
        raise SpecdecError(f"--max-gamma must be >= 1, got {args.max_gamma}")
    if args.gamma is not None and args.gamma < 1:
        raise SpecdecError(f"--gamma must be >= 1, got {args.gamma}")
    if args.verify_cost <= 0:
        raise SpecdecError(f"--verify-cost must be > 0, got {args.verify_cost}")
    gammas = [args.gamma] if args.gamma else list(range(1, args.max_gamma + 1))

    def tokens_and_speedup(g: int) -> tuple[float, float]:
        if args.then is None:
            return expected_tokens_per_pass(args.alpha, g), expected_speedup(args.alpha, g, args.c, args.verify_cost)
        return (expected_tokens_run_aware(args.alpha, args.then, g),
                expected_speedup_run_aware(args.alpha, args.then, g, args.c, args.verify_cost))

    if args.then is None:
        model = "i.i.d. acceptance (seed formula): E = (1 − α^(γ+1)) / (1 − α)"
        title = f"α = {args.alpha}, c = {args.c}, verify cost = {args.verify_cost}"
    else:
        model = "run-aware acceptance: E = 1 + α₁(1 − β^γ) / (1 − β)"
        title = f"α₁ = {args.alpha}, β = {args.then}, c = {args.c}, verify cost = {args.verify_cost}"
    table = Table(title=title)
    for col in ("γ", "E[tokens per pass]", "speed-up"):
        table.add_column(col, justify="right")
    rows = []
    for g in gammas:
        tokens, speed = tokens_and_speedup(g)
        rows.append({"gamma": g, "tokens_per_pass": round(tokens, 4), "speedup": round(speed, 4)})
        table.add_row(str(g), f"{tokens:.3f}", f"{speed:.3f}")
    console.print(table)
    console.print(f"model: {model}")
    best, best_speed = best_gamma(args.alpha, args.c, args.max_gamma, args.verify_cost, then=args.then)
    verdict = "speculate" if best_speed > 1 else "plain decoding is faster"
    console.print(f"best γ in 1..{args.max_gamma}: {best} (speed-up {best_speed:.3f}): {verdict}")
    if args.json:
        print(json.dumps({"model": "i.i.d." if args.then is None else "run-aware", "rows": rows, "best_gamma": best,
                          "best_speedup": round(best_speed, 4)}))
    return 0
