"""Command line: `specdec generate | chat | plan | costs | bench | serve | load-test | explain`.

A thin layer: it parses arguments into the library's config objects, calls the library, and renders.
Errors the user can fix are printed as one line and exit with status 2 (bad arguments) or 1 (the
rest); a traceback means a bug.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

from specdec.errors import SpecdecError
from specdec.options import (add_json_arg, add_model_args, add_target_args, apply_threads, generation_config, load_engine,
                             prepare_costs)
from specdec.terminal import figures_table, past_the_end, plural, table_title

KIND_STYLES = {"accepted": "green", "corrected": "yellow", "bonus": "cyan", "target": ""}


class UsageError(SpecdecError):
    def __init__(self, message: str, prog: str = "specdec") -> None:
        super().__init__(message)
        self.prog = prog  # the (sub)command whose help answers it: "specdec generate"


class Parser(argparse.ArgumentParser):
    """argparse, with its errors in specdec's one-line form and no abbreviations: `--max` is no
    option, where argparse would take it for `--max-gamma` and break when another `--max-…` is added."""

    def __init__(self, *args, **kwargs) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)

    def error(self, message: str):  # argparse's own errors: same one-line format, exit 2
        raise UsageError(message, self.prog)


def _version() -> str:
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("specdec")
    except PackageNotFoundError:  # run from a source tree that was not installed
        return "unknown (not installed)"


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Lossless speculative decoding for causal language models.")
    parser.add_argument("--version", action="version", version=f"specdec {_version()}")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    gen = sub.add_parser("generate", help="generate from one prompt, streaming; accepted draft tokens in colour")
    gen.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_args(gen)
    gen.add_argument("--raw", action="store_true", help="use the prompt as plain text, without the chat template")
    gen.add_argument("--compare", action="store_true", help="also run plain decoding and report the speed-up")
    add_json_arg(gen, "the text and the run's statistics")

    chat = sub.add_parser("chat", help="a multi-turn conversation (/reset to start over, /exit or Ctrl-D to leave; "
                                       "Ctrl-C stops an answer)")
    add_model_args(chat)
    chat.add_argument("--system", default=None, help="a system message")

    plan = sub.add_parser("plan", help="expected tokens per pass and speed-up from α, γ and c")
    plan.add_argument("--alpha", type=float, required=True,
                      help="acceptance rate per drafted token, in [0, 1] (with --then: of the first drafted token)")
    plan.add_argument("--then", type=float, default=None,
                      help="run-aware acceptance: the chance a later drafted token is accepted given the one before "
                           "was (default: i.i.d., the seed formula)")
    plan.add_argument("--c", type=float, required=True, help="cost of one draft step / cost of one target pass")
    plan.add_argument("--gamma", type=int, default=None, help="a draft length to evaluate (default: show 1..max)")
    plan.add_argument("--max-gamma", type=int, default=12)
    plan.add_argument("--verify-cost", type=float, default=1.0,
                      help="cost of a target pass over γ+1 tokens / a one-token pass (default 1, as in the formula)")
    add_json_arg(plan, "the table")

    costs = sub.add_parser("costs", help="show (measuring if needed) this machine's cost model for a model and drafter")
    add_target_args(costs)
    costs.add_argument("--remeasure", action="store_true", help="measure again, replacing the cached numbers")
    add_json_arg(costs, "the cost model")

    from specdec.bench.command import add_arguments

    bench = sub.add_parser("bench", help="measure speed-ups on your prompts against transformers, with a report and plots")
    add_arguments(bench)

    from specdec.serve.command import add_arguments as add_serve_arguments

    serve = sub.add_parser("serve", help="an OpenAI-compatible HTTP server (chat and text completions, streaming, metrics)")
    add_serve_arguments(serve)

    from specdec.explain.command import add_arguments as add_explain_arguments

    explain = sub.add_parser("explain", help="one run, round by round, as a self-contained HTML page (-o run.html)")
    add_explain_arguments(explain)

    from specdec.serve.command import add_load_test_arguments

    load = sub.add_parser("load-test", help="many concurrent streaming clients against a running server, every answer checked")
    add_load_test_arguments(load)

    from specdec.train.command import add_arguments as add_train_arguments

    train = sub.add_parser("train", help="train a drafter on the target's own answers: EAGLE or Medusa heads, or a small draft model")
    add_train_arguments(train)

    from specdec.export.command import add_arguments as add_export_arguments

    export = sub.add_parser("export", help="write a trained EAGLE-3 or Medusa head for vLLM, SGLang or llama.cpp, with a launch file")
    add_export_arguments(export)
    return parser


def _stream(engine, prompt_ids, config, console, stoppable: bool = False):
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


def _summary(stats, console, title: str = "run", breakdown: list[dict] | None = None) -> None:
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
        _breakdown(breakdown, stats, console)


def _breakdown(rows: list[dict], stats, console) -> None:
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
                      f"c: draft cost per token / T(1); v: verify pass / T(1); model: the acceptance model's "
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


def cmd_generate(args, console) -> int:
    from specdec.control.analysis import drafter_breakdown
    from specdec.decode.engine import Engine, require_prompt_text
    from specdec.options import warm_up

    if args.prompt == "-":
        args.prompt = sys.stdin.read()
    require_prompt_text(args.prompt)
    config = generation_config(args)
    engine = load_engine(args, console)
    target = engine.target
    prompt_ids = engine.encode(args.prompt, chat=not args.raw)
    prepare_costs(engine, config, console)
    if args.compare:
        warm_up(engine, prompt_ids, config)
    if console.is_terminal:  # the colours, and so their legend, only where they show
        console.print("[dim]legend:[/dim] [green]accepted draft[/green] [yellow]corrected[/yellow] [cyan]bonus[/cyan] target",
                      highlight=False)
    text, token_ids, stats = _stream(engine, prompt_ids, config, console)
    plain = None
    if args.compare:  # both timed the same way: quiet runs (the streamed one above also paid for the terminal)
        with console.status("timing speculative and plain decoding, neither printing"):
            quiet = engine.generate(prompt_ids, config)
            plain = Engine(target).generate(prompt_ids, config)
        if config.sampling.greedy and quiet.token_ids != token_ids:
            raise SpecdecError("internal error: two greedy speculative runs of one prompt differ")
        stats = quiet.stats
    costs = engine.cost_model if engine.drafters else None
    if costs is None and engine.drafters:  # a fixed γ ran without the cost model; the breakdown needs it
        with console.status("reading the cost model for the breakdown"):
            costs = engine.costs(config.max_gamma)
    breakdown = drafter_breakdown(stats, costs, plain.stats.tokens_per_second if plain else None) if costs is not None else None
    _summary(stats, console, title=f"speculative ({stats.drafter}, γ = {args.gamma})", breakdown=breakdown)
    result = {"text": text, "speculative": stats.to_dict()}
    if breakdown is not None:
        result["breakdown"] = breakdown
    if plain:
        _summary(plain.stats, console, title="plain decoding")
        speedup = stats.tokens_per_second / plain.stats.tokens_per_second
        console.print(f"speed-up: {speedup:.2f}× (the whole run: {stats.tokens_per_second:.2f} tokens/s, plain decoding: "
                      f"{plain.stats.tokens_per_second:.2f})", highlight=False)
        if config.sampling.greedy:
            same = token_ids == plain.token_ids
            console.print(f"greedy outputs identical: {'yes' if same else 'NO'}", style="green" if same else "bold red")
            result["identical"] = same
        else:
            console.print("sampled run: outputs differ draw by draw; their distribution is the same (see tests)")
        result.update(plain=plain.stats.to_dict(), speedup=round(speedup, 4))
    if args.json:
        print(json.dumps(result))
    return 0


def cmd_chat(args, console) -> int:
    from specdec.decode.prefix_cache import PrefixCache

    config = generation_config(args)
    engine = load_engine(args, console)
    engine.prefix_cache = PrefixCache()  # each turn prefills only what the conversation added since the last
    target = engine.target
    if not target.tokenizer.chat_template:
        raise SpecdecError(f"specdec chat needs a model with a chat template, and {args.model} has none; "
                           "for plain text use `specdec generate --raw PROMPT`")
    prepare_costs(engine, config, console)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    console.print("[dim]chat: /reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops an answer, /help lists these[/dim]")
    while True:
        try:
            line = console.input("[bold]you> [/bold]")
        except EOFError:
            console.print()
            return 0
        text = line.strip()
        if text in ("/exit", "/quit"):
            return 0
        if text == "/reset":
            messages = list(system)
            console.print("[dim]conversation cleared[/dim]")
            continue
        if text in ("/help", "/?"):
            console.print("[dim]/reset starts over, /exit or Ctrl-D leaves, Ctrl-C stops an answer; anything else is "
                          "sent to the model[/dim]")
            continue
        if text.startswith("/") and " " not in text:
            console.print(f"[dim]unknown command {text}; /help lists them (nothing was sent)[/dim]")
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        prompt_ids = target.tokenizer.apply_chat_template(messages)
        reply, _, stats = _stream(engine, prompt_ids, config, console, stoppable=True)
        if stats is None:
            console.print("[dim]stopped: the conversation keeps what was written (Ctrl-C at the prompt or /exit "
                          "leaves)[/dim]")
            messages.append({"role": "assistant", "content": reply})
            continue
        console.print(
            f"[dim]{plural(stats.new_tokens, 'token')}, MAT {stats.mean_accepted_tokens:.2f}, "
            f"α {stats.acceptance_rate:.2f}, {stats.tokens_per_second:.1f} tokens/s; "
            f"prompt {stats.prompt_tokens} tokens, {stats.reused_prompt_tokens} of them kept from before[/dim]"
        )
        messages.append({"role": "assistant", "content": reply})


def cmd_plan(args, console) -> int:
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


def spread_text(spread: float | None) -> str:
    """A measurement's spread in the `costs` tables ("–": not recorded, e.g. a point of T(N) measured for rows)."""
    return "–" if spread is None else f"{spread:.0%}"


