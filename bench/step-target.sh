#!/usr/bin/env bash
# The step-time target (--target-step-ms) against the fixed budgets, alternately in one run
# (#19): `tandem up` with one worker of 2 threads on the small preset, and `tandem bench` with
# 32 requests x (128 prompt + 64 output tokens) at concurrency 32. Prints, per run, output
# tokens/s, TTFT p50 and ITL p50/p99. Run it on a quiet machine: under other load the ITLs
# measure the load.
#
#   bench/step-target.sh BUILD [TARGETS] [ROUNDS]    e.g. bench/step-target.sh build/release "0 100" 3
#
# TARGETS are --target-step-ms values (0: off); EXTRA="--prefill-chunk 64 ..." adds flags to
# `tandem up`. The small preset is made in models/ when missing;
# MODEL=FILE runs another model (a quick check of the script with the tiny preset).
set -uo pipefail
build=${1:?usage: bench/step-target.sh BUILD [TARGETS] [ROUNDS]}
targets=${2:-0 100}
rounds=${3:-3}
tandem=$build/cli/tandem
model=${MODEL:-models/small-1.gguf}
[ -f "$model" ] || { mkdir -p models && "$tandem" make-model --preset small --seed 1 --out "$model" >/dev/null; } || exit 1
dir=$(mktemp -d)
trap 'rm -rf "$dir"' EXIT

run() {  # target round -> one line
  local ep=ipc://$dir/ep-$1-$2 up
  "$tandem" up --model "$model" --workers 1 --threads 2 --endpoint "$ep" --target-step-ms "$1" ${EXTRA:-} --log-level warn \
    >"$dir/up.log" 2>&1 &
  up=$!
  for _ in $(seq 1 120); do  # until the worker has registered
    "$tandem" status --endpoint "$ep" 2>/dev/null | grep -Eq '^[0-9]+ +both ' && break
    sleep 0.5
  done
  "$tandem" bench --endpoint "$ep" --concurrency 32 --num-requests 32 --warmup 4 --input-len 128 --output-len 64 \
    --ignore-eos >"$dir/bench.txt" 2>&1
  kill "$up"
  wait "$up" 2>/dev/null
  awk -v t="$1" -v r="$2" '/^throughput/ {tok = $7} /^ttft/ {ttft = $3} /^itl/ {p50 = $3; p99 = $5}
    END { printf "%-6s %-8s %14s %14s %12s %12s\n", r, t, tok, ttft, p50, p99 }' "$dir/bench.txt"
}

printf '%-6s %-8s %14s %14s %12s %12s\n' round target "output tok/s" "TTFT p50 ms" "ITL p50 ms" "ITL p99 ms"
for r in $(seq 1 "$rounds"); do
  for t in $targets; do run "$t" "$r"; done
done
