"""What is exported: a head folder (head.json + head.safetensors) and the target it was trained for."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

import torch
from safetensors.torch import load_file

from specdec.errors import ConfigError
from specdec.heads.files import CONFIG, KINDS, WEIGHTS
from specdec.heads.shipped import shipped_head_for
from specdec.runtime.config import ModelConfig
from specdec.runtime.loading import DEFAULT_MODEL, resolve_model_source


@dataclass
class HeadFiles:
    folder: Path
    kind: str  # eagle | eagle3 | medusa
    meta: dict  # head.json
    state: dict[str, torch.Tensor]  # head.safetensors

    @property
    def target(self) -> str:
        """The target it was trained for, as head.json names it (a built-in name or a path)."""
        return str(self.meta.get("target") or DEFAULT_MODEL)


@dataclass
class Target:
    spec: str  # as given: built-in name, folder or .gguf
    folder: Path  # its Hugging Face folder (config.json, tokenizer)
    gguf: Path | None  # the GGUF it was converted from, if any
    config: ModelConfig


def head_folder(head: str, model: str | None) -> Path:
    """HEAD as given: a head folder, or a kind (eagle3, medusa, ...) for the head shipped for the model."""
    path = Path(head).expanduser()
    if path.is_dir():
        return path
    if head in KINDS:
        return shipped_head_for(model or DEFAULT_MODEL, head)
    raise ConfigError(f"{head} is neither a head folder nor a shipped head ({', '.join(KINDS)})")


def read_head(folder: Path) -> HeadFiles:
    if not (folder / CONFIG).is_file() or not (folder / WEIGHTS).is_file():
        raise ConfigError(f"{folder} is not a trained head: it needs {CONFIG} and {WEIGHTS}")
    try:
        meta = json.loads((folder / CONFIG).read_text())
    except ValueError as e:
        raise ConfigError(f"{folder / CONFIG} is not valid JSON: {e}") from e
    if meta.get("kind") not in KINDS or not isinstance(meta.get("config"), dict):
        raise ConfigError(f"{folder / CONFIG} names no head kind ({', '.join(KINDS)}) and config")
    try:
        state = load_file(str(folder / WEIGHTS))
    except Exception as e:  # safetensors raises its own error type for a damaged file
        raise ConfigError(f"{folder / WEIGHTS} is not a readable safetensors file ({e})") from e
    return HeadFiles(folder, meta["kind"], meta, state)


def read_target(spec: str) -> Target:
    """The target's config only (its weights are not needed to export an EAGLE-3 head)."""
    folder, gguf = resolve_model_source(spec)
    return Target(spec, folder, gguf, ModelConfig.from_hf(json.loads((folder / "config.json").read_text())))


def check_target(config, target: Target) -> None:
    """Refuse a head trained for another model (its features would mean nothing there)."""
    have = {"hidden_size": config.hidden_size, "vocab_size": config.vocab_size}
    want = {"hidden_size": target.config.hidden_size, "vocab_size": target.config.vocab_size}
    if have != want:
        raise ConfigError(f"this head was trained for a model with {have}; the target {target.spec} has {want} "
                          "(give the right one with --model)")
