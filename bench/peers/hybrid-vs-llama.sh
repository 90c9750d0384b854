#!/usr/bin/env bash
# The hybrid (qwen35) small preset and the all-attention small preset of the same size, each run
# by tandem's engine bench and by the npm llama.cpp build's llama-bench on the same file, in one
# run, alternated (ROUNDS times, tandem first in odd rounds): prefill of a 512-token prompt and
# decode at batch 1 after 512 positions, 2 threads, F32 weights. tandem: the mean of
# `tandem-engine-bench` (prefill chunk 512; decode --decode-context 512); llama.cpp: llama-bench
# pp512 and tg64 at depth 512 (-d 512), its default F16 K/V cache (llama-bench takes no f32 cache type; tandem keeps F32 KV), 3 repetitions each.
#
#   bench/peers/hybrid-vs-llama.sh [BUILD] [ROUNDS]     e.g. bench/peers/hybrid-vs-llama.sh build/release 2
#   Needs llama-bench: TOOLS="llama-quantize llama-bench" bench/peers/build-llama-cpp.sh.
#   The model files are made in models/ (git-ignored) when missing.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
build=${1:-build/release}
rounds=${2:-2}
llama=${LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp/llama.cpp}
lb=$llama/build/bin/llama-bench
[ -x "$lb" ] || { echo "no $lb: TOOLS=\"llama-quantize llama-bench\" bench/peers/build-llama-cpp.sh"; exit 2; }
mkdir -p "$repo/models"
declare -A file=([hybrid]=$repo/models/small-hybrid-4k.gguf [attention]=$repo/models/small-4k.gguf)
[ -f "${file[hybrid]}" ] || "$build/cli/tandem" make-model --arch qwen35 --preset small --context 4096 --out "${file[hybrid]}"
[ -f "${file[attention]}" ] || "$build/cli/tandem" make-model --preset small --context 4096 --out "${file[attention]}"
echo "hybrid-vs-llama.sh: $(date -u +%FT%TZ), tandem $(git -C "$repo" rev-parse --short HEAD), llama.cpp $(git -C "$llama" rev-parse --short=8 HEAD)"

tandem_run() {  # model -> "prefill_tok_s decode_tok_s"
  local out
  out=$(mktemp)
  "$build/bench/tandem-engine-bench" --model "$1" --decode-context 512 --benchmark_out="$out" --benchmark_out_format=json \
    --benchmark_filter='^(prefill/threads:2/chunk:512/openblas:0/delta:0|decode/threads:2/batch:1/openblas:0/delta:0)/' \
    >/dev/null 2>&1
  python3 - "$out" <<'PY'
import json, sys
r = {b["name"].split("/")[0]: b["tokens/s"] for b in json.load(open(sys.argv[1]))["benchmarks"]}
print("%.1f %.1f" % (r["prefill"], r["decode"]))
PY
  rm -f "$out"
}
llama_run() {  # model -> "prefill_tok_s decode_tok_s"
  { "$lb" -m "$1" -t 2 -r 3 -p 512 -n 0 -o csv
    "$lb" -m "$1" -t 2 -r 3 -p 0 -n 64 -d 512 -o csv; } 2>/dev/null | python3 -c '
import csv, sys
rows = [r for r in csv.DictReader(sys.stdin) if r.get("avg_ts") not in (None, "", "avg_ts")]
pp = [float(r["avg_ts"]) for r in rows if r["n_prompt"] != "0"]
tg = [float(r["avg_ts"]) for r in rows if r["n_gen"] != "0"]
print("%.1f %.1f" % (pp[0], tg[0]))'
}
printf '%-10s %-6s %-9s %12s %12s\n' model round engine prefill_tok/s decode_tok/s
for i in $(seq 1 "$rounds"); do
  for m in hybrid attention; do
    if [ $((i % 2)) -eq 1 ]; then order="tandem llama.cpp"; else order="llama.cpp tandem"; fi
    for e in $order; do
      if [ "$e" = tandem ]; then r=$(tandem_run "${file[$m]}"); else r=$(llama_run "${file[$m]}"); fi
      read -r pp tg <<<"$r"
      printf '%-10s %-6s %-9s %12s %12s\n' "$m" "$i" "$e" "$pp" "$tg"
    done
  done
done
