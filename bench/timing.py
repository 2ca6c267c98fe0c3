"""Kernel timing on the GPU: warm-up, L2 flush before every repetition, CUDA events, median.

    t = KernelTimer(dev)
    ms = t.time(lambda: lib.fd_gemv(...), reps=50)        # median milliseconds
    print(report("gemv q4_k 8960x1536", ms, n_bytes=w_bytes + x_bytes, peak_gbs=t.peak_gbs))

A benchmark that drives the library itself starts with `dev, timer = open_gpu()` and prints `device_line(timer)`.
"""
from __future__ import annotations

import statistics

L2_FLUSH_BYTES = 256 << 20   # larger than any current L2 (H100: 50 MB, H200: 60 MB)


class KernelTimer:
    def __init__(self, dev):
        self.dev = dev
        self.flush_buf = dev.empty(L2_FLUSH_BYTES // 4)
        ffi, lib = dev.ffi, dev.lib
        self.events = [ffi.new("void**"), ffi.new("void**")]
        for e in self.events:
            dev.native.check(lib.fd_event_create(e, 1), "cudaEventCreate")
        info = dev.info()
        # peak DRAM bandwidth: 2 transfers per clock (DDR) * bus width in bytes * memory clock
        self.peak_gbs = 2 * info["mem_clock_khz"] * 1e3 * info["mem_bus_bits"] / 8 / 1e9
        self.info = info

    def flush_l2(self):
        self.dev.fill_bytes(self.flush_buf, 0)

    def time(self, fn, reps: int = 30, warmup: int = 3, flush: bool = True) -> float:
        dev, lib = self.dev, self.dev.lib
        for _ in range(warmup):
            fn()
        times = []
        ms = dev.ffi.new("float*")
        for _ in range(reps):
            if flush:
                self.flush_l2()
            lib.fd_event_record(self.events[0][0], dev.stream)
            fn()
            lib.fd_event_record(self.events[1][0], dev.stream)
            dev.native.check(lib.fd_event_synchronize(self.events[1][0]), "event sync")
            dev.native.check(lib.fd_event_elapsed_ms(ms, self.events[0][0], self.events[1][0]), "elapsed")
            times.append(ms[0])
        return statistics.median(times)


def open_gpu():
    """(Device, KernelTimer): flashd's CUDA library loaded (built on first use) on device 0, and a timer on it."""
    from flashd.daemon.backends.cuda.lib import load
    from flashd.daemon.backends.cuda.tensor import Device

    dev = Device(load())
    return dev, KernelTimer(dev)


def device_line(timer: KernelTimer) -> str:
    """The header line of a benchmark's output: the GPU, its compute capability, SMs and DRAM peak."""
    info = timer.info
    return f"# {info['name']} cc {info['cc']}, {info['n_sms']} SMs, DRAM peak {timer.peak_gbs:.0f} GB/s"


def report(name: str, ms: float, *, n_bytes: float | None = None, flops: float | None = None,
           peak_gbs: float | None = None, peak_tflops: float | None = None) -> str:
    parts = [f"{name:<48s} {ms * 1e3:9.1f} us"]
    if n_bytes is not None:
        gbs = n_bytes / (ms * 1e-3) / 1e9
        parts.append(f"{gbs:8.1f} GB/s" + (f" ({100 * gbs / peak_gbs:5.1f}% of peak)" if peak_gbs else ""))
    if flops is not None:
        tf = flops / (ms * 1e-3) / 1e12
        parts.append(f"{tf:7.1f} TFLOP/s" + (f" ({100 * tf / peak_tflops:5.1f}% of peak)" if peak_tflops else ""))
    return "  ".join(parts)
