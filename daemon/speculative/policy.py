"""DepthPolicy: how deep to draft each step of `spec=auto`, from what drafting has paid so far.

A step that drafts d tokens emits 1 + (the accepted ones) tokens and costs T(d) seconds (drafting,
verifying d + 1 rows, accepting); plain decoding is d = 0. On the GPU an extra verify row is far
from free, and whether drafts are accepted depends on the drafter and the text, so a fixed depth
can be slower than plain decoding. The policy picks the d that maximises expected tokens per
second, E(d) / T(d), from two measured models:

- acceptance: p_k = P(the k-th drafted token is accepted | the k - 1 before it were), counted over
  the steps that drafted at least k tokens and accepted the k - 1 before (a Beta(1, 1) prior:
  (accepted + 1) / (trials + 2)); E(d) = 1 + sum_{k <= d} prod_{j <= k} p_j;
- cost: T(d) = an exponential moving average of measured step seconds per drafted depth (the
  first sample of a depth is dropped: it includes graph capture); a depth not measured yet is
  interpolated linearly between the measured depths around it (steps cost about a + b d), or
  extrapolated flat from the nearest one, which is optimistic and makes the policy try it.

Exploration: until both d = 0 and d = max_depth are measured, those are tried first; after
`explore_every` plain steps in a row the best positive depth is tried once, so a drafter whose
drafts got better is noticed. An exploring step that leaves plain decoding the best choice at least
doubles the gap before the next one, and makes it long enough that such steps cost at most
`explore_share` of the plain decoding time between them: a step that took x seconds more than plain
decoding would have taken for the tokens it emitted buys a gap of x / (explore_share * T(0)) plain
steps (up to `max_explore_every`). So a drafter that loses keeps costing ~1% however expensive its
drafts are (on an H100 a 0.5B draft model's 7-deep step costs ~8 plain steps: with a gap that only
doubled to 512, spec=auto ran at 0.96x plain); the first exploring step that pays brings the gap
back to `explore_every`. Plain steps up to that point are
known in advance (`plain_steps`), so the decoder runs them as one burst without a host round trip
per token. The policy holds no per-request state and can serve consecutive
requests (the engine keeps one per drafter and budget), so what it learned carries over.
"""
from __future__ import annotations

import math
from dataclasses import dataclass

__all__ = ["PolicyConfig", "DepthPolicy"]


@dataclass(slots=True, frozen=True)
class PolicyConfig:
    ema: float = 0.2              # weight of a new step-time sample
    explore_every: int = 16       # plain steps in a row before one drafted step is tried again
    max_explore_every: int = 4096  # ... growing after each exploring step that did not pay, up to this
    explore_share: float = 0.01   # the most of the plain decoding time that losing exploring steps may cost

    def __post_init__(self):
        if not 0.0 < self.ema <= 1.0:
            raise ValueError(f"ema must be in (0, 1], got {self.ema}")
        if self.explore_every < 1:
            raise ValueError(f"explore_every must be >= 1, got {self.explore_every}")
        if self.max_explore_every < self.explore_every:
            raise ValueError(f"max_explore_every must be >= explore_every, got {self.max_explore_every}")
        if not 0.0 < self.explore_share <= 1.0:
            raise ValueError(f"explore_share must be in (0, 1], got {self.explore_share}")


