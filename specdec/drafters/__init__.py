"""Drafters: one file per proposer, all following `base.Drafter`.

`build_drafters` turns a command-line spec into the list of drafters an `Engine` takes:
    none            plain decoding (no drafter: an empty list)
    ngram[:N]       prompt lookup with n-grams of 2 to N tokens (default 4)
    draft:MODEL     a separate draft model (built-in name, folder or .gguf) sharing the target's tokenizer
    early:L         self-speculation: the target's own first L layers, norm and LM head
    suffix[:PATH]   suffix automata over the request, this drafter's earlier outputs and, optionally,
                    a corpus (file, folder or JSON lines)
    eagle[:PATH]    an EAGLE head (`specdec train eagle`) drafting a chain; without PATH a shipped
                    head that fits the target (the default model's, for it and its dear twins)
    eagle-tree[:PATH]  the same head drafting a dynamic tree (EAGLE-2) of at most 16 nodes, 4 per level
    eagle3[:PATH]   an EAGLE-3 head (`specdec train eagle3`) drafting a dynamic tree as eagle-tree;
                    without PATH a shipped head that fits the target
    eagle3-chain[:PATH]  the same head drafting a chain
    medusa[:PATH]   Medusa heads (`specdec train medusa`), their candidates verified as a static tree
    auto[:A,B,...]  the adaptive policy picks among these drafters each round (default: suffix
                    and, on the lean runtime, early exit at a quarter of the layers and a shipped
                    EAGLE-3 head that fits the target, where there is one)
"""

from __future__ import annotations

from pathlib import Path

from specdec.drafters.base import Draft, Drafter
from specdec.drafters.draft_model import DraftModelDrafter
from specdec.drafters.eagle import EagleDrafter, load_eagle3_head, load_eagle_head
from specdec.drafters.early_exit import EarlyExitDrafter
from specdec.drafter_kinds import DRAFTER_KINDS, check_drafter_spec
from specdec.drafters.medusa import MedusaDrafter, load_medusa_heads
from specdec.drafters.ngram import PromptLookupDrafter
from specdec.drafters.suffix import SuffixDrafter, read_corpus
from specdec.errors import ConfigError
from specdec.heads.files import fits
from specdec.runtime.loading import LanguageModel, load_model

TREE_BUDGET, TREE_TOP_K = 16, 4  # eagle-tree: nodes verified per round, candidates per expanded node
SHIPPED_HEADS = Path(__file__).resolve().parent.parent / "heads" / "shipped"  # trained for the default model


def auto_drafter_specs(target: LanguageModel) -> list[str]:
    """The drafters `auto` chooses among when none are named: suffix lookup, and on the lean runtime
    early exit and a shipped EAGLE-3 head that fits the target (`heads.files.fits`: the default
    model, its dear twins, another file of it), if there is one. Not ngram: suffix finds
    every match it does (the longest, over the request and earlier answers), and a lookup asked every
    round costs time every round (on the dev prompts, greedy, auto committed as many tokens per pass
    without it)."""
    specs = ["suffix"]
    config = getattr(target.net, "config", None)
    if config is not None and config.num_layers >= 4:  # the lean runtime: early exit is available
        specs.append(f"early:{config.num_layers // 4}")
    if config is not None and fitting_shipped_head(target, "eagle3") is not None:
        specs.append("eagle3")
    return specs


def build_drafters(
    spec: str, target: LanguageModel, *, device: str = "cpu", dtype: str = "float32", runtime: str = "lean"
) -> list[Drafter]:
    """The drafters of a spec: none for `none`, several for `auto` (the engine's adaptive policy
    chooses among them each round), else one."""
    kind, _, arg = spec.strip().partition(":")
    if kind == "auto":
        specs = [a.strip() for a in arg.split(",")] if arg else auto_drafter_specs(target)
        if any(not a or a.partition(":")[0] in ("auto", "none") for a in specs):
            raise ConfigError(f"auto:A,B,... needs drafter specs other than none and auto, got '{arg}'")
        return [build_one(a, target, device=device, dtype=dtype, runtime=runtime) for a in specs]
    if kind == "none" and not arg:
        return []
    return [build_one(spec, target, device=device, dtype=dtype, runtime=runtime)]


