"""Export flashd's DFlash drafter GGUF to the layout llama.cpp's `--spec-type draft-dflash` loads.

    python -m flashd.scripts.export_dflash_llama_cpp IN.gguf --target TARGET.gguf OUT.gguf

Same function, other packaging. llama.cpp's plain DFlash drafter (the llama.cpp vendored in
llama-cpp-python 0.3.36: src/models/dflash.cpp, common/speculative.cpp, conversion/qwen.py) computes
what flashd's does (daemon/models/dflash.py; ARCHITECTURE.md, DFlash block drafter):
    F = RMSNorm_enc(fc @ concat(target features in target_layers order))  (the encoder: fc, enc.output_norm)
    context K/V per layer = k_norm(Wk F) roped at the context's positions, Wv F  (the "embd batch" branch:
        no attn_norm on F, no V norm while attn_v exists)
    block [id_last, MASK x n_max] embedded with the target's token_embd, Qwen3 layers (attn_norm,
        q/k RMSNorm per head, NeoX RoPE over head_dim, 1/sqrt(head_dim), SwiGLU), attention
        non-causal over the seq's cached context + the block (llama_set_causal_attn(ctx_dft, false))
    draft logits = target lm_head(output_norm(h)) at block rows 1..n_max
so the tensors are copied byte for byte (any format) under llama.cpp's names, and only keys change.
What each written item answers in llama.cpp's source (LLAMA_CPP_TENSORS / write_llama_cpp_metadata):

* tensors: `fc.weight`, `enc.output_norm.weight` (load_arch_tensors: LLM_TENSOR_FC, _ENC_OUTPUT_NORM; src/
  llama-arch.cpp names them "fc", "enc.output_norm") for flashd's dflash.fc / dflash.hidden_norm; the rest
  (output_norm, blk.N.*) already carry llama.cpp's names. fc's ggml shape {n_feat * n_embd, n_embd}.
* `dflash.target_layers` (load_arch_hparams: get_arr LLM_KV_TARGET_LAYERS, required, int32/uint32) holds
  flashd's target_layer_ids + 1: common/speculative.cpp extracts llama_set_embeddings_layer_inp(id), the
  *input* of target layer id (t_layer_inp[il] = inpL in the target's graph), i.e. the output of layer
  id - 1, which is what flashd captures for id - 1 (conversion/qwen.py writes `i + 1` for the same reason).
* `dflash.rope.freq_base` as float32: llama_model_loader::get_key checks the GGUF type (GKV<float> needs
  GGUF_TYPE_FLOAT32; flashd writes float64, which llama.cpp refuses). Refused here if float32 rounds it.
* the target's `tokenizer.*` keys, and `tokenizer.ggml.mask_token_id` = flashd's mask id:
  common/speculative.cpp takes the MASK from llama_vocab_mask(the draft model's vocab), and the loader
  builds the draft's vocabulary from the draft file.
* `dflash.block_size` (speculative.cpp reads it, default 16), `dflash.attention.causal` = false (read
  there too; absent means false: written so the file says it), `dflash.rope.dimension_count` = head_dim.

The target must be one whose llama.cpp graph records its layer inputs (res->t_layer_inp[il]), or
llama.cpp aborts at the first target decode with "layer input tensor is null" (src/llama-graph.cpp):
of flashd's target architectures, llama, qwen3 and qwen35 do (src/models/{llama,qwen3,qwen35}.cpp);
qwen2 (src/models/qwen2.cpp: Qwen2.5, the shipped drafter's target) does not, so it is refused.

The drafting loop differs, not the drafter: llama.cpp decodes n_max + 1 block tokens (n_max =
--spec-draft-n-max, clamped to block_size - 1), so pass block_size - 1 for the trained block
(bench/llama_spec.py does), and it verifies one greedy chain, where flashd grows a DDTree.
"""
from __future__ import annotations

import argparse
import sys
from pathlib import Path

import gguf
import numpy as np

from flashd.daemon.models.dflash_config import DFLASH_ARCH, DFlashConfig
from flashd.daemon.models.dflash_weights import open_dflash
from flashd.daemon.models.gguf_file import ModelLoadError
from flashd.scripts.gguf_out import new_gguf

__all__ = ["ExportError", "LLAMA_CPP_FEATURE_ARCHS", "LLAMA_CPP_RENAMES", "llama_cpp_name", "export"]


class ExportError(ValueError):
    """The drafter cannot be exported for llama.cpp faithfully; the message says what and why."""


# flashd name -> llama.cpp name; every other tensor keeps its name (output_norm, blk.N.*)
LLAMA_CPP_RENAMES = {"dflash.fc.weight": "fc.weight", "dflash.hidden_norm.weight": "enc.output_norm.weight"}

# flashd's target architectures whose graph in llama.cpp 0.3.36 sets res->t_layer_inp[il] (grep
# "t_layer_inp\[" src/models/*.cpp): DFlash's feature extraction needs it. Not qwen2.
LLAMA_CPP_FEATURE_ARCHS = ("llama", "qwen3", "qwen35")

K_BLOCK_SIZE = f"{DFLASH_ARCH}.block_size"
K_TARGET_LAYERS = f"{DFLASH_ARCH}.target_layers"

# the target's tokenizer keys come over as they are, except the MASK, which is the drafter's
_MASK_KEY = "tokenizer.ggml.mask_token_id"


def llama_cpp_name(name: str) -> str:
    return LLAMA_CPP_RENAMES.get(name, name)


