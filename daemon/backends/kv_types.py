"""KV cache storage types (`flashd serve --kv-type`, `--kv-type-k`, `--kv-type-v`): names, bytes per row.

A KV row is the head_dim values of one (slot, KV head) of K or of V. `f16` is the backend's unquantized
cache (float16 on CUDA; the reference backend keeps float32, its oracle precision). `q8_0` and `q4_0`
store a row as whole ggml blocks of 32 values, byte for byte ggml's layout:

    q8_0: 34 bytes = float16 d, 32 x int8 q             value = d * q
    q4_0: 18 bytes = float16 d, 16 bytes of nibbles     value = d * (q - 8); byte j holds values j (low
                                                        nibble) and j + 16 (high nibble)

so a quantized type needs head_dim % 32 == 0. The rounding (ggml's reference encoders) is in kv_quant.py.

A window (`KVTypes.window`, U positions, 0: none) keeps the current block of the context at full precision: a
query at position p reads a quantized side's row of position t from its full-precision copy when t and p lie in
the same U-aligned block (t // U == p // U), and its stored blocks otherwise. So the keys and values of the most
recent 1..U positions are exact, every completed block is read quantized, and a prefix that ends on a multiple of U
needs no full-precision copy (prefix reuse and host copies keep only the stored bytes). Per query row, by position:
a prefill chunk's row, a tree node and a one-row decode step at the same position read the same values.
"""
from __future__ import annotations

from dataclasses import dataclass

__all__ = ["KV_CACHE_TYPES", "QUANT_BLOCK", "BLOCK_BYTES", "WINDOW_UNIT", "DEFAULT_Q4_WINDOW", "KVTypes", "row_bytes",
           "parse_kv_types", "window_slots"]

KV_CACHE_TYPES = ("f16", "q8_0", "q4_0")
QUANT_BLOCK = 32                                 # values per block of a quantized type
BLOCK_BYTES = {"q8_0": 34, "q4_0": 18}           # bytes per block
WINDOW_UNIT = 64                                 # a window is whole key tiles of the attention kernels
DEFAULT_Q4_WINDOW = 512                          # --kv-window's default when K or V is q4_0 (bench/NOTES.md, session 21:
                                                 # 96.1% -> 99.5% argmax agreement at 2048 tokens, 99.0% at 4096)


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
    window: int = 0          # the full-precision block (positions; a multiple of WINDOW_UNIT), 0: none

    def __post_init__(self):
        for name in ("k", "v"):
            value = getattr(self, name)
            if value not in KV_CACHE_TYPES:
                raise ValueError(f"kv type of {name.upper()} must be one of {', '.join(KV_CACHE_TYPES)}, "
                                 f"got {value!r}")
        if type(self.window) is not int or self.window < 0 or self.window % WINDOW_UNIT:
            raise ValueError(f"the KV window must be 0 or a positive multiple of {WINDOW_UNIT}, got {self.window!r}")
        if self.window and not self.quantized:
            raise ValueError("a KV window needs a quantized K or V (an f16 cache is full precision already)")

    @property
    def quantized(self) -> bool:
        return self.k != "f16" or self.v != "f16"

    def check_head_dim(self, head_dim: int) -> None:
        """ValueError when a quantized type cannot store rows of head_dim values."""
        for kind in (self.k, self.v):
            row_bytes(kind, head_dim)

    def windowed(self, side: str) -> bool:
        """Whether side "k" or "v" keeps full-precision copies of the current block."""
        return self.window > 0 and getattr(self, side) != "f16"

    def as_dict(self) -> dict:
        return {"k": self.k, "v": self.v, **({"window": self.window} if self.window else {})}

    def __str__(self) -> str:
        types = self.k if self.k == self.v else f"k={self.k},v={self.v}"
        return f"{types},window={self.window}" if self.window else types


def parse_kv_types(both: str | None, k: str | None, v: str | None, window: int | None = None) -> KVTypes:
    """--kv-type sets both, --kv-type-k / --kv-type-v override one each (default f16); --kv-window the window (None:
    DEFAULT_Q4_WINDOW when K or V is q4_0, else none; 0: none)."""
    base = both or "f16"
    kt, vt = k or base, v or base
    if window is None:
        window = DEFAULT_Q4_WINDOW if "q4_0" in (kt, vt) else 0
    return KVTypes(kt, vt, window)


def window_slots(window: int, max_rows: int) -> int:
    """Rows per KV head of a window's ring: the window block plus the most rows one forward writes, in whole
    WINDOW_UNITs (every slot a forward may read at full precision, [window * (n_past // window), n_past + rows), is
    live in it). 0 without a window."""
    if not window:
        return 0
    return window + -(-max_rows // WINDOW_UNIT) * WINDOW_UNIT
