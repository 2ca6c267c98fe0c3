"""Training on a tiny synthetic target (CPU, float32): steps lower the loss, a checkpoint resumes the same run,
the command runs end to end (generate, train, export, resume) and its file loads as a `--draft` drafter.
No assertion depends on wall-clock time: budgets are set so the step count, not the clock, ends training."""
from __future__ import annotations

import json

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from click.testing import CliRunner                                  # noqa: E402

from flashd.daemon.backends.reference import ReferenceOps            # noqa: E402
from flashd.daemon.models import load_model                          # noqa: E402
from flashd.daemon.speculative.dflash_drafter import load_dflash_drafter   # noqa: E402
from flashd.train.command import pick_mask_token, train_command      # noqa: E402
from flashd.train.loop import Trainer                                # noqa: E402
from flashd.train.recipe import TrainConfig, drafter_config, loss_gamma, position_weights   # noqa: E402
from flashd.train.target import TorchTarget                          # noqa: E402

TARGET = dict(arch="qwen2", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, ffn=128, vocab_size=320, seed=3)
TC = dict(block_size=6, n_layers=2, n_features=2, anchors=8, batch_seqs=4, max_prompt=16, max_new=48, max_seq=64,
          lr=3e-3, train_minutes=1e6, epochs=100.0)


def samples(n=24, seed=0):
    """Learnable sequences: a prompt, then a periodic answer (what a target's greedy output often is)."""
    rng = np.random.default_rng(seed)
    out = []
    for _ in range(n):
        prompt = rng.integers(0, 300, 8)
        period = rng.integers(0, 300, int(rng.integers(2, 5)))
        out.append((np.concatenate([prompt, np.tile(period, 12)[:40]]).astype(np.int32), 8))
    return out


@pytest.fixture(scope="module")
def target(synthetic_model):
    return TorchTarget(synthetic_model(**TARGET))


def make_trainer(target, loss_rows=0, autocast=None, ce_float32=True, **fields):
    tc = TrainConfig(**{**TC, **fields})
    return Trainer(target, drafter_config(target.cfg, tc, TARGET["vocab_size"] - 1), tc, samples(), log=lambda m: None,
                   loss_rows=loss_rows, autocast=autocast, ce_float32=ce_float32)


def fixed_loss(trainer) -> float:
    ids, lens, plen = trainer._tensors(trainer.train_set[:8])
    with torch.no_grad():
        return float(trainer._forward(ids, lens, plen, torch.Generator().manual_seed(7))[0])


def test_recipe_position_weights():
    assert loss_gamma(16) == 7.0 and loss_gamma(10) == 5.0 and loss_gamma(8) == 4.0
    w = position_weights(16)
    assert len(w) == 15 and w[0] == 1.0 and all(a > b for a, b in zip(w, w[1:]))


def test_training_steps_lower_the_loss(target):
    trainer = make_trainer(target)
    before = fixed_loss(trainer)
    for _ in range(40):
        trainer.train_step(trainer.next_batch())
    after = fixed_loss(trainer)
    assert after < 0.8 * before, (before, after)
    ev = trainer.evaluate()
    assert len(ev["acc"]) == TC["block_size"] - 1 and 0 <= ev["accept_len"] <= TC["block_size"] - 1


@pytest.mark.parametrize("rows", [1, 7, 10_000])
def test_chunked_loss_matches_the_whole_block(target, rows):
    """loss_rows > 0 (labelled rows in chunks through linear_cross_entropy, the gradient formed in forward) is the
    same loss, the same gradient
    and the same hit counts as the whole block's logits at once (float32 on the CPU: 1e-5 relative, summation
    order only). 7 does not divide the labelled row count, 10,000 exceeds it (one chunk)."""
    results = []
    for loss_rows in (0, rows):
        trainer = make_trainer(target, loss_rows=loss_rows)
        ids, lens, plen = trainer._tensors(trainer.train_set[:4])
        loss, hit, cnt, lead = trainer._forward(ids, lens, plen, torch.Generator().manual_seed(5))
        loss.backward()
        grads = [p.grad.clone() for p in trainer.drafter.parameters()]
        results.append((float(loss.detach()), hit, cnt, lead, grads))
    (l0, h0, c0, d0, g0), (l1, h1, c1, d1, g1) = results
    assert l1 == pytest.approx(l0, rel=1e-5)
    assert torch.equal(h0, h1) and torch.equal(c0, c1) and torch.equal(d0, d1)
    for a, b in zip(g0, g1):
        torch.testing.assert_close(b, a, rtol=1e-4, atol=1e-7)
    with pytest.raises(ValueError, match="loss_rows"):
        make_trainer(target, loss_rows=-1)


