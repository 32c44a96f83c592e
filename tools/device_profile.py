"""Where a jitted program's device time goes, per XLA op and per kernel, from a profiler trace.

    import device_profile  # tools/ on sys.path (as for the scripts run from tools/)
    print(device_profile.format_summary(device_profile.profile_calls(fn, *args, calls=5)))

``profile_calls`` runs ``fn(*args)`` once untimed, then ``calls`` times under
``jax.profiler.trace`` and reads the trace back (``jax.profiler.ProfileData``). For every device
plane (``/device:GPU:N``) it returns, per call:

- ``ops``: the "XLA Ops" line, device time per HLO instruction (our custom calls show up as
  ``custom-call.N`` with the target in the op's name where XLA records it; fusions, copies,
  all-to-alls and NCCL collectives as XLA names them);
- ``kernels``: the stream lines, device time per kernel name (template arguments stripped);
- ``busy_ms``: the union of the kernel intervals (overlapping kernels, e.g. on two streams,
  counted once), and ``span_ms``: first kernel start to last kernel end over all calls, divided
  by ``calls``: ``span - busy`` is the time the device waited (host dispatch, launch gaps, spins
  of other ranks are *busy* time of the spinning kernel).

Used by ``tools/ep_bench.py --profile`` (where the EP layer's time goes: expert kernels vs
exchange vs XLA glue). Needs a GPU to say anything: a CPU trace has no device planes, and the
summary says so.
"""

from __future__ import annotations

import glob
import os
import re
import tempfile
from collections import defaultdict

import jax

_TEMPLATE = re.compile(r"<.*>")


def _short(name: str) -> str:
    """A kernel's name without its template arguments and parameter list (readable tables)."""
    name = _TEMPLATE.sub("<>", name)
    return name.split("(")[0].replace("void ", "").strip()


def summarize(profile, calls: int) -> list[dict]:
    """Per device plane of a ``jax.profiler.ProfileData``: ops, kernels, busy and span (ms per
    call), sorted by time."""
    out = []
    for plane in profile.planes:
        if not plane.name.startswith("/device:"):
            continue
        ops: dict[str, float] = defaultdict(float)
        kernels: dict[str, float] = defaultdict(float)
        intervals = []
        for line in plane.lines:
            if line.name == "XLA Ops":
                for e in line.events:
                    ops[e.name] += e.duration_ns
            elif line.name.startswith("Stream"):
                for e in line.events:
                    kernels[_short(e.name)] += e.duration_ns
                    intervals.append((e.start_ns, e.start_ns + e.duration_ns))
        busy = 0.0
        end = float("-inf")
        for a, b in sorted(intervals):  # union of the kernel intervals
            if a > end:
                busy += b - a
                end = b
            elif b > end:
                busy += b - end
                end = b
        span = (max(b for _, b in intervals) - min(a for a, _ in intervals)) if intervals else 0.0
        per_call = lambda d: sorted(((k, v / calls / 1e6) for k, v in d.items()),
                                    key=lambda kv: -kv[1])
        out.append({
            "device": plane.name,
            "ops": per_call(ops),
            "kernels": per_call(kernels),
            "busy_ms": busy / calls / 1e6,
            "span_ms": span / calls / 1e6,
        })
    return out


def profile_calls(fn, *args, calls: int = 5) -> list[dict]:
    """``summarize`` of ``calls`` calls of ``fn(*args)`` (after one untimed call)."""
    jax.block_until_ready(fn(*args))
    with tempfile.TemporaryDirectory() as folder:
        with jax.profiler.trace(folder):
            for _ in range(calls):
                jax.block_until_ready(fn(*args))
        files = glob.glob(os.path.join(folder, "**", "*.xplane.pb"), recursive=True)
        if not files:
            return []
        return summarize(jax.profiler.ProfileData.from_file(files[0]), calls)


def format_summary(summary: list[dict], top: int = 12) -> str:
    """A short text table per device: busy / span, then the top ops and kernels (ms per call)."""
    if not summary:
        return "no device planes in the trace (CPU run, or the profiler saw no device)"
    lines = []
    for dev in summary:
        lines.append(f"{dev['device']}: busy {dev['busy_ms']:.3f} ms per call, span "
                     f"{dev['span_ms']:.3f} ms (span - busy = device idle, incl. between calls)")
        for title, rows in (("XLA ops", dev["ops"]), ("kernels", dev["kernels"])):
            shown = rows[:top]
            rest = sum(ms for _, ms in rows[top:])
            lines.append(f"  {title}:")
            lines += [f"    {ms:9.3f} ms  {name[:100]}" for name, ms in shown]
            if rest:
                lines.append(f"    {rest:9.3f} ms  ({len(rows) - top} more)")
    return "\n".join(lines)
