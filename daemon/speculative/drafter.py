"""The Drafter interface: what every speculative-decoding drafter implements.

Drafters: prompt-lookup n-grams (`ngram.py`), a small autoregressive draft model
(`draft_model.py`), the DFlash block drafter (`dflash_drafter.py`) and a qwen35 target's own
multi-token-prediction block (`mtp_drafter.py`). The speculative decoder
(`decoder.py`) drives one drafter per request through this sequence:

    begin(prompt, root)              once, after the target prefilled `prompt`
    loop:
        proposal = propose(max_depth, top_k)
        <target verify forward over root + tree nodes; capture_hidden(...) during it,
         or capture_device(features, n) after it for a drafter with device_features>
        accept(accepted, bonus, rows)
    end()                            always (done, stop, cancel, error): drop per-request state

Vocabulary of the sequence. The *committed* sequence is prompt + every generated token whose K/V
is in the target's cache. The *root* is the newest token: it has been generated (emitted to the
client) but not forwarded yet, so its successor is unknown. `begin(prompt, root)` starts the
sequence as prompt + [root]; `accept(accepted, bonus, rows)` extends it by `accepted` (the drafted
tokens the target verified, in order, possibly empty) followed by `bonus` (the target's own next
token), and `bonus` becomes the new root. After the call the committed sequence is
old committed + [old root] + accepted.

Proposals. `propose(max_depth, top_k)` returns `Proposal(tokens, logprobs)`, both (n_depth, K)
with 1 <= n_depth <= max_depth and K <= top_k: row d holds candidates for the token d+1 places
after the root, best first; `logprobs` are natural-log probabilities under the drafter's own
distribution (any temperature the drafter likes: they only shape the tree, see tree.py), -inf
marks an unusable slot. A chain drafter returns K = 1. Candidates at depth d are *not*
conditioned on which candidate was taken at depth d-1 (DDTree's path-independent drafts); a
drafter that only knows one continuation returns it with log-prob 0. n_depth may be 0 (nothing
to propose: the step degenerates to plain decoding of one token).

Exactness does not depend on the drafter: the target verifies every token, and at temperature > 0
the decoder treats each candidate as a point-mass draft (tree rejection sampling, decoder.py), so
a drafter never needs to expose a full distribution.

Target features (for DFlash). A drafter declares `target_layer_ids` (0-based target layer
indices whose *outputs* it wants, i.e. the hidden state after that decoder layer, residual
included: what `models.dense.forward(..., hidden_sink=...)` passes). During every target forward
that extends the sequence (prefill chunks, and each verify forward unless device_features: below)
the decoder calls `capture_hidden(layer_index, h)` once per wanted layer, in increasing layer order
(a persistent forward of several launches: once per launch, rows in order), with `h` a
*backend tensor* (n_rows, hidden) float32 holding one row per token of that forward. `h` is only
valid during the call (the CUDA backend recycles its scratch arena per layer): copy what you need
(ops.to_numpy, or a device copy into a buffer you own). Which rows become committed context is
told afterwards:
  - prefill: all captured rows of all chunks, in order, are the prompt positions 0..n_prompt-1;
    `begin` is called after the last chunk.
  - verify: `accept(..., rows)` gives the row indices (into the verify forward's rows) of the
    newly committed positions, in position order: rows[0] is the root (always row 0), then the
    accepted nodes. Other rows belong to rejected nodes and must be dropped.
A drafter with no `target_layer_ids` gets no capture calls.

Gaps (spec=auto). When the depth policy chooses plain decoding, the decoder runs those steps as one
burst on the runner's decode path (no verify forward, no host round trip per token) and calls
`skip(tokens)` instead of accept: the positions it commits have no captured features. A drafter
with target features gets such bursts only if it sets `tolerates_gaps` (DFlash: its context keeps
each injected row's absolute position, so the missing positions are simply absent from what the
block attends to; its drafts may get worse, never the output, which the target verifies). Otherwise
its plain steps stay 1-row verify forwards with capture, which cost more than a decode step.

Device-resident features (verify forwards only). A drafter with `device_features = True` gets a
verify forward's features without a trip through host memory: the decoder runs the verify with
`runner.forward_tree(..., capture=target_layer_ids)` and no hidden sink -- the runner writes each
wanted layer's output rows into buffers it owns, inside the forward (on CUDA by device copies in the
verify's captured graph, which the host sink's per-layer host code would otherwise forbid) -- and
then calls `capture_device(features, n)` once, with `features` a list of backend tensors
(max_tree_nodes, hidden) float32, one per layer in target_layer_ids' order (`runner.tree_features`),
whose rows [0, n) are the verify forward's n rows. They stay valid until the next target forward;
the drafter copies the rows that `accept(..., rows)` names (Ops.gather_rows: device to device on
CUDA, numpy on the reference backend) before that. The prompt's features still come through
capture_hidden during prefill (prefill runs eagerly anyway, and begin() needs them all).

Proposals on the device. A drafter with `device_proposals = True` (DFlash on CUDA) also offers
`propose_device(max_depth, top_k)`: the same candidates as propose() would return, left on the device
as a `DeviceProposal` (backend tensors), or None where it cannot (the decoder then calls propose()). The
decoder hands them to a runner that builds the tree there (tree_verify.py on CUDA: fd_ddtree_build), so
the step reads nothing back before its verify forward.

Ownership. The target's KV cache belongs to the target runner and the decoder (which compacts
the accepted path into consecutive slots). A drafter that runs a model owns that model's runner
and KV cache and keeps it consistent with the committed sequence itself (e.g. roll back its own
n_past to the committed length in `accept`). A drafter is used by one request at a time (the
engine is batch 1); `end()` must leave it ready for the next `begin()` even after an exception
in the middle of a step.
"""
from __future__ import annotations

