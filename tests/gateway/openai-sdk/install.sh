#!/usr/bin/env bash
# The official OpenAI SDK at the version package-lock.json pins, installed with `npm ci` into
# DEST (node_modules/openai): tests/gateway/gateway_test.cpp drives the gateway with it.
#
#   tests/gateway/openai-sdk/install.sh DEST    -> prints DEST
#
# ctest runs it once per build tree as the fixture `openai_sdk` (tests/CMakeLists.txt); with the
# lock's install already in DEST it only prints DEST. Without npm or network npm says why on
# stderr and the script exits non-zero.
set -euo pipefail
dest=${1:?usage: tests/gateway/openai-sdk/install.sh DEST}
src=$(cd "$(dirname "$0")" && pwd)
mkdir -p "$dest"
if [ -f "$dest/node_modules/openai/package.json" ] && cmp -s "$src/package-lock.json" "$dest/package-lock.json"; then
  echo "$dest"
  exit 0
fi
cp "$src/package.json" "$src/package-lock.json" "$dest/"
(cd "$dest" && npm ci --ignore-scripts --no-audit --no-fund >&2)
echo "$dest"
