"""CudaOps' fused hybrid ops (cuda/fused_ops.py) without a GPU, on the host stand-in library of
test_hybrid_ops_on_host.py (its fd_*_fused / _silu / fd_gated_qk_norm run the reference's composition on the
buffers they are handed). Checked: each op reaches its one entry point and nothing else (no split copies, no
separate norms or gates), with no upload, download or synchronization; the arguments arrive in the header's order
(Hv != Hk, q | k | v read as strided views of one row: a swapped pointer or stride gives another result than the
reference's); shapes past the fused kernel's limit (S > 128) run the composition's primitive entry points; bad
shapes are refused before any fd_* call. The kernels themselves: tests/gpu/test_hybrid_fused.py."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.cuda.fused_ops import DELTA_FUSED_MAX_DK
from flashd.daemon.backends.cuda.recurrent_ops import delta_scale
from tests.cuda_on_host.test_hybrid_ops_on_host import REF, ops  # noqa: F401  (the fixture)

EPS = 1e-6


def _inputs(rng, n, hk, hv, S):
    """Host arrays of one fused delta rule call: qkv (n, (2 hk + hv) S), alpha, beta (n, hv), z (n, hv S), dt_bias,
    a (hv,), norm weight (S,), state (hv, S, S)."""
    f = np.float32
    return dict(qkv=rng.standard_normal((n, (2 * hk + hv) * S)).astype(f),
                alpha=rng.standard_normal((n, hv)).astype(f), beta=rng.standard_normal((n, hv)).astype(f),
                z=rng.standard_normal((n, hv * S)).astype(f), dt_bias=rng.standard_normal(hv).astype(f),
                a=-np.exp(rng.standard_normal(hv)).astype(f), norm=(1 + 0.1 * rng.standard_normal(S)).astype(f),
                state=(0.1 * rng.standard_normal((hv, S, S))).astype(f))


def _spy(ops, monkeypatch):
    called = []
    for name in [n for n in dir(type(ops.lib)) if n.startswith("fd_")]:
        fn = getattr(ops.lib, name)
        monkeypatch.setattr(ops.lib, name, lambda *args, _fn=fn, _name=name: called.append(_name) or _fn(*args))
    for name in ("upload", "download", "synchronize"):
        monkeypatch.setattr(ops.dev, name, lambda *args, _name=name, **kw: pytest.fail(f"{_name} in a forward op"))
    return called


def _close(got, want, tol=2e-5):
    np.testing.assert_allclose(got, want, rtol=tol, atol=tol * max(1.0, float(np.abs(want).max())))


@pytest.mark.parametrize("n", [1, 5])
@pytest.mark.parametrize("hk,hv", [(2, 2), (2, 6)])
def test_fused_delta_rule_is_the_composition_in_one_entry(ops, monkeypatch, n, hk, hv):
    S = 16
    host = _inputs(np.random.default_rng(n * 10 + hv), n, hk, hv, S)
    dev = {k: ops.dev.upload(v) for k, v in host.items()}
    ref_state = host["state"].copy()
    want = REF.gated_delta_rule_fused(host["qkv"], host["alpha"], host["beta"], host["z"], host["dt_bias"],
                                      host["a"], host["norm"], ref_state, hk, S, EPS)
    monkeypatch.setattr(ops, "fused_delta_prefill", True)      # (off by default: a prefill then runs composed)
    called = _spy(ops, monkeypatch)
    got = ops.gated_delta_rule_fused(dev["qkv"], dev["alpha"], dev["beta"], dev["z"], dev["dt_bias"], dev["a"],
                                     dev["norm"], dev["state"], hk, S, EPS)
    assert called == ["fd_gated_delta_rule_fused"]
    monkeypatch.undo()
    name, args = ops.lib.calls[-1]
    assert (name, args) == ("fd_gated_delta_rule_fused",
                            ((2 * hk + hv) * S, n, hk, hv, S, S, delta_scale(S), pytest.approx(EPS),
                             pytest.approx(EPS)))
    # the reference's prefill is the chunked form, the kernel's the recurrent one: equal up to rounding
    _close(ops.to_numpy(got), want, 1e-4)
    _close(ops.to_numpy(dev["state"]), ref_state, 1e-4)


def test_fused_tree_rows_are_decode_steps(ops, monkeypatch):
    hk, hv, S, n = 1, 3, 8, 5
    parents = np.array([-1, 0, 1, 0, 3], np.int32)
    host = _inputs(np.random.default_rng(1), n, hk, hv, S)
    dev = {k: ops.dev.upload(v) for k, v in host.items()}
    node_state = ops.dev.upload(np.zeros((n, hv, S, S), np.float32))
    dev_parents = ops.dev.upload(parents)
    called = _spy(ops, monkeypatch)
    got = ops.gated_delta_rule_fused_tree(dev["qkv"], dev["alpha"], dev["beta"], dev["z"], dev["dt_bias"], dev["a"],
                                          dev["norm"], dev["state"], dev_parents, node_state, hk, S, EPS)
    assert called == ["fd_gated_delta_rule_fused_tree"]
    monkeypatch.undo()
    got = ops.to_numpy(got)
    for i in range(n):                               # node i = a one-token decode along its path, by the reference
        path = [i]
        while parents[path[0]] >= 0:
            path.insert(0, int(parents[path[0]]))
        memory = host["state"].copy()
        for j in path:
            row = REF.gated_delta_rule_fused(*(host[k][j:j + 1] for k in ("qkv", "alpha", "beta", "z")),
                                             host["dt_bias"], host["a"], host["norm"], memory, hk, S, EPS)
        _close(got[i], row[0])
        _close(ops.to_numpy(node_state)[i], memory)
    np.testing.assert_array_equal(ops.to_numpy(dev["state"]), host["state"])     # read only


def test_conv_silu_and_its_tree_are_one_entry_each(ops, monkeypatch):
    rng = np.random.default_rng(2)
    n, C, K = 4, 12, 4
    x, w = rng.standard_normal((n, C)).astype(np.float32), rng.standard_normal((C, K)).astype(np.float32)
    st = rng.standard_normal((K - 1, C)).astype(np.float32)
    ref_st = st.copy()
    want = REF.causal_conv1d_silu(x, w, ref_st)
    dx, dw, dst = ops.dev.upload(x), ops.dev.upload(w), ops.dev.upload(st)
    parents = ops.dev.upload(np.array([-1, 0, 1, 2], np.int32))
    node_conv = ops.dev.upload(np.zeros((n, K - 1, C), np.float32))
    called = _spy(ops, monkeypatch)
    got = ops.causal_conv1d_silu(dx, dw, dst)
    assert called == ["fd_causal_conv1d_silu"]
    monkeypatch.undo()
    _close(ops.to_numpy(got), want)
    _close(ops.to_numpy(dst), ref_st)
    fresh = ops.dev.upload(st)
    called = _spy(ops, monkeypatch)
    tree = ops.causal_conv1d_silu_tree(dx, dw, fresh, parents, node_conv)
    assert called == ["fd_causal_conv1d_silu_tree"]
    monkeypatch.undo()
    _close(ops.to_numpy(tree), want)                 # a chain tree is the sequence


def test_gated_qk_norm_is_one_entry(ops, monkeypatch):
    rng = np.random.default_rng(3)
    n, H, hkv, d = 3, 4, 2, 8
    qg, k = rng.standard_normal((n, H, 2 * d)).astype(np.float32), rng.standard_normal((n, hkv, d)).astype(np.float32)
    wq, wk = rng.standard_normal(d).astype(np.float32), rng.standard_normal(d).astype(np.float32)
    want = REF.gated_qk_norm(qg, k, wq, wk, EPS)
    args = [ops.dev.upload(t) for t in (qg, k, wq, wk)]
    called = _spy(ops, monkeypatch)
    got = ops.gated_qk_norm(*args, EPS)
    assert called == ["fd_gated_qk_norm"]
    monkeypatch.undo()
    for g, w in zip(got, want):
        _close(ops.to_numpy(g), w)
    np.testing.assert_array_equal(ops.to_numpy(got[1]), qg[..., d:])     # the gate: bit copies


def test_past_the_fused_limit_the_composition_runs(ops, monkeypatch):
    hk, hv, S, n = 1, 1, DELTA_FUSED_MAX_DK + 8, 1
    host = _inputs(np.random.default_rng(4), n, hk, hv, S)
    dev = {k: ops.dev.upload(v) for k, v in host.items()}
    ops.prepare_capture(type("Cfg", (), {"linear": type("Lin", (), {"head_dim": S})})())    # l2_norm's weight
    want = REF.gated_delta_rule_fused(host["qkv"], host["alpha"], host["beta"], host["z"], host["dt_bias"],
                                      host["a"], host["norm"], host["state"].copy(), hk, S, EPS)
    called = _spy(ops, monkeypatch)
    got = ops.gated_delta_rule_fused(dev["qkv"], dev["alpha"], dev["beta"], dev["z"], dev["dt_bias"], dev["a"],
                                     dev["norm"], dev["state"], hk, S, EPS)
    assert "fd_gated_delta_rule_fused" not in called and "fd_gated_delta_rule_decode" in called
    monkeypatch.undo()
    _close(ops.to_numpy(got), want, 1e-4)


@pytest.mark.parametrize("bad", ["width", "alpha", "z", "norm", "state", "heads"])
def test_bad_shapes_are_refused_before_the_abi(ops, monkeypatch, bad):
    hk, hv, S, n = 2, 4, 8, 2
    host = _inputs(np.random.default_rng(5), n, hk, hv, S)
    if bad == "width":
        host["qkv"] = host["qkv"][:, :-1].copy()
    elif bad == "alpha":
        host["alpha"] = host["alpha"][:, :-1].copy()
    elif bad == "z":
        host["z"] = host["z"][:, :-1].copy()
    elif bad == "norm":
        host["norm"] = host["norm"][:-1].copy()
    elif bad == "state":
        host["state"] = host["state"][:-1].copy()
    dev = {k: ops.dev.upload(v) for k, v in host.items()}
    called = _spy(ops, monkeypatch)
    with pytest.raises(ValueError):
        ops.gated_delta_rule_fused(dev["qkv"], dev["alpha"], dev["beta"], dev["z"], dev["dt_bias"], dev["a"],
                                   dev["norm"], dev["state"], 3 if bad == "heads" else hk, S, EPS)
    assert called == []


def test_a_decode_step_runs_the_fused_entries_and_no_small_ops(tmp_path, monkeypatch):
    """One eager decode step of a qwen35 model (2 Gated DeltaNet + 2 gated attention layers) on CudaOps: per linear
    layer the conv + SiLU and the fused delta rule, per attention layer the q/k norm and the gate's fd_sigmoid_mul;
    none of the small ops they replace (split copies, norms, silu, sigmoid, decay, products) is launched."""
    from collections import Counter

    from flashd.daemon.backends.cuda.tensor import Device
    from flashd.daemon.models import load_model
    from flashd.daemon.runner import ModelRunner
    from flashd.scripts.make_synthetic_gguf import write_synthetic_model
    from tests.cuda_on_host.test_qwen35_forward_on_host import SPEC, HostAttentionOps, ModelNative

    ops = HostAttentionOps(Device(ModelNative()))
    ops.reserve_arena(8 << 20)
    ops.reserve_scratch(2 * SPEC.hidden * max(SPEC.ffn, SPEC.vocab_size))
    lm = load_model(write_synthetic_model(tmp_path / "m.gguf", SPEC), ops.load_weight)
    run = ModelRunner(ops, lm.config, lm.weights, 64, 16)
    run.prefill([1, 2, 3])
    called = []
    for name in [n for n in dir(type(ops.lib)) if n.startswith("fd_")]:
        fn = getattr(ops.lib, name)
        monkeypatch.setattr(ops.lib, name, lambda *args, _fn=fn, _name=name: called.append(_name) or _fn(*args))
    run.prefill([4])
    count = Counter(called)
    n_linear = sum(lm.config.linear.recurrent)
    n_attention = lm.config.n_layers - n_linear
    assert (n_linear, n_attention) == (2, 2)
    for name, want in (("fd_causal_conv1d_silu", n_linear), ("fd_gated_delta_rule_fused", n_linear),
                       ("fd_gated_qk_norm", n_attention), ("fd_sigmoid_mul", n_attention)):
        assert count[name] == want, (name, count)
    replaced = ("fd_copy_cols", "fd_rmsnorm", "fd_silu", "fd_sigmoid", "fd_delta_decay", "fd_swiglu", "fd_mul",
                "fd_causal_conv1d", "fd_gated_delta_rule_decode")
    assert not [n for n in replaced if count[n]], count


@pytest.mark.parametrize("fuse_hybrid,fused_prefill,n,want", [
    (True, True, 3, "fd_gated_delta_rule_fused"), (True, False, 3, "fd_gated_delta_rule_prefill"),
    (True, False, 1, "fd_gated_delta_rule_fused"), (False, True, 1, "fd_gated_delta_rule_decode"),
    (False, True, 3, "fd_gated_delta_rule_prefill")])
def test_the_switches_pick_the_fused_kernel_or_the_composition(ops, monkeypatch, fuse_hybrid, fused_prefill, n,
                                                                want):
    """fuse_hybrid off: the composition everywhere (the unfused launches); fused_delta_prefill off: a prefill of the
    delta rule composed, a decode step still fused. Either way the reference's result."""
    hk, hv, S = 1, 2, 8
    host = _inputs(np.random.default_rng(6), n, hk, hv, S)
    dev = {k: ops.dev.upload(v) for k, v in host.items()}
    ops.prepare_capture(type("Cfg", (), {"linear": type("Lin", (), {"head_dim": S})})())
    ops.fuse_hybrid, ops.fused_delta_prefill = fuse_hybrid, fused_prefill
    want_out = REF.gated_delta_rule_fused(host["qkv"], host["alpha"], host["beta"], host["z"], host["dt_bias"],
                                          host["a"], host["norm"], host["state"].copy(), hk, S, EPS)
    called = _spy(ops, monkeypatch)
    got = ops.materialize(ops.gated_delta_rule_fused(dev["qkv"], dev["alpha"], dev["beta"], dev["z"], dev["dt_bias"],
                                                     dev["a"], dev["norm"], dev["state"], hk, S, EPS))
    assert want in called, called
    monkeypatch.undo()
    _close(ops.to_numpy(got), want_out, 1e-4)
    if not fuse_hybrid:
        qg, kk, w = (ops.dev.upload(np.ones(s, np.float32)) for s in ((n, 2, 8), (n, 1, 4), (4,)))
        called = _spy(ops, monkeypatch)
        ops.gated_qk_norm(qg, kk, w, w, EPS)
        assert "fd_gated_qk_norm" not in called and "fd_rmsnorm" in called
