"""Where a decode step's time goes: the step captured as a CUDA graph with a timing event after
every kernel launch, replayed, and the time between consecutive events summed per op.

    python bench/profile_decode.py MODEL [--depth 128] [--reps 50] [--pdl] [--kv-type f16|q8_0|q4_0|K/V]

Event nodes serialise the graph (no programmatic dependent launch across them, so PDL is off here
unless --pdl: the launch tuning's pdl field, flashd_tuning.h, for a like-for-like view), so per-op
times include each kernel's launch latency and the sum is a little above the real step time, which
is printed first (the plain graph, no events).
"""
from __future__ import annotations

import argparse
import time
from collections import defaultdict

import numpy as np

from flashd.daemon.backends.kv_types import KVTypes
from flashd.daemon.config import EngineConfig
from flashd.daemon.engine import Engine
from flashd.protocol.messages import SamplingParams


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("model")
    ap.add_argument("--depth", type=int, default=128, help="context slots before the profiled step")
    ap.add_argument("--reps", type=int, default=50)
    ap.add_argument("--pdl", action="store_true", help="keep programmatic dependent launch on (the tuning's default)")
    ap.add_argument("--kv-type", default="f16", help="the KV cache's type: one for K and V, or K/V (e.g. q8_0/f16)")
    args = ap.parse_args()
    k_type, _, v_type = args.kv_type.partition("/")
    engine = Engine(EngineConfig(model=args.model, device="cuda", max_ctx=args.depth + 256, prefix_cache=False,
                                 kv_types=KVTypes(k=k_type, v=v_type or k_type)))
    if not args.pdl:
        engine.backend.device.native.set_tuning(pdl=0)   # before load: the graphs are captured without it
    engine.load()
    runner = engine.runner
    dev, lib, ffi, ops = runner.dev, runner.dev.lib, runner.dev.ffi, runner.ops
    prompt = list(np.random.default_rng(0).integers(0, 1000, args.depth))
    for _ in runner.generate(prompt, SamplingParams(), 2):
        pass

    def time_graph(graph) -> float:
        runner._set_state(args.depth, args.depth)
        for _ in range(5):
            lib.fd_graph_launch(graph, dev.stream)
        dev.synchronize()
        t0 = time.perf_counter()
        for _ in range(args.reps):
            runner._set_state(args.depth, args.depth)   # same depth every replay
            lib.fd_graph_launch(graph, dev.stream)
        dev.synchronize()
        return (time.perf_counter() - t0) / args.reps * 1e6

    plain = runner._graph(None)
    print(f"decode step (graph, no events): {time_graph(plain):.1f} us "
          "(includes the host's state upload per replay)")
    ops.trace = []
    start = ffi.new("void**")
    lib.fd_event_create(start, 1)
    dev.native.check(lib.fd_graph_begin_capture(dev.stream), "capture")
    lib.fd_event_record_external(start[0], dev.stream)
    runner._decode_body(None)
    out = ffi.new("void**")
    dev.native.check(lib.fd_graph_end_capture(dev.stream, out), "end capture")
    trace, ops.trace = ops.trace, None
    time_graph(out[0])
    per_op, count = defaultdict(float), defaultdict(int)
    prev = start[0]
    ms = ffi.new("float*")
    total = 0.0
    for name, ev in trace:
        dev.native.check(lib.fd_event_elapsed_ms(ms, prev, ev), "elapsed")
        per_op[name] += ms[0] * 1e3
        count[name] += 1
        total += ms[0] * 1e3
        prev = ev
    print(f"with an event after each of {len(trace)} launches: {total:.1f} us")
    print(f"{'op':28} {'launches':>8} {'us/step':>9} {'us each':>8} {'share':>6}")
    for name, us in sorted(per_op.items(), key=lambda kv: -kv[1]):
        print(f"{name:28} {count[name]:8d} {us:9.1f} {us / count[name]:8.2f} {us / total * 100:5.1f}%")


if __name__ == "__main__":
    main()
