"""How a run shows on the terminal: its tokens streamed in colour by how each came about, and its
summary (with a per-drafter breakdown) — shared by `generate` and `chat`."""

from __future__ import annotations

from specdec.terminal import figures_table, past_the_end, plural, table_title

KIND_STYLES = {"accepted": "green", "corrected": "yellow", "bonus": "cyan", "target": ""}


def stream_run(engine, prompt_ids, config, console, stoppable: bool = False):
    """Print a generation as it streams, coloured by how each token came about (from the run's trace);
    return (text, token ids, final stats). `stoppable`: Ctrl-C stops the answer, not the program, and
    what was written so far comes back with stats None."""
    from dataclasses import replace

    texts, token_ids, stats = [], [], None
    try:
        for event in engine.stream(prompt_ids, replace(config, trace=True)):
            kinds = iter([kind for record in event.rounds for kind in record.kinds()])
            for piece in event.pieces:
                kind = next(kinds) if piece.token_ids else "target"  # a tail of held-back text has no token
                console.print(piece.text, style=KIND_STYLES[kind], end="", markup=False, highlight=False)
                texts.append(piece.text)
                token_ids += piece.token_ids
            stats = event.stats
    except KeyboardInterrupt:
        if not stoppable:
            raise
        stats = None
    console.print()
    return "".join(texts), token_ids, stats


def summary(stats, console, title: str = "run", breakdown: list[dict] | None = None) -> None:
    from rich.table import Table

    table = Table(title=table_title(title), show_header=False, box=None)  # the title may name a drafter's folder
    table.add_column()
    table.add_column(overflow="fold")  # a drafter's folder whole, folded, on any host's temporary path
    per_pos = " ".join(f"{a:.2f}" for a in stats.acceptance_per_position) or "-"
    rows = [
        ("drafter", stats.drafter),
        ("new tokens", f"{stats.new_tokens} ({stats.finish_reason})"),
        ("target passes", str(stats.target_passes)),
        ("drafted / accepted", f"{stats.drafted} / {stats.accepted} (α = "
                               + (f"{stats.acceptance_rate:.2f})" if stats.drafted else "–: nothing drafted)")),
        ("α per position", per_pos),
        ("MAT (tokens per pass)", f"{stats.mean_accepted_tokens:.2f} = {plural(stats.new_tokens, 'token')} / "
                                  f"{plural(stats.target_passes, 'pass', 'passes')}, prefill included"),
        *([("past the end", note)] if (note := past_the_end(stats)) else []),
        ("time: prefill / draft / verify", f"{stats.prefill_seconds:.2f} s / {stats.draft_seconds:.2f} s / {stats.verify_seconds:.2f} s"),
        ("tokens per second", f"{stats.tokens_per_second:.2f}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)
    if breakdown is not None and stats.drafted:
        breakdown_table(breakdown, stats, console)


def breakdown_table(rows: list[dict], stats, console) -> None:
    """Per drafter, each × plain decoding's rate: the models on the run's own α, γ, c beside what its
    rounds did (not the run's speed-up, which counts the prefill and every round); the policy's choices."""
    table = figures_table("per drafter, × plain decoding's tokens per second", "drafter",
                          ("rounds", "f", "γ", "α", "c", "v", "model", "costed", "its rounds"))
    for r in rows:
        measured = f"{r['measured_speedup']:.2f}×" if r["measured_speedup"] is not None else "-"
        table.add_row(r["drafter"], str(r["rounds"]), f"{r['drafting_share']:.2f}", str(r["gamma"]), f"{r['alpha']:.2f}",
                      f"{r['c']:.3f}", f"{r['verify_cost']:.2f}", f"{r['predicted_speedup']:.2f}×",
                      f"{r['costed_speedup']:.2f}×", measured)
    console.print(table)
    if rows:
        console.print(f"[dim]f: share of its rounds that drafted; γ: mean draft positions per drafting round; "
                      f"c: draft cost per token, v: verify pass, each / plain decoding's time per token; model: the acceptance model's "
                      f"prediction from α, γ, f, c, v (docs/ARCHITECTURE.md); costed: the cost model with the "
                      f"acceptance as it happened; its rounds: the tokens its rounds committed per second of those "
                      f"rounds. Each × is over plain decoding's rate (from: {rows[0]['baseline']}); none is the "
                      f"speed-up, which is the whole run's (--compare)[/dim]",
                      highlight=False, soft_wrap=False)
    plain = stats.by_drafter.get("plain")
    if plain:
        console.print(f"plain rounds chosen by the policy: {plain.rounds} of {stats.rounds}")
    for decision in stats.decisions[-6:]:
        console.print(f"[dim]round {decision['round']}: {decision['reason']}[/dim]", highlight=False)
    if len(stats.decisions) > 6:
        console.print(f"[dim]({plural(len(stats.decisions) - 6, 'earlier change')} of choice not shown; --json has "
                      "them)[/dim]")
