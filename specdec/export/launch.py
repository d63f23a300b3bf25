"""launch.sh in the exported folder: the engine's command line with γ filled in, and what was and
was not verified about its flags (from the engines' documentation and source; no engine was run)."""

from __future__ import annotations

import json
import shlex
from pathlib import Path

from specdec.export.source import Target

HF_REPOS = {"smollm2-135m": "HuggingFaceTB/SmolLM2-135M-Instruct"}  # where a built-in GGUF was quantized from

VERIFIED = {
    "vllm": "`vllm serve TARGET --speculative-config '{\"method\": ..., \"model\": ..., \"num_speculative_tokens\": N}'` "
            "and the methods eagle3 and medusa: vLLM's and its speculators' documentation",
    "sglang": "--dtype (server_args), --speculative-algorithm EAGLE3, --speculative-draft-model-path, --speculative-num-steps, "
              "--speculative-eagle-topk, --speculative-num-draft-tokens: SGLang's speculative decoding documentation",
    "llama.cpp": "--spec-type draft-eagle3: llama.cpp's docs/speculative.md; convert_hf_to_gguf.py DIR "
                 "--target-model-dir: conversion/llama.py @ 0274f0fc7d7f (it refuses an EAGLE-3 folder without it). "
                 "NOT verified in llama.cpp's own source: -md and --spec-draft-n-max (seen in third-party "
                 "launchers; older builds call it --draft-max)",
}


def served_target(target: Target) -> str:
    """What vLLM and SGLang load as the target: the Hugging Face repository of a built-in model, else its folder."""
    return HF_REPOS.get(target.spec.strip().lower(), str(target.folder.resolve()))


def target_dtype(target: Target) -> str:
    """The dtype the target's checkpoint names (its config.json's torch_dtype), bfloat16 when it names none."""
    try:
        named = json.loads((target.folder / "config.json").read_text()).get("torch_dtype")
    except (OSError, ValueError):
        named = None
    return named if named in ("bfloat16", "float16", "float32") else "bfloat16"


def commands(fmt: str, kind: str, out: Path, target: Target, gamma: int) -> list[str]:
    here, served = shlex.quote(str(out.resolve())), shlex.quote(served_target(target))
    if fmt == "vllm":
        method = "eagle3" if kind == "eagle3" else "medusa"
        spec = f'{{"method": "{method}", "model": "{out.resolve()}", "num_speculative_tokens": {gamma}}}'
        return [f"vllm serve {served} --speculative-config {shlex.quote(spec)}"]
    if fmt == "sglang":  # a chain of γ drafts: top-1 per step, γ + 1 tokens verified; --dtype: the draft is
        # stored in float32 and SGLang's `auto` would make it float16 beside a bfloat16 target (PR #3431)
        return [f"python -m sglang.launch_server --model-path {served} --dtype {target_dtype(target)} "
                "--speculative-algorithm EAGLE3 "
                f"--speculative-draft-model-path {here} --speculative-num-steps {gamma} "
                f"--speculative-eagle-topk 1 --speculative-num-draft-tokens {gamma + 1}"]
    hf_dir = shlex.quote(str(target.folder.resolve()))
    lines = []
    if target.gguf is None:
        lines.append(f'python "$LLAMA_CPP/convert_hf_to_gguf.py" {hf_dir} --outfile target.gguf')
    gguf = shlex.quote(str(target.gguf.resolve())) if target.gguf else "target.gguf"
    lines.append(f'python "$LLAMA_CPP/convert_hf_to_gguf.py" {here} --target-model-dir {hf_dir} --outfile eagle3.gguf')
    lines.append(f'"$LLAMA_CPP/build/bin/llama-server" -m {gguf} -md eagle3.gguf --spec-type draft-eagle3 '
                 f"--spec-draft-n-max {gamma}")
    return lines


def launch_script(fmt: str, kind: str, out: Path, target: Target, gamma: int, gamma_rule: str,
                  notes: list[str]) -> str:
    lines = ["#!/usr/bin/env bash",
             f"# Written by `specdec export --format {fmt}`: serve this {kind} head with {fmt}.",
             f"# Target: {served_target(target)}" + (f" (the head was trained on {target.spec}, a quantized GGUF: the "
                                                     "full-precision model's features differ slightly)" if target.gguf else ""),
             f"# {gamma_rule}",
             f"# Flags verified: {VERIFIED[fmt]}.",
             *(f"# Note: {note}" for note in notes),
             "# Nothing here was run: no engine was available where this was written.",
             "set -euo pipefail"]
    if fmt == "llama.cpp":
        lines.append('LLAMA_CPP="${LLAMA_CPP:?set LLAMA_CPP to a built llama.cpp checkout}"')
    return "\n".join(lines + commands(fmt, kind, out, target, gamma)) + "\n"
