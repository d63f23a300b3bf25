#!/bin/bash
# Gain kept last of 12, interleaved (kept.py): prompt 92 last of the 12 mt_bench prompts of policy-51-d,
# and two dev prompts last of the 12 dev prompts; each in two processes, the methods' order reversed.
# Run from the repository root: bash docs/bench/policy-51-f/run.sh [OUT-DIR]
set -eu
out=${1:-docs/bench/policy-51-f}
kept=(.venv/bin/python docs/bench/policy-51-f/kept.py --repeats 12)
mt=(--prompts docs/bench/policy-51-partial/last-of-12/last/prompts.jsonl)
dev=(--prompts ../shared/workloads/spec_bench_dev.jsonl --per-category 2)
"${kept[@]}" "${mt[@]}" --last 92 --out $out/92-a.json
"${kept[@]}" "${mt[@]}" --last 92 --reverse --out $out/92-b.json
"${kept[@]}" "${dev[@]}" --last 162 --out $out/162-a.json
"${kept[@]}" "${dev[@]}" --last 162 --reverse --out $out/162-b.json
"${kept[@]}" "${dev[@]}" --last 404 --out $out/404-a.json
"${kept[@]}" "${dev[@]}" --last 404 --reverse --out $out/404-b.json
