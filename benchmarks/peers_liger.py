"""B6: Liger-Kernel's Triton fused MoE, ``liger_kernel.ops.fused_moe.LigerFusedMoEFunction``.

``LigerFusedMoEFunction.apply(x [T, H], gate_up_proj [E, 2F, H], down_proj [E, H, F],
top_k_index [T, k] int32, top_k_weights [T, k] float) -> y [T, H]`` (gate = the first F rows of
``gate_up_proj``, as jax_mok's first F columns), a ``torch.autograd.Function`` whose backward
returns dx, both weight gradients and the routing-weight gradient (in dy's dtype). Its inputs
must be contiguous: the harness stores each expert weight once more in Liger's layout, outside
the timed call (a model using Liger keeps its weights that way).

Autotuning. Seven of its kernels are ``triton.autotune`` objects in
``liger_kernel.ops.fused_moe_kernels`` (imported by name into ``fused_moe``): the four token-side
GEMMs ``_fused_up_proj_swiglu_kernel``, ``_fused_down_proj_kernel``,
``_moe_bwd_down_proj_kernel``, ``_moe_bwd_dX_expanded_kernel`` (32 configs each: BLOCK_N,
BLOCK_K, num_warps, num_stages), the weight-gradient GEMMs ``_moe_bwd_dW1_kernel``,
``_moe_bwd_dW2_kernel`` (16: BLOCK_M, BLOCK_N, BLOCK_K, num_warps) and the token gather
``_token_gather_weighted_sum_kernel`` (40: BLOCK_H, BLOCK_K, num_warps), keyed by (H, F) (the
gather by (H, k, whether it is the weighted forward sum)) plus the dtype of every tensor
argument, as Triton's ``Autotuner`` builds its key. The search costs minutes per shape.
``--b6-autotune``:
  - ``tuned`` (default): each autotuned kernel is pinned, before the first call, to the config
    Liger's own search chose for this shape, recorded in ``benchmarks/b6_configs.json``: its
    ``configs`` list becomes the recorded winner(s), taken from Liger's own candidates, and its
    ``cache`` maps the recorded keys to them, so no call searches. Where the file has no record
    of the shape (its name, T, H, F, E, k and dtype), of a pass the run asks for, or of a kernel
    or config this Liger has, the shape runs ``full`` instead, with a printed warning saying why
    (also in the record's ``b6_warning``). Until a GPU session has run ``record``, the file holds
    no shape and ``tuned`` is ``full`` everywhere;
  - ``record``: ``full``, and afterwards the winners of every searched shape are merged into
    ``--b6-configs`` (default ``benchmarks/b6_configs.json``) and written to
    ``<out>/b6_configs.json`` too. A record run resumes: the autotune keys the file already holds
    for the shape, from a search with the same liger-kernel, Triton and GPU, go into the kernels'
    ``cache`` before the first call (``b6_resumed`` in the record), so only the keys without a
    winner search (S2's forward search alone takes ~450 s: its fwd+bwd record then searches the
    backward kernels only). A search cut short keeps what it found: while the first call runs,
    the worker rewrites ``<out>/logs/<shape>-<attempt>.b6.json`` (:class:`Checkpoint`) each time
    a kernel's key has its winner; where the worker dies inside the item (killed at
    ``--item-timeout-s``, or crashed), the orchestrator puts those winners into the item's
    record (``b6_partial``) and merges them into both configs files at once, so the next call
    resumes from them. Such a partial record adds kernels, never a pass (``tuned`` still needs
    a finished search of every pass). A run cut from outside leaves the file: ``record`` takes
    it as it takes a ``results.json``;
  - ``full``: Liger's autotune runs during the first call of each shape (the untimed check call,
    whose duration is recorded as ``first_call_s``); give it ``--item-timeout-s`` to match;
  - ``pinned``: ``LIGER_FUSED_MOE_AUTOTUNE=0``, Liger's own switch that pins every kernel to one
    config (BLOCK_N 128, BLOCK_K 64, 8 warps, 2 stages for the GEMMs), no search (1.35-1.6x
    slower than its own choice: not B6 at its best).
The switch is read when liger_kernel is imported, so the worker sets it (``1`` for every mode but
``pinned``) before its import; an explicit ``LIGER_FUSED_MOE_AUTOTUNE`` in the environment wins.

Every B6 record says what ran: ``b6_mode`` (the mode after any fallback), ``b6_autotune`` (a
sentence naming each kernel's config in ``tuned`` mode), ``b6_configs`` (each kernel's configs by
autotune key, read from the autotuners after the first call: the search's winners in ``full`` /
``record``, the pinned ones in ``tuned``), ``b6_searched`` (the kernels that searched in that
call: empty in ``tuned`` mode) and ``triton``.

Recording, on the GPU machine with the liger-kernel wheel in ``.whl/``. A shape's search takes
minutes and one device command at most 10, so one shape per GPU in parallel on an
``nvidia-h200-x8`` (the wheel installed once first: six runs would each install it into
``bench-out/site`` at the same time)::

  python3 -m pip install -q --no-index --no-deps --target /tmp/site .whl/liger_kernel-*.whl
  export PYTHONPATH=/tmp/site${PYTHONPATH:+:$PYTHONPATH}
  for i in 1 2 3 4 5 6; do CUDA_VISIBLE_DEVICES=$((i-1)) python3 -m benchmarks.run \\
      --b6-autotune record --impls B6 --routing balanced --shapes S$i --no-ceilings \\
      --item-timeout-s 500 --budget-s 540 --out $OUT/b6-S$i > $OUT/b6-S$i.log 2>&1 & done; wait

or the same with one or two shapes per command on one GPU. Then, on the CPU machine, merge every
call's ``results.json`` into the committed file and commit it::

  python -m benchmarks.peers_liger record <files>/b6-S*/results.json

(any ``full`` or ``record`` run's ``results.json`` will do: the winners are in its B6 records;
``record`` also merges them itself, into ``--b6-configs`` and ``<out>/b6_configs.json``, but on
the device machine that tree is a copy). The file keeps, per shape key (the shape's name;
``name@T..-H..-F..-E..-k..-dtype`` for a scaled or float32 run), the problem, the passes covered,
the B6 items searched, the liger-kernel / Triton / torch versions, the GPU, commit and date, and
per kernel its autotune key names, candidate count and winners (``key`` and ``config``:
``kwargs`` with the BLOCK sizes, ``num_warps``, ``num_stages``, ``num_ctas``, ``maxnreg``).
It holds what GPU sessions recorded (S1 forward and forward+backward, S6 forward, S2 forward):
no value in it is written by hand. Timing then needs no search:
``python3 -m benchmarks.run --impls B6 ...``.

Where liger_kernel is not importable, :func:`ensure_importable` installs a carried wheel
(``.whl/liger_kernel-*.whl``) into a private folder the way ``tools/gpu_check.sh`` does.
"""

