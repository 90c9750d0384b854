#!/usr/bin/python3
"""KV cache quantization replayed in float64 torch on the trained tiny model: where uniform and
rotated (TurboQuant-style) codes flip its greedy picks.

The model is tests/data/tiny-trained.gguf (scripts/train-tiny.py). K and V are quantized as the
engine stores them, after RoPE, each row once:
  * uniform b bits (the engine's formats today): per group of the head dimension (16 on this
    model, whose head_dim is 16: one group per head vector), min-max affine with F32 scale and
    bias, round to nearest;
  * rotated b bits (issue #23): each head vector as its L2 norm (F32) and its direction turned
    by a fixed randomized Hadamard transform R = H D (D: a +-1 diagonal drawn from the seed,
    the layer and K-or-V; H: the normalized Walsh-Hadamard matrix), each rotated coordinate
    replaced by the nearest of 2^b Lloyd-Max levels for the distribution of one coordinate of
    a uniformly random unit vector in head_dim dimensions (density ~ (1 - x^2)^((d-3)/2)).
    Computed the way the kernel will: the query is rotated with K's transform and dotted with
    the dequantized rotated keys times their norms (no inverse rotation per key); values are
    summed in the rotated domain (weights times norms times levels) and rotated back once.
Both keep the engine's F32 window (a query at position p reads exact K and V for the
positions of its own block of 16 and the f32_window - 1 blocks before it) and optionally the
last layer in F32 (skip_last_layer), with the engine's defaults (window 2, no skip).

Modes (Debian's /usr/bin/python3 with python3-torch and python3-numpy, from the repository root):
  /usr/bin/python3 scripts/kv-quant-sim.py              # teacher-forced over 64 held-out windows
      (no F32 window): argmax flips, logit moves, near-ties per format
  /usr/bin/python3 scripts/kv-quant-sim.py --prompts    # kv_quant_test's measure: 8 sets of 32
      held-out text prompts (BOS + 48 bytes) x 64 greedy steps, free-running and teacher-forced
      agreement with F32 KV, and bytes per token, per format
  /usr/bin/python3 scripts/kv-quant-sim.py --levels     # the Lloyd-Max levels and boundaries
The Lloyd-Max and rotation helpers need only numpy (tests/python/kv_rotation_test.py imports
this file); torch is imported by the model modes.
"""
import argparse
import importlib.util
import math
import sys

import numpy as np

MASK64 = (1 << 64) - 1
GOLDEN = 0x9E3779B97F4A7C15


# ---------------------------------------------------------------- the rotation
def splitmix64(state):
    """One step of SplitMix64: (next state, output), both unsigned 64-bit ints."""
    state = (state + GOLDEN) & MASK64
    z = state
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK64
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK64
    return state, z ^ (z >> 31)


def rotation_signs(seed, layer, kv, d):
    """The +-1 diagonal D of (seed, layer, kv: 0 K, 1 V): element i is -1 where bit i % 64 of
    the (i // 64)-th SplitMix64 output is set, the stream starting at state
    seed ^ (2 * layer + kv) * GOLDEN (mod 2^64). Any d; the same on every worker."""
    state = (seed ^ ((2 * layer + kv) * GOLDEN)) & MASK64
    signs = np.empty(d)
    for i in range(d):
        if i % 64 == 0:
            state, word = splitmix64(state)
        signs[i] = -1.0 if (word >> (i % 64)) & 1 else 1.0
    return signs


def check_power_of_two(d):
    if d < 4 or d & (d - 1):
        raise ValueError(f"the rotated KV scheme needs a head dimension that is a power of two >= 4, got {d}")


