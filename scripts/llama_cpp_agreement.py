"""The real-text check: specdec and llama.cpp on the same K-quant files of the default model.

    python scripts/llama_cpp_agreement.py --llama-python /path/to/venv/bin/python --out docs/bench/llama-cpp-agreement
    python scripts/llama_cpp_agreement.py --model gemma-3-270m --llama-python ... --out docs/bench/llama-cpp-agreement-gemma3

With `--model gemma-3-270m` the second real model's file is compared as published (Q4_K_M), without
re-quantizing, and the drafters are those that apply to it (the shipped heads and the default draft
model are the default model's).

1. The default model's weights (its Q4_1 GGUF, dequantized) are written as an F16 GGUF with the
   same metadata and tokenizer, and llama.cpp's own quantizer (`llama_model_quantize`) makes
   Q4_K_M, Q5_K_M, Q6_K and Q8_0 files from it (hidden 576 is not a multiple of 256, so llama.cpp
   puts Q5_0/Q5_1/Q8_0 where a K-quant cannot go: the files mix types as real ones do).
2. Over `--prompts` dev prompts (shared/workloads/spec_bench_dev.jsonl, the first of each
   category in turn), the sequence is the chat-templated prompt followed by specdec's greedy answer
   (`--new-tokens`); both runtimes compute the logits of every position of that sequence
   (teacher-forced, llama.cpp through llama-cpp-python in the given python).
3. Per type: the share of positions where the two top-1 tokens agree, the largest |Δ logit|, the
   same for llama.cpp against itself (float32 and float16 KV cache) and at the clear positions
   (float32's top two ≥ CLEAR_MARGIN apart), and whether every drafter's greedy output equals
   specdec's plain output on the first prompts: prompt lookup, suffix, early exit, the default
   model's Q4_1 file as a separate draft model, the EAGLE, EAGLE-3 and Medusa heads shipped for the
   default model (chains and trees), and auto.
The last line of output is one JSON object; report.md and results.json go to --out.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import tempfile
from pathlib import Path

import numpy as np

from llama_quantize import FTYPES, quantize  # scripts/llama_quantize.py

ROOT = Path(__file__).resolve().parent.parent
TYPES = list(FTYPES)  # Q4_K_M, Q5_K_M, Q6_K, Q8_0
HEADS = ROOT / "specdec" / "heads" / "shipped"  # trained for the default model, named by path on these files
DRAFTERS = {"ngram": "ngram", "suffix": "suffix", "early:8": "early:8", "draft:smollm2-135m": "draft:smollm2-135m",
            "eagle": f"eagle:{HEADS / 'smollm2-135m-eagle'}", "eagle-tree": f"eagle-tree:{HEADS / 'smollm2-135m-eagle'}",
            "eagle3": f"eagle3:{HEADS / 'smollm2-135m-eagle3'}",
            "eagle3-chain": f"eagle3-chain:{HEADS / 'smollm2-135m-eagle3'}",
            "medusa": f"medusa:{HEADS / 'smollm2-135m-medusa'}", "auto": "auto"}  # name in the report: spec
GEMMA_DRAFTERS = {"ngram": "ngram", "suffix": "suffix", "early:9": "early:9", "auto": "auto"}
KV_CACHES = {"f32_cache": 0, "f16_cache": 1}  # llama.cpp's KV cache type (GGML_TYPE_F32, F16: its default)
CLEAR_MARGIN = 1.0  # logits between the float32 reference's top two: a position no rounding here flips

LLAMA_LOGITS = """
import json, sys, numpy as np
from llama_cpp import Llama
path, seqs, out, kv = sys.argv[1], json.load(open(sys.argv[2])), sys.argv[3], int(sys.argv[4])
longest = max(len(s) for s in seqs)
llm = Llama(path, n_ctx=longest + 8, n_batch=512, n_threads=2, logits_all=True, verbose=False, type_k=kv, type_v=kv)
arrays = []
for ids in seqs:
    llm.reset()
    llm.eval(ids)
    arrays.append(np.array(llm.scores[: len(ids)], dtype=np.float32))
