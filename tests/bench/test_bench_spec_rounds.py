"""bench/bench_spec.py's timed passes on the CPU reference backend (a tiny synthetic target, the n-gram drafter):
--rounds N interleaves N passes of plain decoding and of every configuration and shows each row's median pass; the
median pass's own stats make the row; exactness is counted against plain decoding's outputs; --rounds 0 is refused."""
from __future__ import annotations

import pytest

from flashd.bench.bench_spec import Pass, load_flashd, main, make_drafters, median_pass, run_flashd


def test_median_pass_is_the_middle_one_by_speed():
    passes = [Pass(3.0, ["c"]), Pass(1.0, ["a"]), Pass(2.0, ["b"]), Pass(5.0, ["d"])]
    assert median_pass(passes[:3]).outputs == ["b"]
    assert median_pass(passes).outputs == ["b"]          # even count: the lower middle one
    assert median_pass([Pass(7.0, [])]).tok_s == 7.0


@pytest.fixture(scope="module")
def engine(tmp_path_factory):
    from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

    path = write_synthetic_model(tmp_path_factory.mktemp("spec-rounds") / "t.gguf",
                                 SyntheticSpec(n_layers=2, seed=3, name="rounds"))
    eng, _ = load_flashd(str(path), 256, "cpu")
    return eng


def test_rounds_interleave_and_each_row_is_its_median_pass(engine):
    # repetitive prompts, so the n-gram drafter proposes and steps accept
    prompts = [[5, 6, 7, 8] * 6, [9, 10, 11] * 8, [12, 13] * 10]
    configs = make_drafters(engine, None, None, quick=True)
    rows = run_flashd(engine, prompts, 12, configs, n_warm=1, rounds=3)
    assert [(r.drafter, r.mode) for r in rows] == [("-", "plain"), ("ngram", "chain"), ("ngram", "auto")]
    for r in rows:
        speeds = r.extra["rounds_tok_s"]
        assert len(speeds) == 3 and sorted(speeds)[1] == round(r.tok_s, 1)
    for r in rows[1:]:
        assert r.exact == "3/3" and r.extra["rounds_exact"] == [3, 3, 3]   # the reference backend is exact
        assert r.tokens_per_step >= 1.0 and r.verify_ms_step > 0


def test_one_round_keeps_the_single_pass_rows(engine):
    rows = run_flashd(engine, [[5, 6, 7, 8] * 4], 8, make_drafters(engine, None, None, quick=True), n_warm=0)
    assert len(rows) == 3 and all("rounds_tok_s" not in r.extra for r in rows)
    assert rows[1].exact == "1/1"
    with pytest.raises(ValueError, match="rounds"):
        run_flashd(engine, [[5, 6]], 4, [], n_warm=0, rounds=0)


def test_rounds_below_one_are_refused_before_loading(capsys):
    with pytest.raises(SystemExit):
        main(["--skip-llama", "--rounds", "0", "--target", "/nonexistent.gguf"])
    assert "--rounds must be >= 1" in capsys.readouterr().err
