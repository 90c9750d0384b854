#!/usr/bin/env bash
# Builds bench/peers/llama-reference.cpp against the llama.cpp that build-llama-cpp.sh built
# (its include/llama.h and build/bin/libllama.so), outside the repository's build: no CMake
# target, no CI test needs it. Prints the binary's path.
#
#   bench/peers/build-llama-reference.sh [LLAMA_DIR] [OUT]
#   LLAMA_DIR default: ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-cpp/llama.cpp
#   OUT default: LLAMA_DIR/build/bin/llama-reference
set -euo pipefail
here=$(cd "$(dirname "$0")" && pwd)
src=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp/llama.cpp}
out=${2:-$src/build/bin/llama-reference}
[ -f "$src/include/llama.h" ] && [ -f "$src/build/bin/libllama.so" ] ||
  { echo "build-llama-reference: no llama.cpp build in $src (run bench/peers/build-llama-cpp.sh first)" >&2; exit 1; }
g++ -std=c++17 -O2 -Wall -Wextra -o "$out" "$here/llama-reference.cpp" -I "$src/include" -I "$src/ggml/include" \
  -L "$src/build/bin" -lllama -lggml -lggml-base -Wl,-rpath,"$src/build/bin"
echo "$out"
