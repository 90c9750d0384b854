#!/usr/bin/python3
"""tandem's tokenizers against llama.cpp's llama-tokenize: equal ids on random Unicode, and speed.

  bench/peers/tokenize-vs-llama.py [--strings N] [--seed S] [--vocabs a,b,...] [--speed-only|--diff-only]

Needs the native llama.cpp build (bench/peers/build-llama-cpp.sh: llama-tokenize) and the
llama.cpp tree's vocabulary-only GGUFs (tests/data/fetch-llama-tree.sh, the ctest fixture
llama_tree puts them in build/release/llama-tree). No CI test runs this: it needs llama.cpp.

Differential: N strings per vocabulary from a seeded generator: runs of Latin, accented Latin,
Greek, Cyrillic, Arabic, Hebrew, Devanagari, Thai, CJK, Hangul, Hiragana, emoji (with ZWJ
sequences and skin tones), digits, punctuation, apostrophe contractions, whitespace runs
(spaces, tabs, newlines, CR, NBSP, U+3000); valid UTF-8 only. Each string is tokenized by
`tandem tokenize --file F --no-bos --json` and `llama-tokenize -f F --ids --no-bos
--no-parse-special --no-escape --log-disable` (neither adds BOS, reads special tokens from the
text or, as llama-tokenize does by default, turns "\\n" and "\\'" into the characters);
the script prints how many give equal ids, and the first differences.

Speed: 1 MiB of English (Debian's /usr/share/common-licenses/* then /usr/share/doc/*/copyright,
as tokenizer_reference_test's SpeedOnEnglish) and its first 128 KiB, through each tool, best of
3 runs in the child's CPU time (user + system, from wait4), minus the same tool on a 1-byte file
(loading the vocabulary): MB/s of tokenization alone. CPU time, because the machine is shared.
"""
import argparse
import concurrent.futures
import glob
import json
import os
import random
import resource
import subprocess
import sys
import tempfile

ROOT = os.environ.get("TANDEM_ROOT") or os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
TANDEM = os.path.join(ROOT, "build/release/cli/tandem")
LLAMA_TOKENIZE = os.path.expanduser(os.environ.get(
    "LLAMA_TOKENIZE", "~/.cache/tandem/llama-cpp/llama.cpp/build/bin/llama-tokenize"))
VOCAB_DIR = os.environ.get("VOCAB_DIR", os.path.join(ROOT, "build/release/llama-tree/llama.cpp/models"))
VOCABS = ["llama-spm", "llama-bpe", "qwen2", "gpt-2", "deepseek-llm", "deepseek-coder", "phi-3", "starcoder",
          "falcon", "command-r", "mpt", "refact", "qwen35"]

SCRIPTS = [
    (0x41, 0x5A), (0x61, 0x7A), (0x61, 0x7A), (0xC0, 0x17F), (0x391, 0x3C9), (0x410, 0x44F), (0x600, 0x64A),
    (0x5D0, 0x5EA), (0x905, 0x939), (0xE01, 0xE30), (0x4E00, 0x4FFF), (0xAC00, 0xAD00), (0x3041, 0x3096),
]
EMOJI = ["\U0001F600", "\U0001F44D\U0001F3FD", "\U0001F468\u200D\U0001F469\u200D\U0001F467", "\u2764\uFE0F",
         "\U0001F1EB\U0001F1F7", "\U0001F680", "\U0001F923"]
SPACES = [" ", "  ", "\t", "\n", "\n\n", "\r\n", "\u00A0", "\u3000", "   \n ", " \t "]
PUNCT = list(".,;:!?-()[]{}\"'/\\@#$%^&*+=<>|~`_") + ["...", "--", "\u2014", "\u00AB", "\u201C", "\u2019"]
CONTRACTIONS = ["'s", "'t", "'re", "'ve", "'m", "'ll", "'d", "'S", "'LL"]


def random_string(rng):
    parts = []
    for _ in range(rng.randint(1, 24)):
        kind = rng.random()
        if kind < 0.45:
            lo, hi = rng.choice(SCRIPTS)
            parts.append("".join(chr(rng.randint(lo, hi)) for _ in range(rng.randint(1, 9))))
        elif kind < 0.55:
            parts.append("".join(rng.choice("0123456789") for _ in range(rng.randint(1, 7))))
        elif kind < 0.75:
            parts.append(rng.choice(SPACES))
        elif kind < 0.85:
            parts.append(rng.choice(PUNCT))
        elif kind < 0.92:
            parts.append(rng.choice(EMOJI))
        else:
            parts.append(rng.choice(CONTRACTIONS))
    return "".join(parts)


def run_timed(cmd):
    """(stdout, CPU seconds of the child)."""
    p = subprocess.Popen(cmd, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL)
    out = p.stdout.read()
    _, status, usage = os.wait4(p.pid, 0)
    p.returncode = os.waitstatus_to_exitcode(status)
    if p.returncode != 0:
        raise RuntimeError(f"{cmd[0]} exited {p.returncode}")
    return out, usage.ru_utime + usage.ru_stime


