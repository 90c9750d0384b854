#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, make the default model
# (the small preset), and generate with it. Later, `tandem up` will serve it.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target tandem 2>&1 | grep -E "error|warning:" || true
model=models/small-1.gguf
[ -f "$model" ] || build/release/cli/tandem make-model --preset small --seed 1 --out "$model"
build/release/cli/tandem run --model "$model" --prompt "${TANDEM_PROMPT:-The quick brown fox}" --max-tokens 32 --ignore-eos --json
