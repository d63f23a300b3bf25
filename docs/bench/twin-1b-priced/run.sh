#!/bin/bash
# Issue 52: at the 1B twin, with proposals priced after a target pass and the prediction counting the
# prefill (cache format 5), are the head's chain's and tree's predictions within 10% of what they
# measure? The chain, the tree and `auto` with the chain as a candidate, beside plain decoding, greedy,
# in two processes with the methods in the other order (6 dev prompts, one per category, 128 new tokens).
# Run from the repository root: bash docs/bench/twin-1b-priced/run.sh TWINS [OUT]     (~25 min, 2 cores)
set -eu
twins=$1
out=${2:-docs/bench/twin-1b-priced}
common=(--model $twins/twin-1b-Q4_1.gguf --prompts workloads/spec_bench_dev.jsonl --per-category 1 --max-new-tokens 128
        --ignore-eos --repeats 1 --no-transformers --force --temperature 0)
chain_auto=auto:suffix,early:7,eagle3-chain,eagle3
.venv/bin/specdec bench "${common[@]}" --drafter eagle3-chain --drafter eagle3 --drafter $chain_auto --out $out/a
.venv/bin/specdec bench "${common[@]}" --drafter $chain_auto --drafter eagle3 --drafter eagle3-chain --out $out/b
