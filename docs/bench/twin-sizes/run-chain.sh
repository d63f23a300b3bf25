#!/bin/bash
# The 8B-cost dear twin, greedy: `auto` with the EAGLE-3 head's chain as one more candidate beside its tree
# (issue 52: the policy picks chain or tree each round from the measured T(k)), beside today's `auto` in the same run.
# Run from the repository root: bash docs/bench/twin-sizes/run-chain.sh TWINS [OUT-DIR] [REPEATS]     (~65 min with its two cost tables and 2 repeats, 2 cores)
set -eu
twins=$1
out=${2:-docs/bench/twin-sizes}
repeats=${3:-2}
.venv/bin/specdec bench --model $twins/twin-8b-Q4_1.gguf --prompts workloads/spec_bench_dev.jsonl \
  --per-category 1 --max-new-tokens 128 --ignore-eos --repeats $repeats --no-transformers --force --temperature 0 \
  --drafter auto:suffix,early:7,eagle3 --drafter auto:suffix,early:7,eagle3-chain,eagle3 --out $out/8b-chain-in-auto
