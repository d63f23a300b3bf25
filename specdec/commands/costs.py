"""`specdec costs`: this machine's cost model for a model and its drafters, measured once and cached."""

from __future__ import annotations

import json

from specdec.errors import SpecdecError
from specdec.options import add_json_arg, add_target_args, load_engine
from specdec.terminal import figures_table, table_title


def add_arguments(costs) -> None:
    add_target_args(costs)
    costs.add_argument("--remeasure", action="store_true", help="measure again, replacing the cached numbers")
    add_json_arg(costs, "the cost model")


def spread_text(spread: float | None) -> str:
    """A measurement's spread in the `costs` tables ("–": not recorded, e.g. a point of T(N) measured for rows)."""
    return "–" if spread is None else f"{spread:.0%}"


def run(args, console) -> int:
    from rich.table import Table

    from specdec.control.cost_model import costs_dir, load_or_measure

    if not 1 <= args.max_gamma <= 16:
        raise SpecdecError(f"--max-gamma must be in [1, 16], got {args.max_gamma}")
    engine = load_engine(args, console)
    target = engine.target
    with console.status("measuring the cost model on this machine" if args.remeasure else "reading the cost model"):
        costs = load_or_measure(target, engine.drafters, args.max_gamma, remeasure=args.remeasure)
    engine.cost_model = costs
    one = costs.target_pass(1)
    # the model's folder and the CPU's name, as long as the host makes them: wrapped within the table
    table = Table(title=table_title(f"target passes after {costs.context} cached tokens: {target.name} on "
                                    f"{costs.description['machine']['processor']}"))
    columns = ["tokens scored", "ms", "× one-token pass", "spread"]
    if costs.per_context:  # what 1,000 more cached tokens add, and the shape there
        columns[3:3] = ["+ ms per 1k cached", f"× at {costs.context + 1000}"]
    for col in columns:
        table.add_column(col, justify="right")
    longer = costs.context + 1000
    for size in sorted(costs.pass_seconds):
        cells = [str(size), f"{costs.pass_seconds[size] * 1000:.2f}", f"{costs.target_pass(size) / one:.2f}",
                 spread_text(costs.pass_spread.get(size))]
        if costs.per_context:
            cells[3:3] = [f"{costs.per_context.get(size, 0.0) * 1e6:.2f}",
                          f"{costs.target_pass(size, longer) / costs.target_pass(1, longer):.2f}"]
        table.add_row(*cells)
    console.print(table)
    drafts = figures_table("draft cost: per proposal + per drafted token", "drafter",
                           ("per proposal (ms)", "per token (ms)", "c = per token / T(1)", "spread"))
    for d in engine.drafters:
        cost = costs.draft_costs[d.name]
        drafts.add_row(d.name, f"{cost.per_call * 1000:.3f}", f"{cost.per_token * 1000:.3f}", f"{cost.per_token / one:.3f}",
                       spread_text(costs.draft_spread.get(d.name)))
    console.print(drafts)
    console.print("spread: (p90 − p10) / median of the repeats (a busy machine: measured again)")
    console.print(f"measured {costs.description.get('measured_at', '?')}; cached in {costs_dir() / (costs.key + '.json')}")
    if args.json:
        print(json.dumps(costs.to_json()))
    return 0