@pytest.mark.parametrize("ce32, loss_rows", [(False, 0), (True, 13)])
def test_bf16_losses_are_the_float32_loss_within_bf16_rounding(target, ce32, loss_rows):
    """Under bf16 autocast, ce_float32=False (the log-softmax on the bf16 logits) and loss_rows > 0
    (linear_cross_entropy: bf16 probabilities into the second product) against the whole block's float32 copy:
    the same loss to bf16 rounding (2^-8 relative; 1e-2 here), gradients within 5e-2 of the largest."""
    results = []
    for ce32, loss_rows in ((True, 0), (ce32, loss_rows)):
        trainer = make_trainer(target, autocast=True, ce_float32=ce32, loss_rows=loss_rows)
        ids, lens, plen = trainer._tensors(trainer.train_set[:4])
        loss = trainer._forward(ids, lens, plen, torch.Generator().manual_seed(5))[0]
        loss.backward()
        results.append((float(loss.detach()), [p.grad.clone() for p in trainer.drafter.parameters()]))
    (l0, g0), (l1, g1) = results
    assert l1 == pytest.approx(l0, rel=1e-2)
    for a, b in zip(g0, g1):
        assert float((a - b).abs().max()) <= 5e-2 * float(a.abs().max()) + 1e-8


def test_checkpoint_resume_continues_the_same_run(target, tmp_path):
    a = make_trainer(target)
    for _ in range(3):
        a.train_step(a.next_batch())
    a.save(tmp_path / "ckpt.pt")
    for _ in range(3):
        a.train_step(a.next_batch())
    b = make_trainer(target)
    b.load(tmp_path / "ckpt.pt")
    assert b.step == 3
    for _ in range(3):
        b.train_step(b.next_batch())
    for (name, pa), pb in zip(a.drafter.state_dict().items(), b.drafter.state_dict().values()):
        assert torch.equal(pa, pb), name
    with pytest.raises(ValueError, match="another recipe"):
        make_trainer(target, block_size=5).load(tmp_path / "ckpt.pt")
    # a checkpoint from before a recipe field existed (here wide_fraction, whose default is no longer what such runs
    # did) resumes as those runs had it (TrainConfig.ABSENT: 0)
    state = torch.load(tmp_path / "ckpt.pt", weights_only=False)
    assert state["recipe"]["wide_fraction"] == TrainConfig().wide_fraction != TrainConfig.ABSENT["wide_fraction"]
    del state["recipe"]["wide_fraction"]
    torch.save(state, tmp_path / "old.pt")
    make_trainer(target, wide_fraction=0.0).load(tmp_path / "old.pt")
    with pytest.raises(ValueError, match="wide_fraction"):
        make_trainer(target).load(tmp_path / "old.pt")


def test_mask_token_skips_used_and_degenerate_rows():
    embed = torch.randn(10, 8)
    embed[9] = 0                                     # a padded row: degenerate
    assert pick_mask_token(embed, used={8}, stop_ids={7}) == 6


