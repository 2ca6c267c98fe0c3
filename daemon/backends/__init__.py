"""Backends behind the one `Ops` interface (base.py): `reference` (numpy) and `cuda` (native).

A backend object bundles its `ops`, a memory `plan` checked before anything is allocated, and a
`make_runner` that builds the decode loop suited to it.
"""
from __future__ import annotations

import os
import shutil
from dataclasses import dataclass

from .base import Backend

__all__ = ["select_backend", "BackendUnavailable", "ReferenceBackend", "cuda_unavailable_reason"]


class BackendUnavailable(RuntimeError):
    """The requested device cannot be used here; the message says why."""


@dataclass(slots=True, frozen=True)
class HostMemoryPlan:
    weights_bytes: int
    kv_bytes: int

    @property
    def total_bytes(self) -> int:
        return self.weights_bytes + self.kv_bytes

    def as_dict(self) -> dict:
        return {"weights_bytes": self.weights_bytes, "kv_bytes": self.kv_bytes, "total_bytes": self.total_bytes}


class ReferenceBackend(Backend):
    name = "reference"

    def __init__(self):
        from .reference import ReferenceOps
        self.ops = ReferenceOps()

    def info(self) -> dict:
        return {"name": "cpu (numpy reference)", "n_cpus": os.cpu_count()}

    def plan(self, cfg, weight_bytes: int, max_ctx: int, prefill_chunk: int, kv_types=None,
             max_tree_nodes: int | None = None) -> HostMemoryPlan:
        """kv_types (kv_types.KVTypes, None: f16): f16 rows are float32 here, q8_0 / q4_0 rows ggml's blocks.
        max_tree_nodes (make_runner's) is not counted: a hybrid's node states grow in host RAM on the first verify
        (vram_sizes.HostSizes counts them for --vram-budget)."""
        from .kv_types import KVTypes, row_bytes
        kv_types = kv_types or KVTypes()
        kv_types.check_head_dim(cfg.head_dim)
        per_layer = cfg.hidden * (2 * cfg.q_dim + 2 * cfg.kv_dim) + 3 * cfg.hidden * cfg.ffn
        n_params = cfg.vocab_size * cfg.hidden * (1 if cfg.tie_embeddings else 2) + cfg.n_layers * per_layer
        row = sum(4 * cfg.head_dim if t == "f16" else row_bytes(t, cfg.head_dim) for t in (kv_types.k, kv_types.v))
        kv = cfg.n_layers * max_ctx * cfg.n_kv_heads * row
        return HostMemoryPlan(weights_bytes=4 * n_params, kv_bytes=kv)

    def check_fits(self, plan) -> None:
        try:
            avail = os.sysconf("SC_AVPHYS_PAGES") * os.sysconf("SC_PAGE_SIZE")
        except (ValueError, OSError):
            return
        if plan.total_bytes > avail:
            raise MemoryError(f"the reference backend needs {plan.total_bytes / 2**30:.2f} GiB of RAM for float32 "
                              f"weights and KV cache but {avail / 2**30:.2f} GiB are available; lower --max-ctx")

    def make_runner(self, cfg, weights, max_ctx: int, prefill_chunk: int, plan=None, kv_types=None,
                    max_tree_nodes: int | None = None):
        from ..runner import ModelRunner
        return ModelRunner(self.ops, cfg, weights, max_ctx, prefill_chunk, kv_types, max_tree_nodes)


def cuda_unavailable_reason() -> str | None:
    """None when the CUDA backend can run here, else the reason it cannot."""
    if shutil.which("nvidia-smi") is None and not os.path.exists("/dev/nvidia0"):
        return "no NVIDIA GPU found"
    if not os.environ.get("FLASHD_NATIVE_LIB"):
        from .cuda.build import find_nvcc
        if find_nvcc() is None:
            return "nvcc not found to build the native library (or set FLASHD_NATIVE_LIB)"
    return None


def select_backend(device: str):
    """`cpu` -> reference; `cuda` -> the native backend (error if unavailable); `auto` -> cuda when
    it can run, else reference."""
    if device == "cpu":
        return ReferenceBackend()
    if device not in ("cuda", "auto"):
        raise ValueError(f"unknown device {device!r}")
    reason = cuda_unavailable_reason()
    if reason is None:
        try:
            from .cuda.backend import CudaBackend
            return CudaBackend()
        except Exception as exc:       # build failure, driver mismatch: say why
            reason = f"{type(exc).__name__}: {exc}"
    if device == "cuda":
        raise BackendUnavailable(f"--device cuda: {reason}")
    import logging
    logging.getLogger("flashd.backends").info("using the CPU reference backend: %s", reason)
    return ReferenceBackend()
