"""Where a DFlash speculative step spends its time, phase by phase, on any backend.

    python bench/profile_dflash_step.py --device cpu|cuda [--target T.gguf --dflash D.gguf]
        [--mode chain|ddtree] [--budget 22] [--steps 24] [--prompt-len 64] [--sync]
        [--capture device|host|both] [--tree device|host|both] [--tuning FIELD=N,...]

Without --target/--dflash it makes synthetic ones (scripts/make_synthetic_gguf.py and
make_synthetic_dflash.py) in --workdir: by default tiny shapes; `--preset qwen2.5-1.5b --target-layers 6`
gives the real hidden size (1536) and vocabulary (151936) with few target layers, so the drafter's
host-side costs are those of the real drafter (drafter: 3 layers, block 16, 5 features as trained).

It runs one SpecDecoder request (random prompt ids, greedy) and wraps the step's parts:

    propose            the whole drafter step, containing
      inject             the injection forward (context K/V of the newly committed positions)
      block              the block's drafter layers (embed + layers); with --replay graph (the default path on
                         CUDA: the block is one replayed graph) also the lm_head
      lm_head            final norm + the target's lm_head over the B-1 masked rows (--replay eager only)
      host_copy          logits to host memory (reference / fallback path)
      topk               log_softmax + top-K (host), or the device top-K with its small read-back
    tree               the chain / DDTree build on the host (with --tree device the build is a kernel queued
                       between the drafter's top-K and the verify: no phase of its own)
    verify             the target forward over the tree + argmax, containing
      capture            target features copied out (host: capture_hidden's downloads during an eager
                         verify; device: capture_device's hand-over after the graph, whose copies are
                         inside the verify itself)
    device_step        --tree device: the whole step up to the commit (propose, the tree kernel, the verify, the
                       walk's one read-back), containing propose and commit
    commit             the target's KV compaction
    accept             the drafter's bookkeeping of the accepted rows, containing
      gather             device: the accepted rows gathered into the pending device buffers

--capture picks how verify forwards deliver the drafter's target features (drafter.py, "Device-resident
features"): `device` (the default path: a CUDA graph per tree size whose device copies fill the runner's
feature buffers, gathered on the device), `host` (the path before it: an eager verify whose hidden sink
downloads every wanted layer, re-uploaded for injection), or `both` -- one request each on the same warm
engine and drafter, printed side by side, so one run shows the gain. The prompt's features take the host
path in both.

--replay picks how the drafter's forwards run: `graph` (the default path: the block and the device rows'
injections replay CUDA graphs, speculative/replay.py) or `eager` (every op launched from Python, the path
before; the only one on the CPU backend, where both are the same).

Times are per step, in ms, inclusive of the nested phases. With --sync every phase boundary
synchronises the device, so each GPU phase is charged its own work; the sum then exceeds the real
step (the pipelining between phases is lost and every boundary costs a synchronisation). Without
--sync a GPU phase shows only its launch cost and the work lands in whichever later phase waits.
"""
from __future__ import annotations

import argparse
import subprocess
import sys
import time
from collections import defaultdict
from pathlib import Path

import numpy as np

PHASES = ("propose", "inject", "block", "lm_head", "host_copy", "topk", "tree", "verify", "capture", "device_step",
          "commit", "accept", "gather")
NESTED = {"inject", "block", "lm_head", "host_copy", "topk", "capture", "gather"}


class Phases:
    """Inclusive wall time per phase name; `sync` runs at both ends of every phase when set."""

    def __init__(self, sync=None):
        self.sync = sync
        self.reset()

    def reset(self) -> None:
        self.seconds: dict[str, float] = defaultdict(float)
        self.calls: dict[str, int] = defaultdict(int)

    def wrap(self, name: str, fn):
        def timed(*args, **kwargs):
            if self.sync:
                self.sync()
            t0 = time.perf_counter()
            try:
                return fn(*args, **kwargs)
            finally:
                if self.sync:
                    self.sync()
                self.seconds[name] += time.perf_counter() - t0
                self.calls[name] += 1
        return timed


def make_synthetic(workdir: Path, preset: str | None, target_layers: int) -> tuple[Path, Path]:
    workdir.mkdir(parents=True, exist_ok=True)
    target, dflash = workdir / f"target-{preset or 'tiny'}-{target_layers}.gguf", workdir / f"dflash-{preset or 'tiny'}.gguf"
    py = [sys.executable, "-m"]
    if not target.exists():
        shape = (["--preset", preset, "--random-blocks"] if preset else
                 ["--arch", "qwen2", "--hidden", "256", "--heads", "4", "--kv-heads", "2", "--ffn", "512", "--vocab", "1000"])
        subprocess.run(py + ["flashd.scripts.make_synthetic_gguf", str(target), "--layers", str(target_layers), "-q"]
                       + shape, check=True)
    if not dflash.exists():
        shape = (["--heads", "12", "--kv-heads", "2", "--head-dim", "128", "--ffn", "1536"] if preset else
                 ["--heads", "4", "--kv-heads", "2", "--head-dim", "64", "--ffn", "512"])
        subprocess.run(py + ["flashd.scripts.make_synthetic_dflash", str(dflash), "--target", str(target), "--layers",
                             "3", "--block-size", "16", "--features", str(min(5, target_layers - 1))] + shape, check=True)
    return target, dflash


