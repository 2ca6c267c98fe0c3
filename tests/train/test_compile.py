"""torch.compile of one layer (train/target.py compile_layer; Trainer(compile=True), `--compile`) computes the eager
layer's function: the target's forward (features, logits), the drafter's blocks and the gradients of a loss w.r.t.
its parameters, and two training steps (float32 on the CPU, the tiny synthetic target of test_training.py).

Tolerances: inductor fuses the elementwise work into loops of its own (a norm's sum in another order, products
contracted to fused multiply-adds, RoPE's halves in one kernel), so float32 results move by a few ulps per op and
that compounds over layers and through the backward: 1e-5 relative / absolute on activations, logits and losses
(values O(1..10)); gradients and the parameters after two AdamW steps within 1e-5 of the tensor's largest
magnitude (an element-wise relative bound fails on elements that are sums cancelling to near zero, where the
absolute error is still that of the large terms; observed ~1e-6 of the largest). The same ops in the same order
would be bitwise; these are not.

Compilation on a small CPU takes tens of seconds, so the tests are few and share one target and one drafter
config: sizes are symbolic, so another N or T reuses a compiled layer (checked), while the grad mode, an input
that requires grad or not and N = 1 each make a variant of their own. They are marked `compile` (deselect:
-m 'not compile') and skip when inductor cannot compile here (e.g. no C++ compiler).
"""
from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from flashd.train.drafter import TorchDrafter, drafter_layer         # noqa: E402
from flashd.train.loop import Trainer                                # noqa: E402
from flashd.train.recipe import TrainConfig, drafter_config          # noqa: E402
from flashd.train.target import TorchTarget, compile_layer, target_layer   # noqa: E402

from tests.train.test_training import TARGET, TC, samples            # noqa: E402

pytestmark = pytest.mark.compile
ACT = dict(rtol=1e-5, atol=1e-5)          # activations, logits, losses
GRAD = 1e-5                               # gradients, parameters after steps: of the tensor's largest magnitude


def assert_close_to_largest(got, want, name):
    err, scale = float((got - want).abs().max()), float(want.abs().max())
    assert err <= GRAD * scale + 1e-12, f"{name}: max error {err:.3g}, largest magnitude {scale:.3g}"


def variants(fn) -> int | None:
    """How many compiled variants dynamo holds for fn's code (grad mode, N = 1, ... each one); None where this
    torch lacks the (private) helper."""
    entries = getattr(torch._dynamo.eval_frame, "_debug_get_cache_entry_list", None)
    return None if entries is None else len(entries(fn.__code__))


@pytest.fixture(scope="module", autouse=True)
def inductor():
    """Skip the module when torch.compile's default backend cannot build a kernel on this machine."""
    try:
        torch.compile(lambda x: torch.sin(x) * 2 + 1, dynamic=True)(torch.ones(5))
    except Exception as exc:                   # inductor's errors vary: no compiler, missing headers, Python.h
        pytest.skip(f"torch.compile (inductor) cannot compile here: {type(exc).__name__}: {str(exc)[:200]}")


@pytest.fixture(scope="module")
def target(synthetic_model):
    return TorchTarget(synthetic_model(**TARGET))


def test_compiled_target_forward_equals_eager(target):
    """Features and logits at two batch shapes; the second (another N and T) reuses the first's compiled layer."""
    rng = np.random.default_rng(0)
    for n, t in ((3, 29), (2, 64)):
        ids = torch.from_numpy(rng.integers(0, TARGET["vocab_size"], (n, t)))
        try:
            target.compile_layers(False)
            want_feats, want_logits = target.forward(ids, capture=(0, 2), logits=True)
            target.compile_layers(True)
            assert target._layer_fn is compile_layer(target_layer)
            feats, logits = target.forward(ids, capture=(0, 2), logits=True)
        finally:
            target.compile_layers(False)
        torch.testing.assert_close(logits, want_logits, **ACT)
        for f, w in zip(feats, want_feats):
            torch.testing.assert_close(f, w, **ACT)
        if n == 3:
            held = variants(target_layer)
    assert variants(target_layer) == held               # sizes are symbolic: no recompile for a new N or T


