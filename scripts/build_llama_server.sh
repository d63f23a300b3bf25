#!/bin/bash
# Build llama.cpp's own server, `llama-server` (parallel slots, continuous batching, a prompt cache per
# slot), from the llama.cpp copy inside llama-cpp-python's source package: the serving baseline of
# issue 53. Kept out of `make test`; a few minutes on 2 cores.
#
#   bash scripts/build_llama_server.sh [OUT-DIR]        # default: ~/.cache/specdec/llama-server
#
# The version is the one the project's optional llama.cpp baseline pins (pyproject: llama-cpp-python).
# On Intel hosts with AMX the build leaves AMX out (llama.cpp's AMX path can fault there: SIGILL);
# GGML_NATIVE keeps the host's other instructions (AVX-512, VNNI). Prints the binary's path.
set -euo pipefail
out=${1:-${SPECDEC_CACHE_DIR:-$HOME/.cache/specdec}/llama-server}
python=${PYTHON:-.venv/bin/python}
version=$(grep -o 'llama-cpp-python[^"]*' pyproject.toml | head -1 | sed 's/llama-cpp-python//')
mkdir -p "$out"
if [ -x "$out/build/bin/llama-server" ]; then echo "$out/build/bin/llama-server"; exit 0; fi
work=$(mktemp -d)
trap 'rm -rf "$work"' EXIT
"$python" -m pip download -q --no-deps --no-binary :all: "llama-cpp-python$version" -d "$work" >&2
tar -xzf "$work"/llama_cpp_python-*.tar.gz -C "$work"
src=$(echo "$work"/llama_cpp_python-*/vendor/llama.cpp)
flags=""
if grep -q amx_int8 /proc/cpuinfo 2>/dev/null; then flags="-mno-amx-tile -mno-amx-int8 -mno-amx-bf16"; fi
cmake -S "$src" -B "$out/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DLLAMA_CURL=OFF \
  -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=OFF -DLLAMA_BUILD_SERVER=ON \
  -DCMAKE_C_FLAGS="$flags" -DCMAKE_CXX_FLAGS="$flags" >&2
cmake --build "$out/build" --target llama-server -j "$(nproc)" >&2
echo "$out/build/bin/llama-server"
