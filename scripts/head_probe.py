"""Keep a head's probe features (heads/files.py) beside a head saved before heads kept them.

    python scripts/head_probe.py --model smollm2-135m specdec/heads/shipped/*

Runs the probe through the model the heads were trained for (as `specdec` loads it by default) and
writes target_probe.safetensors into each head folder; `auto` then offers a shipped head to every
target whose features match (the model's other files, its dear twins).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

from specdec.heads.files import CONFIG, read_layers, save_probe
from specdec.runtime import load_model


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--model", required=True, help="the model the heads were trained for")
    parser.add_argument("heads", nargs="+", type=Path, help="head folders (head.json + head.safetensors)")
    args = parser.parse_args()
    net = load_model(args.model).net
    for folder in args.heads:
        config = json.loads((folder / CONFIG).read_text())["config"]
        save_probe(folder, net, read_layers(config))
        print(f"{folder}: probe of layers {list(read_layers(config)) or 'final'} written")


if __name__ == "__main__":
    main()
