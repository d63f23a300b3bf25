"""Write a GGUF with the shapes of a named model and random weights, in any type (for benchmarks).

    python scripts/synthetic_gguf.py llama-3.2-1b Q4_K_M -o llama-3.2-1b-Q4_K_M.gguf
    python scripts/synthetic_gguf.py llama-3.1-8b Q8_0 -o 8b-q8.gguf --layers 2   # a small version

Shapes: llama-3.2-1b, llama-3.2-3b, llama-3.1-8b, qwen2.5-1.5b. Types: Q4_0, Q4_1, Q5_0, Q5_1,
Q8_0, Q2_K, Q3_K, Q6_K, and the mixes Q4_K_M and Q5_K_M (each tensor typed as llama.cpp's
quantizer types it). The blocks are random (valid for every type), the tokenizer is the default
model's; see specdec/runtime/gguf_synthetic.py.
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from rich.progress import Progress

from specdec.runtime.gguf_synthetic import BLOCKS, SHAPES, write_gguf
from specdec.runtime.loading import builtin_gguf_path

FILE_TYPES = [*BLOCKS, "Q4_K_M", "Q5_K_M", "F16", "F32"]


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("shape", choices=sorted(SHAPES))
    parser.add_argument("file_type", choices=FILE_TYPES)
    parser.add_argument("-o", "--out", type=Path, required=True)
    parser.add_argument("--layers", type=int, help="fewer layers than the model has (same widths)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    shape = SHAPES[args.shape] if args.layers is None else SHAPES[args.shape].small(args.layers)
    if args.out.exists():
        sys.exit(f"{args.out} exists; remove it or choose another --out")
    with Progress() as progress:
        task = progress.add_task(f"writing {args.out.name}", total=shape.layers)
        write_gguf(args.out, shape, args.file_type, builtin_gguf_path("smollm2-135m"), seed=args.seed,
                   progress=lambda done, total: progress.update(task, completed=done))
    print(f"{args.out}: {args.out.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
