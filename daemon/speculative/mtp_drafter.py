"""MTPDrafter: a qwen35 target's own multi-token-prediction block (models/qwen35_mtp.py) as a built-in drafter
(`--draft mtp`), chain and tree.

The block predicts token p + 1 from token x_p and the target's output-normed hidden row h_{p-1}. Its own K/V cache
must hold an entry for every position of the sequence, position p computed from the pair (x_p, h_{p-1}) (h_{-1}:
zeros), as llama.cpp's MTP driver keeps it by replaying every target batch through the block.

Target rows. The drafter asks for the target's last layer (target_layer_ids = (n_layers - 1,)): the speculative
decoder's hidden sink hands over that layer's output rows of every prefill chunk and verify forward, which the
drafter copies to host memory and output-norms with the target's own op and weight when it feeds them
(qwen35_mtp.target_hidden: the rows the target's lm_head reads). A target forward without this drafter pays
nothing. Plain steps stay 1-row verify forwards with capture (tolerates_gaps is False: every position needs its
pair).

State, with n committed positions (the target's n_past) and the root r at position n:
  - `_n_mtp` cache slots hold correct entries, positions [0, _n_mtp) (always <= n + 1);
  - `_pending`: (token, raw target row of the position before) for positions [_n_mtp, n), in order;
  - `_h_last`: the raw target row of position n - 1 (the root's pair).
propose() runs the block over pending + (r, h_{n-1}) in chunks (the "replay"; its last row drafts d_1), then
chains: d_k at position n + k - 1 with the block's own normed output of the step before (llama.cpp's draft()).
The root's entry (position n) is final; the chain's entries (n + 1 ..) paired the block's own rows, not the
target's, so accept() drops them (_n_mtp = n + 1) and queues the committed tokens with the target's verify rows.
Candidates: depth d's chain step's logits give the top-K (log-softmax at `temperature`, best first, equal
log-probs lower id first: dflash_topk.py), so a tree's depth d is conditioned on the top-1 chain before it.

Prefix reuse: the decoder's runner.start prefills the whole prompt when a drafter wants target rows (runner.py),
so the block always sees every position; a `park` drops the drafter with the target (it borrows the target's
embedding, lm_head and output_norm, loader.borrows_target_weights) and unpark loads it again from the target's file.
"""
from __future__ import annotations

from typing import Sequence

import numpy as np

from ..backends.base import Batch
from ..models.gguf_file import ModelLoadError
from ..models.qwen35_mtp import mtp_cache_spec, mtp_forward, target_hidden
from ..models.qwen35_mtp_weights import MTPWeights, load_mtp_weights, mtp_config
from .dflash_inputs import StagedInputs
from .dflash_topk import topk_logprobs
from .drafter import Drafter, DrafterLoadError, Proposal

__all__ = ["MTPDrafter", "load_mtp_drafter", "MTP", "MTP_MAX_DEPTH"]

MTP = "mtp"                 # the --draft spec and drafter name
MTP_MAX_DEPTH = 4           # the longest chain (the block is trained for one step; later ones feed it its own rows)


