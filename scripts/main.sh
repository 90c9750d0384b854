#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build, make the default model
# (the small preset), serve it with `tandem up` (scheduler + 1 worker), stream one
# generation through the client library, show the status, and stop the service.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" --target tandem 2>&1 | grep -E "error|warning:" || true
tandem=build/release/cli/tandem
model=models/small-1.gguf
[ -f "$model" ] || $tandem make-model --preset small --seed 1 --out "$model"

log=$(mktemp)
$tandem up --model "$model" --workers 1 --threads "$(nproc)" >"$log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -f "$log"' EXIT
for _ in $(seq 1 600); do grep -q "tandem: ready" "$log" && break; sleep 0.2; done
grep "tandem:" "$log"
endpoint=$(sed -n 's/^tandem: endpoint //p' "$log")
$tandem generate --endpoint "$endpoint" --prompt "${TANDEM_PROMPT:-The quick brown fox}" --max-tokens 32 --ignore-eos --json
$tandem status --endpoint "$endpoint"
