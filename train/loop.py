"""Training: batches, anchors, the weighted block loss, the optimiser and schedule, evaluation, checkpoints.

One step (shapes: N sequences of up to T tokens, A anchors, B block size, V vocabulary):
    target features   frozen target forward over (N, T), the outputs of target_layer_ids, concatenated
    anchors           per sequence, A positions a drawn uniformly without replacement from the answer
                      (prompt_len <= a <= len - 2: the anchor is a token the target produced, as the runtime's
                      block root is; fewer when the answer is short, the rest masked out)
    blocks            [token a, MASK x (B-1)] at a .. a+B-1, labels tokens a+1 .. a+B-1 (past the end: no label)
    loss              sum_k w_k CE(logits_k, label_k) / sum_k w_k over labelled positions, w_k = exp(-(k-1)/gamma)
Progress (the learning-rate schedule's clock) is max(step / planned steps, training seconds / train budget), so
a run cut by its time budget still ends with the rate annealed. Evaluation (the acceptance proxy) on held-out
samples: top-1 agreement with the target's token per block position k, and the mean accepted prefix length
(leading agreements of a block, the chain acceptance without the bonus token).
"""
from __future__ import annotations

import json
import math
import os
import time
from pathlib import Path
from typing import Callable

import numpy as np

from . import require_torch
from .drafter import TorchDrafter
from .linear_ce import linear_cross_entropy
from .recipe import TrainConfig, position_weights
from .target import rmsnorm

torch = require_torch()
F = torch.nn.functional

__all__ = ["Trainer"]

PAD_T = 64      # sequence lengths of a step are padded to a multiple of this (see Trainer._tensors)


