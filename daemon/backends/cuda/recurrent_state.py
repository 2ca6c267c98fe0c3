"""CudaRecurrentState: one sequence's recurrent state of a hybrid (qwen35) model's linear-attention layers on the
GPU -- the conv window (n_layers, K - 1, C) and the delta-rule memory (n_layers, Hv, S, S), float32, each one
allocation outside the arena (it lives across forwards). The device twin of backends.reference.
ReferenceRecurrentState: `layer(j)` gives (conv (K - 1, C), memory (Hv, S, S)) views that CudaOps.causal_conv1d
and gated_delta_rule update in place; `save()` is a host copy (numpy, the reference's shapes, so a HybridPrefix
is the same on both backends), `load(copy)` uploads one, `clear()` zeroes both.

A draft tree's verify (models/qwen35_tree.py) writes a state per node into node buffers, conv (n_layers, N, K - 1,
C) and memory (n_layers, N, Hv, S, S), allocated on first use and grown to the largest tree (N nodes) verified, as
the reference's: `tree_layer(j, n)` gives layer j's live state (read only) and node buffers for the
causal_conv1d_tree / gated_delta_rule_tree kernels, `node_parents(parents)` the tree's parents as the int32 device
tensor those kernels take (uploaded once per tree), and `keep_node(i)` copies node i's state into the live one
(the commit; device copies, two per layer)."""
from __future__ import annotations

import numpy as np

from ..base import RecurrentStateSpec
from .tensor import Device

__all__ = ["CudaRecurrentState"]


class CudaRecurrentState:
    def __init__(self, device: Device, spec: RecurrentStateSpec):
        self.dev, self.spec = device, spec
        self._conv_shape = (spec.conv_kernel - 1, spec.conv_channels)
        self._ssm_shape = (spec.n_v_heads, spec.head_dim, spec.head_dim)
        self.conv = device.empty((spec.n_layers, *self._conv_shape), np.float32)
        self.ssm = device.empty((spec.n_layers, *self._ssm_shape), np.float32)
        self.node_conv = self.node_ssm = None     # (n_layers, N, ...) node buffers: tree_layer allocates them
        self._parents = (None, None)              # (host parents, their device copy) of the last tree
        self.clear()

    @property
    def n_bytes(self) -> int:
        return self.conv.nbytes + self.ssm.nbytes

    def layer(self, j: int):
        """Layer j's (conv (K - 1, C), memory (Hv, S, S)): views into the state, updated in place by the ops."""
        return self.conv[j:j + 1].reshape(self._conv_shape), self.ssm[j:j + 1].reshape(self._ssm_shape)

    def clear(self) -> None:
        self.dev.fill_bytes(self.conv, 0)       # 0x00000000 is float32 +0.0
        self.dev.fill_bytes(self.ssm, 0)

    def save(self) -> tuple[np.ndarray, np.ndarray]:
        """Host copies: conv (n_layers, K - 1, C), memory (n_layers, Hv, S, S) float32."""
        return self.dev.download(self.conv), self.dev.download(self.ssm)

    def load(self, saved) -> None:
        conv, ssm = saved
        self.dev.upload(np.ascontiguousarray(conv, np.float32), out=self.conv)
        self.dev.upload(np.ascontiguousarray(ssm, np.float32), out=self.ssm)

    @property
    def _n_node_slots(self) -> int:
        return 0 if self.node_conv is None else self.node_conv.shape[1]

    def tree_layer(self, j: int, n_nodes: int):
        """Layer j's (conv (K - 1, C), memory (Hv, S, S), node conv (n_nodes, K - 1, C), node memory (n_nodes, Hv,
        S, S)): the live state, read by the tree kernels, and the node buffers they write."""
        N = self._n_node_slots
        if N < n_nodes:                           # grown (never shrunk) to the largest tree; zeroed, as the reference
            L = self.spec.n_layers
            self.node_conv = self.dev.empty((L, n_nodes, *self._conv_shape), np.float32)
            self.node_ssm = self.dev.empty((L, n_nodes, *self._ssm_shape), np.float32)
            self.dev.fill_bytes(self.node_conv, 0)
            self.dev.fill_bytes(self.node_ssm, 0)
            N = n_nodes
        conv, ssm = self.layer(j)
        node_conv = self.node_conv[j:j + 1].reshape(N, *self._conv_shape)[:n_nodes]
        node_ssm = self.node_ssm[j:j + 1].reshape(N, *self._ssm_shape)[:n_nodes]
        return conv, ssm, node_conv, node_ssm

    def node_parents(self, parents: np.ndarray):
        """The tree's parents (host int32 (n,)) as an int32 device tensor, uploaded once per tree (every layer of a
        verify forward passes the same array)."""
        host, dev = self._parents
        if host is not parents:
            dev = self.dev.upload(np.ascontiguousarray(parents, np.int32))
            self._parents = (parents, dev)
        return dev

    def keep_node(self, node: int) -> None:
        """The live state <- the state after tree node `node` of the last tree forward, every layer."""
        N = self._n_node_slots
        if not 0 <= node < N:
            raise ValueError(f"tree node {node}: the node buffers hold {N}")
        for j in range(self.spec.n_layers):
            conv, ssm = self.layer(j)
            self.dev.copy(conv, self.node_conv[j:j + 1].reshape(N, *self._conv_shape)[node:node + 1]
                          .reshape(self._conv_shape))
            self.dev.copy(ssm, self.node_ssm[j:j + 1].reshape(N, *self._ssm_shape)[node:node + 1]
                          .reshape(self._ssm_shape))
