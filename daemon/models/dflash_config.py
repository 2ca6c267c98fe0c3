"""DFlashConfig: the hyper-parameters of a DFlash block drafter, and its GGUF metadata schema.

A DFlash drafter (ARCHITECTURE.md, DFlash block drafter) is a small Qwen3-style stack (q/k RMSNorm, NeoX RoPE,
SwiGLU) at its target's hidden width. It has no embedding or lm_head of its own: it borrows the
target's. Its GGUF (architecture "dflash") carries the standard `dflash.*` keys of a decoder plus
the drafting keys:

    dflash.block_size         int    B: tokens per drafted block ([last token, MASK x (B-1)])
    dflash.mask_token_id      int    the MASK id, looked up in the *target's* embedding table
    dflash.target_layer_ids   [int]  target layers whose outputs (HF hidden_states[l + 1]) feed `fc`

`write_metadata` is the one writer of these keys (the converter and the synthetic maker use it), so
the schema lives in this file only.
"""
from __future__ import annotations

from dataclasses import dataclass

from .config import ModelConfig
from .gguf_file import GGUFFile, ModelLoadError

__all__ = ["DFlashConfig", "DFLASH_ARCH", "write_metadata"]

DFLASH_ARCH = "dflash"

# metadata keys (the decoder keys follow gguf.Keys naming with arch "dflash")
K_BLOCK_COUNT = "dflash.block_count"
K_EMBEDDING_LENGTH = "dflash.embedding_length"
K_FFN = "dflash.feed_forward_length"
K_HEADS = "dflash.attention.head_count"
K_KV_HEADS = "dflash.attention.head_count_kv"
K_KEY_LENGTH = "dflash.attention.key_length"
K_VALUE_LENGTH = "dflash.attention.value_length"
K_RMS_EPS = "dflash.attention.layer_norm_rms_epsilon"
K_ROPE_THETA = "dflash.rope.freq_base"
K_CONTEXT_LENGTH = "dflash.context_length"
K_BLOCK_SIZE = "dflash.block_size"
K_MASK_TOKEN_ID = "dflash.mask_token_id"
K_TARGET_LAYER_IDS = "dflash.target_layer_ids"


