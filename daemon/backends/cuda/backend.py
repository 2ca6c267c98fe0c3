"""CudaBackend: the device, the ops, the memory plan and the runner factory for the GPU."""
from __future__ import annotations

from dataclasses import dataclass

from ...models.config import ModelConfig
from ...models.gguf_file import ModelLoadError, ModelUnsupported
from ...vram_budget import kv_cache_bytes, kv_window_bytes
from ..base import Backend
from .attention_ops import PFLASH_HEAD_DIMS
from .graphs import memory_token
from .hybrid_plan import (check_hybrid, hybrid_largest_weight, hybrid_layer_bytes, hybrid_state_bytes,
                          hybrid_tree_nodes, hybrid_workspace_bytes)
from .hybrid_runner import CudaHybridRunner
from .lib import load
from .ops import CudaOps, attention_workspace_bytes
from .runner import SCORE_CHUNK, CudaRunner
from .tensor import Device

__all__ = ["CudaBackend", "MemoryPlan", "MemoryPlanError", "KVTypeUnsupported", "check_kv_types", "CUDA_KV_TYPES"]

ALIGN = 256
# head_dim values every attention kernel a forward uses is instantiated for (prefill, split-K decode / masked, the
# fused decode rope, the persistent forward)
HEAD_DIMS = (64, 128, 256)
# head_dim 256's split-K decode block takes ~150 KB of shared memory (attention_splitk_params.cuh Cfg<256>): the
# architectures whose blocks may opt into that much (sm_80 / sm_87: 163 KB, sm_90 / sm_100: 227 KB); sm_86 / sm_89 /
# sm_120 (99 KB) are refused at plan time rather than with FD_E_SHAPE at the first decode step
WIDE_HEAD_DIM = 256
WIDE_HEAD_DIM_CCS = ("8.0", "8.7", "9.0", "10.0", "10.3")
SAFETY_BYTES = 256 << 20      # CUDA context, graphs, allocator slack
# KV cache types the backend serves (backends/kv_types.py): every one since ABI 5 -- fd_rope_kv_write writes q8_0 /
# q4_0 rows (so does the fused decode rope + write), decode, masked and prefill attention read them,
# fd_kv_compact_rows moves them; a quantized cache runs the per-op graph forward (the persistent one is float16 only).
CUDA_KV_TYPES = ("f16", "q8_0", "q4_0")
KV_TYPES_MISSING = "the CUDA kernels do not cover this KV type"


class KVTypeUnsupported(ModelLoadError):
    """A --kv-type the CUDA kernels do not cover yet. Not ModelUnsupported: --device auto must not move a
    GPU request to the CPU behind the user's back; the user chooses --kv-type f16 or --device cpu."""


def check_kv_types(kv_types) -> None:
    """KVTypeUnsupported naming what is missing when K or V is stored in a type the kernels lack."""
    if kv_types is None:
        return
    for name, kind in (("K", kv_types.k), ("V", kv_types.v)):
        if kind not in CUDA_KV_TYPES:
            raise KVTypeUnsupported(f"--kv-type {kind} ({name}) is not available on the CUDA backend yet: "
                                    f"{KV_TYPES_MISSING}. Use --kv-type f16, or --device cpu (the reference backend "
                                    f"stores every type)")


class MemoryPlanError(MemoryError):
    """The model does not fit on the device with the requested max_ctx; nothing was allocated."""


@dataclass(slots=True, frozen=True)
class MemoryPlan:
    weights_bytes: int
    kv_bytes: int
    arena_bytes: int          # both halves of the activation arena
    scratch_bytes: int        # two float16 copies of the largest weight (prefill GEMM path)
    workspace_bytes: int      # decode attention partials + sampler scratch + small buffers

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes + self.arena_bytes + self.scratch_bytes + self.workspace_bytes

    def as_dict(self) -> dict:
        return {"weights_bytes": self.weights_bytes, "kv_bytes": self.kv_bytes, "arena_bytes": self.arena_bytes,
                "scratch_bytes": self.scratch_bytes, "workspace_bytes": self.workspace_bytes,
                "total_bytes": self.total_bytes}


