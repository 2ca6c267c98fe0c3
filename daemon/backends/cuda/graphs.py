"""CUDA graphs of forwards: `capture` (a body's launches recorded from the stream) and `GraphCache` (forwards
captured once per key and replayed afterwards, e.g. the DFlash drafter's block and context injection).

A graph records raw device addresses. A body may be captured only if every launch in it reads and writes memory
that stays where it is between replays: kept input buffers (filled by uploads before the replay, never inside the
body), weights, KV caches, and the ops' arena / weight scratch / attention workspace (whose bump allocations repeat
the same addresses for the same sequence of takes). GraphCache checks the last three before every replay
(`memory_token`) and drops its graphs when any moved or shrank.
"""
from __future__ import annotations

import gc
from collections import OrderedDict
from typing import Callable

__all__ = ["capture", "memory_token", "GraphCache"]


def capture(dev, body: Callable):
    """(graph, body()) with body's launches captured from dev.stream. Python's cyclic garbage collector is off
    meanwhile: a collection may run the __del__ of an unreachable runner, plan or allocation, whose cudaFree /
    synchronize is illegal during a capture and invalidates it (the next launch then fails with status 901,
    'operation failed due to a previous error during capture', in whatever runner is capturing)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        dev.native.check(dev.lib.fd_graph_begin_capture(dev.stream), "begin capture")
        dev.capturing = True
        try:
            result = body()
        finally:
            dev.capturing = False
            out = dev.ffi.new("void**")
            status = dev.lib.fd_graph_end_capture(dev.stream, out)
    finally:
        if was_enabled:
            gc.enable()
    dev.native.check(status, "end capture")
    return out[0], result


def _where(t) -> tuple[int, int]:
    """(device address, bytes) of a tensor, (0, 0) for None."""
    return (0, 0) if t is None else (int(t.ptr), int(t.nbytes))


def memory_token(ops) -> tuple:
    """Where the ops' shared buffers are: the arena, the weight scratch and the attention workspace (address and
    size each). reserve_* and release replace these buffers (never resize them in place), so a forward captured
    under one token may be replayed while the token is unchanged."""
    arena = ops.arena
    return ((0, 0) if arena is None else (int(arena.alloc.ptr), int(arena.half_bytes)),
            tuple(_where(t) for t in ops.scratch), _where(ops.attn_workspace))


class GraphCache:
    """Forwards on `ops` (CudaOps) captured once per key and replayed after.

    run(key, body): body() issues a forward's launches and returns what it computed (device tensors); it must
    not upload, download, synchronize or allocate outside the arena, and its inputs must sit in kept buffers
    (the same addresses on every call with this key). The first call with a key runs body() eagerly (first-use
    kernel setup and lazily made buffers happen outside capture), captures it and replays it; later calls replay
    only. Every call returns the same tensors, valid until the next forward on the ops writes the arena."""

    def __init__(self, ops, capacity: int = 32):
        if capacity < 1:
            raise ValueError("a graph cache holds at least one graph")
        self.ops, self.dev, self.capacity = ops, ops.dev, capacity
        self._graphs: OrderedDict[object, tuple] = OrderedDict()    # key -> (graph, result)
        self._token: tuple | None = None
        self.captures = 0        # graphs captured (tests and stats)
        self.replays = 0         # graph launches

    def __len__(self) -> int:
        return len(self._graphs)

    def run(self, key, body: Callable):
        token = memory_token(self.ops)
        if token != self._token:
            self.clear()
            self._token = token
        hit = self._graphs.get(key)
        if hit is None:
            body()
            self.dev.synchronize()
            hit = capture(self.dev, body)
            self.captures += 1
            self._graphs[key] = hit
            if len(self._graphs) > self.capacity:
                _, (old, _) = self._graphs.popitem(last=False)
                self.dev.lib.fd_graph_destroy(old)
        else:
            self._graphs.move_to_end(key)
        graph, result = hit
        self.dev.native.check(self.dev.lib.fd_graph_launch(graph, self.dev.stream), "graph launch")
        self.replays += 1
        return result

    def clear(self) -> None:
        """Destroy every graph (after the stream has finished with them)."""
        if self._graphs:
            self.dev.synchronize()
            for graph, _ in self._graphs.values():
                self.dev.lib.fd_graph_destroy(graph)
            self._graphs.clear()