def build_one(spec: str, target: LanguageModel, *, device: str, dtype: str, runtime: str) -> Drafter:
    """One drafter from a spec other than none and auto."""
    kind, _, arg = spec.strip().partition(":")
    if kind == "ngram":
        if not arg:
            return PromptLookupDrafter()
        if not arg.isdigit() or int(arg) < 1:
            raise ConfigError(f"ngram:N needs a whole number N >= 1, got '{arg}'")
        return PromptLookupDrafter(max_ngram=int(arg), min_ngram=min(2, int(arg)))  # ngram:1 matches one token
    if kind == "draft":
        if not arg:
            raise ConfigError("draft:MODEL needs a model: a built-in name, a folder or a .gguf file")
        draft = load_model(arg, device=device, dtype=dtype, runtime=runtime)
        return DraftModelDrafter(draft, target)
    if kind == "early":
        if not arg.isdigit():
            raise ConfigError(f"early:L needs the number of layers to draft with, e.g. early:8; got '{arg}'")
        return EarlyExitDrafter(target, int(arg))
    if kind == "suffix":
        if not arg:
            return SuffixDrafter(learn_outputs=True)
        encode = lambda text: target.tokenizer.encode(text, add_special_tokens=False)  # noqa: E731
        return SuffixDrafter(read_corpus(Path(arg).expanduser(), encode), learn_outputs=True)
    if kind in ("eagle", "eagle-tree"):
        folder = Path(arg).expanduser() if arg else shipped_head(target, "eagle")
        tree = dict(tree_budget=TREE_BUDGET, top_k=TREE_TOP_K) if kind == "eagle-tree" else {}
        return EagleDrafter(target, load_eagle_head(folder, target), name=spec.strip(), **tree)
    if kind in ("eagle3", "eagle3-chain"):
        folder = Path(arg).expanduser() if arg else shipped_head(target, "eagle3")
        tree = dict(tree_budget=TREE_BUDGET, top_k=TREE_TOP_K) if kind == "eagle3" else {}
        return EagleDrafter(target, load_eagle3_head(folder, target), name=spec.strip(), **tree)
    if kind == "medusa":
        folder = Path(arg).expanduser() if arg else shipped_head(target, "medusa")
        return MedusaDrafter(target, load_medusa_heads(folder, target), name=spec.strip())
    check_drafter_spec(spec)  # an unknown kind, named with the closest known one
    raise ConfigError(f"unknown drafter '{spec}'; choose one of: {', '.join(DRAFTER_KINDS)}")  # e.g. none:ARG


def fitting_shipped_head(target: LanguageModel, kind: str) -> Path | None:
    """The folder of a shipped head of this kind that fits the target (`heads.files.fits`), or None."""
    folders = sorted(SHIPPED_HEADS.glob(f"*-{kind}")) if SHIPPED_HEADS.is_dir() else []
    return next((folder for folder in folders if fits(folder, target)), None)


def shipped_head(target: LanguageModel, kind: str) -> Path:
    """The folder of a shipped head of this kind that fits the target, or a clear error."""
    folder = fitting_shipped_head(target, kind)
    if folder is None:
        shipped = sorted(p.name for p in SHIPPED_HEADS.glob(f"*-{kind}")) if SHIPPED_HEADS.is_dir() else []
        raise ConfigError(f"no shipped {kind} head fits {target.name} (shipped: {', '.join(shipped) or 'none'}, each "
                          f"for the model it was trained on); train one with `specdec train {kind} --model "
                          f"{target.name}` and pass {kind}:PATH")
    return folder


__all__ = ["Draft", "Drafter", "DraftModelDrafter", "EagleDrafter", "EarlyExitDrafter", "MedusaDrafter",
           "PromptLookupDrafter", "SuffixDrafter", "build_drafters"]
