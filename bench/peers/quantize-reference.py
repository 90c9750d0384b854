#!/usr/bin/python3
"""What llama-quantize writes for each type tandem writes: digests of every output tensor's bytes.

Runs the npm build's llama-quantize (bench/peers/build-llama-cpp.sh) on mid-f32.gguf and
trained-f32.gguf of ../shared/data/quant/ for each type, and records per output file its SHA-256
and per tensor its type and the SHA-256 of its bytes. tests/model/quant_reference_test.cpp
quantizes the same inputs with tandem (model/quantize.h) and compares.

  PYTHONPATH=$LLAMA_CPP/gguf-py /usr/bin/python3 bench/peers/quantize-reference.py \
      --llama-quantize $LLAMA_CPP/build/bin/llama-quantize [--data ../shared/data/quant] \
      [--out tests/data/quant/quantize-llama-cpp.txt] [--keep DIR]
"""
import argparse
import hashlib
import os
import subprocess
import sys
import tempfile

from gguf import GGUFReader

TYPES = ["F16", "BF16", "Q8_0", "Q4_0", "Q4_1", "Q5_0", "Q5_1", "Q4_K_M", "Q4_K_S", "Q5_K_M", "Q5_K_S", "Q6_K"]
INPUTS = ["mid-f32.gguf", "trained-f32.gguf"]


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser()
    parser.add_argument("--llama-quantize", required=True)
    parser.add_argument("--data", default=os.path.join(repo, "..", "shared", "data", "quant"))
    parser.add_argument("--out", default=os.path.join(repo, "tests", "data", "quant", "quantize-llama-cpp.txt"))
    parser.add_argument("--keep", help="a folder to keep llama-quantize's files in (default: a temporary one)")
    args = parser.parse_args()
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(args.llama_quantize))))
    commit = subprocess.check_output(["git", "-C", tree, "rev-parse", "HEAD"], text=True).strip()
    lines = [
        f"# llama-quantize of llama.cpp {commit} (node-llama-cpp 3.22.1's bundle, built by",
        "# bench/peers/build-llama-cpp.sh), no importance matrix, on ../shared/data/quant/{mid,trained}-f32.gguf;",
        "# 2 threads; made by PYTHONPATH=LLAMA_CPP/gguf-py /usr/bin/python3 bench/peers/quantize-reference.py",
        "#   --llama-quantize LLAMA_CPP/build/bin/llama-quantize. Lines: 'file SOURCE TYPE sha256' for the whole output,",
        "# then 'tensor SOURCE TYPE name ggml_type sha256' per tensor (its bytes, no padding), in file order.",
    ]
    out_dir = args.keep or tempfile.mkdtemp(prefix="tandem-quant-ref-")
    os.makedirs(out_dir, exist_ok=True)
    for source in INPUTS:
        for qtype in TYPES:
            out = os.path.join(out_dir, source.replace("-f32.gguf", f"-{qtype}.gguf"))
            subprocess.run([args.llama_quantize, os.path.join(args.data, source), out, qtype, "2"], check=True,
                           stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
            lines.append(f"file {source} {qtype} {sha256_file(out)}")
            reader = GGUFReader(out)
            for t in reader.tensors:
                raw = bytes(reader.data[t.data_offset:t.data_offset + t.n_bytes])
                lines.append(f"tensor {source} {qtype} {t.name} {t.tensor_type.name} {hashlib.sha256(raw).hexdigest()}")
            if not args.keep:
                os.remove(out)
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"quantize-reference: {len(INPUTS) * len(TYPES)} files -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
