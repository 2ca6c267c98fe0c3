"""The HIP compile check (README "AMD / HIP"): where hipcc (ROCm) is installed, libflashd_hip builds from
the CUDA sources through native/hip/compat.h for one wave32 AMD target and exports the whole C ABI of
flashd.h, and compat.h refuses a wave64 target. Nothing here runs a kernel: loading the library needs
no GPU, and nothing of it is run-tested on AMD hardware."""
import os
import re
import subprocess

import pytest

from flashd.daemon.backends.cuda.build import HIP_DEFAULT_ARCH, _hip_env, build_hip_library, find_hipcc
from flashd.daemon.backends.cuda.lib import cdef_source
from flashd.native import HIP_DIR


def declared_functions() -> list[str]:          # as tests/native/test_native_abi.py
    return re.findall(r"^(?:int|size_t|const char\*)\s+(fd_\w+)\s*\(", cdef_source(), re.M)

needs_hipcc = pytest.mark.skipif(
    find_hipcc() is None,
    reason="hipcc not installed (ROCm; Debian: apt-get install hipcc): the HIP compile check needs it")


@needs_hipcc
def test_hip_library_builds_and_exports_the_abi():
    from flashd.daemon.backends.cuda.lib import NativeLib

    arch = os.environ.get("FLASHD_NATIVE_TEST_HIP_ARCH", HIP_DEFAULT_ARCH)
    path = build_hip_library(arch)
    assert path.name.startswith(f"libflashd_hip-{arch}-")
    lib = NativeLib(path)                       # dlopen only: no HIP call that needs a device
    for name in declared_functions():
        assert hasattr(lib.lib, name), name
    assert lib.lib.fd_abi_version() == lib.lib.FD_ABI_VERSION
    assert lib.ffi.string(lib.lib.fd_status_string(lib.lib.FD_E_UNSUPPORTED)).startswith(b"not available in this build")


@needs_hipcc
def test_compat_refuses_a_wave64_target(tmp_path):
    src = tmp_path / "wave64.cu"
    src.write_text(f'#include "{HIP_DIR / "compat.h"}"\n__global__ void k(float* x) {{ x[0] = 1.0f; }}\n')
    res = subprocess.run([find_hipcc(), "-x", "hip", "--offload-arch=gfx90a", "-c", str(src), "-o",
                          str(tmp_path / "wave64.o")], capture_output=True, text=True, env=_hip_env())
    assert res.returncode != 0
    assert "needs a wave32 target" in res.stdout + res.stderr
