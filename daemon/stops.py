"""Stop strings over a stream of text pieces.

Text that might be the beginning of a stop string is held back until the next piece decides it,
so a client never receives part of a stop string; the matched stop string itself is not emitted.
"""
from __future__ import annotations

__all__ = ["StopMatcher"]


class StopMatcher:
    def __init__(self, stops: tuple[str, ...] | list[str]):
        self.stops = tuple(s for s in stops if s)
        self._held = ""        # received text not yet released
        self.stopped = False

    def feed(self, text: str) -> str:
        """Text safe to emit now. After a match, `stopped` is True and later feeds return ''."""
        if self.stopped:
            return ""
        held = self._held + text
        if not self.stops:
            self._held = ""
            return held
        first = min(((i, s) for s in self.stops if (i := held.find(s)) >= 0), default=None)
        if first is not None:
            self.stopped = True
            self._held = ""
            return held[:first[0]]
        keep = 0   # longest suffix of `held` that is a proper prefix of some stop string
        for s in self.stops:
            for n in range(min(len(s) - 1, len(held)), keep, -1):
                if held.endswith(s[:n]):
                    keep = n
                    break
        self._held = held[len(held) - keep:] if keep else ""
        return held[:len(held) - keep]

    def flush(self) -> str:
        """At the end of generation: release whatever was held back."""
        held, self._held = self._held, ""
        return "" if self.stopped else held
