"""Memory samples of a daemon under soak: host RSS from /proc/<pid>/status and, on a CUDA backend,
device memory in use from the daemon's own `status` reply (memory.device_total_bytes -
device_free_bytes: the driver's view, every allocation of the process included). What they are
judged by: the growth between the start and the end of the measured phase (the median of the first
and of the last fifth of the samples, so one spike decides nothing) and the least-squares slope.
"""
from __future__ import annotations

import statistics
from dataclasses import dataclass, field

__all__ = ["MemorySample", "MemoryTrend", "judge", "read_rss_mib", "trend", "vram_used_mib"]

MIB = 1024 * 1024


def read_rss_mib(pid: int) -> float:
    """VmRSS of `pid` in MiB (the kernel reports kB)."""
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    raise OSError(f"/proc/{pid}/status has no VmRSS line (a zombie?)")


def vram_used_mib(status: dict) -> float | None:
    """Device memory in use per the daemon's status reply, or None on a backend without a device."""
    memory = status.get("memory") or {}
    total, free = memory.get("device_total_bytes"), memory.get("device_free_bytes")
    return (total - free) / MIB if total is not None and free is not None else None


@dataclass(slots=True, frozen=True)
class MemorySample:
    t_s: float                    # seconds since the soak started
    requests: int                 # requests finished by then
    rss_mib: float
    vram_mib: float | None        # None: no device memory to report
    measured: bool                # False during warm-up (not judged)

    def as_dict(self) -> dict:
        return {"t_s": round(self.t_s, 2), "requests": self.requests, "rss_mib": round(self.rss_mib, 2),
                "vram_mib": None if self.vram_mib is None else round(self.vram_mib, 2), "measured": self.measured}


@dataclass(slots=True, frozen=True)
class MemoryTrend:
    n: int                        # measured samples
    start_mib: float              # median of the first fifth
    end_mib: float                # median of the last fifth
    growth_mib: float             # end - start
    slope_mib_per_min: float      # least squares over every measured sample
    peak_mib: float
    extra: dict = field(default_factory=dict)

    def as_dict(self) -> dict:
        return {"n": self.n, "start_mib": round(self.start_mib, 2), "end_mib": round(self.end_mib, 2),
                "growth_mib": round(self.growth_mib, 2), "slope_mib_per_min": round(self.slope_mib_per_min, 3),
                "peak_mib": round(self.peak_mib, 2)}


def trend(times_s: list[float], values_mib: list[float]) -> MemoryTrend | None:
    """The trend of the measured samples; None with fewer than 2."""
    n = len(values_mib)
    if n < 2:
        return None
    fifth = max(1, n // 5)
    start, end = statistics.median(values_mib[:fifth]), statistics.median(values_mib[-fifth:])
    t_mean, v_mean = statistics.fmean(times_s), statistics.fmean(values_mib)
    var = sum((t - t_mean) ** 2 for t in times_s)
    slope = (sum((t - t_mean) * (v - v_mean) for t, v in zip(times_s, values_mib)) / var) if var > 0 else 0.0
    return MemoryTrend(n=n, start_mib=start, end_mib=end, growth_mib=end - start, slope_mib_per_min=slope * 60,
                       peak_mib=max(values_mib))


def judge(samples: list[MemorySample], threshold_mib: float) -> dict:
    """{"rss": ..., "vram": ...} (vram only where sampled): the trend of the measured samples, the bound
    max(threshold_mib, 10% of the start) and ok (None: too few samples to judge)."""
    measured = [s for s in samples if s.measured]
    out = {}
    for name, points in (("rss", [(s.t_s, s.rss_mib) for s in measured]),
                         ("vram", [(s.t_s, s.vram_mib) for s in measured if s.vram_mib is not None])):
        if name == "vram" and not any(s.vram_mib is not None for s in samples):
            continue
        t = trend([p[0] for p in points], [p[1] for p in points])
        if t is None:
            out[name] = {"trend": None, "threshold_mib": None, "ok": None}
            continue
        bound = max(threshold_mib, 0.10 * t.start_mib)
        out[name] = {"trend": t.as_dict(), "threshold_mib": round(bound, 1), "ok": t.growth_mib <= bound}
    return out
