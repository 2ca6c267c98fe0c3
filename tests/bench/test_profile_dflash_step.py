"""bench/profile_dflash_step.py on the CPU reference backend with its tiny synthetic models: every
phase of a DFlash step is reported, for chain and DDTree, with the host top-K and with its
full-argsort definition (no timing is asserted)."""
from __future__ import annotations

import pytest

from flashd.bench.profile_dflash_step import main


@pytest.mark.parametrize("mode,topk", [("ddtree", "fast"), ("chain", "reference")])
def test_reports_every_phase(tmp_path, capsys, mode, topk):
    assert main(["--device", "cpu", "--steps", "2", "--prompt-len", "12", "--mode", mode, "--budget", "8",
                 "--host-topk", topk, "--workdir", str(tmp_path)]) == 0
    out = capsys.readouterr().out
    for phase in ("propose", "inject", "block", "lm_head", "host_copy", "topk", "tree", "verify", "capture",
                  "commit", "accept", "step (wall)"):
        assert f"\n{phase}" in out or f"    {phase}" in out, phase
    assert f"{mode} budget 8," in out and "device capture: 2 steps" in out and f"top-K host ({topk})" in out
