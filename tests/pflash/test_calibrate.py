"""PFlash calibration (daemon/pflash/calibrate.py, `flashd pflash-calibrate`): the choice rule on
made-up layer maxima, the command end to end on the tiny drafter (bands per length, case kinds, --merge,
--rope-scaling), its argument errors, and `flashd serve --prefill-drafter` taking the calibrated bands for
what its command line omits. The stored record itself: test_calibration_store.py."""
import dataclasses
import json
import os
import subprocess
import sys

import numpy as np
import pytest

from click.testing import CliRunner
from tests.pflash.conftest import DRAFTER_SPEC

from flashd.scripts.make_synthetic_gguf import write_synthetic_model

from flashd.daemon.pflash.calibrate import choose_setting
from flashd.daemon.pflash.calibrate_command import calibrate_command

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


def _run(*args, env):
    return subprocess.run([sys.executable, "-m", "flashd.clients.cli", *args], capture_output=True, text=True,
                          timeout=TIMEOUT_S, env=env)


def _brute_force(cases, keeps, select, require_margin=False):
    """The rule stated plainly: every window and keep, then the rank (hi, keep, no margin, lo); with
    require_margin, only the settings whose next smaller keep passes too."""
    keeps = sorted(set(keeps))
    n = cases[0][0].shape[0]
    passed = {(lo, hi, k): all(np.isin(w, select(m[lo:hi].max(axis=0), k)).all() for m, w in cases)
              for hi in range(1, n + 1) for lo in range(hi) for k in keeps}
    ranked = sorted((hi, k, not (keeps.index(k) > 0 and passed[(lo, hi, keeps[keeps.index(k) - 1])]), lo)
                    for (lo, hi, k), ok in passed.items() if ok)
    if require_margin:
        ranked = [r for r in ranked if not r[2]]
    return None if not ranked else (ranked[0][3], ranked[0][0], ranked[0][1], not ranked[0][2])


def test_the_search_finds_what_trying_every_window_finds():
    """choose_setting stops at the first passing layer count and grows each window's max one layer at a time: on
    random maxima it returns what the plain rule over every window returns."""
    rng = np.random.default_rng(5)
    for trial in range(40):
        n_layers, n_tokens = int(rng.integers(2, 6)), 60
        cases = []
        for _ in range(int(rng.integers(1, 4))):
            m = rng.random((n_layers, 2, n_tokens)).astype(np.float32) ** 4
            where = sorted(rng.choice(n_tokens, int(rng.integers(1, 4)), replace=False).tolist())
            for layer in range(n_layers):          # some layers find the facts, more or less strongly
                if rng.random() < 0.5:
                    m[layer][:, where] += rng.random()
            cases.append((m, where))
        keeps = [0.05, 0.1, 0.2, 0.4, 0.7]
        assert choose_setting(cases, keeps, _select_top) == _brute_force(cases, keeps, _select_top), trial
        assert (choose_setting(cases, keeps, _select_top, require_margin=True)
                == _brute_force(cases, keeps, _select_top, require_margin=True)), trial


def test_require_margin_skips_a_setting_that_passes_only_at_its_keep():
    # layer 0 finds the needle (token 7) but also peaks on 3 other tokens: 4% (2 tokens) loses it, 10% (5) keeps
    # it; layer 2 finds it alone: 2% (1 token) keeps it. Fewest layers first: [0, 1) at 10%, no margin (4% fails).
    m = _maxima(4, 50, {2: 7})
    m[0, 0, [7, 20, 30, 40]] = [0.9, 1.0, 1.0, 1.0]
    cases = [(m, [7])]
    assert choose_setting(cases, [0.04, 0.1], _select_top) == (0, 1, 0.1, False)
    # with require_margin that setting does not count: no one-layer window has a margin, and at two layers neither
    # (layer 1 adds nothing); at three layers [2, 3) keeps the needle at 4% and at 10%, so 10% there has a margin
    lo, hi, keep, margin = choose_setting(cases, [0.04, 0.1], _select_top, require_margin=True)
    assert (hi, keep, margin) == (3, 0.1, True) and lo == 0
    assert choose_setting(cases, [0.04, 0.1], _select_top, require_margin=True) == _brute_force(
        cases, [0.04, 0.1], _select_top, require_margin=True)


