"""Load the drafters named by `flashd serve --draft SPEC` (repeatable).

SPEC is `ngram` (the built-in prompt-lookup drafter), `mtp` (the target's own multi-token-prediction block,
mtp_drafter.py: a qwen35 GGUF with nextn layers; any other target is a load error) or a GGUF path: a file whose
general.architecture is `dflash` is a DFlash block drafter (dflash_drafter.py), any other is an
autoregressive draft model (draft_model.py) run on the target's backend with its own KV cache.

A drafter is named for requests' `draft=NAME` by: `ngram`, `mtp`; the registry name of a known model
whose file name matches (e.g. `qwen2.5-coder-0.5b`); otherwise the file's stem. `find_drafter`
also accepts the path as given on the command line.
"""
from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from ..models import ModelLoadError, load_model, open_model
from ..models.gguf_file import GGUFFile
from ..models.weights import total_weight_bytes
from .draft_model import DRAFT_TREE_NODES, DraftModelConfig, DraftModelDrafter, check_same_vocab
from .drafter import Drafter, DrafterLoadError
from .mtp_drafter import MTP, MTPDrafter, load_mtp_drafter
from .ngram import NgramConfig, NgramDrafter

__all__ = ["DrafterContext", "load_drafter", "drafter_name", "find_drafter", "borrows_target_weights", "NGRAM", "MTP",
           "BUILTIN_DRAFTS"]

NGRAM = "ngram"
BUILTIN_DRAFTS = (NGRAM, MTP)     # --draft specs that name no file
DFLASH_ARCH = "dflash"


@dataclass(slots=True, frozen=True)
class DrafterContext:
    """What loading a drafter needs from the engine (passed explicitly, no globals)."""

    backend: Any              # flashd.daemon.backends backend: ops, plan, check_fits, make_runner
    target_file: GGUFFile     # the target's GGUF (tokenizer strings for the vocabulary check)
    target_model: Any         # LoadedModel of the target (DFlash borrows its embedding and lm_head)
    max_ctx: int
    prefill_chunk: int


def drafter_name(spec: str) -> str:
    if spec in BUILTIN_DRAFTS:
        return spec
    path = Path(spec)
    try:
        from ...clients.registry import KNOWN_MODELS
        for known in KNOWN_MODELS.values():
            if known.filename == path.name:
                return known.name
    except ImportError:
        pass
    return path.stem


def find_drafter(drafters: dict[str, Drafter], sources: dict[str, str], name: str) -> Drafter | None:
    """The drafter called `name` (its name, or the path it was loaded from)."""
    if name in drafters:
        return drafters[name]
    for key, src in sources.items():
        if name == src or Path(name).expanduser() == Path(src):
            return drafters[key]
    return None


def borrows_target_weights(drafter: Drafter) -> bool:
    """True for drafters that run on the target's own weights (DFlash: its embedding and lm_head; MTP: those, the
    output_norm and the block's tensors in the target's file), which must be loaded again when the target's weights
    are (unpark)."""
    from .dflash_drafter import DFlashDrafter
    return isinstance(drafter, (DFlashDrafter, MTPDrafter))


def load_drafter(spec: str, ctx: DrafterContext) -> Drafter:
    """A ready drafter, or DrafterLoadError with a message that names the file and the reason."""
    name = drafter_name(spec)
    if spec == NGRAM:
        return NgramDrafter(NgramConfig(), name=name)
    if spec == MTP:
        if ctx.target_model.weights is None:
            raise DrafterLoadError(f"--draft {MTP}: the target is parked (the MTP block runs on its weights)")
        return load_mtp_drafter(ctx.backend.ops, ctx.target_file, ctx.target_model, ctx.max_ctx, ctx.prefill_chunk)
    try:
        f = GGUFFile(spec)
        arch = f.arch
    except ModelLoadError as exc:
        raise DrafterLoadError(f"--draft {spec}: {exc}") from exc
    target_cfg = ctx.target_model.config
    if arch == DFLASH_ARCH:
        from .dflash_drafter import load_dflash_drafter
        return load_dflash_drafter(spec, ctx.backend.ops, target_cfg, ctx.target_model.weights, ctx.max_ctx,
                                   name=name)
    try:
        f, cfg = open_model(spec)
    except ModelLoadError as exc:
        raise DrafterLoadError(f"--draft {spec}: {exc}") from exc
    check_same_vocab(name, cfg, target_cfg, f.metadata("tokenizer.ggml.tokens", None),
                     ctx.target_file.metadata("tokenizer.ggml.tokens", None))
    backend = ctx.backend
    # a draft model drafts (greedy_continue, checkpoint / rewind, a batched prefill for a tree's candidates) and
    # never verifies a tree: no node states planned or allocated (DRAFT_TREE_NODES)
    plan = backend.plan(cfg, total_weight_bytes(f, cfg), ctx.max_ctx, ctx.prefill_chunk,
                        max_tree_nodes=DRAFT_TREE_NODES)
    backend.check_fits(plan)
    model = load_model((f, cfg), backend.ops.load_weight)
    runner = backend.make_runner(model.config, model.weights, ctx.max_ctx, ctx.prefill_chunk, plan,
                                 max_tree_nodes=DRAFT_TREE_NODES)
    return DraftModelDrafter(runner, name, DraftModelConfig())
