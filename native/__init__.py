"""The native sources (C ABI header, CUDA kernels, HIP shim), shipped as package data."""
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent
INCLUDE_DIR = NATIVE_DIR / "include"
HEADER = INCLUDE_DIR / "flashd.h"            # the C ABI: includes one header per part (flashd_*.h)
CUDA_DIR = NATIVE_DIR / "cuda"
HIP_DIR = NATIVE_DIR / "hip"