@dataclass(slots=True, frozen=True)
class DFlashConfig:
    """A DFlash drafter: its block layers (`model`, a ModelConfig of arch "dflash" made by `decoder`) and
    the drafting keys."""

    model: ModelConfig                 # the block layers; model.hidden == the target's hidden width
    block_size: int                    # B
    mask_token_id: int
    target_layer_ids: tuple[int, ...]  # 0-based target layer indices, in fc's column order

    @staticmethod
    def decoder(**fields) -> ModelConfig:
        """The ModelConfig of a drafter's block layers from what varies between drafters: n_layers,
        hidden, n_heads, n_kv_heads, head_dim, ffn, rope_theta (from the checkpoint's config; z-lab's
        Qwen3.5 drafters use 1e7), rms_eps, and optionally context_length (trained, informational) and
        name. The rest is fixed: the layers are Qwen3 decoder layers (q/k RMSNorm, NeoX RoPE over the
        whole head -- HF rotate_half, no row permutation in the checkpoint -- no biases), which the
        dense layer code runs, and the drafter has no vocabulary of its own (it borrows the target's
        embedding and lm_head)."""
        fields.setdefault("context_length", 32768)
        try:
            return ModelConfig(arch=DFLASH_ARCH, vocab_size=0, rope_dim=fields["head_dim"], rope_neox=True,
                               qkv_bias=False, qk_norm=True, tie_embeddings=False, **fields)
        except ModelLoadError as exc:
            raise ModelLoadError(f"DFlash drafter: {exc}") from None

    def __post_init__(self):
        if self.model.arch != DFLASH_ARCH:
            raise ModelLoadError(f"DFlash drafter: its layers' config must be DFlashConfig.decoder's, "
                                 f"got arch {self.model.arch!r}")
        if self.block_size < 2:
            raise ModelLoadError(f"DFlash drafter: block_size must be >= 2 (one known token + masks), "
                                 f"got {self.block_size}")
        if self.mask_token_id < 0:
            raise ModelLoadError(f"DFlash drafter: mask_token_id must be >= 0, got {self.mask_token_id}")
        ids = self.target_layer_ids
        if not isinstance(ids, tuple) or not ids:
            raise ModelLoadError(f"DFlash drafter: target_layer_ids must be a non-empty tuple, got {ids!r}")
        if min(ids) < 0 or len(set(ids)) != len(ids):
            raise ModelLoadError(f"DFlash drafter: target_layer_ids must be distinct and >= 0, got {list(ids)}")

    @property
    def n_features(self) -> int:
        """How many target layers feed the context (fc's input is n_features * hidden)."""
        return len(self.target_layer_ids)

    def check_target(self, target: ModelConfig) -> None:
        """Raise ModelLoadError unless this drafter can draft for `target`."""
        where = f"DFlash drafter {self.model.name!r} and target {target.name!r}"
        if self.model.hidden != target.hidden:
            raise ModelLoadError(f"{where}: hidden size {self.model.hidden} != the target's {target.hidden} "
                                 f"(the drafter reads the target's hidden states and embeddings)")
        if max(self.target_layer_ids) >= target.n_layers:
            raise ModelLoadError(f"{where}: target_layer_ids {list(self.target_layer_ids)} name a layer "
                                 f">= the target's {target.n_layers} layers")
        if max(self.target_layer_ids) == target.n_layers - 1:
            # HF's hidden_states[L] (what the drafter was trained on for layer L-1) is the output
            # *after the final norm*, not the raw layer output flashd captures: refuse, don't guess
            raise ModelLoadError(f"{where}: target_layer_ids {list(self.target_layer_ids)} include the "
                                 f"target's last layer {target.n_layers - 1}, whose trained feature is the "
                                 f"final-normed state; not supported")
        if self.mask_token_id >= target.vocab_size:
            raise ModelLoadError(f"{where}: mask_token_id {self.mask_token_id} is outside the target's "
                                 f"vocabulary of {target.vocab_size}")

    @classmethod
    def from_gguf(cls, f: GGUFFile) -> DFlashConfig:
        if f.arch != DFLASH_ARCH:
            raise ModelLoadError(f"{f.path.name}: architecture {f.arch!r} is not a DFlash drafter "
                                 f"(expected {DFLASH_ARCH!r})")
        hidden = int(f.metadata(K_EMBEDDING_LENGTH))
        n_heads = int(f.metadata(K_HEADS))
        head_dim = int(f.metadata(K_KEY_LENGTH, hidden // n_heads))
        if int(f.metadata(K_VALUE_LENGTH, head_dim)) != head_dim:
            raise ModelLoadError(f"{f.path.name}: key_length != value_length is not supported")
        return cls(
            model=cls.decoder(
                n_layers=int(f.metadata(K_BLOCK_COUNT)),
                hidden=hidden,
                n_heads=n_heads,
                n_kv_heads=int(f.metadata(K_KV_HEADS, n_heads)),
                head_dim=head_dim,
                ffn=int(f.metadata(K_FFN)),
                rope_theta=float(f.metadata(K_ROPE_THETA)),   # required: no silent default (the anchor's bug)
                rms_eps=float(f.metadata(K_RMS_EPS, 1e-6)),
                context_length=int(f.metadata(K_CONTEXT_LENGTH, 32768)),
                name=str(f.metadata("general.name", f.path.stem)),
            ),
            block_size=int(f.metadata(K_BLOCK_SIZE)),
            mask_token_id=int(f.metadata(K_MASK_TOKEN_ID)),
            target_layer_ids=tuple(int(i) for i in f.metadata(K_TARGET_LAYER_IDS)),
        )


def write_metadata(writer, cfg: DFlashConfig) -> None:
    """Write cfg's keys to a gguf.GGUFWriter created with arch DFLASH_ARCH."""
    import gguf

    m = cfg.model
    # One key a line, in from_gguf's order (the writer mirrors the reader key by key, so the lines repeat).
    writer.add_type(gguf.GGUFType.MODEL)
    writer.add_name(m.name or "dflash drafter")
    writer.add_uint32(K_BLOCK_COUNT, m.n_layers)
    writer.add_uint32(K_EMBEDDING_LENGTH, m.hidden)
    writer.add_uint32(K_FFN, m.ffn)
    writer.add_uint32(K_HEADS, m.n_heads)
    writer.add_uint32(K_KV_HEADS, m.n_kv_heads)
    writer.add_uint32(K_KEY_LENGTH, m.head_dim)
    writer.add_uint32(K_VALUE_LENGTH, m.head_dim)
    writer.add_float32(K_RMS_EPS, m.rms_eps)
    # float64: a theta like 1e7 is exact in float32 too, but a converter must never round the config
    writer.add_float64(K_ROPE_THETA, m.rope_theta)
    writer.add_uint32(K_CONTEXT_LENGTH, m.context_length)
    writer.add_uint32(K_BLOCK_SIZE, cfg.block_size)
    writer.add_uint32(K_MASK_TOKEN_ID, cfg.mask_token_id)
    writer.add_array(K_TARGET_LAYER_IDS, [int(i) for i in cfg.target_layer_ids])
