"""PersistentForward: a whole forward of the dense decoder in one launch (native/cuda/forward.cu).

The plan (fd_forward_create) holds the program -- per layer QKV, rope + KV write, attention, O, SwiGLU
MLP, then the lm_head with every row's argmax -- and owns the activations: `hidden` (the rows to
forward: fd_embed writes them) and `logits`. The weights and the KV cache stay the runner's.

Used by CudaRunner for the decode step and for verifying drafted tokens (up to `max_rows` rows per
launch; larger trees go through in consecutive groups, ancestors first, which the mask's row offset
makes exact). The per-op path (CudaOps) stays as the fallback and as the oracle: tests compare the two.

Tuning is data: one `ForwardTuning` per GPU architecture in `TUNING`, passed through the C ABI and
reported by `info()` (flashd bench records it with every result).
"""
from __future__ import annotations

from dataclasses import asdict, dataclass

import numpy as np

from ...models.config import ModelConfig
from ...models.weights import ModelWeights
from .ops import CudaKVCache, CudaOps, QuantWeight, rope_scaling_struct
from .tensor import DeviceTensor

__all__ = ["ForwardTuning", "TUNING", "tuning_for", "PersistentForward", "ForwardUnsupported", "FORWARD_PATHS"]

FORWARD_PATHS = ("persistent", "graph")
MAX_ROWS = 8                      # native/cuda/forward_program.cuh FWD_MAX_ROWS


class ForwardUnsupported(RuntimeError):
    """The persistent forward cannot run this model on this device (the per-op path still can)."""


@dataclass(slots=True, frozen=True)
class ForwardTuning:
    """fd_forward_tuning_t: the schedule knobs of the persistent forward."""

    max_rows: int = MAX_ROWS      # rows per launch wanted (the plan may hold fewer: shared memory)
    step_bytes: int = 6144        # target weight bytes of one GEMV step (G rows of a matrix)
    ring_min_steps: int = 1       # a warp's weight ring holds at least this many of the largest step
    attn_splits: int = 32         # most attention splits per row (chunks of 64 keys)
    n_ctas: int = 0               # 0 = one CTA per SM

    def __post_init__(self):
        if not 1 <= self.max_rows <= MAX_ROWS:
            raise ValueError(f"max_rows must be in [1, {MAX_ROWS}], got {self.max_rows}")
        if self.step_bytes < 256 or self.ring_min_steps < 1:
            raise ValueError(f"step_bytes >= 256 and ring_min_steps >= 1, got {self.step_bytes}, {self.ring_min_steps}")
        if self.attn_splits < 1 or self.n_ctas < 0:
            raise ValueError("attn_splits >= 1 and n_ctas >= 0")


# Per compute capability; sm_90 (H100/H200: 228 KB of shared memory per SM) measured in bench/results, the
# 24 GB cards' entries (sm_86: 100 KB, sm_89: 100 KB) sized for their smaller shared memory.
TUNING: dict[str, ForwardTuning] = {
    "sm_90": ForwardTuning(max_rows=8, step_bytes=6144, ring_min_steps=1, attn_splits=32),
    "sm_89": ForwardTuning(max_rows=4, step_bytes=2048, ring_min_steps=1, attn_splits=32),
    "sm_86": ForwardTuning(max_rows=4, step_bytes=2048, ring_min_steps=1, attn_splits=32),
    "default": ForwardTuning(max_rows=4, step_bytes=2048, ring_min_steps=1, attn_splits=32),
}


def tuning_for(cc: str) -> ForwardTuning:
    """The table's entry for a compute capability "9.0" / "sm_90" (default for unknown ones)."""
    arch = cc if cc.startswith("sm_") else "sm_" + cc.replace(".", "")
    return TUNING.get(arch, TUNING["default"])


