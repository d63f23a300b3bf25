"""`specdec export HEAD --format vllm|sglang|llama.cpp --out DIR`: arguments and the lines printed."""

from __future__ import annotations

import argparse
from pathlib import Path

from specdec.export import FORMATS


def add_arguments(p: argparse.ArgumentParser) -> None:
    p.add_argument("head", help="a head folder (head.json + head.safetensors), or eagle3 / medusa for the head "
                                "shipped for --model")
    p.add_argument("--format", required=True, choices=FORMATS, help="the engine to load it (Medusa: vllm only)")
    p.add_argument("--out", "-o", required=True, type=Path, help="folder to write config.json, model.safetensors, launch.sh")
    p.add_argument("--model", "--target", dest="model", default=None,
                   help="the target: built-in name, Hugging Face folder or .gguf (default: the one head.json names)")
    p.add_argument("--gamma", type=int, default=None,
                   help="draft length for the launch file (default: from the head's validation α, docs/EXPORT.md)")
    p.add_argument("--force", action="store_true", help="write into a non-empty --out, replacing those files")


def run(args, console) -> int:
    from specdec.export.exporter import export_head
    from specdec.export.folder import CONFIG, LAUNCH, WEIGHTS

    with console.status("exporting"):
        done = export_head(args.head, args.format, args.out, args.model, args.gamma, args.force)
    console.print(f"wrote {done.out}/{CONFIG}, {WEIGHTS} ({done.tensors} tensors) and {LAUNCH}: "
                  f"{done.kind} head for {done.fmt}", highlight=False)
    console.print(done.gamma_rule, highlight=False)
    for note in done.notes:
        console.print(f"note: {note}", style="yellow", highlight=False)
    console.print(f"run it with: {done.out}/{LAUNCH}", highlight=False)
    return 0
