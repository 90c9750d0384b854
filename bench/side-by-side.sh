#!/usr/bin/env bash
# Side by side: tandem and llama.cpp serving the same GGUF file with the same number of
# threads, measured by one `tandem bench` workload each (the harness's OpenAI target for the
# peer, its tandem target for tandem). One run after the other, never both at once. The peer:
#   --peer llama-server (the reference): today's llama.cpp's own llama-server, the npm
#     node-llama-cpp source build that bench/peers/build-llama-cpp.sh makes (in --llama-dir,
#     default ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-cpp/llama.cpp), its defaults otherwise;
#   --peer node (default, needs no build): bench/peers/llama-node, llama.cpp through
#     node-llama-cpp's prebuilt CPU build from the npm registry (installed here on first use),
#     behind a minimal OpenAI-compatible server.
#
#   bench/side-by-side.sh [--model FILE] [--threads 2] [--requests 32] [--concurrency 8]
#                         [--input-len 128] [--output-len 64] [--build DIR]
#                         [--peer node|llama-server] [--llama-dir DIR]
#
# The peer gets --concurrency slots (llama.cpp's parallel sequences); tandem one worker of
# --threads threads. Output: both summaries, then the ratios; JSON in $OUT (default a
# temporary folder, kept). Any GGUF both load (Q4_K_M once tandem's engine computes it).
set -uo pipefail
cd "$(dirname "$0")/.."
model=models/small-1.gguf threads=2 requests=32 concurrency=8 input_len=128 output_len=64 build=build/release
peer_kind=node llama_dir=${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp/llama.cpp
while [ $# -gt 0 ]; do
  case $1 in
    --model) model=$2 ;; --threads) threads=$2 ;; --requests) requests=$2 ;; --concurrency) concurrency=$2 ;;
    --input-len) input_len=$2 ;; --output-len) output_len=$2 ;; --build) build=$2 ;;
    --peer) peer_kind=$2 ;; --llama-dir) llama_dir=$2 ;;
    *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
tandem=$build/cli/tandem
[ -x "$tandem" ] || { echo "no $tandem: build first (scripts/main.sh)" >&2; exit 1; }
[ -f "$model" ] || "$tandem" make-model --preset small --seed 1 --out "$model" >/dev/null || exit 1
peer=bench/peers/llama-node
case $peer_kind in
  node)
    if [ ! -d "$peer/node_modules/node-llama-cpp" ]; then
      command -v npm >/dev/null || { echo "the peer needs node and npm (apt-get install nodejs npm)" >&2; exit 1; }
      (cd "$peer" && npm install --no-audit --no-fund >/dev/null) || { echo "npm install failed in $peer" >&2; exit 1; }
    fi ;;
  llama-server)
    [ -x "$llama_dir/build/bin/llama-server" ] ||
      { echo "no $llama_dir/build/bin/llama-server: run bench/peers/build-llama-cpp.sh" >&2; exit 1; } ;;
  *) echo "--peer is node or llama-server" >&2; exit 2 ;;
esac
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
workload=(--num-requests "$requests" --concurrency "$concurrency" --input-len "$input_len" --output-len "$output_len"
          --ignore-eos --warmup 2 --seed 1)
pid=
trap '[ -n "$pid" ] && kill -TERM $pid 2>/dev/null; wait 2>/dev/null' EXIT
wait_for() {  # file, text: up to 120 s
  for _ in $(seq 600); do grep -q "$2" "$1" 2>/dev/null && return 0; sleep 0.2; done
  echo "not ready: $1" >&2; cat "$1" >&2; return 1
}
stop() { kill -TERM "$pid" 2>/dev/null; wait "$pid" 2>/dev/null; pid=; }

"$tandem" up --model "$model" --workers 1 --threads "$threads" --runtime-dir "$out/run" --log-level warn \
  >"$out/tandem-up.out" 2>&1 &
pid=$!
wait_for "$out/tandem-up.out" "tandem: ready" || exit 1
echo "=== tandem (1 worker, $threads threads)"
"$tandem" bench --endpoint "ipc://$out/run/client.sock" "${workload[@]}" --out "$out/tandem.json" | tee "$out/tandem.txt"
stop

port=$((20000 + RANDOM % 20000))
if [ "$peer_kind" = node ]; then
  node "$peer/server.mjs" --model "$model" --port "$port" --slots "$concurrency" --threads "$threads" \
    --ctx $((input_len + output_len + 64)) >"$out/peer.out" 2>&1 &
  pid=$!
  wait_for "$out/peer.out" "llama-node: ready" || exit 1
  echo "=== llama.cpp via node-llama-cpp ($concurrency slots, $threads threads)"
else  # -c is the whole cache, shared by the slots
  "$llama_dir/build/bin/llama-server" -m "$model" --host 127.0.0.1 --port "$port" -t "$threads" -tb "$threads" \
    -np "$concurrency" -c $((concurrency * (input_len + output_len + 64))) --no-webui >"$out/peer.out" 2>&1 &
  pid=$!
  for _ in $(seq 600); do curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 && break; sleep 0.2; done
  curl -sf "http://127.0.0.1:$port/health" >/dev/null 2>&1 || { echo "not ready: llama-server" >&2; cat "$out/peer.out" >&2; exit 1; }
  echo "=== llama-server $(git -C "$llama_dir" rev-parse --short=8 HEAD 2>/dev/null) ($concurrency slots, $threads threads)"
fi
"$tandem" bench --openai-url "http://127.0.0.1:$port" --model peer --token-prompts "${workload[@]}" \
  --out "$out/peer.json" | tee "$out/peer.txt"
stop

json() {  # file, section, key: a number from the summary JSON
  tr -d '\n ' <"$1" | grep -o "\"$2\":{[^}]*}" | head -1 | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2
}
echo "=== tandem / llama.cpp (same model, same $threads threads, same requests)"
for row in "throughput output_tokens_per_s" "ttft_ms p50" "ttft_ms p99" "itl_ms p50" "itl_ms p99" "e2e_ms p50"; do
  set -- $row
  a=$(json "$out/tandem.json" "$1" "$2") b=$(json "$out/peer.json" "$1" "$2")
  awk -v n="$1.$2" -v a="$a" -v b="$b" 'BEGIN { printf "%-32s tandem %10.2f   llama.cpp %10.2f   ratio %6.2f\n", n, a, b, (b > 0 ? a / b : 0) }'
done
echo "JSON and logs: $out"
