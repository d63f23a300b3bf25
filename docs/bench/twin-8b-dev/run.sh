#!/bin/bash
# The 8B-cost dear twin on the dev prompts (one per category), greedy: suffix, the shipped EAGLE-3
# head as a chain, auto. Run from the repository root: bash docs/bench/twin-8b-dev/run.sh TWINS [OUT-DIR]
set -eu
twins=$1
out=${2:-docs/bench/twin-8b-dev}
.venv/bin/specdec bench --model $twins/twin-8b-Q4_1.gguf --prompts ../shared/workloads/spec_bench_dev.jsonl \
  --per-category 1 --temperature 0 --max-new-tokens 128 --ignore-eos --repeats 2 --no-transformers --force \
  --drafter suffix --drafter eagle3-chain --drafter auto --out $out
