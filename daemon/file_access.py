"""Which files a request may make the daemon open.

Two request fields name files on the daemon's machine: an `@path` prompt (`ids=@/tmp/p.bin` in the
line dialect; every Lucebox generate and compress) and a PFlash drafter (`compress drafter=PATH`,
Lucebox's `compress ... drafter_gguf`). Without a bound, whoever can send a request could read any
file the daemon's user can read -- as token ids that `detokenize` turns back into text, or that an
error message quotes -- or make it open a FIFO or a device. So both kinds of path are confined:

  ids files   must resolve (symlinks and `..` first) to a regular file inside one of `ids_dirs`
              (`flashd serve --allow-files DIR`; default: the system temp dir, where Lucebox's
              DflashClient writes its prompt files with tempfile.mkstemp; none: no @file reads)
  models      must resolve to a regular GGUF file inside one of `model_dirs`: the directories of the
              models the daemon was started with, the flashd model cache, and `--allow-models DIR`

A path outside is refused before it is opened (so the answer says nothing about whether it exists).
The checks happen in the front end, before the request is queued: the engine only sees checked paths.
"""
from __future__ import annotations

import dataclasses
import errno
import os
import stat
import tempfile
from dataclasses import dataclass
from typing import Iterable

from ..protocol.errors import ProtocolError
from ..protocol.messages import Compress, Request, resolve_ids_files
from .process import GGUF_MAGIC, read_ids_file

__all__ = ["FileAccess", "default_ids_dirs", "default_model_dirs", "resolve_dirs", "NO_FILES"]

NO_FILES = "none"    # `--allow-files none` / FLASHD_ALLOW_FILES=none: no @file reads at all


def resolve_dirs(dirs: Iterable[str], what: str) -> tuple[str, ...]:
    """Existing directories, resolved (realpath) and deduplicated in order; ValueError naming `what`
    (the option) for one that is not a directory."""
    out: list[str] = []
    for d in dirs:
        real = os.path.realpath(os.path.expanduser(d))
        if not os.path.isdir(real):
            raise ValueError(f"{what} {d}: not a directory")
        if real not in out:
            out.append(real)
    return tuple(out)


def default_ids_dirs() -> tuple[str, ...]:
    """The system temp dir ($TMPDIR, else /tmp): where Lucebox's client and most scripts put prompt files."""
    return resolve_dirs([tempfile.gettempdir()], "temp dir")


def default_model_dirs(model_paths: Iterable[str | None]) -> tuple[str, ...]:
    """The directories of the given model files plus the flashd model cache (and $FLASHD_MODELS_DIR)
    where they exist: a request may load a drafter from where the operator keeps models."""
    dirs = [os.path.dirname(os.path.realpath(p)) for p in model_paths if p]
    try:
        from ..clients.registry import FetchConfig
        fetch = FetchConfig.from_env()
    except (ValueError, OSError):     # a malformed registry setting: only the models' own directories
        fetch = None
    if fetch is not None:
        dirs += [str(fetch.models_cache)] + ([str(fetch.models_dir)] if fetch.models_dir is not None else [])
    return resolve_dirs([d for d in dirs if os.path.isdir(os.path.realpath(os.path.expanduser(d)))], "model dir")


def _inside(path: str, roots: tuple[str, ...]) -> bool:
    return any(os.path.commonpath([path, root]) == root for root in roots)


