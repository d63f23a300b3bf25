"""`specdec serve`: arguments, loading, and uvicorn."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket

from specdec.errors import SpecdecError
from specdec.options import add_json_arg, add_target_args, gamma_arg, load_engine, whole_number
from specdec.serve.addresses import is_loopback
from specdec.terminal import plural

API_KEY_ENV = "SPECDEC_API_KEY"


def add_arguments(p: argparse.ArgumentParser) -> None:
    add_target_args(p)
    p.add_argument("--gamma", type=gamma_arg, default="auto",
                   help="default tokens drafted per round when a request does not say: a whole number or auto (default)")
    p.add_argument("--host", default="127.0.0.1", help="address to listen on (default: 127.0.0.1, loopback only)")
    p.add_argument("--port", type=int, default=8000)
    p.add_argument("--api-key", default=os.environ.get(API_KEY_ENV),
                   help=f"require 'Authorization: Bearer KEY' on every route but /health (default: ${API_KEY_ENV} if set)")
    p.add_argument("--max-queue", type=int, default=16,
                   help="requests running or waiting at once; past it the server answers 429 (default: 16)")
    p.add_argument("--max-batch", type=int, default=None,
                   help="requests decoded together in one batch; more wait in line (default: chosen from this "
                        "machine's measured costs, where more rows stop adding throughput; 1: one at a time)")
    p.add_argument("--share-learning", action="store_true",
                   help="let drafters that learn from outputs (suffix) learn from every client's answers; off by "
                        "default, so that no client's text shows in another client's drafts or timings")
    p.add_argument("--kv-memory", type=float, default=None, metavar="GIB",
                   help="GiB the running requests' KV caches may hold together; a request waits until its cache "
                        "fits, one larger than all of it is refused (default: 80%% of the memory available at start, "
                        "less the weights)")
    p.add_argument("--prefix-cache", type=float, default=None, metavar="GIB",
                   help="GiB of finished requests' KV caches kept, so that a prompt beginning as an earlier one did "
                        "(a system prompt, a conversation's history) prefills only the rest; 0: off. Reuse shows in "
                        "the time to first token, which tells a client whether another sent the same beginning "
                        "(default: a quarter of --kv-memory, at most 1 GiB, taken from it)")
    p.add_argument("--api-docs", action="store_true",
                   help="serve FastAPI's /docs, /redoc and /openapi.json (off by default; /docs loads its scripts "
                        "from a CDN)")
    p.add_argument("--default-max-tokens", type=int, default=256,
                   help="new tokens when a request gives no max_tokens (default: 256, capped by the context)")
    p.add_argument("--shutdown-timeout", type=float, default=30.0,
                   help="on SIGINT/SIGTERM, seconds for requests in flight to finish; the rest get an error "
                        "(streams: an error event and [DONE]; others: 503) (default: 30)")
    p.add_argument("--max-body-bytes", type=int, default=None,
                   help="the largest request body; past it, 413 (default: 32 bytes per token of the model's context, "
                        "at least 1 MiB)")


def _check(args) -> None:
    if not 0 < args.port < 65536:
        raise SpecdecError(f"--port must be in 1..65535, got {args.port}")
    if args.max_queue < 1:
        raise SpecdecError(f"--max-queue must be >= 1, got {args.max_queue}")
    if args.max_batch is not None and args.max_batch < 1:
        raise SpecdecError(f"--max-batch must be >= 1, got {args.max_batch}")
    if args.default_max_tokens < 1:
        raise SpecdecError(f"--default-max-tokens must be >= 1, got {args.default_max_tokens}")
    if args.max_body_bytes is not None and args.max_body_bytes < 1:
        raise SpecdecError(f"--max-body-bytes must be >= 1, got {args.max_body_bytes}")
    if args.shutdown_timeout < 0:
        raise SpecdecError(f"--shutdown-timeout must be >= 0, got {args.shutdown_timeout}")
    if args.kv_memory is not None and not args.kv_memory > 0:
        raise SpecdecError(f"--kv-memory must be more than 0 GiB, got {args.kv_memory}")
    if args.prefix_cache is not None and not args.prefix_cache >= 0:
        raise SpecdecError(f"--prefix-cache must be 0 (off) or more GiB, got {args.prefix_cache}")
    if args.api_key is not None and not args.api_key.strip():
        raise SpecdecError("--api-key is empty; give a key or leave the option out")
    check_can_listen(args.host, args.port)


def check_can_listen(host: str, port: int) -> None:
    """Bind host:port once and let it go, before the model loads: a port in use fails in a second,
    not after the loading. SO_REUSEADDR as uvicorn binds, so only a port someone listens on is refused."""
    try:
        family, kind, proto, _, address = socket.getaddrinfo(host, port, type=socket.SOCK_STREAM,
                                                             flags=socket.AI_PASSIVE)[0]
    except socket.gaierror as err:
        raise SpecdecError(f"--host {host}: not an address to listen on ({err.strerror})") from None
    with socket.socket(family, kind, proto) as probe:
        probe.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            probe.bind(address)
        except OSError as err:
            hint = "; is a server running there already? choose another --port" if err.errno == errno.EADDRINUSE else ""
            raise SpecdecError(f"cannot listen on {host}:{port}: {err.strerror}{hint}") from None


def memory_line(service) -> str:
    """What the KV caches take and how many rows of the full context fit: said once at start."""
    context, budget = service.target.max_context, service.scheduler.memory_budget
    per_token = f"KV cache: {service.slot_bytes / 1024:.0f} KiB a token"
    if budget is None:
        return f"{per_token}; no memory bound (this machine does not say what it has available; set --kv-memory)"
    full = service.rows_that_fit(context)
    kept = (f"; {service.prefix_cache.max_bytes / (1 << 30):.2f} GiB kept for prompts that begin alike (--prefix-cache)"
            if service.prefix_cache is not None else "")
    return (f"{per_token}; {budget / (1 << 30):.1f} GiB for the requests' caches (--kv-memory): "
            f"{plural(full, 'request')} of the full {context}-token context at once, more of shorter ones "
            f"(4k tokens: {service.rows_that_fit(min(4096, context))}){kept}")


def build_service(args, console):
    from specdec.serve.service import ServeSettings, Service

    engine = load_engine(args, console)
    settings = ServeSettings(model_id=args.model, api_key=args.api_key, max_pending=args.max_queue,
                             default_max_tokens=args.default_max_tokens, gamma=args.gamma, max_gamma=args.max_gamma,
                             max_body_bytes=args.max_body_bytes, max_batch=args.max_batch,
                             share_learning=args.share_learning, api_docs=args.api_docs,
                             kv_memory=None if args.kv_memory is None else int(args.kv_memory * (1 << 30)),
                             prefix_cache=None if args.prefix_cache is None else int(args.prefix_cache * (1 << 30)))
    service = Service(engine.target, engine.drafters, settings)
    with console.status("reading the cost model (measuring it on this machine the first time)"):
        service.prepare()
    return service


def run(args, console) -> int:
    from specdec.serve.app import GracefulServer

    _check(args)
    if not is_loopback(args.host) and not args.api_key:
        console.print(f"[yellow]warning: listening on {args.host} without --api-key: anyone who can reach it may use it[/yellow]")
    service = build_service(args, console)
    names = ", ".join(service.by_name) or "none"
    console.print(memory_line(service), highlight=False)
    console.print(f"serving {args.model} (drafters: {names}; up to {plural(service.scheduler.max_batch, 'request')} at once) "
                  f"on http://{args.host}:{args.port}/v1" + (" with an API key" if args.api_key else ""), highlight=False)
    server = GracefulServer(service, args.host, args.port, args.shutdown_timeout)
    # uvicorn shuts down gracefully on SIGINT / SIGTERM, then raises the signal again for the handler
    # that was there before; these handlers turn that into a clean exit.
    previous = {sig: signal.signal(sig, _stopped) for sig in (signal.SIGINT, signal.SIGTERM)}
    try:
        server.run()
    except _Stopped:
        pass
    finally:
        for sig, handler in previous.items():
            signal.signal(sig, handler)
    console.print("stopped")
    return 0


class _Stopped(Exception):
    pass


def _stopped(signum, frame):
    raise _Stopped()


def add_load_test_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("--endpoint", "--url", dest="url", default="http://127.0.0.1:8000", metavar="URL",
                   help="the server, as `bench --endpoint` names it (loopback only; default: http://127.0.0.1:8000)")
    p.add_argument("--served-model", "--model", dest="model", default=None, metavar="NAME",
                   help="the served model id, as `bench --served-model` names it (default: the first GET /v1/models lists)")
    p.add_argument("--prompts", default=None, help="Spec-Bench .jsonl or text file; the first turn of each prompt is sent")
    p.add_argument("--per-category", type=whole_number, default=2, help="prompts per category from a Spec-Bench file (default: 2)")
    p.add_argument("--shared-prefix", default=None, metavar="FILE",
                   help="a text file sent before every prompt (and a blank line), as clients share a system prompt "
                        "or few-shot examples: what a server's prefix cache is for (default: none)")
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


def run_load_test_command(args, console) -> int:
    import asyncio
    import json
    from pathlib import Path

    import httpx
    from rich.progress import Progress

    from specdec.bench.prompts import load_prompts
    from specdec.serve.load_test import run_load_test, speculation_setting

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
                                           disconnect_share=args.disconnect_share))
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

    from specdec.serve.load_plot import curve_table, plot_load_curve
    from specdec.serve.load_test import run_load_curve

    settings = (args.speculation or "off,4,auto").split(",")
    with Progress(console=console, transient=True) as progress:
        task = progress.add_task("load curve", total=len(clients) * len(settings))

        def done(point):
            progress.console.print(f"{plural(point['clients'], 'client'):>11}, {point['speculation']:>4}: "
                                   f"{point['tokens_per_second']} tokens/s, TTFT p50 "
                                   f"{point['time_to_first_token_seconds']['p50']} s", highlight=False)
            progress.advance(task)

        points = asyncio.run(run_load_curve(args.url, model, prompts, clients, settings, args.requests_per_client,
                                            args.max_tokens, args.api_key, progress=done))
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

    from specdec.serve.load_plot import curve_table, plot_load_curve

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
