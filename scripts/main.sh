#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build everything, make the
# default model (the small preset), start the default deployment (deploy/local.toml:
# scheduler + 2 workers, supervised), stream one generation through the client library,
# show the status, and drain the service.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" 2>&1 | grep -E "error|warning:" || true
tandem=build/release/cli/tandem
model=models/small-1.gguf
mkdir -p "$(dirname "$model")"
[ -f "$model" ] || $tandem make-model --preset small --seed 1 --out "$model"

log=$(mktemp)
# deploy/local.toml is written for 2 cores (2 workers x 1 thread, pinned); on one core, one worker.
flags=()
[ "$(nproc)" -lt 2 ] && flags=(--workers 1)
$tandem up --config deploy/local.toml --model "$model" "${flags[@]}" >"$log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null || true; wait $up 2>/dev/null || true; rm -f "$log"' EXIT
for _ in $(seq 1 600); do grep -q "tandem: ready" "$log" && break; sleep 0.2; done
grep "tandem:" "$log"
endpoint=$(sed -n 's/^tandem: endpoint //p' "$log")
$tandem generate --endpoint "$endpoint" --prompt "${TANDEM_PROMPT:-The quick brown fox}" --max-tokens 32 --ignore-eos --json
$tandem status --endpoint "$endpoint"
$tandem drain --endpoint "$endpoint" --wait
wait $up  # tandem up exits 0 after the drain
grep "tandem:" "$log" | tail -2
