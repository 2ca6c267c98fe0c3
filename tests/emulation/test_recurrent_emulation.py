"""The recurrent-layer GPU tests (tests/gpu/test_causal_conv1d.py, test_gated_delta_rule.py) run on the CPU, on
small shapes, against recurrent_kernel_emulation.py: a stand-in library that computes what causal_conv1d.cu and
gated_delta_rule.cu compute (the same reduction order, status codes, NaN for an invalid parent) through the real
CudaOps wrappers. Catches mistakes in the GPU tests' logic and tolerances, in the kernels' documented index math
and in the wrappers' argument order without a GPU; the GPU run checks the kernels themselves."""
import numpy as np
import pytest

import tests.gpu.test_causal_conv1d as conv_tests
import tests.gpu.test_gated_delta_rule as delta_tests
from flashd.daemon.backends.cuda.tensor import Device
from tests.emulation.recurrent_kernel_emulation import RecurrentKernelNative
from tests.gpu.recurrent_oracle import TREES, poisoned_ops


@pytest.fixture(scope="module")
def native():
    return RecurrentKernelNative()


@pytest.fixture(scope="module")
def dev(native):
    return Device(native)


@pytest.fixture
def ops(dev):
    return poisoned_ops(dev, 4 << 20)


def rng(seed: int = 0):
    return np.random.default_rng(seed)


@pytest.mark.parametrize("n,channels,taps", [(1, 37, 4), (7, 100, 4), (2, 33, 8), (5, 1, 2)])
def test_conv_against_the_definition(ops, dev, n, channels, taps):
    conv_tests.test_causal_conv1d_matches_the_definition(ops, dev, rng(n), n, channels, taps)


def test_conv_state_across_calls_and_trees(ops, dev):
    conv_tests.test_state_carried_across_calls_and_decode_after_prefill_are_bitwise(ops, dev, rng(1), 2, 9, 57, 4)
    for parents in (TREES[2], TREES[4]):
        conv_tests.test_tree_nodes_are_decode_steps_along_their_paths(ops, dev, rng(2), parents, 37, 4)
    conv_tests.test_a_node_with_an_invalid_parent_is_nan(ops, dev, rng(3))


def test_conv_status_codes(native, dev):
    conv_tests.test_status_codes(native, dev)


@pytest.mark.parametrize("n,hk,hv,dk,dv", [(37, 2, 6, 16, 24), (9, 1, 1, 7, 31), (3, 5, 5, 1, 1)])
def test_delta_rule_against_the_recurrent_form(ops, dev, n, hk, hv, dk, dv):
    delta_tests.test_gated_delta_rule_matches_the_recurrent_form(ops, dev, rng(n), n, hk, hv, dk, dv)


def test_delta_rule_prefill_calls_and_trees(ops, dev):
    delta_tests.test_prefill_matches_the_reference_backends_chunked_form(ops, dev, rng(4), 70, 2, 4, 16, 16)
    delta_tests.test_state_carried_across_calls_is_bitwise(ops, dev, rng(5), 20, 7, 1, 2, 12, 12)
    for parents in (TREES[2], TREES[4]):
        delta_tests.test_tree_nodes_are_decode_steps_along_their_paths(ops, dev, rng(6), parents, 2, 6, 12, 9)
    delta_tests.test_a_node_with_an_invalid_parent_is_nan(ops, dev, rng(7))


def test_delta_rule_status_codes(native, dev):
    delta_tests.test_status_codes(native, dev)
