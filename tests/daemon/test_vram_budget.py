"""The VRAM budget's pure arithmetic (daemon/vram_budget.py): the size parser, the KV cache's bytes per
type, the plan's per-phase sums, peak and headroom, the checks on construction, the refusal's wording
and the search for the largest max_ctx that fits."""
import pytest

from flashd.daemon.vram_budget import (GiB, MiB, PHASES, BudgetExceeded, Component, VramPlan, format_size,
                                       kv_cache_bytes, largest_fitting, parse_size, refusal)


@pytest.mark.parametrize("text,want", [
    ("24GiB", 24 * 2**30), ("24G", 24 * 2**30), ("24gib", 24 * 2**30), ("24Gi", 24 * 2**30),
    ("22.5G", 22 * 2**30 + 2**29), ("8000MiB", 8000 * 2**20), ("8000M", 8000 * 2**20),
    ("24GB", 24 * 10**9), ("1.5TB", 15 * 10**11), ("512K", 512 * 1024), ("100KB", 100_000),
    ("4096B", 4096), (" 24 GiB ", 24 * 2**30), ("1T", 2**40),
    ("0.1GiB", 107374182),        # 0.1 * 2^30 = 107374182.4: the fraction of a byte is dropped
])
def test_parse_size_accepts_units(text, want):
    assert parse_size(text) == want


@pytest.mark.parametrize("text", ["24", "GiB", "24 Gigs", "24XB", "-1G", "1e9B", "inf", "nan", "", "24GiB!",
                                  "2 4G", "24.G", ".5G", "24,5G", "0G", "0.0000000001B", "2048T"])
def test_parse_size_refuses_everything_else(text):
    with pytest.raises(ValueError) as exc:
        parse_size(text)
    msg = str(exc.value)
    assert repr(text) in msg
    assert ("e.g. 24GiB" in msg) or ("more than 0 bytes" in msg) or ("1 PiB" in msg)


def test_parse_size_says_which_units_mean_what():
    with pytest.raises(ValueError, match="powers of 1024.*powers of 1000"):
        parse_size("24 gigs")


