"""Device.upload_staged on the GPU: uploads that do not synchronise stay in stream order. One small buffer is
overwritten by many staged uploads, each followed by a device copy of it into its own slot of a large tensor (the
kernel-side reader), with the ring small enough to wrap several times: every slot must hold its own upload's
values (a copy that read the ring after it was rewritten, or ran after the next upload, would not)."""
import numpy as np

from flashd.daemon.backends.cuda import tensor
from flashd.daemon.backends.cuda.tensor import Device


def test_staged_uploads_keep_stream_order(native, monkeypatch):
    monkeypatch.setattr(tensor, "STAGE_BYTES", 64 * 1024)
    dev = Device(native)                           # its own stream and ring (made at the patched size)
    n, width = 400, 96                             # 400 x 384 bytes (+ alignment): the ring wraps ~2-3 times
    buf = dev.empty((width,), np.int32)
    slots = dev.empty((n, width), np.int32)
    rng = np.random.default_rng(7)
    want = rng.integers(-2**31, 2**31 - 1, (n, width), dtype=np.int64).astype(np.int32)
    for i in range(n):
        dev.upload_staged(want[i], buf)
        dev.copy(slots[i:i + 1], buf)
    np.testing.assert_array_equal(dev.download(slots), want)
