"""Writing a GGUF file whole or not at all: the one place that opens a gguf.GGUFWriter (the scripts and
the tests write through it).

    with new_gguf(path, "llama") as writer:      # metadata and tensors added in memory,
        writer.add_block_count(1)                # the file written when the block ends
        writer.add_tensor("t", array)

    with written_gguf(path, arch) as writer:     # the block writes the file itself, e.g. tensor
        ...                                      # data streamed one tensor at a time

Either way, if the block raises (a bad tensor, a full disk, Ctrl-C) the partial file is removed, so no
truncated model is ever left behind.
"""
from __future__ import annotations

import contextlib
from collections.abc import Iterator
from pathlib import Path

import gguf

__all__ = ["new_gguf", "written_gguf"]


@contextlib.contextmanager
def written_gguf(path: str | Path, arch: str) -> Iterator[gguf.GGUFWriter]:
    """A GGUFWriter for `path` that the block writes (header, metadata, tensor infos and data),
    closed on leaving the block; the partial file is removed if the block raises."""
    writer = gguf.GGUFWriter(path, arch)
    complete = False
    try:
        yield writer
        complete = True
    finally:
        writer.close()
        if not complete:
            Path(path).unlink(missing_ok=True)


@contextlib.contextmanager
def new_gguf(path: str | Path, arch: str) -> Iterator[gguf.GGUFWriter]:
    """A GGUFWriter for `path` to which the block adds metadata and tensors (held in memory); when the
    block ends the file is written whole: header, metadata, tensors. Nothing is left if it raises."""
    with written_gguf(path, arch) as writer:
        yield writer
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_tensors_to_file()
