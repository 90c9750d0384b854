#!/usr/bin/python3
"""An independent float64 forward pass of the architectures tandem runs, for tests.

    reference_forward.py MODEL.gguf --tokens 1,2,3 --out LOGITS.f64

Reads the GGUF file with its own minimal reader (no llama.cpp, no gguf-py), computes the
logits of every position of the token sequence in float64 with numpy, and writes them as
little-endian float64, [tokens][vocab]. Architectures: llama (optional Q/K/V biases,
Llama 3 rope_freqs.weight, linear and YaRN RoPE scaling), qwen2 (Q/K/V biases, NEOX RoPE),
qwen3 (per-head Q/K RMSNorm before RoPE, NEOX RoPE, head_dim from attention.key_length),
gemma2 and gemma3 (Hugging Face's Gemma2/Gemma3 models as llama.cpp reads their GGUF files:
embeddings times sqrt(dim), GeGLU with tanh GELU, RMSNorm after attention and after the FFN,
sliding-window layers on llama.cpp's pattern where a query at position p sees keys
p - W + 1 .. p, attention and final logit soft-capping (gemma2), Q/K norms and a separate RoPE
base on the windowed layers (gemma3); the GGUF norms already hold Gemma's 1 + w).
The semantics are llama.cpp's (src/llama-model.cpp, ggml's rope), written out from their
definitions here, not translated from tandem's engine.
"""
import argparse
import math
import struct
import sys

import numpy as np

# ---- GGUF -------------------------------------------------------------------------------

_SCALARS = {0: "<B", 1: "<b", 2: "<H", 3: "<h", 4: "<I", 5: "<i", 6: "<f", 7: "<?", 10: "<Q", 11: "<q", 12: "<d"}


class Gguf:
    def __init__(self, path):
        with open(path, "rb") as f:
            self.buf = f.read()
        self.pos = 0
        if self._take(4) != b"GGUF":
            raise ValueError(f"{path}: not a GGUF file")
        version = self._scalar(4)
        if version != 3:
            raise ValueError(f"{path}: GGUF version {version}")
        n_tensors, n_kv = self._scalar(10), self._scalar(10)
        self.kv = {}
        for _ in range(n_kv):
            key = self._string()
            self.kv[key] = self._value(self._scalar(4))
        infos = []
        for _ in range(n_tensors):
            name = self._string()
            dims = [self._scalar(10) for _ in range(self._scalar(4))]
            infos.append((name, dims, self._scalar(4), self._scalar(10)))
        align = self.kv.get("general.alignment", 32)
        data = (self.pos + align - 1) // align * align
        self.tensors = {}
        for name, dims, ggml_type, offset in infos:
            n = math.prod(dims)
            dtype = {0: np.float32, 1: np.float16}.get(ggml_type)
            if dtype is None:
                raise ValueError(f"tensor {name}: type {ggml_type} (this reference reads F32 and F16)")
            a = np.frombuffer(self.buf, dtype=dtype, count=n, offset=data + offset)
            # ggml dims are innermost first: a matrix [in, out] is `out` rows of `in` values.
            self.tensors[name] = a.astype(np.float64).reshape(list(reversed(dims)))

    def _take(self, n):
        b = self.buf[self.pos:self.pos + n]
        self.pos += n
        return b

    def _scalar(self, t):
        fmt = _SCALARS[t]
        return struct.unpack(fmt, self._take(struct.calcsize(fmt)))[0]

    def _string(self):
        return self._take(self._scalar(10)).decode("utf-8")

    def _value(self, t):
        if t == 8:
            return self._string()
        if t == 9:
            et, n = self._scalar(4), self._scalar(10)
            return [self._value(et) for _ in range(n)]
        return self._scalar(t)


# ---- the model --------------------------------------------------------------------------

ROPE_NEOX = {"qwen2", "qwen3", "gemma2", "gemma3"}  # llama.cpp's LLAMA_ROPE_TYPE_NEOX; llama is NORM (adjacent pairs)