def cmd_costs(args, console) -> int:
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


def cmd_bench(args, console) -> int:
    from specdec.bench.command import run

    return run(args, console)


def cmd_serve(args, console) -> int:
    from specdec.serve.command import run

    return run(args, console)


def cmd_explain(args, console) -> int:
    from specdec.explain.command import run

    return run(args, console)


def cmd_load_test(args, console) -> int:
    from specdec.serve.command import run_load_test_command

    return run_load_test_command(args, console)


def cmd_train(args, console) -> int:
    from specdec.train.command import run

    return run(args, console)


def cmd_export(args, console) -> int:
    from specdec.export.command import run

    return run(args, console)


COMMANDS = {"train": cmd_train, "export": cmd_export, "generate": cmd_generate, "chat": cmd_chat, "plan": cmd_plan, "costs": cmd_costs, "bench": cmd_bench,
            "serve": cmd_serve, "load-test": cmd_load_test, "explain": cmd_explain}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    errors = Console(stderr=True, soft_wrap=True)
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if getattr(args, "no_compile", False):
            os.environ["SPECDEC_KERNELS"] = "off"  # read by runtime/kernels when the kernels are first asked for
        if getattr(args, "json", False):  # standard output holds only the JSON line
            console = errors
        if hasattr(args, "threads"):  # a command that runs a model: before anything is loaded
            apply_threads(args.threads, warn=lambda text: errors.print(f"specdec: warning: {text}", markup=False))
        return COMMANDS[args.command](args, console)
    except UsageError as err:
        errors.print(f"{err.prog}: error: {err}  (see {err.prog} --help)", markup=False, highlight=False)
        return 2
    except SpecdecError as err:
        errors.print(f"specdec: error: {err}", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
