"""Drafters: one file per proposer, all following `base.Drafter`.

    spec.py         the `--drafter` kinds in one table (syntax, meaning, argument check, builder) and
                    the spec parsed once into a DrafterChoice (no torch: checked before any model loads)
    build.py        build_drafters: a choice's drafters, each by its kind's builder; auto's own set
    base.py         the interface (Draft, Drafter), features, drafting a chain one token at a time
    ngram.py        prompt lookup (PromptLookupDrafter)
    suffix.py       suffix automata over the request, earlier outputs and a corpus (SuffixDrafter)
    draft_model.py  a separate draft model (DraftModelDrafter)
    early_exit.py   the target's own first layers (EarlyExitDrafter)
    eagle.py        EAGLE and EAGLE-3 heads, as a chain or a dynamic tree (EagleDrafter)
    medusa.py       Medusa heads verified as a static tree (MedusaDrafter)

Nothing is imported here until it is asked for: `from specdec.drafters import build_drafters` (or a
drafter class) imports its module then, so that reading a spec (`spec.py`) loads no model code.
"""

from __future__ import annotations

from importlib import import_module

_HOMES = {  # public name: the module that defines it
    "build_drafters": "build", "auto_drafter_specs": "build", "parse_drafter_spec": "spec",
    "DrafterChoice": "spec", "DrafterSpec": "spec", "Draft": "base", "Drafter": "base",
    "PromptLookupDrafter": "ngram", "SuffixDrafter": "suffix", "DraftModelDrafter": "draft_model",
    "EarlyExitDrafter": "early_exit", "EagleDrafter": "eagle", "MedusaDrafter": "medusa",
}
__all__ = list(_HOMES)


def __getattr__(name: str):
    if name not in _HOMES:
        raise AttributeError(f"module 'specdec.drafters' has no attribute '{name}'")
    return getattr(import_module(f"specdec.drafters.{_HOMES[name]}"), name)
