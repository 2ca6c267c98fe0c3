"""Inside the fused RoPE decode attention of a decode step: per-CTA globaltimer stamps (bench/lab; not a test).

Needs a library built with bench/lab/attention_stamps.patch (splitk_kernel's ROPE instantiations stamp split 0's CTAs
of query tile 0 and, where the row is split, the last split with keys, one record a launch a KV head each: entry, its pre-wait work done (plan, first tiles' copies, cos / sin),
pdl_wait returned, q staged (rotated, in shared memory), the tile loop done, the warps' merge weights, the output
written; an `lab_attn_stamps` entry point reads them), loaded through FLASHD_NATIVE_LIB; CUDA only:

    bash bench/prebuilt_lib.sh HEAD attn .libs bench/lab/attention_stamps.patch   (CPU machine)
    FLASHD_NATIVE_LIB=attn.so python bench/lab/attention_stamps.py MODEL [--depth 64 --depth 1000] [--reps 12]

Each depth: the decode graph replayed --reps times at that depth (n_past), every layer's records read back. Printed:
means over records, in us, of each phase, and the time from one layer's attention wait-return to the next layer's
(the layer's whole chain).
"""
from __future__ import annotations

import argparse
import ctypes
import os
import statistics

import numpy as np

MAGIC = 0x5441544142414C41
T0, TPRE, TW, TQ, TLOOP, TMERGE, TEND, NT, MAG, TCS = range(10)


class Lab:
    def __init__(self, path: str):
        self.fn = ctypes.CDLL(path).lab_attn_stamps
        self.fn.argtypes = [ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int, ctypes.c_void_p]
        info = (ctypes.c_int * 3)()
        self._call(None, None, 0, info)
        self.ring, self.heads, self.fields = list(info)

    def _call(self, dst, counts, reset, info=None):
        st = self.fn(dst, counts, reset, info)
        if st:
            raise SystemExit(f"lab_attn_stamps: error {st}")

    def reset(self):
        self._call(None, None, 1)

    def read(self):
        buf = np.zeros((self.ring, self.heads, self.fields), np.uint64)
        counts = np.zeros(self.heads, np.uint32)
        self._call(buf.ctypes.data_as(ctypes.c_void_p), counts.ctypes.data_as(ctypes.c_void_p), 0)
        return buf, counts


def summary(buf, counts, n_layers: int, heads=None):
    phases = {"plan, first copies": (T0, TCS), "RoPE cos / sin": (TCS, TPRE), "pre-wait work": (T0, TPRE), "wait (after pre-wait)": (TPRE, TW), "q staged": (TW, TQ),
              "tile loop": (TQ, TLOOP), "merge weights": (TLOOP, TMERGE), "output": (TMERGE, TEND),
              "wait -> end": (TW, TEND)}
    out = {k: [] for k in phases}
    tiles, layer = [], []
    for h in (range(buf.shape[1]) if heads is None else heads):
        n = min(int(counts[h]), buf.shape[0])
        recs = [buf[i, h] for i in range(n) if int(buf[i, h, MAG]) == MAGIC]
        for r in recs:
            for k, (a, b) in phases.items():
                out[k].append((int(r[b]) - int(r[a])) / 1e3)
            tiles.append(int(r[NT]) & 0xFFFFFFFF)
        for i in range(1, len(recs)):
            if i % n_layers:   # the same step
                layer.append((int(recs[i][TW]) - int(recs[i - 1][TW])) / 1e3)
    return out, tiles, layer


def main(argv=None) -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, action="append", default=[])
    ap.add_argument("--reps", type=int, default=12)
    ap.add_argument("--max-ctx", type=int, default=0, help="default: the largest depth + 256")
    args = ap.parse_args(argv)
    depths = args.depth or [64]
    path = os.environ.get("FLASHD_NATIVE_LIB")
    if not path:
        raise SystemExit("set FLASHD_NATIVE_LIB to a library built with bench/lab/attention_stamps.patch")
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.protocol.messages import SamplingParams

    max_ctx = args.max_ctx or max(depths) + 256
    engine = Engine(EngineConfig(model=args.model, device="cuda", max_ctx=max_ctx, prefix_cache=False,
                                 forward="graph"))
    engine.load()
    runner = engine.runner
    dev, lib = runner.dev, runner.dev.lib
    n_layers = runner.cfg.n_layers
    lab = Lab(path)
    prompt = [int(t) for t in np.random.default_rng(0).integers(0, 1000, max(depths))]
    for _ in runner.generate(prompt, SamplingParams(), 2):
        pass
    graph = runner._graph(None)
    print(f"max_ctx {max_ctx}")
    for depth in depths:
        for _ in range(4):
            runner._set_state(depth, depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        lab.reset()
        for _ in range(args.reps):
            runner._set_state(depth, depth)
            dev.native.check(lib.fd_graph_launch(graph, dev.stream), "graph launch")
        dev.synchronize()
        buf, counts = lab.read()
        half = lab.heads // 2
        for name, heads in (("split 0", range(half)), ("last split with keys", range(half, lab.heads))):
            out, tiles, layer = summary(buf, counts, n_layers, heads)
            if not tiles:
                continue
            print(f"\n=== depth {depth}, {name}: {len(out['q staged'])} records, tiles {statistics.fmean(tiles):.1f}, "
                  f"layer (wait to wait) {statistics.fmean(layer) if layer else float('nan'):.2f} us")
            for k, v in out.items():
                print(f"  {k:>22}: {statistics.fmean(v):7.2f} us (median {statistics.median(v):6.2f})")
        # the same launch's two records (record i of KV head h and of h + half): the last split's entry and wait
        # return after split 0's
        d_entry, d_wait, d_end = [], [], []
        for h in range(half):
            n = min(int(counts[h]), int(counts[h + half]), buf.shape[0])
            for i in range(n):
                a, b = buf[i, h], buf[i, h + half]
                if int(a[MAG]) == MAGIC and int(b[MAG]) == MAGIC:
                    d_entry.append((int(b[T0]) - int(a[T0])) / 1e3)
                    d_wait.append((int(b[TW]) - int(a[TW])) / 1e3)
                    d_end.append((int(b[TEND]) - int(a[TEND])) / 1e3)
        if d_entry:
            print(f"  last split - split 0: entry {statistics.fmean(d_entry):.2f} us, wait return "
                  f"{statistics.fmean(d_wait):.2f}, output written {statistics.fmean(d_end):.2f} ({len(d_entry)} pairs)")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
