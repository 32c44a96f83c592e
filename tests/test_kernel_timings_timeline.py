"""tools/kernel_timings.py timeline: a trace's device events cut into calls and summed.

CPU only: the events are made up (name, start ns, duration ns), as CUPTI gives them on a GPU."""

import os
import sys

import pytest

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "tools"))
import kernel_timings as kt  # noqa: E402

MS = 1_000_000


def _call(t0: int) -> list[tuple[str, int, int]]:
    """One call: a 1-ms kernel, a 20-us gap, a 2-ms kernel overlapped by a 0.5-ms one, a 5-us gap,
    a 0.25-ms kernel: span 3.275 ms, busy 3.25 ms, idle 25 us, largest gap 20 us."""
    return [("a_kernel", t0, MS), ("b_kernel", t0 + MS + 20_000, 2 * MS),
            ("c_kernel", t0 + MS + 500_000, MS // 2),
            ("d_kernel", t0 + 3 * MS + 25_000, MS // 4)]


def test_calls_are_cut_at_the_widest_gaps_and_summed():
    events = _call(0) + _call(10 * MS) + _call(17 * MS)  # gaps between calls: ms, not us
    st = kt.timeline_stats(list(reversed(events)), 3)  # any order
    assert st["events_per_call"] == 4
    assert st["span_ms"] == pytest.approx(3.275)
    assert st["busy_ms"] == pytest.approx(3.25)
    assert st["idle_ms"] == pytest.approx(0.025)
    assert st["largest_gap_us"] == pytest.approx(20.0)
    assert st["kernels"][0] == (pytest.approx(2.0), "b_kernel")
    assert [n for _, n in st["kernels"]] == ["b_kernel", "a_kernel", "c_kernel", "d_kernel"]


def test_a_slower_call_moves_the_medians_not_the_cut():
    slow = [(n, s, d * 2) for n, s, d in _call(30 * MS)]  # every kernel twice as long
    st = kt.timeline_stats(_call(0) + _call(10 * MS) + slow, 3)
    assert st["events_per_call"] == 4 and st["span_ms"] == pytest.approx(3.275)
    with pytest.raises(ValueError, match="device events for 5 calls"):
        kt.timeline_stats(_call(0), 5)
    with pytest.raises(ValueError, match="calls must be"):
        kt.timeline_stats(_call(0), 0)


def test_short_names_start_at_the_kernel_function():
    assert kt._short("_ZN3mok4cuda17wgmma_gemm_kernelILNS0_4ModeE1E") == (
        "wgmma_gemm_kernelILNS0_4ModeE1E")
    assert kt._short("memset") == "memset"


def test_overlapping_calls_cannot_be_cut():
    # two "calls" whose kernels overlap into one busy interval
    with pytest.raises(ValueError, match="1 busy intervals for 2 calls"):
        kt.timeline_stats([("a", 0, 10), ("b", 5, 10)], 2)
