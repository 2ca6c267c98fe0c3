"""CudaRecurrentState: one sequence's recurrent state of a hybrid (qwen35) model's linear-attention layers on the
GPU -- the conv window (n_layers, K - 1, C) and the delta-rule memory (n_layers, Hv, S, S), float32, each one
allocation outside the arena (it lives across forwards). The device twin of backends.reference.
ReferenceRecurrentState: `layer(j)` gives (conv (K - 1, C), memory (Hv, S, S)) views that CudaOps.causal_conv1d
and gated_delta_rule update in place; `save()` is a host copy (numpy, the reference's shapes, so a HybridPrefix
is the same on both backends), `load(copy)` uploads one, `clear()` zeroes both.

A draft tree's node states (`tree_layer`, `keep_node`) are not on the device yet: the CUDA runner refuses tree
verification on a hybrid (hybrid_runner.py) before a forward could ask for them."""
from __future__ import annotations

import numpy as np

from ..base import RecurrentStateSpec
from .tensor import Device

__all__ = ["CudaRecurrentState", "TreeVerifyUnsupported", "TREE_UNSUPPORTED"]

TREE_UNSUPPORTED = ("speculative decoding (draft tree verification) on a hybrid (qwen35) model is not supported "
                    "on the CUDA backend yet: the per-node recurrent states are not on the device; run the request "
                    "without spec, or the model with --device cpu")


class TreeVerifyUnsupported(NotImplementedError):
    """A draft tree's verify forward on a CUDA hybrid (TREE_UNSUPPORTED says why)."""


class CudaRecurrentState:
    def __init__(self, device: Device, spec: RecurrentStateSpec):
        self.dev, self.spec = device, spec
        self._conv_shape = (spec.conv_kernel - 1, spec.conv_channels)
        self._ssm_shape = (spec.n_v_heads, spec.head_dim, spec.head_dim)
        self.conv = device.empty((spec.n_layers, *self._conv_shape), np.float32)
        self.ssm = device.empty((spec.n_layers, *self._ssm_shape), np.float32)
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

    def tree_layer(self, j: int, n_nodes: int):
        raise TreeVerifyUnsupported(TREE_UNSUPPORTED)

    def keep_node(self, node: int) -> None:
        raise TreeVerifyUnsupported(TREE_UNSUPPORTED)
