"""Command line: `specdec generate | chat | plan`.

A thin layer: it parses arguments into the library's config objects, calls the library, and renders.
Errors the user can fix are printed as one line and exit with status 2 (bad arguments) or 1 (the
rest); a traceback means a bug.
"""

from __future__ import annotations

import argparse
import json
import sys

from specdec.errors import SpecdecError

KIND_STYLES = {"accepted": "green", "corrected": "yellow", "bonus": "cyan", "target": ""}


class UsageError(SpecdecError):
    pass


class Parser(argparse.ArgumentParser):
    def error(self, message: str):  # argparse's own errors: same one-line format, exit 2
        raise UsageError(message)


def _model_args(p: argparse.ArgumentParser) -> None:
    p.add_argument("--model", default="smollm2-135m", help="built-in name, Hugging Face folder or .gguf file (default: smollm2-135m)")
    p.add_argument("--drafter", default="ngram", help="none | ngram[:N] | draft:MODEL | early:L | suffix[:CORPUS] (default: ngram)")
    p.add_argument("--gamma", type=int, default=4, help="tokens drafted per round, >= 1 (default: 4)")
    p.add_argument("--device", default="cpu", help="cpu | cuda | cuda:N (default: cpu)")
    p.add_argument("--dtype", default="float32", help="float32 | bfloat16 | float16 (default: float32)")
    p.add_argument("--runtime", default="lean", help="lean | transformers (default: lean)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--temperature", type=float, default=0.0, help="0 = greedy (default)")
    p.add_argument("--top-k", type=int, default=0, help="0 = off")
    p.add_argument("--top-p", type=float, default=1.0, help="in (0, 1]; 1 = off")
    p.add_argument("--seed", type=int, default=None, help="fixes the random draws: the same seed repeats a sampled run")
    p.add_argument("--stop", action="append", default=[], help="stop string (repeatable)")


def build_parser() -> argparse.ArgumentParser:
    parser = Parser(prog="specdec", description="Lossless speculative decoding for causal language models.")
    sub = parser.add_subparsers(dest="command", required=True, parser_class=Parser)

    gen = sub.add_parser("generate", help="generate from one prompt, streaming; accepted draft tokens in colour")
    gen.add_argument("prompt", help="the prompt text")
    _model_args(gen)
    gen.add_argument("--raw", action="store_true", help="use the prompt as plain text, without the chat template")
    gen.add_argument("--compare", action="store_true", help="also run plain decoding and report the speed-up")
    gen.add_argument("--json", action="store_true", help="print the run's statistics as one JSON line at the end")

    chat = sub.add_parser("chat", help="a multi-turn conversation (/reset to start over, /exit or Ctrl-D to leave)")
    _model_args(chat)
    chat.add_argument("--system", default=None, help="a system message")

    plan = sub.add_parser("plan", help="expected tokens per pass and speed-up from α, γ and c")
    plan.add_argument("--alpha", type=float, required=True, help="acceptance rate per drafted token, in [0, 1]")
    plan.add_argument("--c", type=float, required=True, help="cost of one draft step / cost of one target pass")
    plan.add_argument("--gamma", type=int, default=None, help="a draft length to evaluate (default: show 1..max)")
    plan.add_argument("--max-gamma", type=int, default=12)
    plan.add_argument("--verify-cost", type=float, default=1.0,
                      help="cost of a target pass over γ+1 tokens / a one-token pass (default 1, as in the formula)")
    return parser


def _configs(args):
    from specdec.engine import GenerationConfig
    from specdec.sampling import SamplingParams

    sampling = SamplingParams(temperature=args.temperature, top_k=args.top_k, top_p=args.top_p, seed=args.seed)
    return GenerationConfig(
        max_new_tokens=args.max_new_tokens, gamma=args.gamma, sampling=sampling, stop=tuple(args.stop)
    )


def _load(args, console):
    from specdec.drafters import build_drafter
    from specdec.engine import Engine
    from specdec.runtime import load_model

    with console.status(f"loading {args.model} (the first load converts and caches it)"):
        target = load_model(args.model, device=args.device, dtype=args.dtype, runtime=args.runtime)
        drafter = build_drafter(args.drafter, target, device=args.device, dtype=args.dtype, runtime=args.runtime)
    return target, drafter, Engine(target, drafter)


def _stream(engine, prompt_ids, config, console):
    """Print a generation as it streams, coloured by token kind; return (text, token ids, final stats)."""
    texts, token_ids, stats = [], [], None
    for event in engine.stream(prompt_ids, config):
        for piece in event.pieces:
            console.print(piece.text, style=KIND_STYLES[piece.kind], end="", markup=False, highlight=False)
            texts.append(piece.text)
            token_ids += piece.token_ids
        stats = event.stats
    console.print()
    return "".join(texts), token_ids, stats


