#!/bin/bash
# The 1B-cost dear twin on the dev prompts, greedy: suffix, the shipped EAGLE-3 head as a chain, auto.
# Run from the repository root: bash docs/bench/twin-1b-dev/run.sh TWINS [OUT-DIR]
set -eu
twins=$1
out=${2:-docs/bench/twin-1b-dev}
.venv/bin/specdec bench --model $twins/twin-1b-Q4_1.gguf --prompts ../shared/workloads/spec_bench_dev.jsonl \
  --per-category 2 --temperature 0 --max-new-tokens 128 --ignore-eos --repeats 3 --no-transformers --force \
  --drafter suffix --drafter eagle3-chain --drafter auto --out $out
