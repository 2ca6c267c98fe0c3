"""bench/soak.py's core on the CPU, bounded by a request count (not by time): a mixed load of greedy
and seeded-sampled generates over stdin and two ZeroMQ peers, spec modes and drafters interleaved,
park/unpark of the drafters, the target and both, cancels mid-stream and prefix-cache hits. Every
repetition of a request must equal its first run (and, for the plain outputs, a fresh daemon's), and
every request must get exactly one terminal event.

Memory growth (soak check (c)) is not asserted: a run this short has few samples after its warm-up
and the allocator's settling would dominate them; bench/soak.py judges it over minutes. Nothing here
depends on timing: a cancel that arrives after its generate finished is still exactly one terminal
event, and the schedule (which rounds cancel, which park) is fixed by the seed.
"""
from __future__ import annotations

from flashd.bench import soak


def test_soak_core_outputs_and_terminal_events(tmp_path):
    config = soak.SoakConfig(max_requests=45, minutes=30, workdir=str(tmp_path), seed=3, reference="fresh",
                             sample_every_s=1.0)
    result = soak.run_soak(config)
    report = soak.report(config, result)
    assert result.mismatches == [], report
    assert result.violations == [], report
    assert result.unexpected_errors == [], report
    counts = result.counts
    for verb in ("generate", "cancel", "park", "unpark"):       # every request sent was answered
        assert counts.get(f"answered {verb}") == counts.get(f"sent {verb}"), report
    assert counts["answered generate"] >= 45 and counts["compared, equal"] >= 20, report
    assert counts["greedy"] > 0 and counts["sampled"] > 0, report
    assert counts.get("sent cancel", 0) >= 3 and counts.get("prefix-cache hits", 0) > 0, report
    assert all(counts.get(action, 0) > 0 for action in soak.ACTIONS), report
    assert all(counts.get(f"via {channel}", 0) > 0 for channel in ("stdin", "zmq0", "zmq1")), report
    assert result.samples and all(s.rss_mib > 0 for s in result.samples)
