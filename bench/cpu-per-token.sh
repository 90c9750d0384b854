#!/usr/bin/env bash
# Output tokens/s and CPU per output token of each process (worker, scheduler, bench client) for
# one `tandem up` deployment (one 2-thread worker) and one closed-loop `tandem bench` run on
# bench/spec.sh's text prompts, greedy, 256 output tokens. CPU is utime + stime over the run
# (/proc/PID/stat of the worker and the scheduler, /usr/bin/time for the client): unlike tok/s it
# shows where a loaded machine's cores went. Alternate binaries/options across calls yourself.
#   bench/cpu-per-token.sh BUILD MODEL SPEC CONC REQUESTS   e.g. build/release tests/data/vocab-trained.gguf ngram 16 96
set -uo pipefail
b=$1 model=$2 spec=$3 c=$4 n=$5
root=$(cd "$(dirname "$0")/.." && pwd)
t=$(mktemp -d)
up=
trap '[ -n "$up" ] && kill "$up" 2>/dev/null && wait "$up" 2>/dev/null; rm -rf "$t"' EXIT
python3 "$root/bench/text-prompts.py" >"$t/text.jsonl"
"$b/cli/tandem" up --model "$model" --workers 1 --threads 2 --spec "$spec" --runtime-dir "$t/run" --log-level warn \
  >"$t/up.out" 2>&1 &
up=$!
for _ in $(seq 1 300); do grep -q "tandem: ready" "$t/up.out" && break; sleep 0.1; done
grep -q "tandem: ready" "$t/up.out" || { cat "$t/up.out"; exit 1; }
args=(--endpoint "ipc://$t/run/client.sock" --concurrency "$c" --output-len 256 --ignore-eos --seed 7
      --dataset "$t/text.jsonl")
"$b/cli/tandem" bench "${args[@]}" --num-requests "$c" --warmup "$c" --out "$t/w.json" >/dev/null 2>&1
wp=$(pgrep -f "tandem worker.*$t") sp=$(pgrep -f "tandem scheduler.*$t")
cpu() { awk '{ print $14 + $15 }' "/proc/$1/stat"; }
w0=$(cpu "$wp") s0=$(cpu "$sp")
/usr/bin/time -f "%U %S" -o "$t/time" "$b/cli/tandem" bench "${args[@]}" --num-requests "$n" --warmup 0 \
  --out "$t/b.json" >/dev/null 2>&1
w1=$(cpu "$wp") s1=$(cpu "$sp")
python3 - "$t" "$spec" "$((n * 256))" "$w0" "$w1" "$s0" "$s1" "$(getconf CLK_TCK)" <<'PY'
import json, sys
t, spec, tok, w0, w1, s0, s1, hz = sys.argv[1], sys.argv[2], int(sys.argv[3]), *map(float, sys.argv[4:9])
j = json.load(open(t + "/b.json"))
u, s = map(float, open(t + "/time").read().split())
us = lambda sec: sec * 1e6 / tok
print("%-6s tok/s %8.0f   CPU us per token: worker %.1f scheduler %.1f bench %.1f" % (
    spec, j["throughput"]["output_tokens_per_s"], us((w1 - w0) / hz), us((s1 - s0) / hz), us(u + s)))
PY
