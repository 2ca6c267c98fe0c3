"""Device memory as tensors: `Device` (allocation, copies, one stream) and `DeviceTensor`.

A DeviceTensor is a typed, shaped, contiguous view of device memory. It keeps its `Allocation`
alive; views (reshape, row slices) share it. Arena tensors (`Arena.take`) share the arena's one
allocation and are valid until the arena is reset.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from .lib import NativeLib

__all__ = ["Device", "DeviceTensor", "Allocation", "Arena"]

ALIGN_BYTES = 256
# Device.upload_staged's pinned staging ring: the per-step inputs of speculative decoding (a verify tree's ~5 KB,
# a DFlash draft's few hundred bytes) pass through it; the ring is reused from its start after a synchronisation,
# so it wraps about once per few hundred steps. Larger uploads take upload()'s synchronous path.
STAGE_BYTES = 1 << 22
STAGE_MAX = 1 << 18

# The cffi pointer type of a tensor of each dtype (Device.p): a tensor passed where the C ABI declares another
# pointer type is a TypeError before the call. The ABI's `void*` parameters (weights, the float16 KV cache,
# workspaces, raw copies) take any of them.
CTYPES = {np.dtype(np.float32): "float*", np.dtype(np.int32): "int32_t*", np.dtype(np.uint8): "uint8_t*",
          np.dtype(np.bool_): "uint8_t*", np.dtype(np.float16): "uint16_t*", np.dtype(np.int64): "int64_t*",
          np.dtype(np.uint64): "uint64_t*", np.dtype(np.float64): "double*", np.dtype(np.int8): "int8_t*"}


class Allocation:
    """One cudaMalloc'd block, freed when the last tensor referring to it goes away."""

    __slots__ = ("native", "ptr", "n_bytes")

    def __init__(self, native: NativeLib, n_bytes: int):
        self.native = native
        self.n_bytes = n_bytes
        out = native.ffi.new("void**")
        native.check(native.lib.fd_malloc(out, max(n_bytes, 1)), f"cudaMalloc({n_bytes} bytes)")
        self.ptr = int(native.ffi.cast("uintptr_t", out[0]))

    def free(self) -> None:
        if self.ptr:
            self.native.lib.fd_free(self.native.ffi.cast("void*", self.ptr))
            self.ptr = 0

    def __del__(self):
        try:
            self.free()
        except Exception:   # interpreter shutdown: the process is exiting anyway
            pass


XCODES_GROUP = 128     # x_codes.cuh: columns an int8 code scale covers
XCODES_ROWS = 32       # rows between a group's scales