class MTPDrafter(Drafter):
    device_features = False
    tolerates_gaps = False

    def __init__(self, ops, cfg, weights: MTPWeights, target_weights, max_ctx: int, *, chunk: int = 512,
                 max_depth: int = MTP_MAX_DEPTH, temperature: float = 1.0, name: str = MTP):
        if max_ctx <= 0 or chunk <= 0 or max_depth <= 0:
            raise ValueError("max_ctx, chunk and max_depth must be positive")
        if not temperature > 0:
            raise ValueError(f"draft temperature must be > 0, got {temperature}")
        self.ops, self.cfg, self.weights, self.target_weights = ops, cfg, weights, target_weights
        self.max_ctx, self.chunk, self.max_depth, self.temperature, self.name = max_ctx, chunk, max_depth, \
            float(temperature), name
        self.target_layer_ids = (cfg.n_layers - 1,)
        spec = mtp_cache_spec(cfg, max_ctx)
        self.cache = ops.kv_cache(spec)
        if hasattr(ops, "reserve_attention"):   # the GPU's decode attention over the block's cache (a replay is a
            ops.reserve_attention(cfg.n_heads, cfg.n_kv_heads, cfg.head_dim, spec.max_ctx, n_tokens=1)   # causal
            # prefill: no workspace; the target's attention layers have this shape, so nothing grows)
        self._inputs = StagedInputs(ops)
        self.forwards = 0           # block forwards run (tests and stats)
        self.replayed = 0           # positions whose entry came from a target row (each committed position once)
        self.end()

    # -- Drafter ---------------------------------------------------------------------------------------------
    def check_target(self, target_cfg) -> None:
        if (target_cfg.hidden, target_cfg.vocab_size, target_cfg.n_layers) != (self.cfg.hidden, self.cfg.vocab_size,
                                                                               self.cfg.n_layers):
            raise DrafterLoadError("drafter mtp: the MTP block belongs to another model than the target")

    def capture_hidden(self, layer_index: int, h) -> None:
        if layer_index == self.target_layer_ids[0]:
            self._captured.append(np.array(self.ops.to_numpy(h), dtype=np.float32))

    def begin(self, prompt: Sequence[int], root: int) -> None:
        rows = self._take_captured()
        if rows.shape[0] != len(prompt) or not len(prompt):
            raise RuntimeError(f"MTP drafter: {rows.shape[0]} captured target rows for a prompt of {len(prompt)} "
                               "tokens (the target prefill must run with the drafter's hidden sink)")
        self._n_mtp = 0
        self._n = len(prompt)
        prev = np.concatenate([np.zeros((1, self.cfg.hidden), np.float32), rows[:-1]])
        self._pending = list(zip((int(t) for t in prompt), prev))
        self._h_last = rows[-1]
        self._root = int(root)

    def propose(self, max_depth: int, top_k: int) -> Proposal:
        if self._root is None:
            raise RuntimeError("MTP drafter: propose before begin")
        n_depth = min(max_depth, self.max_depth, self.max_ctx - self._n)
        if n_depth <= 0:
            return Proposal.empty()
        logits, g = self._replay()                       # the root's row: drafts depth 1
        rows, chain = [logits], [self._chain_token(logits, 0)]
        for k in range(1, n_depth):
            logits, g = self._step(chain[-1], self._n + k, g)
            rows.append(logits)
            chain.append(self._chain_token(logits, k))
        if top_k == 1:
            return Proposal.chain(chain)
        ids, lp = topk_logprobs(np.stack(rows), top_k, self.temperature)
        return Proposal(ids, lp)

    def _chain_token(self, logits: np.ndarray, depth: int) -> int:
        """The token the chain continues with after depth `depth`'s logits: their argmax (the top-1 candidate)."""
        return int(np.argmax(logits))

    def accept(self, accepted: Sequence[int], bonus: int, rows: Sequence[int] | None = None) -> None:
        captured = self._take_captured()
        if rows is None or len(rows) != len(accepted) + 1:
            raise RuntimeError(f"MTP drafter: accept needs the committed verify rows (root + {len(accepted)} "
                               f"accepted), got {rows!r}")
        rows = np.asarray(rows, np.int64)
        if rows.max() >= captured.shape[0] or rows.min() < 0:
            raise RuntimeError(f"MTP drafter: committed row {int(rows.max())} of a verify forward with "
                               f"{captured.shape[0]} captured rows")
        kept = captured[rows]                     # target rows of positions n .. n + len(accepted)
        n = self._n
        if self._n_mtp > n:                       # propose ran: the root's entry (position n) is final, the
            self._n_mtp = n + 1                   # chain's (n + 1 ..) paired the block's own rows
        else:
            self._pending.append((self._root, self._h_last))
        self._pending += [(int(t), kept[i]) for i, t in enumerate(accepted)]
        self._h_last = kept[-1]
        self._n = n + len(accepted) + 1
        self._root = int(bonus)

    def end(self) -> None:
        self._captured: list[np.ndarray] = []
        self._pending: list[tuple[int, np.ndarray]] = []
        self._h_last = None
        self._n = self._n_mtp = 0
        self._root: int | None = None

    def close(self) -> None:
        self.end()
        self.weights = self.target_weights = self.cache = None
        self._inputs = StagedInputs(self.ops)

    def info(self) -> dict:
        d = super().info()
        d.update(kind="MTPDrafter", temperature=self.temperature, kv_bytes=int(getattr(self.cache, "n_bytes", 0)))
        return d

    # -- the block's forwards --------------------------------------------------------------------------------
    def _take_captured(self) -> np.ndarray:
        rows = (np.concatenate(self._captured) if self._captured
                else np.zeros((0, self.cfg.hidden), np.float32))
        self._captured = []
        return rows

    def _forward(self, ids: np.ndarray, pos0: int, h_prev, *, raw: bool):
        """One block forward over tokens at positions (and slots) pos0 ..; h_prev (n, D): raw target rows (normed
        here with the target's output_norm) or, raw=False, the block's own normed rows (a backend tensor).
        Returns (the last row's logits on the host, its normed output row on the host)."""
        ops, put = self.ops, self._inputs.put
        n = len(ids)
        ops.begin_forward()
        h = put("h_prev", np.ascontiguousarray(h_prev, np.float32))
        if raw:
            h = target_hidden(ops, self.cfg, self.target_weights, h)
        batch = Batch(put("ids", ids.astype(np.int32)), put("positions", np.arange(pos0, pos0 + n, dtype=np.int32)),
                      put("n_past", np.array([pos0], np.int32)), n_tokens=n)
        logits, g = mtp_forward(ops, self.cfg, self.weights, self.cache, batch, h)
        self.forwards += 1
        return (np.asarray(ops.to_numpy(logits), np.float32)[-1],
                np.array(ops.to_numpy(g), dtype=np.float32).reshape(-1, self.cfg.hidden)[-1:])

    def _replay(self):
        """The pending pairs and the root's (r, h_{n-1}) into the block's cache, in chunks; the root row's
        (logits, normed output)."""
        feed = self._pending + [(self._root, self._h_last)]
        if self._n_mtp + len(feed) != self._n + 1:
            raise RuntimeError(f"MTP drafter: {self._n_mtp} cache entries + {len(feed)} pending != "
                               f"{self._n + 1} positions")
        out = None
        for s in range(0, len(feed), self.chunk):
            part = feed[s:s + self.chunk]
            ids = np.array([t for t, _ in part], np.int32)
            out = self._forward(ids, self._n_mtp, np.stack([r for _, r in part]), raw=True)
            self._n_mtp += len(part)
            self.replayed += len(part)
        self._pending = []
        return out

    def _step(self, token: int, pos: int, g):
        """One chain step: the drafted token at `pos` with the block's own row of the step before."""
        out = self._forward(np.array([token], np.int32), pos, g, raw=False)
        self._n_mtp = max(self._n_mtp, pos + 1)
        return out


def load_mtp_drafter(ops, target_file, target_model, max_ctx: int, chunk: int, **kwargs) -> MTPDrafter:
    """The MTP block of the target's own GGUF as a drafter; DrafterLoadError when the target has none."""
    cfg = target_model.config
    try:
        mcfg = mtp_config(target_file, cfg)
        weights = load_mtp_weights(target_file, cfg, mcfg, ops.load_weight, target_model.weights)
    except ModelLoadError as exc:
        raise DrafterLoadError(f"--draft {MTP}: {exc}") from exc
    return MTPDrafter(ops, cfg, weights, target_model.weights, max_ctx, chunk=chunk, **kwargs)
