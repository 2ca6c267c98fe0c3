"""bench/lab/ncu_source_top.py on a CSV in the layout ncu 2025 writes for `--page source --csv --print-source sass`
(the header row below is the one the H100 host's ncu printed in session 18): one block per launch, repeated blocks
dropped, samples summed by opcode with predicates stripped, rows without source text ignored."""
from flashd.bench.lab import ncu_source_top as nst

HEADER = ["Address", "Source", "Warp Stall Sampling (All Samples)", "Warp Stall Sampling (Not-issued Samples)",
          "# Samples", "stall_long_sb", "stall_barrier"]


def rows():
    data = [["0x10", "LDC R1, c[0x0][0x28]", "2", "2", "2", "0", "0"],
            ["0x20", "@!P2  STS.128 [R4], R36", "6", "6", "6", "6", "0"],
            ["0x30", "", "9", "9", "9", "0", "0"],                     # no source text: not an instruction
            ["0x40", "BAR.SYNC.DEFER_BLOCKING 0x0", "2", "2", "2", "0", "2"]]
    return [HEADER] + data + [HEADER] + data + [[]]


def test_blocks_and_summary():
    found = nst.blocks(rows())
    assert len(found) == 2 and all(len(d) == 3 for _, d in found)
    lines = nst.summarize(*found[0], top=2)
    assert lines[0] == "3 instructions, 10 samples"
    assert lines[1].startswith("by opcode: STS 60.0%, LDC 20.0%, BAR 20.0%")
    assert len(lines) == 4 and "LDC" in lines[2]                  # the top two, in instruction order
    assert "STS.128" in lines[3] and "long_sb=6" in lines[3] and "barrier" not in lines[3]
