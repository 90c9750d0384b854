#!/usr/bin/python3
"""Train a small Llama-architecture model on a real vocabulary (Llama 2's SentencePiece, 32000).

scripts/main.sh and the README's first example run it so the main job prints English, and
tests/cli/trained_model_test.cpp checks that >= 90 % of the words it generates are in Debian's
wamerican list. The vocabulary is used as is (no pruning): its tokenizer.ggml.* keys are
copied byte for byte from the vocabulary-only GGUF given with --vocab (llama.cpp's
models/ggml-vocab-llama-spm.gguf from the llama_tree fixture, the same keys
`tandem make-model --vocab-from` copies).

Run with Debian's Python (apt-get install python3-torch python3-numpy), from the repository root:
  /usr/bin/python3 scripts/train-vocab.py --vocab build/release/llama-tree/llama.cpp/models/ggml-vocab-llama-spm.gguf \
      --out tests/data/vocab-trained.gguf
  /usr/bin/python3 scripts/train-vocab.py --check tests/data/vocab-trained.gguf
Deterministic on one machine: fixed seeds, one thread, sorted files.

Corpus (English prose Debian ships, ~0.94 MB): Vim's user manual /usr/share/vim/vim90/doc/usr_*.txt
(vim-runtime 2:9.0.1378-2+deb12u2) and the licence texts /usr/share/common-licenses/* (base-files 12.4+deb12u11),
each file once (symlinks skipped), sorted by name; each file's first 95 % trains, the rest is held out.
Tokens come from `tandem tokenize` on that vocabulary (no BOS); each training window is BOS + 127 tokens;
450 steps of 16 windows (default) took 21 min on one thread of a loaded 2-vCPU machine.

Shape: dim 64, 4 layers, 4 heads, 2 KV heads, FFN 256, context 512, tied embeddings (no
output.weight: 32000 x 64 F16 = 4 MB is most of the file). Weights F16 (norms F32), as the
engine runs F16 today; the forward pass is scripts/train-tiny.py's, which mirrors the engine.
"""
import argparse
import glob
import importlib.util
import json
import math
import os
import struct
import subprocess
import sys
import time

import numpy as np
import torch
import torch.nn.functional as F

_spec = importlib.util.spec_from_file_location("train_tiny", os.path.join(os.path.dirname(__file__), "train-tiny.py"))
tt = importlib.util.module_from_spec(_spec)
_spec.loader.exec_module(tt)

TANDEM = os.environ.get("TANDEM", tt.TANDEM)  # the tokenizer and engine used
CFG = tt.CFG  # forward() reads this dict: updated in place
CFG.update(vocab=32000, dim=64, n_layers=4, n_heads=4, n_kv_heads=2, ffn=256, ctx=512, rope_base=10000.0, eps=1e-5)
WINDOW = 128
CORPUS = ["/usr/share/vim/vim90/doc/usr_*.txt", "/usr/share/common-licenses/*"]


def tensor_names():
    return [n for n in tt.tensor_names() if n != "output.weight"]  # tied


def tensor_shape(name):
    d, f, kv = CFG["dim"], CFG["ffn"], CFG["dim"] // CFG["n_heads"] * CFG["n_kv_heads"]
    shapes = {"token_embd": [CFG["vocab"], d], "attn_q": [d, d], "attn_k": [kv, d], "attn_v": [kv, d],
              "attn_output": [d, d], "ffn_gate": [f, d], "ffn_up": [f, d], "ffn_down": [d, f]}
    key = name.split(".")[-2]
    return shapes.get(key, [d])  # [out][in]; norms are vectors


# ---------------------------------------------------------------- GGUF writing
def enc_kv(key, typ, payload):
    kb = key.encode()
    return struct.pack("<Q", len(kb)) + kb + struct.pack("<I", typ) + payload


def enc_str(s):
    b = s.encode()
    return struct.pack("<Q", len(b)) + b


