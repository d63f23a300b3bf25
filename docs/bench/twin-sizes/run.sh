#!/bin/bash
# The 8B-cost dear twin on the dev prompts (issue 52, part 4): every drafter kind that fits, greedy; then
# `auto` at T = 1 on three categories. One prompt of each category, 128 new tokens, 2 repeats.
# Run from the repository root: bash docs/bench/twin-sizes/run.sh TWINS [OUT-DIR]     (~110 min for the first, with its cost table; 2 cores)
set -eu
twins=$1
out=${2:-docs/bench/twin-sizes}
common=(--prompts workloads/spec_bench_dev.jsonl --per-category 1 --max-new-tokens 128 --ignore-eos
        --repeats 2 --no-transformers --force)
.venv/bin/specdec bench --model $twins/twin-8b-Q4_1.gguf "${common[@]}" --temperature 0 \
  --drafter suffix --drafter eagle3-chain --drafter eagle3 --drafter medusa --drafter auto --out $out/8b-greedy
.venv/bin/specdec bench --model $twins/twin-8b-Q4_1.gguf "${common[@]}" --temperature 1 \
  --category qa --category translation --category math_reasoning --drafter auto --out $out/8b-t1
