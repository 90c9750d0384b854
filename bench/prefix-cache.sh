#!/usr/bin/env bash
# Prefix caching on the small preset: a 1024-token shared prefix and 64-token unique
# suffixes (`tandem bench --shared-prefix 1024 --prefix-groups 4 --input-len 1088`), one
# request at a time (so time to first token is prefill, not queueing), served with
# --prefix-cache on and off, one after the other in this run. Prints p50/p99 TTFT for
# both, their ratio, and the prompt tokens each measured request had computed (the scheduler
# reports the cached ones in each final event).
#
#   bench/prefix-cache.sh [BUILD_DIR (default build/release)] [REQUESTS (default 24)]
#
# ARCH=qwen35: the hybrid small preset instead (docs/HYBRID.md "Prefix cache"); "on" is then
# --state-checkpoints ${CHECKPOINTS:-16} (a hit resumes from the last checkpoint, every 256
# tokens by default: 1024 here) and "off" --state-checkpoints 0.
set -euo pipefail
cd "$(dirname "$0")/.."
build=${1:-build/release}
n=${2:-24}
tandem=$build/cli/tandem
arch=${ARCH:-llama}
model=models/small-1.gguf
[ "$arch" = llama ] || model=models/$arch-small-1.gguf
[ -f "$model" ] || "$tandem" make-model --arch "$arch" --preset small --seed 1 --out "$model" >/dev/null
cache_flags() {  # cache_flags on|off
  if [ "$arch" = qwen35 ]; then
    [ "$1" = on ] && echo "--state-checkpoints ${CHECKPOINTS:-16}" || echo "--state-checkpoints 0"
  else
    echo "--prefix-cache $1"
  fi
}
work=$(mktemp -d)
trap 'kill $(jobs -p) 2>/dev/null; wait 2>/dev/null; [ -n "${KEEP:-}" ] || rm -rf "$work"' EXIT

field() {  # field FILE SECTION KEY: a number from the bench JSON, e.g. ttft_ms p50
  tr -d '\n ' <"$1" | grep -o "\"$2\":{[^}]*}" | head -1 | grep -o "\"$3\":[0-9.e+-]*" | cut -d: -f2
}

for cache in on off; do
  # shellcheck disable=SC2046  # the flags split into words
  "$tandem" up --model "$model" --workers 1 --threads 2 $(cache_flags "$cache") --runtime-dir "$work/run-$cache" \
    --log-level warn >"$work/up-$cache.out" 2>&1 &
  for _ in $(seq 600); do grep -q "tandem: ready" "$work/up-$cache.out" && break; sleep 0.2; done
  ep="ipc://$work/run-$cache/client.sock"
  # Warm-up: one request per prefix group (the first sight of each prefix computes it).
  "$tandem" bench --endpoint "$ep" --concurrency 1 --num-requests "$n" --warmup 4 --shared-prefix 1024 \
    --prefix-groups 4 --input-len 1088 --output-len 16 --ignore-eos --seed 7 --out "$work/$cache.json" >/dev/null
  kill %1; wait %1 2>/dev/null || true
done

for cache in on off; do
  input=$(tr -d '\n ' <"$work/$cache.json" | grep -o '"tokens":{[^}]*}' | grep -o '"input":[0-9]*' | cut -d: -f2)
  cached=$(tr -d '\n ' <"$work/$cache.json" | grep -o '"tokens":{[^}]*}' | grep -o '"cached_input":[0-9]*' | cut -d: -f2)
  printf 'prefix cache %-3s: TTFT p50 %8.1f ms, p99 %8.1f ms; prompt tokens computed per request %6.1f of 1088\n' \
    "$cache" "$(field "$work/$cache.json" ttft_ms p50)" "$(field "$work/$cache.json" ttft_ms p99)" \
    "$(awk -v i="$input" -v c="$cached" -v n="$n" 'BEGIN { print (i - c) / n }')"
done
awk -v off="$(field "$work/off.json" ttft_ms p50)" -v on="$(field "$work/on.json" ttft_ms p50)" \
  'BEGIN { printf "ratio: TTFT p50 off / on = %.1f (target >= 8)\n", off / on }'
