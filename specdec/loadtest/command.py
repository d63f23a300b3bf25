"""`specdec load-test`: concurrent streaming clients against a running server, every answer checked;
a load curve over numbers of clients, its table and plot."""

from __future__ import annotations

import argparse
import os

from specdec.errors import SpecdecError
from specdec.options import add_json_arg, whole_number
from specdec.serve.command import API_KEY_ENV
from specdec.terminal import plural


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", "--url", dest="url", default="http://127.0.0.1:8000", metavar="URL",
                   help="the server, as `bench --endpoint` names it (loopback only; default: http://127.0.0.1:8000)")
    p.add_argument("--served-model", "--model", dest="model", default=None, metavar="NAME",
                   help="the served model id, as `bench --served-model` names it (default: the first GET /v1/models lists)")
    p.add_argument("--prompts", default=None, help="Spec-Bench .jsonl or text file; the first turn of each prompt is sent")
    p.add_argument("--per-category", type=whole_number, default=2, help="prompts per category from a Spec-Bench file (default: 2)")
    p.add_argument("--shared-prefix", default=None, metavar="FILE",
                   help="a text file sent before every prompt (and a blank line), as clients share a system prompt "
                        "or few-shot examples: what a server's prefix cache is for (default: none)")
    p.add_argument("--references-after", action="store_true",
                   help="ask each prompt's reference answer after the timed requests, not before (default: before), "
                        "so that a server's prefix cache holds no timed prompt whole beforehand: what clients with "
                        "new questions meet")
    p.add_argument("--clients", type=whole_number, default=32, help="concurrent streaming clients (default: 32)")
    p.add_argument("--requests", type=whole_number, default=500, help="requests to complete in all (default: 500)")
    p.add_argument("--max-new-tokens", "--max-tokens", dest="max_tokens", type=int, default=16, metavar="N",
                   help="new tokens each request asks for, its max_tokens (default: 16)")
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV))
    p.add_argument("--speculation", default=None,
                   help="sent with every request: off, auto or a fixed γ (default: the server's own setting); "
                        "with --curve, a comma-separated list (default: off,4,auto)")
    p.add_argument("--answer-lengths", default=None,
                   help="comma-separated max_tokens values drawn at random per request (default: --max-new-tokens)")
    p.add_argument("--duration", type=float, default=None,
                   help="run for this many seconds instead of a number of requests (a sustained test)")
    p.add_argument("--disconnect-share", type=float, default=0.0,
                   help="share of requests whose client goes away after a few stream events (default: 0)")
    p.add_argument("--curve", default=None,
                   help="a load curve: comma-separated numbers of clients (e.g. 1,2,4,8,16,32), each run with "
                        "every --speculation setting and --requests-per-client requests per client")
    p.add_argument("--requests-per-client", type=whole_number, default=4, help="with --curve: requests per client (default: 4)")
    p.add_argument("--plot", default=None, help="with --curve: write a PNG of the curve here")
    p.add_argument("--compare", action="append", default=[], metavar="LABEL=FILE",
                   help="with --curve: also draw a curve saved before with --out (e.g. one-at-a-time=curve-b1.json)")
    p.add_argument("--label", default="this server", help="with --curve: this curve's name in the plot and table")
    p.add_argument("--out", "-o", default=None, help="also write the JSON summary (or curve) to this file")
    add_json_arg(p, "the summary")


DEFAULT_LOAD_PROMPTS = ("Name three colours.", "What is the capital of France?", "Count from one to five.",
                        "Write one sentence about the sea.")


def _numbers(text: str | None, option: str) -> list[int] | None:
    if text is None:
        return None
    try:
        values = [int(v) for v in text.split(",") if v.strip()]
    except ValueError:
        raise SpecdecError(f"{option} takes comma-separated whole numbers, got {text!r}") from None
    if not values or min(values) < 1:
        raise SpecdecError(f"{option} takes whole numbers >= 1, got {text!r}")
    return values


def run(args, console) -> int:
    import asyncio
    import json
    from pathlib import Path

    import httpx
    from rich.progress import Progress

    from specdec.bench.prompts import load_prompts
    from specdec.loadtest.client import run_load_test, speculation_setting

    prompts = ([c.turns[0] for c in load_prompts(args.prompts, args.per_category)] if args.prompts
               else list(DEFAULT_LOAD_PROMPTS))
    if args.shared_prefix is not None:
        prefix = Path(args.shared_prefix).expanduser()
        try:
            shared = prefix.read_text(encoding="utf-8")
        except (OSError, UnicodeDecodeError) as err:
            raise SpecdecError(f"--shared-prefix {prefix}: cannot read it as UTF-8 text ({err})") from None
        prompts = [f"{shared.rstrip()}\n\n{prompt}" for prompt in prompts]
    lengths = _numbers(args.answer_lengths, "--answer-lengths")
    curve = _numbers(args.curve, "--curve")
    for option, path in (("--out", args.out), ("--plot", args.plot)):  # before the run, not after it
        if path is not None and not Path(path).expanduser().parent.is_dir():
            raise SpecdecError(f"{option} {path}: the folder {Path(path).expanduser().parent} does not exist")
    compared = _saved_curves(args.compare)
    if (args.plot or args.compare) and not curve:
        return _draw_saved_curves(compared, args.plot, console)
    if curve and (lengths or args.duration is not None or args.disconnect_share):
        raise SpecdecError("--curve runs a bounded number of requests of --max-new-tokens each, with every client "
                           "staying: leave out --answer-lengths, --duration and --disconnect-share")
    speculation = speculation_setting(args.speculation) if args.speculation and not curve else None
    headers = {"Authorization": f"Bearer {args.api_key}"} if args.api_key else {}
    try:
        model = args.model or httpx.get(f"{args.url}/v1/models", headers=headers, timeout=10).json()["data"][0]["id"]
    except (httpx.HTTPError, KeyError, IndexError, ValueError) as exc:
        raise SpecdecError(f"could not ask {args.url}/v1/models for the model ({exc}); is `specdec serve` running?") from exc
    if curve:
        return _run_curve(args, console, model, prompts, curve, compared)
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task(plural(args.clients, "client"), total=None if args.duration else args.requests)
        result = asyncio.run(run_load_test(args.url, model, prompts, args.clients, args.requests, args.max_tokens,
                                           args.api_key, progress=lambda: progress.advance(task),
                                           speculation=speculation, answer_lengths=lengths, duration=args.duration,
                                           disconnect_share=args.disconnect_share,
                                           references_after=args.references_after))
    summary = {"url": args.url, "model": model, "prompts": len(prompts), "clients": args.clients,
               "max_tokens": lengths or args.max_tokens, "speculation": args.speculation or "server default",
               **result.summary()}
    if args.out:
        Path(args.out).write_text(json.dumps(summary, indent=2) + "\n")
    if args.json:
        print(json.dumps(summary))
    else:
        _print_load_test(summary, console)
    return 0 if not result.errors and not result.mismatches else 1


