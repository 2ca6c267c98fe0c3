"""The VRAM plan's sizes against hand-computed ones for synthetic models (daemon/vram_sizes.py), and the
ledger's composition of them into phases and refusals (daemon/vram_ledger.py) -- no GPU: the CUDA
backend's sizes take the native library's two workspace counts as functions, stubbed here.

The synthetic target: qwen2, 2 layers, hidden 256, 4 heads of 64, 2 KV heads, ffn 512, vocab 512, untied,
every matrix Q8_0 (34 bytes per 32 values), every vector F32."""
from pathlib import Path

import pytest

from flashd.daemon.models import open_model
from flashd.daemon.models.dflash_weights import open_dflash
from flashd.daemon.pflash.config import PFlashConfig
from flashd.daemon.pflash.drafter import chunk_bounds
from flashd.daemon.vram_budget import MiB
from flashd.daemon.vram_ledger import LedgerState, VramLedger
from flashd.daemon.vram_sizes import (CudaSizes, HostSizes, _pflash_shape, describe_dflash, describe_model,
                                      persistent_forward_bytes)
from flashd.scripts.make_synthetic_dflash import spec_for_target, write_synthetic_dflash
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model

# This file's models, whose sizes the checks below compute by hand; test_vram_engine.py's have the same shape
# but smaller numbers (the engine runs them), so each file keeps its own.
TARGET = SyntheticSpec(arch="qwen2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=512,
                       seed=21, name="tgt")
DRAFT = SyntheticSpec(arch="qwen2", n_layers=1, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=512,
                      seed=22, name="drf")
PFLASH = SyntheticSpec(arch="qwen2", n_layers=2, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=512,
                       context_length=4096, seed=23, name="pfl")
BIG_PFLASH = SyntheticSpec(arch="qwen2", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, ffn=512, vocab_size=512,
                           context_length=8192, seed=25, name="big")
DFLASH = spec_for_target(256, 2, 512, n_features=2, n_layers=1, head_dim=64, block_size=8, seed=24)

# per layer: q 256x256, k and v 128x256, o 256x256, gate and up 512x256, down 256x512 values
LAYER_VALUES = 65536 + 2 * 32768 + 65536 + 3 * 131072
LAYER_VECTOR_VALUES = 256 + 256 + 256 + 128 + 128         # attn_norm, ffn_norm, q/k/v biases (qwen2)
GLOBAL_VALUES = 2 * 512 * 256                              # token_embd, output
CUDA_WEIGHTS = 2 * LAYER_VALUES * 34 // 32 + GLOBAL_VALUES * 34 // 32 + 4 * (2 * LAYER_VECTOR_VALUES + 256)
HOST_WEIGHTS = 4 * (2 * LAYER_VALUES + GLOBAL_VALUES + 2 * LAYER_VECTOR_VALUES + 256)


def attention_ws(n_heads, n_kv_heads, head_dim, max_ctx, n_tokens):
    """A stand-in for the native workspace count whose value says which arguments it got."""
    return 1_000_000 * n_tokens + max_ctx


