#!/bin/bash
# T(k) for k = 1..16 on the default model and its dear twins (scripts/dear_twin.py --out-dir TWINS).
# Run from the repository root: bash docs/bench/twin-costs/run.sh TWINS [OUT-DIR]
set -eu
twins=$1
out=${2:-docs/bench/twin-costs}
export SPECDEC_COSTS_DIR=$(mktemp -d)  # measured anew, not read from the user's cache
.venv/bin/specdec costs --drafter none --max-gamma 15 > $out/135m.txt
for size in 1b 3b 8b; do
  .venv/bin/specdec costs --model $twins/twin-$size-Q4_1.gguf --drafter none --max-gamma 15 > $out/$size.txt
done
cp $SPECDEC_COSTS_DIR/*.json $out/
