#!/usr/bin/env bash
# Sliding-window layers at long context (issue 23, docs/WINDOWS.md): make-model's tiny gemma3
# (6 layers, 5 windowed then 1 full, 2 KV heads of 32; F32 KV: 8 KiB per layer per block of 16)
# with Gemma 3's window of 512 and --context 16640, against its all-global twin: the same file
# with a window of 16777216 (no key is ever masked, every block kept; make-model writes the
# same weights, only attention.sliding_window differs).
#
# Part 1, timed (takes the quiet lock /tmp/tandem-quiet when free, waits up to 5 minutes for
# it, holds it under 10): `tandem run`, a prompt of 16383 random ids in chunks of 512, 128
# tokens decoded greedily, 1 thread; per configuration prefill seconds, decode tokens/s and
# peak RSS (/usr/bin/time). Configurations, alternated REPS times in one run: windowed with
# --kv-rings, windowed without, global, and windowed on OLD_TANDEM when given (kernels that
# score every key).
# Part 2, accounting (no lock): `tandem up --kv-rings` (one worker, --kv-blocks 400, chunks of
# 512) on the windowed model, then without rings (--kv-blocks 1100) on both models; a prompt
# of N - 1 ids plus 64 decoded for N = 1k, 4k, 16k; the most blocks in use in each pool while
# the request runs, polled from `tandem status --json` every 50 ms.
#
#   bench/windows.sh TANDEM [OLD_TANDEM] [REPS]
set -uo pipefail
bin=${1:?usage: bench/windows.sh TANDEM [OLD_TANDEM] [REPS]}
old=${2:-}
reps=${3:-3}
[ "$reps" -ge 1 ] && [ "$reps" -le 10 ] || { echo "REPS must be 1..10"; exit 2; }
tmp=$(mktemp -d)
up_pid= locked=
cleanup() {
  [ -n "$up_pid" ] && kill "$up_pid" 2>/dev/null && wait "$up_pid" 2>/dev/null
  [ -n "$locked" ] && rm -f /tmp/tandem-quiet
  rm -rf "$tmp"
}
trap cleanup EXIT
for w in 512 16777216; do
  "$bin" make-model --arch gemma3 --preset tiny --context 16640 --sliding-window "$w" --seed 7 \
    --out "$tmp/w$w.gguf" >/dev/null 2>&1 || { echo "make-model failed"; exit 1; }
done
windowed=$tmp/w512.gguf global=$tmp/w16777216.gguf
ids() { python3 -c "import random,sys; r=random.Random(7); print(','.join(str(r.randrange(3,512)) for _ in range(int(sys.argv[1]))))" "$1"; }
ids 16383 >"$tmp/ids16k"
echo "bench/windows.sh: $(date -u +%FT%TZ), $reps repetitions, $(nproc) CPUs"

# Part 1: one `tandem run`; prints "config prefill_s decode_tps peak_rss_mib".
run_one() {
  local name=$1 b=$2 model=$3; shift 3
  /usr/bin/time -f "rss %M" "$b" run --model "$model" --tokens "$(cat "$tmp/ids16k")" --max-tokens 128 --ignore-eos \
    --chunk 512 --threads 1 "$@" >/dev/null 2>"$tmp/run.err"
  awk -v n="$name" '/tandem run:/ { p = $7; for (i = 1; i <= NF; ++i) if ($i == "decode") d = $(i + 1) }
                    /^rss/ { r = $2 / 1024 } END { printf "%-16s %7.2f %8.1f %6.1f\n", n, p, d, r }' "$tmp/run.err"
}
for _ in $(seq 1 300); do [ -e /tmp/tandem-quiet ] || break; sleep 1; done
if [ ! -e /tmp/tandem-quiet ]; then touch /tmp/tandem-quiet && locked=1; else echo "(quiet lock busy: timing anyway)"; fi
echo "part 1: 16383-token prompt, 128 decoded: config, prefill s, decode tokens/s, peak RSS MiB"
for r in $(seq 1 "$reps"); do
  configs="rings plain global old"
  [ $((r % 2)) -eq 0 ] && configs="old global plain rings"
  for c in $configs; do
    case $c in
      rings) run_one windowed+rings "$bin" "$windowed" --kv-rings ;;
      plain) run_one windowed "$bin" "$windowed" ;;
      global) run_one global "$bin" "$global" ;;
      old) [ -n "$old" ] && run_one windowed-old "$old" "$windowed" ;;
    esac
  done | tee -a "$tmp/part1"
