#!/bin/bash
# Issue 52: does `auto` with the shipped EAGLE-3 head's chain as one more candidate lose anything on the
# default 135M model, where a pass is cheap? Both `auto`s beside plain decoding, greedy and T = 1, each in
# two processes with the methods in the other order (12 dev prompts, 2 per category, 128 new tokens).
# Run from the repository root: bash docs/bench/chain-in-auto-135m/run.sh [OUT]     (~25 min, 2 cores)
# OUT: the folder for the four runs (default: this one)
set -eu
out=${1:-docs/bench/chain-in-auto-135m}
common=(--prompts workloads/spec_bench_dev.jsonl --per-category 2 --max-new-tokens 128 --ignore-eos --repeats 1
        --no-transformers --force)
today=auto:suffix,early:7,eagle3
chain=auto:suffix,early:7,eagle3-chain,eagle3
for t in 0 1; do
  .venv/bin/specdec bench "${common[@]}" --temperature $t --drafter $today --drafter $chain --out $out/t$t-a
  .venv/bin/specdec bench "${common[@]}" --temperature $t --drafter $chain --drafter $today --out $out/t$t-b
done
