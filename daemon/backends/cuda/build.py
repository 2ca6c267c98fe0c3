"""Building libflashd_cuda.so with nvcc, cached by a hash of sources, flags, arch and compiler.
build_hip_library() builds libflashd_hip.so from the same sources with hipcc for one AMD target
(through native/hip/compat.h; a compile check -- nothing of it is run-tested on AMD hardware).

`flashd build [--arch sm_XX]` forces a build; the CUDA backend builds on first use. The library
lands in the user cache dir (FLASHD_CACHE_DIR, else $XDG_CACHE_HOME/flashd, else ~/.cache/flashd)
under native/, named by its key, so different sources or GPUs never share a stale build.
FLASHD_NATIVE_LIB names a prebuilt library to use instead (e.g. one compiled on another machine).
"""
from __future__ import annotations

import concurrent.futures
import fcntl
import hashlib
import os
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

from ....native import CUDA_DIR, HIP_DIR, INCLUDE_DIR

__all__ = ["BuildError", "BuildSpec", "build_library", "library_path", "cache_dir", "detect_arch",
           "HipBuildSpec", "HIP_DEFAULT_ARCH", "build_hip_library", "hip_library_path", "find_hipcc"]


class BuildError(RuntimeError):
    """The native library could not be built; the message carries the compiler's output."""


def cache_dir() -> Path:
    if os.environ.get("FLASHD_CACHE_DIR"):
        return Path(os.environ["FLASHD_CACHE_DIR"])
    base = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    return Path(base) / "flashd"


