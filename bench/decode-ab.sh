#!/usr/bin/env bash
# Two tandem binaries (old, new) alternated in one run (this machine is shared and noisy: only
# ratios measured side by side mean anything): for each pair and binary, `tandem up` with one
# 2-thread worker and --spec off then ngram, and on each `tandem bench` closed loop at
# concurrency 1 and 16, 256 output tokens (--ignore-eos), greedy, text prompts (200-byte
# windows of tests/data/heldout.txt). Prints every run's output tokens/s, then per
# configuration the runs of each binary and the new/old ratio of their medians.
#
#   bench/decode-ab.sh OLD_TANDEM NEW_TANDEM [PAIRS]     MODEL=FILE (default tests/data/vocab-trained.gguf)
set -uo pipefail
old=${1:?usage: bench/decode-ab.sh OLD_TANDEM NEW_TANDEM [PAIRS]} new=${2:?usage: bench/decode-ab.sh OLD_TANDEM NEW_TANDEM [PAIRS]}
pairs=${3:-3}
[ "$pairs" -ge 1 ] && [ "$pairs" -le 20 ] || { echo "PAIRS must be 1..20"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
model=${MODEL:-$root/tests/data/vocab-trained.gguf}
tmp=$(mktemp -d)
up_pid=
cleanup() {
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT
python3 "$root/bench/text-prompts.py" >"$tmp/text.jsonl"  # 32 windows of the held-out text
echo "bench/decode-ab.sh: $(date -u +%FT%TZ), model $(basename "$model"), $pairs pairs"
for p in $(seq 1 "$pairs"); do
  if [ $((p % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for which in $order; do
    bin=$old; [ "$which" = new ] && bin=$new
    for spec in off ngram; do
      rm -rf "$tmp/run"
      "$bin" up --model "$model" --workers 1 --threads 2 --spec "$spec" --runtime-dir "$tmp/run" --log-level warn \
        >"$tmp/up.out" 2>&1 &
      up_pid=$!
      for _ in $(seq 1 300); do grep -q "tandem: ready" "$tmp/up.out" && break; sleep 0.1; done
      for c in 1 16; do
        "$bin" bench --endpoint "ipc://$tmp/run/client.sock" --concurrency "$c" --warmup "$c" \
          --num-requests $((c == 1 ? 16 : 96)) --output-len 256 --ignore-eos --seed 7 --dataset "$tmp/text.jsonl" \
          --out "$tmp/b.json" >/dev/null 2>&1
        tps=$(python3 -c "import json,sys; print(round(json.load(open(sys.argv[1]))['throughput']['output_tokens_per_s']))" "$tmp/b.json" 2>/dev/null || echo 0)
        echo "$p $which $spec c$c $tps" | tee -a "$tmp/res"
      done
      kill "$up_pid"; wait "$up_pid" 2>/dev/null; up_pid=
    done
  done
done
echo
echo "per configuration: old runs | new runs | new/old of the medians"
awk '{ k = $3 " " $4; v[k, $2] = v[k, $2] " " $5; keys[k] = 1 }
     function med(s,   a, n, i, j, x) { n = split(s, a, " ")
       for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] < a[i]) { x = a[i]; a[i] = a[j]; a[j] = x }
       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     END { for (k in keys) printf "  %-10s old%s | new%s | %.2fx\n", k, v[k, "old"], v[k, "new"], med(v[k, "new"]) / med(v[k, "old"]) }' \
  "$tmp/res" | sort
