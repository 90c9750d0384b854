#!/usr/bin/env bash
# Recomputes llama.cpp's reference continuations (bench/peers/llama-reference.cpp: greedy 32
# tokens, F32 KV, 2 threads, one sequence, flash attention off) with the npm llama.cpp build:
#   - for every QUANT_DIR/{trained,mid}-TYPE.gguf with QUANT_DIR/{trained,mid}-prompts.txt:
#     OUT/{trained,mid}-llamacpp-TYPE.jsonl, and how many tokens differ from the older
#     QUANT_DIR/{trained,mid}-llamacpp-TYPE.jsonl (made by llama.cpp c392e50);
#   - for make-model's architecture files (tiny preset, seed 7, as tests/engine/architecture_test
#     makes them): OUT/arch-NAME.gguf.sha256 and OUT/arch-NAME-llamacpp.jsonl for OUT/arch-prompts.txt
#     (the sliding-window gemma2 and gemma3: OUT/arch-window-prompts.txt).
#
#   bench/peers/llama-references.sh QUANT_DIR OUT [TANDEM_BIN]
#   QUANT_DIR: e.g. ../shared/data/quant; TANDEM_BIN default build/release/cli/tandem.
#   LLAMA_DIR (default ${XDG_CACHE_HOME:-~/.cache}/tandem/llama-cpp/llama.cpp) may be set.
set -euo pipefail
repo=$(cd "$(dirname "$0")/../.." && pwd)
quant=${1:?usage: llama-references.sh QUANT_DIR OUT [TANDEM_BIN]}
out=${2:?usage: llama-references.sh QUANT_DIR OUT [TANDEM_BIN]}
tandem=${3:-$repo/build/release/cli/tandem}
llama=${LLAMA_DIR:-${XDG_CACHE_HOME:-$HOME/.cache}/tandem/llama-cpp/llama.cpp}
ref=$("$repo/bench/peers/build-llama-reference.sh" "$llama")
mkdir -p "$out"
echo "llama.cpp $(git -C "$llama" rev-parse --short=8 HEAD)"

# Tokens that differ between two jsonl files, line by line, position by position; and the largest
# |logprob difference| of the chosen token over each prompt's positions before its first difference.
differ() {
  python3 - "$1" "$2" <<'PY'
import json, sys
a = [json.loads(l) for l in open(sys.argv[1])]
b = [json.loads(l) for l in open(sys.argv[2])]
n = d = 0
first, worst = [], 0.0
for x, y in zip(a, b):
    tx, ty = x["tokens"], y["tokens"]
    n += len(tx)
    d += sum(1 for i in range(max(len(tx), len(ty))) if i >= len(tx) or i >= len(ty) or tx[i] != ty[i])
    f = next((i for i in range(len(tx)) if i >= len(ty) or tx[i] != ty[i]), None)
    first.append("-" if f is None else str(f))
    for i in range(len(tx) if f is None else f):
        worst = max(worst, abs(x["top"][i][0][1] - y["top"][i][0][1]))
print(f"{d} of {n} tokens differ; first difference per prompt: {' '.join(first)}; "
      f"max |logprob difference| before it: {worst:.3g}")
PY
}

for model in "$quant"/trained-*.gguf "$quant"/mid-*.gguf; do
  base=$(basename "$model" .gguf)
  set_name=${base%%-*}
  type=${base#*-}
  jsonl="$out/$set_name-llamacpp-$type.jsonl"
  "$ref" "$model" "$quant/$set_name-prompts.txt" 2>/dev/null >"$jsonl"
  old="$quant/$set_name-llamacpp-$type.jsonl"
  if [ -f "$old" ]; then echo "$(basename "$jsonl"): $(differ "$old" "$jsonl")"; else echo "$(basename "$jsonl"): new"; fi
done

# make-model's architecture files, as tests/engine/architecture_test.cpp writes them.
tmp=$(mktemp -d)
trap 'rm -rf "$tmp"' EXIT
# Each line: the name, the prompts file (in OUT), then make-model's flags. The sliding-window
# architectures (window 32) take arch-window-prompts.txt, prompts of 161 to 342 tokens.
while read -r name prompts flags; do
  # shellcheck disable=SC2086
  "$tandem" make-model --preset tiny $flags --seed 7 --out "$tmp/$name.gguf" 2>/dev/null
  (cd "$tmp" && sha256sum "$name.gguf") >"$out/arch-$name.gguf.sha256"
  "$ref" "$tmp/$name.gguf" "$out/$prompts" 2>/dev/null >"$out/arch-$name-llamacpp.jsonl"
  echo "arch-$name-llamacpp.jsonl: make-model --preset tiny $flags --seed 7, $prompts"
done <<'LIST'
qwen2 arch-prompts.txt --arch qwen2
qwen3 arch-prompts.txt --arch qwen3
llama3_rope_freqs arch-prompts.txt --rope-scaling llama3:8:256
gemma2 arch-window-prompts.txt --arch gemma2
gemma3 arch-window-prompts.txt --arch gemma3
qwen35 arch-prompts.txt --arch qwen35
LIST