def instrument(ph: Phases, engine, drafter, host_topk: str, replay: str = "graph") -> None:
    """Wrap the step's parts (instance attributes and the drafter module's functions), once per process;
    each request's decoder is wrapped by instrument_decoder. replay "graph": the block is one phase (its replay
    cannot be split, nor synchronised inside); "eager": the drafter's forwards run op by op, block and lm_head
    timed apart."""
    from flashd.daemon.models import dflash as model
    from flashd.daemon.speculative import dflash_drafter as dd
    from flashd.daemon.speculative.replay import EagerReplay

    ops = drafter.ops
    if replay == "graph":
        drafter._block_forward = ph.wrap("block", drafter._block_forward)
    else:
        drafter._replay = EagerReplay()
        instrument_block(ph, dd, model)
    if host_topk == "reference":
        from flashd.daemon.speculative.dflash_topk import topk_logprobs_reference
        dd.topk_logprobs, drafter._device_topk = topk_logprobs_reference, None
        drafter.device_proposals = False            # the host's top-K: no candidates left on the device
    dd.topk_logprobs = ph.wrap("topk", dd.topk_logprobs)
    to_numpy = ops.to_numpy
    ops.to_numpy = lambda t: (ph.wrap("host_copy", to_numpy)(t) if t.shape[-1] == drafter.head.output.shape[0]
                              else to_numpy(t))
    if drafter._device_topk is not None:
        drafter._device_topk = ph.wrap("topk", drafter._device_topk)
    drafter._inject_pending = ph.wrap("inject", drafter._inject_pending)
    drafter.propose = ph.wrap("propose", drafter.propose)
    drafter.propose_device = ph.wrap("propose", drafter.propose_device)
    drafter.capture_hidden = ph.wrap("capture", drafter.capture_hidden)
    drafter.capture_device = ph.wrap("capture", drafter.capture_device)
    drafter._gather = ph.wrap("gather", drafter._gather)
    drafter.accept = ph.wrap("accept", drafter.accept)
    engine.runner.commit_tree = ph.wrap("commit", engine.runner.commit_tree)


def instrument_block(ph: Phases, dd, model) -> None:
    """The eager block split in two phases (models/dflash.draft_block's body)."""

    def draft_block(ops_, cfg, w, head, cache, batch):       # models/dflash.draft_block, split in two phases
        def layers():
            h = ops_.embed(head.token_embd, batch.ids)
            for i, layer in enumerate(w.layers):
                ops_.begin_layer(i)
                h = model.decoder_layer(ops_, cfg.model, h, layer, cache.layer(i), batch)
            ops_.begin_layer(len(w.layers))
            return h
        h = ph.wrap("block", layers)()
        return ph.wrap("lm_head", lambda: ops_.linear(ops_.rmsnorm(h[1:], w.output_norm, cfg.model.rms_eps),
                                                      head.output))()

    dd.draft_block = draft_block


def instrument_decoder(ph: Phases, decoder) -> None:
    decoder._tree = ph.wrap("tree", decoder._tree)
    decoder._verify = ph.wrap("verify", decoder._verify)
    decoder._device_step = ph.wrap("device_step", decoder._device_step)


def profile(ph: Phases, engine, drafter, cfg, prompt, steps: int) -> dict:
    """One timed request after a warm-up one (graphs of this capture path, arenas, first-call costs): ms per
    step of every phase, the step's wall time and the decoder's stats."""
    from flashd.daemon.speculative.decoder import SpecDecoder
    from flashd.protocol.messages import SamplingParams

    for _ in SpecDecoder(engine.runner, drafter, cfg).generate(prompt, SamplingParams(), 8):
        pass
    dec = SpecDecoder(engine.runner, drafter, cfg)
    instrument_decoder(ph, dec)
    ph.reset()
    t0 = time.perf_counter()
    for _ in dec.generate(prompt, SamplingParams(), steps * 2 + 2):
        if dec.stats.steps >= steps:
            break
    wall = time.perf_counter() - t0
    n = max(dec.stats.steps, 1)
    ms = {name: 1e3 * ph.seconds[name] / n for name in PHASES if ph.calls.get(name)}
    ms.update({"step (wall)": 1e3 * wall / n, "draft (stats)": 1e3 * dec.stats.draft_s / n,
               "verify (stats)": 1e3 * dec.stats.verify_s / n})
    return {"ms": ms, "steps": n, "tokens_per_step": (dec.stats.accepted + n) / n}


