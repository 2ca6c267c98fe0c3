"""The C ABI: flashd.h is cffi-clean, every declared function is defined in the CUDA sources,
and (where nvcc exists) the library compiles for sm_90 and exports every declared symbol.
Loading the library needs no GPU (the CUDA runtime is linked statically)."""
import os
import re
import shutil

import cffi
import pytest

from flashd.daemon.backends.cuda.lib import cdef_source
from flashd.native import CUDA_DIR


def declared_functions() -> list[str]:
    return re.findall(r"^(?:int|size_t|const char\*)\s+(fd_\w+)\s*\(", cdef_source(), re.M)


def test_header_is_cffi_clean():
    ffi = cffi.FFI()
    ffi.cdef(cdef_source())
    names = declared_functions()
    assert len(names) > 40 and len(set(names)) == len(names)


def test_every_declared_function_is_defined_once():
    sources = "\n".join(p.read_text() for p in CUDA_DIR.glob("*.cu"))
    for name in declared_functions():
        defs = re.findall(rf"^\s*(?:extern \"C\"\s+)?[\w\s\*]+?\b{name}\s*\([^;{{]*\)\s*\{{", sources, re.M)
        assert len(defs) == 1, f"{name}: {len(defs)} definitions in native/cuda/*.cu"


@pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: the compile check needs it")
def test_library_builds_and_exports_the_abi(tmp_path_factory):
    from flashd.daemon.backends.cuda.build import build_library
    from flashd.daemon.backends.cuda.lib import NativeLib

    arch = os.environ.get("FLASHD_NATIVE_TEST_ARCH", "sm_90")
    path = build_library(arch)
    lib = NativeLib(path)
    for name in declared_functions():
        assert hasattr(lib.lib, name), name
    assert lib.lib.fd_abi_version() == lib.lib.FD_ABI_VERSION
    assert lib.ffi.string(lib.lib.fd_status_string(-2)) == b"weight format not supported by this kernel"
