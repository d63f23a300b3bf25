"""`specdec bench`: will speculative decoding be faster on my prompts, on my machine, and by how much?

    specdec bench                      # the built-in starter prompts (12, 2 of each Spec-Bench category)
    specdec bench --prompts ../shared/workloads/spec_bench_dev.jsonl --per-category 5 --drafter ngram
    specdec bench --prompts prompts.txt --drafter ngram --drafter suffix --gamma 1,2,4,8,auto --temperature 0,1
    specdec bench --prompts humaneval --per-category 20 --drafter draft:MODEL --assistant MODEL
    specdec bench --endpoint http://127.0.0.1:8000 --label plain --endpoint http://127.0.0.1:8001 --label eagle3

Methods, side by side in one process (see runner.py for the interleaving):
    hf-generate   transformers `generate` on the same weights
    hf-lookup     transformers assisted generation with prompt lookup
    hf-assisted   transformers assisted generation with `--assistant MODEL` (when given)
    llama.cpp     llama.cpp's plain decoding of the same GGUF (`--baseline llama.cpp`; needs
                  llama-cpp-python, an optional extra: pip install -e '.[llamacpp]')
    plain         this project's plain decoding
    SPEC [γ=G]    this project with each `--drafter` at each `--gamma`
    URL or LABEL  a running OpenAI-compatible server (`--endpoint`, repeatable; see endpoint.py),
                  streamed chat completions timed from here
With `--endpoint` only the endpoints run (no model is loaded here) unless `--drafter` is given too;
their speed-ups are then over the first endpoint, and greedy answers are compared with its text.
`--prompts` is a Spec-Bench .jsonl file, a text file (one prompt a line), or a built-in set:
`starter` (the default; shipped with the package, see prompts.py) or `humaneval`.
Writes to `--out` (a folder): report.md, results.jsonl and three PNG plots, and prints a table; the
report states results, and this project's own targets, met or missed, only with `--targets` (as
`make bench` runs it). With `--json` the summary is printed as one JSON line on standard output
(tables and messages go to standard error). While it runs, each finished prompt is appended to
results.partial.jsonl (same format), so that a run stopped halfway keeps what it measured. A
finished report already in `--out` is not overwritten unless `--force` is given.
"""

from __future__ import annotations

import argparse
import datetime
import json
from dataclasses import replace
from pathlib import Path

from specdec.drafters.spec import drafter_help, parse_drafter_spec
from specdec.errors import SpecdecError
from specdec.terminal import plural

DEFAULT_OUT = Path("bench-out")
PARTIAL_RESULTS = "results.partial.jsonl"
REPORT_FILES = ("report.md", "results.jsonl")  # what a finished run writes (and --force overwrites)


def gamma_list(text: str) -> list:
    out = []
    for part in text.split(","):
        part = part.strip()
        if part != "auto" and not (part.isdigit() and int(part) >= 1):
            raise argparse.ArgumentTypeError(f"each gamma must be a whole number >= 1 or auto, got '{part}'")
        out.append(part if part == "auto" else int(part))
    return out


