"""VramLedger: the engine's VRAM plan (vram_budget.py) -- everything the daemon may hold, described once
from the model files, which of it is resident in a given state, and the check before each load.

What counts in a state (`LedgerState`):

- the target, unless parked;
- every --draft drafter that is not parked (n-grams hold nothing);
- the PFlash drafter's slot: the one loaded, else the parked one, else the configured --prefill-drafter
  (reserved: `compress=auto` loads it again). Under the `resident` policy it is in every phase, under
  `park` only while the target is parked;
- the shared buffers (arena, weight scratch, attention workspace) with the target (parking releases
  them); while the target is parked, the ones draft models reserve again when they are unparked;
- the target's embedding and lm_head while parked or unparking, when a DFlash drafter holds them.

Loads that could exceed the budget are checked in the state they would create: the start (every
configured model), `unpark` of the target or of the --draft drafters, and loading a PFlash drafter
(`compress drafter=...`, `unpark what=draft`, compressions under the park policy). A refusal names the
peak's components and the changes that would fit.

The target's draft tree: a hybrid (qwen35) target keeps a whole recurrent state per node of the largest tree a
verify takes (~150 MB a node at the 27B shape), so its node count (`tree_nodes`, the runner's max_tree_nodes
argument) is part of the plan. Without `--max-tree-nodes` the check at start lowers it, when the plan does not fit,
to the largest count that fits, down to TREE_NODES_FLOOR (the engine then builds the runner with it); an explicit
count is kept as given. Draft models verify no tree: they are planned with DRAFT_TREE_NODES (none).
"""
from __future__ import annotations

import dataclasses
import os
from dataclasses import dataclass

from .backends.kv_types import parse_kv_types
from .config import MIN_TREE_NODES
from .vram_budget import (GiB, MiB, BudgetExceeded, Component, VramPlan, format_size, kv_window_bytes, largest_fitting,
                          refusal)
from .vram_sizes import CudaSizes, DFlashDesc, HostSizes, ModelDesc, MTPDesc, describe_dflash, describe_model, describe_mtp

__all__ = ["LedgerState", "VramLedger", "sizes_for", "describe_draft", "TREE_NODES_FLOOR"]

QUANT_KV = ("q8_0", "q4_0")
# The fewest nodes (root included) the automatic lowering gives a hybrid target's draft tree: a DDTree budget of 8
# drafted nodes, below which speculative decoding gains little; an explicit --max-tree-nodes may go down to 2.
TREE_NODES_FLOOR = 9
TREE_DEFAULT, TREE_GIVEN, TREE_LOWERED = "default", "--max-tree-nodes", "lowered to fit --vram-budget"
_KV_RANK = {"f32": 0, "f16": 0, "q8_0": 1, "q4_0": 2}       # larger rank: fewer bytes per value


@dataclass(slots=True, frozen=True)
class LedgerState:
    target: bool = True                         # the target is resident (not parked)
    parked: frozenset[str] = frozenset()        # --draft drafters parked now
    pflash: str | None = None                   # the PFlash drafter's slot (a path), None: empty
    shared_parked: bool = False                 # the target parked, draft models reserved the shared buffers again

    def __post_init__(self):
        if not isinstance(self.target, bool) or not isinstance(self.shared_parked, bool):
            raise ValueError(f"target and shared_parked are bools, got {self.target!r}, {self.shared_parked!r}")
        if not isinstance(self.parked, frozenset) or not all(isinstance(n, str) for n in self.parked):
            raise ValueError(f"parked must be a frozenset of drafter names, got {self.parked!r}")
        if self.pflash is not None and not isinstance(self.pflash, str):
            raise ValueError(f"pflash must be a path or None, got {self.pflash!r}")


