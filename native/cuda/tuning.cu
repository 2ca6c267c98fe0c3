// tuning.cu -- the launch tuning table (flashd_tuning.h): per GPU architecture, the GEMV's activation form,
// step buffer size and rounds, and programmatic dependent launch. Each device starts from its architecture's
// entry; fd_tuning_set replaces it (benchmarks' A/B). Launchers read it per launch (tuning_now), so a change
// applies to launches issued, and graphs captured, after it.
#include "common.cuh"

#include <mutex>

namespace fd {
namespace {

// Measured on sm_90 (H100 / H200; bench/NOTES.md sessions 2, 7, 9, 10, 12, 15): int8 activations, 12 KB steps with one
// single-buffered step a warp wherever the grid holds them (rounds 0), PDL on -- session 15 (H200, one machine, two
// repetitions): against 6 KB steps in 2 rounds, tg128 of the 1.5B clone +2.4%, the 0.5B +5.8%, the hybrid 0.8B shape in
// BF16 +5.7%, the 27B shape +1.7% (bench/results/2026-11-26-h200-session15-tuning-ab.txt); rounds 0 alone lost on
// the 1.5B (-1.4%). gemv_rows = 1 on sm_90 (gemv_rows.cuh, the all-rows tensor-core GEMV, chunks of 256 columns) for
// the formats of gemv_rows_formats = 3, Q4_K and Q6_K: a model runs one path at every n (row invariance), and since
// session 32 a K-quant model's one-row decode is as fast on it as on the dp4a kernels (real 1.5B, one H200, tg128
// 1056.6 vs 1053.9) while its 8-32-row verification forwards cost 1.2-2.2x a row instead of ~3x at 8; n-gram
// speculative decoding of the 1.5B 1.24x its plain decode (bench/NOTES.md session 33). Not Q8_0 / Q5_0 yet: with one
// x scale a 128-column group the 0.5B's Q8_0 lm_head at 896 columns left its logits 2.3% of their scale from the
// reference's (the parity tests allow 2%); launches of one 32-column format now take a scale a 32-column block, with
// which the 0.5B passes on formats 7 and 15, but the one-row cost of that (0.5B tg128 -9% against dp4a with formats
// 7, -6.5% with 3, on one H200) and the DFlash drafter's gain (its Q8_0 layers, +13% for DDTree 22 with the coarser
// codes) are not yet measured side by side with it. Elsewhere gemv_rows = 0 (not
// measured on those GPUs); gemv_rows = 0 turns it off (--tuning) for an A/B. Tensor-core GEMV passes (gemv_mma.cuh) off:
// exact, but slower than the one-row kernel's passes as built (results/2026-11-26-h100-gemv-mma-passes.txt);
// gemv_mma_rows = 2..8 turns them on for an A/B. gemv_rows_fuse_nx = 1: one-row gemv_rows calls quantize x in
// the GEMV's own CTAs (no pre-pass launch: the lab timed that pass at ~1.3 us alone, results/2026-11-26-h100-lab-
// gemv-mma-rows.txt); each CTA then reads n x cols floats of x from L2 (35 KB a row at ffn_down's 8960 columns), which
// grows with n while the pre-pass's cost hardly does (1.3 -> 1.6 us at n = 32), so larger n keep the pre-pass until
// measured (an A/B: gemv_rows_fuse_nx = 2..8). The sm_80 / sm_86 / sm_89 entries (A100, RTX 30xx / 40xx: 24 GB
// cards) carry the same values, compile-checked but not yet measured on those GPUs; PDL does not exist below
// sm_90 (launch_pdl falls back). weights_evict_first = 1 on sm_90: the ~1 GB of weights a step streams no longer
// evicts the activations, norm weights, KV rows and kernel code from L2 (H100, 1.5B clone: tg128 +2.9%, also at
// depth 8192; bench/NOTES.md session 13); the other entries keep 0 until measured on those cards (6-72 MB of L2).
// attn_single_chunks = 4 on sm_90: attention rows of at most 4 chunks (256 keys) run on one CTA per KV head, without
// the split partials and the combine launch (bench/NOTES.md session 14); 0 elsewhere until measured. delta_cluster = 1
// on sm_90: the fused Gated DeltaNet step as a cluster of a head's column tiles (thread-block clusters exist from
// sm_90; session 16, bench/NOTES.md). gemv_xq_prepass_cols = 8192 / _norm_cols = 4096 on
// sm_90: x quantized once by a pre-pass launch for the widest GEMVs (the 1.5B's ffn_down, the 27B's ffn_down, gate/up
// and projections of x; H100 tg128 +5.1% / +2.9%; pre-passing every launch lost 14% on the 0.5B: each pre-pass adds a
// ~2 us link; bench/NOTES.md session 17); 0 elsewhere until measured. gemv_swiglu_stage_bytes = 0 (gemv_stage_bytes)
// everywhere: 6144 gained 1.2% on the 27B and lost 3.7% on the 1.5B (session 17), a shape's choice, not an arch's.
// gemv_swiglu_pair = 1 on sm_90 (session 17, bench/NOTES.md), 0 elsewhere until measured. gemv_xq_direct = 0
// everywhere (H100: 1.5B tg128 -5.7%, 0.5B 0; session 19). gemv_split_cols = 8192 on sm_90 (the 1.5B's 8,960-column
// ffn_down on warp pairs: tg128 +1.3%; the 0.5B's 4,864 columns stay off: split at 4096 lost 6%; session 19,
// bench/NOTES.md), 0 elsewhere until measured. gemv_rows_tma = 1 on sm_90 (bulk copies exist from sm_90): the
// gemv_rows kernels with whole tiles by bulk copies, one tile in flight beyond those landed (session 24,
// bench/NOTES.md); it acts only where gemv_rows is on. gemv_rows_formats: 3 on sm_90 (above), 15 elsewhere (inert while
// gemv_rows is 0). gemv_rows_dp4a = 1 on sm_90 (one-row Q4_K and Q6_K items of the bulk-copy kernel on dp4a lanes, the
// same bits as the mma items: Q4_K 1.5B clone tg128 1,038.4 -> 1,085.7, H200, bench/NOTES.md session 34; Q6_K and
// the mixed q / k / v launches too, 1,036.3 -> 1,125.8, session 35), 0 elsewhere (no bulk-copy kernel there).
// gemv_rows_tma_split = 8 on sm_90: ffn_down's one-tile CTAs (35 chunks a row on the 1.5B) copy their tile in 5
// pieces, so items start on the first 8 chunks (pieces of 4 / 2 lost: 1,085 / 906 tok/s against 1,144 -- each piece is
// 16 row copies; 12 gained less, 18 nothing). gemv_rows_stage_x = 20000 on sm_90: 2 .. 8-row launches of at most
// 20,000 bytes of x codes whose CTAs have more items than warps copy the codes in (every launch staged lost 8 rows to
// 1.31 ms: ffn_down's 72 KB, and q/k/v / o's single items). Both together against neither, one library, H200, session
// 37 (bench/results/2026-11-28-h200-session37.md): 1.5B clone forward of 1 / 2 / 4 / 8 rows 1.004 / 1.271 / 1.281 /
// 1.291 -> 0.991 / 1.178 / 1.211 / 1.232 ms, tg128 1,129 -> 1,142.5 (real 1.5B 1,129.3 -> 1,143.0); the 0.5B's
// tg128 unchanged (1,856), its 8 rows 1.599 -> 1.622 ms. 0 elsewhere (no bulk copies there).
// gemv_rows_tma_warps = 19 on sm_90 (16 before the field; 18 / 19 put ffn_down's 35 chunk items a CTA in 2 rounds
// instead of 3: its Q6_K launch 11.9 -> 10.9 us in the chain; 1.5B clone tg128 1,143 -> 1,177.4 / 1,178.3, 18 warps
// 1,167, one-row forward 0.993 -> 0.971 ms; 0.5B clone 1,856 -> 1,925; two rounds, one library, H200, session 38,
// bench/results/2026-11-28-h200-session38.md). The one-row dp4a launches then got a kernel of their own (64 registers,
// up to 31 warps): at 19 warps 1,177.4 -> 1,211.8 / 1,925 -> 1,951 against the previous kernel, side by side on one
// H200; 24 / 28 / 31 warps were slower (1,179 / 1,166 / 1,173: gate/up's 30 items a CTA in one round did not make its
// launch shorter). 16 elsewhere (no bulk-copy kernel there).
// attn_o_codes = 1 on sm_90: a verify forward's attention (2+ rows, head_dim 128) writes o's int8 codes and the
// output projection reads them (fd_gemv_xq) -- one pre-pass launch a layer fewer: 1.5B clone, 2 / 4 / 8 rows 1.180 /
// 1.213 / 1.231 -> 1.144 / 1.172 / 1.194 ms at depth 128, 1.229 / 1.295 / 1.343 -> 1.187 / 1.265 / 1.323 at depth 1000,
// 16 / 32 rows -1% or nothing; a decode step asks for none (tried at one row: tg128 1,252.3 vs 1,251.3 -- reading 1,536
// bytes of codes takes the same one L2 round trip as quantizing 6 KB); one library, two rounds, H200, session 42
// (bench/results/2026-11-29-h200-session42.md). 0 elsewhere (no gemv_rows there).
// attn_masked_rope = 16 on sm_90: a verify forward of at most 16 rows folds RoPE and the K/V write into its masked
// attention after the first layer (fd_attention_masked_rope) -- one launch a layer fewer: real 1.5B, 1 / 2 / 4 / 8 rows
// at depth 128 0.955 / 1.140 / 1.183 / 1.198 -> 0.882 / 1.074 / 1.122 / 1.143 ms; clones at depth 1000 -3 to -6%; the
// 0.5B clone 1 / 2 / 8 rows -7% / -7% / -0.5% (session 43, a pair of values a thread a row: bound 8). With 8 values a
// thread a row (quad tasks, session 44) the 1-8-row forwards gained another 1.3-3.2% and 12 / 16 rows win too: 1.5B
// clone 12 / 16 rows 1.612 / 1.619 -> 1.550 / 1.556 ms at depth 128, 1.919 / 1.953 -> 1.879 / 1.938 at depth 1000;
// 23 / 32 rows still lose at depth (+1.6% / +3.9%: each block RoPEs up to n visible rows). One library, alternating,
// H200 (bench/results/2026-11-29-h200-session44.md). 0 elsewhere (sm_86 / sm_89 cannot give a block its ~102 KB at
// head_dim 128, HIP's 64 KB neither; not measured there).
struct TuningEntry {
    int cc;   // major * 10 + minor: the entry serves this architecture and newer ones up to the next entry
    fd_tuning_t t;
};
constexpr TuningEntry TABLE[] = {
    {0, {1, 6144, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 16, 0, 0}},    // anything older, and HIP devices (no PDL, no int8 mma, no clusters)
    {80, {1, 6144, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 16, 0, 0}},   // sm_80 A100
    {86, {1, 6144, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 16, 0, 0}},   // sm_86 RTX 30xx (24 GB: 3090)
    {89, {1, 6144, 2, 0, 0, 0, 1, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 15, 0, 0, 0, 16, 0, 0}},   // sm_89 RTX 40xx (24 GB: 4090)
    {90, {1, 12288, 0, 1, 0, 1, 1, 1, 4, 1, 8192, 4096, 0, 1, 0, 8192, 1, 3, 1, 8, 20000, 19, 1, 16}},  // sm_90 H100 / H200
};
constexpr int MAX_DEVICES = 64;

std::mutex mu;
fd_tuning_t current[MAX_DEVICES];
bool ready[MAX_DEVICES];

fd_tuning_t entry_for(int major, int minor) {
    const int cc = major * 10 + minor;
    fd_tuning_t t = TABLE[0].t;
    for (const TuningEntry& e : TABLE)
        if (cc >= e.cc) t = e.t;
    return t;
}

bool valid(const fd_tuning_t& t) {
    return (t.gemv_int8_x == 0 || t.gemv_int8_x == 1) && t.gemv_stage_bytes >= 256 && t.gemv_stage_bytes <= 65536 &&
           (t.gemv_rounds == 0 || (t.gemv_rounds >= 2 && t.gemv_rounds <= 16)) && (t.pdl == 0 || t.pdl == 1) &&
           (t.gemv_mma_rows == 0 || (t.gemv_mma_rows >= 2 && t.gemv_mma_rows <= 8)) &&
           t.gemv_rows >= 0 && t.gemv_rows <= 8 && t.gemv_rows_fuse_nx >= 0 && t.gemv_rows_fuse_nx <= 8 &&
           (t.weights_evict_first == 0 || t.weights_evict_first == 1) && t.attn_single_chunks >= 0 &&
           t.attn_single_chunks <= 64 && (t.delta_cluster == 0 || t.delta_cluster == 1) &&
           t.gemv_xq_prepass_cols >= 0 &&
           t.gemv_xq_prepass_cols <= (1 << 20) && t.gemv_xq_prepass_norm_cols >= 0 &&
           t.gemv_xq_prepass_norm_cols <= (1 << 20) &&
           (t.gemv_swiglu_stage_bytes == 0 || (t.gemv_swiglu_stage_bytes >= 256 && t.gemv_swiglu_stage_bytes <= 65536)) &&
           (t.gemv_swiglu_pair == 0 || t.gemv_swiglu_pair == 1) && (t.gemv_xq_direct == 0 || t.gemv_xq_direct == 1) &&
           t.gemv_split_cols >= 0 && t.gemv_split_cols <= (1 << 20) && t.gemv_rows_tma >= 0 && t.gemv_rows_tma <= 8 &&
           t.gemv_rows_formats >= 0 && t.gemv_rows_formats <= 15 && (t.gemv_rows_dp4a == 0 || t.gemv_rows_dp4a == 1) &&
           t.gemv_rows_tma_split >= 0 && t.gemv_rows_tma_split <= 64 && t.gemv_rows_stage_x >= 0 &&
           t.gemv_rows_stage_x <= (1 << 20) && t.gemv_rows_tma_warps >= 4 && t.gemv_rows_tma_warps <= 31 &&
           (t.attn_o_codes == 0 || t.attn_o_codes == 1) && t.attn_masked_rope >= 0 && t.attn_masked_rope <= 48;
}

// gemv_rows needs int8 mma.sync and cp.async: an NVIDIA GPU of sm_80 or later
bool rows_supported(int dev) {
#if FD_HAS_MMA
    int major = 0;
    return cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev) == cudaSuccess && major >= 8;
#else
    (void)dev;
    return false;
#endif
}

// the current device's slot, initialised from the table on first use; -1 without a device
int slot() {
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) return -1;
    if (!ready[dev]) {
        int major = 0, minor = 0;
#if FD_HAS_MMA   // an NVIDIA device: its architecture's entry (HIP devices take the generic one)
        cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, dev);
        cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, dev);
