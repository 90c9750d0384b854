#!/usr/bin/python3
"""A float64 reference of the hybrid `qwen35` architecture (Gated DeltaNet + gated attention).

Written from the equations in docs/HYBRID.md (llama.cpp's qwen35 graph and GGUF layout,
Hugging Face's Qwen3.5 modeling code), not from tandem's engine. Weights come from a GGUF file
(F32/F16 tensors, read by tests/model/reference_forward.py's minimal reader).

  qwen35-reference.py MODEL.gguf --tokens 1,2,3 [--mode chunked|recurrent] [--out LOGITS.f64]
      logits of every position, float64 little-endian [tokens][vocab]
  qwen35-reference.py MODEL.gguf --self-check [--n-tokens 150]
      the same tokens token by token (recurrent form), in one call (chunked WY form on the
      64-token grid from position 0) and in prompt pieces cut off the grid: logits and final
      states must agree to 1e-10
  qwen35-reference.py MODEL.gguf --compare-llama OUT.jsonl --prompts PROMPTS.txt
      teacher-forces llama.cpp's greedy continuations (bench/peers/llama-reference.cpp's JSONL:
      top-5 log-probabilities per generated token) and reports top-1 agreement and the largest
      log-probability difference
  qwen35-reference.py --make-random OUT.gguf --preset tiny [--seed N] [--layers LFLLF...]
      a small random qwen35 file with llama.cpp's tensor names, shapes and metadata; --layers
      writes an explicit attention.recurrent_layers pattern (L linear, F full attention)

Needs numpy only (Debian's python3-numpy).
"""
import argparse
import json
import math
import os
import struct
import sys

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "tests", "model"))
from reference_forward import Gguf, rms_norm  # noqa: E402  (the repository's minimal GGUF reader)

GRID = 64  # chunk size of the WY prefill, on a grid of absolute positions from 0

# ---- the model --------------------------------------------------------------------------


