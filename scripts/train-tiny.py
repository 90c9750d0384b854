#!/usr/bin/python3
"""Train a small real language model with the exact shape of tandem's "tiny" preset.

The tiny preset's random weights give near-flat logits, so accuracy tests (e.g. 8-bit KV
vs F32 KV greedy agreement) are dominated by argmax ties. This script trains the same
architecture on English text and writes it into a copy of the preset's GGUF, keeping
every metadata key (only general.name changes) and the tensor table byte for byte.

Run with Debian's Python (apt-get install python3-torch python3-numpy), not a pyenv one:
  build/release/cli/tandem make-model --preset tiny --seed 1 --out /tmp/t.gguf
  /usr/bin/python3 scripts/train-tiny.py --template /tmp/t.gguf --out tests/data/tiny-trained.gguf
  /usr/bin/python3 scripts/train-tiny.py --check /tmp/t.gguf                  # random template
  /usr/bin/python3 scripts/train-tiny.py --check tests/data/tiny-trained.gguf  # trained file
Run from the repository root (the check calls build/release/cli/tandem); training ends
with the check of the file it wrote. Deterministic: fixed seeds, one thread, sorted files.

Corpus: every /usr/share/vim/vim90/doc/*.txt (sorted by name) from Debian bookworm's
vim-runtime 2:9.0.1378-2+deb12u2: ~9.5 MB of English help text (the user manual usr_*.txt
is tutorial prose). Each file's first 95% goes to training, its last 5% is held out.

Tokens: tandem's vocabulary (workers/engine/make_model.cpp, runtime/model/tokenizer.cpp)
is byte-level with no merges: <unk>=0, <s>=1 (BOS), </s>=2, byte b = token b+3, and
259..511 are <unusedN> fillers that text never produces. Every training window is BOS
followed by 127 or 511 bytes from a random offset, like `tandem run --prompt` (which
prepends BOS) on a text prompt. EOS is never trained, so greedy text rarely ends.

The forward pass mirrors workers/engine/engine.cpp exactly:
  * GGUF matrices have dims {in, out}, stored row-major as [out][in] = torch Linear weight;
    token_embd.weight and output.weight (untied) are both [vocab][dim].
  * RMSNorm: x / sqrt(mean(x^2) + eps) * w.
  * RoPE on q and k rotates ADJACENT pairs (2i, 2i+1) by pos * base^(-2i/head_dim).
  * GQA: query head j reads KV head j // (n_heads / n_kv_heads); scores scaled by
    1/sqrt(head_dim), causal softmax.
  * FFN: ffn_down(silu(ffn_gate(x)) * ffn_up(x)); pre-norm residual blocks; output_norm
    then output.weight.
"""
import argparse
import glob
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

BOS, BYTE0 = 1, 3  # token ids: <s> and byte 0x00
CORPUS_GLOB = "/usr/share/vim/vim90/doc/*.txt"
TANDEM = "build/release/cli/tandem"
CFG = dict(vocab=512, dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn=192, ctx=512,
           rope_base=10000.0, eps=1e-5)  # preset_config("tiny")

# ---------------------------------------------------------------- GGUF (as runtime/model/gguf.cpp)
# Scalar value types: id -> struct format. 8 = string, 9 = array.
SCALAR = {0: "B", 1: "b", 2: "H", 3: "h", 4: "I", 5: "i", 6: "f", 7: "?", 10: "Q", 11: "q", 12: "d"}