@dataclass(slots=True, frozen=True)
class FileAccess:
    """The directories requests may name files in (resolved absolute paths) and how to say so."""

    ids_dirs: tuple[str, ...]            # @file prompts; empty: none may be read
    model_dirs: tuple[str, ...]          # drafter GGUFs a request names
    max_ids_bytes: int                   # largest ids file read (the request size limit)
    ids_option: str = "--allow-files"    # what widens each, named in the refusal
    models_option: str = "--allow-models"

    def __post_init__(self):
        for name in ("ids_dirs", "model_dirs"):
            for d in getattr(self, name):
                if not os.path.isabs(d) or os.path.realpath(d) != d:
                    raise ValueError(f"{name}: {d!r} must be an absolute path with no symlinks (resolve_dirs)")
        if self.max_ids_bytes < 1:
            raise ValueError(f"max_ids_bytes must be >= 1, got {self.max_ids_bytes}")

    @classmethod
    def build(cls, allow_files: tuple[str, ...] | None, allow_models: tuple[str, ...],
              model_paths: Iterable[str | None], max_ids_bytes: int, *, ids_option: str = "--allow-files",
              models_option: str = "--allow-models") -> FileAccess:
        """From the options: allow_files None -> the temp dir, (NO_FILES,) -> no ids files, else those
        directories; model dirs: the started models' directories, the model cache, then allow_models."""
        if allow_files is None:
            ids_dirs = default_ids_dirs()
        elif tuple(allow_files) == (NO_FILES,):
            ids_dirs = ()
        else:
            ids_dirs = resolve_dirs(allow_files, ids_option)
        model_dirs = default_model_dirs(model_paths) + resolve_dirs(allow_models, models_option)
        return cls(ids_dirs=ids_dirs, model_dirs=tuple(dict.fromkeys(model_dirs)), max_ids_bytes=max_ids_bytes,
                   ids_option=ids_option, models_option=models_option)

    # -- ids files -------------------------------------------------------------------------------
    def read_ids(self, path: str) -> bytes:
        """The bytes of an @file prompt, or OSError whose strerror says why not (the caller,
        messages.resolve_ids_files, makes it `bad_request ids: cannot read @PATH: <why>`)."""
        if not self.ids_dirs:
            raise OSError(errno.EACCES, f"this daemon reads no ids files ({self.ids_option} {NO_FILES}); "
                                        f"send the ids inline")
        real = os.path.realpath(path)
        if not _inside(real, self.ids_dirs):
            raise OSError(errno.EACCES, f"not inside a directory this daemon reads ids files from "
                                        f"({', '.join(self.ids_dirs)}; {self.ids_option} adds one)")
        return read_ids_file(real, self.max_ids_bytes)

    # -- model files -----------------------------------------------------------------------------
    def model_path(self, field: str, path: str) -> str:
        """The resolved path of a GGUF a request names, or ProtocolError(bad_request) that does not
        reveal anything about a file outside the allowed directories."""
        real = os.path.realpath(os.path.expanduser(path))
        if not _inside(real, self.model_dirs):
            raise ProtocolError("bad_request", f"{field}: {path} is not inside a directory this daemon loads "
                                               f"models from ({', '.join(self.model_dirs) or 'none'}; "
                                               f"{self.models_option} adds one)")
        try:
            # O_NONBLOCK: a FIFO planted in an allowed directory must not hang the front end
            fd = os.open(real, os.O_RDONLY | os.O_NONBLOCK | getattr(os, "O_CLOEXEC", 0))
        except OSError as exc:
            raise ProtocolError("bad_request", f"{field}: cannot read {path}: {exc.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            if not stat.S_ISREG(os.fstat(fd).st_mode):
                raise ProtocolError("bad_request", f"{field}: {path} is not a regular file")
            if f.read(len(GGUF_MAGIC)) != GGUF_MAGIC:
                raise ProtocolError("bad_request", f"{field}: {path} is not a GGUF file")
        return real

    # -- a whole request -------------------------------------------------------------------------
    def check(self, request: Request) -> Request:
        """The request with its @file read and its model paths checked (resolved); ProtocolError
        (bad_request, answering the request's id) otherwise."""
        request = resolve_ids_files(request, self.read_ids)
        if isinstance(request, Compress) and request.drafter is not None:
            try:
                request = dataclasses.replace(request, drafter=self.model_path("drafter", request.drafter))
            except ProtocolError as exc:
                raise exc.with_request_id(request.id) from None
        return request
