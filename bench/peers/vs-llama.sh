#!/usr/bin/env bash
# tandem's engine against today's llama.cpp (the npm build, bench/peers/build-llama-cpp.sh) on
# one GGUF file, the two sides alternated in one run (this machine is shared and noisy: only
# ratios measured side by side mean anything). Per pair:
#   tandem-engine-bench --model FILE: prefill 512 (chunk 512), decode at batch 1 and 16 at context
#     192 (the longest llama-batched-bench's 128 + 64 reaches; its average is 160), 2 threads;
#   llama-bench -p 512 -n 128 (pp512, tg128), once as is and once with OMP_WAIT_POLICY=PASSIVE;
#   llama-batched-bench -npp 128 -ntg 64 -npl 16 (decode tokens/s at 16 sequences).
# Prints each pair, the medians, and tandem/llama.cpp ratios (median of the per-pair ratios)
# against llama.cpp's best of default and PASSIVE; then llama.cpp's system_info line.
#
#   bench/peers/vs-llama.sh MODEL.gguf [PAIRS] [BUILD]     PAIRS default 5, BUILD build/release
#   THREADS (default 2), LLAMA_DIR (default ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-cpp/llama.cpp)
# Works on any file both load: F32/F16 today, quantized types once the engine computes them.
set -uo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
model=${1:?usage: vs-llama.sh MODEL.gguf [PAIRS] [BUILD]}
pairs=${2:-5}
build=${3:-$repo/build/release}
threads=${THREADS:-2}
llama=${LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp/llama.cpp}
bin=$llama/build/bin
[ -f "$model" ] || { echo "vs-llama: no $model" >&2; exit 2; }
[ "$pairs" -ge 1 ] 2>/dev/null && [ "$pairs" -le 50 ] || { echo "vs-llama: PAIRS must be 1..50" >&2; exit 2; }
[ -x "$build/bench/tandem-engine-bench" ] || { echo "vs-llama: no $build/bench/tandem-engine-bench" >&2; exit 1; }
for tool in llama-bench llama-batched-bench; do
  [ -x "$bin/$tool" ] || { echo "vs-llama: no $bin/$tool (bench/peers/build-llama-cpp.sh)" >&2; exit 1; }
done
out=$(mktemp -d)
filter="^(prefill/threads:$threads/chunk:512/openblas:0|decode/threads:$threads/batch:(1|16)/openblas:0)/"

tandem_side() {  # -> "prefill512 decode1 decode16" tokens/s
  "$build/bench/tandem-engine-bench" --model "$model" --decode-context 192 --benchmark_filter="$filter" 2>"$out/tandem.err" |
    awk -v t="$threads" '$2 + 0 > 0 && $3 == "ms" && index($1, "prefill/threads:" t "/chunk:512/openblas:0/") == 1 {p = 512e3 / $2}
         $2 + 0 > 0 && $3 == "ms" && index($1, "decode/threads:" t "/batch:1/openblas:0/") == 1 {d1 = 1e3 / $2}
         $2 + 0 > 0 && $3 == "ms" && index($1, "decode/threads:" t "/batch:16/openblas:0/") == 1 {d16 = 16e3 / $2}
         END { printf "%.1f %.1f %.1f\n", p, d1, d16 }'
}
llama_bench() {  # [env...] -> "pp512 tg128" tokens/s
  env "$@" "$bin/llama-bench" -m "$model" -t "$threads" -p 512 -n 128 -r 1 -o jsonl 2>>"$out/llama.err" |
    python3 -c '
import json, sys
r = {}
for line in sys.stdin:
    d = json.loads(line)
    r["pp" if d["n_prompt"] else "tg"] = d["avg_ts"]
print("%.1f %.1f" % (r.get("pp", 0), r.get("tg", 0)))'
}
batched_bench() {  # -> decode tokens/s at 16 sequences of 128 + 64
  "$bin/llama-batched-bench" -m "$model" -t "$threads" -c 4096 -b 2048 -ub 512 -npp 128 -ntg 64 -npl 16 \
    --output-format jsonl 2>>"$out/llama.err" | python3 -c '
import json, sys
print("%.1f" % [json.loads(l) for l in sys.stdin if l.startswith("{")][-1]["speed_tg"])'
}
llama_side() {  # -> "pp512 tg128 pp512_passive tg128_passive batched16"
  echo "$(llama_bench) $(llama_bench OMP_WAIT_POLICY=PASSIVE) $(batched_bench)"
}

echo "model $model, $threads threads, $pairs pairs; tandem $(git -C "$repo" rev-parse --short HEAD), llama.cpp $(git -C "$llama" rev-parse --short=8 HEAD 2>/dev/null)"
printf '%-5s %-7s %10s %10s %10s | %8s %8s %10s %10s %10s\n' pair side prefill512 decode1 decode16 pp512 tg128 pp512-PAS tg128-PAS batched16
for i in $(seq 1 "$pairs"); do
  if [ $((i % 2)) -eq 1 ]; then order="tandem llama"; else order="llama tandem"; fi
  for side in $order; do
    if [ "$side" = tandem ]; then
      t=$(tandem_side)
      # A file the engine cannot load (a type it does not compute yet): its error, not zeros.
      [ "$t" != "0.0 0.0 0.0" ] || { echo "vs-llama: tandem-engine-bench failed:" >&2; tail -5 "$out/tandem.err" >&2; exit 1; }
      echo "$t" >"$out/tandem.$i"; printf '%-5s %-7s %10s %10s %10s |\n' "$i" tandem $t
    else
      l=$(llama_side)
      [ "$(echo "$l" | wc -w)" -eq 5 ] || { echo "vs-llama: llama.cpp failed:" >&2; tail -5 "$out/llama.err" >&2; exit 1; }
      echo "$l" >"$out/llama.$i"; printf '%-5s %-7s %32s | %8s %8s %10s %10s %10s\n' "$i" llama.cpp "" $l
    fi
  done
done
echo
python3 - "$out" "$pairs" <<'PY'
import statistics, sys
out, pairs = sys.argv[1], int(sys.argv[2])
t = [list(map(float, open(f"{out}/tandem.{i}").read().split())) for i in range(1, pairs + 1)]
l = [list(map(float, open(f"{out}/llama.{i}").read().split())) for i in range(1, pairs + 1)]
med = lambda xs: statistics.median(xs)
def ratio(a, b):
    return med([x / y for x, y in zip(a, b) if y > 0]) if any(b) else float("nan")
rows = [("batch-1 decode vs tg128 (best of default, PASSIVE)", [r[1] for r in t], [max(r[1], r[3]) for r in l]),
        ("batch-16 decode vs batched-bench 16 x (128+64)", [r[2] for r in t], [r[4] for r in l]),
        ("prefill 512 vs pp512 (best of default, PASSIVE)", [r[0] for r in t], [max(r[0], r[2]) for r in l])]
print("medians (tokens/s): tandem prefill512 %.1f decode1 %.1f decode16 %.1f; llama.cpp pp512 %.1f tg128 %.1f "
      "pp512-PASSIVE %.1f tg128-PASSIVE %.1f batched16 %.1f" %
      tuple([med([r[k] for r in t]) for k in range(3)] + [med([r[k] for r in l]) for k in range(5)]))
for name, a, b in rows:
    print("%-52s tandem %8.1f  llama.cpp %8.1f  ratio %5.2f (median of %d pairs)" % (name, med(a), med(b), ratio(a, b), pairs))
PY
ref=$("$repo/bench/peers/build-llama-reference.sh" "$llama" 2>/dev/null) && "$ref" --system-info --threads "$threads" 2>/dev/null
echo "raw: $out"
