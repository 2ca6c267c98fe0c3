"""The native sources (C ABI header, CUDA kernels, HIP shim), shipped as package data."""
from pathlib import Path

NATIVE_DIR = Path(__file__).resolve().parent
HEADER = NATIVE_DIR / "include" / "flashd.h"
CUDA_DIR = NATIVE_DIR / "cuda"
HIP_DIR = NATIVE_DIR / "hip"
