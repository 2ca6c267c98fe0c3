"""Batched greedy decoding for the self-distillation data (generate.py): a prompt batch's prefill, then one token per
sequence per step with every shape fixed, so that on the GPU the step is a CUDA graph replayed once per token.

Why: the eager step launches ~45 small kernels per layer (~1,300 for the 1.5B target), each with PyTorch's host
overhead, so at 256 sequences the GPU waited on the host most of the time (sessions 11-12: 4-6 K answer tokens/s on
an H100, 8 of the 20 training minutes spent generating 2.5 M tokens). A replayed graph issues them without the host.

    prefill   TorchTarget.step over the left-padded prompts (one eager forward), slots 0 .. width-1
    step      TorchTarget.step_static: the previous token of every sequence at its own position, written to cache
              slot `slot` (one slot for the batch), attending the valid slots <= slot over the whole cache;
              then, still on the device: argmax, the token stored in column `col` of `out`, `done` updated, and
              the inputs advanced (token, positions, slot, col), so consecutive replays need nothing from the host
    stopping  the host reads `done` every CHECK_EVERY steps (one synchronisation per CHECK_EVERY tokens): all done,
              or past max_new / 4 with at most 1 / TAIL_FRACTION of the batch still answering (those answers are
              kept cut short: still the target's own tokens). Steps past a sequence's stop token are dropped.

Numerics: the same arithmetic as the eager decode except that attention reduces over the whole cache with the
unfilled slots masked (their softmax weight is exactly 0), so a token may differ from the eager path's only where
two logits tie within rounding -- the labels are the target's greedy choices either way.
"""
from __future__ import annotations

import numpy as np

from . import require_torch

torch = require_torch()

__all__ = ["BatchDecoder", "greedy_answers", "CHECK_EVERY", "TAIL_FRACTION"]

CHECK_EVERY = 16      # decode steps between the host's looks at `done`
TAIL_FRACTION = 8     # a batch stops once at most 1/8 of its sequences are still answering (after max_new / 4)