class Config:
    def __init__(self, g):
        arch = g.kv["general.architecture"]
        if arch not in ("llama", "qwen2", "qwen3", "gemma2", "gemma3"):
            raise ValueError(f"architecture {arch!r}")
        k = lambda key, default=None: g.kv.get(f"{arch}.{key}", default)
        self.arch = arch
        self.dim = k("embedding_length")
        self.n_layers = k("block_count")
        self.n_heads = k("attention.head_count")
        self.n_kv = k("attention.head_count_kv", self.n_heads)
        self.ctx = k("context_length")
        self.head_dim = k("attention.key_length", self.dim // self.n_heads)
        self.eps = k("attention.layer_norm_rms_epsilon")
        self.base = k("rope.freq_base", 10000.0)
        # RoPE scaling, as llama.cpp reads it for every architecture: the type defaults to
        # linear, a factor of 0 (or none) means no scaling; type "none" never scales.
        self.scaling = k("rope.scaling.type", "linear")
        factor = k("rope.scaling.factor", k("rope.scale_linear", 0.0))
        self.factor = 1.0 if factor == 0.0 or self.scaling == "none" else factor
        self.orig_ctx = k("rope.scaling.original_context_length", self.ctx)
        self.attn_factor = k("rope.scaling.attn_factor", 1.0)
        self.neox = arch in ROPE_NEOX
        # Llama 3's per-pair frequency divisors: llama.cpp loads rope_freqs.weight for llama only.
        self.freq_factors = g.tensors.get("rope_freqs.weight") if arch == "llama" else None
        self.gemma = arch in ("gemma2", "gemma3")
        self.qk_norm = arch in ("qwen3", "gemma3")
        # Gemma: which layers are windowed (sliding_window_pattern: a bool per layer, or n with
        # layer l windowed iff l % n < n - 1; defaults 2 and 6), the window (gemma2 defaults to
        # 4096; gemma3 without one has none), the windowed layers' RoPE base, the caps.
        self.window = [0] * self.n_layers
        self.caps = (None, None)
        self.swa_base = self.base
        if self.gemma:
            w = k("attention.sliding_window", 4096 if arch == "gemma2" else 0)
            pattern = k("attention.sliding_window_pattern", 2 if arch == "gemma2" else 6)
            for layer in range(self.n_layers):
                if isinstance(pattern, list):
                    windowed = bool(pattern[layer])
                else:
                    windowed = pattern == 0 or layer % pattern < pattern - 1
                self.window[layer] = w if windowed else 0
            self.swa_base = k("rope.freq_base_swa", self.base if arch == "gemma2" else 10000.0)
            if arch == "gemma2":
                self.caps = (k("attn_logit_softcapping", 50.0), k("final_logit_softcapping", 30.0))
            else:
                self.caps = (None, k("final_logit_softcapping"))


def rope_tables(c, n_pos, base=None):
    """cos and sin [pos][pair], magnitude included (YaRN's mscale); `base` overrides c.base."""
    hd = c.head_dim
    base = c.base if base is None else base
    i = np.arange(hd // 2, dtype=np.float64)
    extrap = np.arange(n_pos, dtype=np.float64)[:, None] * base ** (-2.0 * i / hd)[None, :]
    if c.freq_factors is not None:
        extrap = extrap / c.freq_factors[None, :]
    interp = extrap / c.factor
    if c.scaling == "yarn":
        # YaRN (Peng et al. 2023) with llama.cpp's constants for these architectures:
        # beta_fast 32, beta_slow 1, extrapolation factor 1. Pair i keeps its extrapolated
        # angle below the `low` correction dimension, the interpolated one above `high`, and
        # a linear ramp between; attention is sharpened by 1 + 0.1 ln(factor).
        def corr_dim(beta):
            return hd * math.log(c.orig_ctx / (beta * 2 * math.pi)) / (2 * math.log(base))

        low = max(0.0, math.floor(corr_dim(32.0)))
        high = min(hd - 1.0, math.ceil(corr_dim(1.0)))
        ramp = 1.0 - np.clip((i - low) / max(0.001, high - low), 0.0, 1.0)
        theta = interp * (1.0 - ramp) + extrap * ramp
        mscale = c.attn_factor * (1.0 + 0.1 * math.log(c.factor) if c.factor > 1.0 else 1.0)
    else:
        theta = interp
        mscale = c.attn_factor
    return np.cos(theta) * mscale, np.sin(theta) * mscale


def rope(x, cos, sin, neox):
    """x [tokens][heads][head_dim] rotated in place of a copy."""
    y = x.copy()
    half = x.shape[-1] // 2
    c, s = cos[:, None, :], sin[:, None, :]
    if neox:  # pairs (i, i + half)
        a, b = x[..., :half], x[..., half:]
        y[..., :half], y[..., half:] = a * c - b * s, a * s + b * c
    else:  # pairs (2i, 2i + 1)
        a, b = x[..., 0::2], x[..., 1::2]
        y[..., 0::2], y[..., 1::2] = a * c - b * s, a * s + b * c
    return y


def rms_norm(x, w, eps):
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + eps) * w


def gelu_tanh(x):
    return 0.5 * x * (1.0 + np.tanh(math.sqrt(2.0 / math.pi) * (x + 0.044715 * x ** 3)))


def soft_cap(x, cap):
    return x if cap is None else cap * np.tanh(x / cap)


def attention_mask(n, window):
    """0 where query i sees key j: j <= i, and with a window W, i - j < W (keys i - W + 1 .. i)."""
    i, j = np.arange(n)[:, None], np.arange(n)[None, :]
    seen = (j <= i) & ((i - j < window) if window else True)
    return np.where(seen, 0.0, -np.inf)


def forward(g, tokens):
    c = Config(g)
    T = g.tensors
    n, hd = len(tokens), c.head_dim
    x = T["token_embd.weight"][tokens]
    if c.gemma:
        x = x * math.sqrt(c.dim)  # Gemma's embedding normalizer
    cos, sin = rope_tables(c, n)
    # Gemma 3's windowed layers: their own base and no RoPE scaling; Gemma 2's: the file's scaling.
    swa = Config.__new__(Config)
    swa.__dict__.update(c.__dict__)
    if c.arch == "gemma3":
        swa.scaling, swa.factor, swa.attn_factor = "none", 1.0, 1.0
    swa_cos, swa_sin = rope_tables(swa, n, c.swa_base)
    group = c.n_heads // c.n_kv
    for layer in range(c.n_layers):
        mask = attention_mask(n, c.window[layer])
        lcos, lsin = (swa_cos, swa_sin) if c.window[layer] else (cos, sin)
        w = lambda name, kind="weight": T.get(f"blk.{layer}.{name}.{kind}")
        h = rms_norm(x, w("attn_norm"), c.eps)
        qkv = []
        for name, heads in (("attn_q", c.n_heads), ("attn_k", c.n_kv), ("attn_v", c.n_kv)):
            y = h @ w(name).T
            if w(name, "bias") is not None:  # optional in llama.cpp for all three; Qwen2 has them
                y = y + w(name, "bias")
            qkv.append(y.reshape(n, heads, hd))
        q, k, v = qkv
        if c.qk_norm:
            q = rms_norm(q, w("attn_q_norm"), c.eps)
            k = rms_norm(k, w("attn_k_norm"), c.eps)
        q, k = rope(q, lcos, lsin, c.neox), rope(k, lcos, lsin, c.neox)
        out = np.empty((n, c.n_heads, hd))
        for head in range(c.n_heads):
            kv = head // group
            scores = soft_cap(q[:, head, :] @ k[:, kv, :].T / math.sqrt(hd), c.caps[0]) + mask
            p = np.exp(scores - scores.max(axis=1, keepdims=True))
            out[:, head, :] = (p / p.sum(axis=1, keepdims=True)) @ v[:, kv, :]
        attn = out.reshape(n, c.n_heads * hd) @ w("attn_output").T
        x = x + (rms_norm(attn, w("post_attention_norm"), c.eps) if c.gemma else attn)
        h = rms_norm(x, w("ffn_norm"), c.eps)
        gate, up = h @ w("ffn_gate").T, h @ w("ffn_up").T
        act = gelu_tanh(gate) if c.gemma else gate / (1.0 + np.exp(-gate))
        ffn = (act * up) @ w("ffn_down").T
        x = x + (rms_norm(ffn, w("post_ffw_norm"), c.eps) if c.gemma else ffn)
    head = T.get("output.weight", T["token_embd.weight"])  # absent: tied to the embedding
    return soft_cap(rms_norm(x, T["output_norm.weight"], c.eps) @ head.T, c.caps[1])


def main():
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("model")
    p.add_argument("--tokens", required=True, help="comma-separated token ids")
    p.add_argument("--out", required=True, help="where to write the logits, float64 [tokens][vocab]")
    a = p.parse_args()
    tokens = [int(t) for t in a.tokens.split(",")]
    logits = forward(Gguf(a.model), tokens)
    logits.astype("<f8").tofile(a.out)
    print(f"{a.model}: {len(tokens)} tokens, vocab {logits.shape[1]}, max |logit| {np.abs(logits).max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
