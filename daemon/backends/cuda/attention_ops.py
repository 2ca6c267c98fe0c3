"""The attention half of CudaOps: RoPE + the K/V cache write, and one method per attention entry point
of the C ABI, named as the entry point is (CudaOps.attention_decode runs fd_attention_decode, ...).

`Ops.attention` dispatches: a one-row step without a mask (the decode step) runs `attention_decode_rope`
(RoPE, the K/V write and split-K attention in one launch) while `fuse_decode_rope` is on; a masked batch (tree
verification, DFlash blocks) whose shapes `attention_masked_rope` serves runs it in every layer after the
forward's first (whose `rope_kv_write` stores each row's cos / sin for them: the rows table) up to the tuning's
attn_masked_rope rows; every other batch runs `rope_kv_write` first, then `attention_masked`,
`attention_decode` (one row) or `attention_prefill` (several rows, causal). The decode, decode_rope and
masked kernels share the split-K machinery of native/cuda/attention_splitk.cuh, which splits a row's
keys in chunks of DECODE_CHUNK_SLOTS slots; masked attention splits them exactly as decode does, so a
tree node's output is bitwise the decode step's at its position.

`flashprefill_attention` is PFlash's drafter attention: fd_flashprefill_mean_k -> _score -> _select ->
_sparse_attention (native/cuda/flashprefill.cu, attention_sparse.cu), and `tail_max_probs` its token
importance (fd_flashprefill_tail_max_probs).
"""
from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..base import Batch
from .kv_cache_quant import kv_type_of
from .tensor import XCODES_GROUP, XCODES_ROWS, DeviceTensor, XCodes

__all__ = ["AttentionOps", "Roped", "DECODE_CHUNK_SLOTS", "MAX_MASKED_TOKENS", "attention_workspace_bytes",
           "attention_shape", "kv_window", "rope_struct", "rope_scaling_struct"]

DECODE_CHUNK_SLOTS = 64       # split-K chunk of the decode attention (measured: faster at short depth, same at 32K)
MAX_MASKED_TOKENS = 65        # masked attention's workspace: a tree of a root + 64 drafted nodes, a DFlash block
MASKED_ROPE_MAX_NEW = 48      # FD_ATTENTION_MASKED_ROPE_MAX_NEW: the most rows fd_attention_masked_rope takes
MASKED_ROPE_HEAD_DIMS = (64, 128)
FLASHPREFILL_BLOCK = 128      # FD_FLASHPREFILL_BLOCK: key / query block of FlashPrefill's scoring, in slots


KV_TYPE_CODES = {"f16": 0, "q8_0": 1, "q4_0": 2}     # FD_KV_F16, FD_KV_Q8_0, FD_KV_Q4_0 (flashd_attention.h)


def attention_shape(ffi, n_heads: int, n_kv_heads: int, head_dim: int, max_ctx: int, scale: float | None = None,
                    k_type: str = "f16", v_type: str = "f16", window: int = 0, window_slots: int = 0,
                    max_keys: int = 0):
    """The C ABI's `const fd_attention_shape_t*` (scale None: 1 / sqrt(head_dim); k_type / v_type: the cache's
    row formats, backends/kv_types.py names; window / window_slots: the KV window and its ring; max_keys: 0, or
    the most keys a row of the launch sees -- decode / masked attention run one split and no combine under
    attn_single_chunks chunks of it, flashd_attention.h).
    Not checked here: the wrappers check tensors against each other (AttentionOps._shape), the kernels the values
    (FD_E_ARG)."""
    if scale is None:
        scale = float(1.0 / np.sqrt(head_dim)) if head_dim > 0 else 0.0
    return ffi.new("fd_attention_shape_t*", {"n_heads": n_heads, "n_kv_heads": n_kv_heads, "head_dim": head_dim,
                                             "max_ctx": max_ctx, "scale": scale, "k_type": KV_TYPE_CODES[k_type],
                                             "v_type": KV_TYPE_CODES[v_type], "window": window,
                                             "window_slots": window_slots, "max_keys": max_keys})