def temperature_list(text: str) -> list[float]:
    try:
        values = [float(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected comma-separated temperatures, got '{text}'") from None
    if any(not 0 <= v <= 100 for v in values):
        raise argparse.ArgumentTypeError("temperatures must be in [0, 100]")
    return values


def add_arguments(p: argparse.ArgumentParser) -> None:
    from specdec.options import add_load_args

    add_load_args(p)
    p.add_argument("--prompts", default="starter",
                   help="a Spec-Bench .jsonl file, a text file (one prompt a line), or a built-in set: starter "
                        "(12 prompts, 2 of each Spec-Bench category) or humaneval (default: starter)")
    p.add_argument("--drafter", action="append", default=None,
                   help="a drafter spec, repeatable: " + drafter_help() + "; SPEC@G1,G2 runs it at these γ instead of --gamma")
    p.add_argument("--gamma", type=gamma_list, default=["auto"], help="comma-separated γ: numbers and/or auto (default: auto)")
    p.add_argument("--temperature", type=temperature_list, default=[0.0], help="comma-separated; 0 = greedy (default: 0)")
    p.add_argument("--max-new-tokens", type=int, default=256)
    p.add_argument("--ignore-eos", action="store_true",
                   help="every answer exactly --max-new-tokens long, past the end of sequence: the same work for "
                        "every method when sampling (where texts, and so their lengths, differ between methods)")
    p.add_argument("--seed", type=int, default=0,
                   help="the first seed of the sampled runs' draws: each prompt and repeat has its own, the same for "
                        "every method (default: 0)")
    p.add_argument("--per-category", type=int, default=None, help="prompts per category (default: all)")
    p.add_argument("--category", action="append", default=None, help="only these categories or sub-categories (repeatable)")
    p.add_argument("--repeats", type=int, default=1, help="runs per prompt and method; the median is kept (default: 1)")
    p.add_argument("--ask-twice", action="store_true",
                   help="send each prompt twice in a row, as a repeated request (what a drafter that learns from its outputs is for)")
    p.add_argument("--assistant", default=None, help="a draft model for transformers' assisted generation (hf-assisted)")
    p.add_argument("--no-transformers", action="store_true", help="leave out the transformers baselines")
    p.add_argument("--baseline", action="append", choices=["llama.cpp"], default=[],
                   help="also run llama.cpp's plain decoding on the same GGUF (needs llama-cpp-python)")
    p.add_argument("--endpoint", action="append", default=[], metavar="URL",
                   help="a running OpenAI-compatible server to measure (repeatable): specdec serve, vLLM, SGLang, "
                        "llama-server; its base URL, e.g. http://127.0.0.1:8000. Only endpoints run unless --drafter "
                        "is given too; endpoints' greedy answers are compared with the first endpoint's, and with "
                        "endpoints alone it is the baseline of speed-ups (docs/bench/ENDPOINT.md)")
    p.add_argument("--served-model", action="append", default=None, metavar="NAME",
                   help="the model name sent to the endpoints (once for all, or once per --endpoint; default: the "
                        "one model GET /v1/models lists). Not --model, which is the model run here")
    p.add_argument("--api-key", action="append", default=None, metavar="KEY",
                   help="sent as 'Authorization: Bearer KEY' to the endpoints (once for all, or once per --endpoint)")
    p.add_argument("--label", action="append", default=None,
                   help="the name of an endpoint's row in the report (once per --endpoint; default: its URL)")
    p.add_argument("--out", "--out-dir", "-o", dest="out_dir", type=Path, default=DEFAULT_OUT, metavar="DIR",
                   help=f"the folder the report goes to (default: {DEFAULT_OUT})")
    p.add_argument("--force", action="store_true", help="overwrite a report already in --out")
    p.add_argument("--targets", action="store_true",
                   help="add this project's speed targets, met or missed, to the report (what make bench checks)")
    p.add_argument("--json", action="store_true",
                   help="print only the summary as one JSON line on standard output (tables and messages go to standard error)")


def _check(args) -> None:
    if args.max_new_tokens < 1:
        raise SpecdecError(f"--max-new-tokens must be >= 1, got {args.max_new_tokens}")
    if args.repeats < 1:
        raise SpecdecError(f"--repeats must be >= 1, got {args.repeats}")
    if args.per_category is not None and args.per_category < 1:
        raise SpecdecError(f"--per-category must be >= 1, got {args.per_category}")
    # each --drafter SPEC[@G1,G2] parsed once: a misspelled drafter fails before the model and prompts load
    args.drafter_choices = {text: parse_drafter_spec(text.partition("@")[0]) for text in args.drafter or ["ngram"]}
    args.local = not args.endpoint or args.drafter is not None
    if not args.local and (args.assistant or args.baseline):
        raise SpecdecError("--assistant and --baseline run beside this project's decoding, which --endpoint alone "
                           "leaves out: add --drafter SPEC to run local methods beside the endpoints")
    if args.endpoint and args.ignore_eos:
        raise SpecdecError("--ignore-eos has no standard field in the OpenAI API, so endpoints cannot be asked "
                           "to honour it: leave out --ignore-eos or --endpoint")
    if not args.endpoint and (args.served_model or args.api_key or args.label):
        raise SpecdecError("--served-model, --api-key and --label apply to endpoints: add --endpoint URL")
    args.llama_cpp_gguf = _llama_cpp_gguf(args) if "llama.cpp" in args.baseline else None


def _check_out(out: Path, force: bool) -> None:
    """The report's folder: after the prompts (a missing prompts file is the first thing said)."""
    if out.exists() and not out.is_dir():
        raise SpecdecError(f"--out {out} is a file; the report needs a folder")
    existing = [name for name in REPORT_FILES if (out / name).exists()]
    if existing and not force:
        raise SpecdecError(f"{out} already holds a report ({', '.join(existing)}); pass --force to "
                           "overwrite it, or choose another --out")


TRANSFORMERS_BASELINES = "specdec.bench.methods:transformers_baselines"  # child.py factories
LLAMA_CPP_BASELINE = "specdec.bench.methods:llama_cpp_baseline"


def build_methods(args, target, console, failures: dict[str, str]) -> dict[float, list]:
    """This project's methods, and the baselines, each started in a process of its own (child.py);
    a baseline that cannot start is a line in `failures` (name → what happened), not the bench's end."""
    import torch

    from specdec.bench.methods import SpecdecMethod
    from specdec.bench.metrics import LLAMA_CPP
    from specdec.drafters.build import build_drafters
    from specdec.decode.engine import Engine
    from specdec.runtime import load_model
    from specdec.runtime.loading import float_weights_folder

    ours = [SpecdecMethod("plain", Engine(target), 1, ignore_eos=args.ignore_eos)]
    for text in args.drafter or ["ngram"]:
        spec, at, own = text.partition("@")  # SPEC@G1,G2: this drafter at these γ only
        try:
            gammas = gamma_list(own) if at else args.gamma
        except argparse.ArgumentTypeError as err:
            raise SpecdecError(f"--drafter {text}: {err}") from None
        for gamma in gammas:
            # one row per (drafter, γ); a bare spec is γ = auto (the targets check those rows)
            name = spec if gamma == "auto" and len(gammas) == 1 else f"{spec} γ={gamma}"
            engine = Engine(target, build_drafters(args.drafter_choices[text], target, device=args.device, dtype=args.dtype, runtime=args.runtime))
            ours.append(SpecdecMethod(name, engine, gamma, ignore_eos=args.ignore_eos))
    with console.status("reading the cost model (measuring it on this machine the first time)"):
        for method in ours:
            if method.engine.drafters:
                method.engine.costs(method.max_gamma)
    theirs = []
    if not args.no_transformers:
        assistant = None
        if args.assistant:
            assistant = str(float_weights_folder(load_model(args.assistant, device=args.device)))
        kwargs = dict(folder=str(float_weights_folder(target)), eos_token_ids=target.eos_token_ids,
                      lookup_tokens=next((g for g in args.gamma if g != "auto"), 4), ignore_eos=args.ignore_eos,
                      device=args.device, dtype=args.dtype, assistant_folder=assistant)
        with console.status("starting the transformers baselines (in a process of their own)"):
            theirs += _start_baselines("transformers", TRANSFORMERS_BASELINES, kwargs, failures, console)
    if "llama.cpp" in args.baseline:
        kwargs = dict(gguf_path=str(args.llama_cpp_gguf), eos_token_ids=target.eos_token_ids,
                      threads=torch.get_num_threads(), ignore_eos=args.ignore_eos)
        with console.status("starting llama.cpp (in a process of its own)"):
            theirs += _start_baselines(LLAMA_CPP, LLAMA_CPP_BASELINE, kwargs, failures, console)
    return {t: theirs + ours for t in args.temperature}


def _start_baselines(what: str, factory: str, kwargs: dict, failures: dict[str, str], console) -> list:
    """The methods of a baseline process, or none and a line in `failures` if it cannot start."""
    import torch
    from rich.markup import escape

    from specdec.bench.child import BaselineProcess
    from specdec.errors import BaselineFailed

    try:
        return BaselineProcess(factory, kwargs, threads=torch.get_num_threads()).methods
    except BaselineFailed as err:
        failures[what] = str(err)
        console.print(f"[yellow]{escape(what)}: {escape(str(err))}; the bench goes on without it[/]", highlight=False)
        return []


def _llama_cpp_gguf(args):
    """The GGUF file llama.cpp will run; a clear error, before anything is loaded, when it cannot."""
    import importlib.util

    from specdec.bench.methods import LLAMA_CPP_INSTALL
    from specdec.runtime.loading import resolve_model_source

    gguf_path = resolve_model_source(args.model)[1]
    if gguf_path is None:
        raise SpecdecError(f"--baseline llama.cpp runs a GGUF file, and --model {args.model} is not one; "
                           "pass a .gguf file or a built-in model")
    if args.device != "cpu":
        raise SpecdecError("--baseline llama.cpp is measured on the CPU; drop --device or the baseline")
    if importlib.util.find_spec("llama_cpp") is None:
        raise SpecdecError(f"--baseline llama.cpp needs llama-cpp-python: {LLAMA_CPP_INSTALL}")
    return gguf_path


def run(args, console) -> int:
    from rich.markup import escape
    from rich.progress import Progress

    import torch

    from specdec.bench.endpoint import connect_endpoints
    from specdec.bench.memory import PeakMemory
    from specdec.bench.metrics import summarize
    from specdec.bench.prompts import load_prompts
    from specdec.bench.report import print_tables, raw_rows, write_report
    from specdec.bench.runner import run_bench
    from specdec.control.cost_model import machine_description
    from specdec.options import load_target

    _check(args)
    cases = load_prompts(args.prompts, args.per_category, args.category)
    _check_out(args.out_dir, args.force)
    if args.ask_twice:
        cases = [c for case in cases for c in (case, replace(case, id=f"{case.id} (again)"))]
    endpoints = connect_endpoints(args) if args.endpoint else []  # before loading anything: fail fast
    target = None
    failures: dict[str, str] = {}  # baselines that failed: name → what happened (their rows are left out)
    if args.local:
        target = load_target(args, console)
        methods_at = build_methods(args, target, console, failures)
    else:
        methods_at = {t: [] for t in args.temperature}
    clash = sorted({e.name for e in endpoints} & {m.name for methods in methods_at.values() for m in methods})
    if clash:
        raise SpecdecError(f"--label {clash[0]} is also the name of a method run here: choose another label")
    methods_at = {t: methods + endpoints for t, methods in methods_at.items()}
    device = target.net.device if target else torch.device("cpu")
    total = len(cases) * args.repeats * sum(len(m) for m in methods_at.values())
    args.out_dir.mkdir(parents=True, exist_ok=True)
    partial = args.out_dir / PARTIAL_RESULTS
    if partial.is_file() and partial.stat().st_size:  # an earlier stopped run's: set aside, not overwritten
        stamp = datetime.datetime.fromtimestamp(partial.stat().st_mtime).strftime("%Y%m%d-%H%M%S")
        kept = partial.with_name(f"results.partial-{stamp}.jsonl")
        partial.rename(kept)
        console.print(f"an earlier stopped run's results are now in {kept}")
    partial.write_text("")

    def keep(row: dict) -> None:
        with partial.open("a") as f:
            f.write("".join(json.dumps(r) + "\n" for r in raw_rows([row])))

    try:
        with Progress(console=console, transient=True) as progress:
            task = progress.add_task(f"{plural(len(cases), 'prompt')} × {plural(len(methods_at), 'temperature')}",
                                     total=total)

            def show(done, number, case, temperature, method):
                at = f" at T = {temperature:g}" if len(methods_at) > 1 else ""
                progress.update(task, completed=done, description=escape(
                    f"prompt {number} of {len(cases)} ({case.id}, {case.category}): {method}{at}"))

            rows = run_bench(cases, methods_at, target.tokenizer if target else None, args.max_new_tokens, args.repeats,
                             device, seed=args.seed, progress=show, on_row=keep, failures=failures)
    except KeyboardInterrupt:
        console.print(f"stopped: the prompts finished so far are in {partial}")
        raise
    finally:
        for method in {id(m): m for ms in methods_at.values() for m in ms}.values():
            if hasattr(method, "close"):  # endpoints and baseline processes
                method.close()
    costs = {m.name: m.engine.cost_model for ms in methods_at.values() for m in ms if getattr(m, "engine", None)}
    summary = summarize(rows, costs)
    header = {
        "command": "specdec " + " ".join(getattr(args, "argv", ["bench"])),
        "date": datetime.datetime.now(datetime.timezone.utc).isoformat(timespec="seconds"),
        "machine": ", ".join(f"{k} {v}" for k, v in machine_description(device).items()),
        "model": f"{target.name} ({target.net.dtype})" if target else "none here (endpoints only)",
        **{f"endpoint {e.name}": f"{e.url}, model {e.served_model}, new tokens counted from {e.tokens_from}"
           for e in endpoints},
        "prompts": f"{args.prompts}: {len(cases)}",
        "settings": f"max_new_tokens {args.max_new_tokens}, repeats {args.repeats}, temperatures {args.temperature}"
                    + (f", seed {args.seed}" if any(args.temperature) else ""),
        "peak memory": PeakMemory(device).description if target else "not measured (endpoints only)",
        **{f"failed: {name}": f"{what}; its rows are left out" for name, what in failures.items()},
    }
    files = write_report(rows, summary, header, args.out_dir, targets=args.targets)
    partial.unlink()  # all of it is in results.jsonl now
    print_tables(summary, console)
    for name, what in failures.items():
        console.print(f"[yellow]failed: {escape(name)}: {escape(what)}; its rows are left out[/]", highlight=False)
    console.print("wrote " + ", ".join(str(f) for f in files))
    if args.json:
        print(json.dumps({"out_dir": str(args.out_dir), "summary": summary}))
    return 0

