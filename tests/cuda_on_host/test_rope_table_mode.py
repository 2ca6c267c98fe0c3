"""AttentionOps._rope_table_mode (backends/cuda/attention_ops.py): within one decode-body forward (`rope_table_on`) the
first fused decode call stores the position's cos / sin (mode 1) and the later calls of the same rope and position
tensor read them (mode 2); a call of another rope or position tensor, a quantized K, a rope wider than the table, or
any call outside the decode body computes its own (0); begin_forward's reset makes the next forward store again. A
read where nothing of that rope and position was stored would rotate by another step's angles."""
import types

import pytest

from flashd.daemon.backends.cuda.attention_ops import AttentionOps, Roped


def roped(pos_ptr=1000, rope_dim=128, theta=1e6, neox=True, scaling=None):
    return Roped(x=None, positions=types.SimpleNamespace(ptr=pos_ptr), theta=theta, rope_dim=rope_dim, neox=neox,
                 scaling=scaling)


def ops(on=True):
    return types.SimpleNamespace(rope_table_on=on, rope_table=types.SimpleNamespace(size=256), _rope_table_key=None)


def mode(o, r, k_quantized=False):
    return AttentionOps._rope_table_mode(o, r, k_quantized)


def test_the_first_call_stores_and_the_rest_read():
    o = ops()
    assert [mode(o, roped()) for _ in range(4)] == [1, 2, 2, 2]


@pytest.mark.parametrize("other", [dict(pos_ptr=2000), dict(rope_dim=64), dict(theta=1e4), dict(neox=False),
                                   dict(scaling="yarn")])
def test_another_rope_or_position_computes_its_own(other):
    o = ops()
    assert mode(o, roped()) == 1
    assert mode(o, roped(**other)) == 0
    assert mode(o, roped()) == 2


def test_off_outside_the_decode_body_for_a_quantized_k_and_without_a_table():
    assert mode(ops(on=False), roped()) == 0
    assert mode(ops(), roped(), k_quantized=True) == 0
    o = ops()
    o.rope_table = None
    assert mode(o, roped()) == 0
    assert mode(ops(), roped(rope_dim=258)) == 0


def test_a_new_forward_stores_again():
    o = ops()
    assert mode(o, roped()) == 1 and mode(o, roped()) == 2
    o._rope_table_key = None                       # what CudaOps.begin_forward does
    assert mode(o, roped(pos_ptr=2000)) == 1 and mode(o, roped(pos_ptr=2000)) == 2
