"""The integer tricks of gemv_stage.cuh's int8 x prologue (stage_xq / xq_groups), emulated in numpy float32 / int32:

- rint_magic: float32(t + 1.5 * 2^23) read as an int, minus the constant's bits, is t rounded to the nearest integer
  with ties to even -- what __float2int_rn gives -- for |t| < 2^22 (the codes need |t| <= 127.5);
- int_to_float_magic: the inverse, exact for |n| < 2^22;
- the packed code sums: hi * 2^16 + lo summed over 8 lanes (one 32-column block) unpacks to the separate sums, because
  |sum of lo| <= 32 * 127 < 2^15 (lo = rint((t - hi) * 254), |t - hi| <= 1/2);
- pack_s8's two-level byte permute equals the shift-and-or packing it replaced.
The CUDA code is checked bit for bit against the old prologue on the GPU (tests/gpu/test_gemv.py bounds the result;
the session-16 A/B compared 21 GEMV outputs bitwise); this file pins the arithmetic the comments claim."""
import numpy as np

MAGIC = np.float32(12582912.0)          # 1.5 * 2^23
MAGIC_BITS = np.int32(0x4B400000)


def rint_magic(t):
    return (np.asarray(t, np.float32) + MAGIC).view(np.int32) - MAGIC_BITS


def int_to_float_magic(n):
    return (np.asarray(n, np.int32) + MAGIC_BITS).view(np.float32) - MAGIC


def test_magic_constant_is_its_bit_pattern():
    assert np.array([MAGIC], np.float32).view(np.int32)[0] == MAGIC_BITS


def test_rint_magic_is_round_half_even():
    rng = np.random.default_rng(1)
    t = np.concatenate([rng.uniform(-127.5, 127.5, 200_000).astype(np.float32),
                        np.arange(-127.5, 128.0, 0.5, dtype=np.float32),            # every tie in the codes' range
                        np.nextafter(np.arange(-127.5, 128.0, 0.5, dtype=np.float32), np.float32(0)),
                        np.float32([0.0, -0.0, 1e-30, -1e-30, 4194303.0, -4194303.0])])
    assert np.array_equal(rint_magic(t), np.rint(t).astype(np.int32))


def test_int_to_float_magic_is_exact():
    n = np.concatenate([np.arange(-5000, 5001), np.int32([4194303, -4194303])]).astype(np.int32)
    assert np.array_equal(int_to_float_magic(n), n.astype(np.float32))


def test_packed_hi_lo_sums_unpack_exactly():
    rng = np.random.default_rng(2)
    for _ in range(2000):
        hi = rng.integers(-127, 128, (8, 4))                   # 8 lanes x 4 columns: one 32-column block
        lo = rng.integers(-127, 128, (8, 4))
        if rng.random() < 0.1:                                 # extremes: every code at a bound
            hi[:] = rng.choice([-127, 127])
            lo[:] = rng.choice([-127, 127])
        packed = (hi.sum(1) * 65536 + lo.sum(1)).astype(np.int32)
        for width in (4, 8):                                   # the 16-column then the 32-column sums
            total = packed[:width].sum(dtype=np.int32)
            ls = np.int32(np.int16(total & 0xFFFF))
            hs = (total - ls) >> 16
            assert ls == lo[:width].sum() and hs == hi[:width].sum()


def _byte_perm(x, y, s):
    """CUDA's __byte_perm(x, y, s): byte k of the result is byte (s >> 4k) & 7 of the 8-byte value y:x."""
    src = int(x & 0xFFFFFFFF) | int(y & 0xFFFFFFFF) << 32
    return sum(((src >> (8 * ((s >> (4 * k)) & 7))) & 0xFF) << (8 * k) for k in range(4))


def test_pack_s8_byte_permute_matches_shift_and_or():
    rng = np.random.default_rng(3)
    for v in rng.integers(-127, 128, (500, 4)):
        old = (int(v[0]) & 0xFF) | (int(v[1]) & 0xFF) << 8 | (int(v[2]) & 0xFF) << 16 | (int(v[3]) & 0xFF) << 24
        new = _byte_perm(_byte_perm(int(v[0]), int(v[1]), 0x0040), _byte_perm(int(v[2]), int(v[3]), 0x0040), 0x5410)
        assert new == old
