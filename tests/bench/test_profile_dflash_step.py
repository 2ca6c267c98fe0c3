"""bench/profile_dflash_step.py on the CPU reference backend with its tiny synthetic models: every
phase of a DFlash step is reported, for chain and DDTree, with the host top-K and with its
full-argsort definition, with the drafter's forwards as one block phase (--replay graph, the default) and split
into block and lm_head (--replay eager), and the tree builds side by side (--tree both) (no timing is asserted)."""
from __future__ import annotations

import pytest

from flashd.bench.profile_dflash_step import main


@pytest.mark.parametrize("mode,topk,replay", [("ddtree", "fast", "graph"), ("chain", "reference", "eager")])
def test_reports_every_phase(tmp_path, capsys, mode, topk, replay):
    assert main(["--device", "cpu", "--steps", "2", "--prompt-len", "12", "--mode", mode, "--budget", "8",
                 "--host-topk", topk, "--workdir", str(tmp_path), "--replay", replay]) == 0
    out = capsys.readouterr().out
    phases = ["propose", "inject", "block", "host_copy", "topk", "tree", "verify", "capture", "commit", "accept",
              "step (wall)"] + (["lm_head"] if replay == "eager" else [])
    for phase in phases:
        assert f"\n{phase}" in out or f"    {phase}" in out, phase
    assert ("    lm_head" in out) == (replay == "eager")
    assert f"{mode} budget 8, replay {replay}," in out and "capture/tree device/device: 2 steps" in out
    assert f"top-K host ({topk})" in out


def test_both_tree_builds_side_by_side(tmp_path, capsys):
    """--tree both: one request with the host's tree build and one with the device's, in columns (on the CPU
    backend both build on the host: the reference runner has no device build)."""
    assert main(["--device", "cpu", "--steps", "2", "--prompt-len", "12", "--budget", "8", "--tree", "both",
                 "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    assert "capture/tree device/host: 2 steps" in out and "capture/tree device/device: 2 steps" in out
    header = next(line for line in out.splitlines() if line.startswith("phase"))
    assert header.split() == ["phase", "device/host", "device/device"]