def _calibrate(cache, *args) -> tuple[int, str]:
    """The command in this process (CliRunner): (exit code, stdout + stderr)."""
    result = CliRunner().invoke(calibrate_command, list(args), env={"FLASHD_CACHE_DIR": str(cache)})
    return result.exit_code, result.output


def _stored(cache) -> list[dict]:
    return [json.loads(p.read_text()) for p in sorted((cache / "pflash").glob("*.json"))]


def test_the_command_measures_bands_per_length_and_serve_uses_them(pflash_models, tmp_path):
    cache = tmp_path / "cache"
    env = {**os.environ, "FLASHD_CACHE_DIR": str(cache)}
    drafter = pflash_models["drafter"]
    # keep 1.0 keeps every chunk, so every window passes: the cheapest, one layer from layer 0, wins at each length
    result = _run("pflash-calibrate", "--drafter", str(drafter), "--device", "cpu", "--lengths", "800,400",
                  "--kinds", "single,two-hop", "--cases", "1", "--keeps", "1.0", env=env)
    assert result.returncode == 0, result.stderr
    assert "at 400 tokens: score with layers [0, 1) of 2" in result.stdout and "stored in" in result.stdout
    assert "at 800 tokens" in result.stdout and "two-hop case 1/1" in result.stderr
    (stored,) = _stored(cache)
    assert stored["format"] == 2 and stored["kinds"] == ["single", "two-hop"] and stored["cases"] == 1
    assert stored["rope"] is None and stored["seed"] == 0
    assert [(b["length"], b["score_from"], b["score_layers"], b["keep"]) for b in stored["bands"]] == [
        (400, 0, 1, 1.0), (800, 0, 1, 1.0)]

    def ready(*extra):
        out = subprocess.run([sys.executable, "-m", "flashd.daemon", "--model", str(pflash_models["target"]),
                              "--prefill-drafter", str(drafter), "--device", "cpu", "--max-ctx", "1024", *extra],
                             input="quit\n", capture_output=True, text=True, timeout=TIMEOUT_S, env=env)
        assert out.returncode == 0, out.stderr
        return json.loads(out.stdout.splitlines()[0])["pflash"]

    calibrated = ready()
    assert (calibrated["score_layers"], calibrated["score_from"], calibrated["keep"]) == (1, 0, 1.0)
    assert calibrated["calibration"]["identity"] == stored["identity"]
    # the boundary between the bands of 400 and 800 tokens: their geometric mean
    assert [(b["from_tokens"], b["keep"], b["score_layers"]) for b in calibrated["bands"]] == [(0, 1.0, 1),
                                                                                            (566, 1.0, 1)]
    keep_given = ready("--compress-keep", "0.2")
    assert [(b["keep"], b["score_layers"]) for b in keep_given["bands"]] == [(0.2, 1), (0.2, 1)]
    explicit = ready("--compress-keep", "0.2", "--compress-layers", "2")
    assert (explicit["score_layers"], explicit["score_from"], explicit["keep"]) == (2, 0, 0.2)
    assert explicit["bands"] == []
    # under another RoPE scaling the drafter attends differently: this calibration is not used
    assert ready("--rope-scaling", "yarn", "--rope-factor", "2")["calibration"] is None


