"""specdec beside llama.cpp on GGUF files of several sizes and types, in turn, in one run.

    python scripts/size_table.py --llama-python /path/to/venv/bin/python --out docs/bench/sizes \\
        --models /work/models --shape llama-3.2-1b --type Q4_K_M --type Q8_0

For each shape and type it writes the synthetic file once (scripts/synthetic_gguf.py's recipe; the
real default model for `smollm2-135m`, whose other types come from `--file` GGUFs), then runs
`scripts/size_bench.py` as separate processes: specdec with its cache of this file removed (the
first load: tokenizer and packing), then llama.cpp and specdec in turn `--repeats` times. Each
result is a line of results.jsonl; report.md gets the table (medians of the repeats), the CPU named.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True, help="a python with llama-cpp-python installed")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", type=Path, required=True, help="folder for the synthetic files")
    parser.add_argument("--shape", action="append", default=[], help="a shape of gguf_synthetic.SHAPES")
    parser.add_argument("--type", action="append", default=[], help="file types for the shapes")
    parser.add_argument("--file", action="append", default=[], type=Path, help="an existing GGUF to measure too")
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--new-tokens", type=int, default=64)
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    files = list(args.file)
    for shape in args.shape:
        for file_type in args.type:
            path = args.models / f"{shape}-{file_type}.gguf"
            if not path.exists():
                run([sys.executable, str(ROOT / "scripts/synthetic_gguf.py"), shape, file_type, "-o", str(path)])
            files.append(path)
    results = args.out / "results.jsonl"
    for path in files:
        forget(path)
        first = bench(sys.executable, "specdec", path, ["--no-costs", "--new-tokens", "4"])
        rows = {"specdec": [], "llama.cpp": []}
        for _ in range(args.repeats):
            for backend, python in (("llama.cpp", args.llama_python), ("specdec", sys.executable)):
                rows[backend].append(bench(python, backend, path, ["--new-tokens", str(args.new_tokens)]))
        record = {"file": path.name, "size_mb": round(path.stat().st_size / 1e6), "first_load_s": first["load_s"],
                  **{b: summary(r) for b, r in rows.items()}}
        with results.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)


def forget(path: Path) -> None:
    """Remove specdec's cached folder of this file (tokenizer, packed weights): the next load is a first one."""
    from specdec.runtime.gguf_convert import cache_root

    for folder in (cache_root() / "gguf").glob(f"{path.stem}-{path.stat().st_size}-*"):
        shutil.rmtree(folder)


def bench(python: str, backend: str, path: Path, extra: list[str]) -> dict:
    done = run([python, str(ROOT / "scripts/size_bench.py"), backend, str(path), *extra])
    return json.loads(done.stdout.strip().splitlines()[-1])


def run(command: list[str]) -> subprocess.CompletedProcess:
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode:
        sys.exit(f"{' '.join(command)} failed:\n{done.stderr[-3000:]}")
    return done


def summary(rows: list[dict]) -> dict:
    """Medians of the repeats, T(k)/T(1) per k too."""
    keys = ["load_s", "prefill_tok_s", "decode_tok_s", "t1_ms", "peak_rss_mb"]
    out = {k: statistics.median(r[k] for r in rows) for k in keys}
    out["tk_over_t1"] = {k: statistics.median(r["tk_over_t1"][k] for r in rows) for k in rows[0]["tk_over_t1"]}
    out["runs"] = rows
    return out


if __name__ == "__main__":
    main()