def kv_window(cache_layer) -> tuple[int, int]:
    """(window, window_slots) of one layer's (K, V) caches: a windowed quantized side's (KVPlane), or (0, 0)."""
    for c in cache_layer:
        if getattr(c, "window", 0):
            return c.window, c.window_slots
    return 0, 0


def rope_struct(ffi, rope_dim: int, theta: float, neox: bool, scaling=None, table=None, table_mode: int = 0):
    """The C ABI's `const fd_rope_t*`; `scaling` an fd_rope_scaling_t* (rope_scaling_struct), NULL or None; `table`
    (a `float*`) and `table_mode` the step's RoPE table (flashd_attention.h: 1 store, 2 read; 0 none). The struct
    keeps neither `scaling` nor the table alive: the caller keeps them."""
    return ffi.new("fd_rope_t*", {"rope_dim": int(rope_dim), "theta": float(theta), "neox": int(neox),
                                  "scaling": ffi.NULL if scaling is None else scaling,
                                  "table": ffi.NULL if table is None else table, "table_mode": int(table_mode)})


def attention_workspace_bytes(native, n_heads: int, n_kv_heads: int, head_dim: int, max_ctx: int,
                              n_tokens: int = MAX_MASKED_TOKENS) -> int:
    """Bytes of the attention workspace for decode and for masked batches of up to n_tokens (native: the
    NativeLib, its lib and ffi)."""
    shape = attention_shape(native.ffi, n_heads, n_kv_heads, head_dim, max_ctx)
    return max(int(native.lib.fd_attention_decode_workspace_bytes(shape, DECODE_CHUNK_SLOTS)),
               int(native.lib.fd_attention_workspace_bytes(n_tokens, shape, DECODE_CHUNK_SLOTS)))


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


def _roped(what: str, *xs) -> None:
    if not all(isinstance(x, Roped) for x in xs):
        raise TypeError(f"CudaOps.{what} expects q and k from ops.rope")


PFLASH_HEAD_DIMS = (64, 128)   # fd_flashprefill_score / _tail_max_probs, fd_attention_block_sparse: FD_E_SHAPE otherwise


def _pflash_head_dim(what: str, head_dim: int) -> None:
    """PFlash's kernels serve dense drafters of head_dim 64 / 128 (CudaBackend.check_pflash_drafter refuses others
    at load); a ValueError naming them rather than FD_E_SHAPE from inside the sequence."""
    if head_dim not in PFLASH_HEAD_DIMS:
        raise ValueError(f"CudaOps.{what}: PFlash's kernels take head_dim {' or '.join(map(str, PFLASH_HEAD_DIMS))}, "
                         f"not {head_dim}")