class Config:
    """qwen35 hyper-parameters as llama.cpp reads them (src/models/qwen35.cpp, llama-model.cpp)."""

    def __init__(self, g):
        arch = g.kv["general.architecture"]
        if arch != "qwen35":
            raise ValueError(f"architecture {arch!r}: this reference runs qwen35 only")
        k = lambda key, default=None: g.kv.get(f"qwen35.{key}", default)
        need = lambda key: _required(g.kv, f"qwen35.{key}")
        self.dim = need("embedding_length")
        self.n_layers = need("block_count")
        self.n_ff = need("feed_forward_length")
        self.n_heads = need("attention.head_count")
        self.n_kv = k("attention.head_count_kv", self.n_heads)
        self.head_dim = k("attention.key_length", self.dim // self.n_heads)
        if k("attention.value_length", self.head_dim) != self.head_dim:
            raise ValueError("attention.value_length differs from key_length (llama.cpp asserts equal)")
        self.eps = need("attention.layer_norm_rms_epsilon")
        self.base = k("rope.freq_base", 10000.0)
        self.n_rot = k("rope.dimension_count", self.head_dim)
        self.sections = list(need("rope.dimension_sections"))[:4]
        if k("rope.scaling.type", "none") not in ("none", "linear") or k("rope.scaling.factor", 0.0) not in (0.0, 1.0):
            raise ValueError("RoPE scaling: this reference has none")
        self.d_conv = need("ssm.conv_kernel")
        self.d_k = need("ssm.state_size")
        self.h_k = need("ssm.group_count")
        self.h_v = need("ssm.time_step_rank")
        self.d_inner = need("ssm.inner_size")
        if self.d_inner != self.h_v * self.d_k:
            raise ValueError(f"ssm.inner_size {self.d_inner} != time_step_rank {self.h_v} x state_size {self.d_k}"
                             " (llama.cpp takes head_v_dim = state_size)")
        if self.h_v % self.h_k != 0:
            raise ValueError(f"ssm.group_count {self.h_k} does not divide ssm.time_step_rank {self.h_v}")
        if self.n_rot % 2 or self.n_rot > self.head_dim:
            raise ValueError(f"rope.dimension_count {self.n_rot} must be even and <= key_length {self.head_dim}")
        _check_imrope_sections(self.sections, self.n_rot)
        layers = k("attention.recurrent_layers")
        if layers is None:
            interval = k("full_attention_interval", 4)
            layers = [(i + 1) % interval != 0 for i in range(self.n_layers)]
        self.recurrent = [bool(x) for x in layers[:self.n_layers]]
        self.d_v = self.d_k
        self.conv_dim = 2 * self.h_k * self.d_k + self.h_v * self.d_v


def _required(kv, key):
    if key not in kv:
        raise ValueError(f"missing metadata key {key}")
    return kv[key]


def _check_imrope_sections(sections, n_rot):
    """For text every position component is the token's position, so IMROPE is NEOX RoPE if
    every rotated pair reads the t, h or w component (ggml_mrope_cache_init); a pair that falls
    to the 4th component reads position 0 and is not rotated. Qwen3.5's [11, 11, 10, 0] over 32
    pairs covers all; this reference refuses files where it does not."""
    total = sum(sections)
    if total <= 0:
        raise ValueError("rope.dimension_sections is all zero")
    for pair in range(n_rot // 2):
        s = pair % total
        if not any(s % 3 == c and s < 3 * sections[c] for c in range(3)):
            raise ValueError(f"rope.dimension_sections {sections}: pair {pair} is not rotated for text")


def silu(x):
    return x / (1.0 + np.exp(-x))


def sigmoid(x):
    return 1.0 / (1.0 + np.exp(-x))


def softplus(x):
    # ggml's op_softplus and torch's F.softplus (threshold 20): x itself above 20.
    return np.where(x > 20.0, x, np.log1p(np.exp(np.minimum(x, 20.0))))


def l2_normalize(x, eps):
    # x / sqrt(sum x^2 + eps): llama.cpp's build_gdn_l2_norm (eps = rms epsilon), HF's l2norm (eps 1e-6).
    return x / np.sqrt(np.sum(x * x, axis=-1, keepdims=True) + eps)


class LinearState:
    """Per sequence and linear layer: the last d_conv-1 conv inputs and one d_k x d_v state per V head."""

    def __init__(self, c):
        self.conv = np.zeros((c.d_conv - 1, c.conv_dim))
        self.S = np.zeros((c.h_v, c.d_k, c.d_v))


class AttnState:
    def __init__(self, c):
        self.k = np.zeros((0, c.n_kv, c.head_dim))
        self.v = np.zeros((0, c.n_kv, c.head_dim))


def delta_recurrent(q, k, v, g, beta, S):
    """One step per token: S = e^g S; S += k (beta (v - S^T k))^T; o = S^T q. q, k [n][H][d_k]."""
    o = np.empty(v.shape)
    for t in range(q.shape[0]):
        S *= np.exp(g[t])[:, None, None]
        u = np.einsum("hkv,hk->hv", S, k[t])
        d = beta[t][:, None] * (v[t] - u)
        S += k[t][:, :, None] * d[:, None, :]
        o[t] = np.einsum("hkv,hk->hv", S, q[t])
    return o


def unit_lower_solve(A, B):
    """X with (I + A) X = B for strictly lower triangular A [H][L][L], by forward substitution."""
    X = np.empty(B.shape)
    for i in range(A.shape[1]):
        X[:, i] = B[:, i] - np.einsum("hj,hjm->hm", A[:, i, :i], X[:, :i])
    return X


def delta_chunk(q, k, v, g, beta, S):
    """The WY form of L tokens from state S (updated in place). Tensors per head, [H][L][..]."""
    L = q.shape[1]
    gam = np.cumsum(g, axis=1)  # [H][L]
    lower = np.tril(np.ones((L, L), dtype=bool))
    diff = np.where(lower, gam[:, :, None] - gam[:, None, :], -np.inf)
    D = np.exp(diff)  # e^(gam_i - gam_j) for j <= i, else 0
    A = np.tril(beta[:, :, None] * D * np.einsum("hid,hjd->hij", k, k), -1)
    U = unit_lower_solve(A, beta[:, :, None] * v)
    W = unit_lower_solve(A, (beta * np.exp(gam))[:, :, None] * k)
    delta = U - W @ S
    o = np.exp(gam)[:, :, None] * (q @ S) + (D * np.einsum("hid,hjd->hij", q, k)) @ delta
    tail = np.exp(gam[:, -1:] - gam)[:, :, None] * k
    S *= np.exp(gam[:, -1])[:, None, None]
    S += np.einsum("hjk,hjv->hkv", tail, delta)
    return o


def delta_chunked(q, k, v, g, beta, S, pos0):
    """Chunks on the absolute grid: [pos0, next multiple of GRID), then whole grid chunks."""
    n = q.shape[0]
    o = np.empty(v.shape)
    a = 0
    while a < n:
        b = min(n, (pos0 + a) // GRID * GRID + GRID - pos0)
        per_head = lambda x: np.ascontiguousarray(np.swapaxes(x[a:b], 0, 1))
        oc = delta_chunk(per_head(q), per_head(k), per_head(v), per_head(g), per_head(beta), S)
        o[a:b] = np.swapaxes(oc, 0, 1)
        a = b
    return o


def linear_attention(c, w, h, st, mode, pos0):
    n = h.shape[0]
    qkv = h @ w("attn_qkv").T
    z = (h @ w("attn_gate").T).reshape(n, c.h_v, c.d_v)
    beta = sigmoid(h @ w("ssm_beta").T)
    g = softplus(h @ w("ssm_alpha").T + w("ssm_dt", "bias")) * w("ssm_a", None)
    x = np.concatenate([st.conv, qkv])
    kernel = w("ssm_conv1d")  # [conv_dim][d_conv]; column d_conv-1 weighs the current token
    conv = sum(x[i:i + n] * kernel[:, i] for i in range(c.d_conv))
    st.conv = x[n:]
    conv = silu(conv)
    kd = c.h_k * c.d_k
    q = l2_normalize(conv[:, :kd].reshape(n, c.h_k, c.d_k), c.eps) / math.sqrt(c.d_k)
    k = l2_normalize(conv[:, kd:2 * kd].reshape(n, c.h_k, c.d_k), c.eps)
    v = conv[:, 2 * kd:].reshape(n, c.h_v, c.d_v)
    tiled = np.arange(c.h_v) % c.h_k  # GGUF's V head order: V head j reads Q/K head j mod h_k
    q, k = q[:, tiled], k[:, tiled]
    if mode == "recurrent":
        o = delta_recurrent(q, k, v, g, beta, st.S)
    else:
        o = delta_chunked(q, k, v, g, beta, st.S, pos0)
    o = rms_norm(o, w("ssm_norm"), c.eps) * silu(z)
    return o.reshape(n, c.h_v * c.d_v) @ w("ssm_out").T


def rope_neox_partial(x, positions, c):
    """NEOX rotation of the first n_rot dims (pairs i, i + n_rot/2); the rest pass through."""
    half = c.n_rot // 2
    theta = positions[:, None] * c.base ** (-2.0 * np.arange(half) / c.n_rot)[None, :]
    cos, sin = np.cos(theta)[:, None, :], np.sin(theta)[:, None, :]
    y = x.copy()
    a, b = x[..., :half], x[..., half:c.n_rot]
    y[..., :half], y[..., half:c.n_rot] = a * cos - b * sin, a * sin + b * cos
    return y


def full_attention(c, w, h, st, pos0):
    n, hd = h.shape[0], c.head_dim
    qg = (h @ w("attn_q").T).reshape(n, c.n_heads, 2 * hd)  # per head: [query | gate]
    q, gate = qg[..., :hd], qg[..., hd:].reshape(n, c.n_heads * hd)
    k = (h @ w("attn_k").T).reshape(n, c.n_kv, hd)
    v = (h @ w("attn_v").T).reshape(n, c.n_kv, hd)
    positions = np.arange(pos0, pos0 + n, dtype=np.float64)
    q = rope_neox_partial(rms_norm(q, w("attn_q_norm"), c.eps), positions, c)
    k = rope_neox_partial(rms_norm(k, w("attn_k_norm"), c.eps), positions, c)
    st.k, st.v = np.concatenate([st.k, k]), np.concatenate([st.v, v])
    total = st.k.shape[0]
    mask = np.where(np.arange(total)[None, :] <= np.arange(pos0, pos0 + n)[:, None], 0.0, -np.inf)
    group = c.n_heads // c.n_kv  # grouped: query head h reads KV head h // group
    out = np.empty((n, c.n_heads, hd))
    for head in range(c.n_heads):
        s = q[:, head] @ st.k[:, head // group].T / math.sqrt(hd) + mask
        p = np.exp(s - s.max(axis=1, keepdims=True))
        out[:, head] = (p / p.sum(axis=1, keepdims=True)) @ st.v[:, head // group]
    return (out.reshape(n, c.n_heads * hd) * sigmoid(gate)) @ w("attn_output").T


class Model:
    def __init__(self, g):
        self.c = Config(g)
        self.T = g.tensors

    def new_state(self):
        return [LinearState(self.c) if r else AttnState(self.c) for r in self.c.recurrent]

    def forward(self, tokens, state, pos0, mode):
        """Logits [n][vocab] of tokens at positions pos0.. continuing `state` (updated)."""
        c, T = self.c, self.T
        x = T["token_embd.weight"][np.asarray(tokens)]
        for i in range(c.n_layers):
            def w(name, kind="weight", i=i):
                key = f"blk.{i}.{name}" + (f".{kind}" if kind else "")
                if key not in T:
                    raise ValueError(f"missing tensor {key}")
                return T[key]
            h = rms_norm(x, w("attn_norm"), c.eps)
            if c.recurrent[i]:
                x = x + linear_attention(c, w, h, state[i], mode, pos0)
            else:
                x = x + full_attention(c, w, h, state[i], pos0)
            h = rms_norm(x, w("post_attention_norm"), c.eps)
            x = x + (silu(h @ w("ffn_gate").T) * (h @ w("ffn_up").T)) @ w("ffn_down").T
        head = T.get("output.weight", T["token_embd.weight"])
        return rms_norm(x, T["output_norm.weight"], c.eps) @ head.T

    def logits(self, tokens, mode):
        state = self.new_state()
        if mode == "chunked":
            return self.forward(tokens, state, 0, "chunked"), state
        rows = [self.forward(tokens[p:p + 1], state, p, "recurrent") for p in range(len(tokens))]
        return np.concatenate(rows), state

    def pieces(self, tokens, cuts):
        """Prompt pieces [0, cut1), [cut1, cut2), ..., each chunked on the absolute grid."""
        state, rows, bounds = self.new_state(), [], [0] + list(cuts) + [len(tokens)]
        for a, b in zip(bounds, bounds[1:]):
            rows.append(self.forward(tokens[a:b], state, a, "chunked"))
        return np.concatenate(rows), state


# ---- checks -----------------------------------------------------------------------------


def state_difference(a, b):
    worst = 0.0
    for x, y in zip(a, b):
        pairs = [(x.conv, y.conv), (x.S, y.S)] if isinstance(x, LinearState) else [(x.k, y.k), (x.v, y.v)]
        worst = max([worst] + [float(np.abs(p - q).max()) for p, q in pairs])
    return worst


def self_check(model, n_tokens, seed, tolerance=1e-10):
    vocab = model.T["token_embd.weight"].shape[0]
    tokens = list(np.random.default_rng(seed).integers(0, vocab, n_tokens))
    rec, rec_state = model.logits(tokens, "recurrent")
    chk, chk_state = model.logits(tokens, "chunked")
    cuts = [c for c in (37, 64, 100, 129) if c < n_tokens]
    pcs, pcs_state = model.pieces(tokens, cuts)
    scale = float(np.abs(rec).max())
    results = [
        ("chunked vs recurrent logits", float(np.abs(chk - rec).max())),
        ("chunked vs recurrent final state", state_difference(chk_state, rec_state)),
        (f"pieces cut at {cuts} vs recurrent logits", float(np.abs(pcs - rec).max())),
        ("pieces vs recurrent final state", state_difference(pcs_state, rec_state)),
    ]
    ok = True
    print(f"self-check: {n_tokens} tokens, {sum(model.c.recurrent)} linear + "
          f"{model.c.n_layers - sum(model.c.recurrent)} full layers, grid {GRID}, max |logit| {scale:.3f}")
    for name, diff in results:
        good = diff <= tolerance
        ok &= good
        print(f"  {name}: max |diff| {diff:.3e} {'ok' if good else f'> {tolerance:g} FAIL'}")
    return ok


def log_softmax(x):
    m = x.max(axis=-1, keepdims=True)
    return x - m - np.log(np.exp(x - m).sum(axis=-1, keepdims=True))


def compare_llama(model, jsonl, prompts_path):
    """Prefill each prompt in one call (chunked), then decode llama.cpp's tokens one by one."""
    with open(prompts_path) as f:
        prompts = [[int(t) for t in line.split(",")] for line in f if line.strip()]
    with open(jsonl) as f:
        outputs = [json.loads(line) for line in f if line.strip()]
    if len(prompts) != len(outputs):
        raise ValueError(f"{len(prompts)} prompts but {len(outputs)} continuations")
    agree = total = 0
    worst = 0.0
    for prompt, out in zip(prompts, outputs):
        state = model.new_state()
        rows = [model.forward(prompt, state, 0, "chunked")[-1:]]
        for i, t in enumerate(out["tokens"][:-1]):
            rows.append(model.forward([t], state, len(prompt) + i, "recurrent"))
        lp = log_softmax(np.concatenate(rows))
        for pos, top in enumerate(out["top"]):
            total += 1
            agree += int(np.argmax(lp[pos]) == top[0][0])
            worst = max([worst] + [abs(lp[pos][tid] - tlp) for tid, tlp in top])
    print(f"compare-llama: top-1 agreement {agree}/{total}, max |logprob diff| over llama.cpp's top-5 {worst:.3e}")
    return agree, total, worst


# ---- a random qwen35 file ---------------------------------------------------------------

PRESETS = {
    # dim 64; 4 layers: 3 Gated DeltaNet + 1 full attention (interval 4); delta net 2 QK heads and
    # 4 V heads of 16; attention 4 query heads, 2 KV heads of 32 (q width 128 != dim), RoPE on
    # 8 of 32 dims (partial factor 0.25) with IMROPE sections [2, 1, 1, 0] covering its 4 pairs.
    "tiny": dict(vocab=512, dim=64, n_layers=4, interval=4, n_ff=192, n_heads=4, n_kv=2, head_dim=32,
                 n_rot=8, sections=[2, 1, 1, 0], d_conv=4, d_state=16, h_k=2, h_v=4, context=512,
                 base=10000000.0, eps=1e-6),
}


def random_tensors(p, rng):
    """(name, numpy array in ggml's reversed order) in llama.cpp's tensor order."""
    dim, out = p["dim"], []
    mat = lambda n_in, n_out: rng.standard_normal((n_out, n_in)) / math.sqrt(n_in)
    norm = lambda n: 1.0 + 0.25 * rng.standard_normal(n)  # GGUF stores HF's (1 + w): ~1
    out.append(("token_embd.weight", rng.standard_normal((p["vocab"], dim))))
    kd, vd = p["h_k"] * p["d_state"], p["h_v"] * p["d_state"]
    for i, recurrent in enumerate(layer_pattern(p)):
        b = f"blk.{i}."
        out.append((b + "attn_norm.weight", norm(dim)))
        if recurrent:
            out += [(b + "attn_qkv.weight", mat(dim, 2 * kd + vd)), (b + "attn_gate.weight", mat(dim, vd)),
                    (b + "ssm_conv1d.weight", rng.standard_normal((2 * kd + vd, p["d_conv"])) / 2.0),
                    # decay rates from e^-0.005 to ~e^-3 per token: some heads remember past a chunk
                    (b + "ssm_dt.bias", rng.normal(-1.0, 1.0, p["h_v"])),
                    (b + "ssm_a", -np.exp(rng.uniform(math.log(0.01), math.log(2.0), p["h_v"]))),
                    (b + "ssm_beta.weight", mat(dim, p["h_v"])), (b + "ssm_alpha.weight", mat(dim, p["h_v"])),
                    (b + "ssm_norm.weight", norm(p["d_state"])), (b + "ssm_out.weight", mat(vd, dim))]
        else:
            hd = p["head_dim"]
            out += [(b + "attn_q.weight", mat(dim, 2 * p["n_heads"] * hd)),
                    (b + "attn_q_norm.weight", norm(hd)), (b + "attn_k.weight", mat(dim, p["n_kv"] * hd)),
                    (b + "attn_k_norm.weight", norm(hd)), (b + "attn_v.weight", mat(dim, p["n_kv"] * hd)),
                    (b + "attn_output.weight", mat(p["n_heads"] * hd, dim))]
        out += [(b + "post_attention_norm.weight", norm(dim)), (b + "ffn_gate.weight", mat(dim, p["n_ff"])),
                (b + "ffn_down.weight", mat(p["n_ff"], dim)), (b + "ffn_up.weight", mat(dim, p["n_ff"]))]
    out += [("output_norm.weight", norm(dim)), ("output.weight", mat(dim, p["vocab"]))]
    return out


def layer_pattern(p):
    """True = Gated DeltaNet: the explicit pattern if given, else llama.cpp's interval rule."""
    if p.get("layers"):
        return p["layers"]
    return [(i + 1) % p["interval"] != 0 for i in range(p["n_layers"])]


def metadata(p, name):
    a = "qwen35."
    tokens = ["<unk>", "<s>", "</s>"] + [f"<0x{b:02X}>" for b in range(256)]
    types = [2, 3, 3] + [6] * 256
    tokens += [f"<unused{i}>" for i in range(p["vocab"] - len(tokens))]
    types += [5] * (p["vocab"] - len(types))
    return [
        ("general.architecture", "str", "qwen35"), ("general.name", "str", name),
        ("general.file_type", "u32", 0), ("general.alignment", "u32", 32),
        (a + "context_length", "u32", p["context"]), (a + "embedding_length", "u32", p["dim"]),
        (a + "block_count", "u32", p["n_layers"]), (a + "feed_forward_length", "u32", p["n_ff"]),
        (a + "attention.head_count", "u32", p["n_heads"]), (a + "attention.head_count_kv", "u32", p["n_kv"]),
        (a + "attention.key_length", "u32", p["head_dim"]), (a + "attention.value_length", "u32", p["head_dim"]),
        (a + "attention.layer_norm_rms_epsilon", "f32", p["eps"]), (a + "rope.freq_base", "f32", p["base"]),
        (a + "rope.dimension_count", "u32", p["n_rot"]), (a + "rope.dimension_sections", "i32[]", p["sections"]),
        (a + "ssm.conv_kernel", "u32", p["d_conv"]), (a + "ssm.state_size", "u32", p["d_state"]),
        (a + "ssm.group_count", "u32", p["h_k"]), (a + "ssm.time_step_rank", "u32", p["h_v"]),
        (a + "ssm.inner_size", "u32", p["h_v"] * p["d_state"]),
        (a + "full_attention_interval", "u32", p["interval"]), (a + "vocab_size", "u32", p["vocab"]),
        ("tokenizer.ggml.model", "str", "llama"), ("tokenizer.ggml.pre", "str", "default"),
        ("tokenizer.ggml.tokens", "str[]", tokens), ("tokenizer.ggml.scores", "f32[]", [0.0] * p["vocab"]),
        ("tokenizer.ggml.token_type", "i32[]", types), ("tokenizer.ggml.bos_token_id", "u32", 1),
        ("tokenizer.ggml.eos_token_id", "u32", 2), ("tokenizer.ggml.unknown_token_id", "u32", 0),
        ("tokenizer.ggml.add_bos_token", "bool", True), ("tokenizer.ggml.add_eos_token", "bool", False),
    ] + ([(a + "attention.recurrent_layers", "bool[]", p["layers"])] if p.get("layers") else [])


_TYPES = {"u32": (4, "<I"), "i32": (5, "<i"), "f32": (6, "<f"), "bool": (7, "<?"), "str": (8, None)}


def _pack_value(kind, value):
    if kind.endswith("[]"):
        code, _ = _TYPES[kind[:-2]]
        return struct.pack("<IQ", code, len(value)) + b"".join(_pack_value(kind[:-2], v) for v in value)
    if kind == "str":
        raw = value.encode("utf-8")
        return struct.pack("<Q", len(raw)) + raw
    return struct.pack(_TYPES[kind][1], value)


def write_gguf(path, kv, tensors):
    """GGUF v3, F32 tensors, 32-byte alignment."""
    head = bytearray(b"GGUF" + struct.pack("<IQQ", 3, len(tensors), len(kv)))
    for key, kind, value in kv:
        code = 9 if kind.endswith("[]") else _TYPES[kind][0]
        head += _pack_value("str", key) + struct.pack("<I", code) + _pack_value(kind, value)
    offset, blobs = 0, []
    for name, a in tensors:
        raw = np.ascontiguousarray(a, dtype="<f4").tobytes()
        head += _pack_value("str", name) + struct.pack("<I", a.ndim)
        head += b"".join(struct.pack("<Q", d) for d in reversed(a.shape)) + struct.pack("<IQ", 0, offset)
        blobs.append(raw + b"\0" * (-len(raw) % 32))
        offset += len(blobs[-1])
    head += b"\0" * (-len(head) % 32)
    with open(path, "wb") as f:
        f.write(bytes(head) + b"".join(blobs))


def make_random(path, preset, seed, layers=None):
    if preset not in PRESETS:
        raise ValueError(f"unknown preset {preset!r} (presets: {', '.join(PRESETS)})")
    p = dict(PRESETS[preset])
    if layers:
        if set(layers) - set("LF"):
            raise ValueError(f"--layers {layers!r}: one letter per layer, L (Gated DeltaNet) or F (full attention)")
        p["layers"], p["n_layers"] = [ch == "L" for ch in layers], len(layers)
    write_gguf(path, metadata(p, f"qwen35-reference-{preset}"), random_tensors(p, np.random.default_rng(seed)))
    print(f"{path}: random qwen35 preset {preset}, seed {seed}")


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model", nargs="?")
    ap.add_argument("--tokens", help="comma-separated token ids")
    ap.add_argument("--mode", choices=["chunked", "recurrent"], default="chunked")
    ap.add_argument("--out", help="where to write the logits, float64 [tokens][vocab]")
    ap.add_argument("--self-check", action="store_true")
    ap.add_argument("--n-tokens", type=int, default=150)
    ap.add_argument("--compare-llama", metavar="JSONL")
    ap.add_argument("--prompts")
    ap.add_argument("--make-random", metavar="OUT")
    ap.add_argument("--preset", default="tiny")
    ap.add_argument("--seed", type=int, default=1)
    ap.add_argument("--layers", help="with --make-random: the layer pattern, e.g. LFLF, written as "
                    "attention.recurrent_layers (default: full_attention_interval 4)")
    a = ap.parse_args()
    if a.make_random:
        make_random(a.make_random, a.preset, a.seed, a.layers)
        return 0
    if not a.model:
        ap.error("MODEL.gguf is required")
    model = Model(Gguf(a.model))
    if a.self_check:
        return 0 if self_check(model, a.n_tokens, a.seed) else 1
    if a.compare_llama:
        if not a.prompts:
            ap.error("--compare-llama needs --prompts")
        compare_llama(model, a.compare_llama, a.prompts)
        return 0
    if not a.tokens:
        ap.error("one of --tokens, --self-check, --compare-llama, --make-random")
    tokens = [int(t) for t in a.tokens.split(",")]
    logits, _ = model.logits(tokens, a.mode)
    if a.out:
        logits.astype("<f8").tofile(a.out)
    print(f"{a.model}: {len(tokens)} tokens ({a.mode}), vocab {logits.shape[1]}, max |logit| {np.abs(logits).max():.4f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