def _summary(stats, console, title: str = "run") -> None:
    from rich.table import Table

    table = Table(title=title, show_header=False, box=None)
    per_pos = " ".join(f"{a:.2f}" for a in stats.acceptance_per_position) or "-"
    rows = [
        ("drafter", stats.drafter),
        ("new tokens", f"{stats.new_tokens} ({stats.finish_reason})"),
        ("target passes", str(stats.target_passes)),
        ("drafted / accepted", f"{stats.drafted} / {stats.accepted} (α = {stats.acceptance_rate:.2f})"),
        ("α per position", per_pos),
        ("MAT (tokens per pass)", f"{stats.mean_accepted_tokens:.2f}"),
        ("time: prefill / draft / verify", f"{stats.prefill_seconds:.2f} s / {stats.draft_seconds:.2f} s / {stats.verify_seconds:.2f} s"),
        ("tokens per second", f"{stats.tokens_per_second:.2f}"),
    ]
    for key, value in rows:
        table.add_row(key, value)
    console.print(table)


def cmd_generate(args, console) -> int:
    from specdec.engine import Engine, GenerationConfig, require_prompt_text

    require_prompt_text(args.prompt)
    config = _configs(args)
    target, drafter, engine = _load(args, console)
    prompt_ids = engine.encode(args.prompt, chat=not args.raw)
    if args.compare:  # warm up both paths so that neither pays first-call costs
        warm = GenerationConfig(max_new_tokens=4, gamma=args.gamma, sampling=config.sampling)
        engine.generate(prompt_ids, warm)
    console.print("[dim]legend:[/dim] [green]accepted draft[/green] [yellow]corrected[/yellow] [cyan]bonus[/cyan] target", highlight=False)
    _, token_ids, stats = _stream(engine, prompt_ids, config, console)
    _summary(stats, console, title=f"speculative ({stats.drafter}, γ = {args.gamma})")
    result = {"speculative": stats.to_dict()}
    if args.compare:
        plain = Engine(target).generate(prompt_ids, config)
        _summary(plain.stats, console, title="plain decoding")
        speedup = stats.tokens_per_second / plain.stats.tokens_per_second
        console.print(f"speed-up: {speedup:.2f}× ({stats.tokens_per_second:.2f} vs {plain.stats.tokens_per_second:.2f} tokens/s)")
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
    config = _configs(args)
    target, drafter, engine = _load(args, console)
    system = [{"role": "system", "content": args.system}] if args.system else []
    messages = list(system)
    console.print("[dim]chat: /reset starts over, /exit or Ctrl-D leaves[/dim]")
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
            continue
        if not text:
            continue
        messages.append({"role": "user", "content": text})
        prompt_ids = target.tokenizer.apply_chat_template(messages)
        reply, _, stats = _stream(engine, prompt_ids, config, console)
        console.print(
            f"[dim]{stats.new_tokens} tokens, MAT {stats.mean_accepted_tokens:.2f}, "
            f"α {stats.acceptance_rate:.2f}, {stats.tokens_per_second:.1f} tokens/s[/dim]"
        )
        messages.append({"role": "assistant", "content": reply})


def cmd_plan(args, console) -> int:
    from rich.table import Table

    from specdec.theory import best_gamma, expected_speedup, expected_tokens_per_pass

    if args.max_gamma < 1:
        raise SpecdecError(f"--max-gamma must be >= 1, got {args.max_gamma}")
    if args.gamma is not None and args.gamma < 1:
        raise SpecdecError(f"--gamma must be >= 1, got {args.gamma}")
    if args.verify_cost <= 0:
        raise SpecdecError(f"--verify-cost must be > 0, got {args.verify_cost}")
    gammas = [args.gamma] if args.gamma else list(range(1, args.max_gamma + 1))
    table = Table(title=f"α = {args.alpha}, c = {args.c}, verify cost = {args.verify_cost}")
    for col in ("γ", "E[tokens per pass]", "speed-up"):
        table.add_column(col, justify="right")
    rows = []
    for g in gammas:
        tokens = expected_tokens_per_pass(args.alpha, g)
        speed = expected_speedup(args.alpha, g, args.c, args.verify_cost)
        rows.append({"gamma": g, "tokens_per_pass": round(tokens, 4), "speedup": round(speed, 4)})
        table.add_row(str(g), f"{tokens:.3f}", f"{speed:.3f}")
    console.print(table)
    best, best_speed = best_gamma(args.alpha, args.c, args.max_gamma, args.verify_cost)
    verdict = "speculate" if best_speed > 1 else "plain decoding is faster"
    console.print(f"best γ in 1..{args.max_gamma}: {best} (speed-up {best_speed:.3f}): {verdict}")
    print(json.dumps({"rows": rows, "best_gamma": best, "best_speedup": round(best_speed, 4)}))
    return 0


COMMANDS = {"generate": cmd_generate, "chat": cmd_chat, "plan": cmd_plan}


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    errors = Console(stderr=True, soft_wrap=True)
    try:
        args = build_parser().parse_args(argv)
        return COMMANDS[args.command](args, console)
    except UsageError as err:
        errors.print(f"specdec: error: {err}  (see specdec --help)", markup=False, highlight=False)
        return 2
    except SpecdecError as err:
        errors.print(f"specdec: error: {err}", markup=False, highlight=False)
        return 1
    except KeyboardInterrupt:
        errors.print("interrupted")
        return 130


if __name__ == "__main__":
    sys.exit(main())
