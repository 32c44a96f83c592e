"""Tuning of the kernels and of the peer transport, and the registry of environment variables.

This is the only module of jax_mok that reads ``os.environ``; every ``JAX_MOK_*`` variable the
library, its C++ extensions, its build, tests or benchmarks read is listed in :data:`REGISTRY`
(``python -m jax_mok info`` prints them with their values).

Tuning reaches the kernels as FFI attributes (jax_mok/kernels/targets.py), so it is part of the
lowered program and of the jit cache key. A call's tuning is resolved at trace time, field by
field: the dataclass default, then ``JAX_MOK_TUNING`` (a debugging / sweep variable, e.g.
``JAX_MOK_TUNING="pregather_x=1,copy=sm,timeout_ms=2000"``), then the ``tuning=`` argument of
:func:`jax_mok.moe` or the Flax modules, whose fields win wherever they differ from the default.
"""

from __future__ import annotations

import dataclasses
import os
import warnings
from collections.abc import Callable

GEMMS = ("auto", "simt")  # FFI attribute gemm = the index
COPIES = ("ce", "sm")
CHECKS = ("sync", "deferred")
MAX_CTAS_PER_SM = 4  # every CTA of the exchange grid must stay co-resident (it spins on peers)


def _check_choice(owner: str, name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {choices}, got {value!r}")


def _check_int(owner: str, name: str, value, low: int, high: int | None = None) -> None:
    ok = isinstance(value, int) and not isinstance(value, bool) and value >= low
    if not ok or (high is not None and value > high):
        bound = f"in [{low}, {high}]" if high is not None else f">= {low}"
        raise ValueError(f"{owner}.{name} must be an int {bound}, got {value!r}")


def pregather_heuristic(ffn_size: int, rows_per_expert: int) -> bool:
    """Whether the CUDA forward gathers x into expert order before the gate/up GEMM.

    The gather costs a pass over ``T*k*H`` elements and pays where the GEMM is long: F >= 4096
    (S3, F = 14336: gate/up 13.6 -> 11.9 ms on an H200), or F >= 2048 with at least 512 rows per
    expert on average (S6: 0.647 -> 0.554 ms plus a 0.057-ms gather); short experts lose (S4, 112
    rows per expert; S1, F = 768). The kernels apply it only on their wgmma (bfloat16) path.
    """
    return ffn_size >= 4096 or (ffn_size >= 2048 and rows_per_expert >= 512)


def pregather_backward_heuristic(ffn_size: int) -> bool:
    """Whether the CUDA backward copies x and dy into expert order before its GEMMs (the BF16
    backward's, and the FP8 backward's with unquantized weight gradients).

    The copy costs two passes over ``T*k*H`` elements; without it the weight-gradient GEMMs (and
    the BF16 dy·Wd^T) gather the token-order rows themselves, 8-16 % slower per GEMM on an H200.
    The GEMMs' work per copied element grows with F, so the copy pays for wide experts: S2
    (F = 2048) steps 3 % faster with it in BF16, 1 % in fp8_block; S1 (F = 768) steps 6 % (bf16)
    and 5 % (fp8_block) faster without it. Shapes with F >= 2048 keep the copy.
    """
    return ffn_size >= 2048


@dataclasses.dataclass(frozen=True)
class KernelTuning:
    """Choices of the routed-expert kernels that never change what they compute.

    Attributes:
      pregather_x: gather x into expert order before the forward's gate/up GEMM (its A operand
        then loads by TMA). ``None``: :func:`pregather_heuristic` per call shape.
      pregather_backward: copy x and dy into expert order before the backward's GEMMs (the
        weight-gradient GEMMs then load both operands by TMA); off, those GEMMs gather the rows
        themselves. ``None``: :func:`pregather_backward_heuristic` per call shape.
      gemm: ``"auto"`` (wgmma for bfloat16, the SIMT GEMM for float32) or ``"simt"`` (the
        CUDA-core GEMM for every dtype: the oracle the GPU tests compare the wgmma path against).
    """

    pregather_x: bool | None = None
    pregather_backward: bool | None = None
    gemm: str = "auto"

    def __post_init__(self):
        for name in ("pregather_x", "pregather_backward"):
            value = getattr(self, name)
            if value is not None and not isinstance(value, bool):
                raise ValueError(
                    f"KernelTuning.{name} must be None, True or False, got {value!r}")
        _check_choice("KernelTuning", "gemm", self.gemm, GEMMS)

    def pregather_for(self, ffn_size: int, assignments: int, num_experts: int,
                      backward: bool = False) -> bool:
        """The resolved pregather choice of a forward (``backward``: a backward) call with
        ``assignments`` = T*k rows over ``num_experts`` experts of width ``ffn_size``."""
        if backward:
            if self.pregather_backward is not None:
                return self.pregather_backward
            return pregather_backward_heuristic(ffn_size)
        if self.pregather_x is not None:
            return self.pregather_x
        return pregather_heuristic(ffn_size, assignments // max(num_experts, 1))


@dataclasses.dataclass(frozen=True)
class PeerTuning:
    """Choices of the ``"peer"`` expert-parallel transport (docs/peer-transport.md).

    Attributes:
      copy: how rows reach the peers: ``"ce"`` (copy engines, ``cudaMemcpyAsync`` into the peers'
        slots; the kernel only signals, waits and reads) or ``"sm"`` (the exchange kernel's own
        stores). The same bytes either way.
      check: ``"sync"`` (a host sync ends each peer call, so a peer timeout fails that call) or
        ``"deferred"`` (no sync; a timeout fails the next peer call on the workspace).
      timeout_ms: how long a peer call waits for the other ranks before failing with an error
        naming the missing rank.
      ctas_per_sm: the exchange kernel's grid, 1..4 CTAs per SM (4 at most: every CTA of the grid
        must stay co-resident while it spins on its peers).
      workspace_limit_bytes: the largest symmetric workspace per GPU a call may allocate.
    """

    copy: str = "ce"
    check: str = "sync"
    timeout_ms: int = 10_000
    ctas_per_sm: int = 2
    workspace_limit_bytes: int = 8 << 30

    def __post_init__(self):
        _check_choice("PeerTuning", "copy", self.copy, COPIES)
        _check_choice("PeerTuning", "check", self.check, CHECKS)
        _check_int("PeerTuning", "timeout_ms", self.timeout_ms, 1)
        _check_int("PeerTuning", "ctas_per_sm", self.ctas_per_sm, 1, MAX_CTAS_PER_SM)
        _check_int("PeerTuning", "workspace_limit_bytes", self.workspace_limit_bytes, 1)


@dataclasses.dataclass(frozen=True)
class Tuning:
    """Everything tunable about one :func:`jax_mok.moe` call (hashable: a jit-static value)."""

    kernel: KernelTuning = KernelTuning()
    peer: PeerTuning = PeerTuning()

    def __post_init__(self):
        if not isinstance(self.kernel, KernelTuning):
            raise TypeError(
                f"Tuning.kernel must be a KernelTuning, got {type(self.kernel).__name__}")
        if not isinstance(self.peer, PeerTuning):
            raise TypeError(f"Tuning.peer must be a PeerTuning, got {type(self.peer).__name__}")


# ------------------------------------------------------------------ JAX_MOK_TUNING

# Parsers of variable text: each raises KeyError on a value it does not accept.

def _parse_bool_or_auto(text: str):
    return {"auto": None, "0": False, "1": True}[text]


def _flag(text: str) -> bool:
    return {"0": False, "1": True}[text]


def _choice(*choices: str):
    return lambda text: {c: c for c in choices}[text]


def _parse_int(low: int, high: int | None = None):
    def parse(text: str) -> int:
        if not text.isdigit():
            raise KeyError(text)
        value = int(text)
        if value < low or (high is not None and value > high):
            raise KeyError(text)
        return value
    return parse


# key of JAX_MOK_TUNING -> (section of Tuning, parser, accepted values in words)
_KEYS = {
    "pregather_x": ("kernel", _parse_bool_or_auto, "auto | 0 | 1"),
    "pregather_backward": ("kernel", _parse_bool_or_auto, "auto | 0 | 1"),
    "gemm": ("kernel", _choice(*GEMMS), " | ".join(GEMMS)),
    "copy": ("peer", _choice(*COPIES), " | ".join(COPIES)),
    "check": ("peer", _choice(*CHECKS), " | ".join(CHECKS)),
    "timeout_ms": ("peer", _parse_int(1), "an integer >= 1"),
    "ctas_per_sm": ("peer", _parse_int(1, MAX_CTAS_PER_SM), f"an integer in 1..{MAX_CTAS_PER_SM}"),
    "workspace_limit_bytes": ("peer", _parse_int(1), "an integer >= 1 (bytes)"),
}


def parse_tuning(text: str, variable: str = "JAX_MOK_TUNING") -> dict[str, object]:
    """``"key=value,key=value"`` -> ``{key: value}``, strictly: an unknown or repeated key, an
    item without ``=`` or a bad value raises ValueError naming ``variable``, the key and the
    accepted values."""
    out: dict[str, object] = {}
    for item in (part.strip() for part in text.split(",")):
        if not item:
            continue
        key, sep, value = (s.strip() for s in item.partition("="))
        if not sep:
            raise ValueError(f"{variable}: {item!r} is not key=value; keys: {sorted(_KEYS)}")
        if key not in _KEYS:
            raise ValueError(f"{variable}: unknown key {key!r}; keys: {sorted(_KEYS)}")
        if key in out:
            raise ValueError(f"{variable}: key {key!r} is given twice")
        _, parser, accepted = _KEYS[key]
        try:
            out[key] = parser(value)
        except KeyError:
            raise ValueError(
                f"{variable}: {key}={value!r} is not accepted; {key} takes {accepted}") from None
    return out


def resolve_with_sources(tuning: Tuning | None = None) -> tuple[Tuning, dict[str, str]]:
    """The tuning of a call and where each field came from (``"default"``, ``"env"``:
    ``JAX_MOK_TUNING``, ``"argument"``: a field of ``tuning`` that differs from its default)."""
    if tuning is not None and not isinstance(tuning, Tuning):
        raise TypeError(f"tuning must be a jax_mok.Tuning or None, got {type(tuning).__name__}")
    env = read("JAX_MOK_TUNING") or {}
    given = tuning or Tuning()
    default = Tuning()
    sections: dict[str, dict[str, object]] = {"kernel": {}, "peer": {}}
    sources: dict[str, str] = {}
    for section in sections:
        for field in dataclasses.fields(getattr(default, section)):
            name = field.name
            mine = getattr(getattr(given, section), name)
            if mine != getattr(getattr(default, section), name):
                value, source = mine, "argument"
            elif name in env:
                value, source = env[name], "env"
            else:
                value, source = mine, "default"
            sections[section][name] = value
            sources[f"{section}.{name}"] = source
    resolved = Tuning(KernelTuning(**sections["kernel"]), PeerTuning(**sections["peer"]))
    return resolved, sources


def resolve(tuning: Tuning | None = None) -> Tuning:
    """The tuning of a call (see :func:`resolve_with_sources`); read at trace time."""
    warn_unknown_variables()
    return resolve_with_sources(tuning)[0]


# ------------------------------------------------------------------ the registry

@dataclasses.dataclass(frozen=True)
class EnvVar:
    """One ``JAX_MOK_*`` variable.

    Attributes:
      name: the variable.
      accepted: the values it takes, in words (parsed strictly: anything else is an error).
      default: its meaning when unset (or set to the empty string).
      meaning: what it does.
      reader: who reads it and when.
      role: ``"library"`` (changes what runs: tuning), ``"debug"`` (never changes results),
        ``"build"``, ``"test"`` or ``"bench"`` (read outside the library).
      parse: text -> value for :func:`read` (KeyError, or ValueError with its own message, on a
        value outside ``accepted``).
    """

    name: str
    accepted: str
    default: str
    meaning: str
    reader: str
    role: str
    parse: Callable[[str], object] = dataclasses.field(default=str, repr=False, compare=False)


REGISTRY: dict[str, EnvVar] = {v.name: v for v in (
    EnvVar("JAX_MOK_TUNING", "key=value[,key=value...] with keys " + ", ".join(_KEYS),
           "the dataclass defaults",
           "tuning defaults for every call (KernelTuning / PeerTuning fields; a call's "
           "tuning= argument wins where it differs from the default)",
           "Python, at trace time", "library", parse_tuning),
    EnvVar("JAX_MOK_TRANSPORT", "auto | xla | peer", "auto",
           "the expert-parallel transport of calls that name none (auto: peer where every "
           "device of the expert axis is an NVLink peer, else xla with a one-time warning)",
           "Python, at trace time", "debug", _choice("auto", "xla", "peer")),
    EnvVar("JAX_MOK_PEER_BOOTSTRAP", "ipc | fabric", "chosen per mesh",
           "force the multi-process bootstrap of the peer workspace",
           "Python, at workspace creation", "debug", _choice("ipc", "fabric")),
    EnvVar("JAX_MOK_CUDA_DEBUG_SYNC", "0 | 1", "0",
           "synchronize after every CUDA phase and name the phase that failed",
           "C++ (CUDA extension), once per process", "debug", _flag),
    EnvVar("JAX_MOK_CUDA_PROFILE", "0 | 1", "0",
           "print each CUDA phase's device time to stderr (serializes the call)",
           "C++ (CUDA extension), once per process", "debug", _flag),
    EnvVar("JAX_MOK_CPU_THREADS", "an integer >= 1", "all hardware threads (at most 64)",
           "threads of the CPU kernels", "C++ (CPU extension), once per process", "debug",
           _parse_int(1)),
    EnvVar("JAX_MOK_CUDA", "0 | 1 | AUTO", "AUTO",
           "build the CUDA extension: 0 never, 1 always (a missing nvcc is an error), AUTO "
           "where nvcc is on PATH", "pip install (CMake)", "build", _choice("0", "1", "AUTO")),
    EnvVar("JAX_MOK_PYTHON", "a path", "python3 on PATH",
           "the Python whose jaxlib and nanobind headers the Bazel build uses",
           "Bazel (tools/bazel)", "build"),
    EnvVar("JAX_MOK_REQUIRE_CUDA", "0 | 1", "0",
           "a missing GPU fails the GPU tests instead of skipping them", "tests/", "test", _flag),
    EnvVar("JAX_MOK_GIT_COMMIT", "a commit", "git rev-parse HEAD",
           "the commit benchmark records name (the device machine's copy has no .git)",
           "benchmarks/, tools/", "bench"),
    EnvVar("JAX_MOK_BENCH_TORCH_CPU", "0 | 1", "0",
           "run the PyTorch peer B3 on the CPU too (to test its math)", "benchmarks/", "bench",
           _flag),
    EnvVar("JAX_MOK_BENCH_FP8_PURE_JAX", "0 | 1", "0",
           "time an FP8 row even where its call runs the pure-JAX FP8 layer instead of the "
           "kernels (the record's fp8_path says which)", "benchmarks/", "bench", _flag),
)}


def raw(name: str) -> str | None:
    """The variable's text, None when unset or empty."""
    if name not in REGISTRY:
        raise ValueError(f"{name} is not a jax_mok environment variable; known: {sorted(REGISTRY)}")
    value = os.environ.get(name, "").strip()
    return value or None


def read(name: str):
    """The parsed value of a registered variable, None when unset: a bool for 0 | 1 flags, an int
    for counts, a dict for ``JAX_MOK_TUNING``, else the text. A value outside the accepted ones
    raises ValueError naming the variable and what it accepts."""
    value = raw(name)
    if value is None:
        return None
    try:
        return REGISTRY[name].parse(value)
    except KeyError:
        raise ValueError(
            f"{name}={value!r} is not accepted; it takes {REGISTRY[name].accepted}") from None


def unknown_variables() -> list[str]:
    """``JAX_MOK_*`` variables set in this process that jax_mok does not read (a typo, or a
    switch that was removed): listed by ``info`` and warned about once."""
    return sorted(k for k in os.environ if k.startswith("JAX_MOK_") and k not in REGISTRY)


_WARNED_UNKNOWN: set[str] = set()


def warn_unknown_variables() -> None:
    new = [name for name in unknown_variables() if name not in _WARNED_UNKNOWN]
    if new:
        _WARNED_UNKNOWN.update(new)
        warnings.warn(f"jax_mok ignores {', '.join(new)}: not a jax_mok setting (misspelled, or "
                      f"removed); settings: {sorted(REGISTRY)} (python -m jax_mok info)",
                      stacklevel=3)


def settings(tuning: Tuning | None = None) -> list[tuple[str, str, str]]:
    """``(setting, value, source)`` for every tuning field and every registered variable, for
    ``python -m jax_mok info``; source is default / env / argument."""
    resolved, sources = resolve_with_sources(tuning)
    rows = []
    for key, source in sources.items():
        section, name = key.split(".")
        rows.append((f"tuning.{key}", repr(getattr(getattr(resolved, section), name)), source))
    for name, var in REGISTRY.items():
        value = raw(name)
        rows.append((name, value if value is not None else f"({var.default})",
                     "env" if value is not None else "default"))
    return rows


__all__ = [
    "REGISTRY",
    "EnvVar",
    "KernelTuning",
    "PeerTuning",
    "Tuning",
    "parse_tuning",
    "pregather_heuristic",
    "read",
    "resolve",
    "resolve_with_sources",
    "settings",
]
