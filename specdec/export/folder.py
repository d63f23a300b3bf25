"""The exported folder: config.json, model.safetensors and launch.sh."""

from __future__ import annotations

import json
from pathlib import Path

import torch
from safetensors.torch import save_file

from specdec.errors import ConfigError

CONFIG, WEIGHTS, LAUNCH = "config.json", "model.safetensors", "launch.sh"


def check(out: Path, force: bool) -> None:
    """Refuse to write into a non-empty folder unless forced (the files written are then replaced):
    asked before the head and the target are read."""
    if out.exists() and not out.is_dir():
        raise ConfigError(f"--out {out} is a file, not a folder")
    if out.is_dir() and any(out.iterdir()) and not force:
        raise ConfigError(f"--out {out} is not empty; choose an empty folder or pass --force to overwrite its files")


def write(out: Path, config: dict, tensors: dict[str, torch.Tensor], launch: str) -> None:
    tmp = out / (WEIGHTS + ".tmp")
    save_file({name: t.detach().contiguous().cpu() for name, t in tensors.items()}, str(tmp))
    tmp.replace(out / WEIGHTS)
    (out / CONFIG).write_text(json.dumps(config, indent=1) + "\n")
    (out / LAUNCH).write_text(launch)
    (out / LAUNCH).chmod(0o755)
