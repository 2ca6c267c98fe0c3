"""The VRAM plan (daemon/vram_sizes.py, vram_ledger.py) against what the CUDA backend really allocates,
measured as cudaMemGetInfo deltas of this process: after loading a target, a draft model, a DFlash
drafter and a PFlash drafter, at the lowest free memory seen during a compression of a prompt as long
as the PFlash drafter's context (its peak), after parking the target, and with the persistent forward.

Each test prints planned vs measured per step (run with -s to read them). What must hold: the measured
use never exceeds the plan by more than its safety margin (which also covers cudaMalloc's rounding, CUDA
graphs and the kernels' own tables), and the plan is not wildly above it (>= 90% of the planned bytes are
really allocated at the peak)."""
import gc
import threading

import numpy as np
import pytest

from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

MiB = 1 << 20
VOCAB = 8192
TARGET = dict(arch="qwen2", n_layers=8, hidden=1024, n_heads=8, n_kv_heads=2, head_dim=128, ffn=2816,
              vocab_size=VOCAB, seed=41)
DRAFT = dict(arch="qwen2", n_layers=2, hidden=512, n_heads=8, n_kv_heads=2, head_dim=64, ffn=1408, vocab_size=VOCAB,
             seed=42)
PFLASH = dict(arch="qwen2", n_layers=4, hidden=512, n_heads=8, n_kv_heads=2, head_dim=64, ffn=1408, vocab_size=VOCAB,
              context_length=16384, seed=43)


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    d = tmp_path_factory.mktemp("vram-gpu")
    return {"target": str(write_synthetic_model(d / "tgt.gguf", SyntheticSpec(name="tgt", **TARGET))),
            "draft": str(write_synthetic_model(d / "drf.gguf", SyntheticSpec(name="drf", **DRAFT))),
            "pflash": str(write_synthetic_model(d / "pfl.gguf", SyntheticSpec(name="pfl", **PFLASH))),
            "dflash": str(write_synthetic_dflash(d / "dfl.gguf", spec_for_target(
                1024, 8, VOCAB, n_features=3, n_layers=1, n_heads=8, n_kv_heads=2, head_dim=128, ffn=2816,
                block_size=16, seed=44)))}


def _free(dev) -> int:
    dev.synchronize()
    gc.collect()
    return dev.mem_info()[0]


def _report(title: str, plan, phase: str, measured: int, transient: int = 0) -> tuple[int, int]:
    planned = plan.phase_bytes(phase) - plan.margin_bytes - transient
    print(f"\n== {title}: planned {planned / MiB:.1f} MiB ({phase}, margin {plan.margin_bytes / MiB:.0f} MiB apart), "
          f"measured {measured / MiB:.1f} MiB, measured - planned {(measured - planned) / MiB:+.1f} MiB")
    for line in plan.lines():
        print(line)
    return planned, measured


def _ask(engine, req):
    done, out = threading.Event(), []
    engine.submit(req, lambda e: (out.append(e), e["event"] in ("done", "result", "error") and done.set()))
    assert done.wait(300)
    return out[-1]


def _engine(models, *, drafts=("draft", "dflash"), prefill="pflash", forward="graph", max_ctx=16384):
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.daemon.pflash.config import PFlashConfig
    return Engine(EngineConfig(model=models["target"], device="cuda", max_ctx=max_ctx,
                               drafts=tuple(models[d] for d in drafts), forward=forward,
                               prefill_drafter=models[prefill] if prefill else None,
                               pflash=PFlashConfig(forward_chunk=4096)))


def _check(planned: int, measured: int, margin: int) -> None:
    assert measured <= planned + margin, f"measured {measured} > planned {planned} + margin {margin}"
    assert measured >= 0.9 * planned, f"the plan ({planned}) is far above what was allocated ({measured})"


def test_plan_covers_load_and_the_compression_peak(native, models):
    from flashd.protocol import messages as m
    engine = _engine(models)
    dev = engine.backend.device
    free0 = _free(dev)
    engine.load()
    engine.start()
    try:
        plan = engine.vram_plan()
        pf = next(c for c in plan.components if c.role == "prefill_drafter")
        transient = sum(n for what, n in pf.parts if what in ("arena", "kv_cache", "scores", "inputs"))
        _check(*_report("after load", plan, "serving", free0 - _free(dev), transient), plan.margin_bytes)
        drafter = engine.compressor.drafter
        low = [free0]
        for name in ("kv_cache", "from_numpy", "reserve_arena"):      # the free memory after each allocation
            original = getattr(drafter.ops, name)

            def watched(*args, _original=original):
                out = _original(*args)
                low[0] = min(low[0], dev.mem_info()[0])
                return out
            setattr(drafter.ops, name, watched)
        n = dict(plan.settings)["prefill_drafter_tokens"]
        prompt = [int(t) for t in np.random.default_rng(3).integers(0, VOCAB - 10, n)]
        r = _ask(engine, m.Compress("c", ids=prompt, keep=0.05))
        assert r["event"] == "result", r
        _check(*_report(f"compressing {n} tokens (lowest free)", plan, "serving", free0 - low[0]), plan.margin_bytes)
        assert _ask(engine, m.Park("p", what="target"))["parked"]["target"] is True
        parked = engine.vram_plan()
        # the PFlash drafter's arena stays reserved after a compression; its KV cache and scores are gone
        _check(*_report("target parked", parked, "target parked", free0 - _free(dev),
                        sum(n for what, n in pf.parts if what in ("kv_cache", "scores", "inputs"))), plan.margin_bytes)
        assert _ask(engine, m.Unpark("u", what="target"))["parked"]["target"] is False
    finally:
        engine.stop(10)


@pytest.mark.parametrize("forward", ["graph", "persistent"])
def test_plan_covers_a_target_alone(native, models, forward):
    from flashd.protocol import messages as m
    engine = _engine(models, drafts=(), prefill=None, forward=forward, max_ctx=32768)
    dev = engine.backend.device
    free0 = _free(dev)
    engine.load()
    engine.start()
    try:
        r = _ask(engine, m.Generate("g", ids=list(range(1, 600)), max_tokens=8, ignore_eos=True, stream=False))
        assert r["event"] == "done", r
        plan = engine.vram_plan()
        assert any(what == "persistent_forward" for what, _ in plan.components[0].parts) == (
            engine.runner.forward_path == "persistent")
        _check(*_report(f"target alone ({forward})", plan, "serving", free0 - _free(dev)), plan.margin_bytes)
    finally:
        engine.stop(10)


def test_budget_below_the_plan_is_refused_before_allocating(native, models):
    from flashd.daemon.config import EngineConfig
    from flashd.daemon.engine import Engine
    from flashd.daemon.models.gguf_file import ModelLoadError
    probe = _engine(models, drafts=("draft",), prefill=None)
    probe.load()
    need = probe.vram_plan().peak_bytes
    del probe
    engine = Engine(EngineConfig(model=models["target"], device="cuda", max_ctx=16384, drafts=(models["draft"],),
                                 vram_budget=need - MiB))
    before = _free(engine.backend.device)
    with pytest.raises(ModelLoadError, match="does not fit --vram-budget"):
        engine.load()
    assert abs(_free(engine.backend.device) - before) < 4 * MiB          # nothing was left allocated
