"""Step-time breakdown of the end-to-end benchmark: the MoE layers against the rest of the step.

Two measurements, the first preferred:

``profile``
    A few training steps run under :func:`jax.profiler.trace`; the trace (an XSpace protobuf) is
    read back in-process with :class:`jax.profiler.ProfileData`. Every device-op event names the
    HLO instruction it executes (its ``hlo_op`` stat, else the event name); the compiled step's
    optimized HLO text (``compiled.as_text()``) says which instructions belong to the MoE layers:
    a custom call whose target starts with ``mok_`` (jax_mok's kernels), or an instruction whose
    ``op_name`` metadata carries the :data:`MOE_SCOPE` named scope that
    :func:`benchmarks.e2e.model.moe_forward` puts around every variant's MoE layer (forward and,
    as ``transpose(jvp(e2e_moe))``, backward; a fusion without metadata of its own takes its
    fused computation's). Events on ``/device:*`` planes are used where there are any (GPU),
    else the host's XLA thunk events (CPU).

    On a GPU, kernels run inside an XLA command buffer (CUDA graph) carry the command buffer's
    name, not the op's, so the profiled steps run an executable compiled with
    ``xla_gpu_enable_command_buffer=''`` (the timed steps keep the default executable).

``differential``
    Where no profile can be parsed: the median step of the same model with every MoE layer
    replaced by the identity (its parameters kept, unused), subtracted from the variant's
    median step. Labelled as such in the results.

Either way the record gives ``moe_ms`` + ``rest_ms`` = the variant's median step time: the
profile's MoE share of the summed device-op time, applied to the timed (wall-clock) step.
"""

from __future__ import annotations

import collections
import glob
import os
import re

MOE_SCOPE = "e2e_moe"
KERNEL_PREFIX = "mok_"

_INSTR = re.compile(r"^\s*(?:ROOT\s+)?%?([\w.\-]+)\s*=\s*(.*)$")
_COMPUTATION = re.compile(r"^\s*(?:ENTRY\s+)?%?([\w.\-]+)\s*(?:\(.*\))?.*\{\s*$")
_OP_NAME = re.compile(r'op_name="([^"]*)"')
_TARGET = re.compile(r'custom_call_target="([^"]*)"')
_CALLS = re.compile(r"(?:calls|to_apply)=%?([\w.\-]+)")


def classify_hlo(hlo_text: str, scope: str = MOE_SCOPE) -> dict[str, bool]:
    """``{instruction name: belongs to the MoE layers}`` for every instruction of an optimized
    HLO module's text (see the module docstring for the rule)."""
    own: dict[str, bool | None] = {}  # None: no metadata of its own
    calls: dict[str, str] = {}
    members: dict[str, list[str]] = collections.defaultdict(list)
    computation = None
    for line in hlo_text.splitlines():
        if line.rstrip().endswith("{") and " = " not in line.split("{")[0]:
            match = _COMPUTATION.match(line)
            computation = match.group(1) if match else None
            continue
        match = _INSTR.match(line)
        if not match:
            continue
        name, rest = match.groups()
        target = _TARGET.search(rest)
        op_name = _OP_NAME.search(rest)
        if target and target.group(1).startswith(KERNEL_PREFIX):
            own[name] = True
        elif op_name:
            own[name] = scope in op_name.group(1)
        else:
            own[name] = None
        if (called := _CALLS.search(rest)) is not None:
            calls[name] = called.group(1)
        if computation is not None:
            members[computation].append(name)

    def moe(name: str, depth: int = 0) -> bool:
        if own.get(name) is not None:
            return bool(own[name])
        if depth > 4 or name not in calls:
            return False
        inner = [own[n] for n in members.get(calls[name], ()) if own.get(n) is not None]
        if inner:
            return sum(inner) * 2 > len(inner)  # most of the fused ops with metadata
        return any(moe(n, depth + 1) for n in members.get(calls[name], ()))

    return {name: moe(name) for name in own}


def _stat_value(value):
    return value.decode() if isinstance(value, bytes) else value


