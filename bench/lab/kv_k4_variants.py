"""Lab (issue 16 item 1): variants of the quantized K cache, teacher-forced argmax agreement with the f16 cache on
the CPU reference backend. Not part of the daemon; it patches ReferenceOps.attention in this process only.

    python bench/lab/kv_k4_variants.py --model M.gguf --text EVAL.py --calib CALIB.py [--tokens 512]
        [--calib-tokens 256] [--variants base,dcal,...] [--out FILE.json]
    python bench/lab/kv_k4_variants.py --self-test        # the window variants' checks on random data (no model)

How a variant is run: the cache is an f16 one (float32 rows) and the patched attention "fake-quantizes" each key
before it is stored: k_stored = decode(encode(R(k * D - c * D - o2))) and the query becomes R(q / D), R the
Hadamard rotation, c the model's key offset (kv_offset.py), D a per-(layer, KV head, channel) scale equal on each
RoPE pair (so it commutes with RoPE), o2 a per-layer second offset. decode(encode(x)) is exactly what a quantized
cache's rows read back (kv_quant.py), so `base` is today's K q4_0 path number for number. Per-layer K types and
keeping the first tokens' keys in q8_0 are a per-row choice of the encoder.

Shapes: q (n, H, d), k (n, Hkv, d) float32 after RoPE; D, c, o2 (n_layers, Hkv, d).

Variants (--variants, comma-separated; make_variants): base (today: offset c + rotation, ggml's q4_0; its number
is the daemon's before kv_quant_search.py), q8base, norot; dcal / dcal2 / dcalh (D = (E q^2 / E k^2)^(1/4) from the
calibration text, dcal2 rounded to powers of two, dcalh ^(1/8)), dw / dw2 (D from W_q, W_k row norms), off2 (second
offset: calibrated mean of k - c), dcal2off2; sink4 / sinkN (first N slots' K in q8_0), sink1f16 / sink4f16 (in
f16), sinkabs (slot 0's q4_0 error folded into c); l01q8, q8:a.b.c (those layers' K q8_0), only:a-b (q4_0 K in
layers a..b only, f16 elsewhere); mse (34 step factors, least squared error), search (the daemon's 8-factor
encoder, daemon/backends/kv_quant_search.py: only with bench/lab/kv_q4_searched_scale.patch applied), signs (random +-1 D: a randomized Hadamard), msedcal / msedcalh / searchdcal;
window variants (WindowVariant, names RULE[sinkM][+v4|+v4nw], WINDOW_NAME): RULE winN (a KIVI-style sliding
window, e.g. win32, win128: query row at slot p reads the keys of slots t > p - N in f16, older ones as base stores
them), blkU (a block-aligned window, e.g. blk128, blk256, blk512: slot t in f16 iff floor(t / U) == floor(p / U), the
current U-aligned block; a prefix ending on a multiple of U needs no f16 copies, rows early in a block see almost no
window) or base (no window); sinkM: also the first M slots' K in q8_0 as sinkM; +v4: V stored as q4_0 too (ggml's
plain q4_0 of the value rows, no offset or rotation), read in f16 inside the same window as K; +v4nw: V q4_0 with no
window (K keeps its own). base+v4 is today's K q4_0 + V q4_0. All per query row: a prefill chunk's row sees what a
one-row decode step at its slot would (--self-test checks it, and blk1 == win1, win0 == base, a window over the
whole context == the f16 cache, with or without +v4).
Each run prints argmax agreement and the mean KL(f16 || variant) in nats, a smoother figure: at 1024 tokens the
argmax count moves by 5-10 tokens between variants whose KL differs by under 5%. --layer-errors instead prints
each layer's local attention error on the calibration text.
"""
from __future__ import annotations

import argparse
import json
import re
import sys
import time

import numpy as np

from flashd.daemon.backends import reference as ref
from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_rotate

ORIG_ATTENTION = ref.ReferenceOps.attention
STATE = {"layer": 0, "hook": None}


