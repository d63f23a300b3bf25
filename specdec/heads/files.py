"""A trained head on disk: `head.safetensors` (its weights) and `head.json` (kind, config, target,
how it was trained). Only safetensors are read: nothing is unpickled."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import load_file, save_file

from specdec.errors import ConfigError

WEIGHTS, CONFIG = "head.safetensors", "head.json"
KINDS = ("eagle", "eagle3", "medusa")


def save_head(folder: Path, kind: str, config: dict, state: dict[str, torch.Tensor], info: dict) -> None:
    folder = Path(folder)
    folder.mkdir(parents=True, exist_ok=True)
    tmp = folder / (WEIGHTS + ".tmp")
    save_file({k: v.detach().contiguous().cpu() for k, v in state.items()}, str(tmp))
    tmp.replace(folder / WEIGHTS)
    (folder / CONFIG).write_text(json.dumps({"kind": kind, "config": config, **info}, indent=1))


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