class Gguf:
    """Parses a GGUF v3 file into raw pieces so it can be re-emitted with new tensor data."""

    def __init__(self, path):
        self.buf = open(path, "rb").read()
        self.pos = 0
        magic, version, n_tensors, n_kv = struct.unpack_from("<4sIQQ", self.buf, 0)
        assert magic == b"GGUF" and version == 3, (magic, version)
        self.pos = 24
        self.kv = {}      # key -> parsed value
        self.kv_raw = []  # (key, raw bytes of type + value), in file order
        for _ in range(n_kv):
            key = self._str()
            start = self.pos
            self.kv[key] = self._value(self._u("I"))
            self.kv_raw.append((key, self.buf[start:self.pos]))
        self.tensors = {}  # name -> (dims, ggml type, offset in data section)
        tinfo_start = self.pos
        for _ in range(n_tensors):
            name = self._str()
            dims = [self._u("Q") for _ in range(self._u("I"))]
            self.tensors[name] = (dims, self._u("I"), self._u("Q"))
        self.tensor_infos = self.buf[tinfo_start:self.pos]
        self.align = self.kv.get("general.alignment", 32)
        self.data_start = -(-self.pos // self.align) * self.align
        self.data = bytearray(self.buf[self.data_start:])

    def _u(self, fmt):
        (v,) = struct.unpack_from("<" + fmt, self.buf, self.pos)
        self.pos += struct.calcsize(fmt)
        return v

    def _str(self):
        n = self._u("Q")
        s = self.buf[self.pos:self.pos + n].decode("utf-8")
        self.pos += n
        return s

    def _value(self, t):
        if t == 8:
            return self._str()
        if t == 9:
            et, n = self._u("I"), self._u("Q")
            return [self._value(et) for _ in range(n)]
        return self._u(SCALAR[t])

    def tensor(self, name):
        """Tensor as a numpy array of shape reversed(dims), i.e. [out][in] for matrices."""
        dims, typ, off = self.tensors[name]
        assert typ == 0, f"{name}: only F32 templates are supported (make-model without --f16)"
        n = int(np.prod(dims))
        return np.frombuffer(self.data, "<f4", n, off).reshape(dims[::-1]).copy()

    def set_tensor(self, name, arr):
        dims, typ, off = self.tensors[name]
        a = np.ascontiguousarray(arr, dtype="<f4")
        assert typ == 0 and list(a.shape) == dims[::-1], (name, a.shape, dims)
        self.data[off:off + a.nbytes] = a.tobytes()

    def write(self, path, name=None):
        # Same header with general.name's value swapped; tensor offsets are relative to
        # the (re-aligned) data section, so they stay valid when the header length changes.
        kvs = b""
        for key, raw in self.kv_raw:
            if key == "general.name" and name is not None:
                nb = name.encode()
                raw = struct.pack("<IQ", 8, len(nb)) + nb
            kvs += struct.pack("<Q", len(key.encode())) + key.encode() + raw
        head = self.buf[:24] + kvs + self.tensor_infos
        head += b"\0" * (-len(head) % self.align)
        with open(path + ".tmp", "wb") as f:
            f.write(head + bytes(self.data))
        os.replace(path + ".tmp", path)


# ---------------------------------------------------------------- the model (as engine.cpp)
def tensor_names():
    names = ["token_embd.weight"]
    for l in range(CFG["n_layers"]):
        names += [f"blk.{l}.{w}.weight" for w in ("attn_norm", "attn_q", "attn_k", "attn_v",
                                                  "attn_output", "ffn_norm", "ffn_gate", "ffn_up", "ffn_down")]
    return names + ["output_norm.weight", "output.weight"]


def rms_norm(x, w):
    return x * torch.rsqrt(x.pow(2).mean(-1, keepdim=True) + CFG["eps"]) * w


def rope(x, cos, sin):
    # x: [B, T, heads, hd]; rotate adjacent pairs (x[2i], x[2i+1]) by angle pos * theta_i.
    x0, x1 = x[..., 0::2], x[..., 1::2]
    return torch.stack((x0 * cos - x1 * sin, x0 * sin + x1 * cos), dim=-1).flatten(-2)


def rope_tables(T, dtype):
    hd = CFG["dim"] // CFG["n_heads"]
    inv = CFG["rope_base"] ** (-2.0 * torch.arange(hd // 2, dtype=torch.float64) / hd)
    ang = torch.arange(T, dtype=torch.float64)[:, None] * inv[None, :]  # [T, hd/2], in double as the engine
    return ang.cos().to(dtype)[:, None, :], ang.sin().to(dtype)[:, None, :]


def forward(W, tokens):
    """W: name -> tensor in GGUF layout; tokens: LongTensor [B, T]. Returns logits [B, T, vocab]."""
    B, T = tokens.shape
    nh, nkv, dim = CFG["n_heads"], CFG["n_kv_heads"], CFG["dim"]
    hd = dim // nh
    cos, sin = rope_tables(T, W["output.weight"].dtype)
    mask = torch.full((T, T), float("-inf"), dtype=cos.dtype).triu(1)
    x = W["token_embd.weight"][tokens]
    for l in range(CFG["n_layers"]):
        p = lambda w: W[f"blk.{l}.{w}.weight"]
        h = rms_norm(x, p("attn_norm"))
        q = rope((h @ p("attn_q").T).view(B, T, nh, hd), cos, sin).transpose(1, 2)
        k = rope((h @ p("attn_k").T).view(B, T, nkv, hd), cos, sin).transpose(1, 2)
        v = (h @ p("attn_v").T).view(B, T, nkv, hd).transpose(1, 2)
        k = k.repeat_interleave(nh // nkv, dim=1)  # query head j -> KV head j // group
        v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, dim) @ p("attn_output").T
        h = rms_norm(x, p("ffn_norm"))
        x = x + (F.silu(h @ p("ffn_gate").T) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    return rms_norm(x, W["output_norm.weight"]) @ W["output.weight"].T


def check_config(g):
    """The file must have exactly the tiny preset's hyper-parameters and tensor set."""
    kv = g.kv
    got = dict(vocab=kv["llama.vocab_size"], dim=kv["llama.embedding_length"], n_layers=kv["llama.block_count"],
               n_heads=kv["llama.attention.head_count"], n_kv_heads=kv["llama.attention.head_count_kv"],
               ffn=kv["llama.feed_forward_length"], ctx=kv["llama.context_length"],
               rope_base=kv["llama.rope.freq_base"], eps=kv["llama.attention.layer_norm_rms_epsilon"])
    assert all(abs(got[k] - CFG[k]) <= 1e-6 * abs(CFG[k]) for k in CFG), f"not the tiny preset: {got}"
    assert sorted(g.tensors) == sorted(tensor_names()), sorted(g.tensors)


def load_weights(path, dtype):
    g = Gguf(path)
    check_config(g)
    return {n: torch.from_numpy(g.tensor(n)).to(dtype) for n in tensor_names()}


# ---------------------------------------------------------------- check against the engine
def check(path):
    """Greedy tokens and logprobs of `tandem run` vs this forward pass, for 3 prompts."""
    W = load_weights(path, torch.float64)  # reference in double; the engine is float32
    enc = lambda s: [BOS] + [b + BYTE0 for b in s.encode()]
    prompts = [enc("The quick brown fox jumps over the lazy dog."),
               enc("To delete a line in Normal mode, type"),
               [BOS, 5, 77, 300, 411, 2, 130, 131, 259]]  # arbitrary ids incl. unused/EOS ones
    worst, ok = 0.0, True
    for prompt in prompts:
        cmd = [TANDEM, "run", "--model", path, "--tokens", ",".join(map(str, prompt)),
               "--max-tokens", "16", "--json", "--threads", "1", "--ignore-eos"]
        out = json.loads(subprocess.run(cmd, check=True, capture_output=True, text=True).stdout)
        toks, lps = out["tokens"], out["logprobs"]
        # Teacher-forced on the engine's tokens: if every argmax equals the engine's token,
        # free-running greedy decoding here produces exactly the same sequence.
        with torch.no_grad():
            logp = torch.log_softmax(forward(W, torch.tensor([prompt + toks[:-1]]))[0], -1)
        logp = logp[len(prompt) - 1:]
        mine = logp.argmax(-1).tolist()
        diff = max(abs(logp[i, t].item() - lps[i]) for i, t in enumerate(toks))
        worst = max(worst, diff)
        same = mine == toks
        ok &= same and diff < 1e-3
        # Greedy picks the top-1 token, so exp(logprob) is the top-1 probability.
        text = bytes(t - BYTE0 for t in toks if BYTE0 <= t < BYTE0 + 256).decode("utf-8", "replace")
        print(f"prompt {prompt[:8]}... engine tokens {toks}\n  text {text!r}, mean top-1 prob "
              f"{np.mean(np.exp(lps)):.3f}\n  greedy match: {same}, max |logprob diff| = {diff:.2e}")
    print(f"check {'PASSED' if ok else 'FAILED'} for {path}: max |logprob diff| {worst:.2e}")
    return ok


# ---------------------------------------------------------------- corpus and training
def load_corpus():
    files = sorted(glob.glob(CORPUS_GLOB))
    assert len(files) > 100, f"expected Debian's vim-runtime docs under {CORPUS_GLOB}"
    train, held = [], []
    for f in files:
        b = open(f, "rb").read()
        cut = len(b) * 95 // 100
        train.append(b[:cut])
        held.append(b[cut:])
    to_ids = lambda parts: torch.from_numpy(np.frombuffer(b"".join(parts), np.uint8).astype(np.int64) + BYTE0)
    return files, to_ids(train), to_ids(held)


def batch(stream, starts, T):
    # BOS + T-1 bytes as input; targets are the next T bytes (BOS is never a target).
    seq = torch.stack([stream[s:s + T] for s in starts])
    x = torch.cat([torch.full((len(starts), 1), BOS, dtype=torch.long), seq[:, :-1]], 1)
    return x, seq


def evaluate(W, held, T, max_windows=None):
    starts = list(range(0, len(held) - T, T))
    if max_windows:  # evenly spread over all held-out files
        starts = starts[::-(-len(starts) // max_windows)]
    total, n = 0.0, 0
    with torch.no_grad():
        for i in range(0, len(starts), 32):
            x, y = batch(held, starts[i:i + 32], T)
            total += F.cross_entropy(forward(W, x).flatten(0, 1), y.flatten(), reduction="sum").item()
            n += y.numel()
    return total / n


def train(args):
    torch.manual_seed(args.seed)
    files, tr, held = load_corpus()
    print(f"corpus: {len(files)} files ({files[0]} .. {files[-1]}), "
          f"{len(tr)} train / {len(held)} held-out bytes")
    gen = torch.Generator().manual_seed(args.seed)
    if not os.path.exists(args.template):  # the preset's own file gives all metadata
        subprocess.run([TANDEM, "make-model", "--preset", "tiny", "--seed", "1", "--out", args.template], check=True)
    g = Gguf(args.template)
    check_config(g)
    L = CFG["n_layers"]
    W = {}
    for n in tensor_names():  # GPT-2 style init: std 0.02, residual outputs scaled down
        shape = g.tensors[n][0][::-1]
        if n.endswith("norm.weight"):
            W[n] = torch.ones(shape)
        else:
            std = 0.02 / math.sqrt(2 * L) if ("attn_output" in n or "ffn_down" in n) else 0.02
            W[n] = torch.randn(shape, generator=gen) * std
        W[n].requires_grad_(True)
    decay = [w for n, w in W.items() if w.dim() == 2]
    no_decay = [w for n, w in W.items() if w.dim() == 1]
    opt = torch.optim.AdamW([{"params": decay, "weight_decay": 0.1},
                             {"params": no_decay, "weight_decay": 0.0}], lr=args.lr, betas=(0.9, 0.95))
    T, t0 = CFG["ctx"], time.time()
    for step in range(args.steps + 1):
        if step % args.eval_every == 0 or step == args.steps:
            # Quick estimate on 64 of the held-out windows during training.
            print(f"step {step:5d}  {time.time() - t0:6.0f}s  held-out {evaluate(W, held, T, 64):.4f} nats/token",
                  flush=True)
        if step == args.steps:
            break
        warm = min(1.0, (step + 1) / 200)  # linear warm-up, then cosine decay to 10%
        lr = args.lr * warm * (0.1 + 0.9 * 0.5 * (1 + math.cos(math.pi * step / args.steps)))
        for group in opt.param_groups:
            group["lr"] = lr
        # Every 4th step trains on full 512-token windows so that every RoPE position of
        # the context is learned; the others use 128-token windows, ~5x cheaper per token
        # (attention is quadratic). Both carry 4096 target tokens.
        t = T if step % 4 == 3 else T // 4
        starts = torch.randint(0, len(tr) - t, (4096 // t,), generator=gen).tolist()
        x, y = batch(tr, starts, t)
        loss = F.cross_entropy(forward(W, x).flatten(0, 1), y.flatten())
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(list(W.values()), 1.0)
        opt.step()
        if step % 100 == 0:
            print(f"step {step:5d}  {time.time() - t0:6.0f}s  train {loss.item():.4f}", flush=True)
    print(f"training took {time.time() - t0:.0f}s")
    print(f"final held-out loss (all {len(held) // T} windows): {evaluate(W, held, T):.4f} nats/token")
    for n, w in W.items():
        g.set_tensor(n, w.detach().numpy())
    os.makedirs(os.path.dirname(args.out) or ".", exist_ok=True)
    g.write(args.out, name="tandem-tiny-trained")
    print(f"wrote {args.out} ({os.path.getsize(args.out)} bytes)")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--check", metavar="GGUF", help="compare this file's forward pass with `tandem run`")
    ap.add_argument("--template", default="/tmp/t.gguf", help="make-model --preset tiny --seed 1 output (F32)")
    ap.add_argument("--out", default="tests/data/tiny-trained.gguf")
    ap.add_argument("--steps", type=int, default=3000, help="steps of 4096 target tokens")
    ap.add_argument("--lr", type=float, default=6e-3)
    ap.add_argument("--eval-every", type=int, default=500)
    ap.add_argument("--seed", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(1)  # deterministic, and leaves the other core to the build
    if args.check:
        sys.exit(0 if check(args.check) else 1)
    train(args)
    sys.exit(0 if check(args.out) else 1)


if __name__ == "__main__":
    main()
