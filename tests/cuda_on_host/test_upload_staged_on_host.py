"""Device.upload_staged (tensor.py) without a GPU: the bytes arrive, the pinned ring wraps (with a synchronize),
uploads larger than STAGE_MAX take upload()'s synchronous path, and a staged upload during a graph capture is
refused. The stand-in copies at once, so stream ordering is the GPU test's part
(tests/gpu/test_upload_staged_gpu.py)."""
from __future__ import annotations

import numpy as np
import pytest

from flashd.daemon.backends.cuda import tensor
from flashd.daemon.backends.cuda.tensor import Device
from tests.cuda_on_host.test_cuda_kv_prefix_on_host import HostNative


class CountingNative(HostNative):
    def __init__(self):
        super().__init__()
        self.syncs = 0
        lib = self.lib
        original = lib.fd_stream_synchronize

        def sync(stream):
            self.syncs += 1
            return original(stream)
        lib.fd_stream_synchronize = sync


def test_bytes_arrive_across_many_wraps(monkeypatch):
    monkeypatch.setattr(tensor, "STAGE_BYTES", 4096)
    monkeypatch.setattr(tensor, "STAGE_MAX", 1024)
    native = CountingNative()
    dev = Device(native)
    out = dev.empty((200,), np.int32)
    rng = np.random.default_rng(0)
    for i in range(40):                            # 40 x (800 bytes, 64-aligned: 832) = 8 wraps of a 4 KB ring
        a = rng.integers(-1000, 1000, 200).astype(np.int32)
        dev.upload_staged(a, out)
        np.testing.assert_array_equal(dev.download(out), a)
    assert native.syncs > 40                       # download()'s 40, and the wraps' own


def test_ring_synchronises_only_when_it_wraps(monkeypatch):
    monkeypatch.setattr(tensor, "STAGE_BYTES", 4096)
    monkeypatch.setattr(tensor, "STAGE_MAX", 1024)
    native = CountingNative()
    dev = Device(native)
    out = dev.empty((16,), np.int32)
    for i in range(64):                            # 64 bytes each: 64 uploads fill 4096 bytes exactly
        dev.upload_staged(np.full(16, i, np.int32), out)
    assert native.syncs == 0
    dev.upload_staged(np.full(16, 99, np.int32), out)
    assert native.syncs == 1
    np.testing.assert_array_equal(dev.download(out), np.full(16, 99, np.int32))


def test_large_uploads_and_bad_calls(monkeypatch):
    monkeypatch.setattr(tensor, "STAGE_MAX", 64)
    native = CountingNative()
    dev = Device(native)
    big = np.arange(100, dtype=np.float32)
    out = dev.empty((100,), np.float32)
    dev.upload_staged(big, out)                    # 400 bytes > STAGE_MAX: upload(), which synchronises
    assert native.syncs == 1
    np.testing.assert_array_equal(dev.download(out), big)
    with pytest.raises(ValueError, match="bytes"):
        dev.upload_staged(np.zeros(3, np.float32), out)
    dev.capturing = True
    with pytest.raises(RuntimeError, match="capture"):
        dev.upload_staged(np.zeros(100, np.float32), out)
