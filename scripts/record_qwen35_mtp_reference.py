"""Record llama.cpp's multi-token-prediction (MTP) logits on a tiny synthetic qwen35 model with an MTP block
(issue 15, item 5).

The model (MODEL: float32 weights, `make_synthetic_gguf --arch qwen35 --mtp`, fixed seed) is loaded by llama.cpp
with `llama_model_params.load_mtp`, into two contexts, as llama.cpp's own MTP speculative driver
(common/speculative.cpp, common_speculative_impl_draft_mtp) sets them up:

- the target context (default type) with llama_set_embeddings_nextn(ctx, true, masked=false): one decode of the
  prompt x_0 .. x_{N-1}; per position its logits and h_p, the output-normed hidden row its lm_head reads
  (llama_get_embeddings_nextn_ith);
- the MTP context (ctx_type = LLAMA_CONTEXT_TYPE_MTP) with llama_set_embeddings_nextn(ctx, true, masked=true):
  1. the replay: one batch of the prompt's tokens, token x_p at position p paired with the state row h_{p-1}
     (h_{-1} = zeros), all positions output: the block's logits at every position (`replay`) -- what the
     driver's process() hook feeds it after a target prefill;
  2. a draft chain: x_N = argmax(target logits at N - 1) at position N with h_{N-1}, then N_CHAIN - 1 more
     steps, each the previous step's argmax at the next position with the previous step's own h_nextn row
     (the driver's draft()): every step's logits (`chain`).

Batches are built with the extended batch API (llama_batch_ext_add_token, _set_pos, _set_embd_token for the h row,
_set_output_logits) and run with llama_process; the nextn getters are C++ functions of libllama (src/llama-ext.h),
called through ctypes by their mangled names. It needs llama-cpp-python 0.3.36 built from its sdist (not a flashd
dependency; any target directory on PYTHONPATH):
    pip install --target DIR llama-cpp-python==0.3.36
    PYTHONPATH=DIR python -m flashd.scripts.record_qwen35_mtp_reference --out tests/data/reference/qwen35-mtp-synthetic.json
"""
from __future__ import annotations

import ctypes
from pathlib import Path

import numpy as np

from flashd.scripts.llama_cpp_logits import model_identity, prompt_ids, recorder_info, run_recorder, top
from flashd.scripts.make_synthetic_gguf import write_synthetic_model
from flashd.scripts.synthetic_spec import SyntheticSpec

FORMAT = "flashd-qwen35-mtp-reference/1"
# layers: linear, linear, full, linear + the MTP block (index 4); head_dim 32 with 16 rotated dims; Hk 2, Hv 4;
# untied lm_head; the block has nextn.shared_head_norm and falls back to token_embd / output
MODEL = SyntheticSpec(arch="qwen35", n_layers=4, hidden=64, n_heads=4, n_kv_heads=2, head_dim=32, rope_dim=16,
                      ffn=128, vocab_size=384, rope_theta=10000.0, ssm_state=16, ssm_k_heads=2, ssm_v_heads=4,
                      ssm_conv_kernel=4, full_attn_interval=3, weight_type="F32", seed=37, mtp=True,
                      name="synthetic qwen35 mtp")
PROMPT_LEN = 40
PROMPT_SEED = 5
N_CHAIN = 4
N_CTX = 64
FULL_ROWS = (0, 1, 20, 39)


def _lib():
    import llama_cpp

    lib = llama_cpp.llama_cpp._lib
    get_ith = getattr(lib, "_Z30llama_get_embeddings_nextn_ithP13llama_contexti")   # llama-ext.h, C++ linkage
    get_ith.argtypes, get_ith.restype = [ctypes.c_void_p, ctypes.c_int32], ctypes.POINTER(ctypes.c_float)
    set_nextn = getattr(lib, "_Z26llama_set_embeddings_nextnP13llama_contextbb")
    set_nextn.argtypes, set_nextn.restype = [ctypes.c_void_p, ctypes.c_bool, ctypes.c_bool], None
    return llama_cpp, get_ith, set_nextn


class _Embd(ctypes.Structure):
    _fields_ = [("data", ctypes.POINTER(ctypes.c_float)), ("n_rows", ctypes.c_size_t), ("n_embd", ctypes.c_size_t)]


def _process(L, ctx, tokens, positions, h_rows, outputs) -> None:
    """One llama_process of (token, position, h row or None, output?) entries."""
    set_embd = L.llama_cpp._lib.llama_batch_ext_set_embd_token
    set_embd.argtypes, set_embd.restype = [ctypes.c_void_p, ctypes.c_int32, _Embd], ctypes.c_bool
    batch = L.llama_batch_ext_init(ctx)
    keep = []
    try:
        for tok, pos, h, out in zip(tokens, positions, h_rows, outputs):
            idx = L.llama_batch_ext_add_token(batch, 0, int(tok))
            assert idx >= 0, f"llama_batch_ext_add_token: {idx}"
            p = (ctypes.c_int32 * 4)(int(pos), 0, 0, 0)
            keep.append(p)
            assert L.llama_batch_ext_set_pos(batch, idx, p)
            if h is not None:
                row = np.ascontiguousarray(h, np.float32)
                keep.append(row)
                assert set_embd(batch, idx, _Embd(row.ctypes.data_as(ctypes.POINTER(ctypes.c_float)), 1, row.size))
            assert L.llama_batch_ext_set_output_logits(batch, idx, bool(out))
        rc = L.llama_process(ctx, L.LLAMA_PROCESS_TYPE_DECODE, batch)
        assert rc == 0, f"llama_process: {rc}"
    finally:
        L.llama_batch_ext_free(batch)