def write_gguf(path, vocab, W, name):
    kvs = [enc_kv("general.architecture", 8, enc_str("llama")), enc_kv("general.name", 8, enc_str(name)),
           enc_kv("general.file_type", 4, struct.pack("<I", 1)), enc_kv("general.alignment", 4, struct.pack("<I", 32))]
    u32 = dict(context_length=CFG["ctx"], embedding_length=CFG["dim"], block_count=CFG["n_layers"],
               feed_forward_length=CFG["ffn"])
    u32["attention.head_count"], u32["attention.head_count_kv"] = CFG["n_heads"], CFG["n_kv_heads"]
    kvs += [enc_kv("llama." + k, 4, struct.pack("<I", v)) for k, v in u32.items()]
    kvs += [enc_kv("llama.rope.freq_base", 6, struct.pack("<f", CFG["rope_base"])),
            enc_kv("llama.attention.layer_norm_rms_epsilon", 6, struct.pack("<f", CFG["eps"])),
            enc_kv("llama.rope.dimension_count", 4, struct.pack("<I", CFG["dim"] // CFG["n_heads"])),
            enc_kv("llama.vocab_size", 4, struct.pack("<I", CFG["vocab"]))]
    kvs += [struct.pack("<Q", len(k.encode())) + k.encode() + raw for k, raw in vocab.kv_raw
            if k.startswith("tokenizer.")]
    infos, data = b"", b""
    for n in tensor_names():
        a = W[n].detach().numpy()
        blob = a.astype("<f2" if a.ndim == 2 else "<f4").tobytes()
        data += b"\0" * (-len(data) % 32)
        infos += enc_str(n) + struct.pack("<I", a.ndim) + b"".join(struct.pack("<Q", d) for d in a.shape[::-1])
        infos += struct.pack("<IQ", 1 if a.ndim == 2 else 0, len(data))
        data += blob
    head = b"GGUF" + struct.pack("<IQQ", 3, len(tensor_names()), len(kvs)) + b"".join(kvs) + infos
    head += b"\0" * (-len(head) % 32)
    with open(path + ".tmp", "wb") as f:
        f.write(head + data)
    os.replace(path + ".tmp", path)


def read_weights(path, dtype):
    g = tt.Gguf(path)
    W = {}
    for n in tensor_names():
        dims, typ, off = g.tensors[n]
        count = int(np.prod(dims))
        W[n] = torch.from_numpy(np.frombuffer(g.data, "<f2" if typ == 1 else "<f4", count, off)
                                .astype(np.float64).reshape(dims[::-1])).to(dtype)
    W["output.weight"] = W["token_embd.weight"]
    return W


# ---------------------------------------------------------------- corpus
def corpus_files():
    files = []
    for pattern in CORPUS:
        files += [f for f in sorted(glob.glob(pattern)) if not os.path.islink(f) and os.path.isfile(f)]
    assert len(files) > 40, f"expected Debian's vim-runtime and base-files texts: {CORPUS}"
    return files


def tokenize(vocab_path, text, tmp):
    with open(tmp, "wb") as f:
        f.write(text)
    out = subprocess.run([TANDEM, "tokenize", "--model", vocab_path, "--file", tmp, "--no-bos", "--json"],
                         check=True, capture_output=True, text=True).stdout
    return json.loads(out)["ids"]


def load_corpus(vocab_path, out):
    train, held, tmp = [], [], out + ".corpus.tmp"
    for f in corpus_files():
        b = open(f, "rb").read().decode("utf-8", "replace").encode()
        cut = len(b) * 95 // 100
        while cut < len(b) and (b[cut] & 0xC0) == 0x80:  # never cut a character
            cut += 1
        train += tokenize(vocab_path, b[:cut], tmp)
        held += tokenize(vocab_path, b[cut:], tmp)
    os.remove(tmp)
    return torch.tensor(train), torch.tensor(held)


def batch(stream, starts, T):
    seq = torch.stack([stream[s:s + T] for s in starts])
    x = torch.cat([torch.full((len(starts), 1), 1, dtype=torch.long), seq[:, :-1]], 1)  # BOS = 1
    return x, seq


def evaluate(W, held, T):
    total, n = 0.0, 0
    with torch.no_grad():
        starts = list(range(0, len(held) - T, T))
        for i in range(0, len(starts), 32):
            x, y = batch(held, starts[i:i + 32], T)
            total += F.cross_entropy(tt.forward(W, x).flatten(0, 1), y.flatten(), reduction="sum").item()
            n += y.numel()
    return total / n


def train(args):
    torch.manual_seed(args.seed)
    gen = torch.Generator().manual_seed(args.seed)
    vocab = tt.Gguf(args.vocab)
    assert len(vocab.kv["tokenizer.ggml.tokens"]) == CFG["vocab"], "expected a 32000-token vocabulary"
    tr, held = load_corpus(args.vocab, args.out)
    print(f"corpus: {len(corpus_files())} files, {len(tr)} train / {len(held)} held-out tokens", flush=True)
    W = {}
    for n in tensor_names():
        shape = tensor_shape(n)
        if n.endswith("norm.weight"):
            W[n] = torch.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * CFG["n_layers"]) if ("attn_output" in n or "ffn_down" in n) else 0.02
            W[n] = torch.randn(shape, generator=gen) * std
        W[n].requires_grad_(True)
    params = list(W.values())
    W["output.weight"] = W["token_embd.weight"]
    opt = torch.optim.AdamW([{"params": [w for w in params if w.dim() == 2], "weight_decay": 0.1},
                             {"params": [w for w in params if w.dim() == 1], "weight_decay": 0.0}],
                            lr=args.lr, betas=(0.9, 0.95))
    t0 = time.time()
    for step in range(args.steps):
        warm = min(1.0, (step + 1) / 50)
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        starts = torch.randint(0, len(tr) - WINDOW, (args.batch,), generator=gen).tolist()
        x, y = batch(tr, starts, WINDOW)
        loss = F.cross_entropy(tt.forward(W, x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(params, 1.0)
        opt.step()
        if step % 25 == 0:
            print(f"step {step:5d}  {time.time() - t0:6.0f}s  train {loss.item():.4f} nats/token", flush=True)
    print(f"training took {time.time() - t0:.0f}s; held-out loss {evaluate(W, held, WINDOW):.4f} nats/token")
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    write_gguf(args.out, vocab, W, "tandem-vocab-trained")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


def check(path):
    """Greedy tokens and logprobs of `tandem run` vs this forward pass (F16 weights in double)."""
    W = read_weights(path, torch.float64)
    ok = True
    for text in ["The quick brown fox", "To delete a line in Normal mode, type", "This program is free software"]:
        cmd = [TANDEM, "run", "--model", path, "--prompt", text, "--max-tokens", "16", "--json", "--threads", "1",
               "--ignore-eos"]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        prompt = tokenize(path, text.encode(), path + ".check.tmp")
        os.remove(path + ".check.tmp")
        toks, lps = out["tokens"], out["logprobs"]
        with torch.no_grad():
            logp = torch.log_softmax(tt.forward(W, torch.tensor([[1] + prompt + toks[:-1]]))[0], -1)[len(prompt):]
        same = logp.argmax(-1).tolist() == toks
        diff = max(abs(logp[i, t].item() - lps[i]) for i, t in enumerate(toks))
        ok &= same and diff < 1e-3
        print(f"{text!r} -> {out.get('text', '')!r}\n  greedy match: {same}, max |logprob diff| {diff:.2e}")
    print(f"check {'PASSED' if ok else 'FAILED'} for {path}")
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="GGUF", help="compare this file's forward pass with `tandem run`")
    ap.add_argument("--vocab", help="vocabulary-only GGUF of 32000 tokens (ggml-vocab-llama-spm.gguf)")
    ap.add_argument("--out", default="tests/data/vocab-trained.gguf")
    ap.add_argument("--steps", type=int, default=450)
    ap.add_argument("--batch", type=int, default=16, help="windows of 128 tokens per step")
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)
    if args.check:
        sys.exit(0 if check(args.check) else 1)
    train(args)
    sys.exit(0 if check(args.out) else 1)


if __name__ == "__main__":
    main()
