"""DFlashDrafter: the DFlash block drafter (models/dflash.py) behind the Drafter interface.

Per step it runs one drafter forward: first the context K/V of the positions committed since the
last step (their target features, captured during the verify forward; the prompt's after
prefill) are appended to the drafter's own KV cache, then the block [root, MASK x (B-1)] at
positions n_ctx .. n_ctx+B-1 yields B-1 distributions at once. Depth d's candidates are the top-K
of log_softmax(logits[d] / temperature): DFlash drafts every depth in parallel, so they are not
conditioned on the path (DDTree builds its tree from exactly that). dflash_topk.py defines them and
computes them on the host (the reference backend); on CUDA fd_topk_logprobs computes them on the
device and only K ids and log-probs per depth come back (not the (B-1) x vocab logits).

State, kept consistent with the committed sequence (drafter.py): n_pos positions are committed (the
root sits at n_pos); n_ctx rows are in the drafter's cache (slots [0, n_ctx)); the committed rows
with features not yet injected wait, each with its absolute position, for the next propose's
injection forward: first `_pending` (host rows: the prompt's, from prefill; positions
`_pending_pos`), then rows [0, _n_dev) of `_dev_pending` (device-resident rows: the verify
forwards'; positions `_dev_pos`); `_captured` holds the host rows of the target forward in flight,
until begin/accept says which rows were kept.

Features (device_features, drafter.py). The prompt's arrive through capture_hidden and are copied to
host memory (ops.to_numpy). A verify forward's stay on the device: capture_device hands over the
runner's feature buffers, and accept gathers the committed rows (Ops.gather_rows: fd_embed over a
float32 table on CUDA, bit copies) into `_dev_pending`, one (pending_cap, hidden) buffer per target
layer, so a step moves no feature to the host and back. The values are the same floats either way,
so the drafts are bit for bit those of the host path (device_features = False, kept for
bench/profile_dflash_step.py --capture host) wherever both inject the same chunks of rows. Steps
that accept without a propose between them (a policy's plain steps) fill `_dev_pending`; when the
next rows would not fit it is injected first (then the chunks differ: the drafts may move by
rounding, never the output, which the target verifies).

Gaps (drafter.py). spec=auto's plain bursts run on the runner's decode path without features and
call skip(): n_pos advances by the burst's committed positions, nothing is injected and n_ctx does
not move; the rows pending from before the gap stay pending and the next propose injects them, in
commit order, each at its own absolute position (RoPE) in the next slots -- what injecting them
before the gap would have written, so a request whose policy never drafts again injects nothing more
(the prompt's rows included). The block [root, MASK x (B-1)] sits at positions n_pos .. n_pos + B - 1
in slots n_ctx .., so it attends to the context it has, with the burst's positions absent.
"""
from __future__ import annotations

from pathlib import Path
from typing import Sequence

import numpy as np

from ..models.dflash import (TargetHead, block_batch, block_mask, dflash_cache_spec, draft_block,
                             inject_context)
from ..models.dflash_config import DFlashConfig
from ..models.dflash_weights import DFlashWeights, load_dflash_weights, open_dflash
from ..models.gguf_file import ModelLoadError
from .dflash_inputs import StagedInputs
from .replay import forward_replay
from .dflash_topk import device_topk, topk_logprobs
from .drafter import DeviceProposal, Drafter, DrafterLoadError, Proposal

__all__ = ["DFlashDrafter", "load_dflash_drafter"]

# Context rows per injection forward. An injection keeps its features live across all drafter
# layers, so it cannot recycle scratch per layer as a target forward does: 128 rows keep it well
# inside the activation arena sized for the target's prefill chunk (only prefill injects more
# than a step's ~budget rows).
INJECT_CHUNK = 128


