#!/usr/bin/python3
"""Where 8-bit and 4-bit KV flip the trained tiny model's greedy picks, in float64 torch.

Runs tests/data/tiny-trained.gguf (scripts/train-tiny.py) teacher-forced over 64 windows of
held-out text (tests/data/heldout.txt) with K and V quantized as the engine stores them
(per group of the head dimension: min-max affine, F32 scale and bias, round to nearest) and
prints how often the argmax changes, how much the logits move, and how many positions have
their top two logits nearly tied. Same setup as train-tiny.py: Debian's /usr/bin/python3
with python3-torch, from the repository root:
  /usr/bin/python3 scripts/kv-quant-sim.py
"""
import importlib.util
import math

import torch

spec = importlib.util.spec_from_file_location("tt", "scripts/train-tiny.py"); tt = importlib.util.module_from_spec(spec); spec.loader.exec_module(tt)
torch.set_num_threads(1)
W = tt.load_weights("tests/data/tiny-trained.gguf", torch.float64)
CFG = tt.CFG
def quant(x, bits, g):
    # x [..., hd]: min-max affine per group of g along the last dim, RTN
    sh = x.shape; x = x.reshape(*sh[:-1], sh[-1] // g, g)
    mn = x.min(-1, keepdim=True).values; mx = x.max(-1, keepdim=True).values
    levels = (1 << bits) - 1
    scale = (mx - mn) / levels; scale = torch.where(scale == 0, torch.ones_like(scale), scale)
    # engine: F32 scale/bias
    scale = scale.float().double(); mn32 = mn.float().double()
    q = torch.clamp(torch.round((x - mn32) / scale), 0, levels)
    return (q * scale + mn32).reshape(sh)
def forward(tokens, qk=None):
    B, T = tokens.shape
    nh, nkv, dim = CFG["n_heads"], CFG["n_kv_heads"], CFG["dim"]; hd = dim // nh
    cos, sin = tt.rope_tables(T, torch.float64)
    mask = torch.full((T, T), float("-inf"), dtype=torch.float64).triu(1)
    x = W["token_embd.weight"][tokens]; kstats = []
    for l in range(CFG["n_layers"]):
        p = lambda w: W[f"blk.{l}.{w}.weight"]
        h = tt.rms_norm(x, p("attn_norm"))
        q = tt.rope((h @ p("attn_q").T).view(B, T, nh, hd), cos, sin).transpose(1, 2)
        k = tt.rope((h @ p("attn_k").T).view(B, T, nkv, hd), cos, sin).transpose(1, 2)
        v = (h @ p("attn_v").T).view(B, T, nkv, hd).transpose(1, 2)
        kstats.append((k.abs().amax(-1) / k.pow(2).mean(-1).sqrt()).mean().item())
        if qk: k = qk(k); v = qk(v)
        k = k.repeat_interleave(nh // nkv, dim=1); v = v.repeat_interleave(nh // nkv, dim=1)
        att = torch.softmax(q @ k.transpose(-1, -2) / math.sqrt(hd) + mask, dim=-1)
        x = x + (att @ v).transpose(1, 2).reshape(B, T, dim) @ p("attn_output").T
        h = tt.rms_norm(x, p("ffn_norm"))
        x = x + (torch.nn.functional.silu(h @ p("ffn_gate").T) * (h @ p("ffn_up").T)) @ p("ffn_down").T
    return tt.rms_norm(x, W["output_norm.weight"]) @ W["output.weight"].T, kstats
text = open("tests/data/heldout.txt", "rb").read()
stride = (len(text) - 112) // 64
toks = torch.tensor([[1] + [b + 3 for b in text[i*stride:i*stride+111]] for i in range(64)])
ref, ks = forward(toks)
print("K max/rms per layer", ks)
a = ref.argmax(-1); top2 = ref.topk(2, -1).values; gap = top2[..., 0] - top2[..., 1]
print("gap<0.05: %.3f%%  gap<0.2: %.3f%%" % (100 * (gap < 0.05).double().mean(), 100 * (gap < 0.2).double().mean()))
for name, f in [("q8 g16", lambda t: quant(t, 8, 16)), ("q8 g8", lambda t: quant(t, 8, 8)), ("q4 g16", lambda t: quant(t, 4, 16)), ("q4 g8", lambda t: quant(t, 4, 8))]:
    got, _ = forward(toks, f)
    err = (got - ref).abs().amax(-1)
    print("%-7s flips %.3f%%  max|dlogit| median %.4f p99 %.4f max %.4f" % (name, 100 * (got.argmax(-1) != a).double().mean(), err.median(), err.quantile(0.99), err.max()))