class PersistentForward:
    """One plan of fd_forward for a model, its KV cache and a tuning."""

    def __init__(self, ops: CudaOps, cfg: ModelConfig, weights: ModelWeights, cache: CudaKVCache,
                 tuning: ForwardTuning | None = None):
        self.ops, self.cfg, self.cache = ops, cfg, cache
        dev = self.dev = ops.dev
        ffi, lib = dev.ffi, dev.lib
        self.tuning = tuning or tuning_for(dev.info()["cc"])
        self._plan = None
        layers = ffi.new("fd_layer_weights_t[]", cfg.n_layers)
        for i, w in enumerate(weights.layers):
            k_cache, v_cache = cache.layer(i)
            L = layers[i]
            for field, q in (("attn_q", w.attn_q), ("attn_k", w.attn_k), ("attn_v", w.attn_v),
                             ("attn_output", w.attn_output), ("ffn_gate", w.ffn_gate), ("ffn_up", w.ffn_up),
                             ("ffn_down", w.ffn_down)):
                if not isinstance(q, QuantWeight):
                    raise ForwardUnsupported(f"layer {i} {field}: not a device weight")
                setattr(L, field, dev.p(q.data))
            L.qtype_q, L.qtype_k, L.qtype_v = w.attn_q.qtype, w.attn_k.qtype, w.attn_v.qtype
            L.qtype_output, L.qtype_gate = w.attn_output.qtype, w.ffn_gate.qtype
            L.qtype_up, L.qtype_down = w.ffn_up.qtype, w.ffn_down.qtype
            L.attn_norm, L.ffn_norm = dev.p(w.attn_norm), dev.p(w.ffn_norm)
            L.bias_q, L.bias_k = dev.p(w.attn_q_bias), dev.p(w.attn_k_bias)
            L.bias_v = dev.p(w.attn_v_bias)
            L.q_norm, L.k_norm = dev.p(w.attn_q_norm), dev.p(w.attn_k_norm)
            L.k_cache, L.v_cache = dev.p(k_cache), dev.p(v_cache)
        model = ffi.new("fd_forward_model_t*")
        model.n_layers, model.hidden, model.n_heads = cfg.n_layers, cfg.hidden, cfg.n_heads
        model.n_kv_heads, model.head_dim, model.ffn = cfg.n_kv_heads, cfg.head_dim, cfg.ffn
        model.vocab, model.max_ctx = cfg.vocab_size, cache.spec.max_ctx
        model.rope_dim, model.rope_neox = cfg.rope_dim, int(cfg.rope_neox)
        model.rope_theta, model.rms_eps = cfg.rope_theta, cfg.rms_eps
        scaling = rope_scaling_struct(ffi, cfg.rope_scaling, cfg.rope_dim, cfg.rope_theta)   # copied by create
        model.rope_scaling = scaling
        model.layers = layers
        model.output_norm = dev.p(weights.output_norm)
        model.output, model.qtype_output = dev.p(weights.output.data), weights.output.qtype
        tun = ffi.new("fd_forward_tuning_t*")
        for k, v in asdict(self.tuning).items():
            setattr(tun, k, v)
        out = ffi.new("void**")
        status = lib.fd_forward_create(out, model, tun)
        if status != 0:
            reason = ffi.string(lib.fd_status_string(status)).decode()
            raise ForwardUnsupported(f"fd_forward_create: {reason} (status {status})")
        self._plan = out[0]
        info = ffi.new("fd_forward_info_t*")
        dev.native.check(lib.fd_forward_info(self._plan, info), "fd_forward_info")
        self.max_rows = int(info.max_rows)
        self._info = {"max_rows": int(info.max_rows), "n_ctas": int(info.n_ctas), "n_warps": int(info.n_warps),
                      "smem_bytes": int(info.smem_bytes), "ring_bytes": int(info.ring_bytes),
                      "max_step_bytes": int(info.max_step_bytes), "n_splits": int(info.n_splits),
                      "n_stages": int(info.n_stages)}
        hidden_ptr = int(ffi.cast("uintptr_t", info.hidden))
        logits_ptr = int(ffi.cast("uintptr_t", info.logits))
        self._capture_ptr = int(ffi.cast("uintptr_t", info.capture))
        self.hidden = DeviceTensor(hidden_ptr, (self.max_rows, cfg.hidden), np.dtype(np.float32), self)
        self.logits = DeviceTensor(logits_ptr, (self.max_rows, cfg.vocab_size), np.dtype(np.float32), self)
        self._weights = weights

    def info(self) -> dict:
        """The plan as built (rows per launch, grid, shared memory, ring) and the tuning it came from."""
        return {**self._info, "tuning": asdict(self.tuning)}

    def forward(self, ids: DeviceTensor, positions: DeviceTensor, n_past: DeviceTensor, *, mask: DeviceTensor | None = None,
                mask_n: int = 0, row0: int = 0, argmax: DeviceTensor | None = None,
                capture=None) -> DeviceTensor:
        """Enqueue embed + fd_forward for rows ids (n <= max_rows); returns the (n, vocab) logits view.

        positions, n_past (device): as Batch; mask (mask_n * mask_n uint8, device) with this launch's rows
        being rows row0 .. row0 + n - 1 of it; argmax (device int32, n) receives each row's argmax;
        capture (layer indices): those layers' output rows are kept for `captured`."""
        n = ids.shape[0]
        if not 1 <= n <= self.max_rows:
            raise ValueError(f"the persistent forward takes 1..{self.max_rows} rows per launch, got {n}")
        if positions.shape[0] < n:
            raise ValueError(f"{positions.shape[0]} positions for {n} rows")
        if mask is not None and (mask.size < mask_n * mask_n or row0 + n > mask_n):
            raise ValueError(f"mask of {mask.size} bytes for rows {row0}..{row0 + n} of {mask_n}")
        if argmax is not None and argmax.size < n:
            raise ValueError(f"argmax output of {argmax.size} for {n} rows")
        flags = self.dev.ffi.NULL
        if capture:
            if not all(0 <= int(i) < self.cfg.n_layers for i in capture):
                raise ValueError(f"capture layers {sorted(capture)} outside [0, {self.cfg.n_layers})")
            flags = self.dev.ffi.new("uint8_t[]", [int(i in capture) for i in range(self.cfg.n_layers)])
        ops, dev = self.ops, self.dev
        emb = self._weights.token_embd
        ops._check(dev.lib.fd_embed(dev.p(self.hidden), dev.p(emb.data), emb.qtype, emb.rows, emb.cols, dev.p(ids), n,
                                    dev.stream), "fd_embed")
        ops._check(dev.lib.fd_forward(self._plan, dev.p(positions), dev.p(n_past), dev.p(mask),
                                      mask_n if mask is not None else 0, row0, n, dev.p(argmax), flags,
                                      dev.stream), "fd_forward")
        return self.logits[:n]

    def captured(self, layer: int, n: int) -> DeviceTensor:
        """The (n, hidden) output rows of `layer` kept by the last forward that asked for it."""
        if not 0 <= layer < self.cfg.n_layers or not 1 <= n <= self.max_rows:
            raise ValueError(f"captured({layer}, {n}): layer in [0, {self.cfg.n_layers}), n in [1, {self.max_rows}]")
        hidden = self.cfg.hidden
        return DeviceTensor(self._capture_ptr + layer * self.max_rows * hidden * 4, (n, hidden), np.dtype(np.float32),
                            self)

    def close(self) -> None:
        if self._plan is not None:
            self.dev.synchronize()
            self.dev.lib.fd_forward_destroy(self._plan)
            self._plan = None

    def __del__(self):
        try:
            self.close()
        except Exception:
            pass