done
[ -n "$locked" ] && rm -f /tmp/tandem-quiet && locked=
echo "medians:"
awk '{ v[$1] = v[$1] " " $3; p[$1] = p[$1] " " $2; m[$1] = $4 }
     function med(s,   a, n, i, j, x) { n = split(s, a, " ")
       for (i = 1; i <= n; ++i) for (j = i + 1; j <= n; ++j) if (a[j] + 0 < a[i] + 0) { x = a[i]; a[i] = a[j]; a[j] = x }
       return n % 2 ? a[(n + 1) / 2] : (a[n / 2] + a[n / 2 + 1]) / 2 }
     END { for (k in v) printf "  %-16s prefill %6.2f s  decode %7.1f tokens/s  peak RSS %5.1f MiB\n", k, med(p[k]), med(v[k]), m[k] }' \
  "$tmp/part1" | sort

# Part 2: the most blocks in use per pool while one request of N - 1 prompt ids runs.
serve() {
  local model=$1; shift
  rm -rf "$tmp/run"
  "$bin" up --model "$model" --workers 1 --threads 1 --prefill-chunk 512 --runtime-dir "$tmp/run" --log-level warn "$@" \
    >"$tmp/up.out" 2>&1 &
  up_pid=$!
  for _ in $(seq 1 300); do grep -q "tandem: ready" "$tmp/up.out" && break; sleep 0.1; done
}
peak_blocks() {
  local name=$1 n=$2 ep=ipc://$tmp/run/client.sock
  "$bin" generate --endpoint "$ep" --tokens "$(ids $((n - 1)))" --max-tokens 64 --ignore-eos >/dev/null 2>&1 &
  local gen=$!
  : >"$tmp/status"
  while kill -0 "$gen" 2>/dev/null; do
    "$bin" status --endpoint "$ep" --json >>"$tmp/status" 2>/dev/null
    sleep 0.05
  done
  wait "$gen"
  python3 - "$name" "$n" "$tmp/status" <<'EOF'
import json, sys
full = ring = total = rtotal = kv = 0
for line in open(sys.argv[3]):
    try: w = json.loads(line)["workers"][0]
    except Exception: continue
    # in use: neither free nor kept by the prefix cache (earlier requests' cached blocks)
    full = max(full, w["kv_blocks_total"] - w["kv_blocks_free"] - w.get("kv_blocks_cached", 0))
    ring = max(ring, w.get("kv_ring_blocks_total", 0) - w.get("kv_ring_blocks_free", 0)
               - w.get("kv_ring_blocks_cached", 0))
    total, rtotal, kv = w["kv_blocks_total"], w.get("kv_ring_blocks_total", 0), w["kv_bytes"]
# F32 KV of this model: 8 KiB per layer per block; a full-layer block holds 1 layer with rings
# (the 5 windowed ones are in the ring block), all 6 without.
mib = (full * 8 + ring * 40 if rtotal else full * 48) / 1024
print(f"{sys.argv[1]:<16} {sys.argv[2]:>6}: peak blocks in use: full {full:5d} of {total}, ring {ring:3d} of {rtotal:3d};"
      f" KV in use {mib:5.1f} MiB (pool {kv / 2**20:.1f} MiB)")
EOF
}
echo
echo "part 2: peak blocks in use (full-layer pool; ring pool) for one request, context N"
serve "$windowed" --kv-rings --kv-blocks 400
for n in 1024 4096 16384; do peak_blocks windowed+rings "$n"; done
kill "$up_pid"; wait "$up_pid" 2>/dev/null; up_pid=
serve "$windowed" --kv-blocks 1100
for n in 1024 4096 16384; do peak_blocks windowed "$n"; done
kill "$up_pid"; wait "$up_pid" 2>/dev/null; up_pid=
serve "$global" --kv-blocks 1100
for n in 1024 16384; do peak_blocks global "$n"; done
kill "$up_pid"; wait "$up_pid" 2>/dev/null; up_pid=