from __future__ import annotations

import dataclasses
import datetime
import glob
import json
import os
import subprocess
import sys
import threading
import types
from collections.abc import Iterable, Sequence

from benchmarks.peers_torch import TorchRunner
from benchmarks.problems import Problem

# mode -> LIGER_FUSED_MOE_AUTOTUNE: every mode but pinned keeps Liger's full candidate lists
# (tuned picks its recorded winners out of them, and falls back to a search)
AUTOTUNE_MODES = {"tuned": "1", "record": "1", "full": "1", "pinned": "0"}
DEFAULT_MODE = "tuned"
SEARCH_MODES = ("full", "record")  # the modes whose first call runs Liger's search
ENV = "LIGER_FUSED_MOE_AUTOTUNE"
CONFIGS_PATH = os.path.join(os.path.dirname(os.path.abspath(__file__)), "b6_configs.json")
CONFIGS_FORMAT = 1
CONFIGS_ABOUT = ("Liger-Kernel's own Triton autotune winners per benchmark shape, for B6 "
                 "(--b6-autotune tuned, the default). Written by --b6-autotune record or "
                 "python -m benchmarks.peers_liger record RESULTS.json...; format in "
                 "benchmarks/peers_liger.py. No shape until a GPU session has run the record mode.")
CONFIG_FIELDS = ("num_warps", "num_stages", "num_ctas", "maxnreg")
CHECKPOINT_INTERVAL_S = 5.0  # how often a searching call's checkpoint looks at the caches
# the statuses of an item that never finished: its checkpoint's ("running") and the
# orchestrator's for a worker killed at --item-timeout-s or crashed
PARTIAL_STATUSES = ("running", "timeout", "crash")
_printed: set[str] = set()  # warnings already printed by this process (one per shape)


def ensure_importable(repo_root: str, target: str) -> str | None:
    """Makes liger_kernel importable: already installed, or installed from ``.whl/`` into
    ``target`` (added to sys.path). Returns the folder to put on PYTHONPATH for the workers, or
    None when nothing was installed (already importable, or no wheel: the workers then record
    why B6 did not run)."""
    import importlib.util

    if importlib.util.find_spec("liger_kernel") is not None:
        return None
    wheels = sorted(glob.glob(os.path.join(repo_root, ".whl", "liger_kernel-*.whl")))
    if not wheels:
        return None
    os.makedirs(target, exist_ok=True)
    cmd = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps",
           "--no-compile", "--target", target, wheels[-1]]
    result = subprocess.run(cmd, capture_output=True, text=True, timeout=120)
    if result.returncode != 0:
        print(f"B6: could not install {wheels[-1]}: {result.stderr[-300:]}", flush=True)
        return None
    sys.path.insert(0, target)
    return target