def sizes_for(backend, forward: str = "graph"):
    """The sizes of the backend the engine runs on: CUDA (its native library's workspace sizes, the
    device's SM count for the persistent forward) or the reference backend's host RAM."""
    if backend.name != "cuda":
        return HostSizes()
    from .backends.cuda.attention_ops import attention_workspace_bytes
    from .backends.cuda.persistent import tuning_for
    native = backend.device.native
    info = backend.info()
    tuning = tuning_for(info["cc"])

    def attention_ws(n_heads, n_kv_heads, head_dim, max_ctx, n_tokens):
        return attention_workspace_bytes(native, n_heads, n_kv_heads, head_dim, max_ctx, n_tokens)
    return CudaSizes(attention_ws, lambda vocab: int(native.lib.fd_sample_workspace_bytes(vocab)),
                     n_sms=info["n_sms"], tuning_rows=tuning.max_rows, attn_splits=tuning.attn_splits,
                     persistent=forward == "persistent")


def describe_draft(spec: str, target_file=None, target_cfg=None):
    """A --draft drafter's descriptor (None for n-grams; `mtp`: the target's block, from target_file and
    target_cfg); DrafterLoadError worded as the loader's."""
    from .models import ModelLoadError, open_model
    from .models.dflash_weights import open_dflash
    from .models.gguf_file import GGUFFile
    from .speculative.drafter import DrafterLoadError
    from .speculative.loader import DFLASH_ARCH, MTP, NGRAM, drafter_name
    if spec == NGRAM:
        return None
    try:
        if spec == MTP:
            return describe_mtp(MTP, target_file, target_cfg)
        if GGUFFile(spec).arch == DFLASH_ARCH:
            return describe_dflash(drafter_name(spec), *open_dflash(spec))
        return describe_model(drafter_name(spec), *open_model(spec))
    except ModelLoadError as exc:
        raise DrafterLoadError(f"--draft {spec}: {exc}") from None


