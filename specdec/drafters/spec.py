"""The drafter kinds `--drafter` takes, in one table (syntax, meaning, what checks the argument, which
function builds it), and the spec parsed once into a `DrafterChoice` that every command and `auto`
use. Nothing here imports torch or a drafter: the table names each builder by its module, imported
only when a drafter is built (`drafters/build.py`), so a spec is checked before any model loads and
`--help` stays quick.
"""

from __future__ import annotations

import difflib
from dataclasses import dataclass
from typing import Callable

from specdec.errors import ConfigError


def _whole_number(kind: str, what: str) -> Callable[[str], None]:
    def check(arg: str) -> None:
        if not arg.isdigit() or int(arg) < 1:
            raise ConfigError(f"{kind}:{what} needs a whole number {what} >= 1, got '{arg}'")
    return check


def _early_layers(arg: str) -> None:  # (its range, 1..layers − 1, is checked against the model when built)
    if not arg.isdigit():
        raise ConfigError(f"early:L needs the number of layers to draft with, e.g. early:8; got '{arg}'")


def _draft_model(arg: str) -> None:
    if not arg:
        raise ConfigError("draft:MODEL needs a model: a built-in name, a folder or a .gguf file")


@dataclass(frozen=True)
class DrafterKind:
    name: str
    syntax: str  # as the help shows it: "ngram[:N]"
    meaning: str  # one line, for the docs and the package's docstring
    builder: str  # "module:function" that builds one from a DrafterSpec and the target ("": none and auto)
    check: Callable[[str], None] | None = None  # refuses a bad argument by name (None: any, or none, is taken)


KINDS = {kind.name: kind for kind in (
    DrafterKind("none", "none", "plain decoding (no drafter)", ""),
    DrafterKind("ngram", "ngram[:N]", "prompt lookup with n-grams of 2 to N tokens (default 4)",
                "specdec.drafters.ngram:build", lambda arg: arg and _whole_number("ngram", "N")(arg)),
    DrafterKind("draft", "draft:MODEL", "a separate draft model (built-in name, folder or .gguf) sharing the "
                "target's tokenizer", "specdec.drafters.draft_model:build", _draft_model),
    DrafterKind("early", "early:L", "self-speculation: the target's own first L layers, norm and LM head",
                "specdec.drafters.early_exit:build", _early_layers),
    DrafterKind("suffix", "suffix[:PATH]", "suffix automata over the request, this drafter's earlier outputs and, "
                "optionally, a corpus (file, folder or JSON lines)", "specdec.drafters.suffix:build"),
    DrafterKind("eagle", "eagle[:PATH]", "an EAGLE head (`specdec train eagle`) drafting a chain; without PATH a "
                "shipped head that fits the target", "specdec.drafters.eagle:build"),
    DrafterKind("eagle-tree", "eagle-tree[:PATH]", "the same head drafting a dynamic tree (EAGLE-2) of at most 16 "
                "nodes, 4 per level", "specdec.drafters.eagle:build"),
    DrafterKind("eagle3", "eagle3[:PATH]", "an EAGLE-3 head (`specdec train eagle3`) drafting a dynamic tree as "
                "eagle-tree; without PATH a shipped head that fits the target", "specdec.drafters.eagle:build"),
    DrafterKind("eagle3-chain", "eagle3-chain[:PATH]", "the same head drafting a chain", "specdec.drafters.eagle:build"),
    DrafterKind("medusa", "medusa[:PATH]", "Medusa heads (`specdec train medusa`), their candidates verified as a "
                "static tree", "specdec.drafters.medusa:build"),
    DrafterKind("auto", "auto[:A,B,...]", "the adaptive policy picks among these drafters each round (default: "
                "suffix and, on the lean runtime, early exit at a quarter of the layers and a shipped EAGLE-3 head "
                "that fits the target, where there is one)", ""),
)}
DRAFTER_KINDS = tuple(kind.syntax for kind in KINDS.values())  # what the help and the errors list


@dataclass(frozen=True)
class DrafterSpec:
    """One drafter, as `--drafter` (or `auto:A,B`) names it: its kind and the argument after the colon."""

    kind: str
    arg: str = ""

    def __str__(self) -> str:  # the drafter's name in statistics and reports
        return f"{self.kind}:{self.arg}" if self.arg else self.kind


@dataclass(frozen=True)
class DrafterChoice:
    """What `--drafter` asked for: `specs` the drafters to build (none: plain decoding); with `auto`
    the adaptive policy chooses among them each round, and none named means auto's own default for
    the target (`drafters.build.auto_drafter_specs`)."""

    specs: tuple[DrafterSpec, ...]
    auto: bool = False


def drafter_help(default: str = "ngram") -> str:
    return f"{' | '.join(DRAFTER_KINDS)} (default: {default})"


def kind_names() -> list[str]:
    return list(KINDS)


def parse_drafter_spec(text: str) -> DrafterChoice:
    """The spec checked and parsed, before anything is loaded: an unknown kind is named with the closest
    known one, a bad argument with what the kind takes."""
    kind, _, arg = text.strip().partition(":")
    if kind == "auto":
        parts = [part.strip() for part in arg.split(",")] if arg else []
        if any(not part or part.partition(":")[0] in ("auto", "none") for part in parts):
            raise ConfigError(f"auto:A,B,... needs drafter specs other than none and auto, got '{arg}'")
        return DrafterChoice(tuple(_parse_one(part, text) for part in parts), auto=True)
    spec = _parse_one(text.strip(), text)
    if spec.kind == "none":
        if spec.arg:
            raise ConfigError(f"unknown drafter '{text.strip()}'; choose one of: {', '.join(DRAFTER_KINDS)}")
        return DrafterChoice(())
    return DrafterChoice((spec,))


def _parse_one(part: str, whole: str) -> DrafterSpec:
    kind, _, arg = part.partition(":")
    if kind not in KINDS:
        close = difflib.get_close_matches(kind, list(KINDS), n=1)
        hint = f"did you mean '{close[0]}{':' + arg if arg else ''}'? " if close else ""
        raise ConfigError(f"unknown drafter '{whole.strip()}'; {hint}choose one of: {', '.join(DRAFTER_KINDS)}")
    check = KINDS[kind].check
    if check is not None:
        check(arg)
    return DrafterSpec(kind, arg)
