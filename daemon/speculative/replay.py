"""forward_replay(ops): how a drafter runs a forward whose inputs sit in kept buffers -- replayed as a CUDA graph
on a backend that has them (backends/cuda/graphs.py GraphCache: captured on the first call with a key), run
directly elsewhere (the reference backend, whose ops are the oracle). Both return body()'s result; on the GPU
a replay skips the host's per-op work (a DFlash block is ~35 launches, each ~15 us of Python when eager)."""
from __future__ import annotations

from typing import Callable

__all__ = ["forward_replay", "EagerReplay"]


class EagerReplay:
    """run(key, body) is body(): for backends without graphs."""

    captures = replays = 0

    def run(self, key, body: Callable):
        return body()

    def clear(self) -> None:
        pass

    def __len__(self) -> int:
        return 0


def forward_replay(ops):
    """A GraphCache on ops with a CUDA device and an arena (CudaOps), an EagerReplay otherwise."""
    if getattr(ops, "dev", None) is None or not hasattr(ops, "arena"):
        return EagerReplay()
    from ..backends.cuda.graphs import GraphCache
    return GraphCache(ops)