class DFlashDrafter(Drafter):
    device_features = True
    tolerates_gaps = True       # skip(): the context keeps absolute positions (module docstring, "Gaps")

    def __init__(self, ops, cfg: DFlashConfig, weights: DFlashWeights, head: TargetHead, max_ctx: int, *,
                 temperature: float = 1.0, name: str = "dflash", inject_chunk: int = INJECT_CHUNK):
        if max_ctx <= 0 or inject_chunk <= 0:
            raise ValueError("max_ctx and inject_chunk must be positive")
        if not temperature > 0:
            raise ValueError(f"draft temperature must be > 0, got {temperature}")
        self.ops, self.cfg, self.weights, self.head = ops, cfg, weights, head
        self.max_ctx, self.temperature, self.name = max_ctx, float(temperature), name
        self.inject_chunk = inject_chunk
        self.target_layer_ids = tuple(cfg.target_layer_ids)
        self.max_depth = cfg.block_size - 1
        self._feature_index = {layer: j for j, layer in enumerate(cfg.target_layer_ids)}
        spec = dflash_cache_spec(cfg, max_ctx)
        self.cache = ops.kv_cache(spec)
        if hasattr(ops, "reserve_attention"):   # the GPU's attention workspace must hold a block's rows
            ops.reserve_attention(cfg.model.n_heads, cfg.model.n_kv_heads, cfg.model.head_dim, spec.max_ctx,
                                  n_tokens=cfg.block_size)
        self._mask = block_mask(ops, cfg)
        # (logits tensor, n_depth, k, temperature) -> (ids, lp) on the device (CUDA), or None: the host path
        self._device_topk = device_topk(ops, self.max_depth)
        # the same candidates left on the device, for a tree built there (propose_device)
        self._topk_on_device = device_topk(ops, self.max_depth, on_device=True)
        self.device_proposals = self._topk_on_device is not None
        self._inputs = StagedInputs(ops)     # per-step inputs in kept buffers (no allocation per step on CUDA)
        # the injection's inputs at their largest up front: a replayed graph reads these addresses
        self._inputs.buffer("inject_positions", (inject_chunk,), np.int32)
        self._inputs.buffer("inject_start", (1,), np.int32)
        self._replay = forward_replay(ops)   # CUDA: the block and the device rows' injections as graphs
        # device-resident committed rows awaiting injection: one (pending_cap, hidden) float32 buffer per
        # target layer; a step commits at most block_size rows (root + max_depth accepted)
        self.pending_cap = max(inject_chunk, cfg.block_size)
        self._dev_pending = [self._inputs.buffer(f"pending{j}", (self.pending_cap, cfg.model.hidden))
                             for j in range(len(self.target_layer_ids))]
        self.forwards = 0          # drafter forwards run (tests and stats)
        self.injected_rows = 0     # context rows ever injected: each committed position once
        self.end()

    # -- Drafter ---------------------------------------------------------------------------------
    def check_target(self, target_cfg) -> None:
        try:
            self.cfg.check_target(target_cfg)
        except ModelLoadError as exc:
            raise DrafterLoadError(str(exc)) from exc

    def capture_hidden(self, layer_index: int, h) -> None:
        j = self._feature_index.get(layer_index)
        if j is not None:
            self._captured[j].append(np.array(self.ops.to_numpy(h), dtype=np.float32))

    def capture_device(self, features, n: int) -> None:
        if len(features) != len(self.target_layer_ids):
            raise RuntimeError(f"DFlash drafter: {len(features)} feature buffers for target layers "
                               f"{list(self.target_layer_ids)}")
        self._verify_features = (list(features), int(n))

    def begin(self, prompt: Sequence[int], root: int) -> None:
        rows = self._take_captured()
        if rows[0].shape[0] != len(prompt):
            raise RuntimeError(f"DFlash drafter: {rows[0].shape[0]} captured feature rows for a prompt of "
                               f"{len(prompt)} tokens (the target prefill must run with the drafter's hidden sink)")
        self._n_ctx = 0
        self._n_pos = len(prompt)                # committed positions: the root sits at len(prompt)
        self._pending = rows
        self._pending_pos = np.arange(len(prompt), dtype=np.int64)
        self._n_dev = 0
        self._verify_features = None
        self._root = int(root)

    def propose(self, max_depth: int, top_k: int) -> Proposal:
        if self._root is None:
            raise RuntimeError("DFlash drafter: propose before begin")
        n_depth = min(max_depth, self.max_depth)
        if n_depth <= 0:
            return Proposal.empty()
        logits = self._draft()                                       # (B-1, vocab), a backend tensor
        # best first; among equal log-probs the lower id first (dflash_topk.py defines it)
        if self._device_topk is not None:         # CUDA: only the K ids and log-probs per depth come back
            ids, lp = self._device_topk(logits, n_depth, top_k, self.temperature)
        else:
            ids, lp = topk_logprobs(np.asarray(self.ops.to_numpy(logits))[:n_depth], top_k, self.temperature)
        return Proposal(ids, lp)

    def propose_device(self, max_depth: int, top_k: int) -> DeviceProposal | None:
        """propose()'s candidates, left on the device (the same kernel, the same ids and log-probs)."""
        if self._root is None:
            raise RuntimeError("DFlash drafter: propose before begin")
        n_depth = min(max_depth, self.max_depth)
        if n_depth <= 0 or self._topk_on_device is None:
            return None
        ids, lp = self._topk_on_device(self._draft(), n_depth, top_k, self.temperature)
        return DeviceProposal(ids, lp, n_depth)

    def accept(self, accepted: Sequence[int], bonus: int, rows: Sequence[int] | None = None) -> None:
        captured = self._take_captured()
        on_device, self._verify_features = self._verify_features, None
        if rows is None:
            raise RuntimeError("DFlash drafter: accept needs the committed verify rows")
        rows = np.asarray(rows, np.int64)
        if len(rows) != len(accepted) + 1:
            raise RuntimeError(f"DFlash drafter: {len(rows)} committed rows for root + {len(accepted)} accepted")
        n_rows = on_device[1] if on_device is not None else captured[0].shape[0]
        if len(rows) and (rows.max() >= n_rows or rows.min() < 0):
            raise RuntimeError(f"DFlash drafter: committed row {int(rows.max())} of a verify forward with "
                               f"{n_rows} captured rows")
        if on_device is not None:
            if captured[0].shape[0]:
                raise RuntimeError("DFlash drafter: a verify forward's features came both through "
                                   "capture_hidden and capture_device")
            self._gather(on_device[0], rows)
        else:
            if self._n_dev:                 # host rows may not follow device rows (injection order)
                self._inject_pending()
            self._pending = [np.concatenate([p, c[rows]]) for p, c in zip(self._pending, captured)]
            self._pending_pos = np.concatenate([self._pending_pos, self._n_pos + np.arange(len(rows))])
        self._n_pos += len(rows)                # root + accepted: committed, their rows pending
        self._root = int(bonus)

    def skip(self, tokens: Sequence[int]) -> None:
        if self._root is None:
            raise RuntimeError("DFlash drafter: skip before begin")
        if not len(tokens):
            return
        self._take_captured()                   # a decode path forward captures nothing; drop strays
        self._verify_features = None
        self._n_pos += len(tokens)              # the old root and tokens[:-1]: committed, no features
        # the pending rows stay pending with their positions: the next propose injects them (a request whose
        # policy never drafts again injects nothing more)
        self._root = int(tokens[-1])

    def close(self) -> None:
        self._replay.clear()
        super().close()

    def end(self) -> None:
        self._n_ctx = self._n_pos = 0
        self._n_dev = 0           # rows [0, _n_dev) of each _dev_pending buffer await injection
        self._dev_pos = np.zeros(self.pending_cap, np.int64)     # their absolute positions
        self._pending_pos = np.zeros(0, np.int64)                # the host rows' positions
        self._verify_features = None
        self._root: int | None = None
        self._captured: list[list[np.ndarray]] = [[] for _ in self.target_layer_ids]
        self._pending = [np.zeros((0, self.cfg.model.hidden), np.float32) for _ in self.target_layer_ids]

    def info(self) -> dict:
        d = super().info()
        d.update(block_size=self.cfg.block_size, n_layers=self.cfg.model.n_layers, temperature=self.temperature,
                 kv_bytes=int(self.cache.n_bytes))
        return d

    # -- the drafter's forward -------------------------------------------------------------------
    def _take_captured(self) -> list[np.ndarray]:
        rows = [np.concatenate(c) if c else np.zeros((0, self.cfg.model.hidden), np.float32) for c in self._captured]
        if len({r.shape[0] for r in rows}) > 1:
            raise RuntimeError(f"DFlash drafter: target layers {list(self.target_layer_ids)} captured "
                               f"{[r.shape[0] for r in rows]} rows (one capture per wanted layer per forward)")
        self._captured = [[] for _ in self.target_layer_ids]
        return rows

    def _gather(self, features, rows: np.ndarray) -> None:
        """Append rows `rows` of the verify forward's feature buffers to _dev_pending, on the device."""
        m = len(rows)
        if m > self.pending_cap:
            raise RuntimeError(f"DFlash drafter: {m} committed rows > the {self.pending_cap} pending rows it holds")
        if self._n_dev + m > self.pending_cap:
            self._inject_pending()
        ids = self._inputs.put("accepted_rows", rows.astype(np.int32))
        for f, buf in zip(features, self._dev_pending):
            self.ops.gather_rows(f, ids, buf[self._n_dev:self._n_dev + m])
        self._dev_pos[self._n_dev:self._n_dev + m] = self._n_pos + np.arange(m)
        self._n_dev += m

    def _inject_pending(self) -> None:
        """Inject the host rows (the prompt's), then the device rows, in chunks of inject_chunk."""
        n_host, n_dev = self._pending[0].shape[0], self._n_dev
        if self._n_ctx + n_host + n_dev > self.max_ctx:
            raise ValueError(f"DFlash drafter context overflow: {self._n_ctx} + {n_host + n_dev} > max_ctx {self.max_ctx}")
        put = self._inputs.put
        for s in range(0, n_host, self.inject_chunk):
            e = min(n_host, s + self.inject_chunk)
            self._inject([put(f"feature{j}", p[s:e]) for j, p in enumerate(self._pending)], self._pending_pos[s:e])
        self._pending = [p[:0] for p in self._pending]
        self._pending_pos = self._pending_pos[:0]
        for s in range(0, n_dev, self.inject_chunk):
            e = min(n_dev, s + self.inject_chunk)
            self._inject([p[s:e] for p in self._dev_pending], self._dev_pos[s:e], key=("inject", s, e - s))
        self._n_dev = 0

    def _inject(self, feats, positions_host: np.ndarray, key=None) -> None:
        """One injection forward: feats (one (m, hidden) tensor per target layer) at the rows' absolute positions
        positions_host (m,) into slots n_ctx .. n_ctx + m - 1 (the same numbers until a gap). key: feats are rows
        of the kept _dev_pending buffers, so the forward may replay a graph (one per key); None: eager (the
        prompt's rows arrive through `feature{j}` buffers that grow with the prompt)."""
        put = self._inputs.put
        m = len(positions_host)
        positions = put("inject_positions", np.asarray(positions_host, np.int32))
        start = put("inject_start", np.array([self._n_ctx], np.int32))

        def body():
            self.ops.begin_forward()
            inject_context(self.ops, self.cfg, self.weights, self.cache, feats, positions, start)
        if key is None:
            body()
        else:
            self._replay.run(key, body)
        self._n_ctx += m
        self.injected_rows += m

    def _draft(self):
        """The backend tensor of logits (B-1, vocab) of the block [root, MASK x (B-1)] after the committed context."""
        self._inject_pending()
        logits = self._block_forward()
        self.forwards += 1
        return logits

    def _block_forward(self):
        """The block's forward (embedding, layers, lm_head) on the injected context: logits (B-1, vocab)."""
        ops, cfg = self.ops, self.cfg
        ids = np.full(cfg.block_size, cfg.mask_token_id, np.int32)
        ids[0] = self._root
        p = self._n_pos                         # the root's position; its slot is n_ctx (they differ after a gap)
        put = self._inputs.put
        batch = block_batch(cfg, put("block_ids", ids), put("block_positions", np.arange(p, p + cfg.block_size,
                                                                                         dtype=np.int32)),
                            put("block_n_ctx", np.array([self._n_ctx], np.int32)), self._mask)

        def body():
            ops.begin_forward()
            return draft_block(ops, cfg, self.weights, self.head, self.cache, batch)
        return self._replay.run("block", body)


def load_dflash_drafter(path: str | Path, ops, target_cfg, target_weights, max_ctx: int, **kwargs) -> DFlashDrafter:
    """Open, check against the target and load a DFlash drafter GGUF; DrafterLoadError on mismatch.
    kwargs go to DFlashDrafter (name, temperature, inject_chunk: at most the target's prefill chunk
    on the CUDA backend, whose activation arena is sized for it)."""
    try:
        f, cfg = open_dflash(path)
        cfg.check_target(target_cfg)
    except ModelLoadError as exc:
        raise DrafterLoadError(str(exc)) from exc
    weights = load_dflash_weights(f, cfg, ops.load_weight)
    head = TargetHead(token_embd=target_weights.token_embd, output=target_weights.output)
    return DFlashDrafter(ops, cfg, weights, head, max_ctx, **kwargs)
