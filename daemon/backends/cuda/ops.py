"""CudaOps: the `Ops` interface on the GPU through libflashd_cuda.

Weights stay in their GGUF formats on the device (`QuantWeight`); activations are float32 tensors
taken from a bump arena that the runner resets before every forward, so a replayed forward uses
the same addresses (CUDA-graph capture of the decode step).

Fusion without changing the model code: `rmsnorm` of a hidden state returns a pending `Normed`
that the next projection applies in its prologue, and `rope` returns a pending `Roped` that
`attention` applies while it writes the KV cache (attention_ops.py: a one-row step without a mask runs
rope, the K/V write and attention in one op, `fd_attention_decode_rope`). Batches of up to
GEMV_MAX_ROWS tokens use the quantized GEMV kernels (decode, speculative verification); larger ones
dequantize each weight to float16 into a scratch buffer and run the tensor-core GEMM (prefill).

One name per op: a method named after its C entry point's op runs it -- `linear` fd_gemv (or
fd_gemm_f16), `linear_multi` fd_gemv_multi, `linear_swiglu` fd_gemv_swiglu (or fd_gemm_swiglu_f16),
`argmax` fd_argmax, `sample` fd_sample, `attention_decode` fd_attention_decode, and so on (a hybrid model's
`causal_conv1d` fd_causal_conv1d, `gated_delta_rule_decode` fd_gated_delta_rule_decode, ...: recurrent_ops.py).

Row invariance (speculative decoding is exact on the GPU): a forward begun with
`begin_forward(row_invariant=True)` computes every row exactly as a one-row decode step would --
projections stay on the GEMV kernels in groups of up to 8 rows (whose per-row arithmetic does not
depend on the group size; 32 rows where every weight of the call is Q4_K, Q6_K, Q8_0 or Q5_0 and the tuning's
gemv_rows and gemv_rows_formats put the call on native/cuda/gemv_rows.cuh, whose kernel is the same for every row
count), and
masked attention splits each token's keys like decode attention.
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import KVCacheSpec
from .attention_ops import (DECODE_CHUNK_SLOTS, MASKED_ROPE_MAX_NEW, MAX_MASKED_TOKENS, AttentionOps, Roped, attention_shape,
                            attention_workspace_bytes, rope_scaling_struct, rope_struct)
from .kv_cache import CudaKVCache
from .kv_cache_quant import CudaQuantKVCache
from .fused_ops import FusedOps
from .hybrid_ops import HybridOps, Sigmoid, Silu
from .recurrent_ops import RecurrentOps
from .tensor import Arena, Device, DeviceTensor
from .topk_ops import TopKOps
from .tree_build import TreeBuildOps

__all__ = ["CudaOps", "QuantWeight", "CudaKVCache", "Roped", "GEMV_MAX_ROWS", "DECODE_CHUNK_SLOTS", "MAX_MASKED_TOKENS",
           "attention_workspace_bytes", "attention_shape", "rope_scaling_struct", "rope_struct", "gemv_groups",
           "gemv_rows_call", "GEMV_ROWS_MAX_ROWS"]

ROPE_TABLE_FLOATS = 256       # the RoPE table: cos and sin of rope_dim / 2 pairs, rope_dim <= head_dim <= 256
GEMV_MAX_ROWS = 8             # fd_gemv handles up to 8 input rows (gemv.cuh's kernels) ...
GEMV_ROWS_MAX_ROWS = 32       # ... and up to 32 where gemv_rows.cuh runs the call (flashd_linear.h)
GEMV_ROWS_FORMAT_BITS = {12: 1, 14: 2, 8: 4, 6: 8}   # GGML Q4_K, Q6_K, Q8_0, Q5_0: the formats gemv_rows.cuh runs,
                                                      # and each one's bit in fd_tuning_t.gemv_rows_formats
GEMV_ROWS_MAX_COLS = 65536    # gemv_rows_plan.cuh ROWS_MAX_COLS
GGML_F32 = 0                  # the GGML type id of float32 (gguf.GGMLQuantizationType.F32)
FLOAT_QTYPES = frozenset({0, 1, 30})   # F32, F16, BF16: GEMV launches with one of these stage x as floats


def gemv_groups(n: int, size: int = GEMV_MAX_ROWS):
    """(start, end) of the row groups the GEMV kernels take: up to `size` rows each (GEMV_MAX_ROWS, or
    GEMV_ROWS_MAX_ROWS for a call on gemv_rows.cuh: CudaOps.gemv_group)."""
    return ((s, min(n, s + size)) for s in range(0, n, size))


def gemv_rows_call(tuning, qtypes, cols: int) -> bool:
    """Whether the library runs a GEMV call on gemv_rows.cuh (gemv_rows_plan.cuh rows_eligible): `tuning` (a
    mapping of fd_tuning_t's fields, as NativeLib.tuning() gives) has gemv_rows on (the library refuses it where the
    GPU lacks the kernel), every weight is Q4_K / Q6_K / Q8_0 / Q5_0 with its bit in gemv_rows_formats, and cols
    fits the x scratch."""
    if tuning.get("gemv_rows", 0) <= 0 or cols > GEMV_ROWS_MAX_COLS:
        return False
    formats = tuning.get("gemv_rows_formats", 0)
    return all(formats & GEMV_ROWS_FORMAT_BITS.get(int(q), 0) for q in qtypes)


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


class CudaOps(AttentionOps, TopKOps, TreeBuildOps, RecurrentOps, HybridOps, FusedOps):   # topk_ops.py: fd_topk_logprobs;
    # tree_build.py: fd_ddtree_build (the DDTree on the device);
    # recurrent_ops.py, hybrid_ops.py: a hybrid (qwen35) model's conv / delta-rule kernels and the rest of its forward;
    # fused_ops.py: its fused ops (conv + SiLU, the fused delta rule, the gated attention's q/k norms)
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
        self._attention_shapes: dict = {}        # (H, Hkv, d, max_ctx, max_keys) -> fd_attention_shape_t*
        self.attention_max_keys = 0              # the shapes' max_keys (flashd_attention.h): CudaRunner's shallow graph
        # the fused decode step's RoPE table (flashd_attention.h, fd_rope_t.table): one per ops, allocated once with
        # the attention workspace; used while rope_table_on (CudaRunner's decode body), reset by begin_forward
        self.rope_table: DeviceTensor | None = None
        self.rope_table_on = False
        self._rope_table_key = None
        # a masked forward's rows table (fd_attention_masked_rope): its first layer's rope_kv_write stores row i's cos /
        # sin, its later layers read them (AttentionOps._rows_table_mode); reset by begin_forward
        self.rope_rows_table: DeviceTensor | None = None
        self._rope_rows_key = None
        self._ropes: dict = {}                   # (rope_dim, theta, neox, RopeScaling) -> (fd_rope_t*, its scaling)
        self._gemv_rows = self._tuned_gemv_rows()   # the tuning's gemv_rows fields, re-read by begin_forward
        self._tuned_attention()
        self._hybrid_init()                      # hybrid_ops.py's constant buffers

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
        n = attention_workspace_bytes(self.dev.native, n_heads, n_kv_heads, head_dim, max_ctx, n_tokens)
        if self.attn_workspace is None or self.attn_workspace.nbytes < n:
            self.attn_workspace = None
            self.attn_workspace = self.dev.empty((max(int(n), 16),), np.uint8)
        if self.rope_table is None:                  # cos / sin of every pair of a head_dim <= 256 (never replaced)
            self.rope_table = self.dev.empty((ROPE_TABLE_FLOATS,), np.float32)
        if self.rope_rows_table is None:             # the same for MASKED_ROPE_MAX_NEW rows of rope_dim <= 128
            self.rope_rows_table = self.dev.empty((MASKED_ROPE_MAX_NEW * 128,), np.float32)

    def begin_forward(self, row_invariant: bool = False) -> None:
        self.arena.reset()
        self.row_invariant = row_invariant
        self._rope_table_key = None                  # the next fused decode call stores the table again
        self._rope_rows_key = None                   # the next masked layer stores the rows table again
        self._gemv_rows = self._tuned_gemv_rows()
        self._tuned_attention()

    def _tuned_attention(self) -> None:
        """The tuning's attn_o_codes: whether a verify forward's attention writes o's codes for the output projection
        (AttentionOps._o_codes); attn_masked_rope: up to how many rows its later layers run attention_masked_rope."""
        t = self.ffi.new("fd_tuning_t*")
        ok = self.lib.fd_tuning_get(t) == 0
        self.o_codes_on = ok and int(t.attn_o_codes) == 1
        self.masked_rope_rows = int(t.attn_masked_rope) if ok else 0

    def _tuned_gemv_rows(self) -> dict:
        """{'gemv_rows': .., 'gemv_rows_formats': ..} of the tuning in effect (empty: none, the one-row kernels)."""
        t = self.ffi.new("fd_tuning_t*")
        if self.lib.fd_tuning_get(t) != 0:
            return {}
        return {k: int(getattr(t, k, 0)) for k in ("gemv_rows", "gemv_rows_formats")}

    def gemv_group(self, weights) -> int:
        """Rows a GEMV launch of these weights takes: GEMV_ROWS_MAX_ROWS where the call runs on gemv_rows.cuh
        (its kernel is the same for every row count, so the group size changes no result), else GEMV_MAX_ROWS."""
        if gemv_rows_call(self._gemv_rows, (w.qtype for w in weights), weights[0].cols):
            return GEMV_ROWS_MAX_ROWS
        return GEMV_MAX_ROWS

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

    def kv_cache(self, spec: KVCacheSpec):
        """float16 K and V: CudaKVCache; a q8_0 / q4_0 K or V (with or without a window): CudaQuantKVCache
        (kv_cache_quant.py)."""
        return CudaQuantKVCache(self.dev, spec) if spec.kv_types.quantized else CudaKVCache(self.dev, spec)

    def from_numpy(self, array: np.ndarray) -> DeviceTensor:
        return self.dev.upload(np.ascontiguousarray(array))

    def to_numpy(self, t) -> np.ndarray:
        return self.dev.download(self.materialize(t))

    def take(self, shape, dtype=np.float32) -> DeviceTensor:
        return self.arena.take(tuple(shape), dtype)

    def p(self, t):
        """The cffi pointer of a tensor (NULL for None), typed by its dtype (tensor.CTYPES): float32 -> float*,
        int32 -> int32_t*, uint8 -> uint8_t*, so a tensor of the wrong dtype is a TypeError at the call."""
        return self.dev.p(t)

    # -- pending values --------------------------------------------------------------------------
    def materialize(self, t):
        if isinstance(t, Normed):
            rows = t.x.size // t.x.shape[-1]
            out = self.take(t.x.shape)
            self._check(self.lib.fd_rmsnorm(self.p(out), self.p(t.x), self.p(t.weight), rows, t.x.shape[-1], t.eps,
                                            self.dev.stream), "fd_rmsnorm")
            return out
        if isinstance(t, Roped):
            raise TypeError("a RoPE'd tensor can only be consumed by attention")
        if isinstance(t, Silu):
            return self._silu_now(t)
        if isinstance(t, Sigmoid):
            return self._sigmoid_now(t)
        return t

    @staticmethod
    def _norm_parts(x):
        return (x.x, x.weight, x.eps) if isinstance(x, Normed) else (x, None, 0.0)

    # -- math ------------------------------------------------------------------------------------
    def embed(self, table: QuantWeight, ids: DeviceTensor) -> DeviceTensor:
        n = ids.shape[0]
        out = self.take((n, table.cols))
        self._check(self.lib.fd_embed(self.p(out), self.p(table.data), table.qtype, table.rows, table.cols, self.p(ids),
                                      n, self.dev.stream), "fd_embed")
        return out

    def rmsnorm(self, x, weight, eps: float):
        if not isinstance(x, Normed) and x.ndim == 2:
            return Normed(x, weight, float(eps))       # fused into the consumer's prologue
        # a norm of a pending norm (the MTP block's hnorm of the target's output-normed rows) materializes it first
        return self.materialize(Normed(self.materialize(x), weight, float(eps)))

    def _dequant(self, w: QuantWeight, slot: int) -> DeviceTensor:
        n = w.rows * w.cols
        if n > self.scratch_elems:
            raise MemoryError(f"weight scratch of {self.scratch_elems} elements is smaller than {w.rows}x{w.cols}")
        buf = self.scratch[slot]
        self._check(self.lib.fd_dequant_f16(self.p(buf), self.p(w.data), w.qtype, w.rows, w.cols, self.dev.stream),
                    "fd_dequant_f16")
        return buf

    def _on_gemv(self, n: int, weights) -> bool:
        """Projections of n rows run on the GEMV kernels: decode-sized batches, every batch of a row-invariant
        forward (tree verification), and batches of up to GEMV_ROWS_MAX_ROWS rows whose weights all run on
        gemv_rows.cuh (it reads each weight once for all of them, where the GEMM path would dequantize every
        weight to float16 first: the DFlash drafter's 16-row block); other batches take the GEMM."""
        return (n <= GEMV_MAX_ROWS or self.row_invariant
                or (n <= GEMV_ROWS_MAX_ROWS and self.gemv_group(weights) == GEMV_ROWS_MAX_ROWS))

    def linear(self, x, weight: QuantWeight, bias=None, residual=None) -> DeviceTensor:
        n = x.shape[0]
        y = self.take((n, weight.rows))
        if self._on_gemv(n, [weight]) or weight.rows * weight.cols > self.scratch_elems:
            # GEMV in groups of up to 8 (or 32) rows: decode, verification, and weights too large for the
            # dequantization scratch (the lm_head when every position's logits are wanted)
            xs, norm_w, eps = self._norm_parts(x)
            codes = getattr(x, "codes", None)      # x's int8 codes, made by its producer (attention's o)
            for s, e in gemv_groups(n, self.gemv_group([weight])):
                res = self.p(None if residual is None else residual[s:e])
                if codes is not None:             # fd_gemv's bits: the kernel reads the codes instead of making them
                    xq, xsc = codes.rows(s, e)
                    self._check(self.lib.fd_gemv_xq(self.p(y[s:e]), self.p(weight.data), weight.qtype, weight.rows,
                                                    weight.cols, self.p(xs[s:e]), self.p(xq), self.p(xsc), e - s,
                                                    self.p(bias), res, self.dev.stream), "fd_gemv_xq")
                    continue
                self._check(self.lib.fd_gemv(self.p(y[s:e]), self.p(weight.data), weight.qtype, weight.rows,
                                             weight.cols, self.p(xs[s:e]), e - s, self.p(norm_w), eps, self.p(bias),
                                             res, self.dev.stream), "fd_gemv")
            return y
        xm = self.materialize(x)
        w16 = self._dequant(weight, 0)
        self._check(self.lib.fd_gemm_f16(self.p(y), self.p(xm), self.p(w16), n, weight.rows, weight.cols, self.p(bias),
                                         self.p(residual), self.dev.stream), "fd_gemm_f16")
        return y

    def linear_multi(self, x, weights, biases) -> tuple:
        n = x.shape[0]
        if not self._on_gemv(n, weights):
            xm = self.materialize(x)
            return tuple(self.linear(xm, w, b) for w, b in zip(weights, biases))
        floats = [w.qtype in FLOAT_QTYPES for w in weights]
        if any(floats) and not all(floats):
            # a launch stages x as int8 codes only where all its matrices are quantized: one launch per kind, so
            # each matrix gets the bits (and speed) it gets alone
            out = [None] * len(weights)
            for kind in (False, True):
                idx = [i for i, f in enumerate(floats) if f == kind]
                for i, y in zip(idx, self.linear_multi(x, [weights[i] for i in idx], [biases[i] for i in idx])):
                    out[i] = y
            return tuple(out)
        outs = [self.take((n, w.rows)) for w in weights]
        xs, norm_w, eps = self._norm_parts(x)
        k = len(weights)
        ws = self.ffi.new("void*[]", [self.p(w.data) for w in weights])
        qt = self.ffi.new("int[]", [w.qtype for w in weights])
        rows = self.ffi.new("int[]", [w.rows for w in weights])
        bs = self.ffi.new("float*[]", [self.p(b) for b in biases])
        for s, e in gemv_groups(n, self.gemv_group(weights)):
            ys = self.ffi.new("float*[]", [self.p(o[s:e]) for o in outs])
            self._check(self.lib.fd_gemv_multi(k, ys, ws, qt, rows, bs, weights[0].cols, self.p(xs[s:e]), e - s,
                                               self.p(norm_w), eps, self.dev.stream), "fd_gemv_multi")
        return tuple(outs)

    def linear_swiglu(self, x, w_gate: QuantWeight, w_up: QuantWeight) -> DeviceTensor:
        n = x.shape[0]
        y = self.take((n, w_gate.rows))
        if self._on_gemv(n, [w_gate, w_up]):
            xs, norm_w, eps = self._norm_parts(x)
            for s, e in gemv_groups(n, self.gemv_group([w_gate, w_up])):
                self._check(self.lib.fd_gemv_swiglu(self.p(y[s:e]), self.p(w_gate.data), w_gate.qtype,
                                                    self.p(w_up.data), w_up.qtype, w_gate.rows, w_gate.cols,
                                                    self.p(xs[s:e]), e - s, self.p(norm_w), eps,
                                                    self.dev.stream), "fd_gemv_swiglu")
            return y
        xm = self.materialize(x)
        g16, u16 = self._dequant(w_gate, 0), self._dequant(w_up, 1)
        self._check(self.lib.fd_gemm_swiglu_f16(self.p(y), self.p(xm), self.p(g16), self.p(u16), n, w_gate.rows,
                                                w_gate.cols, self.dev.stream), "fd_gemm_swiglu_f16")
        return y

    def release(self) -> None:
        """Drop the arena, weight scratch and attention workspace (parking): their device memory is
        freed once no tensor refers to it; reserve_* allocates them again."""
        self.arena = None
        self.scratch, self.scratch_elems = [], 0
        self.attn_workspace = None
        self._hybrid_init()                      # hybrid_ops.py's ones, split ids, l2 weights: made again on use

    def swiglu(self, gate, up) -> DeviceTensor:
        out = self.take(gate.shape)
        self._check(self.lib.fd_swiglu(self.p(out), self.p(gate), self.p(up), gate.size, self.dev.stream), "fd_swiglu")
        return out

    def add(self, a, b) -> DeviceTensor:
        out = self.take(a.shape)
        self._check(self.lib.fd_add(self.p(out), self.p(a), self.p(b), a.size, self.dev.stream), "fd_add")
        return out

    def gather_rows(self, table: DeviceTensor, ids: DeviceTensor, out: DeviceTensor) -> None:
        """Ops.gather_rows with fd_embed over a float32 table (GGML type F32: quant_float.cuh reads each
        value's 32 bits as the float and stores them, no arithmetic, so the rows are bit copies)."""
        rows, cols = table.shape
        if table.dtype != np.float32 or out.dtype != np.float32 or out.shape != (ids.shape[0], cols):
            raise ValueError(f"gather_rows: table {table.shape} {table.dtype}, {ids.shape[0]} ids, out {out.shape} "
                             f"{out.dtype} (float32, out (n_ids, cols))")
        self._check(self.lib.fd_embed(self.p(out), self.p(table), GGML_F32, rows, cols, self.p(ids), ids.shape[0],
                                      self.dev.stream), "fd_embed(gather_rows)")

    def argmax(self, logits: DeviceTensor, out: DeviceTensor) -> None:
        rows, vocab = logits.shape
        self._check(self.lib.fd_argmax(self.p(out), self.p(logits), rows, vocab, self.dev.stream), "fd_argmax")

    def sample(self, logits: DeviceTensor, out: DeviceTensor, params, history: DeviceTensor, n_history: DeviceTensor,
               step: DeviceTensor, workspace: DeviceTensor) -> None:
        """fd_sample: one token from logits (1, vocab) into out (int32[1]) as flashd.daemon.sampling.sample
        picks it with SamplingParams `params` (temperature > 0), penalties over history[:*n_history], the
        uniform draw at (params.seed, *step); workspace of fd_sample_workspace_bytes(vocab) bytes."""
        self._check(self.lib.fd_sample(self.p(out), self.p(logits), logits.shape[-1], self.p(history),
                                       self.p(n_history), params.repeat_last_n, params.repeat_penalty,
                                       params.frequency_penalty, params.presence_penalty, params.temperature,
                                       params.top_k, params.top_p, params.min_p, params.seed, self.p(step),
                                       self.p(workspace), self.dev.stream), "fd_sample")

    def kv_compact(self, cache: CudaKVCache, n_past: int, src_offsets) -> None:
        """Ops.kv_compact with fd_kv_compact (uploads its two small inputs; CudaRunner.commit_tree
        uses preallocated ones instead)."""
        offsets = np.ascontiguousarray(src_offsets, np.int32)
        if len(offsets) == 0:
            return
        spec = cache.spec
        d_off = self.dev.upload(offsets)
        d_np = self.dev.upload(np.array([n_past], np.int32))
        if isinstance(cache, CudaQuantKVCache):
            cache.compact(d_off, d_np, len(offsets))
            self.dev.synchronize()
            return
        self._check(self.lib.fd_kv_compact(self.p(cache.storage), self.p(d_off), self.p(d_np), len(offsets),
                                           spec.n_layers, spec.n_kv_heads, spec.max_ctx, spec.head_dim,
                                           self.dev.stream), "fd_kv_compact")
        self.dev.synchronize()          # d_off and d_np are freed on return
