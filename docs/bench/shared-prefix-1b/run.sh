#!/bin/bash
# 16 clients whose prompts share a system prompt, at the 1B shape: specdec with and without its
# prefix cache, and llama.cpp's own llama-server with 16 parallel slots (issue 53). Run from the
# repository root, nothing else running:
#
#   bash docs/bench/shared-prefix-1b/run.sh MODEL.gguf LLAMA-SERVER [OUT-DIR]
#
# MODEL.gguf: scripts/synthetic_gguf.py llama-3.2-1b Q4_K_M -o MODEL.gguf; LLAMA-SERVER:
# scripts/build_llama_server.sh. Each server is started afresh (an empty cache) for each test, alone:
# 1 client (6 requests) and 16 clients (18 requests: the first turns of 18 dev prompts, 3 a category);
# every request sends docs/bench/shared-prefix/prefix.txt before its question, greedy, 64 new tokens,
# and the reference answers are asked after the timed requests (--references-after), so no timed
# prompt is cached whole beforehand. Writes OUT-DIR/<server>-<clients>.json and the servers' peak
# resident memory (VmHWM) to OUT-DIR/peak-memory.txt.
set -eu
model=$1
llama_server=$2
out=${3:-docs/bench/shared-prefix-1b}
threads=$(nproc)
load_test() {  # PORT NAME CLIENTS REQUESTS
  .venv/bin/specdec load-test --endpoint http://127.0.0.1:$1 --prompts workloads/spec_bench_dev.jsonl --per-category 3 \
    --shared-prefix docs/bench/shared-prefix/prefix.txt --max-new-tokens 64 --references-after --clients $3 \
    --requests $4 --out $out/$2-$3.json
}
serve_and_test() {  # NAME PORT CLIENTS REQUESTS COMMAND...: start, wait until healthy, test, record VmHWM, stop
  name=$1 port=$2 clients=$3 requests=$4
  shift 4
  "$@" > $out/$name-$clients-server.log 2>&1 &
  pid=$!
  trap "kill $pid 2> /dev/null || true" EXIT  # a failed test must not leave its server holding the port
  until curl -sf http://127.0.0.1:$port/health > /dev/null; do
    kill -0 $pid 2> /dev/null || { echo "$name did not start: see $out/$name-$clients-server.log" >&2; exit 1; }
    sleep 2
  done
  load_test $port $name $clients $requests
  echo "$name, $clients clients: $(grep VmHWM /proc/$pid/status)" >> $out/peak-memory.txt
  kill $pid
  wait $pid 2> /dev/null || true
}
mkdir -p $out
specdec=(.venv/bin/specdec serve --model $model --drafter none --max-batch 16 --max-queue 64 --threads $threads)
# 16 slots of 4,096 tokens each (the prefix's ~1,540 tokens + a question of up to ~700 + 64 new); its
# prompt cache is on by default
llama=($llama_server -m $model --parallel 16 -c 65536 -t $threads -tb $threads --cont-batching)
# RUNS: which CLIENTS:REQUESTS tests (default 1:6 16:18); SERVERS: which servers, in this order
for run in ${RUNS:-1:6 16:18}; do
  set -- ${run/:/ }
  for server in ${SERVERS:-specdec llama-server specdec-no-prefix-cache}; do
    case $server in
      specdec) serve_and_test specdec 8400 $1 $2 "${specdec[@]}" --port 8400 ;;
      llama-server) serve_and_test llama-server 8402 $1 $2 "${llama[@]}" --port 8402 ;;
      specdec-no-prefix-cache) serve_and_test specdec-no-prefix-cache 8401 $1 $2 "${specdec[@]}" --port 8401 --prefix-cache 0 ;;
    esac
  done
done
