"""`specdec generate`: one prompt, streamed with accepted drafts in colour; `--compare` times plain
decoding beside it."""

from __future__ import annotations

import json
import sys
from contextlib import nullcontext

from specdec.commands.show import stream_run, summary
from specdec.errors import SpecdecError
from specdec.options import add_json_arg, add_model_args, generation_config, load_engine, prepare_costs


def add_arguments(gen) -> None:
    gen.add_argument("prompt", help="the prompt text, or - to read it from standard input")
    add_model_args(gen)
    gen.add_argument("--raw", action="store_true", help="use the prompt as plain text, without the chat template")
    gen.add_argument("--compare", action="store_true", help="also run plain decoding and report the speed-up")
    add_json_arg(gen, "the text and the run's statistics")


def run(args, console) -> int:
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
    # --compare runs the prompt three times: a suffix drafter must not draft from an earlier run's answer
    with engine.learning_held() if args.compare else nullcontext():
        if args.compare:
            warm_up(engine, prompt_ids, config)
        if console.is_terminal:  # the colours, and so their legend, only where they show
            console.print("[dim]legend:[/dim] [green]accepted draft[/green] [yellow]corrected[/yellow] [cyan]bonus[/cyan] target",
                          highlight=False)
        text, token_ids, stats = stream_run(engine, prompt_ids, config, console)
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
    breakdown = drafter_breakdown(stats, costs, plain.stats if plain else None) if costs is not None else None
    summary(stats, console, title=f"speculative ({stats.drafter}, γ = {args.gamma})", breakdown=breakdown)
    result = {"text": text, "speculative": stats.to_dict()}
    if breakdown is not None:
        result["breakdown"] = breakdown
    if plain:
        summary(plain.stats, console, title="plain decoding")
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