def test_format_size():
    assert format_size(3 * GiB // 2) == "1.50 GiB"
    assert format_size(3 * MiB // 2) == "1.5 MiB"
    assert format_size(1536) == "1.5 KiB"
    assert format_size(12) == "12 B"


@pytest.mark.parametrize("kv_type,row_bytes", [("f32", 512), ("f16", 256), ("q8_0", 4 * 34), ("q4_0", 4 * 18)])
def test_kv_cache_bytes_per_type(kv_type, row_bytes):
    # 28 layers x 2 KV heads x 1000 slots of a 128-value row, K and V: ggml's q8_0 block is 32 values in
    # 34 bytes, q4_0 32 values in 18 bytes
    assert kv_cache_bytes(28, 2, 128, 1000, kv_type) == 2 * 28 * 2 * 1000 * row_bytes


def test_kv_cache_bytes_refuses_a_row_of_partial_blocks():
    # a quantized row is whole 32-value blocks: head_dim 48 cannot be stored (refused, never rounded up)
    with pytest.raises(ValueError, match="multiple of 32"):
        kv_cache_bytes(1, 1, 48, 1, "q4_0")
    assert kv_cache_bytes(1, 1, 48, 1, "f16") == 2 * 2 * 48
    with pytest.raises(ValueError, match="kv_type"):
        kv_cache_bytes(1, 1, 64, 1, "q5_1")


def test_kv_cache_bytes_k_and_v_in_their_own_types():
    # K q8_0 (4 blocks of 34 bytes per 128-value row) and V q4_0 (4 x 18), 28 layers x 2 heads x 1000 slots
    assert kv_cache_bytes(28, 2, 128, 1000, "q8_0", "q4_0") == 28 * 2 * 1000 * (4 * 34 + 4 * 18)
    assert kv_cache_bytes(28, 2, 128, 1000, "f16", "q8_0") == 28 * 2 * 1000 * (256 + 4 * 34)


def comp(role, name, phases, **parts):
    return Component(role, name, tuple(parts.items()), frozenset(phases))


def sample_plan(budget=None, margin=100):
    return VramPlan((comp("target", "t", {"serving", "unparking"}, weights=1000, kv_cache=500),
                     comp("dflash", "d", set(PHASES), weights=200, kv_cache=50),
                     comp("target_head", "t", {"unparking", "target parked"}, head=300),
                     comp("prefill_drafter", "p", {"target parked"}, weights=400, kv_cache=900)),
                    margin_bytes=margin, budget_bytes=budget)


def test_plan_sums_each_phase_and_takes_the_largest():
    plan = sample_plan(budget=2500)
    assert plan.phase_bytes("serving") == 1500 + 250 + 100
    assert plan.phase_bytes("unparking") == 1500 + 250 + 300 + 100
    assert plan.phase_bytes("target parked") == 250 + 300 + 1300 + 100
    assert plan.peak_phase == "unparking" and plan.peak_bytes == 2150
    assert plan.headroom_bytes == 350 and plan.fits
    assert not sample_plan(budget=2149).fits and sample_plan(budget=2149).headroom_bytes == -1
    assert sample_plan().fits and sample_plan().headroom_bytes is None


def test_plan_as_dict_reports_components_total_budget_and_headroom():
    d = sample_plan(budget=4000).as_dict()
    assert d["budget_bytes"] == 4000 and d["peak_bytes"] == 2150 and d["headroom_bytes"] == 1850
    assert d["phases"] == {"serving": 1850, "unparking": 2150, "target parked": 1950}
    assert d["components"][0] == {"role": "target", "name": "t", "model": "", "bytes": 1500,
                                  "parts": {"weights": 1000, "kv_cache": 500}, "phases": ["serving", "unparking"]}
    assert d["margin_bytes"] == 100 and d["fits"] is True


def test_an_empty_plan_is_its_margin():
    plan = VramPlan((), margin_bytes=7, budget_bytes=10)
    assert plan.peak_bytes == 7 and plan.peak_phase == "serving" and plan.headroom_bytes == 3


@pytest.mark.parametrize("make,match", [
    (lambda: comp("target", "t", {"serving"}, weights=-1), "not a byte count"),
    (lambda: comp("target", "t", {"serving"}, weights=1.5), "not a byte count"),
    (lambda: Component("target", "t", (("weights", 1), ("weights", 2)), frozenset({"serving"})), "repeated"),
    (lambda: Component("target", "t", (("weights",),), frozenset({"serving"})), r"\(what, bytes\)"),
    (lambda: comp("target", "t", {"idle"}, weights=1), "phases"),
    (lambda: comp("target", "t", set(), weights=1), "phases"),
    (lambda: Component("", "t", (), frozenset({"serving"})), "role"),
    (lambda: VramPlan((comp("draft", "a", {"serving"}),) * 2, 0), "repeat"),
    (lambda: VramPlan((), -1), "margin_bytes"),
    (lambda: VramPlan((), 0, budget_bytes=0), "budget_bytes"),
    (lambda: VramPlan([], 0), "tuple"),
])
def test_construction_is_checked(make, match):
    with pytest.raises(ValueError, match=match):
        make()


def test_refusal_names_the_peak_components_the_overshoot_and_the_fixes():
    plan = sample_plan(budget=2000)
    text = refusal("loading the prefill drafter p", plan, ["--max-ctx 4096 (peak 1.9 GiB)", "a bigger budget"])
    assert text.startswith("loading the prefill drafter p does not fit --vram-budget 2.0 KiB: the plan needs")
    assert "2.1 KiB while the target loads again after a park" in text        # the peak: unparking
    assert "150 B over" in text
    for clause in ("target t 1.5 KiB (weights 1000 B, kv_cache 500 B)", "dflash d 250 B", "target_head t 300 B",
                   "safety margin 100 B"):
        assert clause in text
    assert "prefill_drafter" not in text.split(" What would fit")[0]    # not in the peak phase
    assert text.endswith("What would fit: --max-ctx 4096 (peak 1.9 GiB); a bigger budget.")
    assert issubclass(BudgetExceeded, Exception)


def test_plan_lines_for_people():
    lines = sample_plan(budget=4000).lines()
    assert lines[0] == "VRAM plan (GPU): peak 2.1 KiB (unparking), budget 3.9 KiB, headroom 1.8 KiB"
    assert lines[1].split()[:4] == ["target", "t", "1.5", "KiB"] and "serving, unparking" in lines[1]
    assert lines[-1].split()[:2] == ["safety", "margin"]


def test_largest_fitting_searches_and_rounds_down():
    def plan_at(n):       # 10 bytes per slot over a margin of 1000, budget 50000: n <= 4900 fits
        return VramPlan((comp("target", "t", {"serving"}, kv_cache=10 * n),), 1000, budget_bytes=50_000)
    assert largest_fitting(plan_at, 16, 100_000) == 4864            # 4900 rounded down to a multiple of 256
    assert largest_fitting(plan_at, 16, 100_000, step=1) == 4900
    assert largest_fitting(plan_at, 16, 200) == 200
    assert largest_fitting(lambda n: plan_at(n + 10_000), 16, 100) is None