class VramLedger:
    def __init__(self, sizes, target: ModelDesc, drafters: dict, *, max_ctx: int, prefill_chunk: int, pflash,
                 budget: int | None, margin: int, default_pflash: str | None = None, kv_types=None,
                 rope_override: tuple | None = None, tree_nodes: int | None = None):
        """tree_nodes: the target runner's max_tree_nodes argument, --max-tree-nodes (kept as given); None: the
        default bound, which the check at start may lower (the module docstring)."""
        if tree_nodes is not None and (type(tree_nodes) is not int or tree_nodes < MIN_TREE_NODES):
            raise ValueError(f"tree_nodes must be None or an int >= {MIN_TREE_NODES}, got {tree_nodes!r}")
        self.sizes, self.target, self.drafters = sizes, target, dict(drafters)
        self.tree_nodes = tree_nodes      # what the target's runner is (to be) made with
        self.tree_source = TREE_DEFAULT if tree_nodes is None else TREE_GIVEN
        self.kv_types = kv_types          # the target's --kv-type (backends.kv_types.KVTypes; None: f16)
        self.max_ctx, self.prefill_chunk, self.pflash_config = max_ctx, prefill_chunk, pflash
        self.budget, self.margin = budget, margin
        self.default_pflash = default_pflash
        self.rope_override = rope_override  # --rope-scaling: the PFlash drafter is opened with it (as PrefillCompressor)
        self._pflash: dict[str, ModelDesc] = {}       # realpath -> descriptor

    @classmethod
    def for_engine(cls, backend, config, target_file, target_cfg) -> VramLedger:
        """Describe the target (opened already), every --draft and the --prefill-drafter."""
        from .models import ModelLoadError
        from .speculative.loader import drafter_name
        target = describe_model(target_cfg.name or target_file.path.stem, target_file, target_cfg)
        drafters = {drafter_name(spec): describe_draft(spec, target_file, target_cfg) for spec in config.drafts}
        ledger = cls(sizes_for(backend, config.forward), target, drafters, max_ctx=config.max_ctx,
                     prefill_chunk=config.prefill_chunk, pflash=config.pflash, budget=config.vram_budget,
                     margin=config.vram_margin, default_pflash=config.prefill_drafter,
                     kv_types=config.kv_types, rope_override=config.rope_override,
                     tree_nodes=config.max_tree_nodes)
        if config.prefill_drafter is not None:
            try:
                ledger.describe_pflash(config.prefill_drafter)
            except ModelLoadError as exc:
                raise ModelLoadError(f"--prefill-drafter: drafter: {exc}") from None
        return ledger

    def describe_pflash(self, path: str, opened=None) -> ModelDesc:
        """The PFlash drafter at `path` (opened: its (GGUFFile, ModelConfig) when the caller has them)."""
        key = os.path.realpath(path)
        if key not in self._pflash:
            if opened is None:
                from .models import open_model
                opened = open_model(path, self.rope_override)
            f, cfg = opened
            self._pflash[key] = describe_model(cfg.name or f.path.stem, f, cfg)
        return self._pflash[key]

    # -- the plan for a state --------------------------------------------------------------------
    @property
    def hybrid_target(self) -> bool:
        """The target keeps a recurrent state per draft-tree node (its tree count is worth planning)."""
        return getattr(self.target.cfg, "linear", None) is not None

    def target_tree_nodes(self, tree_nodes: int | None = None) -> int:
        """The target runner's max_tree_nodes with the ledger's argument (or a what-if one)."""
        return self.sizes.tree_nodes(self.target.cfg, self.prefill_chunk,
                                     self.tree_nodes if tree_nodes is None else tree_nodes)

    def plan(self, state: LedgerState = LedgerState(), *, max_ctx: int | None = None, kv_type: str | None = None,
             without: frozenset = frozenset(), policy: str | None = None, budget: int | None = -1,
             tree_nodes: int | None = None, kv_window: int | None = None) -> VramPlan:
        """The plan in `state`; the keywords ask what-if: another max_ctx, KV type (and its window: None, that
        type's default) or drafter policy, some --draft drafters left out, another budget, another target tree
        node count."""
        from .speculative.draft_model import DRAFT_TREE_NODES
        tree = self.tree_nodes if tree_nodes is None else tree_nodes
        sizes, chunk = self.sizes, self.prefill_chunk
        ctx, kv = max_ctx or self.max_ctx, sizes.kv_type        # drafters: the backend's unquantized cache
        target_kv = self._target_kv(kv_type)
        policy = policy or self.pflash_config.drafter_policy
        drafters = {n: d for n, d in self.drafters.items() if d is not None and n not in state.parked | without}
        dflash = any(isinstance(d, (DFlashDesc, MTPDesc)) for d in drafters.values())     # hold the target's head
        with_target = frozenset({"serving", "unparking"} if dflash else {"serving"}) if state.target else frozenset()
        everywhere = with_target | {"target parked"}
        comps, needs, draft_needs = [], [], []
        if state.target:
            parts, need = sizes.model(self.target, ctx, chunk, target_kv, tree)
            parts = parts + self._window_parts(kv_type, chunk, kv_window)
            comps.append(Component("target", self.target.name, tuple(parts), with_target, self.target.path))
            needs.append(need)
        for name, desc in drafters.items():
            if isinstance(desc, DFlashDesc):
                parts, need = sizes.dflash(desc, ctx, kv)
            elif isinstance(desc, MTPDesc):
                parts, need = sizes.mtp(desc, ctx, chunk, kv)
            else:
                parts, need = sizes.model(desc, ctx, chunk, kv, DRAFT_TREE_NODES)    # drafts only, verifies none
                draft_needs.append(need)
            role = "dflash" if isinstance(desc, DFlashDesc) else "mtp" if isinstance(desc, MTPDesc) else "draft"
            comps.append(Component(role, name, tuple(parts),
                                   everywhere, desc.path))
            needs.append(need)
        shared = sizes.shared(needs if state.target else draft_needs if state.shared_parked else [])
        if shared:
            comps.append(Component("shared", "", tuple(shared), with_target or frozenset({"target parked"})))
        if dflash:
            comps.append(Component("target_head", self.target.name,
                                   (("held by DFlash / MTP", sizes.weights(self.target.head)),),
                                   frozenset({"unparking", "target parked"}) & everywhere))
        settings = [("max_ctx", ctx), ("prefill_chunk", chunk), ("kv_type", _kv_label(target_kv)),
                    ("drafter_policy", policy), ("max_tree_nodes", self.target_tree_nodes(tree)),
                    ("max_tree_nodes_from", self.tree_source if tree_nodes is None else "what-if")]
        if state.pflash is not None:
            desc = self.describe_pflash(state.pflash)
            n_tokens = _token_limit(desc.cfg)
            comps.append(Component("prefill_drafter", desc.name,
                                   tuple(sizes.pflash(desc, self.pflash_config, n_tokens, kv)),
                                   everywhere if policy == "resident" else frozenset({"target parked"}), desc.path))
            settings.append(("prefill_drafter_tokens", n_tokens))
        return VramPlan(tuple(comps), self.margin, self.budget if budget == -1 else budget, sizes.where,
                        tuple(settings))

    def _window_parts(self, what_if: str | None, chunk: int, window: int | None = None) -> list:
        """The target's KV window rings as a plan part (none without a window): --kv-window's, or for a what-if type
        the window asked (None: the one that type gets by default)."""
        from .runner import max_forward_rows
        types = parse_kv_types(what_if, None, None, window) if what_if is not None else self.kv_types
        if types is None or not types.window:
            return []
        cfg = self.target.cfg
        lin = getattr(cfg, "linear", None)
        n_layers = max(1, len(lin.attention_layers)) if lin is not None else cfg.n_layers
        sides = sum(types.windowed(side) for side in "kv")
        return [("kv_window", kv_window_bytes(n_layers, cfg.n_kv_heads, cfg.head_dim, types.window,
                                              max_forward_rows(chunk), sides))]

    def _target_kv(self, what_if: str | None) -> tuple[str, str]:
        """The target's (K, V) types as the sizes name them: a what-if type for both, else --kv-type with f16
        meaning the backend's unquantized cache (float32 on the reference backend)."""
        if what_if is not None:
            return what_if, what_if
        types = self.kv_types
        if types is None:
            return self.sizes.kv_type, self.sizes.kv_type
        return tuple(self.sizes.kv_type if t == "f16" else t for t in (types.k, types.v))

    # -- checks ----------------------------------------------------------------------------------
    def check(self, action: str, state: LedgerState, *, runtime: bool, loading: frozenset = frozenset()) -> VramPlan:
        """The plan of `state` (what `action` would lead to); BudgetExceeded, naming the components and
        what would fit, when it is over the budget. `loading`: what the action loads ("target", "pflash",
        drafter names), which the suggestions keep."""
        plan = self.plan(state)
        if not plan.fits and not runtime and self.tree_source == TREE_DEFAULT and self.hybrid_target:
            plan = self._lower_tree(state)      # at start only: a runner made already keeps its node count
        if not plan.fits:
            if self.hybrid_target:
                action += f" with a draft tree of {self.target_tree_nodes()} nodes ({self._tree_note()})"
            raise BudgetExceeded(refusal(action, plan, self.fixes(state, runtime=runtime, loading=loading)))
        return plan

    def _tree_note(self) -> str:
        if self.tree_source == TREE_GIVEN:
            return "--max-tree-nodes"
        if self.tree_source == TREE_LOWERED and self.tree_nodes == TREE_NODES_FLOOR:
            return f"lowered to the floor of {TREE_NODES_FLOOR}; fewer only with --max-tree-nodes"
        if self.tree_source == TREE_LOWERED:
            return "lowered at start to fit --vram-budget; --max-tree-nodes sets another"
        return "the default; --max-tree-nodes sets another"

    def _lower_tree(self, state: LedgerState) -> VramPlan:
        """The automatic lowering: the largest node count in [TREE_NODES_FLOOR, the default's) whose plan of `state`
        fits becomes the ledger's (tree_source TREE_LOWERED); where none does, the floor (the caller refuses, with
        the plan at the floor). Plans grow with the count (a state per node)."""
        top = self.target_tree_nodes()
        floor = min(TREE_NODES_FLOOR, top)
        if top <= floor:
            return self.plan(state)
        n = largest_fitting(lambda k: self.plan(state, tree_nodes=k), floor, top - 1, step=1)
        self.tree_nodes, self.tree_source = (floor if n is None else n), TREE_LOWERED
        return self.plan(state)

    def fixes(self, state: LedgerState, *, runtime: bool, loading: frozenset = frozenset()) -> list[str]:
        """The changes that would make `state` fit, each with the peak it gives (only those that fit,
        then the budget it would take)."""
        out = []

        def offer(text: str, plan: VramPlan) -> None:
            if plan.fits:
                out.append(f"{text} (peak {format_size(plan.peak_bytes)})")

        restart = "restart with " if runtime else ""
        ctx = largest_fitting(lambda c: self.plan(state, max_ctx=c), 16, self.max_ctx - 1) if self.max_ctx > 16 \
            else None
        if ctx is not None:
            offer(f"{restart}--max-ctx {ctx}", self.plan(state, max_ctx=ctx))
        resident = [n for n, d in self.drafters.items() if d is not None and n not in state.parked | loading]
        if runtime and resident:
            offer(f"`park what=draft` first (releases the --draft drafters {', '.join(resident)})",
                  self.plan(state, without=frozenset(resident)))
        for name in [] if runtime else resident:
            offer(f"without --draft {name}", self.plan(state, without=frozenset({name})))
        if "pflash" not in loading and state.pflash is not None:
            if runtime and state.pflash != self.default_pflash:
                offer("`free drafter` first", self.plan(dataclasses.replace(state, pflash=self.default_pflash)))
            if not runtime and self.pflash_config.drafter_policy == "resident":
                offer("--drafter-policy park (the prefill drafter loads only while the target is parked)",
                      self.plan(state, policy="park"))
        if runtime and state.target and "target" not in loading:
            offer("`park what=target` first", self.plan(dataclasses.replace(state, target=False)))
        smallest = min(_KV_RANK[t] for t in self._target_kv(None))
        for kv in QUANT_KV:
            if _KV_RANK[kv] <= smallest or self.target.cfg.head_dim % 32:
                continue                      # only a smaller cache than configured, of whole 32-value blocks
            with_default = self.plan(state, kv_type=kv)
            if with_default.fits or not parse_kv_types(kv, None, None).window:
                offer(f"{restart}--kv-type {kv}", with_default)
            else:                             # its default window's rings do not fit: without them
                offer(f"{restart}--kv-type {kv} --kv-window 0", self.plan(state, kv_type=kv, kv_window=0))
        if self.hybrid_target:
            top = self.target_tree_nodes()
            if top > MIN_TREE_NODES:
                n = largest_fitting(lambda k: self.plan(state, tree_nodes=k), MIN_TREE_NODES, top - 1, step=1)
                if n is not None:
                    offer(f"{restart}--max-tree-nodes {n} (a draft tree of {n} nodes, a DDTree budget of {n - 1})",
                          self.plan(state, tree_nodes=n))
        need = self.plan(state, budget=None).peak_bytes
        step = 64 * MiB if need > 4 * GiB else MiB
        need = -(-need // step) * step
        out.append(f"{restart}--vram-budget {need // GiB}GiB or more" if need % GiB == 0 else
                   f"{restart}--vram-budget {need // MiB}MiB or more")
        return out


def _kv_label(pair: tuple[str, str]) -> str:
    return pair[0] if pair[0] == pair[1] else f"k={pair[0]},v={pair[1]}"


def _token_limit(cfg) -> int:
    from .pflash.service import drafter_token_limit
    return drafter_token_limit(cfg)