def test_compiled_drafter_blocks_and_gradients_equal_eager(target):
    """The training shape of blocks (context from feats through fc, several anchors, a dropped block): the hidden
    states, and the gradients of a weighted sum of the block logits w.r.t. every drafter parameter; at two batch
    shapes, the second without a recompile."""
    tc = TrainConfig(**TC)
    cfg = drafter_config(target.cfg, tc, TARGET["vocab_size"] - 1)
    rng = np.random.default_rng(1)
    for n, t, a in ((2, 40, 4), (3, 52, 5)):
        ids = torch.from_numpy(rng.integers(0, 300, (n, t)))
        feats = torch.cat(target.forward(ids, capture=cfg.target_layer_ids)[0], dim=-1)
        anchors = torch.from_numpy(np.stack([rng.choice(np.arange(8, t - 1), a, replace=False) for _ in range(n)]))
        keep = torch.ones(n, a, dtype=torch.bool)
        keep[1, 1] = False                                # a dropped block
        block = torch.full((n, a, tc.block_size), cfg.mask_token_id)
        block[:, :, 0] = ids.gather(1, anchors)
        weight = torch.randn(n, a, tc.block_size - 1, TARGET["vocab_size"],
                             generator=torch.Generator().manual_seed(2))
        results = []
        for compiled in (False, True):
            d = TorchDrafter(cfg, max_pos=tc.max_seq + tc.block_size, seed=4)
            d.compile_layers(compiled)
            assert (d._layer_fn is drafter_layer) != compiled
            h = d.blocks(d.context(feats), target.embed[block], anchors, keep)
            (d.logits(h[:, :, 1:], target.lm_head) * weight).sum().backward()
            results.append((h.detach(), {k: p.grad for k, p in d.named_parameters()}))
        (h0, g0), (h1, g1) = results
        torch.testing.assert_close(h1, h0, **ACT)
        for name, g in g0.items():
            assert_close_to_largest(g1[name], g, name)
        if n == 2:
            held = variants(drafter_layer)
    assert variants(drafter_layer) == held


def test_compiled_trainer_steps_like_eager(target):
    """Two train_steps with compile=True: finite losses close to eager's, parameters close after them; the
    runtime's draft step (TorchDrafter.draft, one block) agrees too."""
    runs = []
    for compiled in (False, True):
        tc = TrainConfig(**TC)
        tr = Trainer(target, drafter_config(target.cfg, tc, TARGET["vocab_size"] - 1), tc, samples(),
                     log=lambda m: None, compile=compiled)
        assert tr.compiled == compiled and (target._layer_fn is target_layer) != compiled
        losses = [tr.train_step(tr.next_batch())["loss"] for _ in range(2)]
        seq = torch.from_numpy(tr.train_set[0][0].astype(np.int64))[None]
        with torch.no_grad():
            feats = torch.cat(target.forward(seq, capture=tr.cfg.target_layer_ids)[0], dim=-1)
            draft = tr.drafter.draft(feats[:, :20], target.embed, target.lm_head, int(seq[0, 20]))
        runs.append((losses, dict(tr.drafter.named_parameters()), draft))
    target.compile_layers(False)
    (l0, p0, d0), (l1, p1, d1) = runs
    assert all(np.isfinite(l1)) and l1 == pytest.approx(l0, rel=ACT["rtol"])
    for name, p in p0.items():
        assert_close_to_largest(p1[name].detach(), p.detach(), name)
    torch.testing.assert_close(d1, d0, **ACT)


def test_command_compile_flag_trains_and_resumes(tmp_path, synthetic_model):
    """`flashd train-drafter --compile` end to end (generate, compiled training, evaluation, the walk, export), and
    a resume without it accepts the checkpoint: compile is not part of the recipe."""
    from click.testing import CliRunner

    from flashd.train.command import train_command
    out = tmp_path / "drafter.gguf"
    args = [str(synthetic_model(**TARGET)), "--out", str(out), "--minutes", "5", "--gen-minutes", "5",
            "--train-minutes", "0.05", "--max-tokens", "200", "--max-new", "24", "--max-prompt", "400",
            "--gen-batch", "8", "--layers", "1", "--features", "2", "--block-size", "4", "--batch-seqs", "2",
            "--anchors", "4", "--device", "cpu"]
    r = CliRunner().invoke(train_command, args + ["--compile"], catch_exceptions=False)
    assert r.exit_code == 0 and "layers compiled" in r.output, r.output
    r = CliRunner().invoke(train_command, args + ["--resume", "--no-compile"], catch_exceptions=False)
    assert r.exit_code == 0 and "resumed at step" in r.output and "layers compiled" not in r.output, r.output
    assert out.exists()
