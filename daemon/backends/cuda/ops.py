"""CudaOps: the `Ops` interface on the GPU through libflashd_cuda.

Weights stay in their GGUF formats on the device (`QuantWeight`); activations are float32 tensors
taken from a bump arena that the runner resets before every forward, so a replayed forward uses
the same addresses (CUDA-graph capture of the decode step).

Fusion without changing the model code: `rmsnorm` of a hidden state returns a pending `Normed`
that the next projection applies in its prologue, and `rope` returns a pending `Roped` that
`attention` applies while it writes the KV cache. A one-row step without a mask (the decode step) runs
rope, the K/V write and attention in one op, `fd_attention_decode_rope` (`fuse_decode_rope`; q and k
are then not rotated in place: nothing reads them after attention); other batches run
`fd_rope_kv_write` first, then their attention kernel. Batches of up to GEMV_MAX_ROWS tokens use the
quantized GEMV kernels (decode, speculative verification); larger ones dequantize each weight to
float16 into a scratch buffer and run the tensor-core GEMM (prefill).

Row invariance (speculative decoding is exact on the GPU): a forward begun with
`begin_forward(row_invariant=True)` computes every row exactly as a one-row decode step would --
projections stay on the GEMV kernels in groups of up to 8 rows (whose per-row arithmetic does not
depend on the group size), and masked attention splits each token's keys like decode attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import Batch, KVCacheSpec
from .kv_cache import CudaKVCache
from .tensor import Arena, Device, DeviceTensor

__all__ = ["CudaOps", "QuantWeight", "CudaKVCache", "GEMV_MAX_ROWS", "MAX_MASKED_TOKENS", "attention_workspace_bytes",
           "rope_scaling_struct"]


def rope_scaling_struct(ffi, scaling, rope_dim: int, theta: float):
    """The C ABI's `const fd_rope_scaling_t*` for a models.config.RopeScaling (NULL for None): the numbers
    of RopeScaling.rope_params, which ReferenceOps.rope uses too, checked here before they cross."""
    if scaling is None:
        return ffi.NULL
    params = scaling.rope_params(int(rope_dim), float(theta))
    freq_scale, ext_factor, low, high, mscale = params
    if not (np.isfinite(params).all() and freq_scale > 0 and ext_factor >= 0 and mscale > 0):
        raise ValueError(f"RoPE scaling parameters out of range: {params}")
    return ffi.new("fd_rope_scaling_t*", {"freq_scale": freq_scale, "ext_factor": ext_factor, "corr_low": low,
                                          "corr_high": high, "mscale": mscale})

GEMV_MAX_ROWS = 8             # fd_gemv handles up to 8 input rows
DECODE_CHUNK_SLOTS = 64       # split-K chunk of the decode attention (measured: faster at short depth, same at 32K)
MAX_MASKED_TOKENS = 65        # masked attention's workspace: a tree of a root + 64 drafted nodes, a DFlash block


def attention_workspace_bytes(lib, n_heads: int, n_kv_heads: int, head_dim: int, max_ctx: int,
                              n_tokens: int = MAX_MASKED_TOKENS) -> int:
    """Bytes of the attention workspace for decode and for masked batches of up to n_tokens."""
    return max(int(lib.fd_attention_decode_workspace_bytes(n_heads, head_dim, max_ctx, DECODE_CHUNK_SLOTS)),
               int(lib.fd_attention_workspace_bytes(n_tokens, n_heads, n_kv_heads, head_dim, max_ctx,
                                                    DECODE_CHUNK_SLOTS)))


def gemv_groups(n: int):
    """(start, end) of the row groups the GEMV kernels take: up to GEMV_MAX_ROWS rows each."""
    return ((s, min(n, s + GEMV_MAX_ROWS)) for s in range(0, n, GEMV_MAX_ROWS))


@dataclass(slots=True, eq=False)
class QuantWeight:
    """A 2-D GGUF weight resident on the device in its stored format."""

    data: DeviceTensor        # uint8, the raw blocks
    qtype: int                # GGML type id
    rows: int
    cols: int

    @property
    def shape(self) -> tuple[int, int]:
        return (self.rows, self.cols)

    @property
    def nbytes(self) -> int:
        return self.data.nbytes


@dataclass(slots=True, eq=False)
class Normed:
    """rmsnorm(x) * weight, not yet computed."""

    x: DeviceTensor
    weight: DeviceTensor
    eps: float

    @property
    def shape(self):
        return self.x.shape


@dataclass(slots=True, eq=False)
class Roped:
    """x with RoPE at `positions`, not yet applied (attention applies it in place)."""

    x: DeviceTensor
    positions: DeviceTensor
    theta: float
    rope_dim: int
    neox: bool
    scaling: object = None         # models.config.RopeScaling (linear / YaRN) or None

    @property
    def shape(self):
        return self.x.shape


class CudaOps:
    name = "cuda"

    def __init__(self, device: Device):
        self.dev = device
        self.lib, self.ffi = device.lib, device.ffi
        self.arena: Arena | None = None          # sized by reserve_arena (the memory plan)
        self.scratch_elems = 0
        self.scratch: list[DeviceTensor] = []
        self.attn_workspace: DeviceTensor | None = None
        self.row_invariant = False               # this forward's mode (begin_forward)
        # one-row unmasked attention as fd_attention_decode_rope (bit for bit fd_rope_kv_write +
        # fd_attention_decode, one launch fewer per layer); False: the two kernels (tests, benchmarks)
        self.fuse_decode_rope = True
        self.trace: list | None = None           # (op name, event) after every launch (bench/profile_decode.py)
        self._rope_scaling_structs: dict = {}    # (RopeScaling, rope_dim, theta) -> fd_rope_scaling_t* (rope_scaling_arg)

    # -- planning --------------------------------------------------------------------------------
    def reserve_arena(self, half_bytes: int) -> None:
        if self.arena is None or self.arena.half_bytes < half_bytes:
            self.arena = None
            self.arena = Arena(self.dev, half_bytes)

    def reserve_scratch(self, n_elems: int) -> None:
        """Two float16 buffers of n_elems for dequantized weights (the GEMM path; two for SwiGLU)."""
        if n_elems > self.scratch_elems:
            self.scratch = [self.dev.empty((n_elems,), np.float16) for _ in range(2)]
            self.scratch_elems = n_elems

    def reserve_attention(self, n_heads: int, n_kv_heads: int, head_dim: int, max_ctx: int,
                          n_tokens: int = MAX_MASKED_TOKENS) -> None:
        """Grow the shared attention workspace to cover this shape (a new buffer: graphs that
        captured the old one must be dropped, see engine.py)."""
        n = attention_workspace_bytes(self.lib, n_heads, n_kv_heads, head_dim, max_ctx, n_tokens)
        if self.attn_workspace is None or self.attn_workspace.nbytes < n:
            self.attn_workspace = None
            self.attn_workspace = self.dev.empty((max(int(n), 16),), np.uint8)

    def begin_forward(self, row_invariant: bool = False) -> None:
        self.arena.reset()
        self.row_invariant = row_invariant

    def begin_layer(self, index: int) -> None:
        self.arena.switch(index)

    # -- memory ----------------------------------------------------------------------------------
    def _check(self, status: int, what: str) -> None:
        if status:
            self.dev.native.check(status, what)
        if self.trace is not None:               # profiling: a timing event after each launch
            ev = self.ffi.new("void**")
            self.dev.native.check(self.lib.fd_event_create(ev, 1), "event create")
            self.dev.native.check(self.lib.fd_event_record_external(ev[0], self.dev.stream), "event record")
            self.trace.append((what, ev[0]))

    def load_weight(self, info):
        host = np.asarray(info.blocks)
        if len(info.shape) == 1:                       # norms, biases: float32 on the device
            from gguf.quants import dequantize
            vec = dequantize(host, info.qtype).reshape(-1).astype(np.float32)
            return self.dev.upload(vec)
        rows, cols = info.shape
        data = self.dev.upload(host.view(np.uint8).reshape(-1))
        return QuantWeight(data=data, qtype=int(info.qtype), rows=rows, cols=cols)

    def kv_cache(self, spec: KVCacheSpec) -> CudaKVCache:
        return CudaKVCache(self.dev, spec)

    def from_numpy(self, array: np.ndarray) -> DeviceTensor:
        return self.dev.upload(np.ascontiguousarray(array))

    def to_numpy(self, t) -> np.ndarray:
        return self.dev.download(self.materialize(t))

    def take(self, shape, dtype=np.float32) -> DeviceTensor:
        return self.arena.take(tuple(shape), dtype)

    def p(self, t, ctype="void*"):
        return self.dev.p(t, ctype)

    # -- pending values --------------------------------------------------------------------------
    def materialize(self, t):
        if isinstance(t, Normed):
            rows = t.x.size // t.x.shape[-1]
            out = self.take(t.x.shape)
            self._check(self.lib.fd_rmsnorm(self.p(out, "float*"), self.p(t.x, "float*"), self.p(t.weight, "float*"),
                                            rows, t.x.shape[-1], t.eps, self.dev.stream), "fd_rmsnorm")
            return out
        if isinstance(t, Roped):
            raise TypeError("a RoPE'd tensor can only be consumed by attention")
        return t

    @staticmethod
    def _norm_parts(x):
        return (x.x, x.weight, x.eps) if isinstance(x, Normed) else (x, None, 0.0)

    # -- math ------------------------------------------------------------------------------------
    def embed(self, table: QuantWeight, ids: DeviceTensor) -> DeviceTensor:
        n = ids.shape[0]
        out = self.take((n, table.cols))
        self._check(self.lib.fd_embed(self.p(out, "float*"), self.p(table.data), table.qtype, table.rows, table.cols,
                                      self.p(ids, "int32_t*"), n, self.dev.stream), "fd_embed")
        return out

    def rmsnorm(self, x, weight, eps: float):
        if x.ndim == 2 and not isinstance(x, Normed):
            return Normed(x, weight, float(eps))       # fused into the consumer's prologue
        return self.materialize(Normed(self.materialize(x), weight, float(eps)))

    def _dequant(self, w: QuantWeight, slot: int) -> DeviceTensor:
        n = w.rows * w.cols
        if n > self.scratch_elems:
            raise MemoryError(f"weight scratch of {self.scratch_elems} elements is smaller than {w.rows}x{w.cols}")
        buf = self.scratch[slot]
        self._check(self.lib.fd_dequant_f16(self.p(buf), self.p(w.data), w.qtype, w.rows, w.cols, self.dev.stream),
                    "fd_dequant_f16")
        return buf

    def _on_gemv(self, n: int) -> bool:
        """Projections of n rows run on the GEMV kernels: decode-sized batches, and every batch of a
        row-invariant forward (tree verification); other batches take the GEMM."""
        return n <= GEMV_MAX_ROWS or self.row_invariant

    def linear(self, x, weight: QuantWeight, bias=None, residual=None) -> DeviceTensor:
        n = x.shape[0]
        y = self.take((n, weight.rows))
        if self._on_gemv(n) or weight.rows * weight.cols > self.scratch_elems:
            # GEMV in groups of up to 8 rows: decode, verification, and weights too large for the
            # dequantization scratch (the lm_head when every position's logits are wanted)
            xs, norm_w, eps = self._norm_parts(x)
            for s, e in gemv_groups(n):
                self._check(self.lib.fd_gemv(self.p(y[s:e], "float*"), self.p(weight.data), weight.qtype, weight.rows,
                                             weight.cols, self.p(xs[s:e], "float*"), e - s, self.p(norm_w, "float*"),
                                             eps, self.p(bias, "float*"),
                                             self.p(None if residual is None else residual[s:e], "float*"),
                                             self.dev.stream), "fd_gemv")
            return y
        xm = self.materialize(x)
        w16 = self._dequant(weight, 0)
        self._check(self.lib.fd_gemm_f16(self.p(y, "float*"), self.p(xm, "float*"), self.p(w16), n, weight.rows,
                                         weight.cols, self.p(bias, "float*"), self.p(residual, "float*"),
                                         self.dev.stream), "fd_gemm_f16")
        return y

    def linears(self, x, weights, biases) -> tuple:
        n = x.shape[0]
        if not self._on_gemv(n):
            xm = self.materialize(x)
            return tuple(self.linear(xm, w, b) for w, b in zip(weights, biases))
        outs = [self.take((n, w.rows)) for w in weights]
        xs, norm_w, eps = self._norm_parts(x)
        k = len(weights)
        ws = self.ffi.new("void*[]", [self.p(w.data) for w in weights])
        qt = self.ffi.new("int[]", [w.qtype for w in weights])
        rows = self.ffi.new("int[]", [w.rows for w in weights])
        bs = self.ffi.new("float*[]", [self.p(b, "float*") for b in biases])
        for s, e in gemv_groups(n):
            ys = self.ffi.new("float*[]", [self.p(o[s:e], "float*") for o in outs])
            self._check(self.lib.fd_gemv_multi(k, ys, ws, qt, rows, bs, weights[0].cols, self.p(xs[s:e], "float*"),
                                               e - s, self.p(norm_w, "float*"), eps, self.dev.stream), "fd_gemv_multi")
        return tuple(outs)

    def swiglu_linear(self, x, w_gate: QuantWeight, w_up: QuantWeight) -> DeviceTensor:
        n = x.shape[0]
        y = self.take((n, w_gate.rows))
        if self._on_gemv(n):
            xs, norm_w, eps = self._norm_parts(x)
            for s, e in gemv_groups(n):
                self._check(self.lib.fd_gemv_swiglu(self.p(y[s:e], "float*"), self.p(w_gate.data), w_gate.qtype,
                                                    self.p(w_up.data), w_up.qtype, w_gate.rows, w_gate.cols,
                                                    self.p(xs[s:e], "float*"), e - s, self.p(norm_w, "float*"), eps,
                                                    self.dev.stream), "fd_gemv_swiglu")
            return y
        xm = self.materialize(x)
        g16, u16 = self._dequant(w_gate, 0), self._dequant(w_up, 1)
        self._check(self.lib.fd_gemm_swiglu_f16(self.p(y, "float*"), self.p(xm, "float*"), self.p(g16), self.p(u16),
                                                n, w_gate.rows, w_gate.cols, self.dev.stream), "fd_gemm_swiglu_f16")
        return y

    def rope(self, x, positions, theta: float, rope_dim: int, neox: bool, scaling=None) -> Roped:
        return Roped(self.materialize(x), positions, float(theta), int(rope_dim), bool(neox), scaling)

    def rope_scaling_arg(self, r: Roped):
        """The `const fd_rope_scaling_t*` of a Roped: NULL without scaling, else a struct holding
        RopeScaling.rope_params (the numbers ReferenceOps.rope uses), kept alive here."""
        if r.scaling is None:
            return self.ffi.NULL
        key = (r.scaling, r.rope_dim, r.theta)
        if key not in self._rope_scaling_structs:
            self._rope_scaling_structs[key] = rope_scaling_struct(self.ffi, r.scaling, r.rope_dim, r.theta)
        return self._rope_scaling_structs[key]

    def attention(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, batch: Batch) -> DeviceTensor:
        if not (isinstance(q, Roped) and isinstance(k, Roped)):
            raise TypeError("CudaOps.attention expects q and k from ops.rope")
        k_cache, v_cache = cache_layer
        n, n_heads, head_dim = q.x.shape
        n_kv_heads, max_ctx = k_cache.shape[0], k_cache.shape[1]
        lib, s = self.lib, self.dev.stream
        scale = float(1.0 / np.sqrt(head_dim))
        if n == 1 and batch.mask is None and self.fuse_decode_rope:
            return self.attention_decode_rope(q, k, v, cache_layer, batch.n_past, scale)
        self._check(lib.fd_rope_kv_write(self.p(q.x, "float*"), self.p(k.x, "float*"), self.p(v, "float*"),
                                         self.p(k_cache), self.p(v_cache), self.p(q.positions, "int32_t*"),
                                         self.p(batch.n_past, "int32_t*"), n, n_heads, n_kv_heads, head_dim,
                                         q.rope_dim, q.theta, int(q.neox), self.rope_scaling_arg(q), max_ctx, s),
                    "fd_rope_kv_write")
        o = self.take((n, n_heads * head_dim))
        common = (self.p(k_cache), self.p(v_cache))
        if batch.mask is not None:
            ws = self.attn_workspace
            need = int(lib.fd_attention_workspace_bytes(n, n_heads, n_kv_heads, head_dim, max_ctx, DECODE_CHUNK_SLOTS))
            if ws is None or ws.nbytes < need:
                raise RuntimeError(f"masked attention over {n} tokens needs a {need}-byte workspace, reserved "
                                   f"{0 if ws is None else ws.nbytes} (CudaOps.reserve_attention(..., n_tokens))")
            self._check(lib.fd_attention_masked(self.p(o, "float*"), self.p(q.x, "float*"), *common,
                                                self.p(batch.mask, "uint8_t*"), self.p(batch.n_past, "int32_t*"), n,
                                                n_heads, n_kv_heads, head_dim, max_ctx, DECODE_CHUNK_SLOTS, scale,
                                                self.p(ws), ws.nbytes, s), "fd_attention_masked")
        elif n == 1:
            self._check(lib.fd_attention_decode(self.p(o, "float*"), self.p(q.x, "float*"), *common,
                                                self.p(batch.n_past, "int32_t*"), n_heads, n_kv_heads, head_dim,
                                                max_ctx, DECODE_CHUNK_SLOTS, scale, self.p(self.attn_workspace), s),
                        "fd_attention_decode")
        else:
            self._check(lib.fd_attention_prefill(self.p(o, "float*"), self.p(q.x, "float*"), *common,
                                                 self.p(batch.n_past, "int32_t*"), n, n_heads, n_kv_heads, head_dim,
                                                 max_ctx, scale, s), "fd_attention_prefill")
        return o

    def attention_decode_rope(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, n_past: DeviceTensor,
                              scale: float) -> DeviceTensor:
        """One new token: RoPE of q and k at q.positions, K/V stored at cache slot *n_past, and split-K
        attention over slots [0, *n_past], in one op (fd_attention_decode_rope). q (1, H, d), k and v
        (1, Hkv, d) as projected; they are left unrotated. Returns o (1, H * d)."""
        k_cache, v_cache = cache_layer
        _, n_heads, head_dim = q.x.shape
        n_kv_heads, max_ctx = k_cache.shape[0], k_cache.shape[1]
        if q.x.shape[0] != 1 or k.x.shape != (1, n_kv_heads, head_dim) or tuple(v.shape) != (1, n_kv_heads, head_dim):
            raise ValueError(f"attention_decode_rope: q {q.x.shape}, k {k.x.shape}, v {tuple(v.shape)} do not fit "
                             f"one token over a cache of {k_cache.shape}")
        if tuple(v_cache.shape) != tuple(k_cache.shape) or k_cache.shape[2] != head_dim or n_heads % n_kv_heads:
            raise ValueError(f"attention_decode_rope: caches {k_cache.shape} / {v_cache.shape} vs q {q.x.shape}")
        if ((k.rope_dim, k.theta, k.neox, k.scaling) != (q.rope_dim, q.theta, q.neox, q.scaling)
                or k.positions.ptr != q.positions.ptr):
            raise ValueError("attention_decode_rope: q and k must be roped alike (one position, one rope)")
        ws = self.attn_workspace
        if ws is None:
            raise RuntimeError("attention workspace not reserved (CudaOps.reserve_attention)")
        o = self.take((1, n_heads * head_dim))
        self._check(self.lib.fd_attention_decode_rope(
            self.p(o, "float*"), self.p(q.x, "float*"), self.p(k.x, "float*"), self.p(v, "float*"), self.p(k_cache),
            self.p(v_cache), self.p(q.positions, "int32_t*"), self.p(n_past, "int32_t*"), n_heads, n_kv_heads,
            head_dim, max_ctx, DECODE_CHUNK_SLOTS, scale, q.rope_dim, q.theta, int(q.neox), self.rope_scaling_arg(q),
            self.p(ws), self.dev.stream), "fd_attention_decode_rope")
        return o

    def sparse_attention(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, batch: Batch, step) -> DeviceTensor:
        """FlashPrefill: mean_K -> normalised block scores -> select -> block-sparse attention
        (native/cuda/flashprefill.cu, attention_sparse.cu); scratch from the arena."""
        if not (isinstance(q, Roped) and isinstance(k, Roped)):
            raise TypeError("CudaOps.sparse_attention expects q and k from ops.rope")
        k_cache, v_cache = cache_layer
        n, n_heads, head_dim = q.x.shape
        n_kv_heads, max_ctx = k_cache.shape[0], k_cache.shape[1]
        lib, s, p0 = self.lib, self.dev.stream, step.p0
        self._check(lib.fd_rope_kv_write(self.p(q.x, "float*"), self.p(k.x, "float*"), self.p(v, "float*"),
                                         self.p(k_cache), self.p(v_cache), self.p(q.positions, "int32_t*"),
                                         self.p(batch.n_past, "int32_t*"), n, n_heads, n_kv_heads, head_dim,
                                         q.rope_dim, q.theta, int(q.neox), self.rope_scaling_arg(q), max_ctx, s),
                    "fd_rope_kv_write")
        n_kb, n_qb = -(-(p0 + n) // 128), -(-n // 128)
        mean_k = self.take((n_kb, n_kv_heads, head_dim))
        score = self.take((n_qb, n_heads, n_kb))
        idx = self.take((n_qb, n_heads, n_kb), np.int32)
        cnt = self.take((n_qb, n_heads), np.int32)
        o = self.take((n, n_heads * head_dim))
        scale = float(1.0 / np.sqrt(head_dim))
        self._check(lib.fd_fp_mean_k(self.p(mean_k, "float*"), self.p(k_cache), p0 + n, n_kv_heads, head_dim,
                                     max_ctx, s), "fd_fp_mean_k")
        self._check(lib.fd_fp_score(self.p(score, "float*"), self.p(q.x, "float*"), self.p(mean_k, "float*"), p0, n,
                                    n_heads, n_kv_heads, head_dim, scale, s), "fd_fp_score")
        self._check(lib.fd_fp_select(self.p(idx, "int32_t*"), self.p(cnt, "int32_t*"), self.p(score, "float*"), p0, n,
                                     n_heads, step.alpha, step.sink_blocks, step.window_blocks,
                                     step.first_full_block, s), "fd_fp_select")
        self._check(lib.fd_fp_sparse_fwd(self.p(o, "float*"), self.p(q.x, "float*"), self.p(k_cache), self.p(v_cache),
                                         p0, n, n_heads, n_kv_heads, head_dim, max_ctx, scale,
                                         self.p(idx, "int32_t*"), self.p(cnt, "int32_t*"), s), "fd_fp_sparse_fwd")
        return o

    def tail_max_probs(self, q, cache_layer, n_keys: int, n_tail: int, acc: DeviceTensor) -> None:
        qx = q.x if isinstance(q, Roped) else q          # rotated in place by the attention call
        n, n_heads, head_dim = qx.shape
        k_cache = cache_layer[0]
        ws = self.take((2 * n_tail * n_heads,))
        self._check(self.lib.fd_fp_tail_max_probs(self.p(acc, "float*"), self.p(qx[n - n_tail:], "float*"),
                                                  self.p(k_cache), n_keys, n_tail, n_heads, k_cache.shape[0],
                                                  head_dim, k_cache.shape[1], float(1.0 / np.sqrt(head_dim)),
                                                  self.p(ws, "float*"), self.dev.stream), "fd_fp_tail_max_probs")

    def release(self) -> None:
        """Drop the arena, weight scratch and attention workspace (parking): their device memory is
        freed once no tensor refers to it; reserve_* allocates them again."""
        self.arena = None
        self.scratch, self.scratch_elems = [], 0
        self.attn_workspace = None

    def kv_write(self, k: Roped, v: DeviceTensor, cache_layer, start: DeviceTensor) -> None:
        if not isinstance(k, Roped):
            raise TypeError("CudaOps.kv_write expects k from ops.rope")
        k_cache, v_cache = cache_layer
        n, n_kv_heads, head_dim = k.x.shape
        # fd_rope_kv_write with q = NULL (n_heads is then unused; it must only be positive):
        # rotate k, store k and v at slots *start + i
        self._check(self.lib.fd_rope_kv_write(self.ffi.NULL, self.p(k.x, "float*"), self.p(v, "float*"),
                                              self.p(k_cache), self.p(v_cache), self.p(k.positions, "int32_t*"),
                                              self.p(start, "int32_t*"), n, n_kv_heads, n_kv_heads, head_dim, k.rope_dim,
                                              k.theta, int(k.neox), self.rope_scaling_arg(k), k_cache.shape[1],
                                              self.dev.stream),
                    "fd_rope_kv_write")

    def swiglu(self, gate, up) -> DeviceTensor:
        out = self.take(gate.shape)
        self._check(self.lib.fd_swiglu(self.p(out, "float*"), self.p(gate, "float*"), self.p(up, "float*"), gate.size,
                                       self.dev.stream), "fd_swiglu")
        return out

    def add(self, a, b) -> DeviceTensor:
        out = self.take(a.shape)
        self._check(self.lib.fd_add(self.p(out, "float*"), self.p(a, "float*"), self.p(b, "float*"), a.size,
                                    self.dev.stream), "fd_add")
        return out

    def argmax(self, logits: DeviceTensor, out: DeviceTensor) -> None:
        rows, vocab = logits.shape
        self._check(self.lib.fd_argmax(self.p(out, "int32_t*"), self.p(logits, "float*"), rows, vocab,
                                       self.dev.stream), "fd_argmax")

    def kv_compact(self, cache: CudaKVCache, n_past: int, src_offsets) -> None:
        """Ops.kv_compact with fd_kv_compact (uploads its two small inputs; CudaRunner.commit_tree
        uses preallocated ones instead)."""
        offsets = np.ascontiguousarray(src_offsets, np.int32)
        if len(offsets) == 0:
            return
        spec = cache.spec
        d_off = self.dev.upload(offsets)
        d_np = self.dev.upload(np.array([n_past], np.int32))
        self._check(self.lib.fd_kv_compact(self.p(cache.storage), self.p(d_off, "int32_t*"), self.p(d_np, "int32_t*"),
                                           len(offsets), spec.n_layers, spec.n_kv_heads, spec.max_ctx, spec.head_dim,
                                           self.dev.stream), "fd_kv_compact")
        self.dev.synchronize()          # d_off and d_np are freed on return
