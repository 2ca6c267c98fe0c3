"""Synthetic GGUF models: random weights at any shape, in any supported weight format.

The files look like llama.cpp's converter output for the architecture (tensor names and metadata
keys from `gguf.constants`, GGUF dims order, F32 norms and biases, a byte-level BPE tokenizer), so
every loader and backend can be tested on small models and benchmarked on real shapes without the
real weights.

What a weight IS is defined by `gguf.quants.dequantize` of the stored bytes; the float weights the
file was made from can be regenerated with `float_tensor(spec, name)` (deterministic per tensor).

Layout of the file (numpy shapes, row-major; GGUF reports each shape reversed, ne[0] = columns):
    token_embd.weight            (vocab, hidden)
    blk.N.attn_norm.weight       (hidden,)                   F32
    blk.N.attn_q.weight          (n_heads*head_dim, hidden)   y = W @ x
    blk.N.attn_k/attn_v.weight   (n_kv_heads*head_dim, hidden)
    blk.N.attn_{q,k,v}.bias      qwen2 only, F32
    blk.N.attn_{q,k}_norm.weight qwen3 only, (head_dim,) F32
    blk.N.attn_output.weight     (hidden, n_heads*head_dim)
    blk.N.ffn_norm.weight        (hidden,)                   F32
    blk.N.ffn_gate/ffn_up.weight (ffn, hidden)
    blk.N.ffn_down.weight        (hidden, ffn)
    output_norm.weight           (hidden,)                   F32
    output.weight                (vocab, hidden)             absent when tie_embeddings
    qwen35: the hybrid's blocks (synthetic_qwen35.py); with --mtp one more block, index n_layers, holding the
    multi-token-prediction head (qwen35_mtp_tensors) and block_count = n_layers + 1, nextn_predict_layers = 1

CLI: python -m flashd.scripts.make_synthetic_gguf OUT.gguf [--preset qwen2.5-1.5b] [--arch ...] ...
"""

from __future__ import annotations

import argparse
import dataclasses
import fnmatch
import sys
import zlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path

import numpy as np
import gguf
from gguf.constants import GGML_QUANT_SIZES, MODEL_TENSOR, MODEL_TENSORS

from flashd.scripts.gguf_out import written_gguf
from flashd.scripts.kquants import OWN_QUANTIZERS
from flashd.scripts.synthetic_arch import ARCH_LAYOUTS, TensorSlot
from flashd.scripts.synthetic_qwen35 import qwen35_mtp_tensors
from flashd.scripts.synthetic_spec import SUPPORTED_WEIGHT_TYPES, SyntheticSpec
from flashd.scripts.synthetic_vocab import N_BYTE_TOKENS, SPECIAL_TOKENS, build_vocab, bytes_to_unicode  # noqa: F401 (bytes_to_unicode: re-exported)

# ----------------------------------------------------------------------------------------------
# Spec
# ----------------------------------------------------------------------------------------------

# general.file_type for a file whose matrices are all of one type. llama.cpp has no "pure Q4_K"
# file type; Q4_K_S / Q5_K_S are the closest (mostly that type).
_FILE_TYPE: dict[str, gguf.LlamaFileType] = {
    "F32": gguf.LlamaFileType.ALL_F32,
    "F16": gguf.LlamaFileType.MOSTLY_F16,
    "BF16": gguf.LlamaFileType.MOSTLY_BF16,
    "Q8_0": gguf.LlamaFileType.MOSTLY_Q8_0,
    "Q4_0": gguf.LlamaFileType.MOSTLY_Q4_0,
    "Q4_1": gguf.LlamaFileType.MOSTLY_Q4_1,
    "Q5_0": gguf.LlamaFileType.MOSTLY_Q5_0,
    "Q5_1": gguf.LlamaFileType.MOSTLY_Q5_1,
    "Q4_K": gguf.LlamaFileType.MOSTLY_Q4_K_S,
    "Q5_K": gguf.LlamaFileType.MOSTLY_Q5_K_S,
    "Q6_K": gguf.LlamaFileType.MOSTLY_Q6_K,
}

