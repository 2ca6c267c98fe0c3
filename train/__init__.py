"""Training flashd's own DFlash block drafters (`flashd train-drafter TARGET`; ARCHITECTURE.md, DFlash block drafter).

PyTorch is an optional extra (`pip install -e '.[train]'`): nothing the daemon imports at run time imports this
package, and inside it torch is imported only through `require_torch()`, which names the extra when it is missing.

    recipe.py    TrainConfig (the recipe and budget, checked) and the drafter's shape for a target
    data.py      prompts from source files installed with the interpreter (the listed sources), chat / raw
    target.py    the target's forward in torch from its GGUF (features at chosen layers, logits, KV decode)
    generate.py  self-distillation data: the target's own greedy answers, batched, saved in shards
    drafter.py   the DFlash drafter in torch: the function flashd's reference backend computes
    loop.py      loss, anchors, the optimiser, evaluation (the acceptance proxy), checkpoints, the time budget
    linear_ce.py the loss's vocabulary projection and cross-entropy a chunk of rows at a time
    walk.py      the runtime's steps over an answer: tokens a step from per-position acceptance
    export.py    the drafter to the DFlash GGUF that `--draft` loads (Q8_0 or F32)
    command.py   the click command
"""
from __future__ import annotations

__all__ = ["require_torch", "TorchMissing"]

INSTALL_HINT = "pip install -e '.[train]'"


class TorchMissing(RuntimeError):
    """PyTorch is not installed; the message says how to install the extra."""


def require_torch():
    """The torch module, or TorchMissing naming the install command."""
    try:
        import torch
    except ImportError as exc:
        raise TorchMissing(f"training a drafter needs PyTorch: {INSTALL_HINT} ({exc})") from None
    return torch
