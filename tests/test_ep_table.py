"""tools/ep_table.py: the EP table from the records of 2026-11-29 (2 x H200, committed)."""

from __future__ import annotations

import os
import sys

import pytest

ROOT = os.path.join(os.path.dirname(__file__), "..")
sys.path.insert(0, os.path.join(ROOT, "tools"))
import ep_table  # noqa: E402

RUN = os.path.join(ROOT, "docs", "bench", "2026-11-29-h200x2-3c8a534")


def test_table_reproduces_the_committed_ratios():
    ep, b5 = ep_table.load([os.path.join(RUN, "ep-S1-8192.jsonl"),
                            os.path.join(RUN, "b5-output.txt")])
    text = ep_table.table(ep, b5)
    row = next(line for line in text.splitlines() if line.startswith("| S1 | 8192 | 2 | balanced"))
    # BENCHMARKS.md: peer fwd 3.05 ms, B5 7.73 ms (2.53x), B4 3.68 ms (1.21x), overlap 1.57
    for figure in ("3.05", "7.73", "3.68", "2.53", "1.21", "1.57"):
        assert figure in row, (figure, row)


def test_peer_bw_sizes_parse_and_reject():
    """tools/peer_bw.py (the exchange bandwidth sweep): sizes parse, bad ones name the entry."""
    import peer_bw

    assert peer_bw.parse_sizes("2048x8192,7168X16") == [(2048, 8192), (7168, 16)]
    assert all(h % 8 == 0 for h, _ in peer_bw.parse_sizes(peer_bw.DEFAULT_SIZES))
    for bad in ("2048", "2048x", "12x8", "0x4"):
        with pytest.raises(SystemExit, match=bad):
            peer_bw.parse_sizes(bad)