def find_nvcc() -> str | None:
    for candidate in (os.environ.get("NVCC"), shutil.which("nvcc"), "/usr/local/cuda/bin/nvcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def detect_arch() -> str | None:
    """sm_XX of GPU 0 from nvidia-smi, or None when no GPU is visible."""
    smi = shutil.which("nvidia-smi")
    if smi is None:
        return None
    try:
        out = subprocess.run([smi, "--query-gpu=compute_cap", "--format=csv,noheader"], capture_output=True,
                             text=True, timeout=20, check=True).stdout.split()
    except (subprocess.SubprocessError, OSError):
        return None
    if not out:
        return None
    major, minor = out[0].strip().split(".")
    return f"sm_{major}{minor}"


@dataclass(slots=True, frozen=True)
class BuildSpec:
    arch: str                       # sm_90, sm_89, ...
    nvcc: str
    debug: bool = False

    def __post_init__(self):
        if not (self.arch.startswith("sm_") and self.arch[3:].rstrip("a").isdigit()):
            raise BuildError(f"arch must look like sm_90 or sm_90a, got {self.arch!r}")

    @property
    def flags(self) -> list[str]:
        gencode = f"-gencode=arch=compute_{self.arch[3:]},code={self.arch}"
        opt = ["-O0", "-G"] if self.debug else ["-O3", "--use_fast_math", "-lineinfo"]
        return ["-std=c++17", gencode, *opt, "-Xcompiler=-fPIC", "--expt-relaxed-constexpr",
                "-Xptxas=-warn-spills"]


def _sources() -> list[Path]:
    return sorted(CUDA_DIR.glob("*.cu"))


def _source_key(compiler_version: str, flags: list[str]) -> str:
    """The cache key of a library build (CUDA or HIP): sha256 over the compiler's --version, the flags and
    every native source's name and bytes, 16 hex digits; a change to any of them is another file in the cache."""
    h = hashlib.sha256()
    h.update(compiler_version.encode())
    h.update(" ".join(flags).encode())
    for f in [*sorted(INCLUDE_DIR.glob("*.h")), *sorted(CUDA_DIR.glob("*.cu*")), *sorted(HIP_DIR.glob("*.h"))]:
        h.update(f.name.encode())
        h.update(f.read_bytes())
    return h.hexdigest()[:16]


def _key(spec: BuildSpec) -> str:
    return _source_key(subprocess.run([spec.nvcc, "--version"], capture_output=True, text=True).stdout, spec.flags)


def library_path(spec: BuildSpec) -> Path:
    return cache_dir() / "native" / f"libflashd_cuda-{spec.arch}-{_key(spec)}.so"


def _compile(spec: BuildSpec, src: Path, obj: Path) -> None:
    cmd = [spec.nvcc, *spec.flags, "-c", str(src), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True)
    if res.returncode != 0:
        raise BuildError(f"nvcc failed on {src.name}:\n$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")


def _locked_build(out: Path, sources: list[Path], compile_one, link_cmd, *, force: bool, jobs: int | None,
                  env: dict | None = None, log=None, what: str = "") -> Path:
    """Compile every source (compile_one(src, obj)) in parallel and link (link_cmd(objs, tmp)) to `out`,
    unless it is cached; one builder per key, others wait on the lock and reuse the result."""
    out.parent.mkdir(parents=True, exist_ok=True)
    with open(out.with_suffix(".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        if out.exists() and not force:
            return out
        work = out.with_suffix(".build")
        shutil.rmtree(work, ignore_errors=True)
        work.mkdir()
        objs = [work / (s.stem + ".o") for s in sources]
        if log:
            log(f"building {out.name} from {len(sources)} sources {what}")
        with concurrent.futures.ThreadPoolExecutor(jobs or os.cpu_count() or 2) as pool:
            for fut in [pool.submit(compile_one, s, o) for s, o in zip(sources, objs)]:
                fut.result()
        tmp = work / out.name
        cmd = link_cmd(objs, tmp)
        res = subprocess.run(cmd, capture_output=True, text=True, env=env)
        if res.returncode != 0:
            raise BuildError(f"link failed:\n$ {' '.join(cmd)}\n{res.stdout}{res.stderr}")
        os.replace(tmp, out)
        shutil.rmtree(work, ignore_errors=True)
        return out


def build_library(arch: str | None = None, *, force: bool = False, debug: bool = False,
                  jobs: int | None = None, log=None) -> Path:
    """Build (or find in the cache) the library for `arch` (default: the local GPU's)."""
    nvcc = find_nvcc()
    if nvcc is None:
        raise BuildError("nvcc not found (set NVCC or put the CUDA toolkit's bin/ on PATH)")
    arch = arch or detect_arch()
    if arch is None:
        raise BuildError("no GPU visible to detect the architecture; pass --arch sm_XX")
    spec = BuildSpec(arch=arch, nvcc=nvcc, debug=debug)

    def link(objs, tmp):
        return [nvcc, "-shared", f"-gencode=arch=compute_{arch[3:]},code={arch}", "-cudart=static",
                "-o", str(tmp), *map(str, objs)]

    return _locked_build(library_path(spec), _sources(), lambda s, o: _compile(spec, s, o), link, force=force,
                         jobs=jobs, log=log, what=f"with {nvcc} for {arch}")


# ---- HIP (AMD) ------------------------------------------------------------------------------------------
# The same .cu sources compiled as HIP through native/hip/compat.h. The kernels assume 32-lane warps,
# so only wave32 targets build (RDNA: gfx10xx, gfx11xx; compat.h stops a wave64 CDNA target such as
# gfx90a with an #error). gfx1030 (RDNA2) is the default: ROCm 5.2 -- Debian's hipcc -- supports it.
HIP_DEFAULT_ARCH = "gfx1030"


def find_hipcc() -> str | None:
    for candidate in (os.environ.get("HIPCC"), shutil.which("hipcc"), "/opt/rocm/bin/hipcc"):
        if candidate and os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    return None


def _hip_env() -> dict:
    return {**os.environ, "HIP_PLATFORM": "amd"}   # hipcc would otherwise pick nvcc where CUDA is installed


@dataclass(slots=True, frozen=True)
class HipBuildSpec:
    arch: str                       # gfx1030, gfx1100, ...
    hipcc: str
    opt: str = "-O0"                # a compile check (see build_hip_library)

    def __post_init__(self):
        if not (self.arch.startswith("gfx") and self.arch[3:].isalnum()):
            raise BuildError(f"HIP arch must look like gfx1030, got {self.arch!r}")

    @property
    def flags(self) -> list[str]:
        return ["-x", "hip", f"--offload-arch={self.arch}", "-std=c++17", self.opt, "-fPIC",
                "-Wno-unused-result", "-Wno-unused-value", "-Wno-cuda-compat"]


def _hip_key(spec: HipBuildSpec) -> str:
    return _source_key(subprocess.run([spec.hipcc, "--version"], capture_output=True, text=True,
                                      env=_hip_env()).stdout, spec.flags)


def hip_library_path(spec: HipBuildSpec) -> Path:
    return cache_dir() / "native" / f"libflashd_hip-{spec.arch}-{_hip_key(spec)}.so"


def _hip_compile(spec: HipBuildSpec, src: Path, obj: Path) -> None:
    cmd = [spec.hipcc, *spec.flags, "-c", str(src), "-o", str(obj)]
    res = subprocess.run(cmd, capture_output=True, text=True, env=_hip_env())
    if res.returncode != 0:
        raise BuildError(f"hipcc failed on {src.name}:\n$ HIP_PLATFORM=amd {' '.join(cmd)}\n{res.stdout}{res.stderr}")


def build_hip_library(arch: str = HIP_DEFAULT_ARCH, *, force: bool = False, jobs: int | None = None,
                      opt: str = "-O0", log=None) -> Path:
    """Build (or find in the cache) libflashd_hip for the AMD target `arch` with hipcc.

    -O0 by default: this build is a compile check (CI), and ROCm 5.2's device compile of forward.cu
    (the persistent forward, 8 row-count instantiations, fully inlined) takes about 2 minutes at -O0
    on 2 cores but more than 15 at -O1. Pass opt="-O3" for a library meant to run."""
    hipcc = find_hipcc()
    if hipcc is None:
        raise BuildError("hipcc not found (set HIPCC, or install ROCm's hipcc: apt-get install hipcc)")
    spec = HipBuildSpec(arch=arch, hipcc=hipcc, opt=opt)

    def link(objs, tmp):
        return [hipcc, f"--offload-arch={arch}", "-shared", "-fPIC", "-o", str(tmp), *map(str, objs)]

    return _locked_build(hip_library_path(spec), _sources(), lambda s, o: _hip_compile(spec, s, o), link,
                         force=force, jobs=jobs, env=_hip_env(), log=log, what=f"with {hipcc} for {arch}")


def build_command():
    """The `flashd build` click command (made lazily so importing this module needs no click)."""
    import click

    @click.command("build")
    @click.option("--arch", default=None, help="sm_XX (default: the local GPU's); with --hip gfxNNNN "
                  f"(default {HIP_DEFAULT_ARCH})")
    @click.option("--force/--no-force", default=True, show_default=True, help="rebuild even if cached")
    @click.option("--debug", is_flag=True, help="-G -O0 device debug build")
    @click.option("--hip", is_flag=True, help="build libflashd_hip with hipcc for an AMD target instead "
                  "(compile-checked only; see the README's AMD / HIP)")
    def command(arch, force, debug, hip):
        """Build libflashd_cuda for this GPU (or --arch) and print its path."""
        import sys
        log = lambda m: print(m, file=sys.stderr)   # noqa: E731
        try:
            if hip:
                path = build_hip_library(arch or HIP_DEFAULT_ARCH, force=force, log=log)
            else:
                path = build_library(arch, force=force, debug=debug, log=log)
        except BuildError as exc:
            raise click.ClickException(str(exc))
        click.echo(str(path))

    return command