CHATML_TEMPLATE = (
    "{%- for message in messages %}"
    "{{- '<|im_start|>' + message['role'] + '\\n' + message['content'] + '<|im_end|>' + '\\n' }}"
    "{%- endfor %}"
    "{%- if add_generation_prompt %}{{- '<|im_start|>assistant\\n' }}{%- endif %}"
)


# ----------------------------------------------------------------------------------------------
# Tensor plan: names, shapes, types and initial distributions, decided before any data exists
# ----------------------------------------------------------------------------------------------

# The final logits' standard deviation (over the vocabulary) for an RMS-normalised input: wide
# enough that the top two logits rarely tie, narrow enough that sampling stays non-trivial.
LOGIT_STD = 2.0
NORM_WEIGHT_STD = 0.1   # norm weights ~ N(1, 0.1): near 1 but not all equal
BIAS_STD = 0.1


@dataclass(slots=True, frozen=True)
class TensorPlan:
    name: str                 # GGUF tensor name, e.g. "blk.0.attn_q.weight"
    shape: tuple[int, ...]    # numpy shape (rows, cols); GGUFReader reports it reversed
    qtype: gguf.GGMLQuantizationType
    init_mean: float          # float weights ~ N(init_mean, init_std)
    init_std: float
    negative_exp: bool = False  # the weights are -exp(N(init_mean, init_std)) (qwen35's ssm_a = -exp(A_log))

    @property
    def n_bytes(self) -> int:
        block_size, type_size = GGML_QUANT_SIZES[self.qtype]
        return int(np.prod(self.shape)) // block_size * type_size


def _init_distribution(spec: SyntheticSpec, role: str, shape: tuple[int, ...]) -> tuple[float, float]:
    """(mean, std) of a tensor's float weights, chosen so activations stay O(1) at any depth.

    A matrix (out, in) has std 1/sqrt(in), so W @ x keeps the RMS of an O(1) input. Projections
    back into the residual stream are further scaled by 1/sqrt(2 n_layers) (GPT-2 style): the
    residual stream then ends with variance ~ embedding + 2 n_layers * 1/(2 n_layers) = O(1).
    """
    if role == "norm":
        return 1.0, NORM_WEIGHT_STD
    if role == "bias":
        return 0.0, BIAS_STD
    if role == "dt_bias":      # qwen35: softplus(alpha + dt_bias) ~ 1.3 for alpha ~ N(0, 1)
        return 1.0, NORM_WEIGHT_STD
    if role == "ssm_a":        # -exp(N(-2, 0.5)) ~ -0.14: with the dt softplus a decay of ~0.83 per token
        return -2.0, 0.5
    fan_in = shape[-1]
    if role in ("matrix", "conv"):
        return 0.0, 1.0 / np.sqrt(fan_in)
    if role == "out_matrix":
        return 0.0, 1.0 / np.sqrt(fan_in * 2 * spec.n_layers)
    if role == "lm_head":      # logits = W @ rmsnorm(x): std LOGIT_STD over the vocabulary
        return 0.0, LOGIT_STD / np.sqrt(fan_in)
    if role == "embedding":    # tied: the same matrix is the lm_head
        return 0.0, (LOGIT_STD / np.sqrt(fan_in)) if spec.tie_embeddings else 1.0
    raise AssertionError(f"unknown role {role!r}")


def _resolve_matrix_type(spec: SyntheticSpec, name: str) -> str:
    type_name = spec.weight_type
    for glob, override in spec.type_overrides:
        if fnmatch.fnmatchcase(name, glob):
            type_name = override
    return type_name


