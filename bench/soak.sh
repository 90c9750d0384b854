#!/usr/bin/env bash
# Soak: tandem under steady open-loop load with cancellations while its workers are killed
# (SIGKILL) on a schedule and restarted by `tandem up`. Reports whether every request got a
# final event, the RSS and open file descriptors of every process over time (least-squares
# slope), and whether the KV blocks are back to baseline once idle.
#
#   bench/soak.sh [--minutes 30] [--kill-every 300] [--model FILE] [--build DIR] [--load 0.8]
#
# Capacity is measured first (closed loop, 16 in flight); the soak then sends Poisson
# arrivals at --load x that rate, 10% of them cancelled after 8 tokens. Output: a summary
# on stdout; samples in $OUT (default a temporary folder, kept) as samples.csv.
set -uo pipefail  # no -e: a grep that finds nothing is an answer here, not an error
cd "$(dirname "$0")/.."
minutes=30 kill_every=300 model=models/small-1.gguf build=build/release load=0.8
while [ $# -gt 0 ]; do
  case $1 in
    --minutes) minutes=$2 ;; --kill-every) kill_every=$2 ;; --model) model=$2 ;; --build) build=$2 ;;
    --load) load=$2 ;; *) echo "unknown flag $1" >&2; exit 2 ;;
  esac
  shift 2
done
tandem=$build/cli/tandem
[ -f "$model" ] || "$tandem" make-model --preset small --seed 1 --out "$model" >/dev/null || exit 1
out=${OUT:-$(mktemp -d)}
mkdir -p "$out"
"$tandem" up --model "$model" --workers 2 --threads 1 --max-restarts 1000 --restart-backoff-ms 200 \
  --heartbeat-ms 500 --runtime-dir "$out/run" --log-dir "$out/logs" --log-level warn >"$out/up.out" 2>&1 &
up=$!
trap 'kill -TERM $up 2>/dev/null; wait $up 2>/dev/null || true' EXIT
for _ in $(seq 600); do grep -q "tandem: ready" "$out/up.out" && break; sleep 0.2; done
ep="ipc://$out/run/client.sock"
load_flags=(--input-len 128 --output-len 64 --ignore-eos)

json_num() { tr -d '\n ' <"$1" | grep -o "\"$2\":[0-9.e+-]*" | head -1 | cut -d: -f2; }

"$tandem" bench --endpoint "$ep" --concurrency 16 --num-requests 48 --warmup 4 "${load_flags[@]}" \
  --out "$out/capacity.json" >/dev/null
capacity=$(json_num "$out/capacity.json" requests_per_s)
rate=$(awk -v c="$capacity" -v l="$load" 'BEGIN { printf "%.3f", c * l }')
echo "capacity ${capacity} requests/s; soak at ${rate} requests/s for ${minutes} min, a worker killed every ${kill_every} s"

"$tandem" bench --endpoint "$ep" --rate "$rate" --duration $((minutes * 60)) --cancel-fraction 0.1 --cancel-after 8 \
  "${load_flags[@]}" --drain-timeout 120 --out "$out/soak.json" >"$out/soak.txt" 2>&1 &
bench=$!

echo "t_s,process,pid,rss_kb,fds" >"$out/samples.csv"
start=$(date +%s) next_kill=$((start + kill_every)) kills=0
while kill -0 $bench 2>/dev/null; do
  now=$(date +%s)
  for pid in $(pgrep -P $up); do
    name=$(tr '\0' ' ' </proc/$pid/cmdline 2>/dev/null | awk '{ for (i = 1; i < NF; ++i) if ($i == "--name") { print $(i + 1); exit } } END { }')
    [ -n "$name" ] || name=scheduler
    rss=$(awk '/^VmRSS/ { print $2 }' /proc/$pid/status 2>/dev/null || echo 0)
    fds=$(ls /proc/$pid/fd 2>/dev/null | wc -l)
    echo "$((now - start)),$name,$pid,$rss,$fds" >>"$out/samples.csv"
  done
  if [ "$now" -ge "$next_kill" ]; then
    victim=$(pgrep -P $up -f "tandem worker" | shuf -n 1 || true)
    [ -n "$victim" ] && kill -KILL "$victim" && kills=$((kills + 1)) && echo "t=$((now - start)) s: killed worker pid $victim"
    next_kill=$((next_kill + kill_every))
  fi
  sleep 10
done
wait $bench || true
sleep 5

completed=$(tr -d '\n ' <"$out/soak.json" | grep -o '"requests":{[^}]*' | grep -o '"completed":[0-9]*' | cut -d: -f2)
failed=$(tr -d '\n ' <"$out/soak.json" | grep -o '"requests":{[^}]*' | grep -o '"failed":[0-9]*' | cut -d: -f2)
cancelled=$(tr -d '\n ' <"$out/soak.json" | grep -o '"requests":{[^}]*' | grep -o '"cancelled":[0-9]*' | cut -d: -f2)
lost=$(grep -o 'no final event within the drain timeout' "$out/soak.json" | wc -l)
echo "requests: $completed completed, $failed failed (errors: see $out/soak.json), $cancelled cancelled; $lost without a final event; $kills workers killed"
"$tandem" status --endpoint "$ep" --json >"$out/idle-status.json"
in_use=$(tr -d '\n ' <"$out/idle-status.json" | grep -o '"kv_blocks_total":[0-9]*,"kv_blocks_free":[0-9]*,"kv_blocks_cached":[0-9]*' |
  awk -F'[:,]' '{ s += $2 - $4 - $6 } END { print s + 0 }')
echo "KV blocks in use once idle: $in_use (0 = back to baseline)"
# Least-squares slope per process name, over the samples of its current pid.
awk -F, 'NR > 1 { k = $2; if (pid[k] != $3) { n[k] = sx[k] = sy[k] = sxx[k] = sxy[k] = fx[k] = sf[k] = sxf[k] = 0; pid[k] = $3 }
  n[k]++; sx[k] += $1; sy[k] += $4; sxx[k] += $1 * $1; sxy[k] += $1 * $4; sf[k] += $5; sxf[k] += $1 * $5 }
  END { for (k in n) { d = n[k] * sxx[k] - sx[k] * sx[k]; if (d == 0) continue;
    printf "%-10s pid %-7s %4d samples: RSS slope %+8.2f KiB/min, fd slope %+6.3f /min\n", k, pid[k], n[k],
      60 * (n[k] * sxy[k] - sx[k] * sy[k]) / d, 60 * (n[k] * sxf[k] - sx[k] * sf[k]) / d } }' "$out/samples.csv"
echo "samples: $out/samples.csv"