def _context(L, model, mtp: bool):
    cp = L.llama_context_default_params()
    cp.n_ctx = cp.n_batch = cp.n_ubatch = N_CTX
    cp.n_threads = cp.n_threads_batch = 2
    cp.type_k = cp.type_v = L.GGML_TYPE_F32
    cp.flash_attn_type = 0            # LLAMA_FLASH_ATTN_TYPE_DISABLED
    if mtp:
        cp.ctx_type = L.LLAMA_CONTEXT_TYPE_MTP
    ctx = L.llama_init_from_model(model, cp)
    assert ctx, "llama_init_from_model failed"
    return ctx


def record_mtp(model_path: Path, ids: list[int]) -> dict:
    L, get_ith, set_nextn = _lib()
    L.llama_backend_init()
    mp = L.llama_model_default_params()
    mp.load_mtp = True
    mp.n_gpu_layers = 0
    model = L.llama_model_load_from_file(str(model_path).encode(), mp)
    assert model and L.llama_model_n_layer_nextn(model) == 1
    n_vocab = L.llama_vocab_n_tokens(L.llama_model_get_vocab(model))
    D = MODEL.hidden
    tgt, dft = _context(L, model, False), _context(L, model, True)
    try:
        set_nextn(tgt, True, False)
        set_nextn(dft, True, True)
        N = len(ids)
        _process(L, tgt, ids, range(N), [None] * N, [True] * N)
        t_logits = np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(tgt, i), (n_vocab,)) for i in range(N)])
        h = np.array([np.ctypeslib.as_array(get_ith(tgt, i), (D,)) for i in range(N)], np.float32)
        # the replay: x_p with h_{p-1}
        h_prev = np.concatenate([np.zeros((1, D), np.float32), h[:-1]])
        _process(L, dft, ids, range(N), list(h_prev), [True] * N)
        r_logits = np.array([np.ctypeslib.as_array(L.llama_get_logits_ith(dft, i), (n_vocab,)) for i in range(N)])
        # the draft chain from the target's next token
        tok, hrow, chain_tokens, chain_rows = int(np.argmax(t_logits[-1])), h[-1].copy(), [], []
        for k in range(N_CHAIN):
            chain_tokens.append(tok)
            _process(L, dft, [tok], [N + k], [hrow], [True])
            row = np.ctypeslib.as_array(L.llama_get_logits_ith(dft, 0), (n_vocab,)).copy()
            chain_rows.append(row)
            hrow = np.ctypeslib.as_array(get_ith(dft, 0), (D,)).copy()
            tok = int(np.argmax(row))
    finally:
        L.llama_free(dft)
        L.llama_free(tgt)
        L.llama_model_free(model)
    rnd = lambda a: [round(float(x), 6) for x in a]       # noqa: E731
    return {
        "prompt_ids": ids,
        "target": {"argmax_ids": [int(i) for i in t_logits.argmax(1)],
                   "h_rows": {str(p): rnd(h[p]) for p in FULL_ROWS}},
        "replay": {"argmax_ids": [int(i) for i in r_logits.argmax(1)],
                   "top_ids": [top(r)[0] for r in r_logits], "top_logits": [top(r)[1] for r in r_logits],
                   "full_rows": {str(p): rnd(r_logits[p]) for p in FULL_ROWS}},
        "chain": {"tokens": chain_tokens, "positions": list(range(N, N + N_CHAIN)),
                  "argmax_ids": [int(np.argmax(r)) for r in chain_rows], "rows": [rnd(r) for r in chain_rows]},
    }


def record_all(tmp: Path) -> dict:
    path = write_synthetic_model(tmp / "mtp.gguf", MODEL)
    info = recorder_info(N_CTX, "scripts/record_qwen35_mtp_reference.py")
    info.update(load="llama_model_params.load_mtp = True; two contexts (default, LLAMA_CONTEXT_TYPE_MTP), "
                     f"n_ctx = n_batch = n_ubatch = {N_CTX}, F32 K/V, no flash attention, 2 threads",
                teacher_forced="target: one llama_process of the prompt, every position output; h = "
                               "llama_get_embeddings_nextn_ith; MTP replay: one llama_process of (x_p, pos p, "
                               "h_{p-1}; h_{-1} = 0), every position output",
                greedy=f"MTP chain: {N_CHAIN} llama_process calls of one row, (x_N = argmax target row N-1, h_{{N-1}}), "
                       "then (argmax of the previous step, the previous step's h_nextn)")
    return {"format": FORMAT, "recorder": info, "model": {**model_identity(path, MODEL),
                                                          **record_mtp(path, prompt_ids(MODEL.vocab_size, PROMPT_LEN,
                                                                                        PROMPT_SEED))}}


def main(argv: list[str] | None = None) -> int:
    return run_recorder(__doc__, argv, record_all, lambda rec: f"{PROMPT_LEN} replayed positions, {N_CHAIN} chained "
                                                              "draft steps")


if __name__ == "__main__":
    raise SystemExit(main())
