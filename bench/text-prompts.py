#!/usr/bin/env python3
"""The benches' text prompts: 32 windows of 200 bytes of tests/data/heldout.txt (newlines as
spaces), one JSON line each ({"prompt": ...}), for `tandem bench --dataset`. The trained models'
output on them repeats (speculation accepts drafts).

    bench/text-prompts.py > text.jsonl
"""
import json
import os

here = os.path.dirname(os.path.abspath(__file__))
with open(os.path.join(here, "..", "tests", "data", "heldout.txt")) as f:
    text = f.read().replace("\n", " ")
for i in range(32):
    print(json.dumps({"prompt": text[i * 700:i * 700 + 200]}))