def test_merge_adds_bands_and_refuses_another_setup(pflash_models, tmp_path):
    cache, drafter = tmp_path / "cache", str(pflash_models["drafter"])
    common = ["--drafter", drafter, "--device", "cpu", "--cases", "1", "--keeps", "1.0", "--kinds", "single"]
    assert _calibrate(cache, *common, "--lengths", "300")[0] == 0
    code, out = _calibrate(cache, *common, "--lengths", "400", "--merge")
    assert code == 0, out
    (stored,) = _stored(cache)
    assert [b["length"] for b in stored["bands"]] == [300, 400]
    code, out = _calibrate(cache, *common[:-1], "two-hop", "--lengths", "350", "--merge")
    assert code == 1 and "--merge: the stored calibration differs in kinds" in out, out
    assert [b["length"] for b in _stored(cache)[0]["bands"]] == [300, 400]        # unchanged
    code, out = _calibrate(cache, *common, "--lengths", "400")                    # without --merge: replaced
    assert code == 0 and [b["length"] for b in _stored(cache)[0]["bands"]] == [400]


def test_margin_from_requires_a_margin_at_the_long_lengths_only(pflash_models, tmp_path):
    """With one keep nothing has a margin (no smaller keep to pass): --margin-from 400 makes 400 tokens fail and
    leaves 300 calibrated as before; --require-margin fails both; the two options together are a usage error."""
    cache, drafter = tmp_path / "cache", str(pflash_models["drafter"])
    common = ["--drafter", drafter, "--device", "cpu", "--cases", "1", "--keeps", "1.0", "--kinds", "single",
              "--lengths", "300,400"]
    code, out = _calibrate(cache, *common, "--margin-from", "400")
    assert code == 1 and "at 400 tokens (with a margin)" in out and "300 tokens" not in out.split("at 400")[1], out
    assert "300 tokens: layers [0, 1)" in out and not (cache / "pflash").exists()
    code, out = _calibrate(cache, *common, "--require-margin")
    assert code == 1 and "at 300 tokens (with a margin), 400 tokens (with a margin)" in out, out
    code, out = _calibrate(cache, *common, "--margin-from", "1000")             # no length reaches it: as before
    assert code == 0 and [b["margin"] for b in _stored(cache)[0]["bands"]] == [False, False], out
    code, out = _calibrate(cache, *common, "--require-margin", "--margin-from", "400")
    assert code == 2 and "give one" in out, out


def test_rope_scaling_reaches_the_drafter_and_names_the_file(tmp_path):
    """Under yarn x2 a drafter trained at 512 tokens scores 700-token cases, and the calibration is stored under the
    scaling's tag; without it 700 tokens is past the drafter's context."""
    cache = tmp_path / "cache"
    drafter = str(write_synthetic_model(tmp_path / "short.gguf", dataclasses.replace(DRAFTER_SPEC, context_length=512)))
    common = ["--drafter", drafter, "--device", "cpu", "--cases", "1", "--keeps", "1.0", "--kinds", "single",
              "--lengths", "700"]
    code, out = _calibrate(cache, *common)
    assert code == 2 and "past the drafter's 512" in out and "--rope-scaling" in out, out
    code, out = _calibrate(cache, *common, "--rope-scaling", "yarn", "--rope-factor", "2")
    assert code == 0, out
    (path,) = (cache / "pflash").glob("*.json")
    assert path.name.endswith("-yarn2x512.json") and json.loads(path.read_text())["rope"] == "yarn2x512"


def test_bad_options_are_usage_errors(pflash_models, tmp_path):
    cache, drafter = tmp_path / "cache", str(pflash_models["drafter"])
    for args, needle in ((["--keeps", "0"], "fractions must be in (0, 1]"), (["--lengths", "10"], "lengths must be"),
                         (["--keeps", "x"], "comma-separated"), (["--lengths", "400,400"], "must not repeat"),
                         (["--kinds", "single,three-hop"], "unknown case kind(s) three-hop"),
                         (["--kinds", ","], "(none given)"), (["--forward-chunk", "1000"], "multiple of 128"),
                         (["--rope-factor", "4"], "need --rope-scaling")):
        code, out = _calibrate(cache, "--drafter", drafter, "--device", "cpu", *args)
        assert code == 2 and needle in out, (args, out)
    code, out = _calibrate(cache, "--drafter", str(tmp_path / "nope.gguf"))
    assert code == 1 and "no such file" in out
    assert not (cache / "pflash").exists()