def _target_tokenizer(reader: gguf.GGUFReader) -> list[tuple[str, object, gguf.GGUFValueType, object]]:
    """(key, value, type, array element type) of every tokenizer.* key but the mask id."""
    out = []
    for key, field in reader.fields.items():
        if not key.startswith("tokenizer.") or key == _MASK_KEY:
            continue
        vtype = field.types[0]
        sub = field.types[1] if vtype == gguf.GGUFValueType.ARRAY else None
        if sub == gguf.GGUFValueType.ARRAY:
            raise ExportError(f"target key {key}: nested arrays are not copied")
        out.append((key, field.contents(), vtype, sub))
    return out


def _n_tokens(tokenizer) -> int:
    for key, value, _, _ in tokenizer:
        if key == "tokenizer.ggml.tokens":
            return len(value)
    raise ExportError("the target GGUF has no tokenizer.ggml.tokens: llama.cpp builds the draft's vocabulary "
                      "(and finds its MASK) from the draft file, so the target's tokenizer is needed")


def write_llama_cpp_metadata(writer: gguf.GGUFWriter, cfg: DFlashConfig) -> None:
    """llama.cpp's DFlash keys for cfg (module docstring: where each is read)."""
    m = cfg.model
    theta32 = np.float32(m.rope_theta)
    if float(theta32) != m.rope_theta:
        raise ExportError(f"rope theta {m.rope_theta!r} is not exact in float32 ({float(theta32)!r}); llama.cpp "
                          f"reads dflash.rope.freq_base as float32 only")
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(m.name or "dflash drafter")
    writer.add_block_count(m.n_layers)
    writer.add_embedding_length(m.hidden)
    writer.add_feed_forward_length(m.ffn)
    writer.add_head_count(m.n_heads)
    writer.add_head_count_kv(m.n_kv_heads)
    writer.add_key_length(m.head_dim)
    writer.add_value_length(m.head_dim)
    writer.add_layer_norm_rms_eps(m.rms_eps)
    writer.add_rope_freq_base(float(theta32))               # GGUF float32
    writer.add_rope_dimension_count(m.rope_dim)             # NeoX over the whole head (DFlashConfig.decoder)
    writer.add_context_length(m.context_length)
    # gguf 0.19 (the installed gguf-py) has no add_block_size / add_target_layers: the keys by name,
    # as llama.cpp's gguf-py spells them (Keys.LLM.BLOCK_SIZE, Keys.LLM.TARGET_LAYERS)
    writer.add_uint32(K_BLOCK_SIZE, cfg.block_size)
    writer.add_causal_attention(False)
    writer.add_array(K_TARGET_LAYERS, [int(i) + 1 for i in cfg.target_layer_ids])   # int32: layer inputs


def export(drafter: Path, target: Path, out: Path, *, check_target_arch: bool = True) -> DFlashConfig:
    """Write OUT; returns the drafter's config. ExportError for anything llama.cpp would not run as flashd
    does. check_target_arch=False only to show llama.cpp's own failure on such a target."""
    try:
        _, cfg = open_dflash(drafter)          # validated: every tensor present with its shape
    except ModelLoadError as exc:
        raise ExportError(str(exc)) from exc
    from flashd.daemon.models import open_model
    try:
        tf, target_cfg = open_model(target)
        cfg.check_target(target_cfg)
    except ModelLoadError as exc:
        raise ExportError(str(exc)) from exc
    if check_target_arch and tf.arch not in LLAMA_CPP_FEATURE_ARCHS:
        raise ExportError(f"target architecture {tf.arch!r}: llama.cpp 0.3.36's {tf.arch} graph does not record "
                          f"layer inputs (res->t_layer_inp), so draft-dflash aborts with \"layer input tensor is "
                          f"null\"; llama.cpp extracts DFlash features for {', '.join(LLAMA_CPP_FEATURE_ARCHS)}")
    tokenizer = _target_tokenizer(gguf.GGUFReader(target))
    if cfg.mask_token_id >= _n_tokens(tokenizer):
        raise ExportError(f"mask_token_id {cfg.mask_token_id} is outside the target tokenizer's "
                          f"{_n_tokens(tokenizer)} tokens (llama.cpp's vocabulary is that list)")

    reader = gguf.GGUFReader(drafter)
    with new_gguf(out, DFLASH_ARCH) as writer:
        write_llama_cpp_metadata(writer, cfg)
        for key, value, vtype, sub in tokenizer:
            writer.add_key_value(key, value, vtype, sub_type=sub)
        writer.add_mask_token_id(cfg.mask_token_id)
        for t in reader.tensors:               # the stored bytes, any format: the writer derives the shape
            writer.add_tensor(llama_cpp_name(t.name), np.asarray(t.data), raw_dtype=t.tensor_type)
    return cfg


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(prog="python -m flashd.scripts.export_dflash_llama_cpp",
                                description="Export a flashd DFlash drafter GGUF to llama.cpp's draft-dflash layout "
                                            "(the same weights; the target's tokenizer is copied in).")
    p.add_argument("drafter", type=Path, help="flashd's DFlash GGUF (convert_dflash.py, flashd train-drafter)")
    p.add_argument("out", type=Path, help="output .gguf for llama.cpp's -md with --spec-type draft-dflash")
    p.add_argument("--target", type=Path, required=True, help="the target model GGUF (its tokenizer is copied)")
    args = p.parse_args(argv)
    try:
        cfg = export(args.drafter, args.target, args.out)
    except ExportError as exc:
        print(f"export_dflash_llama_cpp: {exc}", file=sys.stderr)
        return 1
    print(f"wrote {args.out}: block_size {cfg.block_size}, target_layers "
          f"{[i + 1 for i in cfg.target_layer_ids]} (llama.cpp: --spec-draft-n-max {cfg.block_size - 1})",
          file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