def tensor_plan(spec: SyntheticSpec) -> list[TensorPlan]:
    """Every tensor of the file in write order (token_embd, blocks, output_norm, output).

    Raises ValueError naming the tensor when a row length does not fit its format's block size, and
    when a type override matches no weight matrix (a typo would otherwise be silently ignored).
    """
    layout = ARCH_LAYOUTS[spec.arch]
    T = MODEL_TENSOR
    slots = [TensorSlot(T.TOKEN_EMBD, "weight", (spec.vocab_size, spec.hidden), "embedding")]
    for bid in range(spec.n_layers):
        slots += layout.layer_tensors(spec, bid)
    if spec.mtp:            # qwen35's multi-token-prediction block, block index n_layers (after the trunk)
        slots += qwen35_mtp_tensors(spec)
    slots.append(TensorSlot(T.OUTPUT_NORM, "weight", (spec.hidden,), "norm"))
    if not spec.tie_embeddings:
        slots.append(TensorSlot(T.OUTPUT, "weight", (spec.vocab_size, spec.hidden), "lm_head"))

    allowed_kinds = set(MODEL_TENSORS[layout.model_arch]) | set(layout.extra_kinds)
    plans: list[TensorPlan] = []
    for slot in slots:
        assert slot.kind in allowed_kinds, f"{slot.kind.name} is not a tensor of {spec.arch} in gguf.constants"
        if len(slot.shape) == 2 and slot.role != "conv":   # ssm_conv1d stays F32 (ggml_ssm_conv reads F32)
            qtype = gguf.GGMLQuantizationType[_resolve_matrix_type(spec, slot.name)]
            block_size = GGML_QUANT_SIZES[qtype][0]
            if slot.shape[1] % block_size != 0:
                raise ValueError(
                    f"{slot.name}: row length {slot.shape[1]} (numpy shape {slot.shape}) is not a "
                    f"multiple of the {qtype.name} block size {block_size}")
        else:
            qtype = gguf.GGMLQuantizationType.F32  # norms and biases stay F32, as llama.cpp writes them
        mean, std = _init_distribution(spec, slot.role, slot.shape)
        plans.append(TensorPlan(slot.name, slot.shape, qtype, float(mean), float(std), slot.role == "ssm_a"))

    matrix_names = [p.name for p in plans if len(p.shape) == 2 and not p.name.endswith("ssm_conv1d.weight")]
    for glob, _ in spec.type_overrides:
        if not any(fnmatch.fnmatchcase(n, glob) for n in matrix_names):
            raise ValueError(f"type override {glob!r} matches no weight matrix of this model")
    return plans


# ----------------------------------------------------------------------------------------------
# Float weights (deterministic per tensor) and their encoding
# ----------------------------------------------------------------------------------------------

# Rows generated and encoded at a time: bounds peak memory for vocab-sized matrices at real shapes.
_CHUNK_ELEMENTS = 1 << 22


