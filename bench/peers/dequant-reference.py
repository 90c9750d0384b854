#!/usr/bin/python3
"""Digests of gguf-py's dequantization of every tensor of every GGUF file in a folder.

For each tensor: SHA-256 of gguf-py's float32 output (gguf.quants.dequantize), row-major,
little-endian, as bytes. tests/model/quant_reference_test.cpp dequantizes the same tensors with
tandem (model/quant.h) and compares digests.

  PYTHONPATH=$LLAMA_CPP/gguf-py /usr/bin/python3 bench/peers/dequant-reference.py \
      [--data ../shared/data/quant] [--out tests/data/quant/dequant-gguf-py.txt]

$LLAMA_CPP: a llama.cpp tree, e.g. the one bench/peers/build-llama-cpp.sh clones (its commit
is written into the output). Needs numpy (Debian's python3-numpy).
"""
import argparse
import hashlib
import os
import subprocess
import sys

import numpy as np
from gguf import GGUFReader
from gguf.quants import dequantize


def llama_cpp_commit():
    import gguf
    tree = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(gguf.__file__))))
    try:
        return subprocess.check_output(["git", "-C", tree, "rev-parse", "HEAD"], text=True).strip()
    except (OSError, subprocess.CalledProcessError):
        return "unknown"


def main():
    repo = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
    parser = argparse.ArgumentParser()
    parser.add_argument("--data", default=os.path.join(repo, "..", "shared", "data", "quant"))
    parser.add_argument("--out", default=os.path.join(repo, "tests", "data", "quant", "dequant-gguf-py.txt"))
    args = parser.parse_args()
    lines = [
        "# SHA-256 of gguf-py's float32 dequantization (gguf.quants.dequantize) of every tensor",
        f"# of every file in ../shared/data/quant/, from llama.cpp {llama_cpp_commit()}'s gguf-py",
        "# (node-llama-cpp 3.22.1's bundle), numpy " + np.__version__ + ", made by",
        "#   PYTHONPATH=LLAMA_CPP/gguf-py /usr/bin/python3 bench/peers/dequant-reference.py",
        "# file tensor type elements sha256",
    ]
    for name in sorted(os.listdir(args.data)):
        if not name.endswith(".gguf"):
            continue
        reader = GGUFReader(os.path.join(args.data, name))
        for t in reader.tensors:
            values = np.ascontiguousarray(dequantize(t.data, t.tensor_type), dtype="<f4")
            assert values.size == int(t.n_elements), (name, t.name)
            digest = hashlib.sha256(values.tobytes()).hexdigest()
            lines.append(f"{name} {t.name} {t.tensor_type.name} {t.n_elements} {digest}")
    with open(args.out, "w") as f:
        f.write("\n".join(lines) + "\n")
    print(f"dequant-reference: {len(lines) - 5} tensors -> {args.out}", file=sys.stderr)


if __name__ == "__main__":
    main()
