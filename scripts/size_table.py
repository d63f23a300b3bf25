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
import os
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
    parser.add_argument("--cost-repeats", type=int, default=5, help="repeats of each T(k) pass (median)")
    parser.add_argument("--report-only", action="store_true", help="write report.md from results.jsonl, run nothing")
    parser.add_argument("--alpha", type=float, default=0.44,
                        help="acceptance for the prediction (default: ngram's on Spec-Bench, docs/bench/runtime-llama-cpp)")
    args = parser.parse_args()
    args.out.mkdir(parents=True, exist_ok=True)
    if args.report_only:
        write_report(args.out, args.alpha)
        return
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
                rows[backend].append(bench(python, backend, path, ["--new-tokens", str(args.new_tokens),
                                                                   "--repeats", str(args.cost_repeats)]))
        record = {"file": path.name, "size_mb": round(path.stat().st_size / 1e6), "first_load_s": first["load_s"],
                  **{b: summary(r) for b, r in rows.items()}}
        with results.open("a") as out:
            out.write(json.dumps(record) + "\n")
        print(json.dumps(record), flush=True)
    write_report(args.out, args.alpha)


def forget(path: Path) -> None:
    """Remove specdec's cached folder of this file (tokenizer, packed weights): the next load is a first one."""
    from specdec.cache_dir import cache_root

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


def cpu_name() -> str:
    text = Path("/proc/cpuinfo").read_text()
    model = next((line.split(":", 1)[1].strip() for line in text.splitlines() if line.startswith("model name")), "?")
    flags = next((line for line in text.splitlines() if line.startswith("flags")), "")
    isa = "AVX-512 VNNI" if "avx512_vnni" in flags else "AVX2" if "avx2" in flags else "no AVX2"
    return f"{model} ({isa}), {os.cpu_count()} cores"


def predicted_speedup(tk: dict, alpha: float) -> tuple[int, float]:
    """(γ, speed-up) maximising E(γ) T(1) / T(γ + 1) over γ = 1..15 for i.i.d. acceptance α and a free
    drafter (a lookup): a prediction from the measured pass costs, not a measurement."""
    from specdec.control.theory import expected_tokens_per_pass

    return max(((g, expected_tokens_per_pass(alpha, g) / float(tk[str(g + 1)])) for g in range(1, 16)),
               key=lambda x: x[1])


def write_report(out: Path, alpha: float) -> None:
    rows = [json.loads(line) for line in (out / "results.jsonl").read_text().splitlines()]
    lines = ["# specdec beside llama.cpp at sizes from 135M to 8B", "",
             f"CPU: {cpu_name()}; 2 threads each; llama-cpp-python in its own venv. Command: "
             "`scripts/size_table.py` (each backend a separate process per run, in turn; medians of the runs;",
             "`first load` is specdec with its cache of that file removed: tokenizer conversion and packing). "
             "The 1B–8B files are synthetic (`scripts/synthetic_gguf.py`: the shapes of Llama-3.2-1B/3B and "
             "Llama-3.1-8B, random blocks typed as llama.cpp's quantizer types them, the default model's 49,152-token "
             "vocabulary); the 135M files are the real default model (its Q4_1 file, and Q4_K_M / Q8_0 made by "
             "llama.cpp's quantizer from its F16).", "",
             "| file | MB | load: first / later / llama.cpp (s) | peak RSS: ours / llama.cpp (MB) | prefill tok/s: ours / llama.cpp | "
             "decode tok/s: ours / llama.cpp | × llama.cpp | T(1) ms: ours / llama.cpp |", "|---|---:|---|---|---|---|---:|---|"]
    for r in rows:
        a, b = r["specdec"], r["llama.cpp"]
        lines.append(f"| {r['file']} | {r['size_mb']} | {r['first_load_s']:.1f} / {a['load_s']:.2f} / {b['load_s']:.2f} | "
                     f"{a['peak_rss_mb']:.0f} / {b['peak_rss_mb']:.0f} | {a['prefill_tok_s']:.0f} / {b['prefill_tok_s']:.0f} | "
                     f"{a['decode_tok_s']:.1f} / {b['decode_tok_s']:.1f} | **{a['decode_tok_s'] / b['decode_tok_s']:.2f}** | "
                     f"{a['t1_ms']:.1f} / {b['t1_ms']:.1f} |")
    lines += ["", "Pass cost over k new tokens after a 128-token prompt, T(k)/T(1) (ours / llama.cpp), and what it lets "
              f"speculation gain: the **prediction** of the seed formula for a free lookup drafter with i.i.d. "
              f"acceptance α = {alpha} (ngram's pooled acceptance on Spec-Bench with the real 135M model), best γ, "
              "E(γ)·T(1)/T(γ+1) — on our passes and, for contrast, on llama.cpp's:", "",
              "| file | k = 2 | 4 | 8 | 12 | 16 | predicted × plain (γ), ours | on llama.cpp's passes |",
              "|---|---|---|---|---|---|---|---|"]
    for r in rows:
        a, b = r["specdec"]["tk_over_t1"], r["llama.cpp"]["tk_over_t1"]
        cells = " | ".join(f"{float(a[k]):.2f} / {float(b[k]):.2f}" for k in ("2", "4", "8", "12", "16"))
        (ga, sa), (gb, sb) = predicted_speedup(a, alpha), predicted_speedup(b, alpha)
        lines.append(f"| {r['file']} | {cells} | {sa:.2f} ({ga}) | {sb:.2f} ({gb}) |")
    (out / "report.md").write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