@dataclass(slots=True, eq=False)
class XCodes:
    """An activation's int8 codes as x_codes.cuh lays them out (flashd_attention.h o_codes): q (rows rounded up to 8,
    cols) int8, sc (ceil(rows / 32) * groups, 32) float32 -- row i's scale of group g at sc[(i // 32) * groups + g,
    i % 32]. `rows` slices them as fd_gemv_xq reads a call's rows (within one block of 32)."""
    q: "DeviceTensor"
    sc: "DeviceTensor"
    groups: int

    def rows(self, s: int, e: int) -> tuple["DeviceTensor", "DeviceTensor"]:
        """(codes, scales) of rows s .. e - 1, which must lie in one block of 32 (GEMV groups of 8 or 32 do)."""
        if (e - 1) // XCODES_ROWS != s // XCODES_ROWS:
            raise ValueError(f"x codes rows {s}..{e - 1} cross a block of {XCODES_ROWS}")
        cols = self.q.shape[1]
        q = DeviceTensor(self.q.ptr + s * cols, (e - s, cols), self.q.dtype, self.q.owner)
        at = ((s // XCODES_ROWS) * self.groups * XCODES_ROWS + s % XCODES_ROWS) * 4
        sc = DeviceTensor(self.sc.ptr + at, (self.groups, XCODES_ROWS), self.sc.dtype, self.sc.owner)
        return q, sc


@dataclass(slots=True, eq=False)
class DeviceTensor:
    ptr: int
    shape: tuple[int, ...]
    dtype: np.dtype
    owner: object = None           # Allocation or Arena keeping the memory alive
    codes: object = None           # XCodes: this tensor's int8 codes where its producer made them (attention's o)

    @property
    def size(self) -> int:
        return math.prod(self.shape)

    @property
    def nbytes(self) -> int:
        return self.size * self.dtype.itemsize

    @property
    def ndim(self) -> int:
        return len(self.shape)

    def reshape(self, *shape: int) -> "DeviceTensor":
        if len(shape) == 1 and isinstance(shape[0], tuple):
            shape = shape[0]
        if -1 in shape:
            known = math.prod(d for d in shape if d != -1)
            shape = tuple(self.size // known if d == -1 else d for d in shape)
        if math.prod(shape) != self.size:
            raise ValueError(f"cannot reshape {self.shape} to {shape}")
        return DeviceTensor(self.ptr, tuple(shape), self.dtype, self.owner)

    def __getitem__(self, key) -> "DeviceTensor":
        """Row slices only (contiguous): t[a:b]."""
        if not isinstance(key, slice) or key.step not in (None, 1):
            raise TypeError("DeviceTensor supports contiguous row slices t[a:b] only")
        start, stop, _ = key.indices(self.shape[0])
        stop = max(stop, start)
        row_bytes = self.nbytes // self.shape[0] if self.shape[0] else 0
        return DeviceTensor(self.ptr + start * row_bytes, (stop - start, *self.shape[1:]), self.dtype, self.owner)


class Arena:
    """Activation scratch: two halves used alternately, one per layer, each a bump allocator.

    Layer i takes from half i % 2 after resetting it, so it may read the previous layer's output
    (in the other half) while everything older is recycled. The same sequence of takes yields
    the same addresses, which is what lets a captured CUDA graph be replayed.
    """

    def __init__(self, device: "Device", half_bytes: int):
        self.alloc = Allocation(device.native, 2 * half_bytes)
        self.half_bytes = half_bytes
        self.half = 1
        self.offset = 0
        self.high_water = 0        # most bytes any half held

    def reset(self) -> None:
        """A new forward: start in half 1 so that layer 0 gets half 0."""
        self.half, self.offset = 1, 0

    def switch(self, index: int) -> None:
        self.half, self.offset = index % 2, 0

    def take(self, shape: tuple[int, ...], dtype=np.float32) -> DeviceTensor:
        dtype = np.dtype(dtype)
        n_bytes = math.prod(shape) * dtype.itemsize
        start = self.offset
        end = start + (n_bytes + ALIGN_BYTES - 1) // ALIGN_BYTES * ALIGN_BYTES
        if end > self.half_bytes:
            raise MemoryError(f"activation arena exhausted: a layer needs more than {self.half_bytes} bytes")
        self.offset = end
        self.high_water = max(self.high_water, end)
        return DeviceTensor(self.alloc.ptr + self.half * self.half_bytes + start, tuple(shape), dtype, self)


class Device:
    """One GPU, the native library and the stream every op is issued on."""

    def __init__(self, native: NativeLib, index: int = 0):
        self.native = native
        self.ffi, self.lib = native.ffi, native.lib
        self.index = index
        native.check(self.lib.fd_set_device(index), f"cudaSetDevice({index})")
        out = self.ffi.new("void**")
        native.check(self.lib.fd_stream_create(out), "cudaStreamCreate")
        self.stream = out[0]
        self.capturing = False       # set by graphs.capture while a graph is being recorded from the stream
        self._stage = None           # upload_staged's pinned ring (made on first use; lives with the process)
        self._stage_bytes = self._stage_off = 0

    # -- info ------------------------------------------------------------------------------------
    def info(self) -> dict:
        name = self.ffi.new("char[256]")
        ints = [self.ffi.new("int*") for _ in range(5)]
        total = self.ffi.new("size_t*")
        self.native.check(self.lib.fd_device_info(self.index, name, 256, ints[0], ints[1], ints[2], total,
                                                  ints[3], ints[4]), "cudaGetDeviceProperties")
        return {"name": self.ffi.string(name).decode(), "cc": f"{ints[0][0]}.{ints[1][0]}", "n_sms": ints[2][0],
                "total_bytes": int(total[0]), "mem_clock_khz": ints[3][0], "mem_bus_bits": ints[4][0]}

    def mem_info(self) -> tuple[int, int]:
        free, total = self.ffi.new("size_t*"), self.ffi.new("size_t*")
        self.native.check(self.lib.fd_mem_info(free, total), "cudaMemGetInfo")
        return int(free[0]), int(total[0])

    # -- memory ----------------------------------------------------------------------------------
    def p(self, t: DeviceTensor | None, ctype: str | None = None):
        """The cffi pointer of a tensor (NULL for None), typed by its dtype (CTYPES) unless `ctype` names
        the type (raw memory: the benchmarks and tests that reinterpret bytes)."""
        if t is None:
            return self.ffi.NULL
        return self.ffi.cast(ctype or CTYPES[t.dtype], t.ptr)

    def empty(self, shape, dtype=np.float32) -> DeviceTensor:
        shape = tuple(int(d) for d in (shape if isinstance(shape, (tuple, list)) else (shape,)))
        dtype = np.dtype(dtype)
        alloc = Allocation(self.native, math.prod(shape) * dtype.itemsize)
        return DeviceTensor(alloc.ptr, shape, dtype, alloc)

    def fill_bytes(self, t: DeviceTensor, byte_value: int) -> None:
        self.native.check(self.lib.fd_memset(self.p(t), byte_value, t.nbytes, self.stream), "cudaMemset")

    def upload(self, array: np.ndarray, out: DeviceTensor | None = None) -> DeviceTensor:
        array = np.ascontiguousarray(array)
        t = out if out is not None else self.empty(array.shape, array.dtype)
        if t.nbytes != array.nbytes:
            raise ValueError(f"upload of {array.nbytes} bytes into a {t.nbytes}-byte tensor")
        src = self.ffi.from_buffer("char[]", array)
        self.native.check(self.lib.fd_memcpy_h2d(self.p(t), src, array.nbytes, self.stream), "memcpy H2D")
        self.synchronize()   # the host buffer may be freed as soon as we return
        return t

    def upload_staged(self, array: np.ndarray, out: DeviceTensor) -> DeviceTensor:
        """upload() into `out` without the synchronisation: the bytes are copied into a pinned staging ring first,
        so the stream-ordered copy (after every kernel queued before it, e.g. the last readers of `out`) reads
        memory that nothing frees or rewrites before it runs -- the ring is rewritten only after a synchronize.
        The host can then queue the kernels that read `out` while the GPU still works on earlier ones. Not during a
        graph capture (the copy would be recorded reading the ring, which later replays would not refill)."""
        array = np.ascontiguousarray(array)
        if out.nbytes != array.nbytes:
            raise ValueError(f"upload of {array.nbytes} bytes into a {out.nbytes}-byte tensor")
        if self.capturing:
            raise RuntimeError("upload_staged during a graph capture: inputs are uploaded before a replay")
        n = array.nbytes
        if n > min(STAGE_MAX, self._stage_bytes or STAGE_BYTES):
            return self.upload(array, out)
        if self._stage is None:
            ring = self.ffi.new("void**")
            self.native.check(self.lib.fd_host_alloc(ring, STAGE_BYTES), "cudaHostAlloc(staging ring)")
            self._stage, self._stage_bytes = self.ffi.cast("char*", ring[0]), STAGE_BYTES
        start = (self._stage_off + 63) // 64 * 64
        if start + n > self._stage_bytes:
            self.synchronize()          # every earlier staged copy has run: the ring is free again
            start = 0
        self.ffi.memmove(self._stage + start, self.ffi.from_buffer("char[]", array), n)
        self.native.check(self.lib.fd_memcpy_h2d(self.p(out), self._stage + start, n, self.stream), "memcpy H2D")
        self._stage_off = start + n
        return out

    def download(self, t: DeviceTensor, out: np.ndarray | None = None) -> np.ndarray:
        """t's contents in a new host array, or in `out` (C-contiguous, t's shape and dtype)."""
        if out is None:
            out = np.empty(t.shape, t.dtype)
        elif out.shape != t.shape or out.dtype != t.dtype or not out.flags.c_contiguous:
            raise ValueError(f"download into {out.shape} {out.dtype} (contiguous: {out.flags.c_contiguous}) "
                             f"from a {t.shape} {t.dtype} tensor")
        self.native.check(self.lib.fd_memcpy_d2h(self.ffi.from_buffer("char[]", out), self.p(t), t.nbytes,
                                                 self.stream), "memcpy D2H")
        self.synchronize()
        return out

    def copy(self, dst: DeviceTensor, src: DeviceTensor) -> None:
        if dst.nbytes != src.nbytes:
            raise ValueError("copy between tensors of different sizes")
        self.native.check(self.lib.fd_memcpy_d2d(self.p(dst), self.p(src), src.nbytes, self.stream), "memcpy D2D")

    def synchronize(self) -> None:
        self.native.check(self.lib.fd_stream_synchronize(self.stream), "cudaStreamSynchronize")
