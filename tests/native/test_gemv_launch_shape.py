"""The GEMV's launch shape (gemv_plan.cuh: gemv_plan -> gemv_layout -> gemv_launch_shape), computed on
the CPU by a host-only program compiled with nvcc: the real 1.5B / 0.5B decode launches get the shapes
bench/results/2026-11-26-h100-gemv-one-step-rule.md measured as fastest on an H100, and no shape over a
sweep of step counts, buffer sizes and GPUs breaks the kernel's limits (SMs, warps a CTA, shared memory). Split rows
(gemv_split_cols; gemv_split_shape): whole teams of two warps, within the same limits, at every pass size.
"""
import json
import shutil
import subprocess

import pytest

from flashd.native import CUDA_DIR, NATIVE_DIR

pytestmark = pytest.mark.skipif(shutil.which("nvcc") is None, reason="nvcc not installed: the host program needs it")

PROGRAM = r"""
#include "gemv_plan.cuh"
#include <cstdio>
using namespace fd;

struct Launch { const char* name; int n; int qt[3]; int rows[3]; int cols; bool swiglu; int nx = 1; int split = 0;
                int stage = STAGE_TARGET_BYTES, rounds = 2; };

// one JSON line per launch (one pass of l.nx x rows), an H100's 132 SMs and 227 KB, the default rounds (2); split:
// gemv_split_cols (gemv.cu's order: the plan, the shape of 2 x steps warp-steps, whole teams)
static void show(const Launch& l) {
    alignas(16) static float dummy[16];
    MatIn m[3];
    for (int k = 0; k < l.n; ++k) m[k] = MatIn{(void*)0x100000, dummy, nullptr, l.qt[k], l.rows[k]};
    GemvPlan pl;
    if (gemv_plan(l.n, m, l.swiglu, l.cols, dummy, dummy, 1e-6f, l.nx, true, l.stage, 2 * 132, &pl, l.split)) {
        printf("{\"name\": \"%s\", \"error\": 1}\n", l.name);
        return;
    }
    GemvArgs p = pl.a;
    gemv_layout(pl, l.nx, &p);
    GemvLaunchShape s;
    const bool split = pl.a.mat[0].split_pieces != 0;
    int st = gemv_launch_shape(split ? 2 * pl.a.n_steps : pl.a.n_steps, pl.a.stage_bytes, p.stage_off_bytes,
                               227 * 1024, 132, max_warps_for(l.nx, l.swiglu), l.rounds, l.nx, &s);
    if (!st && split) st = gemv_split_shape(pl.a.stage_bytes, p.stage_off_bytes, 227 * 1024, max_warps_for(l.nx, l.swiglu), &s);
    const long smem = p.stage_off_bytes + (long)s.warps * s.n_bufs * pl.a.stage_bytes;
    printf("{\"name\": \"%s\", \"error\": %d, \"steps\": %d, \"ctas\": %d, \"warps\": %d, \"bufs\": %d, "
           "\"max_warps\": %d, \"lpr\": %d, \"split_pieces\": %d, \"split_bytes\": %d, \"pieces\": %d, "
           "\"row_bytes\": %lld, \"stage_bytes\": %d, \"smem\": %ld, \"qtype\": %d}\n", l.name, st, pl.a.n_steps, s.ctas, s.warps,
           s.n_bufs, max_warps_for(l.nx, l.swiglu), pl.a.mat[0].lpr, pl.a.mat[0].split_pieces, pl.a.mat[0].split_bytes,
           pl.a.mat[0].pieces, (long long)pl.a.mat[0].row_bytes, pl.a.stage_bytes, smem, pl.a.mat[0].qtype);
}

int main() {
    const int Q4K = FD_Q_Q4_K, Q6K = FD_Q_Q6_K, Q50 = FD_Q_Q5_0, Q80 = FD_Q_Q8_0;
    const Launch ls[] = {
        {"1.5b qkv", 3, {Q4K, Q4K, Q6K}, {1536, 256, 256}, 1536, false},
        {"1.5b o", 1, {Q4K}, {1536}, 1536, false},
        {"1.5b gate_up", 2, {Q4K, Q4K}, {8960, 8960}, 1536, true},
        {"1.5b down q4_k", 1, {Q4K}, {1536}, 8960, false},
        {"1.5b down q6_k", 1, {Q6K}, {1536}, 8960, false},
        {"0.5b qkv", 3, {Q50, Q50, Q80}, {896, 128, 128}, 896, false},
        {"0.5b gate_up", 2, {Q50, Q50}, {4864, 4864}, 896, true},
        {"0.5b down q6_k", 1, {Q6K}, {896}, 4864, false},
        // verify passes: gemv.cu fits 7 of 8 rows of ffn_down's 8960 columns in one pass
        {"1.5b down q6_k x7", 1, {Q6K}, {1536}, 8960, false, 7},
        {"1.5b gate_up x8", 2, {Q4K, Q4K}, {8960, 8960}, 1536, true, 8},
        {"1.5b qkv x8", 3, {Q4K, Q4K, Q6K}, {1536, 256, 256}, 1536, false, 8},
        // split rows (gemv_split_cols 8192, the sm_90 entry's step bytes and rounds): ffn_down of both formats at
        // every pass size, and launches the split must not take
        {"split down q4_k", 1, {Q4K}, {1536}, 8960, false, 1, 8192, 12288, 0},
        {"split down q6_k", 1, {Q6K}, {1536}, 8960, false, 1, 8192, 12288, 0},
        {"split down q6_k x3", 1, {Q6K}, {1536}, 8960, false, 3, 8192, 12288, 0},
        {"split down q6_k x7", 1, {Q6K}, {1536}, 8960, false, 7, 8192, 12288, 0},
        {"split 27b down x4", 1, {Q6K}, {5120}, 17408, false, 4, 8192, 12288, 0},   // gemv.cu fits 4-5 rows a pass
        {"split 27b down q4_k x2", 1, {Q4K}, {5120}, 17408, false, 2, 8192, 12288, 0},
        {"split narrow", 1, {Q4K}, {1536}, 1536, false, 1, 8192, 12288, 0},
        {"split swiglu", 2, {Q4K, Q4K}, {8960, 8960}, 8960, true, 1, 8192, 12288, 0},
        {"split multi", 2, {Q4K, Q4K}, {1536, 1536}, 8960, false, 1, 8192, 12288, 0},
    };
    for (const Launch& l : ls) show(l);
    // limits over a sweep: GPUs (SMs, opt-in shared memory), steps, buffer sizes, staged bytes, rounds
    long bad = 0, n = 0;
    const int gpus[][2] = {{132, 227 * 1024}, {82, 99 * 1024}, {28, 99 * 1024}, {1, 48 * 1024}};
    for (const auto& g : gpus)
        for (int steps = 1; steps < 40000; steps = steps * 5 / 4 + 1)
            for (int stage = 256; stage <= 16384; stage *= 2)
                for (int off = 0; off <= 40000; off += 10000)
                    for (int rounds : {0, 2, 3})
                        for (int mw : {12, 16, 24})
                        for (int nx : {1, 2, 8}) {
                            GemvLaunchShape s;
                            const int st = gemv_launch_shape(steps, stage, off, g[1], g[0], mw, rounds, nx, &s);
                            ++n;
                            if (st) {   // refused: only when one buffer does not fit beside the activations
                                bad += (g[1] - off) / stage >= 1;
                                continue;
                            }
                            const long smem = off + (long)s.warps * s.n_bufs * stage;
                            bad += s.ctas < 1 || s.ctas > g[0] || s.ctas > steps || s.warps < 1 || s.warps > mw ||
                                   (s.n_bufs != 1 && s.n_bufs != 2) || smem > g[1];
                            // the same launch split (2 x steps warp-steps, whole teams): even, within the limits,
                            // refused only where not even one team of buffers fits
                            GemvLaunchShape t;
                            if (gemv_launch_shape(2 * steps, stage, off, g[1], g[0], mw, rounds, nx, &t)) continue;
                            ++n;
                            if (gemv_split_shape(stage, off, g[1], mw, &t)) {
                                bad += (g[1] - off) / stage >= 2 && mw >= 2;
                                continue;
                            }
                            const long tsmem = off + (long)t.warps * t.n_bufs * stage;
                            bad += t.warps % 2 || t.warps < 2 || t.warps > mw || tsmem > g[1];
                        }
    printf("{\"name\": \"sweep\", \"cases\": %ld, \"violations\": %ld}\n", n, bad);
}
"""