from abc import ABC, abstractmethod
from dataclasses import dataclass
from typing import Any, Sequence

import numpy as np

__all__ = ["Drafter", "Proposal", "DeviceProposal", "DrafterLoadError"]


class DrafterLoadError(ValueError):
    """A drafter cannot serve this target (missing file, mismatched vocabulary, ...)."""


@dataclass(slots=True, frozen=True)
class Proposal:
    """Per-depth candidates: tokens int32 (n_depth, K), logprobs float64 (n_depth, K), best first."""

    tokens: np.ndarray
    logprobs: np.ndarray

    def __post_init__(self):
        tokens = np.asarray(self.tokens, np.int32)
        if tokens.ndim == 1:                      # a chain given as a flat list
            tokens = tokens.reshape(-1, 1)
        if tokens.ndim != 2:
            raise ValueError(f"Proposal.tokens must be (n_depth, K), got shape {tokens.shape}")
        logprobs = np.asarray(self.logprobs, np.float64).reshape(tokens.shape)
        object.__setattr__(self, "tokens", tokens)
        object.__setattr__(self, "logprobs", logprobs)

    @property
    def n_depth(self) -> int:
        return 0 if self.tokens.size == 0 else int(self.tokens.shape[0])

    @staticmethod
    def empty() -> "Proposal":
        return Proposal(np.zeros((0, 1), np.int32), np.zeros((0, 1), np.float64))

    @staticmethod
    def chain(tokens: Sequence[int]) -> "Proposal":
        """A single continuation, each token with log-prob 0."""
        t = np.asarray(tokens, np.int32).reshape(-1, 1)
        return Proposal(t, np.zeros(t.shape, np.float64))


@dataclass(slots=True, frozen=True)
class DeviceProposal:
    """propose()'s candidates left on the device: ids int32 and logprobs float64, backend tensors (rows >= n_depth,
    k), rows [0, n_depth) used, each best first (fd_topk_logprobs' order); valid until the drafter's next forward."""

    ids: Any
    logprobs: Any
    n_depth: int

    @property
    def k(self) -> int:
        return int(self.ids.shape[1])


class Drafter(ABC):
    """See the module docstring for the call sequence and the meaning of every argument."""

    name: str = "drafter"
    # target layers whose outputs capture_hidden receives; empty: no capture
    target_layer_ids: tuple[int, ...] = ()
    # the deepest proposal this drafter can make (e.g. DFlash: block size - 1)
    max_depth: int = 16
    # True: verify forwards' features come through capture_device (device-resident), not capture_hidden
    device_features: bool = False
    # True: a drafter with target features that can draft over a context with gaps, so spec=auto's plain
    # steps may run on the runner's decode path without capturing features (skip() is told what they committed)
    tolerates_gaps: bool = False
    # True: propose_device may return the candidates on the device (module docstring, "Proposals on the device")
    device_proposals: bool = False

    def check_target(self, target_cfg) -> None:
        """Raise DrafterLoadError when this drafter cannot draft for a target with ModelConfig
        `target_cfg` (e.g. a vocabulary mismatch). Called once when the engine loads drafters."""

    @abstractmethod
    def begin(self, prompt: Sequence[int], root: int) -> None:
        """A new request: the target has prefilled `prompt`; `root` is the first generated token."""

    @abstractmethod
    def propose(self, max_depth: int, top_k: int) -> Proposal:
        """Candidates for the tokens after the root (at most max_depth rows, K <= top_k)."""

    def propose_device(self, max_depth: int, top_k: int) -> DeviceProposal | None:
        """propose()'s candidates on the device (device_proposals only), or None: the decoder calls propose()."""
        return None

    @abstractmethod
    def accept(self, accepted: Sequence[int], bonus: int, rows: Sequence[int] | None = None) -> None:
        """The target verified `accepted` after the root and chose `bonus`, the new root."""

    def skip(self, tokens: Sequence[int]) -> None:
        """Plain decoding steps ran on the runner's decode path, not through a verify forward: the committed
        sequence grew by the old root and tokens[:-1], and tokens[-1] is the new root. No target features
        were captured for those positions (only drafters with tolerates_gaps, or without target features,
        are told this way). Default: one accept([], token, [0]) per token."""
        for tok in tokens:
            self.accept([], int(tok), [0])

    def capture_hidden(self, layer_index: int, h: Any) -> None:
        """A target layer's output rows during a forward (only for layers in target_layer_ids)."""

    def capture_device(self, features: Sequence[Any], n: int) -> None:
        """After a verify forward of n rows (device_features only): features[j] (>= n, hidden) holds
        layer target_layer_ids[j]'s rows, valid until the next target forward."""

    def end(self) -> None:
        """The request is over (any reason): drop per-request state."""

    def close(self) -> None:
        """The daemon drops this drafter: release its memory."""
        self.end()

    def info(self) -> dict:
        """What `status` reports about this drafter."""
        return {"name": self.name, "kind": type(self).__name__, "max_depth": self.max_depth,
                "target_layer_ids": list(self.target_layer_ids)}
