"""The training recipe: TrainConfig (checked on construction) and the drafter's shape for a target.

Where each choice comes from (facts from the paper and the open DFlash trainers; no code copied):

    block size 16            the DFlash paper (Chen, Liang, Liu: "DFlash: Block Diffusion for Flash Speculative
                             Decoding", z-lab, arXiv 2602.06036) and z-lab's released "-b16" drafters
    block = [anchor, MASK x (B-1)]; the anchor is a real token, the B-1 masked positions are predicted in one
                             forward, attending every context position before the anchor and the whole block (the
                             paper's block diffusion drafting; flashd's runtime, models/dflash.py, drafts the same)
    random anchors           the paper's training: a fixed number of blocks per sequence at randomly sampled anchor
                             positions, resampled every epoch (also the open SpecForge DFlash trainer: 512 anchors)
    target layers            n_features (5) layers spread evenly from layer 1 to L - 3, z-lab's rule
                             (scripts/make_synthetic_dflash.evenly_spaced_layers); never the last layer
    KV injection, fc + hidden_norm, shared frozen embedding and lm_head: the paper's architecture
    loss                     cross-entropy of each masked position against the target's token (optionally mixed
                             with the target's whole distribution there: `distill`, ours, off by default), weighted by
                             exp(-(k - 1) / gamma) over block position k = 1 .. B-1 (earlier positions decide
                             acceptance); gamma 7 for B = 16, 5 for B = 10, 4 for B = 8 (the paper's decay; the
                             values used by the open DFlash trainers), linear in B between and beyond
    optimiser                AdamW, lr 6e-4, 4% linear warm-up, no weight decay (the open DFlash training configs);
                             the cosine decay to 0 after warm-up, betas (0.9, 0.95) and the grad-norm clip at 1.0
                             are our choices
    data                     self-distillation: the target's own greedy answers (the paper regenerates its training
                             responses with the target); ours are prompts built from local sources (data.py) and
                             optionally a share the target writes itself after a generic opener (self_prompts.py:
                             the chat request the way Magpie samples one; temperature 0.8 is ours; off by default:
                             its one run, at 0.4, accepted less on the benchmark prompts, see that module), and
                             optionally a share of what data_mix "wide" adds (wide_fraction; all of "wide" lost to
                             "code" in its one run: better on the other languages, worse on Python and prose)
    drafter depth            the paper uses 5 layers for 4B-8B targets; 3 here, with the SwiGLU width chosen so the
                             Q8_0 file stays under `max_mb` (the issue's 60 MB for the 1.5B target) and one H100
                             trains it in minutes

Drafter for Qwen2.5-Coder-1.5B (hidden 1536, 12 heads / 2 KV heads of 128, 28 layers) with the defaults:
target layers (1, 7, 13, 19, 25); fc 1536 x 7680 = 11.80 M; per layer attention 5.51 M + SwiGLU 3 x 1536 x 1536 =
7.08 M; 3 layers -> 49.6 M parameters, 52.7 MB as Q8_0 (`param_count`, `q8_0_bytes`). For the 0.5B (hidden 896,
24 layers): target layers (1, 6, 11, 16, 21), its full SwiGLU width 4864, 48.7 M parameters, 51.8 MB.
"""
from __future__ import annotations

import math
from dataclasses import asdict, dataclass

from flashd.daemon.models.config import ModelConfig
from flashd.daemon.models.dflash_config import DFlashConfig
from flashd.scripts.make_synthetic_dflash import evenly_spaced_layers

__all__ = ["TrainConfig", "drafter_config", "param_count", "q8_0_bytes", "loss_gamma", "position_weights"]

Q8_0_BYTES_PER_WEIGHT = 34 / 32     # a Q8_0 block: 32 int8 codes + one float16 scale


