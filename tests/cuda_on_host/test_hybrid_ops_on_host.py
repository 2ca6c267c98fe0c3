"""CudaOps' hybrid-model ops (cuda/hybrid_ops.py, cuda/recurrent_state.py) without a GPU, on the stand-in library
of test_recurrent_on_host.py (host memory; each fd_* call runs its numpy definition on the buffers it is
handed) grown by the kernels the composition uses (fd_copy_cols, fd_swiglu, fd_silu, fd_sigmoid, fd_sigmoid_mul,
fd_mul, fd_delta_decay, fd_rmsnorm, fd_memset, fd_gemv / fd_dequant_f16 / fd_gemm_f16 over float32 weights). Checked
against the reference backend: split is exact; silu, mul, sigmoid, delta_decay, l2_norm agree to float32 rounding
(the stand-ins of fd_sigmoid* and fd_delta_decay are the reference's formulas: the kernels' own ulps are
tests/gpu/test_hybrid_gates.py's); which entry point each op and pending combination reaches; the recurrent
state's layer views, clear, save and load; and a whole Gated DeltaNet layer of a synthetic qwen35 model (models.qwen35.gated_delta_net
on both backends) through a prefill chunk on the GEMM path and decode steps on the GEMV path, the state carried
on the device. The kernels and the gated attention layer on a GPU: tests/gpu/test_cuda_qwen35.py."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.base import Batch, RecurrentStateSpec
from flashd.daemon.backends.cuda.ops import CudaOps
from flashd.daemon.backends.cuda.tensor import Device
from flashd.daemon.backends.reference import ReferenceOps
from flashd.daemon.models import load_model
from flashd.daemon.models.qwen35 import gated_delta_net
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec
from flashd.daemon.backends.reference_recurrent import causal_conv1d, delta_rule_recurrent
from flashd.daemon.backends.reference_recurrent_tree import causal_conv1d_tree, delta_rule_tree
from tests.cuda_on_host.test_recurrent_on_host import RecurrentLib, RecurrentNative

REF = ReferenceOps()
F32 = 0


def _rms(x, w, eps):
    return x / np.sqrt(np.mean(np.square(x), -1, keepdims=True, dtype=np.float32) + np.float32(eps)) * w


def _fd_silu(g):
    """The stand-in's silu (fd_silu, and the conv's fused SiLU: the same bits on the GPU)."""
    return g / (1 + np.exp(-g))


class HybridLib(RecurrentLib):
    def _null(self, p) -> bool:
        return self._addr(p) == 0

    def fd_embed(self, dst, table, qtype, n_rows, cols, ids, n_ids, stream):
        assert qtype == F32
        self._a(dst, (n_ids, cols))[...] = self._a(table, (n_rows, cols))[self._a(ids, (n_ids,), np.int32)]
        return 0

    def fd_copy_cols(self, y, x, rows, x_cols, col0, cols, stream):
        self._a(y, (rows, cols))[...] = self._a(x, (rows, x_cols))[:, col0:col0 + cols]
        return 0

    def fd_swiglu(self, y, gate, up, n, stream):
        g = self._a(gate, (n,))
        self._a(y, (n,))[...] = g / (1 + np.exp(-g)) * self._a(up, (n,))
        return 0

    def fd_silu(self, y, x, n, stream):
        self._a(y, (n,))[...] = _fd_silu(self._a(x, (n,)))
        return 0

    def fd_sigmoid(self, y, x, n, stream):
        self._a(y, (n,))[...] = REF.sigmoid(self._a(x, (n,)))
        return 0

    def fd_sigmoid_mul(self, y, x, gate, n, stream):
        self._a(y, (n,))[...] = self._a(x, (n,)) * REF.sigmoid(self._a(gate, (n,)))
        return 0

    def fd_mul(self, y, a, b, n, stream):
        self._a(y, (n,))[...] = self._a(a, (n,)) * self._a(b, (n,))
        return 0

    def fd_delta_decay(self, g, alpha, dt_bias, a, n, hv, stream):
        self._a(g, (n, hv))[...] = REF.delta_decay(self._a(alpha, (n, hv)), self._a(dt_bias, (hv,)), self._a(a, (hv,)))
        return 0

    def fd_rmsnorm(self, y, x, w, rows, cols, eps, stream):
        self._a(y, (rows, cols))[...] = _rms(self._a(x, (rows, cols)), self._a(w, (cols,)), eps)
        return 0

    def fd_memset(self, dst, byte, n_bytes, stream):
        self._a(dst, (n_bytes,), np.uint8)[...] = byte
        return 0

    def fd_memcpy_d2d(self, dst, src, n_bytes, stream):
        self.ffi.memmove(self.ffi.cast("char*", dst), self.ffi.cast("char*", src), n_bytes)
        return 0

    def _out(self, y, x_rows, w, rows, bias, residual, n):
        out = x_rows @ w.T
        if not self._null(bias):
            out = out + self._a(bias, (rows,))
        if not self._null(residual):
            out = out + self._a(residual, (n, rows))
        self._a(y, (n, rows))[...] = out
        return 0

    def fd_gemv(self, y, w, qtype, rows, cols, x, n_x, norm_w, eps, bias, residual, stream):
        assert qtype == F32
        xs = self._a(x, (n_x, cols))
        if not self._null(norm_w):
            xs = _rms(xs, self._a(norm_w, (cols,)), eps)
        return self._out(y, xs, self._a(w, (rows, cols)), rows, bias, residual, n_x)

    def fd_gemv_multi(self, n_mats, y, w, qtype, rows, bias, cols, x, n_x, norm_w, eps, stream):
        for k in range(n_mats):    # one launch of n_mats matrices: each as fd_gemv computes it
            status = self.fd_gemv(y[k], w[k], qtype[k], rows[k], cols, x, n_x, norm_w, eps, bias[k], self.ffi.NULL,
                                  stream)
            if status:
                return status
        return 0

    def fd_dequant_f16(self, dst, w, qtype, rows, cols, stream):
        assert qtype == F32
        self._a(dst, (rows, cols), np.float16)[...] = self._a(w, (rows, cols))
        return 0

    def fd_gemm_f16(self, y, x, w16, m, n, k, bias, residual, stream):
        w = self._a(w16, (n, k), np.float16).astype(np.float32)
        return self._out(y, self._a(x, (m, k)), w, n, bias, residual, m)

    # -- the fused ops (ABI 15; cuda/fused_ops.py): the reference's composition, with the kernels' recurrent form
    def fd_causal_conv1d_silu(self, y, x, weight, state, n, c, k, stream):
        self.calls.append(("fd_causal_conv1d_silu", (n, c, k)))
        st = self._a(state, (k - 1, c))
        self._a(y, (n, c))[...] = _fd_silu(causal_conv1d(self._a(x, (n, c)).copy(), self._a(weight, (c, k)), st))
        return 0

    def fd_causal_conv1d_silu_tree(self, y, x, weight, state, parents, node_conv, n, c, k, stream):
        self.calls.append(("fd_causal_conv1d_silu_tree", (n, c, k)))
        self._a(y, (n, c))[...] = _fd_silu(causal_conv1d_tree(self._a(x, (n, c)), self._a(weight, (c, k)),
                                                              self._a(state, (k - 1, c)),
                                                              self._a(parents, (n,), np.int32),
                                                              self._a(node_conv, (n, k - 1, c))))
        return 0

    def _rows(self, p, n, stride, width):
        """(n, width) rows `stride` floats apart from p (views of the conv output's q | k | v)."""
        flat = self._a(p, ((n - 1) * stride + width,))
        return np.stack([flat[t * stride:t * stride + width] for t in range(n)])

    def _fused_in(self, q, k, v, stride, alpha, beta, dt_bias, a, n, hk, hv, dk, dv, l2_eps):
        qn = REF.l2_norm(self._rows(q, n, stride, hk * dk).reshape(n, hk, dk), l2_eps)
        kn = REF.l2_norm(self._rows(k, n, stride, hk * dk).reshape(n, hk, dk), l2_eps)
        vv = self._rows(v, n, stride, hv * dv).reshape(n, hv, dv)
        g = REF.delta_decay(self._a(alpha, (n, hv)), self._a(dt_bias, (hv,)), self._a(a, (hv,)))
        return qn, kn, vv, g, REF.sigmoid(self._a(beta, (n, hv)))

    def _fused_out(self, out, o, z, norm_w, n, hv, dv, norm_eps):
        self._a(out, (n, hv, dv))[...] = REF.mul(_rms(o, self._a(norm_w, (dv,)), norm_eps),
                                                 REF.silu(self._a(z, (n, hv, dv))))
        return 0

    def fd_gated_delta_rule_fused(self, out, q, k, v, stride, alpha, beta, z, dt_bias, a, norm_w, state, n, hk, hv,
                                  dk, dv, scale, l2_eps, norm_eps, stream):
        self.calls.append(("fd_gated_delta_rule_fused", (stride, n, hk, hv, dk, dv, scale, l2_eps, norm_eps)))
        ins = self._fused_in(q, k, v, stride, alpha, beta, dt_bias, a, n, hk, hv, dk, dv, l2_eps)
        o = delta_rule_recurrent(*ins, self._a(state, (hv, dk, dv)))
        return self._fused_out(out, o, z, norm_w, n, hv, dv, norm_eps)

    def fd_gated_delta_rule_fused_tree(self, out, q, k, v, stride, alpha, beta, z, dt_bias, a, norm_w, state, parents,
                                       node_state, n, hk, hv, dk, dv, scale, l2_eps, norm_eps, stream):
        self.calls.append(("fd_gated_delta_rule_fused_tree", (stride, n, hk, hv, dk, dv, scale, l2_eps, norm_eps)))
        ins = self._fused_in(q, k, v, stride, alpha, beta, dt_bias, a, n, hk, hv, dk, dv, l2_eps)
        o = delta_rule_tree(*ins, self._a(state, (hv, dk, dv)), self._a(parents, (n,), np.int32),
                            self._a(node_state, (n, hv, dk, dv)))
        return self._fused_out(out, o, z, norm_w, n, hv, dv, norm_eps)

    def fd_gated_qk_norm(self, q_out, gate_out, k_out, q_gate, k, wq, wk, n, H, hkv, d, eps, stream):
        self.calls.append(("fd_gated_qk_norm", (n, H, hkv, d, eps)))
        qg = self._a(q_gate, (n, H, 2 * d))
        self._a(q_out, (n, H, d))[...] = _rms(qg[..., :d], self._a(wq, (d,)), eps)
        self._a(gate_out, (n, H, d))[...] = qg[..., d:]
        self._a(k_out, (n, hkv, d))[...] = _rms(self._a(k, (n, hkv, d)), self._a(wk, (d,)), eps)
        return 0


class HybridNative(RecurrentNative):
    def __init__(self):
        super().__init__()
        self.lib = HybridLib(self.ffi)


@pytest.fixture
def ops():
    o = CudaOps(Device(HybridNative()))
    o.reserve_arena(4 << 20)
    o.begin_forward()
    return o


@pytest.mark.parametrize("lead", [(5, 3), (1, 1), (1,)])
def test_split_is_an_exact_copy_of_each_part(ops, lead):
    x = np.random.default_rng(0).standard_normal((*lead, 24)).astype(np.float32)
    for sizes in [(12, 12), (8, 8, 8), (4, 8, 12), (6, 18)]:
        got = ops.split(ops.dev.upload(x), sizes)
        for g, want in zip(got, REF.split(x, sizes)):
            assert g.shape == want.shape
            np.testing.assert_array_equal(ops.to_numpy(g), want)
    with pytest.raises(ValueError):
        ops.split(ops.dev.upload(x), (8, 8))


def test_one_row_splits_into_views_when_its_parts_are_aligned(ops):
    """The decode step's split: views of x (no launch, the same bytes) where every part starts on a 16-byte
    boundary; a part at another offset, or several rows, take fd_copy_cols."""
    x = ops.dev.upload(np.arange(24, dtype=np.float32).reshape(1, 24))
    q, k, v = ops.split(x, (8, 4, 12))
    assert [t.ptr - x.ptr for t in (q, k, v)] == [0, 32, 48] and all(t.owner is x.owner for t in (q, k, v))
    assert [t.shape for t in (q, k, v)] == [(1, 8), (1, 4), (1, 12)]
    a, b = ops.split(x, (6, 18))                            # 6 floats: b would start 24 bytes in
    assert a.ptr != x.ptr and b.ptr != x.ptr + 24
    np.testing.assert_array_equal(ops.to_numpy(b), np.arange(6, 24, dtype=np.float32).reshape(1, 18))


def test_elementwise_ops_match_the_reference(ops):
    rng = np.random.default_rng(1)
    a, b = (rng.standard_normal((7, 3, 16)).astype(np.float32) * 4 for _ in range(2))
    da, db = ops.dev.upload(a), ops.dev.upload(b)
    close = dict(rtol=2e-6, atol=2e-6)
    np.testing.assert_allclose(ops.to_numpy(ops.silu(da)), REF.silu(a), **close)
    np.testing.assert_allclose(ops.to_numpy(ops.mul(da, ops.silu(db))), REF.mul(a, REF.silu(b)), **close)
    np.testing.assert_allclose(ops.to_numpy(ops.mul(ops.silu(db), da)), REF.mul(a, REF.silu(b)), **close)
    np.testing.assert_array_equal(ops.to_numpy(ops.mul(da, ops.sigmoid(db))), REF.mul(a, REF.sigmoid(b)))
    np.testing.assert_allclose(ops.to_numpy(ops.l2_norm(da, 1e-6)), REF.l2_norm(a, 1e-6), **close)
    alpha = rng.standard_normal((7, 4)).astype(np.float32) * 30          # past softplus's z > 20 branch too
    dt, A = rng.standard_normal(4).astype(np.float32), -rng.uniform(0.1, 2, 4).astype(np.float32)
    got = ops.delta_decay(*(ops.dev.upload(t) for t in (alpha, dt, A)))
    np.testing.assert_array_equal(ops.to_numpy(got), REF.delta_decay(alpha, dt, A))
    np.testing.assert_array_equal(ops.to_numpy(ops.mul(da, db)), a * b)
    np.testing.assert_array_equal(ops.to_numpy(ops.sigmoid(db)), REF.sigmoid(b))
    with pytest.raises(ValueError):
        ops.mul(da, ops.dev.upload(b[:, :2]))
    with pytest.raises(ValueError):
        ops.delta_decay(*(ops.dev.upload(t) for t in (alpha, dt[:3], A)))


def test_each_op_reaches_its_entry_point_and_nothing_synchronizes(ops, monkeypatch):
    """One C entry per op (ABI 13), pending silu / sigmoid fused into the product, and no download or upload
    (what a captured decode step may not do)."""
    rng = np.random.default_rng(7)
    a, b = (ops.dev.upload(rng.standard_normal((3, 8)).astype(np.float32)) for _ in range(2))
    alpha, vec = ops.dev.upload(rng.standard_normal((3, 4)).astype(np.float32)), ops.dev.upload(np.ones(4, np.float32))
    ops.l2_norm(a, 1e-6)                                   # its weight is made once, before the calls counted
    called = []
    for name in ("fd_copy_cols", "fd_swiglu", "fd_silu", "fd_sigmoid", "fd_sigmoid_mul", "fd_mul", "fd_delta_decay",
                 "fd_rmsnorm"):
        fn = getattr(ops.lib, name)
        monkeypatch.setattr(ops.lib, name, lambda *args, _fn=fn, _name=name: called.append(_name) or _fn(*args))
    for name in ("upload", "download", "synchronize"):
        monkeypatch.setattr(ops.dev, name, lambda *args, _name=name, **kw: pytest.fail(f"{_name} in a forward op"))
    cases = [(lambda: ops.split(a, (2, 6)), ["fd_copy_cols"] * 2),
             (lambda: ops.split(a[:1], (4, 4)), []),             # one aligned row: views
             (lambda: ops.mul(a, ops.silu(b)), ["fd_swiglu"]),
             (lambda: ops.mul(ops.sigmoid(b), a), ["fd_sigmoid_mul"]),
             (lambda: ops.mul(a, b), ["fd_mul"]),
             (lambda: ops.mul(ops.silu(a), ops.sigmoid(b)), ["fd_sigmoid", "fd_swiglu"]),
             (lambda: ops.materialize(ops.silu(a)), ["fd_silu"]),
             (lambda: ops.materialize(ops.sigmoid(a)), ["fd_sigmoid"]),
             (lambda: ops.delta_decay(alpha, vec, vec), ["fd_delta_decay"]),
             (lambda: ops.l2_norm(a, 1e-6), ["fd_rmsnorm"])]
    for run, want in cases:
        called.clear()
        run()
        assert called == want


def test_recurrent_state_views_clear_save_and_load(ops):
    spec = RecurrentStateSpec(n_layers=3, conv_kernel=4, conv_channels=10, n_v_heads=2, head_dim=8)
    st = ops.recurrent_state(spec)
    assert st.n_bytes == 4 * 3 * (3 * 10 + 2 * 64)
    conv, ssm = st.save()
    assert conv.shape == (3, 3, 10) and ssm.shape == (3, 2, 8, 8) and not conv.any() and not ssm.any()
    rng = np.random.default_rng(2)
    saved = (rng.standard_normal((3, 3, 10)).astype(np.float32), rng.standard_normal((3, 2, 8, 8)).astype(np.float32))
    st.load(saved)
    c1, s1 = st.layer(1)
    assert c1.shape == (3, 10) and s1.shape == (2, 8, 8)
    np.testing.assert_array_equal(ops.to_numpy(c1), saved[0][1])
    np.testing.assert_array_equal(ops.to_numpy(s1), saved[1][1])
    st.clear()
    assert not any(a.any() for a in st.save())


def test_tree_node_buffers_parents_and_keep_node(ops):
    spec = RecurrentStateSpec(n_layers=2, conv_kernel=3, conv_channels=6, n_v_heads=2, head_dim=4)
    st = ops.recurrent_state(spec)
    conv, ssm, node_conv, node_ssm = st.tree_layer(1, 3)
    assert node_conv.shape == (3, 2, 6) and node_ssm.shape == (3, 2, 4, 4) and ssm.shape == (2, 4, 4)
    assert not ops.to_numpy(node_ssm).any()
    rng = np.random.default_rng(5)
    nodes = [(rng.standard_normal((3, 2, 6)).astype(np.float32), rng.standard_normal((3, 2, 4, 4)).astype(np.float32))
             for _ in range(2)]
    for j in range(2):                    # a 5-node tree regrows the buffers; layer j's views are its own rows
        _, _, nc, ns = st.tree_layer(j, 5)
        full_c, full_s = np.zeros((5, 2, 6), np.float32), np.zeros((5, 2, 4, 4), np.float32)
        full_c[:3], full_s[:3] = nodes[j]
        ops.dev.upload(full_c, out=nc)
        ops.dev.upload(full_s, out=ns)
    st.keep_node(2)
    conv, ssm = st.save()
    for j in range(2):
        np.testing.assert_array_equal(conv[j], nodes[j][0][2])
        np.testing.assert_array_equal(ssm[j], nodes[j][1][2])
    parents = np.array([-1, 0, 0, 1, 3], np.int32)
    dev_parents = st.node_parents(parents)
    assert dev_parents is st.node_parents(parents)            # one upload per tree
    np.testing.assert_array_equal(ops.to_numpy(dev_parents), parents)
    with pytest.raises(ValueError):
        st.keep_node(5)


SPEC = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=2, n_kv_heads=1, head_dim=64, rope_dim=16,
                     ffn=128, vocab_size=300, weight_type="F32", ssm_state=16, ssm_k_heads=2, ssm_v_heads=4,
                     ssm_conv_kernel=4)