class AttentionOps:
    """Mixed into CudaOps: uses its lib, ffi, dev, p, take, _check, materialize and attn_workspace. Every wrapper
    checks the tensors against each other and the cache before the call (ValueError), so the C ABI sees only
    consistent shapes; the kernels check what they can again (FD_E_ARG)."""

    def rope(self, x, positions, theta: float, rope_dim: int, neox: bool, scaling=None) -> Roped:
        return Roped(self.materialize(x), positions, float(theta), int(rope_dim), bool(neox), scaling)

    def _shape(self, q_shape, cache_layer, what: str):
        """The fd_attention_shape_t* of queries shaped (n, H, d) over one layer's (K, V) caches, checked, cached
        per shape (a captured graph keeps only the values it read at capture: the struct is read on the host).
        Its max_keys is self.attention_max_keys (0: none; set by CudaRunner around a shallow decode graph's body,
        whose rows see at most that many keys)."""
        k_cache, v_cache = cache_layer
        n_heads, head_dim = q_shape[-2], q_shape[-1]
        types = (kv_type_of(k_cache), kv_type_of(v_cache))      # a KVPlane (kv_cache_quant.py): q8_0 / q4_0
        if (len(k_cache.shape) != 3 or tuple(v_cache.shape) != tuple(k_cache.shape) or k_cache.shape[2] != head_dim
                or n_heads % k_cache.shape[0]
                or any(t == "f16" and c.dtype != np.float16 for t, c in zip(types, cache_layer))):
            raise ValueError(f"{what}: q {tuple(q_shape)} does not fit caches {tuple(k_cache.shape)} "
                             f"{k_cache.dtype} / {tuple(v_cache.shape)} ([n_kv_heads][max_ctx][head_dim], float16 "
                             f"or a quantized plane)")
        key = (n_heads, k_cache.shape[0], head_dim, k_cache.shape[1], self.attention_max_keys)
        window = kv_window(cache_layer)
        if types != ("f16", "f16"):
            key += types + window
        if key not in self._attention_shapes:
            self._attention_shapes[key] = attention_shape(self.ffi, *key[:4], k_type=types[0], v_type=types[1],
                                                          window=window[0], window_slots=window[1],
                                                          max_keys=key[4])
        return self._attention_shapes[key]

    def _o_codes(self, n: int, n_heads: int, head_dim: int, shape) -> XCodes | None:
        """Buffers for o's int8 codes where this launch writes them (flashd_attention.h o_codes), set on `shape` for
        the call (_no_codes clears them after it): the tuning's attn_o_codes on, head_dim 128 (a head is one group)
        and n >= 2 rows. The output projection then reads them (CudaOps.linear: fd_gemv_xq) instead of quantizing o
        again -- the same codes, one pre-pass launch fewer; a one-row projection quantizes o in its own CTAs without
        one, and reading codes instead gained nothing there (bench/NOTES.md session 42), so a decode step asks none."""
        if not self.o_codes_on or head_dim != XCODES_GROUP or n < 2:
            return None
        codes = XCodes(self.take((-(-n // 8) * 8, n_heads * head_dim), np.int8),
                       self.take((-(-n // XCODES_ROWS) * n_heads, XCODES_ROWS), np.float32), n_heads)
        shape.o_codes = self.p(codes.q)
        shape.o_scales = self.p(codes.sc)
        return codes

    def _no_codes(self, shape) -> None:
        shape.o_codes = self.ffi.NULL
        shape.o_scales = self.ffi.NULL

    @staticmethod
    def _k_offset(cache_layer, what: str):
        """The K plane's key offset (kv_cache_quant.py; a float32 (n_kv_heads, head_dim) DeviceTensor) or None
        (NULL: none), checked against the cache before it crosses the ABI."""
        k_cache = cache_layer[0]
        off = getattr(k_cache, "offset", None)
        if off is None:
            return None
        if kv_type_of(k_cache) == "f16" or tuple(off.shape) != (k_cache.shape[0], k_cache.shape[2]) \
                or off.dtype != np.float32:
            raise ValueError(f"{what}: key offset {tuple(off.shape)} {off.dtype} for a {kv_type_of(k_cache)} K "
                             f"{tuple(k_cache.shape)} (want float32 (n_kv_heads, head_dim), quantized K only)")
        return off

    def _rope(self, r: Roped, table_mode: int = 0, rows: bool = False):
        """The fd_rope_t* of a Roped (its scaling struct kept alive with it); table_mode 1 / 2: with the ops' RoPE
        table (flashd_attention.h), to store / read -- the decode step's one position, or (rows) the rows table of a
        masked forward."""
        key = (r.rope_dim, r.theta, r.neox, r.scaling, table_mode, rows)
        if key not in self._ropes:
            scaling = rope_scaling_struct(self.ffi, r.scaling, r.rope_dim, r.theta)
            table = self.dev.p(self.rope_rows_table if rows else self.rope_table, "float*") if table_mode else None
            self._ropes[key] = (rope_struct(self.ffi, r.rope_dim, r.theta, r.neox, scaling, table, table_mode),
                                scaling)
        return self._ropes[key][0]

    def _rope_table_mode(self, r: Roped, k_quantized: bool) -> int:
        """The fused decode step's RoPE table mode (flashd_attention.h) while `rope_table_on` (CudaRunner's decode
        body, one forward): the forward's first fused call stores the position's cos / sin (1), later calls of the
        same rope and position tensor read them (2), anything else computes its own (0). A quantized K rotates with
        a table of its own: 0."""
        if not self.rope_table_on or self.rope_table is None or k_quantized or r.rope_dim > self.rope_table.size:
            return 0
        key = (r.rope_dim, r.theta, r.neox, r.scaling, int(r.positions.ptr))
        if self._rope_table_key is None:
            self._rope_table_key = key
            return 1
        return 2 if key == self._rope_table_key else 0

    def _rows_table_mode(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer) -> int:
        """For a masked batch: 2 if this layer can run attention_masked_rope reading the rows table an earlier layer
        of this forward stored (same rope, same positions tensor, same rows), 1 if its rope_kv_write should store the
        table (the forward's first such layer), 0 for neither: more rows than the tuning's attn_masked_rope (0: off;
        measured: bench/NOTES.md session 43), or shapes the kernel does not take (a quantized K or V, a window,
        head_dim other than 64 / 128, a rope_dim not a multiple of 8 or k / v not 16-byte aligned -- the kernel
        takes a row's values 8 at a time --, more than MASKED_ROPE_MAX_NEW rows, q and k roped apart)."""
        n, _, head_dim = q.x.shape
        if (n > min(self.masked_rope_rows, MASKED_ROPE_MAX_NEW) or self.rope_rows_table is None
                or head_dim not in MASKED_ROPE_HEAD_DIMS or q.rope_dim * n > self.rope_rows_table.size
                or q.rope_dim % 8 or k.x.ptr % 16 or v.ptr % 16
                or any(kv_type_of(c) != "f16" for c in cache_layer) or kv_window(cache_layer)[0]
                or (k.rope_dim, k.theta, k.neox, k.scaling, k.positions.ptr)
                != (q.rope_dim, q.theta, q.neox, q.scaling, q.positions.ptr)):
            return 0
        key = (q.rope_dim, q.theta, q.neox, q.scaling, int(q.positions.ptr), n)
        if self._rope_rows_key is None:
            self._rope_rows_key = key
            return 1
        return 2 if key == self._rope_rows_key else 0

    # -- dispatch (the Ops interface) ------------------------------------------------------------
    def attention(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, batch: Batch) -> DeviceTensor:
        _roped("attention", q, k)
        n = q.x.shape[0]
        if n == 1 and batch.mask is None and self.fuse_decode_rope:
            return self.attention_decode_rope(q, k, v, cache_layer, batch.n_past)
        if batch.mask is not None:
            mode = self._rows_table_mode(q, k, v, cache_layer)
            if mode == 2:
                return self.attention_masked_rope(q, k, v, cache_layer, batch.mask, batch.n_past)
            self.rope_kv_write(q, k, v, cache_layer, batch.n_past, rows_table=mode == 1)
            return self.attention_masked(q.x, cache_layer, batch.mask, batch.n_past)
        self.rope_kv_write(q, k, v, cache_layer, batch.n_past)
        if batch.mask is not None:
            return self.attention_masked(q.x, cache_layer, batch.mask, batch.n_past)
        if n == 1:
            return self.attention_decode(q.x, cache_layer, batch.n_past)
        return self.attention_prefill(q.x, cache_layer, batch.n_past)

    def kv_write(self, k: Roped, v: DeviceTensor, cache_layer, start: DeviceTensor) -> None:
        """Rotate k, store k and v at cache slots *start + i (no query)."""
        _roped("kv_write", k)
        self.rope_kv_write(None, k, v, cache_layer, start)

    # -- one method per C entry point --------------------------------------------------------------
    def rope_kv_write(self, q: Roped | None, k: Roped, v: DeviceTensor, cache_layer, n_past: DeviceTensor,
                      rows_table: bool = False) -> None:
        """fd_rope_kv_write: rotate q (n, H, d) and k (n, Hkv, d) in place at k.positions (RoPE; for a quantized K
        then the Hadamard rotation, backends/kv_rotate.py) and store k, v in the cache's types at cache slots
        *n_past + i. q None: k and v only. rows_table: also store row i's cos / sin in the rows table (table_mode 1)
        for the forward's later attention_masked_rope calls."""
        n, n_kv_heads, head_dim = k.x.shape
        if tuple(v.shape) != tuple(k.x.shape) or (q is not None and (q.x.shape[0] != n or q.x.shape[2] != head_dim)):
            raise ValueError(f"rope_kv_write: q {None if q is None else q.x.shape}, k {k.x.shape}, v {v.shape}")
        shape = self._shape(k.x.shape if q is None else q.x.shape, cache_layer, "rope_kv_write")
        if cache_layer[0].shape[0] != n_kv_heads:
            raise ValueError(f"rope_kv_write: k {k.x.shape} vs cache {cache_layer[0].shape}")
        window, slots = kv_window(cache_layer)
        if window and n > slots - window:
            raise ValueError(f"rope_kv_write: {n} rows in one forward, but the KV window's ring holds {window} + "
                             f"{slots - window} (KVCacheSpec.max_rows)")
        self._check(self.lib.fd_rope_kv_write(self.p(None if q is None else q.x), self.p(k.x), self.p(v),
                                              self.p(cache_layer[0]), self.p(cache_layer[1]),
                                              self.p(self._k_offset(cache_layer, "rope_kv_write")), self.p(k.positions),
                                              self.p(n_past), n, shape,
                                              self._rope(k, 1, rows=True) if rows_table else self._rope(k),
                                              self.dev.stream),
                    "fd_rope_kv_write")

    def attention_decode(self, q: DeviceTensor, cache_layer, n_past: DeviceTensor) -> DeviceTensor:
        """fd_attention_decode: one rotated query row q (1, H, d) over cache slots [0, *n_past]."""
        _, n_heads, head_dim = q.shape
        shape = self._shape(q.shape, cache_layer, "attention_decode")
        if q.shape[0] != 1 or self.attn_workspace is None:
            raise ValueError(f"attention_decode: q {q.shape} is not one row, or no workspace (reserve_attention)")
        o = self.take((1, n_heads * head_dim))
        self._check(self.lib.fd_attention_decode(self.p(o), self.p(q), self.p(cache_layer[0]), self.p(cache_layer[1]),
                                                 self.p(n_past), shape, DECODE_CHUNK_SLOTS, self.p(self.attn_workspace),
                                                 self.dev.stream), "fd_attention_decode")
        return o

    def _masked_checks(self, what: str, q_shape, cache_layer, mask: DeviceTensor):
        """The shape struct and the workspace of a masked launch over rows q_shape (n, H, d), checked: the mask (n, n),
        the reserved workspace large enough for n rows (RuntimeError: CudaOps.reserve_attention's n_tokens)."""
        n = q_shape[0]
        shape = self._shape(q_shape, cache_layer, what)
        if mask.size != n * n:
            raise ValueError(f"{what}: mask {mask.shape} for {n} rows")
        ws = self.attn_workspace
        need = int(self.lib.fd_attention_workspace_bytes(n, shape, DECODE_CHUNK_SLOTS))
        if ws is None or ws.nbytes < need:
            raise RuntimeError(f"masked attention over {n} tokens needs a {need}-byte workspace, reserved "
                               f"{0 if ws is None else ws.nbytes} (CudaOps.reserve_attention(..., n_tokens))")
        return shape, ws

    def attention_masked(self, q: DeviceTensor, cache_layer, mask: DeviceTensor, n_past: DeviceTensor) -> DeviceTensor:
        """fd_attention_masked: n rotated rows q (n, H, d); row i attends every slot < *n_past and slot
        *n_past + j iff mask[i, j] (uint8 (n, n)), split like decode attention."""
        n, n_heads, head_dim = q.shape
        shape, ws = self._masked_checks("attention_masked", q.shape, cache_layer, mask)
        o = self.take((n, n_heads * head_dim))
        o.codes = self._o_codes(n, n_heads, head_dim, shape)
        try:
            self._check(self.lib.fd_attention_masked(self.p(o), self.p(q), self.p(cache_layer[0]),
                                                     self.p(cache_layer[1]), self.p(mask), self.p(n_past), n, shape,
                                                     DECODE_CHUNK_SLOTS, self.p(ws), ws.nbytes, self.dev.stream),
                        "fd_attention_masked")
        finally:
            self._no_codes(shape)
        return o

    def attention_masked_rope(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, mask: DeviceTensor,
                              n_past: DeviceTensor) -> DeviceTensor:
        """fd_attention_masked_rope: rope_kv_write + attention_masked in one launch, bit for bit -- n rows q (n, H, d),
        k and v (n, Hkv, d) as projected (left unrotated), row i's cos / sin read from the rows table (an earlier
        rope_kv_write of this forward stored it: _rows_table_mode), K and V stored at slots *n_past + i."""
        n, n_heads, head_dim = q.x.shape
        k_cache = cache_layer[0]
        n_kv_heads = k_cache.shape[0]
        if k.x.shape != (n, n_kv_heads, head_dim) or tuple(v.shape) != (n, n_kv_heads, head_dim):
            raise ValueError(f"attention_masked_rope: q {q.x.shape}, k {k.x.shape}, v {tuple(v.shape)} do not fit "
                             f"a cache of {k_cache.shape}")
        shape, ws = self._masked_checks("attention_masked_rope", q.x.shape, cache_layer, mask)
        o = self.take((n, n_heads * head_dim))
        o.codes = self._o_codes(n, n_heads, head_dim, shape)
        try:
            self._check(self.lib.fd_attention_masked_rope(self.p(o), self.p(q.x), self.p(k.x), self.p(v),
                                                          self.p(k_cache), self.p(cache_layer[1]), self.p(mask),
                                                          self.p(n_past), n, shape, self._rope(q, 2, rows=True),
                                                          DECODE_CHUNK_SLOTS, self.p(ws), ws.nbytes, self.dev.stream),
                        "fd_attention_masked_rope")
        finally:
            self._no_codes(shape)
        return o

    def attention_prefill(self, q: DeviceTensor, cache_layer, n_past: DeviceTensor) -> DeviceTensor:
        """fd_attention_prefill: n rotated rows q (n, H, d) at slots *n_past + i, causal, on tensor cores."""
        n, n_heads, head_dim = q.shape
        shape = self._shape(q.shape, cache_layer, "attention_prefill")
        o = self.take((n, n_heads * head_dim))
        self._check(self.lib.fd_attention_prefill(self.p(o), self.p(q), self.p(cache_layer[0]), self.p(cache_layer[1]),
                                                  self.p(n_past), n, shape, self.dev.stream),
                    "fd_attention_prefill")
        return o

    def attention_decode_rope(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer,
                              n_past: DeviceTensor) -> DeviceTensor:
        """One new token: RoPE of q and k at q.positions, K/V stored at cache slot *n_past, and split-K
        attention over slots [0, *n_past], in one op (fd_attention_decode_rope; a quantized K: q and k also
        Hadamard-rotated, bit for bit rope_kv_write's). q (1, H, d), k and v (1, Hkv, d) as projected; they are left
        unrotated. Returns o (1, H * d)."""
        k_cache = cache_layer[0]
        _, n_heads, head_dim = q.x.shape
        n_kv_heads = k_cache.shape[0]
        if q.x.shape[0] != 1 or k.x.shape != (1, n_kv_heads, head_dim) or tuple(v.shape) != (1, n_kv_heads, head_dim):
            raise ValueError(f"attention_decode_rope: q {q.x.shape}, k {k.x.shape}, v {tuple(v.shape)} do not fit "
                             f"one token over a cache of {k_cache.shape}")
        shape = self._shape(q.x.shape, cache_layer, "attention_decode_rope")
        if ((k.rope_dim, k.theta, k.neox, k.scaling) != (q.rope_dim, q.theta, q.neox, q.scaling)
                or k.positions.ptr != q.positions.ptr):
            raise ValueError("attention_decode_rope: q and k must be roped alike (one position, one rope)")
        ws = self.attn_workspace
        if ws is None:
            raise RuntimeError("attention workspace not reserved (CudaOps.reserve_attention)")
        k_quantized = kv_type_of(k_cache) != "f16"
        o = self.take((1, n_heads * head_dim))
        # no o codes for a one-row step (AttentionOps._o_codes says why)
        self._check(self.lib.fd_attention_decode_rope(self.p(o), self.p(q.x), self.p(k.x), self.p(v), self.p(k_cache),
                                                      self.p(cache_layer[1]),
                                                      self.p(self._k_offset(cache_layer, "attention_decode_rope")),
                                                      self.p(q.positions), self.p(n_past),
                                                      shape, self._rope(q, self._rope_table_mode(q, k_quantized)),
                                                      DECODE_CHUNK_SLOTS, self.p(ws), self.dev.stream),
                    "fd_attention_decode_rope")
        return o

    # -- PFlash (FlashPrefill) ---------------------------------------------------------------------
    def flashprefill_attention(self, q: Roped, k: Roped, v: DeviceTensor, cache_layer, batch: Batch,
                               step) -> DeviceTensor:
        """FlashPrefill of one chunk at slots [step.p0, step.p0 + n): RoPE + K/V write, then mean_K ->
        normalised block scores -> select -> block-sparse attention; scratch from the arena."""
        _roped("flashprefill_attention", q, k)
        n, n_heads, head_dim = q.x.shape
        n_kv_heads, max_ctx = cache_layer[0].shape[0], cache_layer[0].shape[1]
        lib, s, p0 = self.lib, self.dev.stream, step.p0
        if p0 % FLASHPREFILL_BLOCK or p0 + n > max_ctx:
            raise ValueError(f"flashprefill_attention: chunk [{p0}, {p0 + n}) is not block-aligned or past {max_ctx}")
        shape = self._shape(q.x.shape, cache_layer, "flashprefill_attention")
        _pflash_head_dim("flashprefill_attention", head_dim)
        self.rope_kv_write(q, k, v, cache_layer, batch.n_past)
        n_kb, n_qb = -(-(p0 + n) // FLASHPREFILL_BLOCK), -(-n // FLASHPREFILL_BLOCK)
        mean_k = self.take((n_kb, n_kv_heads, head_dim))
        score = self.take((n_qb, n_heads, n_kb))
        idx = self.take((n_qb, n_heads, n_kb), np.int32)
        cnt = self.take((n_qb, n_heads), np.int32)
        o = self.take((n, n_heads * head_dim))
        kc, vc = self.p(cache_layer[0]), self.p(cache_layer[1])
        self._check(lib.fd_flashprefill_mean_k(self.p(mean_k), kc, p0 + n, shape, s), "fd_flashprefill_mean_k")
        self._check(lib.fd_flashprefill_score(self.p(score), self.p(q.x), self.p(mean_k), p0, n, shape, s),
                    "fd_flashprefill_score")
        self._check(lib.fd_flashprefill_select(self.p(idx), self.p(cnt), self.p(score), p0, n, n_heads, step.alpha,
                                               step.sink_blocks, step.window_blocks, step.first_full_block, s),
                    "fd_flashprefill_select")
        self._check(lib.fd_flashprefill_sparse_attention(self.p(o), self.p(q.x), kc, vc, p0, n, shape, self.p(idx),
                                                         self.p(cnt), s), "fd_flashprefill_sparse_attention")
        return o

    def tail_max_probs(self, q, cache_layer, n_keys: int, n_tail: int, acc: DeviceTensor) -> None:
        """fd_flashprefill_tail_max_probs: acc (n_tail, n_keys) = max(acc, the dense causal attention
        probabilities of the last n_tail rows of q, max over heads)."""
        qx = q.x if isinstance(q, Roped) else q          # rotated in place by the attention call
        n, n_heads, _ = qx.shape
        shape = self._shape(qx.shape, cache_layer, "tail_max_probs")
        _pflash_head_dim("tail_max_probs", qx.shape[2])
        if not (1 <= n_tail <= n and n_tail <= n_keys <= cache_layer[0].shape[1]) or acc.shape != (n_tail, n_keys):
            raise ValueError(f"tail_max_probs: n_tail {n_tail}, n_keys {n_keys}, acc {acc.shape}, q {qx.shape}")
        ws = self.take((2 * n_tail * n_heads,))
        self._check(self.lib.fd_flashprefill_tail_max_probs(self.p(acc), self.p(qx[n - n_tail:]),
                                                            self.p(cache_layer[0]), n_keys, n_tail, shape, self.p(ws),
                                                            self.dev.stream), "fd_flashprefill_tail_max_probs")
