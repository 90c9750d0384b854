#!/usr/bin/env bash
# Speculative decoding (--spec ngram) against plain decoding, alternated in one run (this machine
# is shared and noisy: only ratios measured side by side mean anything). For each trained model
# (tests/data/tiny-trained.gguf, tests/data/vocab-trained.gguf) and each pair, `tandem up` with
# one 2-thread worker and --spec off, then --spec ngram (the order alternates per pair), and on
# each `tandem bench` closed-loop at concurrency 1 and 16 with text prompts (lines of
# tests/data/heldout.txt: the models' output repeats, greedy) and with random ids sampled at
# temperature 1 (--input-len, --temperature 1: output that does not repeat, drafts mostly
# rejected, speculation should turn itself off). Prints output tokens/s per run, the
# ngram/off ratios per pair and their medians, and the acceptance (drafts accepted / fed, and
# tokens per round) from `tandem status --json`.
#
#
# WORKLOADS biased: random ids, greedy, every request with --logit-bias $BIAS (default 11=30,12=30,13=30):
# output held to three tokens the model picks among, so a model whose output does not repeat
# (make-model's random hybrid presets, MODELS=qwen35-tiny or qwen35-small) gets drafts accepted.
#
# MODE draft: --spec draft against off instead, on the small preset (random weights, seed 1)
# drafting for itself through its Q4_0 copy (`tandem make-model --from ... --dtype q4_0`),
# text prompts only, at concurrency 1 and 4 (4 and 8 requests: it decodes ~100x slower).
#
#   bench/spec.sh [BUILD] [PAIRS] [OUTPUT_LEN] [MODE]   e.g. bench/spec.sh build/release 3 256 ngram
#   MODELS, WORKLOADS (text random), CONCS (1 16) restrict the runs; SPEC_TOKENS=K passes
#   --spec-tokens K to the speculating deployments.
#   FEW=1 runs the draft mode's request counts (4 at concurrency 1, 2 x C) in any mode, for a slow
#   model (MODELS=qwen35-small).
#   SCALE=N runs N times the requests per run (16 at concurrency 1, 96 at 16): the tiny model's
#   runs last under a second at SCALE=1, where one scheduling hiccup moves a ratio by 30 %.
set -uo pipefail
build=${1:-build/release}
pairs=${2:-3}
out_len=${3:-256}
mode=${4:-ngram}
[ "$mode" = ngram ] || [ "$mode" = draft ] || { echo "MODE must be ngram or draft"; exit 2; }
[ "$pairs" -ge 1 ] && [ "$pairs" -le 20 ] || { echo "PAIRS must be 1..20"; exit 2; }
tandem=$build/cli/tandem
[ -x "$tandem" ] || { echo "no $tandem: build the tandem target first"; exit 2; }
root=$(cd "$(dirname "$0")/.." && pwd)
tmp=$(mktemp -d)
up_pid=
cleanup() {
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null
  rm -rf "$tmp"
}
trap cleanup EXIT

python3 "$root/bench/text-prompts.py" >"$tmp/text.jsonl"  # 32 windows of the held-out text

json_get() {  # file expr -> value (python expression over `j`)
  python3 -c "import json,sys; j=json.load(open(sys.argv[1])); print($2)" "$1"
}
spec_counts() {  # -> "rounds drafts accepted" summed over the workers
  "$tandem" status --endpoint "ipc://$tmp/run/client.sock" --json >"$tmp/status.json" 2>/dev/null
  json_get "$tmp/status.json" "' '.join(str(sum(w.get(k, 0) for w in j['workers'])) for k in ('spec_rounds', 'drafts', 'drafts_accepted'))"
}
up() {  # model spec
  local spec=(--spec "$2")
  [ "$2" != off ] && [ -n "${SPEC_TOKENS:-}" ] && spec+=(--spec-tokens "$SPEC_TOKENS")
  [ "$2" = draft ] && spec+=(--draft-model "$tmp/small-q4.gguf")
  rm -rf "$tmp/run"
  "$tandem" up --model "$1" --workers 1 --threads 2 "${spec[@]}" --runtime-dir "$tmp/run" --log-level warn \
    >"$tmp/up.out" 2>&1 &
  up_pid=$!
  for _ in $(seq 1 600); do
    grep -q "tandem: ready" "$tmp/up.out" && return 0
    sleep 0.1
  done
  echo "tandem up did not become ready:"; cat "$tmp/up.out"; exit 1
}
down() {  # LOGS=DIR keeps each run's `tandem up` output there
  kill "$up_pid" 2>/dev/null; wait "$up_pid" 2>/dev/null; up_pid=
  [ -n "${LOGS:-}" ] && mkdir -p "$LOGS" && cp "$tmp/up.out" "$LOGS/up-$(date +%s%N).out"
}
bench() {  # concurrency workload -> "tok_s rounds drafts accepted" of this run
  local c=$1 w=$2 n=$(( ($1 == 1 ? 16 : 96) * ${SCALE:-1} )) before after
  [ "$mode" = draft ] || [ -n "${FEW:-}" ] && n=$(( $1 == 1 ? 4 : 2 * $1 ))  # the small preset decodes ~100x slower
  before=$(spec_counts)
  local args=(--endpoint "ipc://$tmp/run/client.sock" --concurrency "$c" --num-requests "$n" --warmup "$c"
              --output-len "$out_len" --ignore-eos --seed 7 --out "$tmp/bench.json")
  case $w in
    text) args+=(--dataset "$tmp/text.jsonl") ;;
    biased) args+=(--input-len 64 --logit-bias "${BIAS:-11=30,12=30,13=30}") ;;
    *) args+=(--input-len 64 --temperature 1) ;;
  esac
  "$tandem" bench "${args[@]}" >"$tmp/bench.out" 2>&1 || { cat "$tmp/bench.out" >&2; echo "0 0 0 0"; return; }
  after=$(spec_counts)
  echo "$(json_get "$tmp/bench.json" "j['throughput']['output_tokens_per_s']") $before $after" |
    awk '{ printf "%.1f %d %d %d\n", $1, $5 - $2, $6 - $3, $7 - $4 }'
}