def _check_mode(autotune: str) -> None:
    if autotune not in AUTOTUNE_MODES:
        raise ValueError(f"b6 autotune must be one of {list(AUTOTUNE_MODES)}, got {autotune!r}")


def unavailable_reason(platform: str, autotune: str) -> str | None:
    """None when B6 can run here, else why not. Sets Liger's autotune switch (module docstring)
    before the first import; an explicit ``LIGER_FUSED_MOE_AUTOTUNE`` in the environment wins."""
    _check_mode(autotune)
    if platform != "gpu":
        return "Liger-Kernel's fused MoE runs Triton kernels on CUDA only"
    try:
        import torch
    except ImportError:
        return "torch is not installed"
    if not torch.cuda.is_available():
        return "torch has no CUDA device"
    os.environ.setdefault(ENV, AUTOTUNE_MODES[autotune])
    try:
        from liger_kernel.ops.fused_moe import LigerFusedMoEFunction  # noqa: F401
    except Exception as error:  # noqa: BLE001 - any import failure means B6 cannot run
        return (f"liger_kernel.ops.fused_moe is not importable ({type(error).__name__}: "
                f"{str(error)[:200]}); carry the wheel: pip download --no-deps -d .whl "
                "liger-kernel")
    return None


def _version(dist: str) -> str | None:
    try:
        from importlib.metadata import version

        return version(dist)
    except Exception:  # noqa: BLE001 - not installed, or metadata missing
        return None


def liger_version() -> str | None:
    return _version("liger-kernel")


def triton_version() -> str | None:
    return _version("triton") or _version("pytorch-triton")


# ---------------------------------------------------------------------------------------------
# Liger's autotuners. Triton's ``Autotuner`` (3.6 on the GPU machine; 3.8 alike) keeps
# ``configs`` (the candidates), ``keys`` (the key argument names), ``cache`` ({key tuple: the
# winning Config}; the key is those arguments' values followed by ``str(dtype)`` of every tensor
# argument) and ``best_config`` (the config of its last launch). ``run`` searches only when it
# has more than one candidate and the key is not in ``cache``; with one candidate it launches
# that one whatever the key. Everything below reads those attributes only (the tests pass fakes).
# ---------------------------------------------------------------------------------------------


def is_autotuner(obj) -> bool:
    return all(hasattr(obj, name) for name in ("configs", "cache", "keys"))


def autotuned_kernels(module) -> dict[str, object]:
    """The autotuned kernels among ``module``'s attributes, by name."""
    found = {}
    for name in sorted(vars(module)):
        obj = getattr(module, name)
        if not isinstance(obj, (type, types.ModuleType)) and is_autotuner(obj):
            found[name] = obj
    return found


def liger_autotuners() -> dict[str, object]:
    """Liger's autotuned fused-MoE kernels (the objects ``LigerFusedMoEFunction`` launches)."""
    from liger_kernel.ops import fused_moe

    return autotuned_kernels(fused_moe)


def config_dict(config) -> dict:
    """A Triton ``Config`` as JSON: ``kwargs`` (the BLOCK sizes) and the launch fields."""
    out = {"kwargs": {k: _jsonable(v) for k, v in dict(config.kwargs).items()}}
    for field in CONFIG_FIELDS:
        if hasattr(config, field):
            out[field] = _jsonable(getattr(config, field))
    return out


def config_text(config: dict) -> str:
    """``BLOCK_N=128 BLOCK_K=64 num_warps=8 num_stages=3`` (num_ctas 1 and maxnreg None left
    out)."""
    parts = [f"{k}={v}" for k, v in config["kwargs"].items()]
    for field in CONFIG_FIELDS:
        v = config.get(field)
        if v is not None and not (field == "num_ctas" and v == 1):
            parts.append(f"{field}={v}")
    return " ".join(parts)


def _jsonable(value):
    if value is None or isinstance(value, (bool, int, float, str)):
        return value
    return str(value)


def _matches(config, recorded: dict) -> bool:
    if dict(config.kwargs) != recorded["kwargs"]:
        return False
    return all(getattr(config, f, None) == recorded[f] for f in CONFIG_FIELDS if f in recorded)


def _candidate(tuner, recorded: dict):
    """The config object among ``tuner``'s own candidates equal to ``recorded``, or None."""
    return next((c for c in tuner.configs if _matches(c, recorded)), None)


