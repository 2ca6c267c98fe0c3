"""Lab (issue 16 item 1): variants of the quantized K cache, teacher-forced argmax agreement with the f16 cache on
the CPU reference backend. Not part of the daemon; it patches ReferenceOps.attention in this process only. The
variants themselves are bench/lab/kv_variants.py.

    python bench/lab/kv_k4_variants.py --model M.gguf --text EVAL.py --calib CALIB.py [--tokens 512]
        [--calib-tokens 256] [--variants base,dcal,...] [--out FILE.json]
    python bench/lab/kv_k4_variants.py --self-test        # the window variants' checks on random data (no model)

How a variant is run: the cache is an f16 one (float32 rows) and the patched attention "fake-quantizes" each key
before it is stored: k_stored = decode(encode(R(k * D - c * D - o2))) and the query becomes R(q / D), R the
Hadamard rotation, c the model's key offset (kv_offset.py), D a per-(layer, KV head, channel) scale equal on each
RoPE pair (so it commutes with RoPE), o2 a per-layer second offset. decode(encode(x)) is exactly what a quantized
cache's rows read back (kv_quant.py), so `base` is today's K q4_0 path number for number. Per-layer K types and
keeping the first tokens' keys in q8_0 are a per-row choice of the encoder.

Shapes: q (n, H, d), k (n, Hkv, d) float32 after RoPE; D, c, o2 (n_layers, Hkv, d).

Variants (--variants, comma-separated; make_variants): base (today: offset c + rotation, ggml's q4_0; its number
is the daemon's before kv_quant_search.py), q8base, norot; dcal / dcal2 / dcalh (D = (E q^2 / E k^2)^(1/4) from the
calibration text, dcal2 rounded to powers of two, dcalh ^(1/8)), dw / dw2 (D from W_q, W_k row norms), off2 (second
offset: calibrated mean of k - c), dcal2off2; sink4 / sinkN (first N slots' K in q8_0), sink1f16 / sink4f16 (in
f16), sinkabs (slot 0's q4_0 error folded into c); l01q8, q8:a.b.c (those layers' K q8_0), only:a-b (q4_0 K in
layers a..b only, f16 elsewhere); mse (34 step factors, least squared error), search (the daemon's 8-factor
encoder, daemon/backends/kv_quant_search.py: only with bench/lab/kv_q4_searched_scale.patch applied), signs (random +-1 D: a randomized Hadamard), msedcal / msedcalh / searchdcal;
window variants (WindowVariant, names RULE[sinkM][+v4|+v4nw], WINDOW_NAME): RULE winN (a KIVI-style sliding
window, e.g. win32, win128: query row at slot p reads the keys of slots t > p - N in f16, older ones as base stores
them), blkU (a block-aligned window, e.g. blk128, blk256, blk512: slot t in f16 iff floor(t / U) == floor(p / U), the
current U-aligned block; a prefix ending on a multiple of U needs no f16 copies, rows early in a block see almost no
window) or base (no window); sinkM: also the first M slots' K in q8_0 as sinkM; +v4: V stored as q4_0 too (ggml's
plain q4_0 of the value rows, no offset or rotation), read in f16 inside the same window as K; +v4nw: V q4_0 with no
window (K keeps its own). base+v4 is today's K q4_0 + V q4_0. All per query row: a prefill chunk's row sees what a
one-row decode step at its slot would (--self-test checks it, and blk1 == win1, win0 == base, a window over the
whole context == the f16 cache, with or without +v4).
Each run prints argmax agreement and the mean KL(f16 || variant) in nats, a smoother figure: at 1024 tokens the
argmax count moves by 5-10 tokens between variants whose KL differs by under 5%. --layer-errors instead prints
each layer's local attention error on the calibration text.
"""
from __future__ import annotations

import argparse
import json
import sys
import time

import numpy as np

from flashd.daemon.backends import reference as ref
# the variants themselves (run as a script, this folder is on sys.path)
from kv_variants import (WINDOW_NAME, SinkAbsorb, Variant, WindowVariant, _log_softmax, fake_quant, pair_mean,
                         window_variant)