def _float_row_chunks(spec: SyntheticSpec, plan: TensorPlan) -> Iterator[np.ndarray]:
    """The tensor's float32 weights as consecutive row chunks (2-D) or one 1-D chunk.

    The generator is seeded from (spec.seed, tensor name), so a tensor does not depend on the
    others; chunking draws the same stream as one call would.
    """
    rng = np.random.default_rng([spec.seed, zlib.crc32(plan.name.encode())])
    if len(plan.shape) == 1:
        x = rng.standard_normal(plan.shape, dtype=np.float32) * np.float32(plan.init_std) + np.float32(plan.init_mean)
        yield -np.exp(x) if plan.negative_exp else x
        return
    n_rows, n_cols = plan.shape
    rows_per_chunk = max(1, _CHUNK_ELEMENTS // n_cols)
    for row0 in range(0, n_rows, rows_per_chunk):
        n = min(rows_per_chunk, n_rows - row0)
        chunk = rng.standard_normal((n, n_cols), dtype=np.float32)
        chunk *= np.float32(plan.init_std)
        chunk += np.float32(plan.init_mean)
        yield chunk


def float_tensor(spec: SyntheticSpec, name: str) -> np.ndarray:
    """The float32 weights (numpy shape of the plan) that tensor `name` of the file was encoded from."""
    for plan in tensor_plan(spec):
        if plan.name == name:
            return np.concatenate(list(_float_row_chunks(spec, plan)), axis=0).reshape(plan.shape)
    raise KeyError(f"no tensor {name!r} in a {spec.arch} model of this spec")


def encode_tensor(x: np.ndarray, qtype: gguf.GGMLQuantizationType) -> np.ndarray:
    """Encode float rows x (n_rows, n_cols) or (n,) in `qtype`.

    Returns float32/float16 arrays of x's shape for F32/F16, else uint8 (n_rows, bytes_per_row).
    """
    x = np.ascontiguousarray(x, dtype=np.float32)
    if qtype in OWN_QUANTIZERS:
        block_size = GGML_QUANT_SIZES[qtype][0]
        blocks = OWN_QUANTIZERS[qtype](x.reshape(-1, block_size))
        return blocks.reshape(*x.shape[:-1], -1)
    return gguf.quants.quantize(x, qtype)


_POOL_ROWS = 256


def random_block_rows(spec: SyntheticSpec, plan: TensorPlan) -> np.ndarray:
    """The matrix as rows drawn at random from a pool of _POOL_ROWS valid encoded rows (spec.random_blocks): a
    quantized pool is random codes with float16 scales scaled so the values' root mean square is the tensor's
    init_std (random_weights.py), a float pool N(mean, std) encoded. No quantizer runs, so a 27B-shape Q4_K_M file
    is written at the speed of the disk."""
    from flashd.scripts.random_weights import FLOAT_FORMATS, random_weights, scaled_weights

    rng = np.random.default_rng([spec.seed, zlib.crc32(plan.name.encode()), 1])
    n_rows, n_cols = plan.shape
    n_pool = min(n_rows, _POOL_ROWS)
    if plan.qtype in FLOAT_FORMATS:
        pool = rng.standard_normal((n_pool, n_cols), dtype=np.float32) * np.float32(plan.init_std)
        pool = encode_tensor(pool + np.float32(plan.init_mean), plan.qtype).view(np.uint8).reshape(n_pool, -1)
    else:
        pool = scaled_weights(random_weights(rng, plan.qtype, n_pool, n_cols), plan.qtype, n_cols,
                              float(np.hypot(plan.init_std, plan.init_mean)))
    return pool[rng.integers(0, n_pool, n_rows)]


# ----------------------------------------------------------------------------------------------
# Writing
# ----------------------------------------------------------------------------------------------

def _write_metadata(writer: gguf.GGUFWriter, spec: SyntheticSpec) -> None:
    layout = ARCH_LAYOUTS[spec.arch]
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(spec.name)
    writer.add_block_count(spec.n_layers + int(spec.mtp))     # llama.cpp counts the MTP block in block_count
    writer.add_context_length(spec.context_length)
    writer.add_embedding_length(spec.hidden)
    writer.add_feed_forward_length(spec.ffn)
    writer.add_head_count(spec.n_heads)
    writer.add_head_count_kv(spec.n_kv_heads)
    writer.add_rope_freq_base(spec.rope_theta)
    if spec.rope_scaling != "none":       # the keys convert_hf_to_gguf writes for a config.json rope_scaling
        writer.add_rope_scaling_type(gguf.RopeScalingType(spec.rope_scaling))
        writer.add_rope_scaling_factor(spec.rope_factor)
        if spec.rope_orig_ctx is not None:
            writer.add_rope_scaling_orig_ctx_len(spec.rope_orig_ctx)
    writer.add_layer_norm_rms_eps(spec.rms_eps)
    writer.add_file_type(_FILE_TYPE[spec.weight_type])
    layout.write_arch_metadata(writer, spec)

    vocab = build_vocab(spec.vocab_size)
    writer.add_tokenizer_model("gpt2")
    writer.add_tokenizer_pre(layout.tokenizer_pre)
    writer.add_token_list(list(vocab.tokens))
    writer.add_token_types(list(vocab.token_types))
    writer.add_token_merges(list(vocab.merges))
    writer.add_bos_token_id(vocab.bos_id)
    writer.add_eos_token_id(vocab.eos_id)
    writer.add_pad_token_id(vocab.pad_id)
    writer.add_add_bos_token(False)
    writer.add_chat_template(CHATML_TEMPLATE)
    writer.add_quantization_version(gguf.GGML_QUANT_VERSION)


def write_synthetic_model(path: str | Path, spec: SyntheticSpec, *, progress: Callable[[str], None] | None = None) -> Path:
    """Write the model of `spec` to `path`, one tensor in memory at a time; returns the path."""
    path = Path(path)
    plans = tensor_plan(spec)
    with written_gguf(path, gguf.MODEL_ARCH_NAMES[ARCH_LAYOUTS[spec.arch].model_arch]) as writer:
        _write_metadata(writer, spec)
        for plan in plans:
            # Element shape + raw_dtype: the writer stores the shape reversed (ne[0] = columns).
            writer.add_tensor_info(plan.name, plan.shape, np.dtype(np.float32), plan.n_bytes, raw_dtype=plan.qtype)
        writer.write_header_to_file()
        writer.write_kv_data_to_file()
        writer.write_ti_data_to_file()
        for plan in plans:
            if progress is not None:
                progress(f"{plan.name} {plan.shape} {plan.qtype.name}")
            if spec.random_blocks and len(plan.shape) == 2 and not plan.name.endswith("ssm_conv1d.weight"):
                data = random_block_rows(spec, plan)
            else:
                encoded = [encode_tensor(chunk, plan.qtype) for chunk in _float_row_chunks(spec, plan)]
                data = np.concatenate(encoded, axis=0) if len(encoded) > 1 else encoded[0]
            writer.write_tensor_data(data)
    return path


# ----------------------------------------------------------------------------------------------
# Presets and CLI
# ----------------------------------------------------------------------------------------------

def __getattr__(name: str):
    """PRESETS (synthetic_presets.py), imported on first use: building them checks each against tensor_plan."""
    if name == "PRESETS":
        from flashd.scripts.synthetic_presets import PRESETS
        return PRESETS
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")


# CLI flag -> SyntheticSpec field
_CLI_FIELDS = {
    "arch": "arch", "layers": "n_layers", "hidden": "hidden", "heads": "n_heads", "kv_heads": "n_kv_heads",
    "head_dim": "head_dim", "ffn": "ffn", "vocab": "vocab_size", "ctx": "context_length",
    "rope_theta": "rope_theta", "rope_scaling": "rope_scaling", "rope_factor": "rope_factor",
    "rope_orig_ctx": "rope_orig_ctx", "rms_eps": "rms_eps", "type": "weight_type", "seed": "seed", "name": "name",
    "rope_dim": "rope_dim", "ssm_state": "ssm_state", "ssm_k_heads": "ssm_k_heads", "ssm_v_heads": "ssm_v_heads",
    "ssm_conv": "ssm_conv_kernel", "full_attn_interval": "full_attn_interval", "random_blocks": "random_blocks",
    "mtp": "mtp", "mtp_own_head": "mtp_own_head",
}


def _parse_override(text: str) -> tuple[str, str]:
    glob, sep, type_name = text.rpartition("=")
    if not sep or not glob or not type_name:
        raise argparse.ArgumentTypeError(f"expected GLOB=TYPE, got {text!r}")
    return glob, type_name.upper()


def build_arg_parser() -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog="python -m flashd.scripts.make_synthetic_gguf",
        description="Write a GGUF model with random weights (llama/qwen2/qwen3/qwen35 layout, any weight format).")
    p.add_argument("out", type=Path, help="output .gguf path")
    p.add_argument("--preset", choices=sorted(__getattr__("PRESETS")), help="start from real shapes; other flags override")
    p.add_argument("--arch", choices=sorted(ARCH_LAYOUTS))
    p.add_argument("--layers", type=int)
    p.add_argument("--hidden", type=int)
    p.add_argument("--heads", type=int)
    p.add_argument("--kv-heads", type=int)
    p.add_argument("--head-dim", type=int)
    p.add_argument("--ffn", type=int)
    p.add_argument("--vocab", type=int)
    p.add_argument("--ctx", type=int, help="context_length")
    p.add_argument("--rope-theta", type=float)
    p.add_argument("--rope-scaling", choices=("none", "linear", "yarn"), help="{arch}.rope.scaling.type")
    p.add_argument("--rope-factor", type=float, help="{arch}.rope.scaling.factor")
    p.add_argument("--rope-orig-ctx", type=int, help="{arch}.rope.scaling.original_context_length")
    p.add_argument("--rms-eps", type=float)
    p.add_argument("--type", type=str.upper, choices=SUPPORTED_WEIGHT_TYPES, help="weight matrix format")
    p.add_argument("--override", type=_parse_override, action="append", default=[], metavar="GLOB=TYPE",
                   help="type for matching weight matrices, e.g. 'token_embd.weight=Q4_K' (repeatable; later wins)")
    p.add_argument("--tie", action=argparse.BooleanOptionalAction, default=None, help="tie lm_head to token_embd")
    p.add_argument("--rope-dim", type=int, help="rotated dims of each head (qwen35: partial rotary)")
    p.add_argument("--ssm-state", type=int, help="qwen35: head size of the Gated DeltaNet layers")
    p.add_argument("--ssm-k-heads", type=int, help="qwen35: query/key heads of the Gated DeltaNet layers")
    p.add_argument("--ssm-v-heads", type=int, help="qwen35: value heads of the Gated DeltaNet layers")
    p.add_argument("--ssm-conv", type=int, help="qwen35: taps of the short causal convolution")
    p.add_argument("--full-attn-interval", type=int, help="qwen35: every n-th layer is full attention")
    p.add_argument("--mtp", action=argparse.BooleanOptionalAction, default=None,
                   help="qwen35: add one multi-token-prediction (nextn) block after the trunk")
    p.add_argument("--mtp-own-head", action=argparse.BooleanOptionalAction, default=None,
                   help="qwen35 --mtp: the MTP block gets its own nextn.embed_tokens and nextn.shared_head_head")
    p.add_argument("--random-blocks", action=argparse.BooleanOptionalAction, default=None,
                   help="matrices as random valid quant blocks, no quantizer (seconds for a 27B shape)")
    p.add_argument("--seed", type=int)
    p.add_argument("--name")
    p.add_argument("-q", "--quiet", action="store_true", help="do not list tensors on stderr")
    return p


def spec_from_args(args: argparse.Namespace) -> SyntheticSpec:
    base = __getattr__("PRESETS")[args.preset] if args.preset else SyntheticSpec()
    changes = {field: getattr(args, flag) for flag, field in _CLI_FIELDS.items() if getattr(args, flag) is not None}
    if args.tie is not None:
        changes["tie_embeddings"] = args.tie
    if args.override:
        changes["type_overrides"] = base.type_overrides + tuple(args.override)
    return dataclasses.replace(base, **changes)


def main(argv: list[str] | None = None) -> int:
    parser = build_arg_parser()
    args = parser.parse_args(argv)
    try:
        spec = spec_from_args(args)
    except ValueError as e:
        parser.error(str(e))
    progress = None if args.quiet else (lambda line: print(line, file=sys.stderr))
    path = write_synthetic_model(args.out, spec, progress=progress)
    print(f"wrote {path} ({path.stat().st_size} bytes): {spec}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())