def _snapshot(cache: dict) -> dict:
    """A copy of an autotune ``cache`` that another thread may be adding to (the checkpoint
    thread reads while Triton searches): ``dict(cache)`` copies in one C call under the GIL;
    a resize seen mid-copy is retried."""
    while True:
        try:
            return dict(cache)
        except RuntimeError:  # "dictionary changed size during iteration"
            continue


def cache_keys(tuners: dict) -> dict[str, set]:
    """Each kernel's autotune cache keys now (to tell afterwards which kernels searched)."""
    return {name: set(_snapshot(t.cache)) for name, t in tuners.items()}


def searched(tuners: dict, before: dict[str, set], now: dict[str, set] | None = None
             ) -> dict[str, int]:
    """The kernels whose cache gained keys since ``before`` (they searched): how many keys.
    ``now``: the caches' keys already read (:func:`cache_keys`), else read here."""
    grown = {name: len(keys - before.get(name, set()))
             for name, keys in (now if now is not None else cache_keys(tuners)).items()}
    return {name: n for name, n in grown.items() if n}


def capture(tuners: dict) -> dict[str, dict]:
    """What each kernel used, read after a call: its ``cache`` (key -> config; after a search
    the winners), else its last launch's ``best_config`` with key None (one candidate, no
    search); kernels not launched yet are left out."""
    out = {}
    for name, tuner in sorted(tuners.items()):
        winners = [{"key": [_jsonable(v) for v in key], "config": config_dict(cfg)}
                   for key, cfg in _snapshot(tuner.cache).items()]
        if not winners and getattr(tuner, "best_config", None) is not None:
            winners = [{"key": None, "config": config_dict(tuner.best_config)}]
        if winners:
            out[name] = {"key_names": list(tuner.keys), "candidates": len(tuner.configs),
                         "winners": winners}
    return out


def pin_recorded(tuners: dict, kernels: dict) -> str | None:
    """Pins each recorded kernel to its recorded winner(s): ``configs`` becomes Liger's own
    candidate(s) equal to them and ``cache`` maps the recorded keys to them, so that launching
    needs no search (one winner: Triton launches it whatever the key; several, e.g. the gather's
    forward and backward keys: the cache holds each key's). Returns why not, changing nothing,
    when a recorded kernel is not autotuned in this Liger or a recorded config is none of its
    candidates."""
    plan = {}
    for name, record in sorted(kernels.items()):
        tuner = tuners.get(name)
        if tuner is None:
            return f"this liger-kernel has no autotuned kernel {name}"
        chosen, cache = [], {}
        for winner in record["winners"]:
            match = _candidate(tuner, winner["config"])
            if match is None:
                return (f"the recorded config of {name} ({config_text(winner['config'])}) is "
                        f"none of this liger-kernel's {len(tuner.configs)} candidates")
            if all(match is not c for c in chosen):
                chosen.append(match)
            if winner["key"] is not None:
                cache[tuple(winner["key"])] = match
        if len(chosen) > 1 and any(w["key"] is None for w in record["winners"]):
            return f"{name} has several recorded configs but not every one has its key"
        plan[name] = (chosen, cache)
    for name, (chosen, cache) in plan.items():
        tuners[name].configs = chosen
        tuners[name].cache.update(cache)
    return None


def resumable(key: str, problem: dict, gpu: str | None, liger: str | None, triton: str | None,
              path: str = CONFIGS_PATH) -> dict:
    """``record`` mode's resume: the kernels the file at ``path`` holds for shape ``key`` and
    ``problem`` from a search with this ``liger`` (liger-kernel), ``triton`` and ``gpu`` (the
    kernels entry of the file), else none (another GPU or version searches everything)."""
    try:
        entry = load_configs(path).get("shapes", {}).get(key)
    except (OSError, ValueError):
        return {}
    if entry is None or entry["problem"] != problem:
        return {}
    if (entry.get("gpu"), entry.get("liger_kernel"), entry.get("triton")) != (gpu, liger, triton):
        return {}
    return dict(entry["kernels"])


def prefill(tuners: dict, kernels: dict) -> dict[str, list]:
    """Puts each recorded winner with a key into its kernel's autotune ``cache`` (the config
    object among the kernel's own candidates), leaving ``configs`` whole: a recorded key launches
    its winner without a search, any other key searches as usual. Returns the keys put in, by
    kernel; a kernel this Liger lacks, or a winner that is none of its candidates, is skipped."""
    done: dict[str, list] = {}
    for name, record in sorted(kernels.items()):
        tuner = tuners.get(name)
        if tuner is None:
            continue
        for winner in record["winners"]:
            if winner["key"] is None:
                continue
            match = _candidate(tuner, winner["config"])
            if match is not None:
                tuner.cache[tuple(winner["key"])] = match
                done.setdefault(name, []).append(list(winner["key"]))
    return done


