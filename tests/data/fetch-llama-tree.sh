#!/usr/bin/env bash
# The llama.cpp source tree that npm's node-llama-cpp (pinned in bench/peers/llama-node/) ships
# as llama/gitRelease.bundle: its models/templates/ (chat templates) and models/ggml-vocab-*
# (vocabularies) are reference data for tests. Shared by every test that needs that tree.
#
#   tests/data/fetch-llama-tree.sh DEST
#
# Installs the pinned package into DEST/npm (npm install --ignore-scripts: `npm ci` refuses the
# lock, which lacks other platforms' optional packages; the prebuilt binaries come along, for
# tests that run llama.cpp's tools), clones the bundle into DEST/llama.cpp and prints that path.
# Idempotent: a tree already there is printed at once. Without npm or network it says so on
# stderr and exits 0 printing nothing, so the tests that need the tree skip with that reason.
set -euo pipefail
dest=${1:?usage: fetch-llama-tree.sh DEST}
repo=$(cd "$(dirname "$0")/../.." && pwd)
tree=$dest/llama.cpp
if [ -d "$tree/models" ]; then echo "$tree"; exit 0; fi
command -v npm >/dev/null && command -v git >/dev/null || { echo "fetch-llama-tree: npm or git missing" >&2; exit 0; }
mkdir -p "$dest/npm"
cp "$repo/bench/peers/llama-node/package.json" "$repo/bench/peers/llama-node/package-lock.json" "$dest/npm/"
if ! (cd "$dest/npm" && npm install --ignore-scripts --no-audit --no-fund >"$dest/npm.log" 2>&1); then
  echo "fetch-llama-tree: npm install failed (no network?), see $dest/npm.log" >&2
  exit 0
fi
bundle=$dest/npm/node_modules/node-llama-cpp/llama/gitRelease.bundle
[ -f "$bundle" ] || { echo "fetch-llama-tree: no $bundle in the package" >&2; exit 0; }
rm -rf "$tree.tmp"
git clone -q "$bundle" "$tree.tmp"
mv "$tree.tmp" "$tree"
echo "$tree"