class BatchDecoder:
    """Greedy answers of one prompt batch; `graph` None: a CUDA graph on a CUDA target, eager otherwise.

    temperature > 0 samples instead (the prompts the target writes itself, self_prompts.py): each token is
    argmax(logits / temperature + Gumbel noise), which draws from softmax(logits / temperature). The noise comes from
    `generator` (a torch.Generator on the target's device; the steps then run eagerly), or with generator None from
    the device's default generator, which a CUDA graph may replay (torch advances its offsets per replay)."""

    def __init__(self, target, prompts: list[np.ndarray], max_new: int, stop_ids: list[int], graph: bool | None = None,
                 temperature: float = 0.0, generator=None):
        if max_new < 1 or not prompts:
            raise ValueError("a batch needs prompts and max_new >= 1")
        if not temperature >= 0:
            raise ValueError(f"temperature must be >= 0, got {temperature!r}")
        self.target, self.max_new = target, max_new
        self.temperature, self.generator = float(temperature), generator
        dev = target.device
        own_rng = bool(temperature) and generator is not None
        self.graph_on = (dev.type == "cuda" and not own_rng) if graph is None else graph
        if self.graph_on and (dev.type != "cuda" or own_rng):
            raise ValueError(f"a CUDA graph needs a CUDA target ({dev}) and, to sample, the default generator "
                             f"(generator None)")
        n, width = len(prompts), max(len(p) for p in prompts)
        self.n, self.width = n, width
        t_max = width + max_new
        ids = torch.zeros(n, width, dtype=torch.long)
        pos = torch.zeros(n, width, dtype=torch.long)
        valid = torch.ones(n, t_max, dtype=torch.bool)
        for i, p in enumerate(prompts):
            pad = width - len(p)
            ids[i, pad:] = torch.from_numpy(p.astype(np.int64))
            pos[i, pad:] = torch.arange(len(p))
            valid[i, :pad] = False
        self.prompt_ids, self.prompt_pos, self.valid = ids.to(dev), pos.to(dev), valid.to(dev)
        self.cache = target.new_cache(n, t_max)
        self.stops = torch.tensor(stop_ids or [-1], device=dev)
        self.slots = torch.arange(t_max, device=dev)
        # the step's state, advanced on the device
        self.tok = torch.zeros(n, 1, dtype=torch.long, device=dev)
        self.pos = torch.tensor([[len(p)] for p in prompts], dtype=torch.long, device=dev)   # next token's position
        self.slot = torch.tensor(width, dtype=torch.long, device=dev)                         # its cache slot
        self.col = torch.tensor(1, dtype=torch.long, device=dev)                              # its column in out
        self.out = torch.zeros(n, max_new, dtype=torch.long, device=dev)
        self.done = torch.zeros(n, dtype=torch.bool, device=dev)
        self._graph = None

    def _stopped(self, tok):
        return (tok[:, None] == self.stops[None, :]).any(-1)

    def _choose(self, logits):
        """The next token of every sequence: the greedy argmax, or a sample (Gumbel-max) at temperature > 0."""
        if not self.temperature:
            return logits.argmax(-1)
        u = torch.rand(logits.shape, generator=self.generator, device=logits.device, dtype=torch.float32)
        gumbel = -torch.log(-torch.log(u.clamp(min=1e-20)))
        return (logits.float() / self.temperature + gumbel).argmax(-1)

    def _step(self) -> None:
        key_mask = self.valid & (self.slots[None, :] <= self.slot)
        nxt = self._choose(self.target.step_static(self.tok, self.pos, self.cache, self.slot, key_mask))
        self.out.index_copy_(1, self.col.view(1), nxt[:, None])
        self.done |= self._stopped(nxt)
        self.tok.copy_(nxt[:, None])
        self.pos += 1
        self.slot += 1
        self.col += 1

    def _replay(self) -> None:
        if not self.graph_on:
            self._step()
            return
        if self._graph is None:
            # first use: one step eagerly on a side stream (CUDA graph capture wants its allocations warmed up
            # there), then the capture, which records the step without running it
            side = torch.cuda.Stream(device=self.target.device)
            side.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(side):
                self._step()
            torch.cuda.current_stream().wait_stream(side)
            self._graph = torch.cuda.CUDAGraph()
            with torch.cuda.graph(self._graph):
                self._step()
            return
        self._graph.replay()

    @torch.no_grad()
    def run(self) -> list[np.ndarray]:
        """The answers: each ends with its stop token, or is max_new long (or cut short by the tail rule)."""
        first = self._choose(self.target.step(self.prompt_ids, self.prompt_pos, self.cache, 0, self.valid))
        self.out[:, 0] = first
        self.done |= self._stopped(first)
        self.tok.copy_(first[:, None])
        steps = 1
        while steps < self.max_new:
            if steps % CHECK_EVERY == 1 or CHECK_EVERY == 1:
                n_active = int((~self.done).sum())
                if n_active == 0 or (steps >= self.max_new // 4 and n_active <= self.n // TAIL_FRACTION):
                    break
            self._replay()
            steps += 1
        answers = self.out[:, :steps].cpu().numpy().astype(np.int32)
        stop_ids = self.stops.cpu().numpy()
        result = []
        for row in answers:
            hit = np.nonzero(np.isin(row, stop_ids))[0]
            result.append(row[:hit[0] + 1] if len(hit) else row)
        return result


def greedy_answers(target, prompts: list[np.ndarray], max_new: int, stop_ids) -> list[np.ndarray]:
    """The target's greedy answers (int32) to `prompts`, in their order, decoded as one batch sorted by length (the
    shortest prompts first: the left padding is least); the evaluation tools' way to get a prompt set's answers."""
    order = sorted(range(len(prompts)), key=lambda i: len(prompts[i]))
    out = BatchDecoder(target, [prompts[i] for i in order], max_new, sorted(stop_ids)).run()
    answers: list[np.ndarray] = [np.empty(0, np.int32)] * len(prompts)
    for i, a in zip(order, out):
        answers[i] = np.asarray(a, np.int32)
    return answers
