"""cffi binding of libflashd_cuda: the declarations come from native/include/flashd.h itself and the part
headers it includes (flashd_runtime.h, flashd_attention.h, ...), read in its include order.

`load()` returns the process-wide `NativeLib` (ffi + lib), building the library on first use.
`check(status, what)` turns a non-zero status into `CudaError` naming the call.
"""
from __future__ import annotations

import os
import re
import threading
from pathlib import Path

import cffi

from ....native import HEADER
from .build import build_library

__all__ = ["NativeLib", "CudaError", "load", "cdef_source"]

_lock = threading.Lock()
_loaded: "NativeLib | None" = None


class CudaError(RuntimeError):
    def __init__(self, status: int, what: str, message: str):
        super().__init__(f"{what}: {message} (status {status})")
        self.status = status
        self.is_oom = status == 2   # cudaErrorMemoryAllocation


def _cdef_part(header: Path) -> str:
    m = re.search(r"/\* --- cdef begin --- \*/(.*)/\* --- cdef end --- \*/", header.read_text(), re.S)
    if m is None:
        raise RuntimeError(f"{header}: cdef markers not found")
    return m.group(1)


def abi_headers(header: Path = HEADER) -> list[Path]:
    """flashd.h, then the headers it includes with #include "..." (the ABI's parts), in that order."""
    includes = re.findall(r'^#include "([^"]+)"', header.read_text(), re.M)
    return [header, *(header.parent / name for name in includes)]


def cdef_source(header: Path = HEADER) -> str:
    """The declarations cffi reads: the cdef part of flashd.h and of each header it includes."""
    return "\n".join(_cdef_part(h) for h in abi_headers(header))


class NativeLib:
    def __init__(self, path: Path):
        self.path = Path(path)
        self.ffi = cffi.FFI()
        self.ffi.cdef(cdef_source())
        self.lib = self.ffi.dlopen(str(self.path))
        if self.lib.fd_abi_version() != self.lib.FD_ABI_VERSION:
            raise RuntimeError(f"{self.path}: ABI version {self.lib.fd_abi_version()} != header's "
                               f"{self.lib.FD_ABI_VERSION}")

    def check(self, status: int, what: str) -> None:
        if status != 0:
            raise CudaError(status, what, self.ffi.string(self.lib.fd_status_string(status)).decode())

    def tuning(self) -> dict[str, int]:
        """The launch tuning in effect on the current device (flashd_tuning.h's fd_tuning_t, by field)."""
        t = self.ffi.new("fd_tuning_t*")
        self.check(self.lib.fd_tuning_get(t), "fd_tuning_get")
        return {name: int(getattr(t, name)) for name, _ in self.ffi.typeof("fd_tuning_t").fields}

    def set_tuning(self, **changes: int) -> dict[str, int]:
        """Replace fields of the current device's tuning (the rest stay); returns the tuning now in effect.
        Unknown fields raise KeyError, out-of-range values CudaError (FD_E_ARG, nothing changes)."""
        current = self.tuning()
        unknown = sorted(set(changes) - set(current))
        if unknown:
            raise KeyError(f"unknown tuning field(s) {', '.join(unknown)}; known: {', '.join(current)}")
        t = self.ffi.new("fd_tuning_t*", {**current, **{k: int(v) for k, v in changes.items()}})
        self.check(self.lib.fd_tuning_set(t), "fd_tuning_set")
        return self.tuning()


def load(path: str | os.PathLike | None = None) -> NativeLib:
    """The library at `path`, FLASHD_NATIVE_LIB, or built for the local GPU (cached)."""
    global _loaded
    with _lock:
        if _loaded is None:
            path = path or os.environ.get("FLASHD_NATIVE_LIB") or build_library()
            _loaded = NativeLib(Path(path))
        return _loaded
