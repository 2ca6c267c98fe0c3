"""Writing a GGUF file whole or not at all: the one place the scripts open a gguf.GGUFWriter."""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import gguf

__all__ = ["written_gguf"]


@contextlib.contextmanager
def written_gguf(path: str | Path, arch: str) -> Iterator[gguf.GGUFWriter]:
    """A GGUFWriter for `path`, closed on leaving the block; if the block raises (a bad tensor, a
    full disk, Ctrl-C), the partial file is removed, so no truncated model is ever left behind."""
    writer = gguf.GGUFWriter(path, arch)
    complete = False
    try:
        yield writer
        complete = True
    finally:
        writer.close()
        if not complete:
            Path(path).unlink(missing_ok=True)