@pytest.fixture(scope="module")
def shapes(tmp_path_factory):
    d = tmp_path_factory.mktemp("launch_shape")
    (d / "main.cu").write_text(PROGRAM)
    exe = d / "main"
    subprocess.run(["nvcc", "-std=c++17", "--expt-relaxed-constexpr", "-I", str(CUDA_DIR), "-I", str(NATIVE_DIR / "include"),
                    "-o", str(exe), str(d / "main.cu")], check=True, capture_output=True, text=True)
    out = subprocess.run([str(exe)], check=True, capture_output=True, text=True).stdout
    return {r["name"]: r for r in map(json.loads, out.splitlines())}


def test_projections_smaller_than_the_gpu_give_every_warp_one_step(shapes):
    for name in ("1.5b qkv", "1.5b o", "0.5b qkv", "0.5b down q6_k"):
        s = shapes[name]
        assert s["error"] == 0 and s["bufs"] == 1, s
        assert s["ctas"] == -(-s["steps"] // 8) and s["ctas"] * s["warps"] >= s["steps"], s   # ceil(steps / 8) CTAs


def test_the_one_step_threshold_splits_the_two_measured_launches(shapes):
    assert shapes["0.5b gate_up"]["bufs"] == 1, shapes["0.5b gate_up"]       # 9.2 steps an SM: one step a warp
    for name in ("1.5b down q4_k", "1.5b down q6_k", "1.5b gate_up"):       # 11.6 and 34 steps an SM: rounds
        assert shapes[name]["bufs"] == 2 and shapes[name]["ctas"] == 132, shapes[name]


def test_no_shape_breaks_the_kernels_limits(shapes):
    sweep = shapes["sweep"]
    assert sweep["cases"] > 10000 and sweep["violations"] == 0, sweep


def test_verify_passes_run_as_many_warps_as_fit(shapes):
    # several x rows make a step compute-bound: warps, not buffers (4 double-buffered warps ran ffn_down's 7-row
    # pass at a tenth of the weights' bandwidth on an H100)
    down = shapes["1.5b down q6_k x7"]
    assert down["error"] == 0 and down["bufs"] == 1 and down["warps"] >= 8, down
    gate_up = shapes["1.5b gate_up x8"]
    assert gate_up["error"] == 0 and gate_up["warps"] == gate_up["max_warps"], gate_up
    qkv = shapes["1.5b qkv x8"]   # fewer steps than warps: one step a warp, as with one row
    assert qkv["error"] == 0 and qkv["bufs"] == 1 and qkv["ctas"] * qkv["warps"] >= qkv["steps"], qkv


SPLIT = ["split down q4_k", "split down q6_k", "split down q6_k x3", "split down q6_k x7", "split 27b down x4",
         "split 27b down q4_k x2"]
BLOCK_BYTES = {12: 144, 14: 210}   # GGML Q4_K, Q6_K


def test_split_launches_run_whole_teams_within_the_limits(shapes):
    """gemv_split_cols: lanes per row 32, slice 0 = ceil(blocks / 2) blocks, a buffer holds it, an even warp count
    (teams of two) within the CTA's warps and shared memory, at every pass size."""
    for name in SPLIT:
        s = shapes[name]
        assert s["error"] == 0 and s["lpr"] == 32 and s["steps"] > 0, s
        blocks = s["row_bytes"] // BLOCK_BYTES[s["qtype"]]
        h = (blocks + 1) // 2
        assert s["split_bytes"] == s["row_bytes"] // blocks * h and s["split_pieces"] == s["pieces"] // blocks * h, s
        assert s["stage_bytes"] >= s["split_bytes"] + 15 + 16, s       # any head alignment + the read slack
        assert s["warps"] % 2 == 0 and 2 <= s["warps"] <= s["max_warps"] and s["smem"] <= 227 * 1024, s
    one_row = shapes["split down q6_k"]                                # 3072 warp-steps: 24 warps an SM
    assert one_row["ctas"] == 132 and one_row["warps"] == 24, one_row


def test_launches_the_split_does_not_take(shapes):
    for name in ("split narrow", "split swiglu", "split multi"):
        assert shapes[name]["error"] == 0 and shapes[name]["split_pieces"] == 0, shapes[name]