def test_command_end_to_end_and_resume(tmp_path, synthetic_model):
    path = synthetic_model(**TARGET)
    out = tmp_path / "drafter.gguf"
    args = [str(path), "--out", str(out), "--minutes", "5", "--gen-minutes", "5", "--train-minutes", "0.05",
            "--max-tokens", "400", "--max-new", "24", "--max-prompt", "400", "--gen-batch", "8", "--layers", "1",
            "--features", "2", "--block-size", "4", "--batch-seqs", "2", "--anchors", "4", "--device", "cpu"]
    r = CliRunner().invoke(train_command, args, catch_exceptions=False)
    assert r.exit_code == 0, r.output
    report = json.loads((tmp_path / "drafter.gguf.work" / "report.json").read_text())
    assert report["bytes"] == out.stat().st_size and report["gen"]["done"]
    r = CliRunner().invoke(train_command, args, catch_exceptions=False)
    assert r.exit_code != 0 and "--resume" in r.output            # an earlier run is never overwritten silently
    # the chunked loss is not part of the recipe: a resume may switch it (a smaller card)
    r = CliRunner().invoke(train_command, args + ["--resume", "--loss-rows", "5"], catch_exceptions=False)
    assert r.exit_code == 0, r.output
    r = CliRunner().invoke(train_command, args + ["--resume", "--ce", "bfloat16"], catch_exceptions=False)
    assert r.exit_code != 0 and "--loss-rows 0" in r.output      # bf16 CE is the whole block's option only
    r = CliRunner().invoke(train_command, args + ["--resume", "--distill", "0.5", "--loss-rows", "0"],
                           catch_exceptions=False)
    assert r.exit_code != 0 and "--loss-rows must be > 0" in r.output
    r = CliRunner().invoke(train_command, args + ["--resume", "--distill", "0.5"], catch_exceptions=False)
    assert r.exit_code != 0 and "another recipe" in r.output      # distill defines the run: not a resume's choice
    ops = ReferenceOps()
    m = load_model(path, ops.load_weight)
    d = load_dflash_drafter(out, ops, m.config, m.weights, 64)
    assert d.cfg.block_size == 4 and d.cfg.model.n_layers == 1


def test_command_wide_mix_takes_no_wide_share(tmp_path, synthetic_model, monkeypatch):
    """--data-mix wide is the whole wide mix: the default --wide-fraction (a share of it blended into "code") is
    dropped, an explicit one is an error."""
    import flashd.train.target as target_mod

    class Stop(Exception):
        pass

    def stop(*a, **k):
        raise Stop
    monkeypatch.setattr(target_mod, "TorchTarget", stop)     # the recipe was accepted: stop before the target
    path = synthetic_model(**TARGET)
    args = [str(path), "--out", str(tmp_path / "d.gguf"), "--device", "cpu", "--data-mix", "wide"]
    r = CliRunner().invoke(train_command, args)
    assert isinstance(r.exception, Stop), r.output
    r = CliRunner().invoke(train_command, args + ["--wide-fraction", "0.2"])
    assert r.exit_code != 0 and "wide_fraction" in r.output


def test_load_drafter_reads_back_what_export_wrote(target, tmp_path):
    """export -> load_drafter: f32 files give the parameters back bit for bit; Q8_0 files within one Q8_0 step
    (absmax / 127 of each 32-value block; bounded here by the tensor's absmax / 127)."""
    from flashd.train.export import export, load_drafter
    trainer = make_trainer(target)
    params = {k: v.detach().clone() for k, v in trainer.drafter.gguf_tensors().items()}
    export(trainer.drafter, tmp_path / "f32.gguf", "f32")
    back, cfg = load_drafter(tmp_path / "f32.gguf")
    assert cfg == trainer.cfg
    for name, p in back.gguf_tensors().items():
        assert torch.equal(p.detach(), params[name]), name
    export(trainer.drafter, tmp_path / "q8.gguf", "q8_0")
    back, _ = load_drafter(tmp_path / "q8.gguf")
    for name, p in back.gguf_tensors().items():
        step = params[name].abs().max() / 127
        assert (p.detach() - params[name]).abs().max() <= step + 1e-6, name