# ---------------------------------------------------------------------------------------------
# A searching call's checkpoint: the winners found so far, in a file that outlives the worker
# ---------------------------------------------------------------------------------------------


class Checkpoint:
    """Writes, while a searching first call runs, the winners its kernels have so far.

    Triton's ``Autotuner`` puts a key's winner into ``cache`` once every candidate of that key
    is benchmarked, so a key in ``cache`` is a finished search. ``start`` runs a thread that
    looks at the caches every ``interval_s`` and, when a kernel has a key it had not at the last
    write and that is not one of ``before`` (the keys given before the call), rewrites ``path``
    atomically (a temporary file, then ``os.replace``: a kill leaves the last whole file). The
    file is a results.json object whose one record is ``base`` (the item's record so far, with
    its GPU) plus ``b6_configs`` / ``b6_searched`` as they stand, ``status`` "running" and
    ``b6_partial`` true: what :func:`recorded_entries` takes from a cut search. ``stop`` (before
    the check and the timed calls) ends the thread and writes once more; ``close`` removes the
    file: the item's own record says everything once its worker gets to write it."""

    THREAD_NAME = "b6-checkpoint"

    def __init__(self, path: str, tuners: dict, base: dict, before: dict[str, set],
                 interval_s: float | None = None):
        self.path, self.tuners, self.base, self.before = path, tuners, dict(base), before
        self.interval_s = CHECKPOINT_INTERVAL_S if interval_s is None else interval_s
        self.written: dict[str, set] | None = None  # the caches' keys at the last write
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def write(self) -> bool:
        """Rewrites the file where a kernel searched a key since the last write; True if so."""
        # the keys first, then the capture: the file holds at least the keys remembered as
        # written, so a key is never left out until the next new one
        now = cache_keys(self.tuners)
        grown = searched(self.tuners, self.before, now)
        if not grown or now == self.written:
            return False
        record = {**self.base, "status": "running", "b6_partial": True,
                  "b6_configs": capture(self.tuners), "b6_searched": grown}
        date = datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")
        data = {"meta": {"date": date, "b6_checkpoint": "the winners of a search still running "
                         "when written (benchmarks/peers_liger.py, Checkpoint)"},
                "records": [record]}
        os.makedirs(os.path.dirname(os.path.abspath(self.path)), exist_ok=True)
        tmp = f"{self.path}.tmp{os.getpid()}"
        with open(tmp, "w") as f:
            json.dump(data, f, indent=1)
            f.write("\n")
        os.replace(tmp, self.path)
        self.written = now
        return True

    def _try_write(self) -> None:
        try:
            self.write()
        except Exception as error:  # noqa: BLE001 - a lost checkpoint must not end the item
            say_once(f"B6: checkpoint {self.path} not written: {type(error).__name__}: {error}")

    def _poll(self) -> None:
        while not self._stop.wait(self.interval_s):
            self._try_write()

    def start(self) -> Checkpoint:
        self._thread = threading.Thread(target=self._poll, name=self.THREAD_NAME, daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        """Ends the thread (at most a write's time), then writes what the call found."""
        if self._thread is not None:
            self._stop.set()
            self._thread.join()
            self._thread = None
            self._try_write()

    def close(self) -> None:
        self.stop()
        try:
            os.remove(self.path)
        except FileNotFoundError:
            pass


def read_checkpoint(path: str, key: str) -> dict | None:
    """The partial record of item ``key`` in the checkpoint at ``path``; None where there is
    none (the item searched nothing, its worker finished it, or the file is another item's)."""
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return next((r for r in data.get("records", [])
                 if r.get("key") == key and r.get("b6_partial")), None)


# ---------------------------------------------------------------------------------------------
# benchmarks/b6_configs.json
# ---------------------------------------------------------------------------------------------


def empty_configs() -> dict:
    return {"about": CONFIGS_ABOUT, "format": CONFIGS_FORMAT, "shapes": {}}


def validate(data: dict) -> None:
    """Raises ValueError where ``data`` is not a configs file of this format."""
    if not isinstance(data, dict) or data.get("format") != CONFIGS_FORMAT:
        raise ValueError(f"not a B6 configs file of format {CONFIGS_FORMAT}")
    shapes = data.get("shapes")
    if not isinstance(shapes, dict):
        raise ValueError("'shapes' must be an object")
    for key, entry in shapes.items():
        for field in ("problem", "passes", "kernels"):
            if field not in entry:
                raise ValueError(f"shape {key}: no {field!r}")
        for name, kernel in entry["kernels"].items():
            winners = kernel.get("winners")
            if not winners:
                raise ValueError(f"shape {key}, kernel {name}: no winners")
            for w in winners:
                if "key" not in w or not isinstance(w.get("config", {}).get("kwargs"), dict):
                    raise ValueError(f"shape {key}, kernel {name}: a winner needs key and "
                                     "config.kwargs")


def load_configs(path: str = CONFIGS_PATH) -> dict:
    """The configs file at ``path`` (an empty one where it does not exist)."""
    if not os.path.exists(path):
        return empty_configs()
    with open(path) as f:
        data = json.load(f)
    validate(data)
    return data


def save_configs(data: dict, path: str = CONFIGS_PATH) -> None:
    validate(data)
    os.makedirs(os.path.dirname(os.path.abspath(path)), exist_ok=True)
    tmp = f"{path}.tmp{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=1)
        f.write("\n")
    os.replace(tmp, path)


def problem_of(shape, dtype: str) -> dict:
    """The problem a record is valid for (``shape``: a ``testing.Shape`` or a record)."""
    get = shape.get if isinstance(shape, dict) else lambda k: getattr(shape, k)
    return {"tokens": get("tokens"), "hidden": get("hidden"), "ffn": get("ffn"),
            "experts": get("experts"), "top_k": get("top_k"), "dtype": dtype}


def shape_key(name: str, problem: dict) -> str:
    """The file's key: the shape's name where it is the protocol shape in bfloat16, else the name
    with the problem (a scaled or float32 run never takes a protocol shape's configs)."""
    from jax_mok.testing import SHAPES  # light: no device is touched

    base = SHAPES.get(name)
    if base is not None and problem == problem_of(base, "bfloat16"):
        return name
    p = problem
    return (f"{name}@T{p['tokens']}-H{p['hidden']}-F{p['ffn']}-E{p['experts']}-k{p['top_k']}"
            f"-{p['dtype']}")


def _where(path: str) -> str:
    """``path`` relative to the repository where it lies inside it, else as given."""
    root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
    rel = os.path.relpath(os.path.abspath(path), root)
    return path if rel.startswith("..") else rel


@dataclasses.dataclass
class Plan:
    """What B6's autotune does for one shape: ``mode`` (after any fallback), the recorded
    ``entry`` (tuned), and the ``warning`` that says why a requested ``tuned`` became ``full``."""

    requested: str
    mode: str
    key: str
    path: str
    entry: dict | None = None
    warning: str | None = None

    def fall_back(self, why: str) -> Plan:
        warning = (f"B6 {self.key}: {why}; falling back to --b6-autotune full (Triton's search "
                   "inside the untimed first call: minutes per shape, raise --item-timeout-s). "
                   "Record the configs with --b6-autotune record (benchmarks/peers_liger.py), "
                   "or pass --b6-autotune pinned")
        return dataclasses.replace(self, mode="full", entry=None, warning=warning)


def select_mode(requested: str, key: str, problem: dict, passes: Sequence[str],
                data: dict | None = None, path: str = CONFIGS_PATH) -> Plan:
    """The plan for one shape: ``requested`` as given, except ``tuned`` without a usable record
    (the shape's key, its problem, every pass in ``passes``; a fwdbwd record covers fwd) in
    ``data`` (default: the file at
    ``path``), which falls back to ``full`` with a warning."""
    _check_mode(requested)
    plan = Plan(requested, requested, key, path)
    if requested != "tuned":
        return plan
    if data is None:
        try:
            data = load_configs(path)
        except (OSError, ValueError) as error:
            return plan.fall_back(f"{_where(path)} is unreadable ({type(error).__name__}: "
                                  f"{str(error)[:200]})")
    entry = data.get("shapes", {}).get(key)
    if entry is None:
        return plan.fall_back(f"no recorded Liger configs for this shape in {_where(path)}")
    if entry["problem"] != problem:
        return plan.fall_back(f"the configs in {_where(path)} were recorded for "
                              f"{entry['problem']}, this run has {problem}")
    # A fwd+bwd call runs the forward's kernels on the same autotune keys first, so its record
    # covers the forward pass too (a kernel it lacks makes pin_recorded fall back).
    covered = set(entry["passes"]) | ({"fwd"} if "fwdbwd" in entry["passes"] else set())
    missing = [p for p in passes if p not in covered]
    if missing and not entry["passes"]:
        return plan.fall_back(f"{_where(path)} holds only a cut search's winners for this shape "
                              "(a --b6-autotune record run resumes it)")
    if missing:
        return plan.fall_back(f"{_where(path)} has its configs for the {entry['passes']} "
                              f"pass(es) only, not {missing}")
    if not entry["kernels"]:
        return plan.fall_back(f"{_where(path)} records no kernel for this shape")
    return dataclasses.replace(plan, entry=entry)


def autotune_setting(plan: Plan | None = None) -> str:
    """What Liger's autotune does in this process, for the record (``b6_autotune``); in tuned
    mode it names each kernel's pinned config."""
    value = os.environ.get(ENV, "1")
    if value.lower() in ("0", "false", "no"):
        text = f"{ENV}={value}: one pinned config per kernel, no search"
    else:
        text = f"{ENV}={value}: Triton autotune inside the first (untimed) call of each shape"
    if plan is None:
        return text
    if plan.mode == "tuned":
        e = plan.entry
        kernels = []
        for name, kernel in sorted(e["kernels"].items()):
            names = kernel.get("key_names", [])
            winners = kernel["winners"]
            for w in winners:
                where = ""
                if len(winners) > 1 and w["key"] is not None:
                    named = zip(names, w["key"][:len(names)], strict=False)  # dtypes follow
                    where = " [" + " ".join(f"{n}={v}" for n, v in named) + "]"
                kernels.append(f"{name}{where} {config_text(w['config'])}")
        return (f"tuned: each autotuned kernel pinned before the first call to Liger's own "
                f"search winner for {plan.key} from {_where(plan.path)} (recorded with "
                f"liger-kernel {e.get('liger_kernel')}, triton {e.get('triton')} on "
                f"{e.get('gpu')}), no search: " + "; ".join(kernels))
    if plan.warning is not None:
        return f"{plan.mode} (tuned asked for; {plan.warning}): {text}"
    if plan.mode == "record":
        return f"record: {text}; the winners go to {_where(plan.path)}"
    return f"{plan.mode}: {text}"


def say_once(text: str) -> None:
    """Prints ``text`` once per process (a worker runs one shape's B6 items)."""
    if text not in _printed:
        _printed.add(text)
        print(text, flush=True)


# ---------------------------------------------------------------------------------------------
# Recording: from the B6 records of full / record runs into the configs file
# ---------------------------------------------------------------------------------------------


def recorded_entries(records: Iterable[dict], date: str | None = None) -> dict[str, dict]:
    """The file's entries from a run's records: every B6 record of a searching mode that was
    timed (its check passed) contributes the winners its autotuners held after the first call
    (a kernel's winners by key; later records win; the keys a resumed record was given from the
    file, ``b6_resumed``, are not its own), and its pass. A partial record (``b6_partial``: a
    :class:`Checkpoint` of an item that never finished) contributes its winners but not its
    pass: its search may have left kernels or keys of the pass unsearched."""
    entries: dict[str, dict] = {}
    for r in records:
        partial = bool(r.get("b6_partial")) and r.get("status") in PARTIAL_STATUSES
        if (r.get("impl") != "B6" or not (r.get("status") == "ok" or partial)
                or r.get("b6_mode") not in SEARCH_MODES or not r.get("b6_configs")):
            continue
        problem = problem_of(r, r["dtype"])
        key = shape_key(r["shape"], problem)
        entry = entries.setdefault(key, {
            "problem": problem, "passes": [], "items": [],
            "liger_kernel": r.get("liger_kernel"), "triton": r.get("triton"),
            "torch": r.get("torch"), "gpu": r.get("gpu_name"),
            "git_commit": r.get("git_commit"), "date": date, "kernels": {},
        })
        if not partial and r["pass"] not in entry["passes"]:
            entry["passes"].append(r["pass"])
        entry["items"].append(r["key"])
        resumed = r.get("b6_resumed") or {}
        for name, kernel in r["b6_configs"].items():
            given = resumed.get(name, [])
            searched_winners = [w for w in kernel["winners"]
                                if w["key"] is not None and w["key"] not in given]
            if not searched_winners:
                continue  # one candidate, no search: nothing Liger chose
            into = entry["kernels"].setdefault(
                name, {"key_names": kernel["key_names"], "candidates": kernel["candidates"],
                       "winners": []})
            into["candidates"] = max(into["candidates"], kernel["candidates"])
            for w in searched_winners:
                into["winners"] = [o for o in into["winners"] if o["key"] != w["key"]] + [w]
    for entry in entries.values():
        entry["passes"].sort()
    return {k: e for k, e in entries.items() if e["kernels"]}


def _winner_key(winner: dict) -> tuple | None:
    return None if winner["key"] is None else tuple(winner["key"])


_SAME_RUN_FIELDS = ("problem", "liger_kernel", "triton", "gpu")


def merge_configs(data: dict, entries: dict[str, dict]) -> dict:
    """``data`` with ``entries`` in: an entry of the same problem, versions and GPU as the one
    there gains its kernels and passes (new winners replace those of the same key); any other
    replaces it."""
    shapes = dict(data.get("shapes", {}))
    for key, new in entries.items():
        old = shapes.get(key)
        if old is None or any(old.get(f) != new.get(f) for f in _SAME_RUN_FIELDS):
            shapes[key] = new
            continue
        merged = {**old, **{k: v for k, v in new.items() if k not in ("kernels", "passes",
                                                                        "items")}}
        merged["passes"] = sorted(set(old["passes"]) | set(new["passes"]))
        merged["items"] = list(dict.fromkeys([*old.get("items", []), *new["items"]]))
        kernels = {n: dict(k) for n, k in old["kernels"].items()}
        for name, kernel in new["kernels"].items():
            if name not in kernels:
                kernels[name] = kernel
                continue
            keys = {_winner_key(w) for w in kernel["winners"]}
            kernels[name] = {**kernel, "winners": [
                w for w in kernels[name]["winners"] if _winner_key(w) not in keys
            ] + kernel["winners"]}
        merged["kernels"] = kernels
        shapes[key] = merged
    return {**empty_configs(), **{k: v for k, v in data.items() if k != "shapes"},
            "shapes": dict(sorted(shapes.items()))}


def record_results(results: Iterable[dict], path: str = CONFIGS_PATH,
                   also: Sequence[str] = ()) -> list[str]:
    """Merges the winners in ``results`` (results.json objects) into the file at ``path``
    (and writes the merged file to each of ``also``). Returns the shape keys recorded."""
    entries: dict[str, dict] = {}
    for result in results:
        date = result.get("meta", {}).get("date")
        found = recorded_entries(result.get("records", []), date)
        entries = merge_configs({"shapes": entries}, found)["shapes"] if entries else found
    if not entries:
        return []
    data = merge_configs(load_configs(path), entries)
    for target in (path, *also):
        save_configs(data, target)
    return sorted(entries)


def main(argv: list[str] | None = None) -> int:
    """``python -m benchmarks.peers_liger record RESULTS.json... [--configs PATH]`` (a
    checkpoint, ``<out>/logs/*.b6.json``, is read like a results.json)."""
    import argparse

    p = argparse.ArgumentParser(prog="python -m benchmarks.peers_liger",
                                description="Record Liger's autotune winners for B6 from the "
                                            "results.json of --b6-autotune full/record runs.")
    sub = p.add_subparsers(dest="command", required=True)
    rec = sub.add_parser("record", help="merge the B6 winners of results.json files")
    rec.add_argument("results", nargs="+",
                     help="results.json files, or the checkpoints <out>/logs/*.b6.json of "
                          "searches cut short")
    rec.add_argument("--configs", default=CONFIGS_PATH, help="the file to merge into")
    args = p.parse_args(argv)
    results = []
    for path in args.results:
        with open(path) as f:
            results.append(json.load(f))
    keys = record_results(results, args.configs)
    if not keys:
        print("no B6 record of a full/record run with a passed check or a checkpoint in "
              f"{', '.join(args.results)}: nothing recorded", file=sys.stderr)
        return 1
    print(f"recorded Liger's configs for {', '.join(keys)} in {args.configs}")
    return 0


class LigerRunner(TorchRunner):
    """B6 on one Problem, with :class:`TorchRunner`'s sets, timing step and probe slicing.

    ``fn(x, ids, tw, gate_up_proj, down_proj)`` defaults to ``LigerFusedMoEFunction.apply`` with
    its argument order; tests pass a stand-in with the same layout contract. Weight gradients
    come back in jax_mok's layout as transposed views (no copy)."""

    def __init__(self, problem: Problem, passname: str, fn=None):
        import torch

        if fn is None:
            from liger_kernel.ops.fused_moe import LigerFusedMoEFunction

            def fn(x, ids, tw, gate_up_proj, down_proj):
                return LigerFusedMoEFunction.apply(x, gate_up_proj, down_proj, ids, tw)

        super().__init__(problem, passname, fn)
        layouts: dict[int, tuple] = {}  # one Liger copy per distinct weight array
        sets = []
        for s, (x, _, tw, gu, dn, dy) in zip(problem.sets, self.sets, strict=True):
            key = id(s.w_gate_up)
            if key not in layouts:
                layouts[key] = (gu.transpose(1, 2).contiguous(), dn.transpose(1, 2).contiguous())
            ids = torch.from_dlpack(s.ids).to(torch.int32)
            sets.append((x, ids, tw, *layouts[key], dy))
        self.sets = sets

    def run(self, i: int, dy=None):
        """:meth:`TorchRunner.run` on Liger's sets, with the weight gradients returned as
        ``[E, H, 2F]`` / ``[E, F, H]`` views of Liger's ``[E, 2F, H]`` / ``[E, H, F]``."""
        out = super().run(i, dy)
        if self.passname == "fwd":
            return out
        y, (dx, dtw, dgu, ddn) = out
        return y, (dx, dtw, dgu.transpose(1, 2), ddn.transpose(1, 2))


if __name__ == "__main__":
    sys.exit(main())
