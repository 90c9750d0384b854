#!/usr/bin/env bash
# The HTTP gateway's cost (#17): one deployment (`tandem up --http`), and `tandem bench` through
# the client library (`--endpoint`) and through the gateway (`--openai-url`, completions with
# token-id prompts, so both send the same prompts; the gateway's side counts output tokens from
# `usage`), alternated in one run. Prints per run output tokens/s, TTFT p50/p99, ITL p50 and, for
# the gateway runs, the gateway process's CPU time per output token; then the ratios of the
# medians (gateway / endpoint).
#
#   bench/gateway-vs-endpoint.sh BUILD [ROUNDS] [CONCURRENCY]   e.g. bench/gateway-vs-endpoint.sh build/release 3 64
#
# MODEL=FILE (default: the tiny preset, made in models/ when missing: the most tokens per second,
# so the gateway's share of the work is the largest), THREADS (2), REQUESTS (4 x CONCURRENCY),
# INPUT (128), OUTPUT (64), BENCH_PREFIX (default "nice -n 10", for both targets alike: the load
# generator yields the cores to the service, as a client on another host would not take them;
# BENCH_PREFIX= runs it at the service's priority), UP_FLAGS (more flags for `tandem up`, e.g.
# "--nice 0" for a gateway at the normal priority instead of --nice's default 10).
# Run it on a quiet machine.
set -uo pipefail
build=${1:?usage: bench/gateway-vs-endpoint.sh BUILD [ROUNDS] [CONCURRENCY]}
rounds=${2:-3}
conc=${3:-64}
tandem=$build/cli/tandem
model=${MODEL:-models/tiny-1.gguf}
requests=${REQUESTS:-$((4 * conc))}
[ -f "$model" ] || { mkdir -p models && "$tandem" make-model --preset tiny --seed 1 --out "$model" >/dev/null; } || exit 1
dir=$(mktemp -d)
port=$((20000 + RANDOM % 20000))
ep=ipc://$dir/ep
"$tandem" up --model "$model" --workers 1 --threads "${THREADS:-2}" --endpoint "$ep" --http "127.0.0.1:$port" \
  ${UP_FLAGS:-} --log-level warn >"$dir/up.log" 2>&1 &
up=$!
trap 'kill $up 2>/dev/null; wait $up 2>/dev/null; rm -rf "$dir"' EXIT
name=
for _ in $(seq 1 120); do  # until the worker has registered and the gateway answers
  if "$tandem" status --endpoint "$ep" 2>/dev/null | grep -Eq '^[0-9]+ +both '; then
    name=$(curl -sf "http://127.0.0.1:$port/v1/models" | sed -n 's/.*"id":"\([^"]*\)".*/\1/p')
    [ -n "$name" ] && break
  fi
  sleep 0.5
done
[ -n "$name" ] || { echo "the deployment did not come up:" >&2; cat "$dir/up.log" >&2; exit 1; }
gateway=$(pgrep -P "$up" -f ' gateway ' | head -1)
[ -n "$gateway" ] || { echo "no gateway process under tandem up ($up)" >&2; exit 1; }
ticks=$(getconf CLK_TCK)

cpu_ticks() { awk '{print $14 + $15}' "/proc/$gateway/stat"; }

run() {  # kind round seed -> one line
  local target before after
  if [ "$1" = endpoint ]; then target=(--endpoint "$ep"); else target=(--openai-url "http://127.0.0.1:$port" --model "$name" --token-prompts); fi
  before=$(cpu_ticks)
  ${BENCH_PREFIX-nice -n 10} "$tandem" bench "${target[@]}" --concurrency "$conc" --num-requests "$requests" --warmup 8 \
    --input-len "${INPUT:-128}" --output-len "${OUTPUT:-64}" --ignore-eos --seed "$3" >"$dir/bench.txt" 2>&1
  after=$(cpu_ticks)
  grep -m1 -E '^  error' "$dir/bench.txt" >&2  # the first failure's reason, if any
  awk -v k="$1" -v r="$2" -v cpu="$((after - before))" -v hz="$ticks" '
    /^requests/ {failed = $4} /^throughput/ {tok = $7}
    /^duration/ {secs = $2} /^ttft/ {p50 = $3; p99 = $5} /^itl/ {itl = $3}
    END { per = (k == "gateway" && tok > 0) ? sprintf("%.1f", cpu / hz / (tok * secs) * 1e6) : "-"
          printf "%-6s %-9s %12s %10s %10s %9s %12s %7s\n", r, k, tok, p50, p99, itl, per, failed }' "$dir/bench.txt"
}

printf '%-6s %-9s %12s %10s %10s %9s %12s %7s\n' round target "output tok/s" "TTFT p50" "TTFT p99" "ITL p50" "gw CPU us/tok" failed
for r in $(seq 1 "$rounds"); do
  # A seed per run: no run finds another's prompts in the prefix cache.
  run endpoint "$r" "$((2 * r))"
  run gateway "$r" "$((2 * r + 1))"
done | tee "$dir/runs.txt"
awk 'function median(a, n,   i, j, t) { for (i = 1; i <= n; i++) for (j = i + 1; j <= n; j++) if (a[j] < a[i]) { t = a[i]; a[i] = a[j]; a[j] = t }
       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     $2 == "endpoint" { e[++ne] = $3; et[ne] = $4 } $2 == "gateway" { g[++ng] = $3; gt[ng] = $4; c[ng] = $7 }
     END { printf "median: output tok/s gateway/endpoint %.3f, TTFT p50 gateway - endpoint %+.1f ms, gateway CPU %.1f us/token\n",
             median(g, ng) / median(e, ne), median(gt, ng) - median(et, ne), median(c, ng) }' "$dir/runs.txt"