#endif
        current[dev] = entry_for(major, minor);
        ready[dev] = true;
    }
    return dev;
}

}  // namespace

fd_tuning_t tuning_now() {
    std::lock_guard<std::mutex> lock(mu);
    const int s = slot();
    return s < 0 ? TABLE[0].t : current[s];
}

int device_sm_count() {
    static std::mutex sm_mu;
    static int cache[MAX_DEVICES];
    int dev = 0;
    if (cudaGetDevice(&dev) != cudaSuccess || dev < 0 || dev >= MAX_DEVICES) return 1;
    std::lock_guard<std::mutex> lock(sm_mu);
    if (cache[dev] == 0) {
        int n = 0;
        if (cudaDeviceGetAttribute(&n, cudaDevAttrMultiProcessorCount, dev) != cudaSuccess || n < 1) n = 1;
        cache[dev] = n;
    }
    return cache[dev];
}

}  // namespace fd

extern "C" {

int fd_tuning_default(int cc_major, int cc_minor, fd_tuning_t* out) {
    FD_CHECK_ARG(out != nullptr && cc_major >= 0 && cc_minor >= 0);
    *out = fd::entry_for(cc_major, cc_minor);
    return 0;
}

int fd_tuning_get(fd_tuning_t* out) {
    FD_CHECK_ARG(out != nullptr);
    *out = fd::tuning_now();
    return 0;
}

int fd_tuning_set(const fd_tuning_t* tuning) {
    FD_CHECK_ARG(tuning != nullptr && fd::valid(*tuning));
    std::lock_guard<std::mutex> lock(fd::mu);
    const int s = fd::slot();
    if (s < 0) return (int)cudaErrorNoDevice;
    if (tuning->gemv_rows != 0 && !fd::rows_supported(s)) return FD_E_ARG;
    fd::current[s] = *tuning;
    return 0;
}

}  // extern "C"