def main(argv=None) -> int:
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--device", choices=("cpu", "cuda"), default="cpu")
    p.add_argument("--target", type=Path)
    p.add_argument("--dflash", type=Path)
    p.add_argument("--preset", help="synthetic target shapes (make_synthetic_gguf --preset), e.g. qwen2.5-1.5b")
    p.add_argument("--target-layers", type=int, default=6, help="synthetic target: decoder layers")
    p.add_argument("--workdir", type=Path, default=Path("/tmp/flashd-profile-dflash"))
    p.add_argument("--mode", choices=("chain", "ddtree"), default="ddtree")
    p.add_argument("--budget", type=int, default=22)
    p.add_argument("--steps", type=int, default=24, help="speculative steps to time (after one warm-up request)")
    p.add_argument("--prompt-len", type=int, default=64)
    p.add_argument("--sync", action="store_true", help="synchronise the device at every phase boundary")
    p.add_argument("--host-topk", choices=("fast", "reference"), default="fast",
                   help="reference: the full-argsort definition on the host (the cost before dflash_topk.py); "
                        "CUDA: also turns the device top-K off")
    p.add_argument("--tuning", default="", metavar="FIELD=N,...",
                   help="launch tuning overrides (flashd_tuning.h; cuda), set before anything is captured")
    p.add_argument("--capture", choices=("device", "host", "both"), default="device",
                   help="how verify forwards deliver the drafter's features: device-resident (graph verify), "
                        "host (eager verify, the path before), or both side by side")
    p.add_argument("--tree", choices=("device", "host", "both"), default="device",
                   help="where greedy steps build the tree: on the device (SpecConfig.device_tree, the default where "
                        "runner and drafter can) or on the host (tree.py); both: one request each, side by side")
    p.add_argument("--replay", choices=("graph", "eager"), default="graph",
                   help="the drafter's forwards as replayed CUDA graphs (the default path) or op by op")
    args = p.parse_args(argv)

    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.daemon.speculative.decoder import SpecConfig
    from flashd.daemon.speculative.loader import DrafterContext, load_drafter

    target, dflash = args.target, args.dflash
    if target is None or dflash is None:
        target, dflash = make_synthetic(args.workdir, args.preset, args.target_layers)
    engine = Engine(EngineConfig(model=str(target), device=args.device, max_ctx=1024, prefill_chunk=256))
    engine.load()
    if args.tuning:
        from flashd.daemon.bench_cli import parse_tuning
        print("# tuning:", engine.backend.device.native.set_tuning(**parse_tuning(args.tuning)))
    ctx = DrafterContext(backend=engine.backend, target_file=engine.model.file, target_model=engine.model,
                         max_ctx=engine.config.max_ctx, prefill_chunk=engine.config.prefill_chunk)
    drafter = load_drafter(str(dflash), ctx)
    if hasattr(engine.runner, "drop_graphs"):
        engine.runner.drop_graphs()          # the drafter may have grown the shared buffers (engine.py does this)
    dev = getattr(engine.backend.ops, "dev", None)
    ph = Phases(dev.synchronize if (args.sync and dev is not None) else None)
    prompt = np.random.default_rng(0).integers(0, min(engine.model.config.vocab_size, 20000), args.prompt_len).tolist()
    instrument(ph, engine, drafter, args.host_topk, args.replay)
    captures = ("host", "device") if args.capture == "both" else (args.capture,)
    trees = ("host", "device") if args.tree == "both" else (args.tree,)
    results = {}
    for capture in captures:
        for tree in trees:
            drafter.device_features = capture == "device"
            cfg = SpecConfig(args.mode, args.budget, device_tree=tree == "device")
            results[f"{capture}/{tree}"] = profile(ph, engine, drafter, cfg, prompt, args.steps)
    paths = tuple(results)
    print(f"# DFlash step profile: device {args.device}, {args.mode} budget {args.budget}, replay {args.replay}, sync "
          f"{'on' if ph.sync else 'off'}; "
          + ", ".join(f"capture/tree {p}: {r['steps']} steps, {r['tokens_per_step']:.2f} tokens/step"
                      for p, r in results.items()))
    print(f"# target {target.name}, drafter {dflash.name}, top-K {'device' if drafter._device_topk else 'host'} "
          f"({args.host_topk}); ms per step (nested phases indented, inclusive); step (wall) includes the "
          "prompt's prefill once")
    print(f"{'phase':<16}" + "".join(f"{p:>16}" for p in paths))
    names = [n for n in PHASES + ("step (wall)", "draft (stats)", "verify (stats)")
             if any(n in r["ms"] for r in results.values())]
    for name in names:
        label = ("    " if name in NESTED else "") + name
        print(f"{label:<16}" + "".join(f"{results[p]['ms'].get(name, 0.0):16.3f}" for p in paths))
    return 0


if __name__ == "__main__":
    sys.exit(main())