def _arena_half_bytes(cfg: ModelConfig, chunk: int) -> int:
    """Bytes one layer (one arena half) takes for a chunk of `chunk` tokens, plus the head."""
    f32 = 4
    def up(n): return (n * f32 + ALIGN - 1) // ALIGN * ALIGN
    c = chunk
    layer = (up(c * cfg.hidden)                                   # embedding (before layer 0)
             + up(c * cfg.q_dim) + 2 * up(c * cfg.kv_dim)         # q, k, v
             + up(c * cfg.q_dim) + up(c * cfg.hidden)             # attention out, o-proj (+residual)
             + 3 * up(c * cfg.hidden)                             # materialized norms (prefill GEMM path)
             + 2 * up(c * cfg.q_dim)                              # materialized qk-norms (qwen3)
             + up(c * cfg.ffn) + up(c * cfg.hidden))              # swiglu, down (+residual)
    if cfg.head_dim == 128:                                       # o's int8 codes (a verify forward) and scales:
        code_rows, scale_rows = -(-c // 8) * 8, -(-c // 32) * 32      # 8-row tiles read whole, blocks of 32 rows
        layer += up(-(-code_rows * cfg.q_dim // f32)) + up(scale_rows * cfg.n_heads)   # up() counts floats
    head = up(cfg.hidden) * 2 + up(max(SCORE_CHUNK, 1) * cfg.vocab_size) + up(SCORE_CHUNK * cfg.hidden) * 2
    return max(layer, head) + (1 << 20)


class CudaBackend(Backend):
    name = "cuda"

    def __init__(self, device_index: int = 0, lib_path: str | None = None):
        self.forward_path = "graph"         # decode / verify forwards: "graph" (per-op) or "persistent" (one launch)
        self.native = load(lib_path)
        self.device = Device(self.native, device_index)
        self.ops = CudaOps(self.device)
        self._graph_memory = None           # graphs.memory_token of the shared memory when graphs were last checked

    def info(self) -> dict:
        return self.device.info()

    def plan(self, cfg: ModelConfig, weight_bytes: int, max_ctx: int, prefill_chunk: int,
             kv_types=None, max_tree_nodes: int | None = None) -> MemoryPlan:
        """The model's device memory (max_tree_nodes: make_runner's, which sizes a hybrid's tree node states);
        refuses (ModelUnsupported) a shape the kernels do not cover, so such a
        model fails at load time with a message instead of at its first forward, and (KVTypeUnsupported) a KV
        type they do not write and read."""
        check_kv_types(kv_types)
        hybrid = getattr(cfg, "linear", None) is not None
        if hybrid:                                      # a Gated DeltaNet hybrid: hybrid_plan.py
            check_hybrid(cfg)
        if cfg.head_dim not in HEAD_DIMS:
            raise ModelUnsupported(f"the CUDA backend's attention kernels support head_dim {', '.join(map(str, HEAD_DIMS))}"
                                 f"; this model has head_dim {cfg.head_dim} (use --device cpu)")
        if cfg.head_dim == WIDE_HEAD_DIM:
            cc = self.device.info()["cc"]
            if cc not in WIDE_HEAD_DIM_CCS:
                raise ModelUnsupported(f"head_dim {cfg.head_dim}'s decode attention needs ~150 KB of shared memory per "
                                       f"block, which this GPU (compute capability {cc}) does not give (sm_80, sm_90 "
                                       f"do; use --device cpu)")
        lib = self.device.lib
        n_kv_layers = max(1, len(cfg.linear.attention_layers)) if hybrid else cfg.n_layers
        kv = kv_cache_bytes(n_kv_layers, cfg.n_kv_heads, cfg.head_dim, max_ctx, *(
            (kv_types.k, kv_types.v) if kv_types is not None else ("f16", "f16")))
        if kv_types is not None and kv_types.window:       # the window's rings (kv_cache_quant.py)
            from ...runner import max_forward_rows
            kv += kv_window_bytes(n_kv_layers, cfg.n_kv_heads, cfg.head_dim, kv_types.window,
                                  max_forward_rows(prefill_chunk), sum(kv_types.windowed(s) for s in "kv"))
        largest = max(cfg.q_dim * cfg.hidden, cfg.ffn * cfg.hidden, cfg.kv_dim * cfg.hidden)
        workspace = (attention_workspace_bytes(self.device.native, cfg.n_heads, cfg.n_kv_heads, cfg.head_dim,
                                               max_ctx)
                     + int(lib.fd_sample_workspace_bytes(cfg.vocab_size)) + 8 * (max_ctx + 2 * prefill_chunk))
        half = _arena_half_bytes(cfg, prefill_chunk)
        if hybrid:          # kv_bytes: the attention layers' K/V, the recurrent state and the tree node states
            kv += (1 + hybrid_tree_nodes(prefill_chunk, max_tree_nodes)) * hybrid_state_bytes(cfg)
            largest = max(largest, hybrid_largest_weight(cfg))
            workspace += hybrid_workspace_bytes(cfg, prefill_chunk)
            half = max(half, hybrid_layer_bytes(cfg, prefill_chunk) + (1 << 20))
        return MemoryPlan(weights_bytes=weight_bytes, kv_bytes=kv, arena_bytes=2 * half,
                          scratch_bytes=2 * largest * 2, workspace_bytes=workspace)

    def check_pflash_drafter(self, cfg: ModelConfig) -> None:
        """ModelUnsupported unless PFlash's kernels cover the drafter's head_dim (a dense model of 64 or 128)."""
        if cfg.head_dim not in PFLASH_HEAD_DIMS:
            raise ModelUnsupported(f"PFlash's CUDA kernels serve drafters of head_dim "
                                   f"{' and '.join(map(str, PFLASH_HEAD_DIMS))}; this drafter has head_dim {cfg.head_dim}")

    def check_fits(self, plan: MemoryPlan) -> None:
        free, total = self.device.mem_info()
        if plan.total_bytes + SAFETY_BYTES > free:
            raise MemoryPlanError(
                f"the model needs {plan.total_bytes / 2**30:.2f} GiB on the GPU "
                f"({', '.join(f'{k[:-6]} {v / 2**30:.2f}' for k, v in plan.as_dict().items() if k != 'total_bytes')}"
                f" GiB) but {free / 2**30:.2f} GiB of {total / 2**30:.2f} GiB are free; lower --max-ctx")

    def make_runner(self, cfg: ModelConfig, weights, max_ctx: int, prefill_chunk: int, plan: MemoryPlan,
                    kv_types=None, max_tree_nodes: int | None = None):
        """The runner (max_tree_nodes: ModelRunner's, the same as the plan's)."""
        check_kv_types(kv_types)
        self.ops.reserve_arena(plan.arena_bytes // 2)
        self.ops.reserve_scratch(plan.scratch_bytes // 4)
        self.ops.reserve_attention(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, max_ctx)
        if getattr(cfg, "linear", None) is not None:     # graph decode, eager verify: hybrid_runner.py
            return CudaHybridRunner(self.ops, cfg, weights, max_ctx, prefill_chunk, kv_types=kv_types,
                                    max_tree_nodes=max_tree_nodes)
        return CudaRunner(self.ops, cfg, weights, max_ctx, prefill_chunk, forward_path=self.forward_path,
                          kv_types=kv_types, max_tree_nodes=max_tree_nodes)

    def drop_graphs(self, runners) -> None:
        for runner in runners:
            if isinstance(runner, CudaRunner):
                runner.drop_graphs()

    def drop_stale_graphs(self, runners) -> None:
        # where the shared buffers are (graphs.memory_token, as the drafters' GraphCache checks them): reserve_* and
        # release replace them, never resize them in place
        token = memory_token(self.ops)
        if token != self._graph_memory:
            self.drop_graphs(runners)
            self._graph_memory = token


def measure_copy_gbs(device: Device, n_bytes: int = 1 << 30, reps: int = 5) -> float:
    """Device-to-device copy bandwidth in GB/s, counting bytes read plus bytes written (the
    figure a decode step's weight streaming is compared against)."""
    import numpy as np

    src, dst = device.empty((n_bytes,), np.uint8), device.empty((n_bytes,), np.uint8)
    ffi, lib = device.ffi, device.lib
    ev = [ffi.new("void**"), ffi.new("void**")]
    for e in ev:
        device.native.check(lib.fd_event_create(e, 1), "event")
    ms = ffi.new("float*")
    best = 0.0
    try:
        for i in range(reps + 1):
            lib.fd_event_record(ev[0][0], device.stream)
            device.copy(dst, src)
            lib.fd_event_record(ev[1][0], device.stream)
            device.native.check(lib.fd_event_synchronize(ev[1][0]), "event sync")
            lib.fd_event_elapsed_ms(ms, ev[0][0], ev[1][0])
            if i:
                best = max(best, 2 * n_bytes / (ms[0] * 1e-3) / 1e9)
    finally:
        for e in ev:
            lib.fd_event_destroy(e[0])
    return best
