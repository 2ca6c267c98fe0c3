"""linear_cross_entropy (train/linear_ce.py) against torch's F.linear + F.cross_entropy in float64 (CPU).

Tolerances: float64 inputs give the oracle's loss and input gradient to summation order (1e-12 relative). With a
bfloat16 weight (the GPU's dtype) the probabilities are rounded to bfloat16 before the second product, as the
whole-block path's backward rounds its gradient: the input gradient within 2^-7 of the largest entry's size.
"""
from __future__ import annotations

import pytest

torch = pytest.importorskip("torch")
F = torch.nn.functional

from flashd.train.linear_ce import linear_cross_entropy           # noqa: E402


def problem(rows=37, dim=24, vocab=301, seed=0, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(rows, dim, generator=g, dtype=torch.float64)
    weight = torch.randn(vocab, dim, generator=g, dtype=torch.float64) * 0.7
    labels = torch.randint(0, vocab, (rows,), generator=g)
    labels[:5] = (x[:5] @ weight.t()).argmax(-1)                 # some rows right (hit True, p near 1)
    w = torch.rand(rows, generator=g, dtype=torch.float64)
    w[3] = 0.0                                                    # a row that is not in the loss
    return x.to(dtype), weight.to(dtype), labels, w


def oracle(x, weight, labels, w):
    x = x.double().detach().requires_grad_(True)
    logits = F.linear(x, weight.double())
    loss = (F.cross_entropy(logits, labels, reduction="none") * w.double()).sum()
    loss.backward()
    return float(loss.detach()), x.grad, logits.argmax(-1) == labels


@pytest.mark.parametrize("chunk", [1, 5, 37, 1000])
def test_float64_is_the_oracle(chunk):
    """Any chunking (1 row, a chunk not dividing the rows, exactly the rows, more than the rows)."""
    x, weight, labels, w = problem()
    ref_loss, ref_grad, ref_hit = oracle(x, weight, labels, w)
    xg = x.clone().requires_grad_(True)
    loss, hit = linear_cross_entropy(xg, weight, labels, w, chunk=chunk)
    (2.5 * loss).backward()                                       # backward scales by the incoming gradient
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=1e-12)
    assert torch.equal(hit, ref_hit) and hit.sum() >= 5
    torch.testing.assert_close(xg.grad, 2.5 * ref_grad, rtol=1e-10, atol=1e-12)
    assert torch.all(xg.grad[3] == 0)                             # a zero-weight row gets no gradient


def test_bfloat16_weight_within_rounding():
    x, weight, labels, w = problem(rows=64, dim=32, vocab=517, seed=1)
    ref_loss, ref_grad, _ = oracle(x.bfloat16(), weight.bfloat16(), labels, w)
    xg = x.bfloat16().requires_grad_(True)
    loss, _ = linear_cross_entropy(xg, weight.bfloat16(), labels, w.float(), chunk=24)
    loss.backward()
    assert xg.grad.dtype == torch.bfloat16
    assert float(loss.detach()) == pytest.approx(ref_loss, rel=2e-2)
    err = float((xg.grad.double() - ref_grad).abs().max())
    assert err <= 2 ** -7 * float(ref_grad.abs().max())


def test_without_a_gradient_only_the_loss():
    """The evaluation path (no_grad): the same loss and hits, no input gradient formed."""
    x, weight, labels, w = problem()
    ref_loss, _, ref_hit = oracle(x, weight, labels, w)
    with torch.no_grad():
        loss, hit = linear_cross_entropy(x, weight, labels, w, chunk=8)
    assert float(loss) == pytest.approx(ref_loss, rel=1e-12) and torch.equal(hit, ref_hit)


def test_bad_arguments():
    x, weight, labels, w = problem()
    with pytest.raises(ValueError, match="chunk"):
        linear_cross_entropy(x, weight, labels, w, chunk=0)
    with pytest.raises(ValueError, match=r"\(R, D\)"):
        linear_cross_entropy(x, weight[:, :5], labels, w)
    with pytest.raises(ValueError, match="labels and w"):
        linear_cross_entropy(x, weight, labels[:-1], w)
    with pytest.raises(ValueError, match="frozen"):
        linear_cross_entropy(x, weight.clone().requires_grad_(True), labels, w)