ORIG_ATTENTION = ref.ReferenceOps.attention
STATE = {"layer": 0, "hook": None}


def log(msg: str) -> None:
    print(f"[k4 {time.strftime('%H:%M:%S')}] {msg}", file=sys.stderr, flush=True)


def _begin_layer(self, index):
    STATE["layer"] = index


def _attention(self, q, k, v, cache_layer, batch):
    if STATE.get("capture") is not None:
        STATE["capture"].setdefault(STATE["layer"], []).append((q, k, v))
    hook = STATE["hook"]
    if isinstance(hook, WindowVariant):           # computes the attention itself (two key sets per row)
        return hook.attention(STATE["layer"], q, k, v, cache_layer, batch)
    if hook is not None:
        q, k = hook(STATE["layer"], int(batch.n_past[0]), q, k)
    return ORIG_ATTENTION(self, q, k, v, cache_layer, batch)


ref.ReferenceOps.begin_layer, ref.ReferenceOps.attention = _begin_layer, _attention


def argmax_run(runner, ids, hook, ref_logp=None):
    """argmax (n,) int64 of every position; with ref_logp (a list of the f16 run's per-chunk log-probs, float16)
    also the mean KL(f16 || this) in nats (a smoother figure than the argmax count: 1 token = 0.1% at 1024).
    Without ref_logp and with hook None: (argmax, the per-chunk log-probs) for later runs."""
    STATE["hook"] = hook
    runner.reset()
    out, kls, keep = [], [], []
    for i, s in enumerate(range(0, len(ids), runner.prefill_chunk)):
        logits = np.asarray(runner.prefill(ids[s:s + runner.prefill_chunk], all_logits=True))
        out.append(np.argmax(logits, -1))
        if ref_logp is not None:
            p_ref = ref_logp[i].astype(np.float64)
            kls.append((np.exp(p_ref) * (p_ref - _log_softmax(logits))).sum(-1))
        elif hook is None:
            keep.append(_log_softmax(logits).astype(np.float16))
    runner.reset()
    STATE["hook"] = None
    top = np.concatenate(out)
    if ref_logp is not None:
        return top, float(np.concatenate(kls).mean())
    return (top, keep) if hook is None else top


