"""The engine's speculative-decoding drafters: the --draft set, which one a request names, the
decoder a request gets, and parking (a drafter that holds memory releases it; unpark loads the
same file again, so drafts and output after a round trip equal those before).
"""
from __future__ import annotations

import gc
import logging
from dataclasses import dataclass

from ..protocol import messages as m
from ..protocol.errors import ProtocolError
from .speculative.decoder import DEFAULT_DDTREE_BUDGET, SpecConfig, SpecDecoder
from .speculative.drafter import Drafter, DrafterLoadError
from .speculative.loader import MTP, NGRAM, DrafterContext, borrows_target_weights, drafter_name, find_drafter, load_drafter
from .speculative.ngram import NgramConfig, NgramDrafter
from .speculative.policy import DepthPolicy

__all__ = ["DrafterSet", "ParkedDrafter"]

log = logging.getLogger("flashd.engine")


@dataclass(slots=True)
class ParkedDrafter:
    """A --draft drafter whose memory `park what=draft` released; `unpark` loads it again."""

    name: str
    borrows_target: bool          # DFlash: reloading needs the target's weights resident

    def info(self) -> dict:
        return {"name": self.name, "kind": "parked", "parked": True}


class DrafterSet:
    def __init__(self, backend, ddtree_chain_seed: bool = True):
        self.backend = backend
        self.ddtree_chain_seed = ddtree_chain_seed
        self.by_name: dict[str, Drafter | ParkedDrafter] = {}   # --draft order: the first is the default
        self._sources: dict[str, str] = {}        # name -> the --draft argument it came from
        self._ngram: NgramDrafter | None = None   # the built-in n-gram drafter when no --draft ngram
        self._policies: dict[tuple[str, int], DepthPolicy] = {}   # spec=auto: (drafter, budget) -> what it measured

    def load(self, specs, ctx: DrafterContext) -> None:
        """Every --draft, checked against the target; DrafterLoadError stops the daemon's start."""
        for spec in specs:
            name = drafter_name(spec)
            if name in self.by_name:
                raise DrafterLoadError(f"--draft {spec}: a drafter named {name!r} is already loaded")
            drafter = load_drafter(spec, ctx)
            drafter.check_target(ctx.target_model.config)
            self.by_name[name] = drafter
            self._sources[name] = spec
            log.info("drafter %s loaded from %s", name, spec)

    def runners(self) -> list:
        """The runners of the drafters that run a model of their own (None for the others)."""
        return [getattr(d, "runner", None) for d in self.by_name.values()]

    def info(self) -> list[dict]:
        return [d.info() for d in self.by_name.values()]

    def parked_names(self) -> list[str]:
        return [name for name, d in self.by_name.items() if isinstance(d, ParkedDrafter)]

    # -- a request's drafter and decoder ---------------------------------------------------------
    def pick(self, name: str | None) -> Drafter | ParkedDrafter:
        """The drafter a request names, or the daemon's default (the first --draft; without any, the
        built-in n-gram drafter, which needs no weights and is always there). A parked drafter is
        returned as such: the request then decodes plainly."""
        if name is None:
            return next(iter(self.by_name.values())) if self.by_name else self._builtin_ngram()
        drafter = find_drafter(self.by_name, self._sources, name)
        if drafter is None and name == NGRAM:
            return self._builtin_ngram()
        if drafter is None and name == MTP:     # it holds memory (the block, its cache): loaded at start only
            raise ProtocolError("not_loaded", f"draft={MTP}: this daemon was not started with --draft {MTP} (the "
                                              "target's multi-token-prediction block is loaded at start)")
        if drafter is None:
            loaded = ", ".join([*self.by_name, *([] if NGRAM in self.by_name else [NGRAM])])
            raise ProtocolError("not_loaded", f"draft={name}: no such drafter; loaded: {loaded}")
        return drafter

    def _builtin_ngram(self) -> NgramDrafter:
        if self._ngram is None:
            self._ngram = NgramDrafter(NgramConfig(), name=NGRAM)
        return self._ngram

    def spec_decoder(self, req: m.Generate, runner, drafter: Drafter) -> SpecDecoder:
        """spec=chain: budget = chain length (default: the drafter's max_depth); spec=auto: the
        deepest chain, each step's depth chosen by the drafter's DepthPolicy (kept per drafter and
        budget across requests, so what it measured carries over); spec=ddtree:
        budget = drafted tree nodes (default DEFAULT_DDTREE_BUDGET). A tree, root included, must
        fit the runner's verify forward (runner.max_tree_nodes: prefill_chunk on the CPU -- at most 65
        for a hybrid, whose verify keeps a recurrent state per node --, 65 on the GPU, whose masked
        attention workspace is sized for it; at most `flashd serve --max-tree-nodes`, or what
        --vram-budget lowered a hybrid target's tree to)."""
        if req.budget is not None:
            budget = req.budget
        else:
            budget = DEFAULT_DDTREE_BUDGET if req.spec == "ddtree" else drafter.max_depth
        max_budget = runner.max_tree_nodes - 1
        if budget > max_budget:
            if req.budget is not None:
                raise ProtocolError("bad_request", f"budget={budget}: at most {max_budget} drafted nodes fit one "
                                                   f"verify forward here (the target's max_tree_nodes is "
                                                   f"{runner.max_tree_nodes}, root included)")
            budget = max_budget
        # the target's tree verify graphs and a draft model's decode graph bake in the shared memory,
        # which a drafter load, park or PFlash may have reallocated since the last speculative request
        self.backend.drop_stale_graphs([runner, getattr(drafter, "runner", None)])
        config = SpecConfig(req.spec, max(budget, 1), chain_seed=self.ddtree_chain_seed)
        policy = None
        if req.spec == "auto":
            policy = self._policies.setdefault((drafter.name, config.budget), DepthPolicy(config.budget))
        return SpecDecoder(runner, drafter, config, policy)

    # -- park / unpark ---------------------------------------------------------------------------
    def park(self) -> None:
        """Release every --draft drafter that holds memory (a draft model, DFlash); n-grams stay."""
        for name, drafter in list(self.by_name.items()):
            if not isinstance(drafter, (ParkedDrafter, NgramDrafter)):
                borrows = borrows_target_weights(drafter)
                drafter.close()
                self.by_name[name] = ParkedDrafter(name, borrows)
        gc.collect()

    def unpark(self, ctx: DrafterContext) -> None:
        """Load the parked drafters again from their --draft sources (the same files: the same
        drafts, so output after a round trip equals output before)."""
        for name, drafter in list(self.by_name.items()):
            if not isinstance(drafter, ParkedDrafter):
                continue
            if drafter.borrows_target and ctx.target_model.weights is None:
                raise ProtocolError("parked", f"the drafter {name} runs on the target's weights: "
                                              f"send `unpark what=target` first")
            try:
                loaded = load_drafter(self._sources[name], ctx)
                loaded.check_target(ctx.target_model.config)
            except DrafterLoadError as exc:
                raise ProtocolError("internal", f"unpark of drafter {name} failed: {exc}") from exc
            self.by_name[name] = loaded

    def reload_target_borrowers(self, ctx: DrafterContext) -> None:
        """Drafters that use the target's own weights (DFlash: embedding and lm_head) held the
        parked copy: load them again against the unparked target. Each old one is dropped before its new
        one loads (the VRAM plan counts one copy of each, vram_ledger.py)."""
        for name in list(self.by_name):
            drafter = self.by_name[name]
            if borrows_target_weights(drafter):
                drafter.close()
                self.by_name[name] = ParkedDrafter(name, True)     # until the reload below replaces it
                del drafter
                gc.collect()
                self.by_name[name] = load_drafter(self._sources[name], ctx)
            else:   # parking released the shared arena its graphs used
                self.backend.drop_graphs([getattr(drafter, "runner", None)])