def sample_ws(vocab):       # sampling.cu fd_sample_workspace_bytes: align_up(V, 64) * (float + 2 int32)
    return -(-vocab // 64) * 64 * 12


@pytest.fixture(scope="module")
def files(tmp_path_factory) -> dict[str, Path]:
    d = tmp_path_factory.mktemp("vram-models")
    return {"target": write_synthetic_model(d / "tgt.gguf", TARGET),
            "draft": write_synthetic_model(d / "drf.gguf", DRAFT),
            "pflash": write_synthetic_model(d / "pfl.gguf", PFLASH),
            "big": write_synthetic_model(d / "big.gguf", BIG_PFLASH),
            "dflash": write_synthetic_dflash(d / "dfl.gguf", DFLASH)}


@pytest.fixture(scope="module")
def target(files):
    return describe_model("tgt", *open_model(files["target"]))


def test_weights_as_each_backend_uploads_them(target):
    assert CudaSizes(attention_ws, sample_ws).weights(target.tensors) == CUDA_WEIGHTS == 1_541_120
    assert HostSizes().weights(target.tensors) == HOST_WEIGHTS == 5_776_384
    # the head a DFlash drafter borrows: token_embd and output, 512x256 each
    assert CudaSizes(attention_ws, sample_ws).weights(target.head) == 2 * 512 * 256 * 34 // 32


def test_cuda_target_parts_and_shared_needs(target):
    parts, need = CudaSizes(attention_ws, sample_ws).model(target, max_ctx=1024, prefill_chunk=512, kv_type="f16")
    parts = dict(parts)
    assert parts["weights"] == CUDA_WEIGHTS
    assert parts["kv_cache"] == 2 * 2 * 2 * 1024 * 64 * 2                # K+V x layers x KV heads x slots x d x f16
    # CudaRunner: p_ids + p_pos (2 x 512) + p_n_past + 5 state words + history (1025) + tree inputs for 65 nodes
    # (2 x 65 + 1 + ceil(65 x 65 / 4) = 1188) + commit (66) + argmax (65) int32 words, and the sampler's workspace
    assert parts["runner"] == 4 * (1025 + 5 + 1025 + 1188 + 66 + 65) + 512 * 12
    assert set(parts) == {"weights", "kv_cache", "runner"}
    # one layer of a 512-token chunk in float32, each tensor 256-byte aligned: embedding, q, k, v, attention out,
    # o-proj, 3 norms, 2 qk-norms (512 x 256 x 4 = 512 KiB each, k and v half that), swiglu (1 MiB), down;
    # larger than the head (2 KiB + 128 KiB + 2 x 64 KiB), plus 1 MiB
    assert need.arena_half == 11 * 524288 + 1048576 + 1048576
    assert need.scratch_elems == 512 * 256                               # the largest matrix (gate/up/down)
    assert need.attention == attention_ws(4, 2, 64, 1024, 65)             # masked batches of a 65-node tree


def test_cuda_shared_buffers_take_the_largest_need(target, files):
    sizes = CudaSizes(attention_ws, sample_ws)
    _, t = sizes.model(target, 1024, 512, "f16")
    _, d = sizes.model(describe_model("drf", *open_model(files["draft"])), 1024, 512, "f16")
    assert dict(sizes.shared([t, d])) == {"arena": 2 * t.arena_half, "scratch": 4 * 512 * 256,
                                          "attention_workspace": t.attention}
    assert sizes.shared([]) == []


def test_host_target_is_float32_weights_and_kv(target):
    parts, _ = HostSizes().model(target, 1024, 512, "f32")
    assert dict(parts) == {"weights": HOST_WEIGHTS, "kv_cache": 2 * 2 * 2 * 1024 * 64 * 4}


def test_dflash_parts(files):
    desc = describe_dflash("dfl", *open_dflash(files["dflash"]))
    parts, need = CudaSizes(attention_ws, sample_ws).dflash(desc, max_ctx=1024, kv_type="f16")
    parts = dict(parts)
    # a 2-layer target leaves one feature layer: fc 256x256; one layer of q 256x256, k and v 128x256, o 256x256,
    # gate/up 128x256, down 256x128 (Q8_0); hidden_norm, output_norm, attn_norm, ffn_norm (256), q/k norms (64): F32
    assert desc.cfg.n_features == 1
    assert parts["weights"] == ((256 * 256 + 65536 + 2 * 32768 + 65536 + 3 * 32768) * 34 // 32
                                + 4 * (4 * 256 + 2 * 64))
    assert parts["kv_cache"] == 2 * 1 * 2 * (1024 + 8) * 64 * 2          # max_ctx + B slots
    assert parts["mask"] == 8 * 8
    # two injections of 128 rows of 1 feature of 256 floats (+ positions, start), and a block's ids/positions/n
    assert parts["inputs"] == 2 * (128 * 256 * 4 + 128 * 4 + 4) + (2 * 8 * 4 + 4)
    assert parts["topk"] == 7 * 8 * 12         # the device top-K's ids + log-probs for B-1 depths, K = 8
    # device-resident features of 1 target layer: 128 pending rows + the runner's 65 verify rows, 256 floats
    assert parts["features"] == 1 * (128 + 65) * 256 * 4
    assert need.attention == attention_ws(4, 2, 64, 1032, 8) and need.arena_half == 0


def test_pflash_parts(files):
    desc = describe_model("pfl", *open_model(files["pflash"]))
    pc = PFlashConfig()                                     # forward_chunk 4096, tail 8, block 128
    parts = dict(CudaSizes(attention_ws, sample_ws).pflash(desc, pc, 4096, "f16"))
    assert parts["weights"] == CUDA_WEIGHTS                 # the same shapes as the target
    assert parts["scratch"] == 4 * 512 * 256
    # Drafter.tail_probs: one layer of a 4096-token chunk (8x the 512-token layer) + FlashPrefill's scratch over
    # 32 key blocks: 4 x (2 x 32 x 4 x 32 scores + 32 x 128 mean K + 2 x 8 x 4 tail) + 8 x 256; two halves
    assert parts["arena"] == 2 * ((11 * 524288 + 1048576) * 8 + 1048576 + 4 * (2 * 32 * 4 * 32 + 32 * 128 + 64) + 2048)
    assert parts["kv_cache"] == 2 * 2 * 2 * 4096 * 64 * 2     # every layer, the prompt's whole blocks
    assert parts["scores"] == 4 * 8 * 4096 and parts["inputs"] == 2 * (8 * 4096 + 4)
    host = dict(HostSizes().pflash(desc, pc, 4096, "f32"))
    assert host == {"weights": HOST_WEIGHTS, "kv_cache": 2 * 2 * 2 * 4096 * 64 * 4, "scores": 4 * 8 * 4096}


@pytest.mark.parametrize("chunk,tail", [(128, 8), (256, 8), (256, 1)])
def test_pflash_longest_chunk_bounds_every_prompt_up_to_the_limit(chunk, tail):
    pc = PFlashConfig(forward_chunk=chunk, tail_tokens=tail)
    for limit in (1, 7, 100, chunk, chunk + 3, chunk + tail - 1, chunk + 50, 3 * chunk + 2, 5 * chunk):
        seen = max(e - s for n in range(1, limit + 1) for s, e in chunk_bounds(n, chunk, min(tail, n)))
        longest, n_tail, n_blocks = _pflash_shape(None, pc, limit)
        assert longest == seen, (limit, longest, seen)
        assert n_tail == min(tail, limit) and n_blocks == -(-limit // 128)


def test_persistent_forward_workspace_by_hand(target):
    cfg = target.cfg          # 8 rows, 132 CTAs, max_ctx 1024: 16 splits; group 2 -> one head tile; 11 stages
    got = persistent_forward_bytes(cfg, 1024, rows=8, n_ctas=132, attn_splits=32)
    f = 4
    pieces = [8 * 256 * f, 8 * 256 * f, 8 * 128 * f, 8 * 128 * f, 8 * 256 * f, 8 * 512 * f, 8 * 512 * f,
              2 * 8 * 32 * f, 8 * 4 * 16 * 66 * f, 132 * 8 * f, 132 * 8 * 4, 8 * 2 * 1 * 4, 12 * 4,
              2 * 8 * 256 * f, 11 * 132 * 4 * 8]
    assert got == sum(-(-p // 256) * 256 for p in pieces) + 2 * 32 + 9 * 4
    parts, _ = CudaSizes(attention_ws, sample_ws, n_sms=132, tuning_rows=8, persistent=True).model(
        target, 1024, 512, "f16")
    assert dict(parts)["persistent_forward"] == got


# -- the ledger: components, phases, refusals ---------------------------------------------------------------

def ledger(files, *, budget, drafts=("draft", "dflash"), policy="resident", max_ctx=1024, margin=MiB):
    target = describe_model("tgt", *open_model(files["target"]))
    drafters = {"drf": describe_model("drf", *open_model(files["draft"])),
                "dfl": describe_dflash("dfl", *open_dflash(files["dflash"])), "ngram": None}
    drafters = {k: v for k, v in drafters.items() if k == "ngram" or {"drf": "draft", "dfl": "dflash"}[k] in drafts}
    led = VramLedger(CudaSizes(attention_ws, sample_ws), target, drafters, max_ctx=max_ctx, prefill_chunk=512,
                     pflash=PFlashConfig(drafter_policy=policy), budget=budget, margin=margin,
                     default_pflash=str(files["pflash"]))
    led.describe_pflash(str(files["pflash"]))
    return led


def test_ledger_phases_with_a_dflash_drafter_and_the_resident_policy(files):
    led = ledger(files, budget=None)
    plan = led.plan(LedgerState(pflash=str(files["pflash"])))
    by = {c.label: c for c in plan.components}
    assert set(by) == {"target tgt", "draft drf", "dflash dfl", "shared", "target_head tgt", "prefill_drafter pfl"}
    assert by["target tgt"].phases == {"serving", "unparking"} == by["shared"].phases
    assert by["prefill_drafter pfl"].phases == {"serving", "unparking", "target parked"} == by["draft drf"].phases
    assert by["target_head tgt"].phases == {"unparking", "target parked"}
    assert by["target_head tgt"].bytes == 2 * 512 * 256 * 34 // 32
    every = sum(c.bytes for c in plan.components)
    assert plan.phase_bytes("unparking") == every + MiB == plan.peak_bytes
    assert plan.phase_bytes("serving") == every - by["target_head tgt"].bytes + MiB
    assert dict(plan.settings)["prefill_drafter_tokens"] == 4096


def test_ledger_park_policy_and_parked_states(files):
    led = ledger(files, budget=None, drafts=("draft",), policy="park")
    pf = str(files["pflash"])
    plan = led.plan(LedgerState(pflash=pf))
    by = {c.label: c for c in plan.components}
    assert by["prefill_drafter pfl"].phases == {"target parked"} and "target_head tgt" not in by
    assert plan.phase_bytes("target parked") == by["draft drf"].bytes + by["prefill_drafter pfl"].bytes + MiB
    parked = led.plan(LedgerState(target=False, pflash=pf))
    assert parked.phases == ("target parked",) and "shared" not in {c.role for c in parked.components}
    # draft models unparked while the target is parked reserve the shared buffers for themselves again
    again = led.plan(LedgerState(target=False, pflash=pf, shared_parked=True))
    shared = next(c for c in again.components if c.role == "shared")
    assert shared.phases == {"target parked"} and dict(shared.parts)["arena"] > 0
    assert {c.label for c in led.plan(LedgerState(parked=frozenset({"drf"}))).components} == {"target tgt", "shared"}


def test_ledger_refusal_at_start_names_components_and_what_would_fit(files):
    led = ledger(files, budget=None, drafts=("draft",))
    state = LedgerState(pflash=str(files["pflash"]))
    peak = led.plan(state).peak_bytes
    led.budget = peak - 64 * 1024                        # 64 KiB short
    with pytest.raises(Exception) as exc:
        led.check("the configuration", state, runtime=False)
    text = str(exc.value)
    assert text.startswith("the configuration does not fit --vram-budget")
    for name in ("target tgt", "draft drf", "prefill_drafter pfl", "shared", "kv_cache", "safety margin"):
        assert name in text
    fixes = text.split("What would fit: ")[1]
    assert "--max-ctx " in fixes and "without --draft drf" in fixes and "--drafter-policy park" in fixes
    assert "--kv-type q8_0" in fixes and "--kv-type q4_0" in fixes          # the target's quantized KV caches
    assert fixes.rstrip(".").endswith("MiB or more")
    ctx = int(fixes.split("--max-ctx ")[1].split()[0])
    assert led.plan(state, max_ctx=ctx).fits and not led.plan(state, max_ctx=ctx + 256).fits


def test_ledger_runtime_fixes_are_requests_or_a_restart(files):
    led = ledger(files, budget=None, drafts=("draft",))
    pf, big = str(files["pflash"]), str(files["big"])
    led.describe_pflash(big)
    state = LedgerState(target=True, pflash=big)           # loading another prefill drafter while serving
    led.budget = led.plan(state).peak_bytes - 100 * 1024    # a draft model or the target would make room
    assert not led.plan(state).fits and led.plan(LedgerState(pflash=pf)).fits
    fixes = led.fixes(state, runtime=True, loading=frozenset({"pflash"}))
    assert any(f.startswith("`park what=draft` first") for f in fixes)
    assert any(f.startswith("`park what=target` first") for f in fixes)
    assert fixes[-1].startswith("restart with --vram-budget")
    assert not any("free drafter" in f for f in fixes)      # that would unload what is being loaded
    # unparking the target while another prefill drafter fills the slot: freeing it is the fix
    fixes = led.fixes(LedgerState(pflash=big), runtime=True, loading=frozenset({"target"}))
    assert any(f.startswith("`free drafter` first") for f in fixes)


@pytest.mark.parametrize("fields", [dict(target=1), dict(parked={"a"}), dict(parked=frozenset({1})),
                                    dict(pflash=Path("x")), dict(shared_parked=None)])
def test_ledger_state_is_checked(fields):
    with pytest.raises(ValueError):
        LedgerState(**fields)
