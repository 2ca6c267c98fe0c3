"""The per-op benchmarks on the CPU (no GPU call): each imports, its --help runs as a script, every fd_* call
passes as many arguments as the C ABI's headers declare, the harness fails with the seed and the
worst element and exits 1, and the shape, byte and FLOP arithmetic and the oracles' index math agree with
brute force on small shapes."""
import ast
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from tests.native.test_native_abi import declared_arity, native_calls

from flashd.daemon.pflash import flashprefill as fp

ROOT = Path(__file__).resolve().parents[2]
OP_BENCHMARKS = ["bench_sampling", "bench_flashprefill", "bench_flashprefill_sparse_attention", "bench_gemv_multi",
                 "bench_recurrent"]


# ------------------------------------------------------------------------------ import, --help, ABI
@pytest.mark.parametrize("name", OP_BENCHMARKS)
def test_imports_and_parses_its_arguments(bench_module, name):
    module = bench_module(name)
    args = module.build_parser().parse_args(["--seed", "7", "--reps", "3"])
    assert (args.seed, args.reps) == (7, 3)
    assert module.build_parser().parse_args([]).seed is None          # a fresh seed unless given
    assert "python bench/" + name + ".py" in module.__doc__            # the docstring gives its command line


@pytest.mark.parametrize("name", OP_BENCHMARKS)
def test_help_runs_as_a_script(name):
    out = subprocess.run([sys.executable, str(ROOT / "bench" / f"{name}.py"), "--help"], capture_output=True,
                         text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "--seed" in out.stdout and f"python bench/{name}.py" in out.stdout


@pytest.mark.parametrize("name", OP_BENCHMARKS + ["op_harness"])
def test_every_native_call_matches_the_header(name):
    """As tests/native's repository-wide check, per benchmark: each calls the library, with the declared
    number of arguments."""
    arity = declared_arity()
    calls = list(native_calls(ROOT / "bench" / f"{name}.py"))
    assert calls
    for line, fn, args in calls:
        assert fn in arity, f"{name}.py calls {fn}, which the headers do not declare"
        assert not any(isinstance(a, ast.Starred) for a in args)
        assert len(args) == arity[fn], f"{name}.py:{line} {fn}: {len(args)} args, header {arity[fn]}"


# ---------------------------------------------------------------------------------------- harness
class FakeTimer:
    peak_gbs = 3000.0

    def __init__(self):
        self.calls = 0

    def time(self, fn, reps):
        for _ in range(reps):
            fn()
        self.calls += reps
        return 0.010


class FakeDevice:
    def synchronize(self):
        pass


def test_tolerance_reports_the_worst_element(bench_module):
    Tolerance = bench_module("op_harness").Tolerance
    tol = Tolerance("why", atol=0.1)
    assert tol(np.array([1.0, 2.0]), np.array([1.05, 2.0])) is None
    msg = tol(np.array([[1.0, 2.0], [3.0, 9.0]]), np.array([[1.2, 2.0], [3.0, 8.0]]))
    assert "2 of 4" in msg and "(1, 1)" in msg and "got 9.0" in msg
    assert "(0,)" in tol(np.array([np.nan, 1.0]), np.array([0.0, 1.0]))            # NaN fails
    assert tol(np.array([np.nan]), np.array([np.nan])) is None                     # unless expected
    assert Tolerance("rel", rtol=1e-3)(np.array([1000.5]), np.array([1000.0])) is None
    assert Tolerance("per element", atol=np.array([0.0, 1.0]))(np.array([0.0, 1.5]), np.array([0.0, 1.0])) is None
    assert "shape" in Tolerance.exact("ids")(np.zeros(3, np.int32), np.zeros(4, np.int32))
    assert Tolerance.exact("ids")(np.array([3, 4]), np.array([3, 4])) is None


def test_run_checks_before_timing_and_exits_1_with_the_seed(bench_module, capsys):
    h_mod = bench_module("op_harness")
    timer = FakeTimer()
    h = h_mod.OpHarness(1234, 5, FakeDevice(), timer, script="bench_x.py")
    launches = []
    ms = h.run("fd_ok", lambda: launches.append(1), lambda: np.arange(3), lambda: np.arange(3),
               h_mod.Tolerance.exact("ints"), n_bytes=30e6)
    assert ms == 0.010 and len(launches) == 1 + 5 and timer.calls == 5
    assert "fd_ok" in capsys.readouterr().out
    with pytest.raises(SystemExit) as exc:
        h.run("fd_bad", lambda: None, lambda: np.array([1, 2, 7]), lambda: np.arange(3),
              h_mod.Tolerance.exact("ints"))
    assert exc.value.code == 1 and timer.calls == 5                  # never timed
    out = capsys.readouterr().out
    assert "FAIL fd_bad" in out and "seed 1234" in out and "--seed 1234" in out and "got 7" in out


def test_case_inputs_depend_on_the_seed_and_the_case_only(bench_module):
    h_mod = bench_module("op_harness")
    a = h_mod.OpHarness(5, 1).rng("case a").standard_normal(4)
    h = h_mod.OpHarness(5, 1)
    h.rng("case b").standard_normal(100)
    assert np.array_equal(h.rng("case a").standard_normal(4), a)
    assert not np.array_equal(h_mod.OpHarness(6, 1).rng("case a").standard_normal(4), a)
    assert h_mod.OpHarness(None, 1).seed >= 0


# --------------------------------------------------------------------------------------- sampling
def test_sampling_references(bench_module):
    from flashd.daemon.sampling import apply_penalties, sample

    bs = bench_module("bench_sampling")
    rng = np.random.default_rng(0)
    x = bs.llm_logits(rng, 3, 1000)
    x[1, [5, 9]] = x[1].max() + 1
    assert x.dtype == np.float32 and bs.argmax_reference(x)[1] == 5                 # the lowest id wins a tie
    hist = bs.history_ids(rng, 1000)
    assert hist.shape == (bs.N_HISTORY,) and len(np.unique(hist[-64:])) < 64      # repeats in the window
    params = bs.sampling_params(bs.SAMPLE_CASES["T=0.8 top_k 40 top_p 0.95 rep 1.1"], 3)
    assert params.top_p == float(np.float32(0.95)) and params.repeat_penalty == float(np.float32(1.1))
    greedy = bs.sampling_params(bs.SAMPLE_CASES["T=1.0 top_k 1 freq 0.5 presence 0.5"], 3)
    steps = [0, 1, 99]
    want = np.array([sample(x[0], hist, greedy, s) for s in steps])
    assert (want == np.argmax(apply_penalties(x[0], hist, greedy))).all()          # top_k 1 = argmax
    check = bs.SampleCheck(x[0], hist, greedy, steps)
    assert check(want, want) is None and "off any float32 boundary" in check(want + 1, want)


# ----------------------------------------------------------------------------------- flashprefill
def test_flashprefill_counts_against_brute_force(bench_module):
    bf = bench_module("bench_flashprefill")
    p0, n, H, d = 256, 777, 14, 64
    rows = bf.query_block_rows(p0, n)
    assert rows[0] == (2, 128) and rows[-1] == (2 + 6, 777 - 6 * 128)
    dense = fp.block_mask(np.zeros(H, np.int32), None, None, p0, n, bf.n_blocks(p0 + n), 0, 0)
    assert bf.causal_blocks(p0, n, H) == dense.sum()
    brute = sum(2 * d * H * (p0 // 128 + i // 128 + 1) for i in range(n))
    assert bf.score_flops(p0, n, H, d) == brute
    assert bf.first_full_block(28672, 4096) == 256 - 2
    assert bf.mean_k_bytes(1000, 2, 64) == 2 * 1000 * 2 * 64 + 4 * 8 * 2 * 64


def test_flashprefill_inputs_give_a_realistic_selection(bench_module):
    bf = bench_module("bench_flashprefill")
    p0, n, H, n_kv, d = 2048, 1024, 14, 2, 64
    q, kc, vc = bf.prefill_inputs(np.random.default_rng(3), p0, n, H, n_kv, d, p0 + n + 5)
    assert q.shape == (n, H, d) and q.dtype == np.float32 and kc.shape == vc.shape == (n_kv, p0 + n + 5, d)
    assert np.isnan(kc[:, p0 + n:]).all() and np.isfinite(kc[:, :p0 + n]).all()
    idx, cnt = bf.oracle_selection(q, kc, p0, n_kv)
    assert idx.shape == (8, H, 24) and cnt.shape == (8, H)
    density = cnt.sum() / bf.causal_blocks(p0, n, H)
    assert 0.1 < density < 0.6, density         # neither dense (random q, k) nor sinks + window only
    assert (cnt[:-2] < np.arange(17, 23)[:, None] + 1).all()                    # the non-final rows are sparse


# ------------------------------------------------------------------------------ sparse attention
def test_sparse_attention_pairs_and_oracle_agree_with_flashprefill(bench_module):
    bf, bs = bench_module("bench_flashprefill"), bench_module("bench_flashprefill_sparse_attention")
    p0, n, H, n_kv, d = 384, 700, 14, 2, 64
    q, kc, vc = bf.prefill_inputs(np.random.default_rng(4), p0, n, H, n_kv, d)
    idx, cnt = bf.oracle_selection(q, kc, p0, n_kv)
    mask = fp.block_mask(np.full(H, fp.MASK_LISTS, np.int32), idx, cnt, p0, n, bf.n_blocks(p0 + n), 0, 0)
    slots = np.arange(p0 + n)
    brute = sum(int(mask[i // 128, h][slots[:p0 + i + 1] // 128].sum()) for i in range(n) for h in range(H))
    assert bs.visible_pairs(idx, cnt, p0, n) == brute
    assert bs.dense_pairs(p0, n, H) == H * sum(p0 + i + 1 for i in range(n))
    assert bs.check_blocks(n) == [0, 3, 5] and bs.check_blocks(100) == [0]
    want = bs.sparse_reference(q, kc, vc, idx, cnt, p0)
    attend = fp.sparse_attention(q.astype(np.float16).astype(np.float64), bf.slots_first(kc).astype(np.float64),
                                 bf.slots_first(vc).astype(np.float64), p0, mask, 1 / np.sqrt(d))
    got = bs.sampled_output(attend, p0, n, d, H)
    assert got.shape == want.shape == (128 + 128 + 60, H, d)
    np.testing.assert_allclose(got, want, atol=1e-12)          # two independent float64 oracles


# ---------------------------------------------------------------------------------------- gemv multi
def test_gemv_multi_bytes_and_reference(bench_module):
    from gguf.quants import dequantize

    from flashd.daemon.backends.cuda.ops import GEMV_MAX_ROWS
    from flashd.scripts.random_weights import random_weights

    bg = bench_module("bench_gemv_multi")
    rng = np.random.default_rng(5)
    for cols, mats in [bg.SHAPES["qkv 1.5B"], bg.SHAPES["qkv 0.5B"], bg.AWKWARD[1:3]]:
        for q, r in mats:
            assert bg.weight_bytes(q, r, cols) == random_weights(rng, q, r, cols).nbytes
    cols, mats = bg.SHAPES["qkv 1.5B"]
    w = sum(bg.weight_bytes(q, r, cols) for q, r in mats)
    assert GEMV_MAX_ROWS == 8 and bg.moved_bytes(mats, cols, 16) - 2 * w == 2 * bg.moved_bytes(mats, cols, 8) - 2 * w
    assert bg.moved_bytes(mats, cols, 1) == w + 4 * 2048 + 4 * 1536 + 4 * (1536 + 2048)
    cols, mats, n_x = bg.AWKWARD[1], bg.AWKWARD[2], bg.AWKWARD[3]
    datas = [random_weights(rng, q, r, cols) for q, r in mats]
    Ws = [dequantize(dt, q).reshape(r, cols).astype(np.float64) for dt, (q, r) in zip(datas, mats)]
    biases = [rng.standard_normal(r).astype(np.float32) for _, r in mats]
    x = rng.standard_normal((n_x, cols)).astype(np.float32)
    y, bound = bg.reference_and_bound(x, np.ones(cols, np.float32), Ws, biases)
    assert y.shape == bound.shape == (n_x, sum(r for _, r in mats)) and (bound > 0).all()
    xn = x / np.sqrt((x.astype(np.float64) ** 2).mean(-1, keepdims=True) + bg.EPS)
    np.testing.assert_allclose(y[:, 333:370], xn @ Ws[1].T + biases[1], rtol=1e-12)
    # gemv_rows' x scales: a 32-column block in a launch of one 32-column format, a 128-column group otherwise; the
    # coarser block bounds more error, and the 128-column bound is what rows=True means
    T = bg.T
    assert bg.x_block([T.Q8_0, T.Q8_0]) == 32 and bg.x_block([T.Q5_0]) == 32
    assert bg.x_block([T.Q8_0, T.Q5_0]) == bg.x_block([T.Q4_K]) == bg.ROWS_XG == 128
    xq = x[:, :2048]
    b32, b128 = bg.int8_x_bound(xq, Ws[0][:, :2048], 32), bg.int8_x_bound(xq, Ws[0][:, :2048], True)
    assert (b32 <= b128 + 1e-12).all() and (b32 < b128).any()
    np.testing.assert_allclose(b128, bg.int8_x_bound(xq, Ws[0][:, :2048], 128))