def test_walk_eval_is_the_runtime_drafts_walked(target):
    """Trainer.walk_eval (every answer position drafted in one batched forward, then the walk) against the
    runtime's draft step (TorchDrafter.draft: one block after the context of positions < a) at every position,
    walked by train/walk.py: the same leading agreements, so the same figures (float32 on the CPU)."""
    from flashd.train.walk import walk
    trainer = make_trainer(target)
    for _ in range(200):                                       # a drafter that accepts something
        trainer.train_step(trainer.next_batch())
    samples = [(s[:trainer.tc.max_seq], p) for s, p in trainer.train_set[:3]]   # seen in training: some accepted
    trainer.eval_set = samples
    got = trainer.walk_eval(max_samples=3, batch_seqs=2)
    where, leads = [], []
    with torch.no_grad():
        for si, (seq, p) in enumerate(samples):
            ids = torch.from_numpy(seq.astype(np.int64))[None]
            feats = torch.cat(target.forward(ids, capture=trainer.cfg.target_layer_ids)[0], dim=-1)
            for a in range(p, len(seq) - 1):
                logits = trainer.drafter.draft(feats[:, :a], target.embed, target.lm_head, int(seq[a]))
                chain, cont = logits.argmax(-1).numpy(), seq[a + 1:]
                n = 0
                while n < min(len(chain), len(cont)) and chain[n] == cont[n]:
                    n += 1
                where.append((si, a, p, len(seq)))
                leads.append(n)
    assert got["drafts"] == len(leads) and sum(leads) > 0
    assert got["anywhere"] == pytest.approx(1 + np.mean(leads))
    assert got["walk"] == pytest.approx(walk(where, leads)) and got["walk"] >= 1


@pytest.mark.parametrize("alpha, top", [(0.4, 0), (1.0, 0), (0.4, 5)])
def test_distill_learns_the_targets_distribution_at_each_label(target, alpha, top):
    """distill = alpha: block row (n, j, k)'s target is (1 - alpha) onehot(token a_j + k) + alpha softmax(the target's
    logits at a_j + k - 1) -- with distill_top > 0 that softmax over the position's top tokens only. The loss against
    an independent computation with explicit loops over the rows (float32, CPU), and a step runs; evaluations skip
    the target's logits (their agreements are the same either way)."""
    tr = make_trainer(target, loss_rows=7, distill=alpha, distill_top=top)
    ids, lens, plen = tr._tensors(tr.train_set[:4])
    anchors, keep = tr._anchors(lens, plen, ids.shape[1], torch.Generator().manual_seed(5))
    with torch.no_grad():
        loss = float(tr._forward(ids, lens, plen, None, anchored=(anchors, keep))[0])
        feats, tl = target.forward(ids, capture=tr.cfg.target_layer_ids, logits=True)
        B = tr.tc.block_size
        block = torch.full((*anchors.shape, B), tr.cfg.mask_token_id, dtype=torch.long)
        block[:, :, 0] = ids.gather(1, anchors)
        h = tr.drafter.blocks(tr.drafter.context(torch.cat(feats, -1)), target.embed[block], anchors, keep)
        logp = torch.log_softmax(tr.drafter.logits(h[:, :, 1:], target.lm_head).double(), -1)
        num = den = 0.0
        for n in range(anchors.shape[0]):
            for j in range(anchors.shape[1]):
                for k in range(1, B):
                    a = int(anchors[n, j])
                    if not keep[n, j] or a + k >= int(lens[n]):
                        continue
                    wk = tr.weights[k - 1].item()
                    z = tl[n, a + k - 1].double()
                    if top:                       # the top tokens' distribution, zero elsewhere
                        val, idx = z.topk(top)
                        s = torch.zeros_like(z).scatter_(0, idx, torch.softmax(val, -1))
                    else:
                        s = torch.softmax(z, -1)
                    ce = -(1 - alpha) * logp[n, j, k - 1, ids[n, a + k]] - alpha * (s * logp[n, j, k - 1]).sum()
                    num, den = num + wk * float(ce), den + wk
    assert loss == pytest.approx(num / den, rel=1e-4)            # the trainer in float32, the loops in float64
    assert tr.evaluate() == make_trainer(target, loss_rows=7).evaluate()          # the same drafter: the same figures
    r = tr.train_step(tr.next_batch())
    assert np.isfinite(r["loss"])
    with pytest.raises(ValueError, match="loss_rows"):
        make_trainer(target, loss_rows=0, distill=alpha)
