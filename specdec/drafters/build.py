"""From a parsed `--drafter` choice (`spec.py`) to the drafters an `Engine` takes: each kind built by the
function its row of `spec.KINDS` names, imported then; `auto`'s own set for a target."""

from __future__ import annotations

from importlib import import_module

from specdec.drafters.base import Drafter
from specdec.drafters.spec import KINDS, DrafterChoice, DrafterSpec, parse_drafter_spec
from specdec.heads.shipped import fitting_shipped_head
from specdec.runtime.weight_formats import weight_bytes

# Where a pass reads this many bytes of weights or more (a 1B-class model and up), `auto` takes a shipped
# EAGLE-3 head's chain beside its tree. Measured (docs/bench/twin-sizes, greedy, each `auto` beside the
# other in one run): at the 8B twin (4.6 GB) the chain raised `auto` 4-10% (three runs, two hosts, both
# orders), at the 1B twin (0.8 GB) 4-8% (both orders); on the 135M model (0.1 GB), where a pass costs a
# few ms, it gained nothing and lost up to 7% at T = 1 (docs/bench/chain-in-auto-135m).
DEAR_PASS_BYTES = 500_000_000


def build_drafters(choice: DrafterChoice | str, target, *, device: str = "cpu", dtype: str = "float32",
                   runtime: str = "lean") -> list[Drafter]:
    """The drafters of a choice (a spec's text is parsed first): none for `none`, several for `auto`
    (the engine's adaptive policy chooses among them each round), else one. `device`, `dtype` and
    `runtime`: how a draft model loads (as the target did)."""
    if isinstance(choice, str):
        choice = parse_drafter_spec(choice)
    specs = auto_drafter_specs(target) if choice.auto and not choice.specs else choice.specs
    return [build_one(spec, target, device=device, dtype=dtype, runtime=runtime) for spec in specs]


def build_one(spec: DrafterSpec, target, **load) -> Drafter:
    """One drafter, by its kind's builder (`spec.KINDS`)."""
    module, _, function = KINDS[spec.kind].builder.partition(":")
    return getattr(import_module(module), function)(spec, target, **load)


def auto_drafter_specs(target) -> tuple[DrafterSpec, ...]:
    """The drafters `auto` chooses among when none are named: suffix lookup, and on the lean runtime
    early exit and a shipped EAGLE-3 head that fits the target (`heads.files.fits`: the default
    model, its dear twins, another file of it), if there is one: its tree, and where a pass reads at
    least DEAR_PASS_BYTES of weights also its chain. Not ngram: suffix finds every match it does (the
    longest, over the request and earlier answers), and a lookup asked every round costs time every
    round (on the dev prompts, greedy, auto committed as many tokens per pass without it)."""
    specs = [DrafterSpec("suffix")]
    config = getattr(target.net, "config", None)
    if config is not None and config.num_layers >= 4:  # the lean runtime: early exit is available
        specs.append(DrafterSpec("early", str(config.num_layers // 4)))
    if config is not None and fitting_shipped_head(target, "eagle3") is not None:
        if weight_bytes(target.net) >= DEAR_PASS_BYTES:
            specs.append(DrafterSpec("eagle3-chain"))
        specs.append(DrafterSpec("eagle3"))
    return tuple(specs)
