"""Command line: `specdec COMMAND`, each command a module with `add_arguments(parser)` and `run(args,
console)` (the table below).

A thin layer: it parses arguments into the library's config objects, calls the library, and renders.
Errors the user can fix are printed as one line and exit with status 2 (bad arguments) or 1 (the
rest); a traceback means a bug.
"""

from __future__ import annotations

import argparse
import sys
from importlib import import_module

from specdec.errors import SpecdecError
from specdec.options import apply_threads
from specdec.runtime.kernels import switch_off_kernels

COMMANDS = {  # name: (its module, its help line), in the order `specdec --help` lists them
    "generate": ("specdec.commands.generate", "generate from one prompt, streaming; accepted draft tokens in colour"),
    "chat": ("specdec.commands.chat", "a multi-turn conversation (/reset to start over, /exit or Ctrl-D to leave; "
                                      "Ctrl-C stops an answer)"),
    "plan": ("specdec.commands.plan", "expected tokens per pass and speed-up from α, γ and c"),
    "costs": ("specdec.commands.costs", "show (measuring if needed) this machine's cost model for a model and drafter"),
    "bench": ("specdec.bench.command", "measure speed-ups on your prompts against transformers, with a report and plots"),
    "serve": ("specdec.serve.command", "an OpenAI-compatible HTTP server (chat and text completions, streaming, metrics)"),
    "explain": ("specdec.explain.command", "one run, round by round, as a self-contained HTML page (-o run.html)"),
    "load-test": ("specdec.loadtest.command", "many concurrent streaming clients against a running server, every "
                                              "answer checked"),
    "train": ("specdec.train.command", "train a drafter on the target's own answers: EAGLE or Medusa heads, or a small "
                                       "draft model"),
    "export": ("specdec.export.command", "write a trained EAGLE-3 or Medusa head for vLLM, SGLang or llama.cpp, with a "
                                         "launch file"),
}


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
    for name, (module, help_line) in COMMANDS.items():
        import_module(module).add_arguments(sub.add_parser(name, help=help_line))
    return parser


def main(argv: list[str] | None = None) -> int:
    from rich.console import Console

    console = Console(soft_wrap=True)
    errors = Console(stderr=True, soft_wrap=True)
    try:
        args = build_parser().parse_args(argv)
        args.argv = list(sys.argv[1:] if argv is None else argv)
        if getattr(args, "no_compile", False):  # before anything is loaded
            switch_off_kernels()
        if getattr(args, "json", False):  # standard output holds only the JSON line
            console = errors
        if hasattr(args, "threads"):  # a command that runs a model: before anything is loaded
            apply_threads(args.threads, warn=lambda text: errors.print(f"specdec: warning: {text}", markup=False))
        return import_module(COMMANDS[args.command][0]).run(args, console)
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