def tandem_cmd(vocab, path):
    return [TANDEM, "tokenize", "--model", vocab, "--file", path, "--no-bos", "--json"]


def llama_cmd(vocab, path):
    return [LLAMA_TOKENIZE, "-m", vocab, "-f", path, "--ids", "--no-bos", "--no-parse-special", "--no-escape",
            "--log-disable"]


def ids_of(cmd):
    out = subprocess.run(cmd, capture_output=True, check=True).stdout.decode()
    if cmd[0] == TANDEM:
        return json.loads(out)["ids"]
    return json.loads(out.strip().splitlines()[-1])


def compare(vocab_path, text, tmp):
    with open(tmp, "w", encoding="utf-8", newline="") as f:
        f.write(text)
    try:
        return ids_of(tandem_cmd(vocab_path, tmp)), ids_of(llama_cmd(vocab_path, tmp))
    finally:
        os.remove(tmp)


def differential(vocab, n, seed, work):
    path = os.path.join(VOCAB_DIR, f"ggml-vocab-{vocab}.gguf")
    rng = random.Random(f"{seed}:{vocab}")
    texts = [random_string(rng) for _ in range(n)]
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        results = list(pool.map(lambda it: compare(path, it[1], os.path.join(work, f"{vocab}-{it[0]}.txt")),
                                enumerate(texts)))
    diffs = [(t, a, b) for t, (a, b) in zip(texts, results) if a != b]
    print(f"{vocab:15s} {n - len(diffs):5d} equal, {len(diffs):4d} different of {n}", flush=True)
    for t, a, b in diffs[:3]:
        print(f"    {t!r}\n      tandem {a}\n      llama  {b}")
    return n - len(diffs), len(diffs)


def english(limit):
    files = sorted(f for f in glob.glob("/usr/share/common-licenses/*") if os.path.isfile(f) and not os.path.islink(f))
    files += sorted(glob.glob("/usr/share/doc/*/copyright"))
    text = b""
    for f in files:
        b = open(f, "rb").read()
        try:
            b.decode("utf-8")
        except UnicodeDecodeError:
            continue
        text += b
        if len(text) >= limit:
            break
    text = (text * (1 + limit // max(1, len(text))))[:limit]
    return text.decode("utf-8", "ignore").encode()  # a character cut at the end is dropped


def speed(vocab, work):
    path = os.path.join(VOCAB_DIR, f"ggml-vocab-{vocab}.gguf")
    files = {}
    for name, size in (("1MiB", 1 << 20), ("128KiB", 128 << 10), ("1B", 1)):
        files[name] = os.path.join(work, f"english-{name}.txt")
        with open(files[name], "wb") as f:
            f.write(english(size) if size > 1 else b"a")
    row = {}
    for tool, cmd in (("tandem", tandem_cmd), ("llama-tokenize", llama_cmd)):
        best = {k: min(run_timed(cmd(path, p))[1] for _ in range(3)) for k, p in files.items()}
        tokens = len(ids_of(cmd(path, files["1MiB"])))
        mb = (1 << 20) / 1e6 / max(1e-9, best["1MiB"] - best["1B"])
        ms128 = 1e3 * (best["128KiB"] - best["1B"])
        row[tool] = (mb, ms128, tokens)
        print(f"{vocab:12s} {tool:15s} 1 MiB -> {tokens} tokens: {mb:6.1f} MB/s (CPU); 128 KiB: {ms128:6.1f} ms "
              f"(CPU); load {1e3 * best['1B']:.0f} ms", flush=True)
    return row


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--strings", type=int, default=200)
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--vocabs", default=",".join(VOCABS))
    ap.add_argument("--speed-vocabs", default="llama-bpe,llama-spm")
    ap.add_argument("--speed-only", action="store_true")
    ap.add_argument("--diff-only", action="store_true")
    args = ap.parse_args()
    for tool in (TANDEM, LLAMA_TOKENIZE):
        if not os.access(tool, os.X_OK):
            sys.exit(f"tokenize-vs-llama: {tool} not found (build tandem; bench/peers/build-llama-cpp.sh)")
    print(f"llama-tokenize: {LLAMA_TOKENIZE}\nvocabularies: {VOCAB_DIR}")
    with tempfile.TemporaryDirectory() as work:
        if not args.speed_only:
            total = [0, 0]
            for v in args.vocabs.split(","):
                eq, diff = differential(v, args.strings, args.seed, work)
                total[0] += eq
                total[1] += diff
            print(f"all: {total[0]} equal, {total[1]} different")
        if not args.diff_only:
            for v in args.speed_vocabs.split(","):
                speed(v, work)


if __name__ == "__main__":
    main()
