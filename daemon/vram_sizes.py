"""What each model allocates, computed from its config and tensor sizes the way the backends allocate
(read beside backends/cuda/runner.py, ops.py, kv_cache.py, persistent.py, pflash/drafter.py and
speculative/dflash_drafter.py: each sum below names the allocation it mirrors).

`describe_model` / `describe_dflash` turn an opened GGUF into a descriptor (config + every tensor the
loader uploads); `CudaSizes` and `HostSizes` size a descriptor on the CUDA and the reference backend.
A model's own parts come with a `SharedNeed`: what it asks of the buffers every model on the backend's
ops shares (they grow to the largest need, they are not added up).

Not counted (the plan's safety margin covers them): the CUDA context and kernel images, CUDA graphs
(driver memory), the persistent forward's per-stage tables (a few KB), cudaMalloc's rounding, and on
the reference backend the numpy temporaries of a forward.
"""
from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable

from .pflash.config import PFlashConfig
from .vram_budget import kv_cache_bytes

__all__ = ["ModelDesc", "DFlashDesc", "MTPDesc", "SharedNeed", "CudaSizes", "HostSizes", "describe_model",
           "describe_dflash", "describe_mtp", "persistent_forward_bytes"]

Tensors = tuple[tuple[tuple[int, ...], int], ...]       # (shape, stored bytes) of every tensor loaded


@dataclass(slots=True, frozen=True)
class ModelDesc:
    """A dense model as the planner needs it: config and every tensor the loader uploads."""

    name: str
    path: str
    cfg: object                    # models.config.ModelConfig
    tensors: Tensors
    head: Tensors = ()             # token_embd and output (when untied): what a DFlash drafter borrows


@dataclass(slots=True, frozen=True)
class DFlashDesc:
    """A DFlash drafter as the planner needs it. ModelDesc's fields again but for `head` (a drafter borrows
    its target's): a type of its own, not a subclass, as the ledger tells drafters apart by type."""

    name: str
    path: str
    cfg: object                    # models.dflash_config.DFlashConfig
    tensors: Tensors


@dataclass(slots=True, frozen=True)
class MTPDesc:
    """The target's multi-token-prediction block as a drafter (`--draft mtp`, speculative/mtp_drafter.py): the block's
    tensors in the target's file; cfg is the target's (the block has the shape of its attention layers). It borrows
    the target's embedding, lm_head and output_norm like a DFlash drafter."""

    name: str
    path: str
    cfg: object                    # the target's models.config.ModelConfig
    tensors: Tensors


@dataclass(slots=True, frozen=True)
class SharedNeed:
    """What a model asks of the shared buffers of the backend's ops (CudaOps.reserve_*)."""

    arena_half: int = 0            # reserve_arena(half_bytes)
    scratch_elems: int = 0         # reserve_scratch(n_elems): two float16 buffers
    attention: int = 0             # reserve_attention: attention_workspace_bytes(...)


def _kv_pair(kv_type) -> tuple[str, str]:
    """A model's KV types for kv_cache_bytes: one name for K and V, or a (K, V) pair (the target's --kv-type-k / -v)."""
    return (kv_type, kv_type) if isinstance(kv_type, str) else tuple(kv_type)


def _tensors(infos) -> Tensors:
    return tuple((tuple(int(d) for d in info.shape), int(info.n_bytes)) for info in infos)


def describe_model(name: str, f, cfg) -> ModelDesc:
    """A dense model from its opened GGUF (models.open_model)."""
    from .models.weights import tensor_plan
    plan = tensor_plan(f, cfg)
    head = [info for field, _, info in plan if field in ("token_embd", "output")]
    return ModelDesc(name, str(f.path), cfg, _tensors(info for _, _, info in plan), _tensors(head))


def describe_dflash(name: str, f, cfg) -> DFlashDesc:
    from .models.dflash_weights import dflash_tensor_plan
    return DFlashDesc(name, str(f.path), cfg, _tensors(info for _, _, info in dflash_tensor_plan(f, cfg)))


def describe_mtp(name: str, f, cfg) -> MTPDesc:
    """The MTP block of an opened qwen35 target (ModelLoadError when it has none)."""
    from .models.qwen35_mtp_weights import mtp_config, mtp_tensor_plan
    plan = mtp_tensor_plan(f, cfg, mtp_config(f, cfg))
    return MTPDesc(name, str(f.path), cfg, _tensors(info for _, info in plan))