def latest_profile(trace_dir: str):
    """``(ProfileData, path)`` of the newest ``*.xplane.pb`` under ``trace_dir`` (what
    :func:`jax.profiler.trace` wrote there)."""
    from jax.profiler import ProfileData

    files = sorted(glob.glob(os.path.join(trace_dir, "**", "*.xplane.pb"), recursive=True),
                   key=os.path.getmtime)
    if not files:
        raise FileNotFoundError(f"no *.xplane.pb under {trace_dir}")
    return ProfileData.from_file(files[-1]), files[-1]


def op_times(trace_dir: str, module: str | None = None,
             known: set[str] | None = None) -> tuple[dict[str, float], str]:
    """Summed duration (ns) per HLO op name over every device-op event of the newest trace under
    ``trace_dir``, and which planes they came from. ``module``: only events whose ``hlo_module``
    stat is this (the compiled step's HLO module name). ``known``: instruction names; an event
    without an ``hlo_op`` stat counts where its own name is one of them (or is one with its dots
    written as underscores, as GPU kernel names are)."""
    by_kernel_name = {n.replace(".", "_"): n for n in known or ()}
    data, path = latest_profile(trace_dir)
    per_plane: dict[str, dict[str, float]] = {}
    for plane in data.planes:
        totals: dict[str, float] = collections.defaultdict(float)
        for line in plane.lines:
            for event in line.events:
                stats = {k: _stat_value(v) for k, v in event.stats}
                op = stats.get("hlo_op")
                if op is None and known:
                    op = event.name if event.name in known else by_kernel_name.get(event.name)
                if op is None:
                    continue
                if module is not None and stats.get("hlo_module") not in (None, module):
                    continue
                totals[str(op)] += float(event.duration_ns)
        if totals:
            per_plane[plane.name] = totals
    device = {n: t for n, t in per_plane.items() if n.startswith("/device:")}
    chosen = device or per_plane
    merged: dict[str, float] = collections.defaultdict(float)
    for totals in chosen.values():
        for op, ns in totals.items():
            merged[op] += ns
    if not merged:
        raise ValueError(f"no HLO-op events (hlo_op stat) in {path}")
    return dict(merged), ", ".join(sorted(chosen))


def from_profile(trace_dir: str, hlo_text: str, module: str | None, steps: int,
                 step_ms: float) -> dict:
    """The ``profile`` breakdown record (see the module docstring)."""
    is_moe = classify_hlo(hlo_text)
    times, planes = op_times(trace_dir, module, set(is_moe))
    moe_ns = sum(ns for op, ns in times.items() if is_moe.get(op, False))
    unmatched_ns = sum(ns for op, ns in times.items() if op not in is_moe)
    busy_ns = sum(times.values())
    fraction = moe_ns / busy_ns if busy_ns else 0.0
    top = sorted(((ns, op) for op, ns in times.items() if is_moe.get(op, False)), reverse=True)
    moe_ms = fraction * step_ms
    return {
        "method": "profile",
        "profiled_steps": steps,
        "planes": planes,
        "device_op_ms_per_step": busy_ns / steps / 1e6,
        "moe_op_ms_per_step": moe_ns / steps / 1e6,
        "rest_op_ms_per_step": (busy_ns - moe_ns) / steps / 1e6,
        "unmatched_op_ms_per_step": unmatched_ns / steps / 1e6,
        "moe_fraction": fraction,
        "step_ms": step_ms,
        "moe_ms": moe_ms,
        "rest_ms": step_ms - moe_ms,
        "ops": len(times),
        "moe_ops": sum(1 for op in times if is_moe.get(op, False)),
        "top_moe_ops": [{"op": op, "ms_per_step": ns / steps / 1e6} for ns, op in top[:8]],
        "text": "MoE share of the summed device-op time of the profiled steps, applied to the "
                "median timed step",
    }


def differential(step_ms: float, no_moe_step_ms: float, reason: str) -> dict:
    """The ``differential`` breakdown record: ``step_ms`` minus the identity-MoE model's step."""
    moe_ms = min(max(step_ms - no_moe_step_ms, 0.0), step_ms)
    return {
        "method": "differential",
        "reason": reason,
        "step_ms": step_ms,
        "no_moe_step_ms": no_moe_step_ms,
        "moe_ms": moe_ms,
        "rest_ms": step_ms - moe_ms,
        "moe_fraction": moe_ms / step_ms if step_ms else 0.0,
        "text": "differential (no profile could be parsed): the median step minus the median "
                "step of the same model with every MoE layer replaced by the identity",
    }
