"""KV cache storage types (`flashd serve --kv-type`, `--kv-type-k`, `--kv-type-v`): names, bytes per row.

A KV row is the head_dim values of one (slot, KV head) of K or of V. `f16` is the backend's unquantized
cache (float16 on CUDA; the reference backend keeps float32, its oracle precision). `q8_0` and `q4_0`
store a row as whole ggml blocks of 32 values, byte for byte ggml's layout:

    q8_0: 34 bytes = float16 d, 32 x int8 q             value = d * q
    q4_0: 18 bytes = float16 d, 16 bytes of nibbles     value = d * (q - 8); byte j holds values j (low
                                                        nibble) and j + 16 (high nibble)

so a quantized type needs head_dim % 32 == 0. The rounding (ggml's reference encoders) is in kv_quant.py.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KV_CACHE_TYPES", "QUANT_BLOCK", "BLOCK_BYTES", "KVTypes", "row_bytes", "parse_kv_types"]

KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
QUANT_BLOCK = 32                                 # values per block of a quantized type
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}           # bytes per block


def row_bytes(kv_type: str, head_dim: int) -> int:
    """Bytes of one row of head_dim values stored as kv_type (f16: float16)."""
    if kv_type == "f16":
        return 2 * head_dim
    if kv_type not in BLOCK_BYTES:
        raise ValueError(f"kv type must be one of {', '.join(KV_CACHE_TYPES)}, got {kv_type!r}")
    if head_dim % QUANT_BLOCK:
        raise ValueError(f"a {kv_type} KV cache needs head_dim to be a multiple of {QUANT_BLOCK}, got {head_dim}")
    return head_dim // QUANT_BLOCK * BLOCK_BYTES[kv_type]


@dataclass(slots=True, frozen=True)
class KVTypes:
    """The storage types of K and of V (they may differ, e.g. K q8_0 and V q4_0)."""

    k: str = "f16"
    v: str = "f16"

    def __post_init__(self):
        for name in ("k", "v"):
            value = getattr(self, name)
            if value not in KV_CACHE_TYPES:
                raise ValueError(f"kv type of {name.upper()} must be one of {', '.join(KV_CACHE_TYPES)}, "
                                 f"got {value!r}")

    @property
    def quantized(self) -> bool:
        return self.k != "f16" or self.v != "f16"

    def check_head_dim(self, head_dim: int) -> None:
        """ValueError when a quantized type cannot store rows of head_dim values."""
        for kind in (self.k, self.v):
            row_bytes(kind, head_dim)

    def as_dict(self) -> dict:
        return {"k": self.k, "v": self.v}

    def __str__(self) -> str:
        return self.k if self.k == self.v else f"k={self.k},v={self.v}"


def parse_kv_types(both: str | None, k: str | None, v: str | None) -> KVTypes:
    """--kv-type sets both, --kv-type-k / --kv-type-v override one each (default f16)."""
    base = both or "f16"
    return KVTypes(k or base, v or base)
