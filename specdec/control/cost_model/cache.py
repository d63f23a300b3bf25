"""The cost model's cache file: one JSON file per machine and model under `$SPECDEC_COSTS_DIR`
(default: `<specdec cache>/costs`), named by a key that hashes what the timings depend on: the
machine (CPU or GPU model, threads, torch version), the model (its config and weight files), device,
dtype, runtime, kernels and KV-cache type. Draft costs are kept by drafter name with the digest of
the drafter's own weights (a head, a draft model: `Drafter.weights_digest`)."""

from __future__ import annotations

import hashlib
import json
import os
import platform
from pathlib import Path

import torch

from specdec.cache_dir import cache_root
from specdec.control.cost_model.model import FORMAT_VERSION, CostModel


def costs_dir() -> Path:
    return Path(os.environ.get("SPECDEC_COSTS_DIR") or cache_root() / "costs")


def machine_description(device: torch.device) -> dict:
    if device.type == "cuda":
        processor = torch.cuda.get_device_name(device)
    else:
        processor = platform.processor() or platform.machine()
        try:
            for line in Path("/proc/cpuinfo").read_text().splitlines():
                if line.startswith("model name"):
                    processor = line.split(":", 1)[1].strip()
                    break
        except OSError:
            pass
    return {"processor": processor, "cpus": os.cpu_count(), "threads": torch.get_num_threads(),
            "torch": torch.__version__, "device": str(device)}


def cost_key(model) -> tuple[str, dict]:
    description = {"machine": machine_description(model.net.device), "model": model.description()}
    key = hashlib.sha256(json.dumps(description, sort_keys=True).encode()).hexdigest()[:20]
    return key, description


def read_cached(path: Path, key: str) -> CostModel | None:
    """The cost model in `path` if it is one of this format and `key`; None if absent or unreadable."""
    if not path.is_file():
        return None
    try:
        data = json.loads(path.read_text())
        if data.get("version") == FORMAT_VERSION and data.get("key") == key:
            return CostModel.from_json(data)
    except (OSError, ValueError, KeyError, TypeError):
        pass  # unreadable or from another version: measured again and overwritten
    return None


def write_cached(path: Path, costs: CostModel) -> None:
    """Write `costs` to `path` whole (a temporary file, renamed); a read-only cache only costs a
    measurement next time."""
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.with_suffix(".tmp")
        tmp.write_text(json.dumps(costs.to_json(), indent=1))
        tmp.replace(path)
    except OSError:
        pass