models=${MODELS:-tiny-trained vocab-trained} workloads=${WORKLOADS:-text random} concs=${CONCS:-1 16}
if [ "$mode" = draft ]; then
  workloads=text concs="1 4"
  "$tandem" make-model --preset small --seed 1 --out "$tmp/small.gguf" >/dev/null || exit 1
  "$tandem" make-model --from "$tmp/small.gguf" --dtype q4_0 --out "$tmp/small-q4.gguf" >/dev/null || exit 1
  models=small
fi
# qwen35-tiny, qwen35-small: make-model's hybrid presets (random weights, seed 1), made here.
for m in $models; do
  case $m in qwen35-*) "$tandem" make-model --arch qwen35 --preset "${m#qwen35-}" --seed 1 --out "$tmp/$m.gguf" >/dev/null || exit 1 ;; esac
done
model_file() {
  case $1 in small | qwen35-*) echo "$tmp/$1.gguf" ;; *) echo "$root/tests/data/$1.gguf" ;; esac
}

echo "bench/spec.sh: $(date -u +%FT%TZ), $(git -C "$root" rev-parse --short HEAD 2>/dev/null), output $out_len tokens, $pairs pairs, $mode"
printf '%-14s %-5s %-6s %-6s %4s %10s %8s %10s\n' model pair spec prompt conc "tok/s" accept "tok/round"
for model in $models; do
  for i in $(seq 1 "$pairs"); do
    if [ $((i % 2)) -eq 1 ]; then order="off $mode"; else order="$mode off"; fi
    for spec in $order; do
      up "$(model_file "$model")" "$spec"
      for w in $workloads; do
        for c in $concs; do
          read -r tps rounds drafts accepted <<<"$(bench "$c" "$w")"
          acc=$(awk -v d="$drafts" -v a="$accepted" 'BEGIN { if (d > 0) printf "%.2f", a / d; else printf "-" }')
          tpr=$(awk -v r="$rounds" -v a="$accepted" 'BEGIN { if (r > 0) printf "%.2f", (r + a) / r; else printf "-" }')
          echo "$model $i $spec $w $c $tps" >>"$tmp/results"
          printf '%-14s %-5s %-6s %-6s %4s %10s %8s %10s\n' "$model" "$i" "$spec" "$w" "$c" "$tps" "$acc" "$tpr"
        done
      done
      down
    done
  done
done
echo
echo "$mode/off output tokens/s, per pair and median (goals, ngram: text 2x at 1, 1.5x at 16; random >= 0.95x):"
awk -v mode="$mode" '{ t[$1 " " $4 " " $5 " " $2 " " $3] = $6; key[$1 " " $4 " " $5] = 1; if ($2 > np) np = $2 }
     END {
       for (k in key) {
         n = 0; line = sprintf("  %-30s", k)
         for (i = 1; i <= np; ++i) {
           o = t[k " " i " off"]; g = t[k " " i " " mode]
           if (o > 0) { v[++n] = g / o; line = line sprintf(" %.3f", g / o) }
         }
         for (a = 1; a <= n; ++a) for (b = a + 1; b <= n; ++b) if (v[b] < v[a]) { x = v[a]; v[a] = v[b]; v[b] = x }
         med = n % 2 ? v[(n + 1) / 2] : (v[n / 2] + v[n / 2 + 1]) / 2
         print line sprintf("   median %.3f", med)
       }
     }' "$tmp/results" | sort
