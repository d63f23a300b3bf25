"""The heads shipped with the package (`heads/shipped/<model>-<kind>/`, trained for the default model):
which fits a loaded target, or which is shipped for a model named by the user (export)."""

from __future__ import annotations

from pathlib import Path

from specdec.errors import ConfigError
from specdec.heads.files import fits

SHIPPED_HEADS = Path(__file__).resolve().parent / "shipped"


def shipped_folders(kind: str) -> list[Path]:
    """The shipped heads of this kind (eagle, eagle3, medusa), by folder name."""
    return sorted(SHIPPED_HEADS.glob(f"*-{kind}")) if SHIPPED_HEADS.is_dir() else []


def fitting_shipped_head(target, kind: str) -> Path | None:
    """The folder of a shipped head of this kind that fits the loaded target (`heads.files.fits`: the
    default model, its dear twins, another file of it), or None."""
    return next((folder for folder in shipped_folders(kind) if fits(folder, target)), None)


def shipped_head(target, kind: str) -> Path:
    """The folder of a shipped head of this kind that fits the loaded target, or a clear error."""
    folder = fitting_shipped_head(target, kind)
    if folder is None:
        raise ConfigError(f"no shipped {kind} head fits {target.name} (shipped: {_names(kind)}, each for the model "
                          f"it was trained on); train one with `specdec train {kind} --model {target.name}` and pass "
                          f"{kind}:PATH")
    return folder


def shipped_head_for(model: str, kind: str) -> Path:
    """The folder of the head of this kind shipped for the model named `model` (no model is loaded)."""
    folder = SHIPPED_HEADS / f"{model}-{kind}"
    if not folder.is_dir():
        raise ConfigError(f"no {kind} head is shipped for {model} (shipped: {_names(kind)}); train one with "
                          f"`specdec train {kind}` and pass its folder")
    return folder


def _names(kind: str) -> str:
    return ", ".join(folder.name for folder in shipped_folders(kind)) or "none"
