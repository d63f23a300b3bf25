"""Write the default model's dear twins: its GGUF widened by zero MLP blocks to the pass cost of
Llama-3.2-1B, Llama-3.2-3B and Llama-3.1-8B (specdec/runtime/gguf_twin.py says what they stand for).

    python scripts/dear_twin.py --out-dir twins                 # 1b, 3b and 8b, in the stored type (Q4_1)
    python scripts/dear_twin.py 8b --out-dir twins --q4-k-m --llama-python .venv/bin/python

Each twin is twin-<size>-Q4_1.gguf; with --q4-k-m, llama.cpp's quantizer (run by a python that has
llama-cpp-python) also requantizes it to twin-<size>-Q4_K_M.gguf: its logits are then those of the
default model requantized to Q4_K_M, not of the shipped Q4_1 file. The widths and bytes are printed.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
from pathlib import Path

import gguf
from rich.progress import Progress

from specdec.errors import SpecdecError
from specdec.runtime.gguf_synthetic import SHAPES
from specdec.runtime.gguf_twin import TWINS, file_pass_bytes, pass_bytes, twin_width, write_twin
from specdec.runtime.loading import builtin_gguf_path

from llama_quantize import quantize  # scripts/llama_quantize.py

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("twins", nargs="*", metavar="TWIN", help=f"which: {', '.join(TWINS)} (default: all)")
    parser.add_argument("--out-dir", type=Path, required=True)
    parser.add_argument("--q4-k-m", action="store_true", help="also requantize each twin to Q4_K_M with llama.cpp")
    parser.add_argument("--llama-python", type=Path, help="a python with llama-cpp-python (for --q4-k-m)")
    parser.add_argument("--force", action="store_true", help="write over twins already there")
    args = parser.parse_args()
    unknown = [twin for twin in args.twins if twin not in TWINS]
    if unknown:
        sys.exit(f"unknown twin {unknown[0]!r}; choose from {', '.join(TWINS)}")
    if args.q4_k_m and args.llama_python is None:
        sys.exit("--q4-k-m needs --llama-python: a python with llama-cpp-python installed")
    source = builtin_gguf_path("smollm2-135m")
    reader = gguf.GGUFReader(str(source))
    args.out_dir.mkdir(parents=True, exist_ok=True)
    print(f"{source.name}: a pass reads {file_pass_bytes(reader) / 1e6:.0f} MB")
    for twin in args.twins or list(TWINS):
        width = twin_width(reader, twin)
        path = args.out_dir / f"twin-{twin}-Q4_1.gguf"
        target = pass_bytes(SHAPES[TWINS[twin]])
        if path.exists() and not args.force:
            print(f"{path} exists (--force to write it again)")
        else:
            try:
                with Progress() as progress:
                    task = progress.add_task(f"writing {path.name}", total=1.0)
                    write_twin(path, source, width,
                               progress=lambda done, total: progress.update(task, completed=done / total))
            except SpecdecError as err:
                sys.exit(f"error: {err}")
        print(f"{path}: MLP {width}, a pass reads {file_pass_bytes(reader, mlp=width) / 1e6:.0f} MB "
              f"({TWINS[twin]} Q4_K_M: {target / 1e6:.0f} MB); file {path.stat().st_size / 1e6:.0f} MB")
        if args.q4_k_m:
            quantized = args.out_dir / f"twin-{twin}-Q4_K_M.gguf"
            try:
                quantize(args.llama_python, path, quantized, "Q4_K_M")
            except subprocess.CalledProcessError as err:
                sys.exit(f"error: llama.cpp's quantizer failed on {path} (exit {err.returncode})")
            print(f"{quantized}: file {quantized.stat().st_size / 1e6:.0f} MB")


if __name__ == "__main__":
    main()