def soft_problem(rows=37, vocab=301, seed=3, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    return torch.softmax(torch.randn(rows, vocab, generator=g, dtype=torch.float64) * 2, -1).to(dtype)


@pytest.mark.parametrize("alpha", [0.3, 1.0])
@pytest.mark.parametrize("chunk", [1, 10, 1000])
def test_soft_targets_float64_are_the_oracle(alpha, chunk):
    """Distillation: CE against (1 - alpha) onehot(label) + alpha s, s from soft(i0, i1) a chunk at a time."""
    x, weight, labels, w = problem()
    s = soft_problem()
    asked = []

    def soft(i0, i1):
        asked.append((i0, i1))
        return s[i0:i1]
    xr = x.double().detach().requires_grad_(True)
    logp = torch.log_softmax(F.linear(xr, weight.double()), -1)
    target = alpha * s + (1 - alpha) * F.one_hot(labels, weight.shape[0]).double()
    ref = (-(target * logp).sum(-1) * w).sum()
    ref.backward()
    xg = x.clone().requires_grad_(True)
    loss, hit = linear_cross_entropy(xg, weight, labels, w, chunk=chunk, soft=soft, alpha=alpha)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=1e-12)
    torch.testing.assert_close(xg.grad, xr.grad, rtol=1e-10, atol=1e-12)
    assert torch.equal(hit, logp.argmax(-1) == labels)
    assert sorted(asked) == [(i, min(i + chunk, 37)) for i in range(0, 37, chunk)]


@pytest.mark.parametrize("chunk", [1, 10, 1000])
def test_sparse_soft_targets_are_the_dense_ones_they_stand_for(chunk):
    """soft(i0, i1) -> (ids (r, k), probabilities (r, k)): the same loss and input gradient as the dense targets with
    those probabilities at those ids and zeros elsewhere (float64, to rounding)."""
    x, weight, labels, w = problem()
    g = torch.Generator().manual_seed(9)
    k = 6
    ids = torch.stack([torch.randperm(weight.shape[0], generator=g)[:k] for _ in range(x.shape[0])])
    prob = torch.softmax(torch.randn(x.shape[0], k, generator=g, dtype=torch.float64), -1)
    dense = torch.zeros(x.shape[0], weight.shape[0], dtype=torch.float64).scatter_(1, ids, prob)
    out = []
    for soft in (lambda i0, i1: dense[i0:i1], lambda i0, i1: (ids[i0:i1], prob[i0:i1])):
        xg = x.clone().requires_grad_(True)
        loss, hit = linear_cross_entropy(xg, weight, labels, w, chunk=chunk, soft=soft, alpha=0.6)
        loss.backward()
        out.append((float(loss.detach()), xg.grad, hit))
    assert out[1][0] == pytest.approx(out[0][0], rel=1e-12)
    torch.testing.assert_close(out[1][1], out[0][1], rtol=1e-10, atol=1e-12)
    assert torch.equal(out[1][2], out[0][2])


def test_soft_targets_bfloat16_within_rounding():
    x, weight, labels, w = problem(rows=64, dim=32, vocab=517, seed=1)
    s = soft_problem(rows=64, vocab=517)
    xr = x.bfloat16().double().detach().requires_grad_(True)
    logp = torch.log_softmax(F.linear(xr, weight.bfloat16().double()), -1)
    target = 0.5 * s + 0.5 * F.one_hot(labels, 517).double()
    ref = (-(target * logp).sum(-1) * w).sum()
    ref.backward()
    xg = x.bfloat16().requires_grad_(True)
    loss, _ = linear_cross_entropy(xg, weight.bfloat16(), labels, w.float(), chunk=24,
                                   soft=lambda i0, i1: s[i0:i1].float(), alpha=0.5)
    loss.backward()
    assert float(loss.detach()) == pytest.approx(float(ref.detach()), rel=2e-2)
    assert float((xg.grad.double() - xr.grad).abs().max()) <= 2 ** -7 * float(xr.grad.abs().max())


def test_soft_arguments():
    x, weight, labels, w = problem()
    with pytest.raises(ValueError, match="alpha"):
        linear_cross_entropy(x, weight, labels, w, alpha=0.5)                  # no soft targets
    with pytest.raises(ValueError, match="alpha"):
        linear_cross_entropy(x, weight, labels, w, soft=lambda a, b: None, alpha=1.5)
