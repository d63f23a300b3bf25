"""A trained head on disk: `head.safetensors` (its weights), `head.json` (kind, config, target,
how it was trained) and `target_probe.safetensors` (what the head reads of its target on a fixed
probe). Only safetensors are read: nothing is unpickled.

Which targets a head fits. A head reads its target's features (an EAGLE or Medusa head the final
hidden states, an EAGLE-3 head the residual stream entering its `aux_layers`), so it fits a target
whose features are its own target's: the probe is PROBE_TOKENS fixed token ids run through the target
when the head is saved, and the features of the layers the head reads kept beside it. A target fits
where it has the head's hidden size, vocabulary and layers, and its features on the probe have a
cosine similarity of at least PROBE_FIT with the kept ones in every row: the same model in another
runtime or file type does (a quantized pass moves the features by far less), its dear twins do (bit
for bit the same), a model of the same shape with other weights does not. `auto` includes a shipped
head that fits (drafters/__init__.py), whatever the target's name."""

from __future__ import annotations

import json
import weakref
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import ConfigError

WEIGHTS, CONFIG, PROBE = "head.safetensors", "head.json", "target_probe.safetensors"
KINDS = ("eagle", "eagle3", "medusa")
PROBE_TOKENS = 32  # token ids of the probe, drawn once with PROBE_SEED from the target's vocabulary
PROBE_SEED = 20261206
PROBE_FIT = 0.99  # the least cosine similarity, row by row, of a target's probe features and the head's


def save_head(folder: Path, kind: str, config: dict, state: dict[str, torch.Tensor], info: dict, net=None) -> None:
    """Write a head; trained for the model `net`, given, its probe features are kept beside it."""
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (WEIGHTS + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    tmp.replace(folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps({"kind": kind, "config": config, **info}, indent=1))
    if net is not None:
        save_probe(folder, net, read_layers(config))


def read_layers(config: dict) -> tuple[int, ...]:
    """The target layers whose inputs a head reads (an EAGLE-3 head's aux layers); () for the final
    hidden states (EAGLE, Medusa)."""
    return tuple(config.get("aux_layers") or ())


def probe_features(net, layers: tuple[int, ...]) -> torch.Tensor:
    """[PROBE_TOKENS, len(layers) × hidden or hidden] float32: what a head reading `layers` reads of
    `net` on the probe; run once per net and layers (`auto` asks whether a head fits, then builds it)."""
    probed = _PROBED.setdefault(net, {})
    if layers not in probed:
        probed[layers] = _run_probe(net, layers)
    return probed[layers]


_PROBED: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()  # net → {layers: its probe features}


def _run_probe(net, layers: tuple[int, ...]) -> torch.Tensor:
    from specdec.runtime.llama import Segment

    ids = torch.randint(0, net.config.vocab_size, (PROBE_TOKENS,), generator=torch.Generator().manual_seed(PROBE_SEED))
    cache = net.new_cache(PROBE_TOKENS)
    out = net.forward_segments(ids.to(net.device), [Segment(cache, PROBE_TOKENS)], return_hidden=True, aux_layers=layers)
    features = torch.cat([out[2][layer] for layer in layers], dim=-1) if layers else out[1]  # [T, F]
    return features.float().cpu()


def save_probe(folder: Path, net, layers: tuple[int, ...]) -> None:
    save_file({"features": probe_features(net, layers).contiguous()}, str(Path(folder) / PROBE))


def probe_fit(folder: Path, target) -> float | None:
    """The least cosine similarity over the probe's rows between the features `target` gives and
    those the head's target gave; None where the head keeps no probe or cannot read this target
    (another hidden size, vocabulary, too few layers, not the lean runtime)."""
    folder = Path(folder)
    config, net = _read_config(folder), target.net
    model = getattr(net, "config", None)
    if config is None or not (folder / PROBE).is_file() or model is None or not hasattr(net, "forward_segments"):
        return None
    layers = read_layers(config)
    hidden = config.get("target_hidden_size", config.get("hidden_size"))
    if (hidden, config.get("vocab_size")) != (model.hidden_size, model.vocab_size) or \
            any(not 0 <= layer < model.num_layers for layer in layers):
        return None
    try:
        kept = load_file(str(folder / PROBE))["features"]
    except Exception:  # a damaged probe: the head is not offered (an explicit path still loads it)
        return None
    features = probe_features(net, layers)
    if features.shape != kept.shape:
        return None
    return float(torch.nn.functional.cosine_similarity(features, kept, dim=-1).min())


def fits(folder: Path, target) -> bool:
    """Whether the head in `folder` reads `target` as it read the model it was trained for."""
    fit = probe_fit(folder, target)
    return fit is not None and fit >= PROBE_FIT


def _read_config(folder: Path) -> dict | None:
    try:
        meta = json.loads((folder / CONFIG).read_text())
    except (OSError, ValueError):
        return None
    return meta.get("config") if isinstance(meta.get("config"), dict) else None


def load_head(folder: Path, kind: str, target) -> tuple[dict, dict[str, torch.Tensor]]:
    """(the JSON, the weights) of a head folder trained for `target`; clear errors for a missing,
    unreadable or wrong one."""
    folder = Path(folder).expanduser()
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise ConfigError(f"{folder} is not a trained head: it needs {CONFIG} and {WEIGHTS} "
                          f"(make one with `specdec train {kind}`)")
    try:
        meta = json.loads((folder / CONFIG).read_text())
    except ValueError as e:
        raise ConfigError(f"{folder / CONFIG} is not valid JSON: {e}") from e
    if meta.get("kind") != kind:
        raise ConfigError(f"{folder} holds a {meta.get('kind')!r} head, not {kind!r}")
    check_target(meta, target)
    try:
        return meta, load_file(str(folder / WEIGHTS))
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise ConfigError(f"{folder / WEIGHTS} is not a readable safetensors file ({e}); train the head again") from e


def check_target(meta: dict, target) -> None:
    """Refuse a head trained for another model (its features would mean nothing)."""
    config = target.net.config
    if not isinstance(meta.get("config"), dict):
        raise ConfigError("the head's JSON has no config")
    want = {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size}
    have = {k: meta["config"].get(k) for k in want}
    if have != want:
        raise ConfigError(f"this head was trained for a model with {have} ({meta.get('target', '?')}); "
                          f"the target has {want}")


def load_module(folder: Path, kind: str, target, build) -> torch.nn.Module:
    """The head in `folder`, built by `build(config dict)`, its weights loaded, on the target's device
    and in its dtype, in eval mode."""
    meta, weights = load_head(folder, kind, target)
    module = build(meta["config"])
    module.load_state_dict(weights)
    return module.to(device=target.net.device, dtype=target.net.dtype).eval()