class Trainer:
    """The drafter being trained on `samples` ((ids int32, prompt_len) pairs) against a frozen TorchTarget."""

    def __init__(self, target, drafter_cfg, tc: TrainConfig, samples, log: Callable[[str], None] = print,
                 autocast: bool | None = None, loss_rows: int = 0, ce_float32: bool = True, compile: bool = False):
        self.target, self.cfg, self.tc, self.log = target, drafter_cfg, tc, log
        if not isinstance(loss_rows, int) or loss_rows < 0:
            raise ValueError(f"loss_rows must be an int >= 0, got {loss_rows!r}")
        self.loss_rows = loss_rows       # 0: the block's logits at once; else labelled rows in chunks (_chunked_ce)
        # the whole-block loss's log-softmax on a float32 copy of the logits (True), or on the autocast dtype's
        # logits as they are (False: no 4-byte copy of N*A*(B-1)*V values; the kernel still sums in float32)
        self.ce_float32 = bool(ce_float32)
        if tc.distill and not loss_rows:
            raise ValueError("distill (soft targets) runs in the chunked loss: loss_rows must be > 0")
        self.dev = target.device
        held = [i for i in range(len(samples)) if i % tc.eval_every == 0]
        self.eval_set = [samples[i] for i in held]
        self.train_set = [s for i, s in enumerate(samples) if i % tc.eval_every]
        self.train_set = [(ids[:tc.max_seq], p) for ids, p in self.train_set if min(len(ids), tc.max_seq) - p >= 2]
        if not self.train_set:
            raise ValueError("no training samples with an answer of >= 2 tokens")
        self.drafter = TorchDrafter(drafter_cfg, max_pos=tc.max_seq + tc.block_size, seed=tc.seed).to(self.dev)
        # compile: one layer's function of the target's forward and of the drafter's blocks through torch.compile
        # (target.compile_layer), reused by every layer. It sets the target's mode too: a shared target follows
        # the last Trainer made. Not part of the recipe: a checkpoint resumes either way.
        self.compiled = bool(compile)
        target.compile_layers(self.compiled)
        self.drafter.compile_layers(self.compiled)
        self.opt = torch.optim.AdamW(self.drafter.parameters(), lr=tc.lr, betas=(0.9, 0.95),
                                     weight_decay=tc.weight_decay)
        self.weights = torch.tensor(position_weights(tc.block_size), device=self.dev)
        self.gen = torch.Generator().manual_seed(tc.seed)         # anchors (CPU: the same on every device)
        self.step, self.train_seconds = 0, 0.0
        self.per_epoch = math.ceil(len(self.train_set) / tc.batch_seqs)
        self.planned = max(1, int(tc.epochs * self.per_epoch))
        # bf16 autocast on the GPU (float32 master weights); the CPU tests run float32 unless asked
        self.autocast = self.dev.type == "cuda" if autocast is None else autocast
        self._order: tuple[int, list] = (-1, [])

    # -- data ------------------------------------------------------------------------------------
    def _epoch_order(self, epoch: int) -> list[np.ndarray]:
        """The epoch's batches: shuffled, sorted by length within groups of 16 batches (less padding)."""
        if self._order[0] == epoch:
            return self._order[1]
        rng = np.random.default_rng([self.tc.seed, epoch])
        order = rng.permutation(len(self.train_set))
        n = self.tc.batch_seqs
        batches = []
        for g in range(0, len(order), 16 * n):
            group = sorted(order[g:g + 16 * n], key=lambda i: len(self.train_set[i][0]))
            batches.extend(np.array(group[j:j + n]) for j in range(0, len(group), n))
        rng.shuffle(batches)
        self._order = (epoch, batches)
        return batches

    def _tensors(self, samples):
        """ids int64 (N, T) right-padded with 0, lengths (N,), prompt lengths (N,) on the device. T is the longest
        sample rounded up to a multiple of PAD_T (not beyond max_seq): the attention kernels build a plan per shape
        (cuDNN: ~0.45 s for a new T on an H100, bench/bench_train_step.py), so few distinct T keep steps fast."""
        t = max(len(ids) for ids, _ in samples)
        t = max(t, min(-(-t // PAD_T) * PAD_T, self.tc.max_seq))
        ids = np.zeros((len(samples), t), np.int64)
        for i, (s, _) in enumerate(samples):
            ids[i, :len(s)] = s
        lens = torch.tensor([len(s) for s, _ in samples])
        plen = torch.tensor([p for _, p in samples])
        return torch.from_numpy(ids).to(self.dev), lens.to(self.dev), plen.to(self.dev)

    def _anchors(self, lens, plen, t: int, gen):
        """anchors int64 (N, A), keep bool (N, A): up to A answer positions per sequence, without replacement."""
        a = min(self.tc.anchors, t)
        pos = torch.arange(t)
        ok = (pos[None] >= plen.cpu()[:, None]) & (pos[None] <= lens.cpu()[:, None] - 2)
        score = torch.rand(len(lens), t, generator=gen).masked_fill(~ok, -1.0)
        top, idx = score.topk(a, dim=1)
        return idx.to(self.dev), (top >= 0).to(self.dev)

    # -- the loss --------------------------------------------------------------------------------
    def _all_anchors(self, lens, plen):
        """anchors int64 (N, A), keep bool (N, A): every answer position with a next token (prompt_len <= a <=
        len - 2), for the walk (walk_eval)."""
        a = int((lens - 1 - plen).clamp(min=0).max())
        offs = torch.arange(max(a, 1), device=self.dev)
        keep = offs[None] < (lens - 1 - plen)[:, None]
        return torch.where(keep, plen[:, None] + offs, plen[:, None]), keep

    def _forward(self, ids, lens, plen, gen, anchored=None, soft: bool = True):
        """(loss, correct (B-1,), counted (B-1,), per-block leading agreements of the kept blocks in (sequence,
        anchor) order) for one batch; anchored: (anchors, keep) instead of drawing them; soft False: no soft targets
        (the evaluations, which use the agreements only)."""
        B = self.tc.block_size
        soft = soft and self.tc.distill > 0
        # the target's logits (N, T, V), or its top distill_top tokens' distribution at each position
        feats, tsoft = self.target.forward(ids, capture=self.cfg.target_layer_ids, logits=soft,
                                           top=self.tc.distill_top)
        feats = torch.cat(feats, dim=-1)                                           # (N, T, n_features * D)
        anchors, keep = anchored if anchored is not None else self._anchors(lens, plen, ids.shape[1], gen)
        offs = torch.arange(B, device=self.dev)
        where = anchors[:, :, None] + offs                                         # (N, A, B)
        labelled = (where < lens[:, None, None]) & keep[:, :, None]
        tok = ids.gather(1, where.clamp(max=ids.shape[1] - 1).flatten(1)).view_as(where)
        block = torch.full_like(tok, self.cfg.mask_token_id)
        block[:, :, 0] = tok[:, :, 0]
        labels, mask = tok[:, :, 1:], labelled[:, :, 1:]
        w = self.weights * mask
        with torch.autocast(self.dev.type, dtype=torch.bfloat16, enabled=self.autocast):
            h = self.drafter.blocks(self.drafter.context(feats), self.target.embed[block], anchors, keep)
            if self.loss_rows:
                ce_sum, hit = self._chunked_ce(h[:, :, 1:], labels, mask, w, anchors, tsoft)
                loss = ce_sum / w.sum().clamp(min=1e-9)
            else:
                logits = self.drafter.logits(h[:, :, 1:], self.target.lm_head)   # (N, A, B-1, V)
        if not self.loss_rows:
            flat = (logits.float() if self.ce_float32 else logits).flatten(0, 2)
            ce = F.cross_entropy(flat, labels.flatten(), reduction="none").float().view_as(labels)
            loss = (ce * w).sum() / w.sum().clamp(min=1e-9)
            hit = (logits.argmax(-1) == labels) & mask
        lead = hit.int().cumprod(dim=-1).sum(-1)[keep]                             # leading agreements per block
        return loss, hit.sum((0, 1)), mask.sum((0, 1)), lead

    def _chunked_ce(self, h, labels, mask, w, anchors=None, tsoft=None):
        """The weighted CE sum and the hit mask (N, A, B-1) from the labelled rows only, through
        linear_cross_entropy: `loss_rows` rows' logits at a time, each chunk's input gradient formed in forward, so
        the block's logits (N * A * (B-1) * V: 2.3 G values for the 1.5B) are never alive at once. With the target's
        distributions tsoft (distill > 0): block row (n, j, k) (k = 1 .. B-1, labelled token a_j + k) also learns
        the target's distribution at a_j + k, the one its position a_j + k - 1 predicts: tsoft is the target's
        logits (N, T, V) (distill_top 0: the softmax of the row) or (ids, probabilities) (N, T, top) each (the
        renormalized top tokens, linear_ce's sparse targets)."""
        where = mask.flatten().nonzero().squeeze(1)                                  # labelled rows
        rows = rmsnorm(h.flatten(0, 2)[where], self.drafter.output_norm, self.cfg.model.rms_eps)
        soft = None
        if tsoft is not None:
            n_a, n_k = mask.shape[1], mask.shape[2]
            seq, blk, k0 = where // (n_a * n_k), (where // n_k) % n_a, where % n_k     # k0 = k - 1
            pos = anchors[seq, blk] + k0

            def sparse(i0, i1):
                return tsoft[0][seq[i0:i1], pos[i0:i1]], tsoft[1][seq[i0:i1], pos[i0:i1]]

            def dense(i0, i1):
                return torch.softmax(tsoft[seq[i0:i1], pos[i0:i1]], dim=-1)
            soft = sparse if isinstance(tsoft, tuple) else dense
        total, hit_rows = linear_cross_entropy(rows, self.target.lm_head, labels.flatten()[where],
                                               w.flatten()[where], chunk=self.loss_rows, soft=soft,
                                               alpha=self.tc.distill if soft is not None else 0.0)
        hit = torch.zeros(mask.numel(), dtype=torch.bool, device=mask.device)
        hit[where] = hit_rows
        return total, hit.view_as(mask)

    def lr_at(self, progress: float) -> float:
        w = self.tc.warmup
        if progress < w:
            return self.tc.lr * (progress / w)
        return self.tc.lr * 0.5 * (1 + math.cos(math.pi * min(1.0, (progress - w) / (1 - w))))

    def progress(self) -> float:
        return max(self.step / self.planned, self.train_seconds / (self.tc.train_minutes * 60))

    def next_batch(self) -> np.ndarray:
        """Indices into train_set of the step's sequences (a function of seed and step: resumable)."""
        epoch, i = divmod(self.step, self.per_epoch)
        return self._epoch_order(epoch)[i]

    def train_step(self, batch_idx) -> dict:
        ids, lens, plen = self._tensors([self.train_set[i] for i in batch_idx])
        for g in self.opt.param_groups:
            g["lr"] = self.lr_at(self.progress())
        loss, hit, cnt, lead = self._forward(ids, lens, plen, self.gen)
        self.opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(self.drafter.parameters(), self.tc.grad_clip)
        self.opt.step()
        self.step += 1
        return {"loss": float(loss.detach()), "hit": hit.cpu(), "cnt": cnt.cpu(), "lead": lead.float().mean().item(),
                "tokens": int(lens.sum())}

    @torch.no_grad()
    def evaluate(self, max_samples: int = 256) -> dict:
        """Held-out acceptance proxy: per-position top-1 agreement and the mean accepted prefix length."""
        gen = torch.Generator().manual_seed(1234)                # the same anchors at every evaluation
        samples = [(s[:self.tc.max_seq], p) for s, p in self.eval_set[:max_samples]
                   if min(len(s), self.tc.max_seq) - p >= 2]
        hit = cnt = 0
        leads = []
        for j in range(0, len(samples), self.tc.batch_seqs):
            ids, lens, plen = self._tensors(samples[j:j + self.tc.batch_seqs])
            _, h, c, lead = self._forward(ids, lens, plen, gen, soft=False)
            hit, cnt = hit + h.cpu(), cnt + c.cpu()
            leads.append(lead.float().cpu())
        if not leads:
            return {}
        acc = (hit / cnt.clamp(min=1)).tolist()
        return {"acc": acc, "accept_len": float(torch.cat(leads).mean()), "blocks": int(sum(len(x) for x in leads))}

    @torch.no_grad()
    def walk_eval(self, max_samples: int = 32, batch_seqs: int = 1) -> dict:
        """The held-out chain acceptance the way speculative decoding will see it: a draft rooted at every answer
        position, then each answer walked with the runtime's steps (train/walk.py). {"walk": chain tokens a step
        along the walk, "anywhere": 1 + the mean leading agreements over every position, "drafts": count}. One
        sequence a forward by default: every position is a block, so a 512-token answer is ~8 K block rows."""
        from .walk import walk
        samples = [(s[:self.tc.max_seq], p) for s, p in self.eval_set[:max_samples]
                   if min(len(s), self.tc.max_seq) - p >= 2]
        where, leads = [], []
        for j in range(0, len(samples), batch_seqs):
            part = samples[j:j + batch_seqs]
            ids, lens, plen = self._tensors(part)
            anchors, keep = self._all_anchors(lens, plen)
            lead = self._forward(ids, lens, plen, None, anchored=(anchors, keep), soft=False)[3].tolist()
            kept = keep.nonzero().tolist()                              # (sequence, anchor index), row-major
            for (i, k), n_acc in zip(kept, lead):
                s, p = part[i]
                where.append((j + i, p + k, p, min(len(s), self.tc.max_seq)))
                leads.append(int(n_acc))
        if not leads:
            return {}
        return {"walk": walk(where, leads), "anywhere": 1 + float(np.mean(leads)), "drafts": len(leads)}

    # -- the loop --------------------------------------------------------------------------------
    def run(self, deadline: float, ckpt: Path, save_every_s: float = 120.0, log_every_s: float = 20.0,
            eval_every_s: float = 180.0) -> dict:
        """Train until progress reaches 1 or time.monotonic() reaches `deadline`; checkpoint and evaluate as it
        goes; returns the final held-out evaluation."""
        last_log = last_save = last_eval = time.monotonic()
        agg = {"loss": 0.0, "n": 0, "tokens": 0, "hit": 0, "cnt": 0, "lead": 0.0, "t": 0.0}
        while self.progress() < 1.0 and time.monotonic() < deadline:
            t0 = time.monotonic()
            r = self.train_step(self.next_batch())
            if self.dev.type == "cuda":
                torch.cuda.synchronize()
            dt = time.monotonic() - t0
            self.train_seconds += dt
            for k in ("loss", "tokens", "hit", "cnt", "lead"):
                agg[k] = agg[k] + r[k]
            agg["n"] += 1
            agg["t"] += dt
            now = time.monotonic()
            if now - last_log >= log_every_s:
                self._log_progress(agg)
                agg = {k: 0 for k in agg}
                last_log = now
            if now - last_save >= save_every_s:
                self.save(ckpt)
                last_save = now
            if now - last_eval >= eval_every_s:
                self.log_eval(self.evaluate())
                last_eval = time.monotonic()
        self.save(ckpt)
        ev = self.evaluate()
        self.log_eval(ev)
        wk = self.walk_eval()
        if wk:
            ev["chain_walk"] = wk
            self.log(f"held-out chain, tokens a step: {wk['walk']:.3f} along the runtime's walk, "
                     f"{wk['anywhere']:.3f} per position ({wk['drafts']} drafts; train/walk.py)")
        return ev

    def log_eval(self, ev: dict) -> None:
        if ev:
            acc = " ".join(f"{a:.2f}" for a in ev["acc"])
            self.log(f"held-out at step {self.step}: accept_len {ev['accept_len']:.2f} over {ev['blocks']} blocks; "
                     f"top-1 agreement by block position: {acc}")

    def _log_progress(self, agg) -> None:
        acc = (agg["hit"] / np.maximum(agg["cnt"], 1)).tolist() if agg["n"] else []
        shown = " ".join(f"k{k + 1}={acc[k]:.2f}" for k in (0, 1, 3, 7, 14) if k < len(acc))
        self.log(f"step {self.step} ({self.progress():.0%}) loss {agg['loss'] / agg['n']:.3f} "
                 f"lr {self.opt.param_groups[0]['lr']:.2e} {agg['tokens'] / max(agg['t'], 1e-9):.0f} tok/s "
                 f"top1 {shown} accept_len {agg['lead'] / agg['n']:.2f}")

    # -- checkpoints -----------------------------------------------------------------------------
    def save(self, path: Path) -> None:
        state = {"drafter": self.drafter.state_dict(), "opt": self.opt.state_dict(), "step": self.step,
                 "train_seconds": self.train_seconds, "gen": self.gen.get_state(), "recipe": self.tc.to_dict(),
                 "mask_token_id": self.cfg.mask_token_id, "target_layer_ids": list(self.cfg.target_layer_ids),
                 "ffn": self.cfg.model.ffn}
        tmp = path.with_name(path.name + ".tmp")
        torch.save(state, tmp)
        os.replace(tmp, path)

    def load(self, path: Path) -> None:
        state = torch.load(path, map_location=self.dev, weights_only=False)
        # a checkpoint written before a recipe field existed: that field as such runs had it (TrainConfig.ABSENT)
        fixed = {k: v for k, v in {**TrainConfig().to_dict(), **TrainConfig.ABSENT, **state["recipe"]}.items()
                 if k not in TrainConfig.RESUMABLE}
        now = {k: v for k, v in self.tc.to_dict().items() if k not in TrainConfig.RESUMABLE}
        if fixed != now or state["mask_token_id"] != self.cfg.mask_token_id or state["ffn"] != self.cfg.model.ffn:
            diff = sorted(k for k in fixed if fixed[k] != now.get(k))
            raise ValueError(f"{path}: the checkpoint was trained with another recipe ({', '.join(diff) or 'mask/ffn'}"
                             f" differ): resume with the same flags or use a new --work folder")
        self.drafter.load_state_dict(state["drafter"])
        self.opt.load_state_dict(state["opt"])
        self.step, self.train_seconds = int(state["step"]), float(state["train_seconds"])
        self.gen.set_state(state["gen"].cpu())           # map_location moved it to the device; the generator is CPU

    def write_report(self, path: Path, ev: dict, extra: dict) -> None:
        path.write_text(json.dumps({"step": self.step, "train_seconds": round(self.train_seconds, 1),
                                    "eval": ev, **extra}, indent=1))
