"""Backends behind the one `Ops` interface (base.py): `reference` (numpy) and `cuda` (native)."""
from __future__ import annotations

__all__ = ["select_backend", "BackendUnavailable"]


class BackendUnavailable(RuntimeError):
    """The requested device cannot be used here; the message says why."""


def cuda_unavailable_reason() -> str | None:
    """None when the CUDA backend can run here, else the reason it cannot."""
    return "the CUDA backend is not part of this release yet"


def select_backend(device: str):
    """`cpu` -> reference; `cuda` -> the native backend (error if unavailable); `auto` -> cuda when
    it can run, else reference."""
    if device == "cpu":
        from .reference import ReferenceOps
        return ReferenceOps()
    reason = cuda_unavailable_reason()
    if device == "cuda":
        raise BackendUnavailable(f"--device cuda: {reason}")
    if device == "auto":
        from .reference import ReferenceOps
        return ReferenceOps()
    raise ValueError(f"unknown device {device!r}")
