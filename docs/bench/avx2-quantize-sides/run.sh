#!/bin/bash
# The AVX2 kernels of this checkout against those of REV (default d980e98: rows quantized by scalar
# code, a tile's two sides of 8 outputs one pass each), paired in one process per command.
# Run from the repository root: bash docs/bench/avx2-quantize-sides/run.sh TWINS SYNTH [REV] [OUT-DIR]
#   TWINS: scripts/dear_twin.py --out-dir TWINS;  SYNTH: llama-3.2-1b-Q4_K_M.gguf and
#   llama-3.1-8b-Q4_K_M.gguf from scripts/synthetic_gguf.py
set -eu
twins=$1
synth=$2
rev=${3:-d980e98}
out=${4:-docs/bench/avx2-quantize-sides}
py=$PWD/.venv/bin/python
old=$(mktemp -d)
git worktree add --detach "$old" "$rev" > /dev/null
trap 'git worktree remove --force "$old"' EXIT
so=$(cd "$old" && PYTHONPATH="$old" $py -c 'from specdec.runtime.kernels import invariant_kernels; print(invariant_kernels().__file__)')
echo "other build: $rev, $so" > $out/builds.txt
$py scripts/kernel_rate.py --types Q4_1,Q4_K,Q4_0,Q5_K,Q6_K,Q8_0,Q2_K --rows 1,2,3,4,8,16 --repeats 10 \
  --against "$so" > $out/kernel-rate.txt
passes=(--against "$so" --sizes 1,2,3,4,5,8)
$py scripts/pass_rate.py --model $twins/twin-8b-Q4_1.gguf "${passes[@]}" --repeats 8 > $out/pass-twin-8b.txt
$py scripts/pass_rate.py --model $twins/twin-8b-Q4_1.gguf "${passes[@]}" --repeats 8 --other-first > $out/pass-twin-8b-b.txt
$py scripts/pass_rate.py --model $twins/twin-1b-Q4_1.gguf "${passes[@]}" --repeats 12 > $out/pass-twin-1b.txt
$py scripts/pass_rate.py --model smollm2-135m "${passes[@]}" --repeats 30 > $out/pass-135m.txt
$py scripts/pass_rate.py --model $synth/llama-3.2-1b-Q4_K_M.gguf "${passes[@]}" --repeats 12 > $out/pass-llama-1b-q4km.txt
$py scripts/pass_rate.py --model $synth/llama-3.1-8b-Q4_K_M.gguf "${passes[@]}" --repeats 6 > $out/pass-llama-8b-q4km.txt
$py scripts/pass_rate.py --model $synth/llama-3.1-8b-Q4_K_M.gguf "${passes[@]}" --repeats 6 --other-first > $out/pass-llama-8b-q4km-b.txt
