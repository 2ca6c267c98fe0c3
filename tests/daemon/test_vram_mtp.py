"""The VRAM plan of `--draft mtp` (vram_sizes.MTPDesc, describe_mtp, CudaSizes.mtp / HostSizes.mtp; the ledger's
"mtp" component): the block's weights as the loader uploads them (eh_proj's halves: the same bytes), its one-layer
K/V cache and inputs, computed by hand for a synthetic qwen35 + MTP target; the target's head is counted as held by
the drafter while the target is parked or unparking (like DFlash); a target without the block is refused with the
loader's words."""
import dataclasses

import pytest

from flashd.daemon.models import open_model
from flashd.daemon.speculative.drafter import DrafterLoadError
from flashd.daemon.vram_ledger import LedgerState, VramLedger, describe_draft
from flashd.daemon.vram_sizes import CudaSizes, HostSizes, MTPDesc, describe_model
from flashd.daemon.pflash.config import PFlashConfig
from flashd.scripts.make_synthetic_gguf import SyntheticSpec, write_synthetic_model
from tests.daemon.test_vram_sizes import MiB, attention_ws, sample_ws

# D 256, H 4 x 64 (q with its gate: 512 rows), Hkv 2, F 512; Q8_0 matrices (34 bytes per 32 values)
TARGET = SyntheticSpec(arch="qwen35", n_layers=4, hidden=256, n_heads=4, n_kv_heads=2, head_dim=64, rope_dim=16,
                       ffn=512, vocab_size=512, ssm_state=32, ssm_k_heads=2, ssm_v_heads=4, full_attn_interval=2,
                       weight_type="Q8_0", seed=26, mtp=True, name="q35mtp")
BLOCK_MATRIX_VALUES = 512 * 256 + 2 * 128 * 256 + 256 * 256 + 3 * 512 * 256 + 256 * 512    # q, k, v, o, ffn, eh_proj


@pytest.fixture(scope="module")
def target(tmp_path_factory):
    path = write_synthetic_model(tmp_path_factory.mktemp("vram-mtp") / "q35mtp.gguf", TARGET)
    return path, *open_model(path)


def test_mtp_parts(target):
    path, f, cfg = target
    desc = describe_draft("mtp", f, cfg)
    assert isinstance(desc, MTPDesc) and desc.path == str(path)
    # vectors: attn_norm, post_attention_norm, enorm, hnorm, shared_head_norm (256 each), q/k norms (64 each)
    vectors = 5 * 256 + 2 * 64
    parts, need = CudaSizes(attention_ws, sample_ws).mtp(desc, max_ctx=1024, prefill_chunk=64, kv_type="f16")
    parts = dict(parts)
    assert parts["weights"] == BLOCK_MATRIX_VALUES * 34 // 32 + 4 * vectors
    assert parts["kv_cache"] == 2 * 1 * 2 * 1024 * 64 * 2                 # K and V, one layer, 2 KV heads, f16
    assert parts["inputs"] == 4 * (2 * 64 + 64 * 256 + 1)
    assert need.attention == attention_ws(4, 2, 64, 1024, 1) and need.arena_half == 0
    host, _ = HostSizes().mtp(desc, max_ctx=1024, prefill_chunk=64, kv_type="f32")
    assert dict(host) == {"weights": 4 * (BLOCK_MATRIX_VALUES + vectors), "kv_cache": 2 * 2 * 1024 * 64 * 4}


def test_ledger_counts_the_block_and_the_target_head(target):
    path, f, cfg = target
    led = VramLedger(CudaSizes(attention_ws, sample_ws), describe_model("q35mtp", f, cfg),
                     {"mtp": describe_draft("mtp", f, cfg)}, max_ctx=1024, prefill_chunk=64,
                     pflash=PFlashConfig(), budget=None, margin=MiB)
    plan = led.plan(LedgerState())
    by = {c.label: c for c in plan.components}
    assert {"target q35mtp", "mtp mtp", "target_head q35mtp"} <= set(by)
    assert by["mtp mtp"].phases == {"serving", "unparking", "target parked"}
    assert by["target_head q35mtp"].phases == {"unparking", "target parked"}
    without = led.plan(LedgerState(), without=frozenset({"mtp"}))
    assert plan.phase_bytes("serving") - without.phase_bytes("serving") == by["mtp mtp"].bytes


def test_a_target_without_the_block_is_refused(tmp_path):
    path = write_synthetic_model(tmp_path / "plain.gguf", dataclasses.replace(TARGET, mtp=False))
    f, cfg = open_model(path)
    with pytest.raises(DrafterLoadError, match="no multi-token-prediction"):
        describe_draft("mtp", f, cfg)