def log(msg: str) -> None:
    print(f"[k4 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _begin_layer(self, index):
    STATE["layer"] = index


def _attention(self, q, k, v, cache_layer, batch):
    if STATE.get("capture") is not None:
        STATE["capture"].setdefault(STATE["layer"], []).append((q, k, v))
    hook = STATE["hook"]
    if isinstance(hook, WindowVariant):           # computes the attention itself (two key sets per row)
        return hook.attention(STATE["layer"], q, k, v, cache_layer, batch)
    if hook is not None:
        q, k = hook(STATE["layer"], int(batch.n_past[0]), q, k)
    return ORIG_ATTENTION(self, q, k, v, cache_layer, batch)


ref.ReferenceOps.begin_layer, ref.ReferenceOps.attention = _begin_layer, _attention


def fake_quant(x: np.ndarray, kind: str) -> np.ndarray:
    """What a kind cache row reads back: x (n, Hkv, d) float32 -> decode(encode(x))."""
    if kind == "q4_mse":
        return q4_mse(x)
    if kind == "q4_search":           # the patch's encoder (bench/lab/kv_q4_searched_scale.patch applied)
        from flashd.daemon.backends.kv_quant import dequantize_q4_0
        from flashd.daemon.backends.kv_quant_search import quantize_q4_0_searched
        return dequantize_q4_0(quantize_q4_0_searched(x)).reshape(x.shape)
    return x if kind == "f16" else decode_rows(encode_rows(x, kind), kind)


def q4_mse(x: np.ndarray, grid=np.linspace(0.70, 1.10, 17)) -> np.ndarray:
    """A q4_0 row (the same bytes format: d float16, codes 0..15, value d (q - 8)) whose scale is searched: d =
    f * amax / 8 of either sign for f in grid, codes round to nearest and clip; the d of least squared error per
    block wins. Returns what it reads back, x's shape."""
    b = x.reshape(-1, 32).astype(np.float32)
    first = np.abs(b).argmax(axis=1)[:, None]
    m = np.take_along_axis(b, first, axis=1)                     # (nb, 1) signed max
    best, best_err = None, None
    for sign in (-1.0, 1.0):
        for f in grid:
            d = (m * np.float32(sign * f / 8.0)).astype(np.float16).astype(np.float32)
            inv = np.where(d != 0, 1.0 / np.where(d != 0, d, 1), 0).astype(np.float32)
            qc = np.clip(np.round(b * inv) + 8, 0, 15)
            y = d * (qc - 8)
            err = ((y - b) ** 2).sum(1)
            if best is None:
                best, best_err = y, err
            else:
                take = err < best_err
                best[take], best_err[take] = y[take], err[take]
    return best.reshape(x.shape).astype(np.float32)


def pair_mean(e: np.ndarray, neox: bool) -> np.ndarray:
    """(..., d) per-channel energies -> the same, each RoPE pair's two channels given their mean (rope_dim = d)."""
    d = e.shape[-1]
    if neox:
        m = 0.5 * (e[..., :d // 2] + e[..., d // 2:])
        return np.concatenate([m, m], axis=-1)
    m = 0.5 * (e[..., 0::2] + e[..., 1::2])
    return np.repeat(m, 2, axis=-1)


class Variant:
    """One K storage scheme: scale D, offsets c + o2, a K type per layer, sink rows kept in sink_type."""

    def __init__(self, name, n_layers, c, D=None, o2=None, types=None, sink=0, sink_type="q8_0", rotate=True):
        self.name, self.c, self.D, self.o2 = name, c, D, o2
        self.types = types or ["q4_0"] * n_layers
        self.sink, self.sink_type, self.rotate = sink, sink_type, rotate

    def __call__(self, layer, n_past, q, k):
        q, k = self.transform(layer, q, k)
        return q, self.quantize(layer, n_past, k)

    def transform(self, layer, q, k):
        """q, k after the exact transforms (scale D, offset c + o2, rotation), float32: what is quantized."""
        D = None if self.D is None else self.D[layer]                       # (Hkv, d)
        off = self.c[layer] if self.c is not None else np.zeros(k.shape[1:], np.float32)
        if self.o2 is not None:
            off = off + self.o2[layer]
        if D is not None:
            group = q.shape[1] // k.shape[1]
            q = q / np.repeat(D, group, axis=0)[None]
            k = k * D[None]
            off = off * D
        k = (k - off).astype(np.float32)
        if self.rotate:
            q, k = hadamard_rotate(q), hadamard_rotate(k)
        return q.astype(np.float32), k

    def quantize(self, layer, n_past, k):
        """What the cache reads back for transformed keys k at slots n_past.. (the first `sink` slots in sink_type)."""
        out = fake_quant(k, self.types[layer])
        n_sink = max(0, min(self.sink - n_past, k.shape[0]))
        if n_sink:
            out[:n_sink] = fake_quant(k[:n_sink], self.sink_type)
        return out.astype(np.float32)


class WindowVariant(Variant):
    """A window of full-precision K (and V) rows per query row, the rest read back quantized. Query row i of a
    forward (slot p = n_past + i) reads key slot t <= p as f16 (the transformed key, float32 as the f16 cache is
    here) if t is in p's window, else as the variant stores it (q4_0; the first `sink` slots in sink_type). The
    window rule, `full_mask`: sliding (window W, winN: t > p - W, KIVI-style) or block-aligned (block U, blkU:
    floor(t / U) == floor(p / U), the current U-aligned block of the context in full precision, every completed block
    quantized: a prefix ending on a multiple of U needs no full-precision copies). v_type: the V cache's type (f16,
    or q4_0: plain ggml q4_0 of the value rows, no offset or rotation); a quantized V is read in full precision
    inside the same window when v_window, else everywhere quantized (+v4nw). Per query row, not per chunk: a prefill
    chunk's row sees what a one-row decode step at its slot would. The cache holds the transformed keys and the values
    unquantized, side arrays per layer what the quantized caches would read back; the attention is
    ReferenceOps.attention's arithmetic with each score (and each value row) taken from one of the two sets. An empty
    window (win0) is the variant's own path bit for bit (win0 = base; win0+v4 = base+v4); a window covering the whole
    context (winN, blkU with N, U >= the context) is the f16 cache with offset + rotation (the f16 run up to float32
    rounding), with V q4_0 too (+v4: the full-precision V rows are read, the quantized ones weigh 0 exactly)."""

    def __init__(self, name, n_layers, c, window=0, block=0, v_type="f16", v_window=True, **kw):
        super().__init__(name, n_layers, c, **kw)
        if window and block:
            raise ValueError("a sliding window or a block-aligned one, not both")
        self.window, self.block, self.v_type, self.v_window = window, block, v_type, v_window
        self.side, self.v_side = {}, {}

    def full_mask(self, n_past, n, n_ctx):
        """(n, n_ctx) bool: query row i (slot n_past + i) reads slot t in full precision (t > slot is masked
        anyway), and the first column any row reads so (n_ctx if none)."""
        p = (n_past + np.arange(n))[:, None]
        t = np.arange(n_ctx)[None, :]
        if self.block:
            full, lo = t // self.block == p // self.block, n_past // self.block * self.block
        else:
            full, lo = t > p - self.window, (max(0, n_past - self.window + 1) if self.window > 0 else n_ctx)
        return full, min(lo, n_ctx)

    def _side(self, store, layer, like):
        side = store.get(layer)
        if side is None or side.shape != like.shape:
            side = store[layer] = np.zeros(like.shape, np.float32)
        return side

    def attention(self, layer, q, k, v, cache_layer, batch):
        k_cache, v_cache = cache_layer
        q, k = self.transform(layer, q, k)
        n, n_heads, head_dim = q.shape
        n_kv_heads = k.shape[1]
        n_past = int(batch.n_past[0])
        if n_past + n > k_cache.shape[0]:
            raise ValueError(f"KV cache overflow: {n_past} + {n} > {k_cache.shape[0]} slots")
        side = self._side(self.side, layer, k_cache)
        k_cache[n_past:n_past + n] = k                           # before quantize (an f16 type returns k itself)
        v_cache[n_past:n_past + n] = v
        side[n_past:n_past + n] = self.quantize(layer, n_past, k)
        v_side = None
        if self.v_type != "f16":
            v_side = self._side(self.v_side, layer, v_cache)
            v_side[n_past:n_past + n] = fake_quant(np.asarray(v, np.float32), self.v_type)
        n_ctx = n_past + n
        visible = np.ones((n, n_ctx), dtype=bool)                # (n, T)
        new = np.tril(np.ones((n, n), bool)) if batch.mask is None else np.asarray(batch.mask, bool)
        visible[:, n_past:] = new
        full, lo = self.full_mask(n_past, n, n_ctx)              # (n, T): full-precision slots; columns lo.. hold any
        group = n_heads // n_kv_heads
        qg = q.reshape(n, n_kv_heads, group, head_dim)
        scale = np.float32(1.0 / np.sqrt(head_dim))
        scores = np.einsum("nkgd,tkd->kgnt", qg, side[:n_ctx]) * scale
        if lo < n_ctx:                                           # einsum's dot per (row, slot): slicing t is exact
            f16 = np.einsum("nkgd,tkd->kgnt", qg, k_cache[lo:n_ctx]) * scale
            scores[..., lo:] = np.where(full[None, None, :, lo:], f16, scores[..., lo:])
        scores = np.where(visible[None, None], scores, np.float32(-np.inf))
        scores -= scores.max(axis=-1, keepdims=True)
        probs = np.exp(scores)
        probs /= probs.sum(axis=-1, keepdims=True)
        if v_side is None:
            out = np.einsum("kgnt,tkd->nkgd", probs, v_cache[:n_ctx])
        elif not self.v_window or lo == n_ctx:
            out = np.einsum("kgnt,tkd->nkgd", probs, v_side[:n_ctx])
        else:                                                    # quantized rows outside the window, f16 inside
            fm = full[None, None]
            zero = np.float32(0)
            out = np.einsum("kgnt,tkd->nkgd", np.where(fm, zero, probs), v_side[:n_ctx])
            out += np.einsum("kgnt,tkd->nkgd", np.where(fm[..., lo:], probs[..., lo:], zero), v_cache[lo:n_ctx])
        return out.reshape(n, n_heads * head_dim).astype(np.float32, copy=False)


WINDOW_NAME = re.compile(r"(base|win\d+|blk\d+)(sink\d+)?(\+v4(nw)?)?")


def window_variant(name, n_layers, c):
    """A WindowVariant from its name (WINDOW_NAME): base | winN | blkU, then sinkM (the first M slots' K in q8_0),
    then +v4 (V q4_0, full precision in the K window) or +v4nw (V q4_0 everywhere); None if the name is not one."""
    m = WINDOW_NAME.fullmatch(name)
    if m is None:
        return None
    rule, sink, v4, nw = m.groups()
    window = int(rule[3:]) if rule.startswith("win") else 0
    block = int(rule[3:]) if rule.startswith("blk") else 0
    if rule.startswith("blk") and block < 1:
        raise ValueError(f"{name}: a block of at least 1 slot")
    return WindowVariant(name, n_layers, c, window=window, block=block, v_type="q4_0" if v4 else "f16",
                         v_window=not nw, sink=int(sink[4:]) if sink else 0)


def _log_softmax(x: np.ndarray) -> np.ndarray:
    x = x.astype(np.float64)
    x = x - x.max(-1, keepdims=True)
    return x - np.log(np.exp(x).sum(-1, keepdims=True))


class SinkAbsorb(Variant):
    """The slot-0 key absorbed into the offset: when slot 0 is written, c_eff = c + R (u - Q(u)), u = R (k_0 - c)
    (R the Hadamard rotation, its own inverse), so R (k_0 - c_eff) = Q(u) up to float32 rounding and the sink key
    reads back (nearly) exactly; every later key of the cache uses the same c_eff (a constant: softmax-exact)."""

    def __init__(self, name, n_layers, c, **kw):
        super().__init__(name, n_layers, c, **kw)
        self.c_model, self.c = c, c.copy()

    def __call__(self, layer, n_past, q, k):
        if n_past == 0:
            u = hadamard_rotate(k[:1] - self.c_model[layer])
            self.c[layer] = self.c_model[layer] + hadamard_rotate(u - fake_quant(u, self.types[layer]))[0]
        return super().__call__(layer, n_past, q, k)


def argmax_run(runner, ids, hook, ref_logp=None):
    """argmax (n,) int64 of every position; with ref_logp (a list of the f16 run's per-chunk log-probs, float16)
    also the mean KL(f16 || this) in nats (a smoother figure than the argmax count: 1 token = 0.1% at 1024).
    Without ref_logp and with hook None: (argmax, the per-chunk log-probs) for later runs."""
    STATE["hook"] = hook
    runner.reset()
    out, kls, keep = [], [], []
    for i, s in enumerate(range(0, len(ids), runner.prefill_chunk)):
        logits = np.asarray(runner.prefill(ids[s:s + runner.prefill_chunk], all_logits=True))
        out.append(np.argmax(logits, -1))
        if ref_logp is not None:
            p_ref = ref_logp[i].astype(np.float64)
            kls.append((np.exp(p_ref) * (p_ref - _log_softmax(logits))).sum(-1))
        elif hook is None:
            keep.append(_log_softmax(logits).astype(np.float16))
    runner.reset()
    STATE["hook"] = None
    top = np.concatenate(out)
    if ref_logp is not None:
        return top, float(np.concatenate(kls).mean())
    return (top, keep) if hook is None else top


def calibrate(runner, ids, c, neox):
    """From an f16 forward over ids: per (layer, KV head, channel) E[q^2] (summed over the group's heads), E[(k -
    c)^2], mean(k - c); each (n_layers, Hkv, d) float64. Returns also the per-layer rows (q, k) for the proxy."""
    acc = {}

    def cap(layer, n_past, q, k):
        n, h, d = q.shape
        hkv = k.shape[1]
        kc = k.astype(np.float64) - c[layer]
        qq = (q.astype(np.float64) ** 2).reshape(n, hkv, h // hkv, d).sum(2)
        a = acc.setdefault(layer, [0, 0.0, 0.0, 0.0])
        a[0] += n
        a[1] = a[1] + qq.sum(0)
        a[2] = a[2] + (kc ** 2).sum(0)
        a[3] = a[3] + kc.sum(0)
        return q, k

    argmax_run(runner, ids, cap)
    L = len(acc)
    q2 = np.stack([acc[i][1] / acc[i][0] for i in range(L)])
    k2 = np.stack([acc[i][2] / acc[i][0] for i in range(L)])
    km = np.stack([acc[i][3] / acc[i][0] for i in range(L)])
    return pair_mean(q2, neox), pair_mean(k2, neox), km


def balance_scale(q2, k2, alpha=0.25, pow2=False, clip=64.0):
    """D = (E q^2 / E k^2) ** alpha per channel (alpha 1/4 minimizes E|q/D|^2 * E|k D|^2), normalized to geometric
    mean 1 per head, clipped to [1/clip, clip]; pow2: rounded to a power of two (exact in float arithmetic)."""
    D = (np.maximum(q2, 1e-12) / np.maximum(k2, 1e-12)) ** alpha
    D = D / np.exp(np.log(D).mean(axis=-1, keepdims=True))
    D = np.clip(D, 1.0 / clip, clip)
    if pow2:
        D = 2.0 ** np.round(np.log2(D))
    return D.astype(np.float32)


def random_signs(n_layers, hkv, d, seed=16):
    """D = +-1 per channel (a randomized Hadamard: R = H diag(D), exact: a sign flip rounds nothing)."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random((n_layers, hkv, d)) < 0.5, -1.0, 1.0).astype(np.float32)


def weight_scale(lm, cfg, alpha=0.25, pow2=False):
    """D from the weights only: E q_i^2 ~ |W_q row i * g|^2 + b_q[i]^2 (g: attn_norm), E k_i^2 alike, per pair."""
    out = []
    hkv, d = cfg.n_kv_heads, cfg.head_dim
    for w in lm.weights.layers:
        g = np.asarray(w.attn_norm, np.float64)
        def energy(W, b, heads):
            W = np.asarray(W, np.float64) * g[None]
            e = (W ** 2).sum(1) + (0 if b is None else np.asarray(b, np.float64) ** 2)
            return e.reshape(heads, d)
        q2 = energy(w.attn_q, w.attn_q_bias, cfg.n_heads).reshape(hkv, -1, d).sum(1)
        out.append((q2, energy(w.attn_k, None, hkv)))     # k: the bias is the offset's, not counted
    q2 = pair_mean(np.stack([a for a, _ in out]), cfg.rope_neox)
    k2 = pair_mean(np.stack([b for _, b in out]), cfg.rope_neox)
    return balance_scale(q2, k2, alpha, pow2)


def _causal_attention(q, k, v):
    """q (n, H, d), k and v (n, Hkv, d) -> (n, H, d) float64, causal softmax(q k / sqrt(d)) v."""
    n, h, d = q.shape
    g = h // k.shape[1]
    qg = q.astype(np.float64).reshape(n, k.shape[1], g, d)
    s = np.einsum("nkgd,tkd->kgnt", qg, k.astype(np.float64)) / np.sqrt(d)
    s = np.where(np.tril(np.ones((n, n), bool))[None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("kgnt,tkd->nkgd", p, v.astype(np.float64)).reshape(n, h, d)


def layer_errors(runner, ids, variants):
    """Per layer and variant: |attn(q4 K) - attn(f16 K)| / |attn(f16 K)| (Frobenius) over ids from slot 0, each
    layer on the f16 forward's own q, k, v (no propagation): where a q4_0 K hurts locally."""
    if any(isinstance(var, WindowVariant) for var in variants):
        raise SystemExit("--layer-errors: window variants (winN, blkU, +v4) are not supported")
    STATE["capture"] = {}
    argmax_run(runner, ids, None)
    cap, STATE["capture"] = STATE["capture"], None
    out = {}
    for layer in sorted(cap):
        q, k, v = (np.concatenate([c[j] for c in cap[layer]]) for j in range(3))
        ref_o = _causal_attention(q, k, v)
        for var in variants:
            qv, kv = var(layer, 0, q, k)
            err = np.linalg.norm(_causal_attention(qv, kv, v) - ref_o) / np.linalg.norm(ref_o)
            out.setdefault(var.name, []).append(float(err))
    return out


def self_test(seed=16):
    """Random data, no model (--self-test). Returns the checks' lines; raises AssertionError on a failure.
    (1) Per-row semantics: every window rule and V type, a forward in chunks of 13 rows (crossing block and window
    edges) equals one-row decode steps, and both equal an independent per-row float64 evaluation of the rule
    (row p: K and V rows t <= p from the full-precision set where the rule says, else the quantized one).
    (2) Bit for bit: blk1 == win1 (each row's own slot only), blkU == winN for U, N >= the context, +v4 with a
    window covering the context == without it, win0 == base and win0+v4 == base+v4 (base through
    ReferenceOps.attention, the path the non-window variants take)."""
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    L, H, Hkv, d, T = 2, 4, 2, 128, 80
    c = rng.normal(size=(L, Hkv, d)).astype(np.float32)
    q = (rng.normal(size=(T, H, d)) * 3).astype(np.float32)
    k = (rng.normal(size=(T, Hkv, d)) * 2 + c[1]).astype(np.float32)
    v = rng.normal(size=(T, Hkv, d)).astype(np.float32)
    layer, lines = 1, []

    def run(var, chunk):
        kc, vc = np.zeros((T, Hkv, d), np.float32), np.zeros((T, Hkv, d), np.float32)
        out = []
        for s0 in range(0, T, chunk):
            batch = SimpleNamespace(n_past=np.array([s0], np.int32), mask=None)
            sl = slice(s0, s0 + chunk)
            if isinstance(var, WindowVariant):
                out.append(var.attention(layer, q[sl], k[sl], v[sl], (kc, vc), batch))
            else:                                     # the hook path of _attention
                qv, kv = var(layer, s0, q[sl], k[sl])
                out.append(ORIG_ATTENTION(ref.ReferenceOps(), qv, kv, v[sl], (kc, vc), batch))
        return np.concatenate(out)

    def per_row(var):
        qt, kt = var.transform(layer, q, k)
        kq = var.quantize(layer, 0, kt)
        vq = v if var.v_type == "f16" else fake_quant(v, var.v_type)
        out = np.zeros((T, H, d))
        g = H // Hkv
        for p in range(T):
            t = np.arange(p + 1)
            full = (t // var.block == p // var.block) if var.block else (t > p - var.window)
            keys = np.where(full[:, None, None], kt[:p + 1], kq[:p + 1]).astype(np.float64)
            vfull = full if var.v_window else np.zeros_like(full)
            vals = np.where(vfull[:, None, None], v[:p + 1], vq[:p + 1]).astype(np.float64)
            for h in range(H):
                sc = keys[:, h // g] @ qt[p, h].astype(np.float64) / np.sqrt(d)
                w = np.exp(sc - sc.max())
                out[p, h] = (w / w.sum()) @ vals[:, h // g]
        return out.reshape(T, H * d)

    names = ["win0", "win1", "win8", "win32", "blk1", "blk8", "blk16", "blk64", "win8+v4", "win8+v4nw", "blk8+v4",
             "blk16+v4", "blk16+v4nw", "blk16sink4+v4", "base+v4", "blk1000", "blk1000+v4", "win1000", "win1000+v4"]
    outs = {}
    for name in names:
        a, b = run(window_variant(name, L, c), 13), run(window_variant(name, L, c), 1)
        r = per_row(window_variant(name, L, c))
        e1 = float(np.abs(a - b).max() / np.abs(b).max())
        e2 = float(np.abs(a - r).max() / np.abs(r).max())
        assert e1 < 1e-5 and e2 < 1e-4, (name, e1, e2)
        outs[name] = a
        lines.append(f"{name}: chunks of 13 vs one-row steps max rel diff {e1:.1e}, vs per-row float64 {e2:.1e}")
    base, base_v4 = run(Variant("base", L, c), 13), outs["base+v4"]
    for x, y in [("blk1", "win1"), ("blk1000", "win1000"), ("blk1000+v4", "blk1000"), ("win1000+v4", "win1000"),
                 ("win0", "base")]:
        ox, oy = outs[x], base if y == "base" else outs[y]
        assert np.array_equal(ox, oy), (x, y, float(np.abs(ox - oy).max()))
        lines.append(f"{x} == {y} bit for bit")
    assert np.array_equal(run(window_variant("win0+v4", L, c), 13), base_v4)
    lines.append("win0+v4 == base+v4 bit for bit")
    for x, y in [("blk8", "win8"), ("blk16", "blk8"), ("blk16+v4", "blk16+v4nw"), ("blk16+v4", "blk16"),
                 ("blk16sink4+v4", "blk16+v4"), ("win8+v4", "win8+v4nw")]:     # the checks above can tell these apart
        e = float(np.abs(outs[x] - outs[y]).max() / np.abs(outs[y]).max())
        assert e > 1e-3, (x, y, e)
        lines.append(f"{x} vs {y}: max rel diff {e:.1e} (distinct)")
    f16 = ORIG_ATTENTION(ref.ReferenceOps(), q, k, v, (np.zeros_like(k), np.zeros_like(v)),
                         SimpleNamespace(n_past=np.array([0], np.int32), mask=None))
    for name in ["blk1000", "blk1000+v4", "base", "blk16", "blk16+v4", "blk16+v4nw", "base+v4"]:
        o = base if name == "base" else outs[name]
        lines.append(f"{name} vs the f16 cache (no offset, no rotation): max rel diff "
                     f"{float(np.abs(o - f16).max() / np.abs(f16).max()):.1e}")
    return lines


def load(args):
    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.backends import select_backend
    from flashd.daemon.backends.kv_offset import model_key_offsets
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes
    f, cfg = open_model(args.model)
    tok = Tokenizer.from_gguf(f.metadata_dict)
    ids = tok.encode(open(args.text).read())[:args.tokens]
    cal = tok.encode(open(args.calib).read())[:args.calib_tokens]
    backend = select_backend("cpu")
    lm = load_model((f, cfg), backend.ops.load_weight)
    max_ctx = max(len(ids), len(cal)) + 1
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, args.chunk)
    runner = backend.make_runner(cfg, lm.weights, max_ctx, args.chunk, plan)
    c = model_key_offsets(backend.ops, cfg, lm.weights)
    return lm, cfg, runner, ids, cal, c


def make_variants(names, lm, cfg, c, q2, k2, km):
    L = cfg.n_layers
    o2 = (km - 0).astype(np.float32)                      # calibration mean of k - c: a second offset
    table = {
        "base": lambda: Variant("base", L, c),
        "q8base": lambda: Variant("q8base", L, c, types=["q8_0"] * L),
        "norot": lambda: Variant("norot", L, c, rotate=False),
        "dcal": lambda: Variant("dcal", L, c, D=balance_scale(q2, k2)),
        "dcal2": lambda: Variant("dcal2", L, c, D=balance_scale(q2, k2, pow2=True)),
        "dcalh": lambda: Variant("dcalh", L, c, D=balance_scale(q2, k2, alpha=0.125)),
        "dw2": lambda: Variant("dw2", L, c, D=weight_scale(lm, cfg, pow2=True)),
        "dw": lambda: Variant("dw", L, c, D=weight_scale(lm, cfg)),
        "off2": lambda: Variant("off2", L, c, o2=o2),
        "dcal2off2": lambda: Variant("dcal2off2", L, c, D=balance_scale(q2, k2, pow2=True), o2=o2),
        "q8dcal2": lambda: Variant("q8dcal2", L, c, D=balance_scale(q2, k2, pow2=True), types=["q8_0"] * L),
        "mse": lambda: Variant("mse", L, c, types=["q4_mse"] * L),
        "search": lambda: Variant("search", L, c, types=["q4_search"] * L),
        "searchdcal": lambda: Variant("searchdcal", L, c, D=balance_scale(q2, k2), types=["q4_search"] * L),
        "msedcal": lambda: Variant("msedcal", L, c, D=balance_scale(q2, k2), types=["q4_mse"] * L),
        "msedcalh": lambda: Variant("msedcalh", L, c, D=balance_scale(q2, k2, alpha=0.125), types=["q4_mse"] * L),
        "signs": lambda: Variant("signs", L, c, D=random_signs(L, cfg.n_kv_heads, cfg.head_dim)),
        "sink4": lambda: Variant("sink4", L, c, sink=4),
        "sinkabs": lambda: SinkAbsorb("sinkabs", L, c),
        "sink4f16": lambda: Variant("sink4f16", L, c, sink=4, sink_type="f16"),
        "sink1f16": lambda: Variant("sink1f16", L, c, sink=1, sink_type="f16"),
        "l01q8": lambda: Variant("l01q8", L, c, types=["q8_0"] * 2 + ["q4_0"] * (L - 2)),
    }
    for n in names:                 # only:a-b: q4_0 in layers a..b, f16 elsewhere; q8:a.b.c: those layers q8_0
        if n.startswith("only:"):
            a, b = map(int, n[5:].split("-"))
            table[n] = lambda n=n, a=a, b=b: Variant(n, L, c, types=["q4_0" if a <= i <= b else "f16"
                                                                      for i in range(L)])
        elif n.startswith("q8:"):
            sel = {int(x) for x in n[3:].split(".")}
            table[n] = lambda n=n, sel=sel: Variant(n, L, c, types=["q8_0" if i in sel else "q4_0" for i in range(L)])
        elif n.startswith("sink") and n not in table:
            table[n] = lambda n=n: Variant(n, L, c, sink=int(n[4:]))
        elif n not in table and WINDOW_NAME.fullmatch(n):    # winN / blkU / base, [sinkM], [+v4 | +v4nw]
            table[n] = lambda n=n: window_variant(n, L, c)
    return [table[n]() for n in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--text")
    ap.add_argument("--calib")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--calib-tokens", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--variants", default="base,dcal2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--layer-errors", action="store_true", help="per-layer local attention error on the calib text")
    ap.add_argument("--self-test", action="store_true", help="the window variants' checks on random data, no model")
    args = ap.parse_args(argv)
    if args.self_test:
        for line in self_test():
            log(line)
        return 0
    if not (args.model and args.text and args.calib):
        ap.error("--model, --text and --calib are required (but for --self-test)")
    t0 = time.perf_counter()
    lm, cfg, runner, ids, cal, c = load(args)
    log(f"loaded in {time.perf_counter() - t0:.0f} s; eval {len(ids)} tokens, calib {len(cal)}")
    t0 = time.perf_counter()
    q2, k2, km = calibrate(runner, cal, c, cfg.rope_neox)
    log(f"calibrated in {time.perf_counter() - t0:.0f} s")
    if args.layer_errors:
        errs = layer_errors(runner, cal, make_variants(args.variants.split(","), lm, cfg, c, q2, k2, km))
        for name, e in errs.items():
            log(f"{name}: per-layer relative attention error " + " ".join(f"{x:.4f}" for x in e))
        if args.out:
            json.dump(errs, open(args.out, "w"), indent=1)
        return 0
    t0 = time.perf_counter()
    f16, ref_logp = argmax_run(runner, ids, None)
    log(f"f16 in {time.perf_counter() - t0:.0f} s")
    results, kl, differ, secs = {}, {}, {}, {}
    for var in make_variants(args.variants.split(","), lm, cfg, c, q2, k2, km):
        t0 = time.perf_counter()
        top, kl[var.name] = argmax_run(runner, ids, var, ref_logp)
        results[var.name], differ[var.name] = float(np.mean(top == f16)), int((top != f16).sum())
        secs[var.name] = round(time.perf_counter() - t0, 1)
        log(f"{var.name}: {100 * results[var.name]:.2f}% ({differ[var.name]} of {len(ids)} differ), "
            f"KL {kl[var.name]:.5f} nats, in {secs[var.name]:.0f} s")
        if args.out:
            json.dump({"tokens": len(ids), "calib_tokens": len(cal), "agreement": results, "kl_nats": kl,
                       "differ": differ, "seconds": secs}, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
