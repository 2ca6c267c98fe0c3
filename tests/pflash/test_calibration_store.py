"""The stored PFlash calibration (daemon/pflash/calibration_store.py): the round trip, the file's identity and RoPE
tag, format 1 files (one setting, before bands), the bands by prompt length and what serve builds from them, merge."""
import dataclasses
import json

import pytest

from flashd.daemon.pflash.calibrate import merge
from flashd.daemon.pflash.calibration_store import (
    CalibratedBand, Calibration, calibrated_pflash, calibration_path, file_identity, load_calibration, pflash_bands,
    rope_tag, save_calibration,
)
from flashd.daemon.pflash.config import PFlashBand, PFlashConfig
from flashd.daemon.models.config import RopeScaling


def _drafter(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHD_CACHE_DIR", str(tmp_path / "cache"))
    drafter = tmp_path / "d.gguf"
    drafter.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    return drafter


def _calibration(drafter, rope=None, lengths=(8192, 32768, 131072), **fields) -> Calibration:
    bands = tuple(CalibratedBand(length=n, score_from=4, score_layers=10 + i, keep=(0.05, 0.04, 0.03)[i], margin=i == 0)
                  for i, n in enumerate(lengths))
    return Calibration(**{"bands": bands, "n_layers": 24, "cases": 20, "kinds": ("single", "two-hop"), "alpha": 0.7,
                          "drafter": drafter.name, "identity": file_identity(drafter), "rope": rope,
                          "date": "2026-11-26", "seed": 0, **fields})


def test_round_trip_per_file_and_rope_scaling(tmp_path, monkeypatch):
    drafter = _drafter(tmp_path, monkeypatch)
    assert load_calibration(drafter) is None
    plain, yarn = _calibration(drafter), _calibration(drafter, rope="yarn4x32768", lengths=(65536,))
    assert save_calibration(plain, drafter) == calibration_path(drafter)
    assert save_calibration(yarn, drafter).name.endswith("-yarn4x32768.json")
    assert load_calibration(drafter) == plain and load_calibration(drafter, "yarn4x32768") == yarn
    assert load_calibration(drafter, "yarn2x32768") is None                 # another scaling: nothing
    drafter.write_bytes(drafter.read_bytes() + b"x")                        # another file under the same name
    assert load_calibration(drafter) is None and load_calibration(drafter, "yarn4x32768") is None


def test_rope_tag_names_the_scaling():
    assert rope_tag(None) is None
    assert rope_tag(RopeScaling.create("yarn", 4.0, 32768)) == "yarn4x32768"
    assert rope_tag(RopeScaling.create("linear", 2.5, 4096)) == "linear2.5x4096"


def test_a_format_1_file_loads_as_one_band(tmp_path, monkeypatch):
    """What `flashd pflash-calibrate` stored before bands: one setting measured over all lengths."""
    drafter = _drafter(tmp_path, monkeypatch)
    old = {"score_from": 4, "score_layers": 12, "keep": 0.03, "n_layers": 24, "lengths": [4096, 8192], "cases": 4,
           "alpha": 0.7, "drafter": drafter.name, "identity": file_identity(drafter), "date": "2026-11-25",
           "margin": True}
    path = calibration_path(drafter)
    path.parent.mkdir(parents=True)
    path.write_text(json.dumps(old))
    c = load_calibration(drafter)
    assert c.bands == (CalibratedBand(length=4096, score_from=4, score_layers=12, keep=0.03, margin=True),)
    assert (c.kinds, c.rope, c.seed, c.cases) == (("single",), None, None, 4)
    assert pflash_bands(c) == (PFlashBand(0, 0.03, 12, 4),)
    assert load_calibration(drafter, "yarn4x32768") is None
    path.write_text(json.dumps({**old, "keep": 2.0}))                       # unreadable: as if none
    assert load_calibration(drafter) is None
    path.write_text(json.dumps({"format": 3}))
    assert load_calibration(drafter) is None


def test_bands_cover_every_length_by_the_nearest_calibrated_length(tmp_path, monkeypatch):
    c = _calibration(_drafter(tmp_path, monkeypatch))
    bands = pflash_bands(c)
    assert [b.from_tokens for b in bands] == [0, 16384, 65536]             # geometric means of 8K|32K and 32K|128K
    assert [(b.keep, b.score_from, b.score_layers) for b in bands] == [(0.05, 4, 10), (0.04, 4, 11), (0.03, 4, 12)]
    for n, length in ((100, 8192), (16383, 8192), (16384, 32768), (32744, 32768), (65535, 32768), (65536, 131072),
                      (10 ** 6, 131072)):
        assert c.band_for(n).length == length, n
    config = PFlashConfig(bands=bands)
    assert config.setting(32744) == bands[1] and config.setting(0) == bands[0]
    assert PFlashConfig(keep=0.2, score_layers=3, score_from=1).setting(10 ** 6) == PFlashBand(0, 0.2, 3, 1)


def test_serve_fills_what_its_command_line_omits(tmp_path, monkeypatch):
    c = _calibration(_drafter(tmp_path, monkeypatch))
    base = PFlashConfig(keep=0.07, score_layers=20, score_from=2)
    filled = calibrated_pflash(base, c)
    assert filled.bands == pflash_bands(c) and (filled.keep, filled.score_layers, filled.score_from) == (0.05, 10, 4)
    keep_given = calibrated_pflash(base, c, frozenset({"keep"}))
    assert [(b.keep, b.score_layers) for b in keep_given.bands] == [(0.07, 10), (0.07, 11), (0.07, 12)]
    window_given = calibrated_pflash(base, c, frozenset({"score_from"}))  # the window only as a whole
    assert [(b.keep, b.score_from, b.score_layers) for b in window_given.bands] == [
        (0.05, 2, 20), (0.04, 2, 20), (0.03, 2, 20)]
    assert calibrated_pflash(base, c, frozenset({"keep", "score_layers"})) == base
    assert calibrated_pflash(base, None) == base


def test_records_and_bands_are_checked(tmp_path, monkeypatch):
    drafter = _drafter(tmp_path, monkeypatch)
    with pytest.raises(ValueError, match="band lengths must increase"):
        _calibration(drafter, lengths=(32768, 8192))
    with pytest.raises(ValueError, match="of 8 layers"):
        _calibration(drafter, n_layers=8)
    with pytest.raises(ValueError, match="kinds must be some of"):
        _calibration(drafter, kinds=("three-hop",))
    with pytest.raises(ValueError, match="at least one"):
        _calibration(drafter, lengths=())
    with pytest.raises(ValueError, match="bad window"):
        CalibratedBand(length=4096, score_from=5, score_layers=5, keep=0.1, margin=False)
    with pytest.raises(ValueError, match="first band must start at 0"):
        PFlashConfig(bands=(PFlashBand(100, 0.1, 0, 0),))
    with pytest.raises(ValueError, match="increasing"):
        PFlashConfig(bands=(PFlashBand(0, 0.1, 0, 0), PFlashBand(0, 0.2, 0, 0)))
    with pytest.raises(ValueError, match="band keep"):
        PFlashBand(0, 0.0, 0, 0)
    with pytest.raises(ValueError, match="band score_from"):
        PFlashBand(0, 0.1, 4, 4)
    with pytest.raises(ValueError, match="tuple of PFlashBand"):
        PFlashConfig(bands=[PFlashBand(0, 0.1, 0, 0)])


def test_merge_replaces_bands_of_the_same_length_and_refuses_another_setup(tmp_path, monkeypatch):
    drafter = _drafter(tmp_path, monkeypatch)
    stored = _calibration(drafter, lengths=(8192, 32768))
    new = _calibration(drafter, lengths=(32768, 131072), date="2026-11-27")
    merged = merge(stored, new)
    assert [b.length for b in merged.bands] == [8192, 32768, 131072] and merged.date == "2026-11-27"
    assert merged.bands[1] == new.bands[0] and merged.bands[0] == stored.bands[0]
    with pytest.raises(ValueError, match=r"rope \(None stored, 'yarn4x32768' now\)"):
        merge(stored, _calibration(drafter, rope="yarn4x32768"))
    with pytest.raises(ValueError, match="cases"):
        merge(stored, _calibration(drafter, cases=4))


def test_shipped_calibrations_are_valid_records_named_for_their_file():
    from flashd.daemon.pflash import calibration_store

    shipped = sorted(calibration_store.SHIPPED_DIR.glob("*.json"))
    assert shipped, "flashd ships at least the calibration measured for Qwen2.5-Coder-0.5B under YaRN x4"
    for path in shipped:
        c = Calibration.from_dict(json.loads(path.read_text()))
        assert path.name == f"{c.drafter}-{c.identity}{'-' + c.rope if c.rope else ''}.json"
        assert calibration_store.shipped_calibration_paths(c.identity, c.rope) == [path]


def test_a_shipped_calibration_serves_a_file_of_its_identity_and_the_users_own_comes_first(tmp_path, monkeypatch):
    from flashd.daemon.pflash import calibration_store

    drafter = _drafter(tmp_path, monkeypatch)
    shipped_dir = tmp_path / "shipped"
    shipped_dir.mkdir()
    monkeypatch.setattr(calibration_store, "SHIPPED_DIR", shipped_dir)
    shipped = dataclasses.replace(_calibration(drafter, rope="yarn4x32768"), drafter="published-name.gguf")
    (shipped_dir / f"published-name.gguf-{shipped.identity}-yarn4x32768.json").write_text(json.dumps(shipped.as_dict()))
    assert load_calibration(drafter) is None                                # no record without the scaling
    assert calibration_store.find_calibration(drafter, "yarn4x32768") == (
        shipped, shipped_dir / f"published-name.gguf-{shipped.identity}-yarn4x32768.json")
    assert load_calibration(drafter, "yarn4x32768", shipped=False) is None  # what --merge reads: the user's own only
    own = _calibration(drafter, rope="yarn4x32768", lengths=(65536,))
    assert calibration_store.find_calibration(drafter, "yarn4x32768")[1].parent == shipped_dir
    save_calibration(own, drafter)
    assert calibration_store.find_calibration(drafter, "yarn4x32768") == (own, calibration_path(drafter,
                                                                                          rope="yarn4x32768"))
    drafter.write_bytes(drafter.read_bytes() + b"x")                        # another file: neither matches
    assert calibration_store.find_calibration(drafter, "yarn4x32768") is None