def calibrate(runner, ids, c, neox):
    """From an f16 forward over ids: per (layer, KV head, channel) E[q^2] (summed over the group's heads), E[(k -
    c)^2], mean(k - c); each (n_layers, Hkv, d) float64. Returns also the per-layer rows (q, k) for the proxy."""
    acc = {}

    def cap(layer, n_past, q, k):
        n, h, d = q.shape
        hkv = k.shape[1]
        kc = k.astype(np.float64) - c[layer]
        qq = (q.astype(np.float64) ** 2).reshape(n, hkv, h // hkv, d).sum(2)
        a = acc.setdefault(layer, [0, 0.0, 0.0, 0.0])
        a[0] += n
        a[1] = a[1] + qq.sum(0)
        a[2] = a[2] + (kc ** 2).sum(0)
        a[3] = a[3] + kc.sum(0)
        return q, k

    argmax_run(runner, ids, cap)
    L = len(acc)
    q2 = np.stack([acc[i][1] / acc[i][0] for i in range(L)])
    k2 = np.stack([acc[i][2] / acc[i][0] for i in range(L)])
    km = np.stack([acc[i][3] / acc[i][0] for i in range(L)])
    return pair_mean(q2, neox), pair_mean(k2, neox), km


def balance_scale(q2, k2, alpha=0.25, pow2=False, clip=64.0):
    """D = (E q^2 / E k^2) ** alpha per channel (alpha 1/4 minimizes E|q/D|^2 * E|k D|^2), normalized to geometric
    mean 1 per head, clipped to [1/clip, clip]; pow2: rounded to a power of two (exact in float arithmetic)."""
    D = (np.maximum(q2, 1e-12) / np.maximum(k2, 1e-12)) ** alpha
    D = D / np.exp(np.log(D).mean(axis=-1, keepdims=True))
    D = np.clip(D, 1.0 / clip, clip)
    if pow2:
        D = 2.0 ** np.round(np.log2(D))
    return D.astype(np.float32)


def random_signs(n_layers, hkv, d, seed=16):
    """D = +-1 per channel (a randomized Hadamard: R = H diag(D), exact: a sign flip rounds nothing)."""
    rng = np.random.default_rng(seed)
    return np.where(rng.random((n_layers, hkv, d)) < 0.5, -1.0, 1.0).astype(np.float32)


def weight_scale(lm, cfg, alpha=0.25, pow2=False):
    """D from the weights only: E q_i^2 ~ |W_q row i * g|^2 + b_q[i]^2 (g: attn_norm), E k_i^2 alike, per pair."""
    out = []
    hkv, d = cfg.n_kv_heads, cfg.head_dim
    for w in lm.weights.layers:
        g = np.asarray(w.attn_norm, np.float64)
        def energy(W, b, heads):
            W = np.asarray(W, np.float64) * g[None]
            e = (W ** 2).sum(1) + (0 if b is None else np.asarray(b, np.float64) ** 2)
            return e.reshape(heads, d)
        q2 = energy(w.attn_q, w.attn_q_bias, cfg.n_heads).reshape(hkv, -1, d).sum(1)
        out.append((q2, energy(w.attn_k, None, hkv)))     # k: the bias is the offset's, not counted
    q2 = pair_mean(np.stack([a for a, _ in out]), cfg.rope_neox)
    k2 = pair_mean(np.stack([b for _, b in out]), cfg.rope_neox)
    return balance_scale(q2, k2, alpha, pow2)


def _causal_attention(q, k, v):
    """q (n, H, d), k and v (n, Hkv, d) -> (n, H, d) float64, causal softmax(q k / sqrt(d)) v."""
    n, h, d = q.shape
    g = h // k.shape[1]
    qg = q.astype(np.float64).reshape(n, k.shape[1], g, d)
    s = np.einsum("nkgd,tkd->kgnt", qg, k.astype(np.float64)) / np.sqrt(d)
    s = np.where(np.tril(np.ones((n, n), bool))[None, None], s, -np.inf)
    p = np.exp(s - s.max(-1, keepdims=True))
    p /= p.sum(-1, keepdims=True)
    return np.einsum("kgnt,tkd->nkgd", p, v.astype(np.float64)).reshape(n, h, d)


def layer_errors(runner, ids, variants):
    """Per layer and variant: |attn(q4 K) - attn(f16 K)| / |attn(f16 K)| (Frobenius) over ids from slot 0, each
    layer on the f16 forward's own q, k, v (no propagation): where a q4_0 K hurts locally."""
    if any(isinstance(var, WindowVariant) for var in variants):
        raise SystemExit("--layer-errors: window variants (winN, blkU, +v4) are not supported")
    STATE["capture"] = {}
    argmax_run(runner, ids, None)
    cap, STATE["capture"] = STATE["capture"], None
    out = {}
    for layer in sorted(cap):
        q, k, v = (np.concatenate([c[j] for c in cap[layer]]) for j in range(3))
        ref_o = _causal_attention(q, k, v)
        for var in variants:
            qv, kv = var(layer, 0, q, k)
            err = np.linalg.norm(_causal_attention(qv, kv, v) - ref_o) / np.linalg.norm(ref_o)
            out.setdefault(var.name, []).append(float(err))
    return out


def self_test(seed=16):
    """Random data, no model (--self-test). Returns the checks' lines; raises AssertionError on a failure.
    (1) Per-row semantics: every window rule and V type, a forward in chunks of 13 rows (crossing block and window
    edges) equals one-row decode steps, and both equal an independent per-row float64 evaluation of the rule
    (row p: K and V rows t <= p from the full-precision set where the rule says, else the quantized one).
    (2) Bit for bit: blk1 == win1 (each row's own slot only), blkU == winN for U, N >= the context, +v4 with a
    window covering the context == without it, win0 == base and win0+v4 == base+v4 (base through
    ReferenceOps.attention, the path the non-window variants take)."""
    from types import SimpleNamespace
    rng = np.random.default_rng(seed)
    L, H, Hkv, d, T = 2, 4, 2, 128, 80
    c = rng.normal(size=(L, Hkv, d)).astype(np.float32)
    q = (rng.normal(size=(T, H, d)) * 3).astype(np.float32)
    k = (rng.normal(size=(T, Hkv, d)) * 2 + c[1]).astype(np.float32)
    v = rng.normal(size=(T, Hkv, d)).astype(np.float32)
    layer, lines = 1, []

    def run(var, chunk):
        kc, vc = np.zeros((T, Hkv, d), np.float32), np.zeros((T, Hkv, d), np.float32)
        out = []
        for s0 in range(0, T, chunk):
            batch = SimpleNamespace(n_past=np.array([s0], np.int32), mask=None)
            sl = slice(s0, s0 + chunk)
            if isinstance(var, WindowVariant):
                out.append(var.attention(layer, q[sl], k[sl], v[sl], (kc, vc), batch))
            else:                                     # the hook path of _attention
                qv, kv = var(layer, s0, q[sl], k[sl])
                out.append(ORIG_ATTENTION(ref.ReferenceOps(), qv, kv, v[sl], (kc, vc), batch))
        return np.concatenate(out)

    def per_row(var):
        qt, kt = var.transform(layer, q, k)
        kq = var.quantize(layer, 0, kt)
        vq = v if var.v_type == "f16" else fake_quant(v, var.v_type)
        out = np.zeros((T, H, d))
        g = H // Hkv
        for p in range(T):
            t = np.arange(p + 1)
            full = (t // var.block == p // var.block) if var.block else (t > p - var.window)
            keys = np.where(full[:, None, None], kt[:p + 1], kq[:p + 1]).astype(np.float64)
            vfull = full if var.v_window else np.zeros_like(full)
            vals = np.where(vfull[:, None, None], v[:p + 1], vq[:p + 1]).astype(np.float64)
            for h in range(H):
                sc = keys[:, h // g] @ qt[p, h].astype(np.float64) / np.sqrt(d)
                w = np.exp(sc - sc.max())
                out[p, h] = (w / w.sum()) @ vals[:, h // g]
        return out.reshape(T, H * d)

    names = ["win0", "win1", "win8", "win32", "blk1", "blk8", "blk16", "blk64", "win8+v4", "win8+v4nw", "blk8+v4",
             "blk16+v4", "blk16+v4nw", "blk16sink4+v4", "base+v4", "blk1000", "blk1000+v4", "win1000", "win1000+v4"]
    outs = {}
    for name in names:
        a, b = run(window_variant(name, L, c), 13), run(window_variant(name, L, c), 1)
        r = per_row(window_variant(name, L, c))
        e1 = float(np.abs(a - b).max() / np.abs(b).max())
        e2 = float(np.abs(a - r).max() / np.abs(r).max())
        assert e1 < 1e-5 and e2 < 1e-4, (name, e1, e2)
        outs[name] = a
        lines.append(f"{name}: chunks of 13 vs one-row steps max rel diff {e1:.1e}, vs per-row float64 {e2:.1e}")
    base, base_v4 = run(Variant("base", L, c), 13), outs["base+v4"]
    for x, y in [("blk1", "win1"), ("blk1000", "win1000"), ("blk1000+v4", "blk1000"), ("win1000+v4", "win1000"),
                 ("win0", "base")]:
        ox, oy = outs[x], base if y == "base" else outs[y]
        assert np.array_equal(ox, oy), (x, y, float(np.abs(ox - oy).max()))
        lines.append(f"{x} == {y} bit for bit")
    assert np.array_equal(run(window_variant("win0+v4", L, c), 13), base_v4)
    lines.append("win0+v4 == base+v4 bit for bit")
    for x, y in [("blk8", "win8"), ("blk16", "blk8"), ("blk16+v4", "blk16+v4nw"), ("blk16+v4", "blk16"),
                 ("blk16sink4+v4", "blk16+v4"), ("win8+v4", "win8+v4nw")]:     # the checks above can tell these apart
        e = float(np.abs(outs[x] - outs[y]).max() / np.abs(outs[y]).max())
        assert e > 1e-3, (x, y, e)
        lines.append(f"{x} vs {y}: max rel diff {e:.1e} (distinct)")
    f16 = ORIG_ATTENTION(ref.ReferenceOps(), q, k, v, (np.zeros_like(k), np.zeros_like(v)),
                         SimpleNamespace(n_past=np.array([0], np.int32), mask=None))
    for name in ["blk1000", "blk1000+v4", "base", "blk16", "blk16+v4", "blk16+v4nw", "base+v4"]:
        o = base if name == "base" else outs[name]
        lines.append(f"{name} vs the f16 cache (no offset, no rotation): max rel diff "
                     f"{float(np.abs(o - f16).max() / np.abs(f16).max()):.1e}")
    return lines


def load(args):
    from flashd.clients.tokenizer import Tokenizer
    from flashd.daemon.backends import select_backend
    from flashd.daemon.backends.kv_offset import model_key_offsets
    from flashd.daemon.models import load_model, open_model
    from flashd.daemon.models.weights import total_weight_bytes
    f, cfg = open_model(args.model)
    tok = Tokenizer.from_gguf(f.metadata_dict)
    ids = tok.encode(open(args.text).read())[:args.tokens]
    cal = tok.encode(open(args.calib).read())[:args.calib_tokens]
    backend = select_backend("cpu")
    lm = load_model((f, cfg), backend.ops.load_weight)
    max_ctx = max(len(ids), len(cal)) + 1
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), max_ctx, args.chunk)
    runner = backend.make_runner(cfg, lm.weights, max_ctx, args.chunk, plan)
    c = model_key_offsets(backend.ops, cfg, lm.weights)
    return lm, cfg, runner, ids, cal, c


def make_variants(names, lm, cfg, c, q2, k2, km):
    L = cfg.n_layers
    o2 = (km - 0).astype(np.float32)                      # calibration mean of k - c: a second offset
    table = {
        "base": lambda: Variant("base", L, c),
        "q8base": lambda: Variant("q8base", L, c, types=["q8_0"] * L),
        "norot": lambda: Variant("norot", L, c, rotate=False),
        "dcal": lambda: Variant("dcal", L, c, D=balance_scale(q2, k2)),
        "dcal2": lambda: Variant("dcal2", L, c, D=balance_scale(q2, k2, pow2=True)),
        "dcalh": lambda: Variant("dcalh", L, c, D=balance_scale(q2, k2, alpha=0.125)),
        "dw2": lambda: Variant("dw2", L, c, D=weight_scale(lm, cfg, pow2=True)),
        "dw": lambda: Variant("dw", L, c, D=weight_scale(lm, cfg)),
        "off2": lambda: Variant("off2", L, c, o2=o2),
        "dcal2off2": lambda: Variant("dcal2off2", L, c, D=balance_scale(q2, k2, pow2=True), o2=o2),
        "q8dcal2": lambda: Variant("q8dcal2", L, c, D=balance_scale(q2, k2, pow2=True), types=["q8_0"] * L),
        "mse": lambda: Variant("mse", L, c, types=["q4_mse"] * L),
        "search": lambda: Variant("search", L, c, types=["q4_search"] * L),
        "searchdcal": lambda: Variant("searchdcal", L, c, D=balance_scale(q2, k2), types=["q4_search"] * L),
        "msedcal": lambda: Variant("msedcal", L, c, D=balance_scale(q2, k2), types=["q4_mse"] * L),
        "msedcalh": lambda: Variant("msedcalh", L, c, D=balance_scale(q2, k2, alpha=0.125), types=["q4_mse"] * L),
        "signs": lambda: Variant("signs", L, c, D=random_signs(L, cfg.n_kv_heads, cfg.head_dim)),
        "sink4": lambda: Variant("sink4", L, c, sink=4),
        "sinkabs": lambda: SinkAbsorb("sinkabs", L, c),
        "sink4f16": lambda: Variant("sink4f16", L, c, sink=4, sink_type="f16"),
        "sink1f16": lambda: Variant("sink1f16", L, c, sink=1, sink_type="f16"),
        "l01q8": lambda: Variant("l01q8", L, c, types=["q8_0"] * 2 + ["q4_0"] * (L - 2)),
    }
    for n in names:                 # only:a-b: q4_0 in layers a..b, f16 elsewhere; q8:a.b.c: those layers q8_0
        if n.startswith("only:"):
            a, b = map(int, n[5:].split("-"))
            table[n] = lambda n=n, a=a, b=b: Variant(n, L, c, types=["q4_0" if a <= i <= b else "f16"
                                                                      for i in range(L)])
        elif n.startswith("q8:"):
            sel = {int(x) for x in n[3:].split(".")}
            table[n] = lambda n=n, sel=sel: Variant(n, L, c, types=["q8_0" if i in sel else "q4_0" for i in range(L)])
        elif n.startswith("sink") and n not in table:
            table[n] = lambda n=n: Variant(n, L, c, sink=int(n[4:]))
        elif n not in table and WINDOW_NAME.fullmatch(n):    # winN / blkU / base, [sinkM], [+v4 | +v4nw]
            table[n] = lambda n=n: window_variant(n, L, c)
    return [table[n]() for n in names]


def main(argv=None) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--model")
    ap.add_argument("--text")
    ap.add_argument("--calib")
    ap.add_argument("--tokens", type=int, default=512)
    ap.add_argument("--calib-tokens", type=int, default=256)
    ap.add_argument("--chunk", type=int, default=64)
    ap.add_argument("--variants", default="base,dcal2")
    ap.add_argument("--out", default=None)
    ap.add_argument("--layer-errors", action="store_true", help="per-layer local attention error on the calib text")
    ap.add_argument("--self-test", action="store_true", help="the window variants' checks on random data, no model")
    args = ap.parse_args(argv)
    if args.self_test:
        for line in self_test():
            log(line)
        return 0
    if not (args.model and args.text and args.calib):
        ap.error("--model, --text and --calib are required (but for --self-test)")
    t0 = time.perf_counter()
    lm, cfg, runner, ids, cal, c = load(args)
    log(f"loaded in {time.perf_counter() - t0:.0f} s; eval {len(ids)} tokens, calib {len(cal)}")
    t0 = time.perf_counter()
    q2, k2, km = calibrate(runner, cal, c, cfg.rope_neox)
    log(f"calibrated in {time.perf_counter() - t0:.0f} s")
    if args.layer_errors:
        errs = layer_errors(runner, cal, make_variants(args.variants.split(","), lm, cfg, c, q2, k2, km))
        for name, e in errs.items():
            log(f"{name}: per-layer relative attention error " + " ".join(f"{x:.4f}" for x in e))
        if args.out:
            json.dump(errs, open(args.out, "w"), indent=1)
        return 0
    t0 = time.perf_counter()
    f16, ref_logp = argmax_run(runner, ids, None)
    log(f"f16 in {time.perf_counter() - t0:.0f} s")
    results, kl, differ, secs = {}, {}, {}, {}
    for var in make_variants(args.variants.split(","), lm, cfg, c, q2, k2, km):
        t0 = time.perf_counter()
        top, kl[var.name] = argmax_run(runner, ids, var, ref_logp)
        results[var.name], differ[var.name] = float(np.mean(top == f16)), int((top != f16).sum())
        secs[var.name] = round(time.perf_counter() - t0, 1)
        log(f"{var.name}: {100 * results[var.name]:.2f}% ({differ[var.name]} of {len(ids)} differ), "
            f"KL {kl[var.name]:.5f} nats, in {secs[var.name]:.0f} s")
        if args.out:
            json.dump({"tokens": len(ids), "calib_tokens": len(cal), "agreement": results, "kl_nats": kl,
                       "differ": differ, "seconds": secs}, open(args.out, "w"), indent=1)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
