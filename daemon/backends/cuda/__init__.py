"""The CUDA backend: cffi over libflashd_cuda.so (native/), built on first use."""
