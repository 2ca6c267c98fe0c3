"""The C ABI: flashd.h is cffi-clean, every declared function is defined in the CUDA sources,
and (where nvcc exists) the library compiles for sm_90 and exports every declared symbol.
Loading the library needs no GPU (the CUDA runtime is linked statically)."""
import ast
import os
import re
import shutil
from pathlib import Path

import cffi
import pytest

from flashd.daemon.backends.cuda.lib import cdef_source
from flashd.native import CUDA_DIR

ROOT = Path(__file__).resolve().parents[2]


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


ABI_VERSION = 31   # flashd.h FD_ABI_VERSION; bump both together, with the header's history comment


def test_abi_version_is_pinned_and_the_recurrent_part_is_declared():
    """A change to the C ABI bumps FD_ABI_VERSION (NativeLib refuses a library of another version) and this pin;
    11 added fd_tuning_t.weights_evict_first; 12 added flashd_recurrent.h (the hybrid models' conv1d and gated delta
    rule); 13 added fd_tuning_t.attn_single_chunks; 14 the
    hybrid's gates (fd_mul, fd_silu, fd_sigmoid, fd_sigmoid_mul, fd_copy_cols, fd_delta_decay); 15 the hybrid's
    fused ops (fd_causal_conv1d_silu*, fd_gated_delta_rule_fused*, fd_gated_qk_norm); 16 fd_tuning_t.delta_cluster; 17
    fd_tuning_t.gemv_prewait; 18 gemv_prewait removed, fd_tuning_t.gemv_xq_prepass_cols,
    gemv_xq_prepass_norm_cols, gemv_swiglu_stage_bytes; 19 fd_tuning_t.gemv_swiglu_pair; 20 fd_tuning_t.gemv_xq_direct,
    gemv_split_cols; 21 the KV window (fd_attention_shape_t.window / window_slots, fd_kv_window_offset,
    fd_kv_compact_ring); 22 fd_tuning_t.gemv_rows_tma; 23 fd_ddtree_build; 24
    fd_tuning_t.gemv_rows_formats; 25 fd_tuning_t.gemv_rows_dp4a; 26 fd_tuning_t.gemv_rows_tma_split,
    gemv_rows_stage_x; 27 fd_tuning_t.gemv_rows_tma_warps; 28 fd_attention_shape_t.max_keys; 29 fd_rope_t.table /
    table_mode; 30 fd_attention_shape_t.o_codes / o_scales, fd_gemv_xq, fd_tuning_t.attn_o_codes; 31
    fd_attention_masked_rope, fd_rope_kv_write's table_mode 1, fd_tuning_t.attn_masked_rope."""
    ffi = cffi.FFI()
    ffi.cdef(cdef_source())
    lib = ffi.dlopen(None)          # integer constants only: no symbol is looked up
    assert lib.FD_ABI_VERSION == ABI_VERSION
    names = set(declared_functions())
    assert {"fd_causal_conv1d", "fd_causal_conv1d_tree", "fd_gated_delta_rule_decode", "fd_gated_delta_rule_prefill",
            "fd_gated_delta_rule_tree", "fd_mul", "fd_silu", "fd_sigmoid", "fd_sigmoid_mul", "fd_copy_cols",
            "fd_delta_decay", "fd_causal_conv1d_silu", "fd_causal_conv1d_silu_tree", "fd_gated_delta_rule_fused",
            "fd_gated_delta_rule_fused_tree", "fd_gated_qk_norm", "fd_kv_window_offset", "fd_kv_compact_ring"} <= names


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


def declared_arity() -> dict[str, int]:
    """fd_* function -> its number of parameters, from the headers cffi reads."""
    text = re.sub(r"/\*.*?\*/", "", cdef_source(), flags=re.S)
    arity = {}
    for name, params in re.findall(r"\b(fd_\w+)\s*\(([^()]*)\)\s*;", text):
        params = params.strip()
        arity[name] = 0 if params in ("", "void") else params.count(",") + 1
    return arity


def native_calls(path: Path):
    """(line, name, args) of every call x.fd_name(...) in a Python file."""
    tree = ast.parse(path.read_text(encoding="utf-8"), str(path))
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr.startswith("fd_"):
            yield node.lineno, node.func.attr, node.args


def test_every_native_call_in_the_repository_matches_the_headers():
    """The calls the CPU cannot run (tests/gpu, bench/, the CUDA backend) still pass each fd_* function as many
    arguments as the headers declare, and call only declared functions: a signature change is caught here
    before a GPU run. (A call with *args is only checked for its name.)"""
    arity = declared_arity()
    checked = 0
    for folder in ("bench", "tests", "daemon", "scripts", "clients"):
        for path in sorted((ROOT / folder).rglob("*.py")):
            if "data" in path.relative_to(ROOT).parts:
                continue
            for line, name, args in native_calls(path):
                where = f"{path.relative_to(ROOT)}:{line} {name}"
                assert name in arity, f"{where}: not declared in the headers"
                if not any(isinstance(a, ast.Starred) for a in args):
                    assert len(args) == arity[name], f"{where}: {len(args)} arguments, the headers say {arity[name]}"
                    checked += 1
    assert checked > 100