def test_a_gated_delta_net_layer_matches_the_reference_prefill_then_decode(ops, tmp_path):
    path = write_synthetic_model(tmp_path / "q35.gguf", SPEC)
    ref_lm, lm = load_model(path, REF.load_weight), load_model(path, ops.load_weight)
    cfg, lin = lm.config, lm.config.linear
    ops.reserve_scratch(4 * cfg.ffn * cfg.hidden)
    spec = RecurrentStateSpec(len(lin.linear_layers), lin.conv_kernel, lin.conv_channels, lin.n_v_heads,
                              lin.head_dim)
    ref_state, state = REF.recurrent_state(spec), ops.recurrent_state(spec)
    rng = np.random.default_rng(3)
    for n in (12, 1, 1, 3):                       # a chunk on the GEMM path, then GEMV rows
        x = rng.standard_normal((n, cfg.hidden)).astype(np.float32)
        batch = Batch(ids=np.zeros(n, np.int32), positions=np.zeros(n, np.int32), n_past=np.zeros(1, np.int32))
        ops.begin_forward()
        want = gated_delta_net(REF, cfg, REF.rmsnorm(x, ref_lm.weights.layers[0].attn_norm, cfg.rms_eps),
                               ref_lm.weights.layers[0], ref_state.layer(0), batch)
        got = gated_delta_net(ops, cfg, ops.rmsnorm(ops.dev.upload(x), lm.weights.layers[0].attn_norm, cfg.rms_eps),
                              lm.weights.layers[0], state.layer(0), batch)
        # the GEMM path rounds weights to float16 (the reference does not), and the state carries that on
        tol = 3e-3
        np.testing.assert_allclose(ops.to_numpy(got), want, rtol=tol, atol=tol * float(np.abs(want).max()))
        for a, b in zip(state.save(), ref_state.save()):
            np.testing.assert_allclose(a[0], b[0], rtol=tol, atol=tol * float(np.abs(b[0]).max()))
