#!/usr/bin/env bash
# The main job on a fresh machine: install dependencies, build everything, start the default
# deployment (deploy/local.toml: scheduler + 2 workers, supervised) on the small trained model
# tests/data/vocab-trained.gguf (Llama 2's real 32000-token vocabulary, trained on English text
# Debian ships by scripts/train-vocab.py), stream one generation of text through the client
# library, show the status, and drain the service. TANDEM_MODEL=FILE runs another model.
set -euo pipefail
cd "$(dirname "$0")/.."
bash scripts/install-deps.sh
cmake -S . -B build/release -DCMAKE_BUILD_TYPE=Release >/dev/null
cmake --build build/release -j"$(nproc)" 2>&1 | grep -E "error|warning:" || true
tandem=build/release/cli/tandem
model=${TANDEM_MODEL:-tests/data/vocab-trained.gguf}

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
admin=$(sed -n 's/^tandem: admin endpoint \([^ ]*\).*/\1/p' "$log")  # drain goes there, not to clients' endpoint
# Streams the text as it comes (--json: one event per token); sampled, seeded: the same text each run.
$tandem generate --endpoint "$endpoint" --prompt "${TANDEM_PROMPT:-When you}" --max-tokens 32 --ignore-eos \
  --temperature 0.7 --seed 1
$tandem status --endpoint "$endpoint"
$tandem drain --endpoint "$admin" --wait
wait $up  # tandem up exits 0 after the drain
grep "tandem:" "$log" | tail -2
