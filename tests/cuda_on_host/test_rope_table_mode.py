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


def test_the_rope_struct_carries_the_table_in_its_modes():
    """AttentionOps._rope: the fd_rope_t of mode 1 / 2 points at the ops' table, mode 0's at nothing -- one struct a
    (rope, mode), as the C ABI reads it (cffi with the library's own header)."""
    import cffi

    from flashd.daemon.backends.cuda.lib import cdef_source
    ffi = cffi.FFI()
    ffi.cdef(cdef_source())
    fake = types.SimpleNamespace(ffi=ffi, dev=types.SimpleNamespace(p=lambda t, ctype: ffi.cast(ctype, 4096)),
                                 rope_table=object(), _ropes={})
    r = roped()
    structs = {m: AttentionOps._rope(fake, r, m) for m in (0, 1, 2)}
    assert structs[0].table == ffi.NULL and structs[0].table_mode == 0
    for m in (1, 2):
        assert int(ffi.cast("uintptr_t", structs[m].table)) == 4096 and structs[m].table_mode == m
        assert structs[m].rope_dim == 128 and structs[m].neox == 1
    assert AttentionOps._rope(fake, r, 2) is structs[2] and len(fake._ropes) == 3