class DepthPolicy:
    def __init__(self, max_depth: int, config: PolicyConfig = PolicyConfig()):
        if max_depth < 1:
            raise ValueError(f"max_depth must be >= 1, got {max_depth}")
        self.max_depth, self.config = max_depth, config
        self.trials = [0] * (max_depth + 1)        # [k]: steps that drafted >= k and accepted >= k - 1
        self.hits = [0] * (max_depth + 1)          # [k]: ... and accepted the k-th
        self.step_s: list[float | None] = [None] * (max_depth + 1)
        self.samples = [0] * (max_depth + 1)       # step times seen per depth (the first is dropped)
        self.asked = [0] * (max_depth + 1)         # steps that asked the drafter for this depth
        self.plain_run = 0                         # plain steps since the last drafted one
        self.explore_gap = config.explore_every    # plain steps before the next exploring step
        self._exploring = False                    # the step just chosen is an exploring one

    # -- the two models ----------------------------------------------------------------------
    def accept_prob(self, k: int) -> float:
        return (self.hits[k] + 1) / (self.trials[k] + 2)

    def expected_tokens(self, d: int) -> float:
        total, run = 1.0, 1.0
        for k in range(1, d + 1):
            run *= self.accept_prob(k)
            total += run
        return total

    def cost(self, d: int) -> float | None:
        """Estimated seconds of a step that drafts d tokens; None while nothing is measured."""
        if self.step_s[d] is not None:
            return self.step_s[d]
        below = next((k for k in range(d - 1, -1, -1) if self.step_s[k] is not None), None)
        above = next((k for k in range(d + 1, self.max_depth + 1) if self.step_s[k] is not None), None)
        if below is not None and above is not None:
            t = (d - below) / (above - below)
            return (1 - t) * self.step_s[below] + t * self.step_s[above]
        near = below if below is not None else above
        return None if near is None else self.step_s[near]

    # -- decisions ---------------------------------------------------------------------------
    def _best(self, depths) -> int:
        def rate(d: int) -> float:
            c = self.cost(d)
            return self.expected_tokens(d) / c if c else float("inf")
        return max(depths, key=lambda d: (rate(d), -d))    # ties: the shallower (cheaper) depth

    def depth(self, limit: int) -> int:
        """The depth to draft this step, at most `limit` (the tokens and context left)."""
        limit = min(limit, self.max_depth)
        if limit <= 0:
            return 0
        best = next((d for d in (0, limit) if self.asked[d] < 2), None)    # measure both ends first
        if best is None:
            best = self._best(range(limit + 1))
            if best == 0 and self.plain_run >= self.explore_gap:
                best = self._best(range(1, limit + 1))
                self._exploring = True
        self.asked[best] += 1
        return best

    def plain_steps(self, limit: int) -> int:
        """After depth() chose 0: how many plain steps in a row it would choose before trying a
        drafted one again (exploration), at most `limit` -- so the decoder can run them as one
        burst with a single synchronisation. 1 while the plain and full depths are still being
        measured."""
        if limit <= 1 or self.asked[self.max_depth] < 2:
            return 1
        return max(1, min(limit, self.explore_gap - self.plain_run))

    def observe(self, drafted: int, accepted: int, seconds: float) -> None:
        """A step drafted `drafted` tokens (0: a plain step), kept `accepted`, took `seconds`."""
        if not 0 <= accepted <= drafted <= self.max_depth:
            raise ValueError(f"bad step: drafted {drafted}, accepted {accepted}, max depth {self.max_depth}")
        for k in range(1, min(drafted, accepted + 1) + 1):
            self.trials[k] += 1
            self.hits[k] += k <= accepted
        self.plain_run = self.plain_run + 1 if drafted == 0 else 0
        self.samples[drafted] += 1
        if self.samples[drafted] > 1:                   # the first: graph capture, first launches
            old = self.step_s[drafted]
            a = self.config.ema
            self.step_s[drafted] = seconds if old is None else (1 - a) * old + a * seconds
        self._after_exploring(accepted, seconds)

    def _after_exploring(self, accepted: int, seconds: float) -> None:
        """After an exploring step: if plain decoding is still the best choice, a longer gap -- at least twice the
        last, and enough plain steps that this step's extra time is at most explore_share of theirs."""
        if not self._exploring:
            return
        self._exploring = False
        cfg = self.config
        if self._best(range(self.max_depth + 1)) == 0:      # it did not pay: wait longer
            gap = 2 * self.explore_gap
            plain = self.cost(0)
            if plain:
                extra = seconds - (accepted + 1) * plain      # beyond plain decoding of the tokens it emitted
                gap = max(gap, math.ceil(extra / (cfg.explore_share * plain)))
            self.explore_gap = min(gap, cfg.max_explore_every)
        else:
            self.explore_gap = cfg.explore_every

    def info(self) -> dict:
        return {"accept_prob": [round(self.accept_prob(k), 4) for k in range(1, self.max_depth + 1)],
                "step_ms": [None if s is None else round(s * 1e3, 4) for s in self.step_s]}
