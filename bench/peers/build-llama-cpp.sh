#!/usr/bin/env bash
# Builds the reference llama.cpp natively, outside the repository: the source tree that the
# npm package node-llama-cpp (the version pinned in bench/peers/llama-node/package.json) ships
# as llama/gitRelease.bundle, compiled with Debian's cmake and g++ (Release, -DGGML_NATIVE=ON,
# OpenBLAS). Tools: llama-quantize (first: the quantization references need it), llama-bench,
# llama-batched-bench, llama-server, llama-tokenize.
#
#   bench/peers/build-llama-cpp.sh [DIR]      # DIR default: ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-cpp
#   JOBS=2 (parallel compile jobs), TOOLS="llama-quantize ..." (a subset) may be set.
#
# npm: `npm install node-llama-cpp@<pinned version> --ignore-scripts` into DIR/npm, not `npm ci`
# with the repository's lock file (that lock lacks other platforms' optional packages, so
# `npm ci` refuses it); --ignore-scripts: only the bundle is needed, not the package's
# prebuilt binaries. Prints the tools' paths and the llama.cpp commit, last.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
dir=${1:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp}
jobs=${JOBS:-2}
tools=${TOOLS:-llama-quantize llama-tokenize llama-bench llama-batched-bench llama-server}
mkdir -p "$dir"
dir=$(cd "$dir" && pwd)
case "$dir/" in "$repo"/*) echo "build-llama-cpp: $dir is inside the repository; give a folder outside it" >&2; exit 2 ;; esac

version=$(sed -n 's/.*"node-llama-cpp": *"\([^"]*\)".*/\1/p' "$repo/bench/peers/llama-node/package.json")
[ -n "$version" ] || { echo "build-llama-cpp: no node-llama-cpp version in bench/peers/llama-node/package.json" >&2; exit 1; }
for tool in npm git cmake g++; do
  command -v $tool >/dev/null || { echo "build-llama-cpp: needs $tool (scripts/install-deps.sh, apt-get install nodejs npm)" >&2; exit 1; }
done

bundle=$dir/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
if [ ! -f "$bundle" ] || ! grep -q "\"version\": \"$version\"" "$dir/npm/node_modules/node-llama-cpp/package.json"; then
  mkdir -p "$dir/npm"
  [ -f "$dir/npm/package.json" ] || echo '{"name": "tandem-llama-cpp-build", "private": true}' >"$dir/npm/package.json"
  echo "build-llama-cpp: npm install node-llama-cpp@$version in $dir/npm" >&2
  (cd "$dir/npm" && npm install --no-audit --no-fund --ignore-scripts --save-exact "node-llama-cpp@$version" >&2)
fi

src=$dir/llama.cpp
if [ ! -d "$src/.git" ]; then
  git clone --quiet "$bundle" "$src"
else  # a newer bundle (another pinned version): move the tree to its head
  git -C "$src" fetch --quiet "$bundle" && git -C "$src" checkout --quiet --detach FETCH_HEAD
fi
commit=$(git -C "$src" rev-parse HEAD)

cmake -S "$src" -B "$src/build" -DCMAKE_BUILD_TYPE=Release -DGGML_NATIVE=ON -DGGML_BLAS=ON \
  -DGGML_BLAS_VENDOR=OpenBLAS -DLLAMA_BUILD_TESTS=OFF -DLLAMA_BUILD_EXAMPLES=ON \
  -DLLAMA_BUILD_TOOLS=ON -DLLAMA_BUILD_SERVER=ON >&2
for tool in $tools; do  # one at a time, so the first tools are usable while the rest compile
  cmake --build "$src/build" --target "$tool" -j "$jobs" >&2
done

echo "llama.cpp $commit (node-llama-cpp $version), built in $src/build"
for tool in $tools; do echo "$tool: $src/build/bin/$tool"; done
