#!/usr/bin/env bash
# Old against new binaries, alternately in one run (this machine is shared and noisy: only
# ratios measured side by side mean anything). For each pair: the engine (prefill of 512
# tokens and decode at batch 1 and 16, 2 threads, small preset) and the served path
# (tandem-serve-bench: 1 and 16 streams through `tandem up`). Prints each pair's new/old
# ratios and their medians.
#
#   bench/ab.sh OLD_BUILD NEW_BUILD [PAIRS]     e.g. bench/ab.sh /tmp/old/build/release build/release 5
#
# Both builds must have bench/tandem-engine-bench, bench/tandem-serve-bench and cli/tandem.
# The small preset model is made in models/ when missing (by the first binary that runs).
set -uo pipefail
old=${1:?usage: bench/ab.sh OLD_BUILD NEW_BUILD [PAIRS]} new=${2:?usage: bench/ab.sh OLD_BUILD NEW_BUILD [PAIRS]}
pairs=${3:-5}
[ "$pairs" -ge 1 ] && [ "$pairs" -le 50 ] || { echo "PAIRS must be 1..50"; exit 2; }
out=$(mktemp -d)
filter='^(prefill/threads:2/chunk:512/openblas:0|decode/threads:2/batch:(1|16)/openblas:0)/'

engine() {  # build -> "prefill_tok_s decode1_tok_s decode16_tok_s" (from each run's time per iteration)
  "$1/bench/tandem-engine-bench" --benchmark_filter="$filter" 2>/dev/null |
    awk '$2 + 0 > 0 && $3 == "ms" && /^prefill\/threads:2\/chunk:512\/openblas:0\// {p = 512e3 / $2}
         $2 + 0 > 0 && $3 == "ms" && /^decode\/threads:2\/batch:1\/openblas:0\// {d1 = 1e3 / $2}
         $2 + 0 > 0 && $3 == "ms" && /^decode\/threads:2\/batch:16\/openblas:0\// {d16 = 16e3 / $2}
         END { printf "%.1f %.1f %.1f\n", p, d1, d16 }'
}
serve() {  # build -> "tok_s_1_stream tok_s_16_streams"
  "$1/bench/tandem-serve-bench" --streams 1,16 --prompt 128 --output 64 --tiny-streams 8 2>/dev/null |
    awk '$1 == 1 && NF >= 5 {a=$3} $1 == 16 && NF >= 5 {b=$3} END { printf "%s %s\n", a, b }'
}

printf '%-6s %-4s %12s %12s %12s %14s %14s\n' pair side "prefill t/s" "decode1 t/s" "decode16 t/s" "serve1 t/s" "serve16 t/s"
for i in $(seq 1 "$pairs"); do
  # Alternate which side goes first, so drift in the machine's speed favours neither.
  if [ $((i % 2)) -eq 1 ]; then order="old new"; else order="new old"; fi
  for side in $order; do
    dir=$old; [ "$side" = new ] && dir=$new
    e=$(engine "$dir"); s=$(serve "$dir")
    echo "$e $s" >"$out/$side.$i"
    printf '%-6s %-4s %12s %12s %12s %14s %14s\n' "$i" "$side" $e $s
  done
done
echo
echo "new/old per pair and median (>= 0.97 keeps the speed):"
/usr/bin/env awk -v pairs="$pairs" -v dir="$out" 'BEGIN {
  split("prefill decode1 decode16 serve1 serve16", names, " ")
  for (i = 1; i <= pairs; ++i) {
    getline lo < (dir "/old." i); getline ln < (dir "/new." i)
    split(lo, o, " "); split(ln, n, " ")
    for (k = 1; k <= 5; ++k) r[k, i] = (o[k] > 0 ? n[k] / o[k] : 0)
  }
  for (k = 1; k <= 5; ++k) {
    line = sprintf("  %-9s", names[k])
    for (i = 1; i <= pairs; ++i) { v[i] = r[k, i]; line = line sprintf(" %.3f", v[i]) }
    for (i = 1; i <= pairs; ++i) for (j = i + 1; j <= pairs; ++j) if (v[j] < v[i]) { t = v[i]; v[i] = v[j]; v[j] = t }
    med = pairs % 2 ? v[(pairs + 1) / 2] : (v[pairs / 2] + v[pairs / 2 + 1]) / 2
    print line sprintf("   median %.3f", med)
  }
}'
rm -rf "$out"
