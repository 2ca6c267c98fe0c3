"""The fault suite's bookkeeping: per fault class, how many requests were sent and how many
invariant checks failed, printed as a table at the end of the session (conftest.py).

Every test runs its checks inside `with faults.case("<class>") as case:`. A failed check is
recorded and the test goes on (so one run shows every broken invariant of the class, and the
table counts them); the test fails at the end of the block. An exception escaping the block (a
daemon that hangs or dies: the harness's deadline raises) counts as one failure.

The invariants every class checks (ARCHITECTURE.md, "Fault and bad-input suite"):
  - every accepted request gets exactly one terminal event (done / result / error),
  - no Python traceback reaches a client (scan every reply the client sees),
  - the daemon keeps serving: a probe afterwards gives the same tokens as a fresh daemon.
"""
from __future__ import annotations

import contextlib
import json
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field

TERMINAL = ("done", "result", "error")


@dataclass
class Tally:
    sent: int = 0
    failures: int = 0
    messages: list[str] = field(default_factory=list)


class FaultCase:
    """The checks of one test, counted into its fault class's tally."""

    def __init__(self, tally: Tally):
        self._tally = tally
        self._failed: list[str] = []

    def sent(self, n: int = 1) -> None:
        self._tally.sent += n

    def check(self, ok: bool, message: str) -> bool:
        if not ok:
            self._tally.failures += 1
            self._failed.append(message)
        return ok

    def no_traceback(self, replies: Iterable, where: str) -> None:
        """No reply (an event dict, a status line, an HTTP body) carries a Python traceback."""
        for reply in replies:
            text = reply if isinstance(reply, str) else json.dumps(reply, default=repr)
            self.check("Traceback" not in text, f"{where}: a traceback reached the client: {text[:300]}")

    def one_terminal(self, events: list[dict], request_id: str, where: str) -> dict | None:
        """Exactly one terminal event for `request_id` among `events`; it is returned."""
        terminals = [e for e in events if e.get("id") == request_id and e.get("event") in TERMINAL]
        self.check(len(terminals) == 1, f"{where}: request {request_id!r} got {len(terminals)} terminal events "
                                        f"({[e.get('event') for e in terminals]})")
        return terminals[0] if terminals else None

    def error_code(self, event: dict | None, code: str, where: str) -> None:
        self.check(event is not None and event.get("event") == "error" and event.get("code") == code,
                   f"{where}: expected error {code}, got {event}")

    def probe(self, daemon, fresh: dict[str, list[int]], where: str) -> None:
        """The fault left no trace: the daemon's probe generations (daemon_harness.PROBES, through
        its stdin) give a fresh daemon's tokens."""
        self.sent(len(fresh))
        got = daemon.probe()
        self.check(got == fresh, f"{where}: the probe gives other tokens than a fresh daemon: {got} != {fresh}")

    @property
    def failed(self) -> list[str]:
        return list(self._failed)


class FaultRegistry:
    """Tallies by fault class, in the order the classes were first seen."""

    def __init__(self):
        self.tallies: dict[str, Tally] = {}

    @contextlib.contextmanager
    def case(self, fault_class: str) -> Iterator[FaultCase]:
        tally = self.tallies.setdefault(fault_class, Tally())
        case = FaultCase(tally)
        try:
            yield case
        except BaseException as exc:
            if not isinstance(exc, (KeyboardInterrupt, GeneratorExit)):
                tally.failures += 1
                tally.messages.append(f"{type(exc).__name__}: {str(exc)[:200]}")
            raise
        tally.messages.extend(case.failed)
        if case.failed:
            raise AssertionError(f"{fault_class}: {len(case.failed)} invariant(s) broken:\n  "
                                 + "\n  ".join(case.failed))

    def table(self) -> list[str]:
        if not self.tallies:
            return []
        width = max(len("fault class"), *(len(name) for name in self.tallies))
        rows = [f"{'fault class':<{width}}  {'requests sent':>13}  {'failures':>8}",
                f"{'-' * width}  {'-' * 13}  {'-' * 8}"]
        for name, tally in self.tallies.items():
            rows.append(f"{name:<{width}}  {tally.sent:>13}  {tally.failures:>8}")
        total_sent = sum(t.sent for t in self.tallies.values())
        total_failures = sum(t.failures for t in self.tallies.values())
        rows.append(f"{'total':<{width}}  {total_sent:>13}  {total_failures:>8}")
        return rows


# One registry per pytest session: the fixture hands it to tests, the summary hook prints it.
REGISTRY = FaultRegistry()