def _run_curve(args, console, model: str, prompts: list[str], clients: list[int], compared: dict[str, list[dict]]) -> int:
    import asyncio
    import json
    from pathlib import Path

    from rich.progress import Progress

    from specdec.loadtest.plot import curve_table, plot_load_curve
    from specdec.loadtest.client import run_load_curve

    settings = (args.speculation or "off,4,auto").split(",")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("load curve", total=len(clients) * len(settings))

        def done(point):
            progress.console.print(f"{plural(point['clients'], 'client'):>11}, {point['speculation']:>4}: "
                                   f"{point['tokens_per_second']} tokens/s, TTFT p50 "
                                   f"{point['time_to_first_token_seconds']['p50']} s", highlight=False)
            progress.advance(task)

        points = asyncio.run(run_load_curve(args.url, model, prompts, clients, settings, args.requests_per_client,
                                            args.max_tokens, args.api_key, progress=done,
                                            references_after=args.references_after))
    curves = {args.label: points, **compared}
    if args.out:
        Path(args.out).write_text(json.dumps({"url": args.url, "model": model, "max_tokens": args.max_tokens,
                                              "prompts": len(prompts), "points": points}, indent=1) + "\n")
    if args.plot:
        plot_load_curve(curves, Path(args.plot))
    if args.json:
        print(json.dumps({"points": points}))
    else:
        console.print(curve_table(curves), highlight=False, markup=False)
    return 0 if all(p["errors"] == 0 and p["mismatches"] == 0 for p in points) else 1


def _saved_curves(items: list[str]) -> dict[str, list[dict]]:
    """--compare LABEL=FILE items → label → the points of a curve written by --out."""
    import json
    from pathlib import Path

    curves = {}
    for item in items:
        label, _, path = item.partition("=")
        try:
            curves[label] = json.loads(Path(path).read_text())["points"]
        except (OSError, ValueError, KeyError) as exc:
            raise SpecdecError(f"--compare {item}: not a curve written by --out ({exc})") from None
    return curves


def _draw_saved_curves(curves: dict[str, list[dict]], plot: str | None, console) -> int:
    """Without --curve: draw (and tabulate) the curves given with --compare, running nothing."""
    from pathlib import Path

    from specdec.loadtest.plot import curve_table, plot_load_curve

    if not curves or not plot:
        raise SpecdecError("to draw saved curves give --plot FILE and at least one --compare LABEL=FILE "
                           "(or --curve to measure one)")
    plot_load_curve(curves, Path(plot))
    console.print(curve_table(curves), highlight=False, markup=False)
    return 0


def _print_load_test(summary: dict, console) -> None:
    lat, first = summary["latency_seconds"], summary["time_to_first_token_seconds"]
    memory = summary["server_memory_mb"]
    console.print(f"{plural(summary['completed'], 'request')} completed by {plural(summary['clients'], 'client')} in "
                  f"{summary['seconds']} s "
                  f"({summary['requests_per_second']} requests/s, {summary['tokens_per_second']} tokens/s); "
                  f"429 answers: {summary['busy_answers_429']}", highlight=False)
    console.print(f"latency p50 / p90 / p99: {lat['p50']} / {lat['p90']} / {lat['p99']} s; "
                  f"time to first token: {first['p50']} / {first['p90']} / {first['p99']} s", highlight=False)
    differ = summary["mismatches"]
    verdict = (f"{plural(differ, 'answer')} {'differs' if differ == 1 else 'differ'} from its reference" if differ
               else "every answer equal to its reference")
    console.print(f"errors: {summary['errors']}; {verdict}; clients that left on purpose: {summary['disconnected']}; "
                  f"server memory {memory['before']} → {memory['after']} MB", highlight=False)
    if memory["samples"]:
        console.print("server memory (s: MB): " + ", ".join(f"{t:.0f}: {mb}" for t, mb in memory["samples"]), highlight=False)
    for problem in summary["first_errors"] + summary["first_mismatches"]:
        console.print(f"  {problem}", markup=False, highlight=False)