def fwht(x):
    """Normalized Walsh-Hadamard transform of the last axis of a numpy array (length a power of
    two): butterflies h = 1, 2, 4, ... with (a, b) -> (a + b, a - b), then / sqrt(d). Sylvester
    order, so it is the matrix H with H[i][j] = (-1)^popcount(i & j) / sqrt(d); H = H^T = H^-1."""
    x = np.array(x, dtype=np.float64)
    d = x.shape[-1]
    check_power_of_two(d)
    h = 1
    while h < d:
        y = x.reshape(*x.shape[:-1], d // (2 * h), 2, h)
        a, b = y[..., 0, :].copy(), y[..., 1, :].copy()
        y[..., 0, :], y[..., 1, :] = a + b, a - b
        x = y.reshape(*x.shape)
        h *= 2
    return x / math.sqrt(d)


def rotation_matrix(seed, layer, kv, d):
    """R = H D as a d x d float64 matrix: a head vector x (a row) rotates to x @ R.T and back
    with y @ R."""
    check_power_of_two(d)
    return fwht(np.diag(rotation_signs(seed, layer, kv, d))).T


# ---------------------------------------------------------------- the Lloyd-Max levels
def coordinate_density(x, d):
    """Density of one coordinate of a uniformly random unit vector in d dimensions:
    Gamma(d/2) / (sqrt(pi) Gamma((d-1)/2)) (1 - x^2)^((d-3)/2) on [-1, 1]."""
    c = math.exp(math.lgamma(d / 2) - math.lgamma((d - 1) / 2)) / math.sqrt(math.pi)
    return c * np.clip(1 - np.asarray(x, dtype=np.float64) ** 2, 0, None) ** ((d - 3) / 2)


_GL_NODES, _GL_WEIGHTS = np.polynomial.legendre.leggauss(96)


def _cell_moments(lo, hi, d):
    """Integrals of f, x f and x^2 f over the cells [lo[i], hi[i]] (96-point Gauss-Legendre)."""
    half, mid = (hi - lo) / 2, (hi + lo) / 2
    x = mid[:, None] + half[:, None] * _GL_NODES[None, :]
    wf = coordinate_density(x, d) * _GL_WEIGHTS[None, :] * half[:, None]
    return wf.sum(1), (wf * x).sum(1), (wf * x * x).sum(1)


def lloyd_max(d, bits, tol=1e-15, max_iter=200000):
    """Lloyd-Max levels for coordinate_density(., d) with 2^bits levels: iterate the two
    optimality conditions (each boundary the midpoint of its neighbouring levels; each level
    the centroid of its cell, integrated by Gauss-Legendre quadrature per cell) from levels at
    uniform steps over +-3/sqrt(d), until no level moves by more than tol. Returns (levels,
    boundaries, mse, iterations): 2^bits ascending levels, the 2^bits - 1 inner boundaries and
    the mean squared error per coordinate (the error of a unit vector is d * mse)."""
    if d < 4:
        raise ValueError(f"d must be at least 4, got {d}")
    n = 1 << bits
    levels = np.clip((np.arange(n) + 0.5 - n / 2) * (6 / math.sqrt(d) / n), -0.99, 0.99)
    for it in range(1, max_iter + 1):
        bounds = (levels[1:] + levels[:-1]) / 2
        lo, hi = np.concatenate(([-1.0], bounds)), np.concatenate((bounds, [1.0]))
        m0, m1, _ = _cell_moments(lo, hi, d)
        new = m1 / m0
        new = (new - new[::-1]) / 2  # the density is even: keep the levels exactly symmetric
        moved = np.abs(new - levels).max()
        levels = new
        if moved <= tol:
            break
    bounds = (levels[1:] + levels[:-1]) / 2
    lo, hi = np.concatenate(([-1.0], bounds)), np.concatenate((bounds, [1.0]))
    m0, m1, m2 = _cell_moments(lo, hi, d)
    mse = float((m2 - 2 * levels * m1 + levels**2 * m0).sum())
    return levels, bounds, mse, it


# ---------------------------------------------------------------- formats and their bytes
class Format:
    """scheme 'f32', 'uniform' or 'rotated'; bits; window (F32 blocks); skip_last_layer; norm
    ('f32' or 'f16', rotated only)."""

    def __init__(self, scheme, bits=0, window=2, skip_last=False, norm="f32", seed=1, scale="norm"):
        self.scheme, self.bits, self.window, self.skip_last, self.norm, self.seed = scheme, bits, window, skip_last, norm, seed
        self.scale = scale  # rotated: store the norm ('norm') or the least-squares scale ('fit')

    def name(self):
        if self.scheme == "f32":
            return "f32"
        s = f"{self.scheme} q{self.bits}" + ("" if self.window == 2 else f" w{self.window}")
        s += " +f32-last" if self.skip_last else ""
        s += " f16-norm" if self.scheme == "rotated" and self.norm == "f16" else ""
        s += " fit-scale" if self.scheme == "rotated" and self.scale == "fit" else ""
        return s + (f" seed {self.seed}" if self.scheme == "rotated" and self.seed != 1 else "")

    def layer_quantized(self, layer, n_layers):
        return self.scheme != "f32" and not (self.skip_last and layer + 1 == n_layers)

    def vector_bytes(self, d, group=64):
        """Bytes one stored head vector (one K or one V row) takes."""
        if self.scheme == "f32":
            return 4 * d
        codes = d * self.bits / 8
        if self.scheme == "uniform":
            return codes + 8 * (d // min(group, d))  # F32 scale and bias per group
        return codes + (4 if self.norm == "f32" else 2)

    def bytes_per_token(self, n_layers, n_kv, d):
        f32_vec = Format("f32").vector_bytes(d)
        return sum(2 * n_kv * (self.vector_bytes(d) if self.layer_quantized(l, n_layers) else f32_vec) for l in range(n_layers))


# ---------------------------------------------------------------- the model (torch)
class Sim:
    def __init__(self, model="tests/data/tiny-trained.gguf"):
        import torch

        self.torch = torch
        torch.set_num_threads(1)
        spec = importlib.util.spec_from_file_location("tt", "scripts/train-tiny.py")
        self.tt = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(self.tt)
        self.W = self.tt.load_weights(model, torch.float64)
        self.cfg = self.tt.CFG
        self.hd = self.cfg["dim"] // self.cfg["n_heads"]
        check_power_of_two(self.hd)
        self.tables, self.rot = {}, {}
        self.cos, self.sin = self.tt.rope_tables(self.cfg["ctx"], torch.float64)

    def levels(self, bits):
        if bits not in self.tables:
            lv, bd, _, _ = lloyd_max(self.hd, bits)
            self.tables[bits] = (self.torch.tensor(lv), self.torch.tensor(bd))
        return self.tables[bits]

    def rotation(self, seed, layer, kv):
        key = (seed, layer, kv)
        if key not in self.rot:
            self.rot[key] = self.torch.tensor(rotation_matrix(seed, layer, kv, self.hd))
        return self.rot[key]

    def uniform(self, x, bits, g=16):
        # x [..., hd]: min-max affine per group of g along the last dim, RTN, F32 scale and bias
        sh = x.shape
        x = x.reshape(*sh[:-1], sh[-1] // g, g)
        mn = x.min(-1, keepdim=True).values
        mx = x.max(-1, keepdim=True).values
        levels = (1 << bits) - 1
        scale = (mx - mn) / levels
        scale = self.torch.where(scale == 0, self.torch.ones_like(scale), scale)
        scale = scale.float().double()
        mn32 = mn.float().double()
        q = self.torch.clamp(self.torch.round((x - mn32) / scale), 0, levels)
        return (q * scale + mn32).reshape(sh)

    def rotated(self, x, R, fmt):
        """x [..., hd] -> what the cache holds, dequantized, still rotated: norm * level[code]."""
        torch = self.torch
        lv, bd = self.levels(fmt.bits)
        n = x.norm(dim=-1, keepdim=True)
        y = (x / n.clamp_min(1e-300)) @ R.T
        yq = lv[torch.bucketize(y, bd)]  # the nearest level
        if fmt.scale == "fit":  # the scale that minimizes |x - s yq|: n <y, yq> / |yq|^2
            n = n * (y * yq).sum(-1, keepdim=True) / yq.pow(2).sum(-1, keepdim=True)
        n = n.float() if fmt.norm == "f32" else n.half()
        return n.double() * yq

    def forward(self, tokens, fmt, cache=None, stats=None):
        """Logits [B, T, vocab] of `tokens` [B, T] at positions cache["pos"]... (0 without a
        cache). The cache keeps, per layer, K and V exact and as stored (each row quantized
        once, when it is appended), like the engine's pool and F32 window."""
        torch, tt, cfg, W = self.torch, self.tt, self.cfg, self.W
        B, T = tokens.shape
        nh, nkv, dim, hd = cfg["n_heads"], cfg["n_kv_heads"], cfg["dim"], self.hd
        cache = {"pos": 0} if cache is None else cache
        p0 = cache["pos"]
        cos, sin = self.cos[p0:p0 + T], self.sin[p0:p0 + T]
        qpos, kpos = torch.arange(p0, p0 + T), torch.arange(p0 + T)
        causal = torch.where(kpos[None, :] > qpos[:, None], float("-inf"), 0.0).double()
        first = torch.clamp(qpos // 16 + 1 - fmt.window, min=0) * 16  # Engine::window_first * 16
        exact = kpos[None, :] >= first[:, None]  # [query, key]: read from the F32 window
        x = W["token_embd.weight"][tokens]
        rep = lambda t: t.repeat_interleave(nh // nkv, dim=1)  # query head j -> KV head j // group
        for l in range(cfg["n_layers"]):
            p = lambda w: W[f"blk.{l}.{w}.weight"]
            h = tt.rms_norm(x, p("attn_norm"))
            q = tt.rope((h @ p("attn_q").T).view(B, T, nh, hd), cos, sin).transpose(1, 2)
            k = tt.rope((h @ p("attn_k").T).view(B, T, nkv, hd), cos, sin).transpose(1, 2)
            v = (h @ p("attn_v").T).view(B, T, nkv, hd).transpose(1, 2)
            if stats is not None:
                stats.append((k.abs().amax(-1) / k.pow(2).mean(-1).sqrt()).mean().item())
            quant = fmt.layer_quantized(l, cfg["n_layers"])
            Rk, Rv = (self.rotation(fmt.seed, l, 0), self.rotation(fmt.seed, l, 1)) if fmt.scheme == "rotated" else (0, 0)
            if not quant:
                kq = vq = None
            elif fmt.scheme == "uniform":
                kq, vq = self.uniform(k, fmt.bits), self.uniform(v, fmt.bits)
            else:  # stored rotated: norm * level[code]
                kq, vq = self.rotated(k, Rk, fmt), self.rotated(v, Rv, fmt)
            old = cache.get(l)
            if old is not None:
                cat = lambda a, b: None if a is None else torch.cat([a, b], 2)
                k, v, kq, vq = cat(old[0], k), cat(old[1], v), cat(old[2], kq), cat(old[3], vq)
            cache[l] = (k, v, kq, vq)
            scores = q @ rep(k).transpose(-1, -2)
            if quant and fmt.scheme == "uniform":
                scores = torch.where(exact, scores, q @ rep(kq).transpose(-1, -2))
            elif quant:  # the query rotated once; no inverse rotation per key
                scores = torch.where(exact, scores, (q @ Rk.T) @ rep(kq).transpose(-1, -2))
            att = torch.softmax(scores / math.sqrt(hd) + causal, dim=-1)
            if not quant:
                out = att @ rep(v)
            elif fmt.scheme == "uniform":
                out = (att * exact) @ rep(v) + (att * ~exact) @ rep(vq)
            else:  # summed in the rotated domain, rotated back once
                out = (att * exact) @ rep(v) + ((att * ~exact) @ rep(vq)) @ Rv
            x = x + out.transpose(1, 2).reshape(B, T, dim) @ p("attn_output").T
            h = tt.rms_norm(x, p("ffn_norm"))
            x = x + (torch.nn.functional.silu(h @ p("ffn_gate").T) * (h @ p("ffn_up").T)) @ p("ffn_down").T
        cache["pos"] = p0 + T
        return tt.rms_norm(x, W["output_norm.weight"]) @ W["output.weight"].T

    def greedy(self, prompts, fmt, steps=64):
        """Free-running greedy picks [B, steps]: the prompt in one pass, then one token a step."""
        cache, picks = {"pos": 0}, []
        nxt = self.forward(prompts, fmt, cache)[:, -1].argmax(-1)
        for i in range(steps):
            picks.append(nxt)
            if i + 1 < steps:
                nxt = self.forward(nxt[:, None], fmt, cache)[:, -1].argmax(-1)
        return self.torch.stack(picks, 1)

    def forced(self, prompts, picks, fmt):
        """Teacher-forced picks: the argmax at every step fed F32 KV's picks (one pass)."""
        seq = self.torch.cat([prompts, picks[:, :-1]], 1)
        return self.forward(seq, fmt)[:, prompts.shape[1] - 1:].argmax(-1)


def text_prompts(text, s, n=32, length=48):
    """kv_quant_test's text_prompts(s): BOS + 48 bytes of held-out text, 8 sets of 32."""
    stride = (len(text) - length) // 256
    return [[1] + [b + 3 for b in text[(s * n + i) * stride:(s * n + i) * stride + length]] for i in range(n)]


def print_levels(d):
    print(f"Lloyd-Max levels for one coordinate of a random unit vector in d = {d} dimensions")
    print("(density ~ (1 - x^2)^((d-3)/2); times sqrt(d) in brackets, to compare with N(0, 1)'s)")
    for bits in (1, 2, 3, 4):
        lv, bd, mse, it = lloyd_max(d, bits)
        print(f"{bits} bits ({it} iterations): mse per coordinate {mse:.6e}, d * mse {d * mse:.5f}")
        print("  levels     " + " ".join(f"{v:+.6f}" for v in lv))
        print("  boundaries " + " ".join(f"{v:+.6f}" for v in bd))
        print("  levels * sqrt(d) [" + " ".join(f"{v * math.sqrt(d):+.4f}" for v in lv) + "]")


CXX_DIMS, CXX_BITS = (16, 32, 64, 128, 256), (2, 3, 4)


def cxx_levels():
    """The engine's tables (workers/engine/kv_rotation_levels.inc): the F32 levels and inner
    boundaries for every head dimension and width the kernels take, generated here once so the
    engine never computes them (lgamma and pow differ between libms)."""
    def literal(x):
        t = f"{float(np.float32(x)):.9g}"
        return (t if any(c in t for c in ".en") else t + ".0") + "f"

    def floats(v):
        return ", ".join(literal(x) for x in v)
    out = ["// Generated by `/usr/bin/python3 scripts/kv-quant-sim.py --cxx-levels`: do not edit.",
           "// The Lloyd-Max levels of one coordinate of a random unit vector in d dimensions (issue #23,",
           "// docs/KV_ROTATED.md), ascending, and the midpoints between them, as F32; included by",
           "// workers/engine/kv_rotation.cpp. tests/python/kv_rotation_test.py checks it is current.", ""]
    rows = []
    for d in CXX_DIMS:
        for bits in CXX_BITS:
            lv, bd, _, _ = lloyd_max(d, bits)
            # The midpoints of the F32 levels, rounded to F32: the boundaries the kernel compares with.
            lv32 = lv.astype(np.float32)
            bd32 = ((lv32[1:].astype(np.float64) + lv32[:-1]) / 2).astype(np.float32)
            out.append(f"constexpr float kLevels{d}x{bits}[] = {{{floats(lv32)}}};")
            out.append(f"constexpr float kBounds{d}x{bits}[] = {{{floats(bd32)}}};")
            rows.append(f"    {{{d}, {bits}, kLevels{d}x{bits}, kBounds{d}x{bits}}},")
    out += ["", "constexpr LevelTable kLevelTables[] = {"] + rows + ["};"]
    return "\n".join(out) + "\n"


def vector_errors(d, n=20000, seed=0):
    """Mean |x - x^|^2 / |x|^2 and bits per element of uniform (groups of min(64, d), F32 scale
    and bias) and rotated (F32 norm) codes on n Gaussian head vectors, and on the same vectors
    with coordinate 0 (an outlier channel, as keys often have) times 8. numpy only."""
    rng = np.random.default_rng(seed)
    g = min(64, d)
    R = rotation_matrix(1, 0, 0, d)
    rows = []
    for outlier in (1.0, 8.0):
        x = rng.standard_normal((n, d))
        x[:, 0] *= outlier
        rel = lambda y: float((((y - x) ** 2).sum(1) / (x**2).sum(1)).mean())
        for bits in (4, 3):
            xg = x.reshape(n, d // g, g)
            mn, mx = xg.min(-1, keepdims=True), xg.max(-1, keepdims=True)
            scale = (mx - mn) / ((1 << bits) - 1)
            uni = (np.round((xg - mn) / scale) * scale + mn).reshape(n, d)
            lv, bd, _, _ = lloyd_max(d, bits)
            norm = np.linalg.norm(x, axis=1, keepdims=True)
            rot = norm * lv[np.searchsorted(bd, (x / norm) @ R.T)] @ R
            rows.append((outlier, bits, rel(uni), bits + 64 / g, rel(rot), bits + 32 / d))
    return rows


def print_vector_errors():
    print("relative squared error per head vector, Gaussian coordinates (outlier: coordinate 0 x 8)")
    for d in (16, 64, 128):
        for outlier, bits, u, ub, r, rb in vector_errors(d):
            print(f"  d {d:3d}{' outlier' if outlier > 1 else '        '} {bits} bits: uniform g{min(64, d)} {u:.5f} "
                  f"({ub:.2f} bits/element)  rotated {r:.5f} ({rb:.2f} bits/element)")


def heldout_report(sim, formats):
    torch = sim.torch
    text = open("tests/data/heldout.txt", "rb").read()
    stride = (len(text) - 112) // 64
    toks = torch.tensor([[1] + [b + 3 for b in text[i * stride:i * stride + 111]] for i in range(64)])
    ks = []
    ref = sim.forward(toks, Format("f32"), stats=ks)
    print("K max/rms per layer", ks)
    a = ref.argmax(-1)
    top2 = ref.topk(2, -1).values
    gap = top2[..., 0] - top2[..., 1]
    print("gap<0.05: %.3f%%  gap<0.2: %.3f%%" % (100 * (gap < 0.05).double().mean(), 100 * (gap < 0.2).double().mean()))
    for fmt in formats:
        got = sim.forward(toks, fmt)
        err = (got - ref).abs().amax(-1)
        print("%-22s flips %.3f%%  max|dlogit| median %.4f p99 %.4f max %.4f" % (
            fmt.name(), 100 * (got.argmax(-1) != a).double().mean(), err.median(), err.quantile(0.99), err.max()))


def prompts_report(sim, formats, sets=8):
    torch, cfg = sim.torch, sim.cfg
    text = open("tests/data/heldout.txt", "rb").read()
    free = {f.name(): [] for f in formats}
    forced = {f.name(): [] for f in formats}
    for s in range(sets):
        prompts = torch.tensor(text_prompts(text, s))
        ref = sim.greedy(prompts, Format("f32"))
        for fmt in formats:
            free[fmt.name()].append((sim.greedy(prompts, fmt) == ref).double().mean().item())
            forced[fmt.name()].append((sim.forced(prompts, ref, fmt) == ref).double().mean().item())
            print(f"set {s} {fmt.name():26s} free-running {100 * free[fmt.name()][-1]:5.1f}%  "
                  f"teacher-forced {100 * forced[fmt.name()][-1]:5.1f}%", flush=True)
    print(f"\n{sets} sets x 32 prompts x 64 steps; bytes per token: all layers, K and V (the F32 window's "
          "tail blocks are per sequence, not per token)")
    print("| format | free-running mean | worst set | teacher-forced mean | worst set | bytes per token |")
    print("| --- | --- | --- | --- | --- | --- |")
    f32_bytes = Format("f32").bytes_per_token(cfg["n_layers"], cfg["n_kv_heads"], sim.hd)
    print(f"| f32 | 100 % | 100 % | 100 % | 100 % | {f32_bytes:g} |")
    for fmt in formats:
        fr, tf = free[fmt.name()], forced[fmt.name()]
        b = fmt.bytes_per_token(cfg["n_layers"], cfg["n_kv_heads"], sim.hd)
        print(f"| {fmt.name()} | {100 * sum(fr) / len(fr):.1f} % | {100 * min(fr):.1f} % | "
              f"{100 * sum(tf) / len(tf):.2f} % | {100 * min(tf):.2f} % | {b:g} ({f32_bytes / b:.2f}x fewer) |")


def parse_formats(spec):
    """'uniform:8,rotated:4:w0,rotated:3:f16,rotated:4:skip,rotated:4:s7' -> Formats."""
    out = []
    for item in spec.split(","):
        scheme, bits, *opts = item.split(":")
        fmt = Format(scheme, int(bits))
        for o in opts:
            if o.startswith("w"):
                fmt.window = int(o[1:])
            elif o == "skip":
                fmt.skip_last = True
            elif o == "fit":
                fmt.scale = "fit"
            elif o == "f16":
                fmt.norm = "f16"
            elif o.startswith("s"):
                fmt.seed = int(o[1:])
            else:
                raise SystemExit(f"unknown format option {o!r} in {item!r}")
        out.append(fmt)
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--prompts", action="store_true", help="greedy agreement over kv_quant_test's 8 prompt sets")
    ap.add_argument("--levels", action="store_true", help="print the Lloyd-Max levels and exit")
    ap.add_argument("--cxx-levels", action="store_true", help="print workers/engine/kv_rotation_levels.inc and exit")
    ap.add_argument("--sets", type=int, default=8)
    ap.add_argument("--formats", help="e.g. uniform:8,rotated:4,rotated:3:f16,rotated:4:w0,uniform:4:skip,rotated:4:s7")
    args = ap.parse_args()
    if args.cxx_levels:
        sys.stdout.write(cxx_levels())
        return
    if args.levels:
        print_levels(16)
        print_vector_errors()
        return
    sim = Sim()
    print_levels(sim.hd)
    if args.prompts:
        formats = parse_formats(args.formats or "uniform:8,uniform:4,rotated:4,rotated:3,rotated:2")
        prompts_report(sim, formats, args.sets)
    else:
        formats = parse_formats(args.formats or "uniform:8:w0,uniform:4:w0,rotated:4:w0,rotated:3:w0")
        heldout_report(sim, formats)


if __name__ == "__main__":
    main()