@dataclass(slots=True, frozen=True)
class TrainConfig:
    """The recipe (stored in the checkpoint; a resume must use the same one) and the data budget."""

    block_size: int = 16          # B
    n_layers: int = 3             # drafter layers
    n_features: int = 5           # target layers feeding fc
    max_mb: float = 56.0          # Q8_0 file size cap (MB, 1e6 bytes) that sets the SwiGLU width
    anchors: int = 128            # blocks per sequence per step (fewer when the answer is short)
    batch_seqs: int = 8           # sequences per step
    max_seq: int = 1024           # prompt + answer tokens kept per sequence
    lr: float = 6e-4
    warmup: float = 0.04          # fraction of training spent warming up
    weight_decay: float = 0.0
    grad_clip: float = 1.0
    epochs: float = 4.0           # upper bound; the time budget usually ends training first
    seed: int = 0
    # data (self-distillation)
    max_tokens: int = 6_000_000   # answer tokens to generate at most (~5 min on an H100 for a 1.5B target)
    max_prompt: int = 512         # prompt tokens (longer prompts are skipped)
    max_new: int = 512            # answer tokens per prompt
    gen_batch: int = 256          # prompts decoded together
    raw_fraction: float = 0.5     # share of raw-completion prompts (the rest go through the chat template)
    self_prompt_fraction: float = 0.0   # share of prompts the target writes itself (self_prompts.py), half raw;
                                        # 0.4 lost in its one run (session 27: less data in the same minutes)
    self_prompt_tokens: int = 64        # tokens sampled after an opener (a chat request: up to its end of turn)
    self_prompt_temperature: float = 0.8
    data_mix: str = "code"        # data.DATA_MIXES: "code" (Python + C, the shipped drafter's) or "wide" (+ C++,
                                  # docs, answers in other languages): its one run lost on the benchmark prompts
                                  # (session 28: better on Rust / C++ / SQL / bash, worse on Python and prose)
    distill: float = 0.0          # the soft targets' share in the loss: the target's own distribution at each
                                  # labelled position (linear_ce alpha); 0: its greedy token only (as shipped)
    distill_top: int = 32         # ... restricted to the target's top distill_top tokens there, renormalized (the
                                  # step computes and keeps k per position, not the vocabulary); 0: all of it
                                  # (a much longer step: bench/NOTES.md, session 30)
    # The prompt forms (session 30, the 0.5B target, the same minutes: the benchmark prompts' chain walk 1.95 -> 2.22
    # tokens a step, accept_len 1.51 -> 1.71, with these three shares against none): the benchmark's prompts are
    # mostly function headers to complete and word problems, forms the source-file prompts lacked.
    wide_fraction: float = 0.15   # with data_mix "code": this share of the prompts is what "wide" adds (data.py
                                  # build_prompts: C++ / docs sources, Python translated), the rest "code"'s
    header_fraction: float = 0.2  # this share: function headers from the Python sources, completed raw (styles.py)
    problem_fraction: float = 0.1 # this share: word problems built from styles.py's templates (raw or chat)
    task_fraction: float = 0.0    # this share: one-line requests in a comment, "// Go: <a docstring's summary>"
                                  # (styles.comment_tasks; not yet measured)
    eval_every: int = 32          # every eval_every-th sample is held out
    # budget (minutes, summed over resumed calls)
    gen_minutes: float = 7.0      # the shipped 1.5B drafter's recipe (session 27): the token cap ended
    train_minutes: float = 10.5   # generation at 5.2 minutes; 17.3 minutes in all on one H100

    def __post_init__(self):
        ints = ("block_size", "n_layers", "n_features", "anchors", "batch_seqs", "max_seq", "max_tokens",
                "max_prompt", "max_new", "gen_batch", "eval_every", "self_prompt_tokens")
        for name in ints:
            v = getattr(self, name)
            if not isinstance(v, int) or isinstance(v, bool) or v < 1:
                raise ValueError(f"{name} must be a positive int, got {v!r}")
        if self.block_size < 2:
            raise ValueError(f"block_size must be >= 2 (the anchor + masks), got {self.block_size}")
        if self.eval_every < 2:
            raise ValueError("eval_every must be >= 2 (some samples must be trained on)")
        if self.max_prompt + self.max_new > self.max_seq:
            raise ValueError(f"max_prompt + max_new ({self.max_prompt + self.max_new}) > max_seq ({self.max_seq})")
        for name in ("max_mb", "lr", "epochs", "gen_minutes", "train_minutes"):
            if not getattr(self, name) > 0:
                raise ValueError(f"{name} must be > 0, got {getattr(self, name)!r}")
        if not 0 <= self.warmup < 1 or not 0 <= self.raw_fraction <= 1 or not 0 <= self.self_prompt_fraction <= 1:
            raise ValueError("warmup must be in [0, 1), raw_fraction and self_prompt_fraction in [0, 1]")
        if self.data_mix not in ("code", "wide"):
            raise ValueError(f"data_mix must be 'code' or 'wide', got {self.data_mix!r}")
        if not 0 <= self.distill <= 1:
            raise ValueError(f"distill must be in [0, 1], got {self.distill!r}")
        if not isinstance(self.distill_top, int) or isinstance(self.distill_top, bool) or self.distill_top < 0:
            raise ValueError(f"distill_top must be an int >= 0 (0: the whole vocabulary), got {self.distill_top!r}")
        shares = (self.wide_fraction, self.header_fraction, self.problem_fraction, self.task_fraction)
        if not all(0 <= f <= 1 for f in shares) or sum(shares) > 1:
            raise ValueError(f"wide_fraction, header_fraction, problem_fraction and task_fraction must be in [0, 1] "
                             f"and sum to <= 1, got {shares}")
        if not 0 <= self.wide_fraction <= 1 or (self.wide_fraction and self.data_mix != "code"):
            raise ValueError(f"wide_fraction must be in [0, 1] and used with data_mix 'code', got "
                             f"{self.wide_fraction!r} with {self.data_mix!r}")
        if not self.self_prompt_temperature > 0:
            raise ValueError(f"self_prompt_temperature must be > 0, got {self.self_prompt_temperature!r}")
        if self.weight_decay < 0 or not self.grad_clip > 0:
            raise ValueError("weight_decay must be >= 0 and grad_clip > 0")

    def to_dict(self) -> dict:
        return asdict(self)

    @property
    def sources_mix(self) -> str:
        """The data mix whose sources the run reads (data.data_sources): "wide" as soon as a share of it is drawn."""
        return "wide" if self.wide_fraction else self.data_mix

    # what a resume may change (budget and batching) vs what defines the drafter being trained
    RESUMABLE = ("max_tokens", "gen_minutes", "train_minutes", "epochs", "gen_batch", "batch_seqs", "anchors")
    # a recipe field a checkpoint does not record was added after it was written: the value that reproduces what such
    # a run did (the field's default where that did not change since)
    ABSENT = {"wide_fraction": 0.0, "header_fraction": 0.0, "problem_fraction": 0.0, "task_fraction": 0.0,
              "distill_top": 0}


