"""A client of an in-process Engine (no daemon, no codec): submit a request, wait for its last event.
Shared by the engine tests of tests/daemon and tests/pflash."""
import threading

from flashd.protocol import messages as m


class EngineClient:
    def __init__(self, engine):
        self.engine, self.n = engine, 0

    def ask(self, cls, **fields) -> dict:
        """Submit cls(id, **fields) with a fresh id; the request's last event (done, result or error)."""
        self.n += 1
        done, events = threading.Event(), []

        def emit(event):
            events.append(event)
            if event["event"] in ("done", "result", "error"):
                done.set()

        self.engine.submit(cls(f"r{self.n}", **fields), emit)
        assert done.wait(120), "no answer"
        return events[-1]

    def greedy(self, ids, n: int) -> list[int]:
        """n greedy tokens after `ids` (ignore_eos), as a list of ids."""
        event = self.ask(m.Generate, ids=list(ids), max_tokens=n, ignore_eos=True, stream=False)
        assert event["event"] == "done", event
        return event["ids"]