np.savez(out, *arrays)
"""

def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--llama-python", required=True)
    parser.add_argument("--model", choices=("smollm2-135m", "gemma-3-270m"), default="smollm2-135m")
    parser.add_argument("--out", type=Path, required=True)
    parser.add_argument("--models", type=Path, default=Path(tempfile.gettempdir()) / "specdec-agreement")
    parser.add_argument("--prompts", type=int, default=12)
    parser.add_argument("--new-tokens", type=int, default=64)
    parser.add_argument("--greedy-prompts", type=int, default=3, help="prompts for the drafters' greedy check")
    args = parser.parse_args()
    from specdec.runtime.loading import builtin_gguf_path

    args.out.mkdir(parents=True, exist_ok=True)
    args.models.mkdir(parents=True, exist_ok=True)
    prompts = dev_prompts(args.prompts)
    if args.model != "smollm2-135m":  # a file as published, in its own type
        results = {"as published": compare(builtin_gguf_path(args.model), prompts, args, GEMMA_DRAFTERS)}
        (args.out / "results.json").write_text(json.dumps(results, indent=2))
        write_report(args.out / "report.md", results, args, GEMMA_DRAFTERS)
        print(json.dumps(results))
        return
    f16 = args.models / "smollm2-135m-F16.gguf"
    if not f16.exists():
        write_f16(builtin_gguf_path("smollm2-135m"), f16)
    results = {}
    for name in TYPES:
        path = args.models / f"smollm2-135m-{name}.gguf"
        if not path.exists():
            quantize(args.llama_python, f16, path, name)
        results[name] = compare(path, prompts, args, DRAFTERS)
        print(name, json.dumps(results[name]), flush=True)
    (args.out / "results.json").write_text(json.dumps(results, indent=2))
    write_report(args.out / "report.md", results, args, DRAFTERS)
    print(json.dumps(results))


def write_f16(source: Path, out: Path) -> None:
    """The GGUF at `source` with every quantized tensor dequantized to F16 (1-D ones F32), same metadata."""
    import gguf

    reader = gguf.GGUFReader(str(source))
    arch = reader.fields["general.architecture"].contents()
    writer = gguf.GGUFWriter(str(out), arch)
    for key, field in reader.fields.items():
        if key.startswith("GGUF.") or key in ("general.architecture", "general.file_type"):
            continue
        value_type = field.types[0]
        sub_type = field.types[1] if value_type == gguf.GGUFValueType.ARRAY else None
        writer.add_key_value(key, field.contents(), value_type, sub_type=sub_type)
    for tensor in reader.tensors:
        values = gguf.quants.dequantize(tensor.data, tensor.tensor_type)
        writer.add_tensor(tensor.name, values.astype(np.float16 if values.ndim > 1 else np.float32))
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()


def dev_prompts(count: int) -> list[str]:
    rows = [json.loads(line) for line in (ROOT / "workloads" / "spec_bench_dev.jsonl").read_text().splitlines()]
    by_category: dict[str, list[str]] = {}
    for row in rows:
        by_category.setdefault(row["category"], []).append(row["turns"][0])
    picked, i = [], 0
    while len(picked) < count:
        for prompts in by_category.values():
            if i < len(prompts) and len(picked) < count:
                picked.append(prompts[i])
        i += 1
    return picked


def compare(path: Path, prompts: list[str], args, drafters: dict[str, str]) -> dict:
    import torch

    from specdec.drafters import build_drafters
    from specdec.decode.engine import Engine, GenerationConfig
    from specdec.runtime import load_model

    model = load_model(str(path))
    config = GenerationConfig(max_new_tokens=args.new_tokens, gamma=4, ignore_eos=True)
    seqs, identical = [], {}
    for n, prompt in enumerate(prompts):
        ids = Engine(model).encode(prompt)
        plain = Engine(model).generate(ids, config)
        seqs.append(ids + plain.token_ids)
        if n < args.greedy_prompts:
            for name, spec in drafters.items():
                out = Engine(model, build_drafters(spec, model)).generate(ids, config)
                identical[name] = identical.get(name, True) and out.token_ids == plain.token_ids
    def logits(net) -> list[np.ndarray]:  # [T, V] per sequence
        return [net.forward(torch.tensor([ids]), net.new_cache(len(ids)))[0].numpy() for ids in seqs]

    def agreement(a: list[np.ndarray], b: list[np.ndarray]) -> dict:
        same = sum(int((x.argmax(-1) == y.argmax(-1)).sum()) for x, y in zip(a, b))
        return {"top1_agreement": round(same / sum(len(x) for x in a), 4),
                "max_abs_logit_diff": round(max(float(np.abs(x - y).max()) for x, y in zip(a, b)), 3)}

    def clear_agreement(a: list[np.ndarray], b: list[np.ndarray], reference: list[np.ndarray]) -> dict:
        """Top-1 agreement at the positions where the float32 reference's top two differ by at least
        CLEAR_MARGIN: the disagreements left are not near-ties that any rounding can flip."""
        clear = [np.diff(np.sort(r, -1)[:, -2:], axis=-1)[:, 0] >= CLEAR_MARGIN for r in reference]
        same = sum(int((x.argmax(-1) == y.argmax(-1))[c].sum()) for x, y, c in zip(a, b, clear))
        count = sum(int(c.sum()) for c in clear)
        return {"positions": count, "top1_agreement": round(same / max(count, 1), 4)}

    ours = logits(model.net)
    # the same file's weights dequantized, in float32 with float32 activations: what both approximate
    exact = logits(load_model(str(path), weights="float32").net)
    result = {"positions": sum(len(ids) for ids in seqs), "ours_vs_float32": agreement(ours, exact)}
    theirs_by_cache = {}
    for cache, kv_type in KV_CACHES.items():
        with tempfile.TemporaryDirectory() as tmp:
            (Path(tmp) / "seqs.json").write_text(json.dumps(seqs))
            subprocess.run([args.llama_python, "-c", LLAMA_LOGITS, str(path), str(Path(tmp) / "seqs.json"),
                            str(Path(tmp) / "logits.npz"), str(kv_type)], check=True)
            theirs = np.load(Path(tmp) / "logits.npz")
            theirs = [theirs[f"arr_{i}"] for i in range(len(seqs))]
        theirs_by_cache[cache] = theirs
        result[cache] = agreement(ours, theirs)
        result[cache.replace("cache", "cache_vs_float32")] = agreement(theirs, exact)
    # llama.cpp against itself with the other KV cache type: how far apart two roundings put it
    result["llama_cpp_f32_vs_f16_cache"] = agreement(theirs_by_cache["f32_cache"], theirs_by_cache["f16_cache"])
    result["f32_cache_clear"] = clear_agreement(ours, theirs_by_cache["f32_cache"], exact)
    return {**result, "weights": model.weights.summary(), "greedy_identical_to_plain": identical}


def write_report(path: Path, results: dict, args, drafters: dict[str, str]) -> None:
    source = ("SmolLM2-135M-Instruct written as F16, quantized by llama.cpp's `llama_model_quantize`"
              if args.model == "smollm2-135m" else
              f"{args.model}'s file as published ({', '.join(sorted(set(r['weights'] for r in results.values())))})")
    lines = [f"# specdec against llama.cpp on {'K-quant files of the default model' if args.model == 'smollm2-135m' else args.model}", "",
             f"{source}; `--model {args.model}`; "
             f"{args.prompts} dev prompts, each the prompt (chat-templated where the file has a template) and specdec's greedy answer of "
             f"{args.new_tokens} tokens, teacher-forced through both (`scripts/llama_cpp_agreement.py`).", "",
             "llama.cpp ran twice: with a float32 KV cache (as specdec's) and with its default float16 one. "
             "Beside each, both runtimes against the same weights computed in float32 with float32 activations "
             "(specdec `--weights float32`): what both approximate by quantizing activations to 8 bits.", "",
             "Both quantize activations to 8 bits the same way (Q8_K rows for K-quant weights, Q8_0 for the "
             "others), but any other difference in rounding (summation order, exp, RoPE) moves some inputs "
             "across a rounding boundary, so the logits differ by more than float32 round-off and near-ties "
             "flip. Two yardsticks of that floor: llama.cpp against itself with its two KV cache types, and "
             f"the agreement at the positions where the float32 reference's top two differ by ≥ {CLEAR_MARGIN} "
             "(clear positions).", "",
             "Top-1 agreement (max abs logit difference):", "",
             "| type | positions | ours ~ llama.cpp (f32 cache) | ours ~ llama.cpp (f16 cache) | llama.cpp f32 ~ f16 cache | "
             "clear positions: ours ~ llama.cpp (f32 cache) | ours ~ float32 | "
             "llama.cpp (f32 cache) ~ float32 | llama.cpp (f16 cache) ~ float32 | greedy with " + ", ".join(drafters) +
             " = plain | layouts |", "|---|---:|---|---|---|---|---|---|---|---|---|"]

    def cell(entry: dict) -> str:
        return f"{entry['top1_agreement']:.2%} ({entry['max_abs_logit_diff']})"

    for name, r in results.items():
        same = "yes" if all(r["greedy_identical_to_plain"].values()) else json.dumps(r["greedy_identical_to_plain"])
        clear = r["f32_cache_clear"]
        lines.append(f"| {name} | {r['positions']} | {cell(r['f32_cache'])} | {cell(r['f16_cache'])} | "
                     f"{cell(r['llama_cpp_f32_vs_f16_cache'])} | {clear['top1_agreement']:.2%} of {clear['positions']} | "
                     f"{cell(r['ours_vs_float32'])} | {cell(r['f32_cache_vs_float32'])} | {cell(r['f16_cache_vs_float32'])} | "
                     f"{same} | {r['weights']} |")
    path.write_text("\n".join(lines) + "\n")


if __name__ == "__main__":
    main()