def loss_gamma(block_size: int) -> float:
    """The loss decay gamma: 7 at B = 16, 5 at B = 10, 4 at B = 8; linear in B between and beyond (>= 1)."""
    if block_size >= 10:
        return max(1.0, 5.0 + (block_size - 10) * (7.0 - 5.0) / (16 - 10))
    return max(1.0, 4.0 + (block_size - 8) * (5.0 - 4.0) / (10 - 8))


def position_weights(block_size: int) -> list[float]:
    """w_k = exp(-(k - 1) / gamma) for the masked positions k = 1 .. B-1."""
    g = loss_gamma(block_size)
    return [math.exp(-(k - 1) / g) for k in range(1, block_size)]


def param_count(cfg: DFlashConfig) -> tuple[int, int]:
    """(matrix weights, norm weights) of a drafter."""
    m = cfg.model
    q, kv = m.n_heads * m.head_dim, m.n_kv_heads * m.head_dim
    per_layer = m.hidden * (2 * q + 2 * kv + 3 * m.ffn)
    matrices = m.hidden * cfg.n_features * m.hidden + m.n_layers * per_layer
    norms = 2 * m.hidden + m.n_layers * (2 * m.hidden + 2 * m.head_dim)
    return matrices, norms


def q8_0_bytes(cfg: DFlashConfig) -> int:
    """Tensor bytes of the Q8_0 file (matrices Q8_0, norms F32; metadata adds a few KB)."""
    matrices, norms = param_count(cfg)
    return int(matrices * Q8_0_BYTES_PER_WEIGHT) + 4 * norms


def _ffn_width(target: ModelConfig, tc: TrainConfig) -> int:
    """The widest SwiGLU (<= the target's, a multiple of 256, or of 32 for tiny targets) within max_mb."""
    h = target.hidden
    q, kv = target.n_heads * target.head_dim, target.n_kv_heads * target.head_dim
    budget = tc.max_mb * 1e6 / Q8_0_BYTES_PER_WEIGHT - h * tc.n_features * h - tc.n_layers * h * (2 * q + 2 * kv)
    step = 256 if target.ffn >= 1024 else 32
    width = min(target.ffn, int(budget / (3 * h * tc.n_layers)) // step * step)
    if width < step:
        raise ValueError(f"{tc.n_layers} drafter layers with {tc.n_features} target features do not fit "
                         f"--max-mb {tc.max_mb} for a target of hidden {h}: use fewer layers or features")
    return width


def drafter_config(target: ModelConfig, tc: TrainConfig, mask_token_id: int, name: str = "") -> DFlashConfig:
    """The drafter for `target`: its attention shapes, rope theta and eps, z-lab's layer choice, the capped SwiGLU."""
    if target.linear is not None:
        raise ValueError("train-drafter supports dense targets (llama, qwen2, qwen3), not hybrid ones")
    model = DFlashConfig.decoder(n_layers=tc.n_layers, hidden=target.hidden, n_heads=target.n_heads,
                                 n_kv_heads=target.n_kv_heads, head_dim=target.head_dim, ffn=_ffn_width(target, tc),
                                 rope_theta=target.rope_theta, rms_eps=target.rms_eps,
                                 context_length=target.context_length, name=name or f"{target.name} dflash")
    return DFlashConfig(model=model, block_size=tc.block_size, mask_token_id=mask_token_id,
                        target_layer_ids=evenly_spaced_layers(target.n_layers, tc.n_features))
