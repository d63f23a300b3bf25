#!/bin/bash
# The three bench processes of issue 51 (methods in three orders), then prompt 92 alone and last of 12.
# Run from the repository root: bash docs/bench/policy-51-d/run.sh [OUT-DIR] [--runs-only]
set -u
out=${1:-docs/bench/policy-51-d}
common=(--prompts ../shared/workloads/spec_bench_dev.jsonl --per-category 2 --temperature 0,1 --max-new-tokens 128
        --ignore-eos --repeats 3 --no-transformers --baseline llama.cpp --targets --force)
.venv/bin/specdec bench "${common[@]}" --drafter ngram@3 --drafter suffix@2,3 --drafter suffix --drafter auto --out $out/run-1
.venv/bin/specdec bench "${common[@]}" --drafter auto --drafter suffix --drafter suffix@3,2 --drafter ngram@3 --out $out/run-2
.venv/bin/specdec bench "${common[@]}" --drafter suffix --drafter auto --drafter ngram@3 --drafter suffix@2,3 --out $out/run-3
[ "${2:-}" = "--runs-only" ] && exit 0
last=(--temperature 0 --max-new-tokens 128 --ignore-eos --repeats 3 --no-transformers --force --drafter suffix)
.venv/bin/specdec bench --prompts docs/bench/policy-51-partial/last-of-12/alone/prompts.jsonl "${last[@]}" --out $out/last-of-12/alone
.venv/bin/specdec bench --prompts docs/bench/policy-51-partial/last-of-12/last/prompts.jsonl "${last[@]}" --out $out/last-of-12/last
