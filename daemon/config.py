"""EngineConfig: how `flashd serve` was asked to run, checked on construction."""
from __future__ import annotations

from dataclasses import dataclass, field

from .backends.kv_types import KVTypes
from .pflash.config import PFlashConfig
from .vram_budget import DEFAULT_MARGIN

__all__ = ["EngineConfig", "DEVICES", "FORWARDS", "MIN_TREE_NODES", "MAX_TREE_NODES_OPTION"]

DEVICES = ("auto", "cpu", "cuda")
FORWARDS = ("persistent", "graph")      # the CUDA decode / verify forward (backends/cuda/persistent.py)
MIN_TREE_NODES = 2                      # --max-tree-nodes: a root and one drafted node
MAX_TREE_NODES_OPTION = 1 << 16         # anything larger is a typo (the runner's bounds cap it far lower anyway)


@dataclass(slots=True, frozen=True)
class EngineConfig:
    model: str                          # GGUF path (names are resolved by the CLI before this)
    device: str = "auto"                # auto: cuda when a GPU and the native library are present (the CPU for a
                                        # model its kernels do not cover: Engine._plan_target)
    max_ctx: int = 4096                 # KV slots; prompt + max_tokens must fit
    drafts: tuple[str, ...] = ()        # speculative-decoding drafters (paths, or "ngram")
    prefill_drafter: str | None = None  # PFlash scoring model
    max_queue: int = 64                 # queued requests beyond the running one; more -> overloaded
    prefill_chunk: int = 512            # tokens per prefill forward
    pflash: PFlashConfig = field(default_factory=PFlashConfig)   # compression defaults, drafter policy
    ddtree_chain_seed: bool = True      # spec=ddtree: insert the drafter's top-1 chain first
    prefix_cache: bool = True           # keep the cached K/V of the last prompt's common prefix (runner.py)
    prefix_cache_ram_mb: int = 4096     # host copies of earlier prompts' prefixes (prefix_cache.py); 0: none
    forward: str = "graph"              # cuda decode / verify: "graph" (per-op CUDA graph) or "persistent"
    rope_override: tuple | None = None  # (kind, factor | None, orig_ctx | None): --rope-scaling over the GGUF's
    vram_budget: int | None = None      # --vram-budget in bytes: plan everything up front, refuse what would not fit
    vram_margin: int = DEFAULT_MARGIN   # --vram-margin: the plan's allowance for what the backend does not track
    kv_types: KVTypes = KVTypes()       # --kv-type / --kv-type-k / --kv-type-v: the target's K and V storage
    tuning: tuple[tuple[str, int], ...] = ()   # --tuning: (field, value) overrides of the CUDA launch tuning table
                                        # (flashd_tuning.h), applied before anything is captured; e.g. gemv_rows 0
    max_tree_nodes: int | None = None   # --max-tree-nodes: nodes (root included) of the largest draft tree the target
                                        # verifies, a recurrent state each on a hybrid; None: the default (65 for a
                                        # hybrid, also bounded by prefill_chunk and the GPU's masked attention), which
                                        # --vram-budget may lower to fit (vram_ledger.py)

    def __post_init__(self):
        if self.device not in DEVICES:
            raise ValueError(f"device must be one of {', '.join(DEVICES)}, got {self.device!r}")
        if not 16 <= self.max_ctx <= 1 << 20:
            raise ValueError(f"max_ctx must be in [16, 1048576], got {self.max_ctx}")
        if self.max_queue < 1:
            raise ValueError(f"max_queue must be >= 1, got {self.max_queue}")
        if not isinstance(self.pflash, PFlashConfig):
            raise ValueError("pflash must be a PFlashConfig")
        if self.prefix_cache_ram_mb < 0:
            raise ValueError(f"prefix_cache_ram_mb must be >= 0, got {self.prefix_cache_ram_mb}")
        if self.forward not in FORWARDS:
            raise ValueError(f"forward must be one of {', '.join(FORWARDS)}, got {self.forward!r}")
        if self.rope_override is not None and (len(self.rope_override) != 3
                                               or self.rope_override[0] not in ("none", "linear", "yarn")):
            raise ValueError(f"rope_override must be (none|linear|yarn, factor, orig_ctx), got {self.rope_override!r}")
        if self.prefill_chunk < 1:
            raise ValueError(f"prefill_chunk must be >= 1, got {self.prefill_chunk}")
        if any(not (isinstance(f, str) and f and type(v) is int) for f, v in self.tuning):
            raise ValueError(f"tuning must be (field name, int) pairs, got {self.tuning!r}")
        if self.vram_budget is not None and (type(self.vram_budget) is not int or self.vram_budget <= 0):
            raise ValueError(f"vram_budget must be a positive number of bytes or None, got {self.vram_budget!r}")
        if type(self.vram_margin) is not int or self.vram_margin < 0:
            raise ValueError(f"vram_margin must be a non-negative number of bytes, got {self.vram_margin!r}")
        if not isinstance(self.kv_types, KVTypes):
            raise ValueError(f"kv_types must be a KVTypes, got {self.kv_types!r}")
        if self.kv_types.window and self.prefill_chunk % self.kv_types.window:
            raise ValueError(f"--prefill-chunk {self.prefill_chunk} must be a multiple of the KV window "
                             f"{self.kv_types.window} (--kv-window; 0: none)")
        if self.max_tree_nodes is not None and (type(self.max_tree_nodes) is not int
                                                or not MIN_TREE_NODES <= self.max_tree_nodes <= MAX_TREE_NODES_OPTION):
            raise ValueError(f"max_tree_nodes must be None or an int in [{MIN_TREE_NODES}, {MAX_TREE_NODES_OPTION}] "
                             f"(a root and at least one drafted node), got {self.max_tree_nodes!r}")
        if self.vram_budget is not None and self.vram_margin >= self.vram_budget:
            raise ValueError(f"--vram-margin ({self.vram_margin} bytes) leaves nothing of --vram-budget "
                             f"({self.vram_budget} bytes)")
