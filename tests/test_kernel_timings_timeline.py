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


def _host(t0: int) -> list[tuple[str, str, int, int]]:
    """One call's host side, the device's first kernel at ``t0 + 0.5 ms`` (as in ``_call(t0 +
    0.5 ms)``): the 0.1-ms return of the previous call's synchronization, then a 0.4-ms dispatch
    with a 0.3-ms execute nested in it starting 0.4 ms before the kernel, and a 3.5-ms
    synchronization starting 0.1 ms after it."""
    return [("python", "sync_return", t0, MS // 10),
            ("python", "PjitFunction(step)", t0 + MS // 10, 2 * MS // 5),
            ("python", "Execute", t0 + MS // 5, 3 * MS // 10),
            ("python", "block_until_ready", t0 + 3 * MS // 5, 7 * MS // 2)]


def test_host_windows_lead_and_top_names():
    """Calls cut as timeline_stats cuts them; each call's host window runs from the previous
    call's last kernel end (the first one's from -inf) to its own; the lead runs from the call's
    PjitFunction to its first kernel, and the names' times are medians of the per-call sums,
    nested events counted in full."""
    starts = [0, 10 * MS, 17 * MS]  # the calls' host starts; their kernels start 0.5 ms later
    device = [ev for t in starts for ev in _call(t + MS // 2)]
    # the first call's host also started the trace 2 ms earlier
    host = [("python", "start_trace", -2 * MS, MS)] + [ev for t in starts for ev in _host(t)]
    # after the last call's kernels end (3.775 ms after its start): outside every window
    host.append(("python", "stop_trace", 17 * MS + 3_800_000, MS))
    # a second thread, during the second call's kernels: in its window, after its lead
    host.append(("tf_pool", "Await", 11 * MS, MS // 4))
    st = kt.host_stats(list(reversed(host)), device, 3)
    assert st["lead_ms"] == pytest.approx(0.4)
    assert st["lead_event"] == "PjitFunction(step)"
    # kernels 0.5-3.775, 10.5-13.775, 17.5-20.775 ms: idle 6.725 and 3.725 ms between them
    assert st["between_ms"] == pytest.approx(5.225)
    assert st["host_top"] == [(pytest.approx(3.5), "block_until_ready"),
                              (pytest.approx(0.4), "PjitFunction(step)"),
                              (pytest.approx(0.3), "Execute"),
                              (pytest.approx(0.1), "sync_return")]  # Await, start_trace: median 0
    # from any event: the first after the previous call's kernels (the first call's, start_trace)
    st = kt.host_stats(host, device, 3, call_event="")
    assert st["lead_ms"] == pytest.approx(0.5)  # leads 2.5, 0.5, 0.5
    assert st["lead_event"] == "sync_return"


def test_host_lead_is_none_without_a_call_event_before_the_kernels():
    """A call with no PjitFunction starting before its first kernel has no lead; one call has no
    idle time between calls; the device events' cut errors come through."""
    st = kt.host_stats([("python", "PjitFunction(step)", 2 * MS, MS)], _call(0), 1)
    assert st["lead_ms"] is None and st["lead_event"] is None and st["between_ms"] is None
    assert st["host_top"] == [(pytest.approx(1.0), "PjitFunction(step)")]
    with pytest.raises(ValueError, match="device events for 5 calls"):
        kt.host_stats([], _call(0), 5)


def test_host_lead_medians_only_the_calls_that_have_one():
    """Calls without a PjitFunction before their first kernel are left out of the lead's median;
    with ``call_event=""`` the earliest event on any thread after the previous call's kernels
    ended gives the lead."""
    device = _call(0) + _call(10 * MS)  # the first call's kernels end at 3.275 ms
    host = [("python", "PjitFunction(step)", 9 * MS, MS), ("tf_pool", "Await", 4 * MS, MS // 4)]
    st = kt.host_stats(host, device, 2)
    assert st["lead_ms"] == pytest.approx(1.0)  # the second call's; the first has none
    assert st["lead_event"] == "PjitFunction(step)"
    st = kt.host_stats(host, device, 2, call_event="")
    assert st["lead_ms"] == pytest.approx(6.0)  # the second call's, from Await at 4 ms
    assert st["lead_event"] == "Await"


def test_clock_samples_are_parsed_and_summarized():
    """nvidia-smi's csv lines (clock MHz, power W) give the median and minimum clock and the
    median power; unreadable lines (a header, a warning) are skipped, none readable is None."""
    lines = ["1980, 500.5", "garbage", "1755, 699.0", "1980, 650.0", ""]
    assert kt.parse_smi(lines) == {"mhz": 1980.0, "min_mhz": 1755.0, "watts": 650.0,
                                   "samples": 3}
    assert kt.parse_smi(["[N/A], [N/A]"]) is None


def test_gpu_clocks_reads_what_the_sampler_printed():
    """The sampler runs beside the block and its output is read when the block ends (a stand-in
    command prints two samples); without nvidia-smi the result is None, not an error."""
    cmd = [sys.executable, "-c", "print('1410, 300.0'); print('1200, 310.0')"]
    with kt.gpu_clocks(cmd) as c:
        assert c["clocks"] is None  # filled in afterwards
    assert c["clocks"] == {"mhz": 1305.0, "min_mhz": 1200.0, "watts": 305.0, "samples": 2}
    if kt.shutil.which("nvidia-smi") is None:
        with kt.gpu_clocks() as none:
            pass
        assert none["clocks"] is None


def test_clock_reasons_name_every_limit_seen():
    """A third field is the clocks event reasons mask: the limits seen in any sample are named
    (the idle bit is not a limit); a mask of none gives an empty list, unreadable masks drop
    their line."""
    lines = ["1560, 436.0, 0x0000000000000004", "1470, 440.0, 0x0000000000000024",
             "1980, 120.0, 0x0000000000000001", "1500, 400.0, notahex"]
    c = kt.parse_smi(lines)
    assert c["samples"] == 3 and c["min_mhz"] == 1470.0
    assert c["reasons"] == ["sw power cap", "sw thermal"]
    assert kt.parse_smi(["1980, 500.0, 0x0"])["reasons"] == []
    assert "limited by: sw power cap" in kt._clock_text(kt.parse_smi(lines[:1]))


def test_fresh_then_hot_times_four_conditions(monkeypatch):
    """Three single calls after idle, the fresh and after-load measures (median_s: 3 warm-ups
    and 20 synchronized calls each) and back_to_back_s's five trials (and one warm-up) of reps
    calls sized from the fresh time to ~``seconds`` in all: every call accounted for."""
    monkeypatch.setattr(kt.time, "sleep", lambda s: None)
    calls, reps_seen = [0], []
    b2b = kt.back_to_back_s

    def spy(f, *args, reps, trials):
        reps_seen.append((reps, trials))
        return b2b(f, *args, reps=reps, trials=trials)

    monkeypatch.setattr(kt, "back_to_back_s", spy)

    def f(x):
        calls[0] += 1
        return x + 1

    rows = kt._fresh_then_hot(f, (kt.jnp.zeros(()),), 0.05)
    assert [r[0] for r in rows] == ["alone after idle", "fresh", "back to back 0.05 s",
                                    "synchronized after"]
    [(reps, trials)] = reps_seen
    assert trials == 5 and reps == max(1, round(0.05e3 / 5 / max(rows[1][1], 1e-3)))
    assert calls[0] == 3 + 2 * (3 + 20) + (1 + trials) * reps
    assert all(ms > 0 for _, ms, _ in rows)


def test_clocks_prints_a_row_per_condition(monkeypatch, capsys):
    """The mode end to end on the CPU with a small dot and no layer: four rows, each with its
    ms, TFLOP/s and a clock column ("-" without nvidia-smi)."""
    monkeypatch.setattr(kt.time, "sleep", lambda s: None)
    kt.clocks([], seconds=0.01, n=128)
    rows = [r for r in capsys.readouterr().out.splitlines() if r.startswith("| bf16 dot 128^3")]
    assert [r.split(" | ")[1] for r in rows] == ["alone after idle", "fresh",
                                                 "back to back 0.01 s", "synchronized after"]


def test_clocks_goes_on_after_a_workload_runs_out_of_memory(monkeypatch, capsys):
    """A layer that does not fit prints an "out of memory" row and the next workload still
    runs; any other runtime error is raised."""
    monkeypatch.setattr(kt.time, "sleep", lambda s: None)

    def oom(name):
        if name == "S6":
            raise kt.jax.errors.JaxRuntimeError("RESOURCE_EXHAUSTED: Out of memory")
        raise kt.jax.errors.JaxRuntimeError("INTERNAL: something else")

    monkeypatch.setattr(kt, "inputs", oom)
    kt.clocks(["S6"], seconds=0.01, n=64)
    out = capsys.readouterr().out
    assert "| S6 fwd+bwd | out of memory |" in out
    assert out.count("| bf16 dot 64^3 |") == 4
    with pytest.raises(kt.jax.errors.JaxRuntimeError, match="INTERNAL"):
        kt.clocks(["S1"], seconds=0.01, n=64)