def _largest_weight(cfg) -> int:
    """Elements of the largest projection: the GEMM path's dequantization scratch (backend.plan)."""
    return max(cfg.q_dim * cfg.hidden, cfg.ffn * cfg.hidden, cfg.kv_dim * cfg.hidden)


def _pflash_shape(cfg, pc: PFlashConfig, n_tokens: int) -> tuple[int, int, int]:
    """(longest forward chunk, tail rows, key blocks) of the drafter's forward over any prompt of up to
    n_tokens (pflash/drafter.py chunk_bounds: a last chunk shorter than the tail joins the one before)."""
    n_tail = min(pc.tail_tokens, n_tokens)
    longest = n_tokens if n_tokens <= pc.forward_chunk else min(n_tokens, pc.forward_chunk + n_tail - 1)
    return longest, n_tail, -(-n_tokens // pc.block)


class HostSizes:
    """The reference backend: float32 weights (dequantized once) and a float32 KV cache, in host RAM."""

    where = "host RAM (reference backend)"
    kv_type = "f32"

    def weights(self, tensors: Tensors) -> int:
        return sum(4 * math.prod(shape) for shape, _ in tensors)

    def tree_nodes(self, cfg, prefill_chunk: int, cap: int | None = None) -> int:
        """ModelRunner.max_tree_nodes of a runner made with max_tree_nodes=cap: a prefill chunk, a hybrid's at most
        MAX_TREE_NODES when no cap is given (its cache's bound), at most the cap."""
        from .models.qwen35_tree import MAX_TREE_NODES
        if getattr(cfg, "linear", None) is not None:
            return min(prefill_chunk, MAX_TREE_NODES if cap is None else cap)
        return prefill_chunk if cap is None else min(prefill_chunk, cap)

    def model(self, desc: ModelDesc, max_ctx: int, prefill_chunk: int, kv_type: str,
              tree_nodes: int | None = None) -> tuple[list, SharedNeed]:
        """A target or a draft model (tree_nodes: its runner's max_tree_nodes argument -- the target's configured
        count, DRAFT_TREE_NODES for a draft model; None: the default bound)."""
        cfg = desc.cfg
        lin = getattr(cfg, "linear", None)
        if lin is None:
            return ([("weights", self.weights(desc.tensors)),
                     ("kv_cache", kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, max_ctx, *_kv_pair(kv_type)))],
                    SharedNeed())
        # a hybrid (models/qwen35.py HybridCache): K/V of the attention layers, and the linear layers' float32
        # recurrent state (ReferenceRecurrentState: conv (K - 1, C) and delta-rule memory (Hv, S, S) per layer),
        # plus one such state per node of the largest draft tree a verify takes (its node buffers, grown on use)
        n_attn, n_lin = max(1, len(lin.attention_layers)), max(1, len(lin.linear_layers))
        state = 4 * n_lin * ((lin.conv_kernel - 1) * lin.conv_channels + lin.n_v_heads * lin.head_dim ** 2)
        return ([("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(n_attn, cfg.n_kv_heads, cfg.head_dim, max_ctx, *_kv_pair(kv_type))),
                 ("recurrent_state", state), ("tree_states", self.tree_nodes(cfg, prefill_chunk, tree_nodes) * state)],
                SharedNeed())

    def dflash(self, desc: DFlashDesc, max_ctx: int, kv_type: str) -> tuple[list, SharedNeed]:
        m, b = desc.cfg.model, desc.cfg.block_size
        return ([("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(m.n_layers, m.n_kv_heads, m.head_dim, max_ctx + b, kv_type))],
                SharedNeed())

    def mtp(self, desc: MTPDesc, max_ctx: int, prefill_chunk: int, kv_type: str) -> tuple[list, SharedNeed]:
        """MTPDrafter: the block's weights (float32) and its one-layer K/V cache (qwen35_mtp.mtp_cache_spec)."""
        cfg = desc.cfg
        return ([("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(1, cfg.n_kv_heads, cfg.head_dim, max_ctx, kv_type))], SharedNeed())

    def pflash(self, desc: ModelDesc, pc: PFlashConfig, n_tokens: int, kv_type: str) -> list:
        cfg = desc.cfg
        _, n_tail, n_blocks = _pflash_shape(cfg, pc, n_tokens)
        return [("weights", self.weights(desc.tensors)),
                ("kv_cache", kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, n_blocks * pc.block, kv_type)),
                ("scores", 4 * n_tail * n_tokens)]

    def shared(self, needs) -> list:
        return []


class CudaSizes:
    """The CUDA backend. attention_ws(n_heads, n_kv_heads, head_dim, max_ctx, n_tokens) and sample_ws(vocab)
    are the native library's byte counts (the backend passes its own); n_sms and tuning_rows size the
    persistent forward's workspace (forward_path "persistent")."""

    where = "GPU"
    kv_type = "f16"

    def __init__(self, attention_ws: Callable[..., int], sample_ws: Callable[[int], int], *, n_sms: int = 0,
                 tuning_rows: int = 0, attn_splits: int = 32, persistent: bool = False):
        self.attention_ws, self.sample_ws = attention_ws, sample_ws
        self.n_sms, self.tuning_rows, self.attn_splits = n_sms, tuning_rows, attn_splits
        self.persistent = persistent

    def weights(self, tensors: Tensors) -> int:
        """ops.load_weight: a matrix uploaded as stored, a vector (norm, bias) dequantized to float32."""
        return sum(n_bytes if len(shape) == 2 else 4 * math.prod(shape) for shape, n_bytes in tensors)

    def tree_nodes(self, cfg, prefill_chunk: int, cap: int | None = None) -> int:
        """CudaRunner.max_tree_nodes of a runner made with max_tree_nodes=cap: the masked attention's bound and the
        prefill chunk, a hybrid's MAX_TREE_NODES when no cap is given (hybrid_plan.hybrid_tree_nodes), the cap."""
        from .backends.cuda.hybrid_plan import hybrid_tree_nodes
        from .backends.cuda.ops import MAX_MASKED_TOKENS
        if getattr(cfg, "linear", None) is not None:
            return hybrid_tree_nodes(prefill_chunk, cap)
        n = min(prefill_chunk, MAX_MASKED_TOKENS)
        return n if cap is None else min(n, cap)

    def runner_bytes(self, cfg, max_ctx: int, prefill_chunk: int, tree_nodes: int | None = None) -> int:
        """CudaRunner.__init__'s device buffers (the pinned ring is host memory)."""
        from .backends.cuda.runner import STATE_FIELDS
        from .backends.cuda.tree_inputs import tree_input_words
        n_tree = max(self.tree_nodes(cfg, prefill_chunk, tree_nodes), 1)   # max_tree_nodes (one-node buffers at 0)
        words = (2 * prefill_chunk + 1                                  # p_ids, p_pos, p_n_past
                 + len(STATE_FIELDS) + (max_ctx + 1)                    # _state, history
                 + tree_input_words(n_tree) + (n_tree + 1) + n_tree)    # _t_inputs, _t_commit, t_argmax
        return 4 * words + max(int(self.sample_ws(cfg.vocab_size)), 1)  # sample_ws

    def model(self, desc: ModelDesc, max_ctx: int, prefill_chunk: int, kv_type: str,
              tree_nodes: int | None = None) -> tuple[list, SharedNeed]:
        """A target or a draft model: backend.make_runner -> CudaRunner with its KV cache (tree_nodes: make_runner's
        max_tree_nodes -- the target's configured count, DRAFT_TREE_NODES for a draft model; None: the default)."""
        from .backends.cuda.backend import _arena_half_bytes
        from .backends.cuda.ops import MAX_MASKED_TOKENS
        cfg = desc.cfg
        if getattr(cfg, "linear", None) is not None:
            return self._hybrid(desc, max_ctx, prefill_chunk, kv_type, tree_nodes)
        parts = [("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, max_ctx, *_kv_pair(kv_type))),
                 ("runner", self.runner_bytes(cfg, max_ctx, prefill_chunk, tree_nodes))]
        if self.persistent:
            parts.append(("persistent_forward", persistent_forward_bytes(cfg, max_ctx, self.tuning_rows, self.n_sms,
                                                                         self.attn_splits)))
        need = SharedNeed(arena_half=_arena_half_bytes(cfg, prefill_chunk), scratch_elems=_largest_weight(cfg),
                          attention=int(self.attention_ws(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, max_ctx,
                                                          MAX_MASKED_TOKENS)))
        return parts, need

    def _hybrid(self, desc: ModelDesc, max_ctx: int, prefill_chunk: int, kv_type: str,
                tree_nodes: int | None) -> tuple[list, SharedNeed]:
        """A hybrid (qwen35) on CudaHybridRunner: K/V of the attention layers, the device recurrent state, a state
        per node of the largest draft tree and hybrid_ops.py's buffers (backends/cuda/hybrid_plan.py); no
        persistent forward."""
        from .backends.cuda.backend import _arena_half_bytes
        from .backends.cuda.hybrid_plan import (hybrid_largest_weight, hybrid_layer_bytes, hybrid_state_bytes,
                                                hybrid_tree_nodes, hybrid_workspace_bytes)
        from .backends.cuda.ops import MAX_MASKED_TOKENS
        cfg = desc.cfg
        n_attn = max(1, len(cfg.linear.attention_layers))
        parts = [("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(n_attn, cfg.n_kv_heads, cfg.head_dim, max_ctx, *_kv_pair(kv_type))),
                 ("recurrent_state", hybrid_state_bytes(cfg)),
                 ("tree_states", hybrid_tree_nodes(prefill_chunk, tree_nodes) * hybrid_state_bytes(cfg)),
                 ("hybrid_buffers", hybrid_workspace_bytes(cfg, prefill_chunk)),
                 ("runner", self.runner_bytes(cfg, max_ctx, prefill_chunk, tree_nodes))]
        half = max(_arena_half_bytes(cfg, prefill_chunk), hybrid_layer_bytes(cfg, prefill_chunk) + (1 << 20))
        need = SharedNeed(arena_half=half, scratch_elems=max(_largest_weight(cfg), hybrid_largest_weight(cfg)),
                          attention=int(self.attention_ws(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, max_ctx,
                                                          MAX_MASKED_TOKENS)))
        return parts, need

    def dflash(self, desc: DFlashDesc, max_ctx: int, kv_type: str) -> tuple[list, SharedNeed]:
        """DFlashDrafter: its weights (fc split by columns: the same bytes), its KV cache (dflash_cache_spec:
        max_ctx + B slots), the block mask, the per-forward inputs (dflash_inputs.StagedInputs keeps one
        injection's features, positions and start and the block's ids / positions / n_ctx; two injections are
        counted, as when each upload was its own allocation), the device top-K's read-back buffer
        (dflash_topk.device_topk: B-1 depths x 8 candidates x 12 bytes), and the device-resident features:
        its pending rows (pending_cap = max(INJECT_CHUNK, B) per target layer, float32) plus the target
        runner's verify feature buffers it asks for (CudaRunner.tree_features: max_tree_nodes <=
        MAX_MASKED_TOKENS rows per target layer); the arena is the target's."""
        from .backends.cuda.ops import MAX_MASKED_TOKENS
        from .speculative.dflash_drafter import INJECT_CHUNK
        cfg = desc.cfg
        m, b = cfg.model, cfg.block_size
        inputs = 2 * (cfg.n_features * INJECT_CHUNK * m.hidden * 4 + INJECT_CHUNK * 4 + 4) + (2 * b * 4 + 4)
        features = cfg.n_features * (max(INJECT_CHUNK, b) + MAX_MASKED_TOKENS) * m.hidden * 4
        parts = [("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(m.n_layers, m.n_kv_heads, m.head_dim, max_ctx + b, kv_type)),
                 ("mask", b * b), ("inputs", inputs), ("topk", (b - 1) * 8 * 12), ("features", features)]
        return parts, SharedNeed(attention=int(self.attention_ws(m.n_heads, m.n_kv_heads, m.head_dim, max_ctx + b, b)))

    def mtp(self, desc: MTPDesc, max_ctx: int, prefill_chunk: int, kv_type: str) -> tuple[list, SharedNeed]:
        """MTPDrafter: the block's weights (eh_proj split by columns: the same bytes), its one-layer K/V cache
        (qwen35_mtp.mtp_cache_spec: max_ctx slots) and its inputs (StagedInputs: a replay chunk's ids, positions and
        target rows, n_past); its forward runs in the target's arena (a replay chunk is one attention layer of a
        prefill chunk) and decode attention workspace (the target's attention layers' shape)."""
        cfg = desc.cfg
        inputs = 4 * (2 * prefill_chunk + prefill_chunk * cfg.hidden + 1)
        parts = [("weights", self.weights(desc.tensors)),
                 ("kv_cache", kv_cache_bytes(1, cfg.n_kv_heads, cfg.head_dim, max_ctx, kv_type)),
                 ("inputs", inputs)]
        return parts, SharedNeed(attention=int(self.attention_ws(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, max_ctx,
                                                                 1)))

    def pflash(self, desc: ModelDesc, pc: PFlashConfig, n_tokens: int, kv_type: str) -> list:
        """The PFlash drafter over a prompt of up to n_tokens, on its own CudaOps: weights, its weight scratch,
        its arena (Drafter.tail_probs: one layer of the longest chunk + FlashPrefill scratch, grown to the
        largest prompt seen), and per compression the KV cache of every layer (a request may score with all)
        for the prompt's whole blocks, the tail scores and two chunks' ids / positions / n_past."""
        from .backends.cuda.backend import _arena_half_bytes
        cfg = desc.cfg
        longest, n_tail, n_blocks = _pflash_shape(cfg, pc, n_tokens)
        extra = (4 * (2 * -(-longest // pc.block) * cfg.n_heads * n_blocks + n_blocks * cfg.kv_dim
                      + 2 * n_tail * cfg.n_heads) + 8 * 256)
        return [("weights", self.weights(desc.tensors)),
                ("scratch", 4 * _largest_weight(cfg)),
                ("arena", 2 * (_arena_half_bytes(cfg, longest) + extra)),
                ("kv_cache", kv_cache_bytes(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim, n_blocks * pc.block, kv_type)),
                ("scores", 4 * n_tail * n_tokens),
                ("inputs", 2 * (2 * 4 * longest + 4))]

    def shared(self, needs) -> list:
        """The shared buffers at the largest need: the arena (two halves), two float16 weight scratches,
        the attention workspace (at least 16 bytes once reserved)."""
        needs = list(needs)
        if not needs:
            return []
        attention = max(n.attention for n in needs)
        return [("arena", 2 * max(n.arena_half for n in needs)),
                ("scratch", 4 * max(n.scratch_elems for n in needs)),
                ("attention_workspace", max(attention, 16))]


def persistent_forward_bytes(cfg, max_ctx: int, rows: int, n_ctas: int, attn_splits: int = 32) -> int:
    """fd_forward_create's device memory: the workspace carve() lays out (native/cuda/forward_plan.cuh, every
    piece 256-byte aligned) plus the per-layer KV pointer table and the GEMV stage index."""
    def take(n: int) -> int:
        return (n + 255) // 256 * 256
    f, d = 4, cfg.head_dim
    qd, kvd, group = cfg.n_heads * d, cfg.n_kv_heads * d, cfg.n_heads // cfg.n_kv_heads
    max_ht = 4 if d > 128 else 8                                          # fa_head_tile
    n_htiles = -(-group // min(group, max_ht))
    n_splits = min(-(-max_ctx // 64), attn_splits)                        # FA_CHUNK
    n_stages = 5 * cfg.n_layers + 1
    ws = (take(rows * cfg.hidden * f) + take(rows * qd * f) + 2 * take(rows * kvd * f) + take(rows * qd * f)
          + take(rows * cfg.ffn * f) + take(rows * cfg.vocab_size * f) + take(2 * rows * (cfg.rope_dim // 2) * f)
          + take(rows * cfg.n_heads * n_splits * (d + 2) * f) + 2 * take(n_ctas * 8 * 4)
          + take(rows * cfg.n_kv_heads * n_htiles * 4) + take((n_stages + 1) * 4)
          + take(cfg.n_layers * rows * cfg.hidden * f) + take(n_stages * n_ctas * 4 * 8))
    return ws + cfg.n_layers * 32 + (4 * cfg.n_layers + 1) * 4
