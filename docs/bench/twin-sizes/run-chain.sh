#!/bin/bash
# A dear twin: `auto` with the EAGLE-3 head's chain as one more candidate beside its tree (issue 52: the
# policy picks chain or tree each round from the measured T(k)), beside today's `auto` in the same run.
# Run from the repository root:
#   bash docs/bench/twin-sizes/run-chain.sh TWINS [OUT-DIR] [REPEATS] [ORDER]
# (8B, greedy: ~65 min with its two cost tables and 2 repeats, 2 cores, AVX2). ORDER: today-first (default)
# or chain-first, the order of the two `auto`s in --drafter (a second process reorders them).
# The environment picks the rest: SIZE (8b; 1b, 3b), TEMPERATURE (0), PER_CATEGORY (1); the run's folder is
# OUT-DIR/<SIZE>-chain-in-auto, with -t<TEMPERATURE> added where it is not 0 and -chain-first for that order.
set -eu
twins=$1
out=${2:-docs/bench/twin-sizes}
repeats=${3:-2}
order=${4:-today-first}
size=${SIZE:-8b}
temperature=${TEMPERATURE:-0}
today=auto:suffix,early:7,eagle3
chain=auto:suffix,early:7,eagle3-chain,eagle3
case $order in
  today-first) drafters="--drafter $today --drafter $chain" ;;
  chain-first) drafters="--drafter $chain --drafter $today" ;;
  *) echo "ORDER must be today-first or chain-first, not $order" >&2; exit 2 ;;
esac
folder=$out/$size-chain-in-auto
[ "$temperature" = 0 ] || folder=$folder-t$temperature
[ "$order" = today-first ] || folder=$folder-$order
.venv/bin/specdec bench --model $twins/twin-$size-Q4_1.gguf --prompts workloads/spec_bench_dev.jsonl \
  --per-category ${PER_CATEGORY:-1} --max-new-tokens 128 --ignore-eos --repeats $repeats --no-transformers --force \
  --temperature $temperature --seed 0 $drafters --out $folder
