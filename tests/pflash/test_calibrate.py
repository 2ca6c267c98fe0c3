"""PFlash calibration (daemon/pflash/calibrate.py, `flashd pflash-calibrate`): the choice rule on
made-up layer maxima, the stored file and its identity, the command end to end on the tiny drafter,
and `flashd serve --prefill-drafter` taking the calibrated settings for what its command line omits."""
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from flashd.daemon.pflash.calibrate import (
    Calibration, calibration_path, choose_setting, file_identity, load_calibration, save_calibration,
)

TIMEOUT_S = 300


def _maxima(n_layers: int, n_tokens: int, hot: dict[int, int]) -> np.ndarray:
    """(N, 1, S) maxima: a flat background, and layer l puts a peak on token hot[l]."""
    m = np.full((n_layers, 1, n_tokens), 0.01, np.float32)
    for layer, token in hot.items():
        m[layer, 0, token] = 1.0
    return m


def _select_top(probs: np.ndarray, keep: float) -> np.ndarray:
    """A stand-in for the chunk selection: keep the ceil(keep * S) highest-scoring tokens."""
    p = probs.max(axis=0)
    n = max(1, int(np.ceil(keep * p.size)))
    return np.sort(np.argsort(-p, kind="stable")[:n])


def test_the_cheapest_window_that_keeps_every_needle_wins():
    # the needle (token 7) is found only by layer 3; layers 0-1 peak elsewhere (a sink at token 0)
    cases = [(_maxima(6, 100, {0: 0, 1: 0, 3: 7}), [7]), (_maxima(6, 100, {0: 0, 3: 7, 4: 7}), [7])]
    lo, hi, keep, margin = choose_setting(cases, [0.01, 0.05], _select_top)
    # windows [2, 4) and [3, 4) run the fewest layers (4) and keep the needle at 1%; windows with
    # layer 0 or 1 see the sink as strongly and lose it; among equals the widest view (lo 2) wins
    assert (lo, hi, keep, margin) == (2, 4, 0.01, False)
    # a layer that peaks on the sink and the needle alike: 1% keeps only the sink, 5% both
    both = _maxima(6, 100, {3: 7})
    both[3, 0, 0] = 1.0
    assert choose_setting([(both, [7])], [0.01, 0.05], _select_top) == (0, 4, 0.05, False)


def test_a_margin_breaks_ties_and_nothing_passing_is_none():
    cases = [(_maxima(4, 50, {2: 9}), [9])]
    lo, hi, keep, margin = choose_setting(cases, [0.02, 0.04], _select_top)
    assert (lo, hi, keep, margin) == (0, 3, 0.02, False)
    never = [(_maxima(3, 50, {0: 1}), [40])]
    assert choose_setting(never, [0.02], _select_top) is None


def test_stored_calibration_is_found_only_for_the_same_file(tmp_path, monkeypatch):
    monkeypatch.setenv("FLASHD_CACHE_DIR", str(tmp_path / "cache"))
    drafter = tmp_path / "d.gguf"
    drafter.write_bytes(b"GGUF" + bytes(range(256)) * 10)
    assert load_calibration(drafter) is None
    c = Calibration(score_from=4, score_layers=12, keep=0.03, n_layers=24, lengths=(4096,), cases=4, alpha=0.7,
                    drafter=drafter.name, identity=file_identity(drafter), date="2026-11-25", margin=True)
    path = save_calibration(c, drafter)
    assert path == calibration_path(drafter) and load_calibration(drafter) == c
    drafter.write_bytes(drafter.read_bytes() + b"x")             # another file under the same name
    assert load_calibration(drafter) is None
    with pytest.raises(ValueError):
        Calibration(**{**c.as_dict(), "lengths": (1,), "score_from": 12})


def _run(*args, env):
    return subprocess.run([sys.executable, "-m", "flashd.clients.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)


def test_the_command_measures_stores_and_serve_uses_it(pflash_models, tmp_path):
    env = {**os.environ, "FLASHD_CACHE_DIR": str(tmp_path / "cache")}
    drafter = pflash_models["drafter"]
    # keep 1.0 keeps every chunk, so every window passes: the cheapest, one layer from layer 0, wins
    result = _run("pflash-calibrate", "--drafter", str(drafter), "--device", "cpu", "--lengths", "300",
                  "--cases", "2", "--keeps", "1.0", env=env)
    assert result.returncode == 0, result.stderr
    assert "layers [0, 1) of 2" in result.stdout and "stored in" in result.stdout
    stored = json.loads(next((tmp_path / "cache" / "pflash").glob("drafter.gguf-*.json")).read_text())
    assert (stored["score_from"], stored["score_layers"], stored["keep"], stored["cases"]) == (0, 1, 1.0, 2)

    def ready(*extra):
        out = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", str(pflash_models["target"]),
                              "--prefill-drafter", str(drafter), "--device", "cpu", "--max-ctx", "1024", *extra],
                             input="quit\n", capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[0])["pflash"]

    calibrated = ready()
    assert (calibrated["score_layers"], calibrated["score_from"], calibrated["keep"]) == (1, 0, 1.0)
    assert calibrated["calibration"]["identity"] == stored["identity"]
    explicit = ready("--compress-keep", "0.2", "--compress-layers", "2")
    assert (explicit["score_layers"], explicit["score_from"], explicit["keep"]) == (2, 0, 0.2)


def test_bad_options_are_usage_errors(pflash_models, tmp_path):
    env = {**os.environ, "FLASHD_CACHE_DIR": str(tmp_path / "cache")}
    for args, needle in ((["--keeps", "0"], "fractions must be in (0, 1]"), (["--lengths", "10"], "lengths must be"),
                         (["--keeps", "x"], "comma-separated")):
        result = _run("pflash-calibrate", "--drafter", str(pflash_models["drafter"]), *args, env=env)
        assert result.returncode == 2 and needle in result.stderr, result.stderr
    missing = _run("pflash-calibrate", "--drafter", str(tmp_path / "nope.gguf"), env=env)
    assert missing.returncode == 1 and "no such file" in missing.stderr
