"""The quantized-K variants of the lab bench/lab/kv_k4_variants.py (which runs them): what a cache of each variant
reads back (fake_quant, q4_mse), the exact transforms and encoders (Variant), the full-precision windows
(WindowVariant: sliding winN and block-aligned blkU, V q4_0 with +v4 / +v4nw) and a first-slot absorber
(SinkAbsorb). Shapes: q (n, H, d), k (n, Hkv, d) float32 after RoPE; D, c, o2 (n_layers, Hkv, d).
"""
from __future__ import annotations

import re

import numpy as np

from flashd.daemon.backends.kv_quant import decode_rows, encode_rows
from flashd.daemon.backends.kv_rotate import hadamard_rotate

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
