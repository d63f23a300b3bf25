"""`specdec serve`: arguments, loading, and uvicorn."""

from __future__ import annotations

import argparse
import errno
import os
import signal
import socket

from specdec.errors import SpecdecError
from specdec.options import add_target_args, gamma_arg, load_engine
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
