"""bench/bench_niah.py on the CPU with the tiny synthetic PFlash models (tests/pflash/conftest.py): every case kind
reported beside the first with pass rates per kind and length, the explicit and the calibrated compress=auto modes,
and its argument errors. The tiny models answer nothing right: what is checked is the plumbing, not pass rates."""
import json

import pytest
from tests.pflash.conftest import pflash_models  # noqa: F401  (the fixture)

from flashd.bench import bench_niah
from flashd.daemon.pflash.calibration_store import CalibratedBand, Calibration, file_identity, save_calibration

KINDS = "single,multi-all,two-hop"


def _run(models, tmp_path, *extra) -> dict:
    out = tmp_path / "out"
    code = bench_niah.main(["--target", str(models["target"]), "--drafter", str(models["drafter"]), "--device", "cpu",
                            "--skip-llama", "--cases", "1", "--kinds", KINDS, "--max-tokens", "3", "--sweep-keeps", "",
                            "--forward-chunk", "256", "--out", str(out), *extra])
    assert code == 0
    (json_file,) = out.glob("*-niah.json")
    (md_file,) = out.glob("*-niah.md")
    return {"json": json.loads(json_file.read_text()), "md": md_file.read_text()}


def test_every_kind_is_reported_beside_the_first(pflash_models, tmp_path):
    result = _run(pflash_models, tmp_path, "--lengths", "400,500", "--skip-dense", "--keep", "0.5")
    data, md = result["json"], result["md"]
    assert data["mode"] == "explicit" and data["kinds"] == KINDS.split(",")
    for length in ("400", "500"):
        row = data["lengths"][length]
        assert list(row["kinds"]) == KINDS.split(",")
        for kind, r in row["kinds"].items():
            # multi-all leaves 4 values x 3 tokens for the answer, the others 3
            assert r["prompt_tokens"] <= int(length) - 3 * (4 if kind == "multi-all" else 1)
            assert r["pflash"]["n"] == 1 and 0 <= r["pflash"]["pass"] <= 1 and "dense" not in r
            assert r["pflash"]["settings"] == ["keep 0.5 layers [0, 2)"]
        assert row["pflash"] == row["kinds"]["single"]["pflash"]          # the headline is the first kind's
    assert "## single (headline)" in md and "## Case kinds by length" in md
    assert md.count("| multi-all |") == 2 and md.count("| two-hop |") == 2


def test_auto_uses_the_stored_calibration_by_length(pflash_models, tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHD_CACHE_DIR", str(tmp_path / "cache"))
    drafter = pflash_models["drafter"]
    with pytest.raises(SystemExit, match="no calibration stored"):
        _run(pflash_models, tmp_path, "--lengths", "500", "--auto")
    bands = (CalibratedBand(length=400, score_from=0, score_layers=1, keep=1.0, margin=False),
             CalibratedBand(length=600, score_from=1, score_layers=2, keep=0.3, margin=False))
    save_calibration(Calibration(bands=bands, n_layers=2, cases=1, kinds=("single",), alpha=0.7,
                                 drafter=drafter.name, identity=file_identity(drafter), rope=None,
                                 date="2026-11-26", seed=0), drafter)
    # 450 and 560 tokens: the bands of 400 and 600 (boundary sqrt(400 * 600) = 490); 300 is under --threshold
    data = _run(pflash_models, tmp_path, "--lengths", "300,450,560", "--auto", "--threshold", "350")["json"]
    assert data["mode"] == "auto" and data["threshold"] == 350 and data["calibration"]["date"] == "2026-11-26"
    settings = {length: {kind: r["pflash"]["settings"] for kind, r in row["kinds"].items()}
                for length, row in data["lengths"].items()}
    assert settings["300"] == {k: ["dense"] for k in KINDS.split(",")}
    assert settings["450"] == {k: ["keep 1 layers [0, 1)"] for k in KINDS.split(",")}
    assert settings["560"] == {k: ["keep 0.3 layers [1, 2)"] for k in KINDS.split(",")}
    row = data["lengths"]["560"]["kinds"]["two-hop"]
    assert row["pflash"]["kept_tokens"] < row["prompt_tokens"] and row["dense"]["n"] == 1


@pytest.mark.parametrize("args, message", [
    (["--kinds", "single,three-hop"], "--kinds"), (["--kinds", "single,single"], "--kinds"),
    (["--lengths", "x"], "--lengths"), (["--lengths", "90", "--kinds", "multi-all"], "exceed the answer"),
    (["--threshold", "100"], "--auto's"), (["--rope-factor", "4"], "need --rope-scaling"),
    (["--cases", "0"], "--cases")])
def test_argument_errors(args, message, capsys):
    with pytest.raises(SystemExit) as info:
        bench_niah.parse_args(["--target", "t.gguf", "--drafter", "d.gguf", *args])
    assert info.value.code == 2 and message in capsys.readouterr().err
