"""The symmetric workspace of the ``"peer"`` expert-parallel transport (docs/peer-transport.md).

What is here runs on any machine: sizing (:class:`WorkspaceSpec`), the configuration fingerprint
that ranks compare at setup, the choice of bootstrap path, and
:func:`peer_transport_available`. :func:`workspace_for` allocates and links the buffers through
the ``_mok_cuda`` extension; it needs CUDA GPUs (the single-process peer-access path and the
two-process IPC path are tested on 2 x H200; fabric handles are compile-checked only).
"""

from __future__ import annotations

import dataclasses
import json
import socket
import threading
import zlib

import jax
import numpy as np

from jax_mok import tuning
from jax_mok.ep import errors
from jax_mok.ep.pack import buffer_rows
from jax_mok.kernels import _ffi

SIGNAL_BYTES = 4096  # flags, tickets, epoch (ffi/cuda/symmetric.h: kSignalBytes)
MAX_EP = 64  # arrival flags in the signal area (ffi/cuda/symmetric.h: kMaxRanks)
ALIGN = 16  # every field of a chunk starts on 16 bytes (vector stores)
AREAS = 4  # staged halves 0/1 (alternating by epoch parity), fused dispatch, fused combine
DEFAULT_LIMIT_BYTES = tuning.PeerTuning().workspace_limit_bytes
PATHS = ("peer_access", "ipc", "fabric")
# The layout constants the CUDA extension reports (workspace_constants()), by name: the sizes
# above must be the ones the kernels use.
EXTENSION_CONSTANTS = {"signal_bytes": SIGNAL_BYTES, "max_ranks": MAX_EP, "areas": AREAS}


def _pad(n: int) -> int:
    return (n + ALIGN - 1) // ALIGN * ALIGN


@dataclasses.dataclass(frozen=True)
class WorkspaceSpec:
    """Sizes of one symmetric workspace (the same on every rank of an expert group).

    Attributes:
      ep_size: ranks of the expert axis, ``1 <= ep_size <= 64``.
      rows: ``R``, rows of one (source, destination) chunk (``T`` per rank when dropless).
      hidden_size: ``H``.
      top_k: ``k``.
      dtype: name of x's dtype (``"bfloat16"`` or ``"float32"``).
    """

    ep_size: int
    rows: int
    hidden_size: int
    top_k: int
    dtype: str

    def __post_init__(self):
        for name in ("ep_size", "rows", "hidden_size", "top_k"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"WorkspaceSpec.{name} must be a positive int, got {value!r}")
        if self.ep_size > MAX_EP:
            raise ValueError(
                f"WorkspaceSpec.ep_size must be <= {MAX_EP} (arrival flags in the signal area), "
                f"got {self.ep_size}"
            )
        if self.dtype not in ("bfloat16", "float32"):
            raise ValueError(
                f"WorkspaceSpec.dtype must be 'bfloat16' or 'float32', got {self.dtype!r}")

    @classmethod
    def for_call(cls, config, tokens_local: int, tokens_global: int, ep_size: int,
                 dtype) -> WorkspaceSpec:
        """The spec of a ``moe`` call: ``R`` as the XLA transport sizes its chunks (dropless:
        ``T`` per rank; capacity ``C``: ``min(T, E_loc * C)``), so no chunk can overflow."""
        rows = buffer_rows(config, tokens_local, tokens_global, ep_size)
        return cls(ep_size, rows, config.hidden_size, config.top_k, np.dtype(dtype).name)

    @property
    def itemsize(self) -> int:
        return 2 if self.dtype == "bfloat16" else 4

    @property
    def dispatch_chunk_bytes(self) -> int:
        """x rows ``[R, H]`` + ids ``[R, k]`` int32 + weights ``[R, k]`` float32, 16 B aligned."""
        return (_pad(self.rows * self.hidden_size * self.itemsize)
                + 2 * _pad(self.rows * self.top_k * 4))

    @property
    def combine_chunk_bytes(self) -> int:
        """Rows of local results ``[R, H]`` in x's dtype."""
        return _pad(self.rows * self.hidden_size * self.itemsize)

    @property
    def chunk_bytes(self) -> int:
        """One receive region: the largest chunk any call on this workspace sends."""
        return max(self.dispatch_chunk_bytes, self.combine_chunk_bytes)

    @property
    def total_bytes(self) -> int:
        """Per rank: signal area + 4 areas x EP sources x chunk (ffi/cuda/symmetric.h: the staged
        calls' two halves, the fused forward's dispatch and combine areas)."""
        return SIGNAL_BYTES + AREAS * self.ep_size * self.chunk_bytes

    def check_fits(self, limit_bytes: int = DEFAULT_LIMIT_BYTES) -> None:
        """Raises ValueError naming the numbers when the workspace exceeds ``limit_bytes``
        (``PeerTuning.workspace_limit_bytes``, 8 GiB by default)."""
        if self.total_bytes > limit_bytes:
            raise ValueError(
                f"the peer transport needs a workspace of {self.total_bytes} bytes per GPU "
                f"(4096 + 4 areas x EP={self.ep_size} x chunk {self.chunk_bytes} B; chunk = "
                f"R={self.rows} rows x (H={self.hidden_size} x {self.itemsize} B + 2 x "
                f"k={self.top_k} x 4 B), dtype {self.dtype}), over the limit of {limit_bytes} "
                "bytes (PeerTuning.workspace_limit_bytes): use fewer tokens per call, a "
                "capacity_factor, or transport='xla'"
            )


# ------------------------------------------------------------------ fingerprint

def fingerprint(spec: WorkspaceSpec, config=None, mesh_shape=None, axis: str | None = None
                ) -> dict:
    """What every rank of a group must agree on, as a JSON-able dict."""
    fp = {"spec": dataclasses.asdict(spec), "total_bytes": spec.total_bytes}
    if config is not None:
        fp["config"] = dataclasses.asdict(config)
    if mesh_shape is not None:
        fp["mesh_shape"] = {str(k): int(v) for k, v in dict(mesh_shape).items()}
    if axis is not None:
        fp["axis"] = axis
    return json.loads(json.dumps(fp, sort_keys=True))


def _flatten(d: dict, prefix: str = "") -> dict:
    out = {}
    for k, v in d.items():
        if isinstance(v, dict):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def compare_fingerprints(mine: dict, theirs: dict, my_rank: int, their_rank: int) -> None:
    """Raises ValueError listing every field where two ranks' fingerprints differ."""
    a, b = _flatten(mine), _flatten(theirs)
    diffs = [f"{key}: rank {my_rank} has {a.get(key)!r}, rank {their_rank} has {b.get(key)!r}"
             for key in sorted(set(a) | set(b)) if a.get(key) != b.get(key)]
    if diffs:
        raise ValueError(
            "jax_mok peer transport: ranks disagree on the MoE call (config or shapes differ "
            "between processes, which would deadlock or corrupt peer memory): "
            + "; ".join(diffs)
        )


def kv_client():
    """``jax.distributed``'s key-value client, or None (not initialised / not offered).

    jax 0.10.2 and 0.11.2 both keep it at ``jax._src.distributed.global_state.client`` with
    ``key_value_set(key, value)`` and ``blocking_key_value_get(key, timeout_in_ms)``; the feature
    is probed, not assumed.
    """
    try:  # imported here: a private module, probed when needed (ImportError: no client)
        from jax._src import distributed
    except ImportError:
        return None
    client = getattr(getattr(distributed, "global_state", None), "client", None)
    if client is None:
        return None
    if not all(hasattr(client, m) for m in ("key_value_set", "blocking_key_value_get")):
        return None
    return client


def exchange_fingerprint(fp: dict, key: str, process_index: int, process_count: int,
                         client=None, timeout_ms: int = 60_000) -> None:
    """Publishes this process's fingerprint under ``key`` and checks every other process's."""
    if process_count <= 1:
        return
    client = client or kv_client()
    if client is None:
        raise RuntimeError(
            f"jax_mok peer transport: {process_count} processes but jax.distributed's key-value "
            "store is not reachable; call jax.distributed.initialize() first"
        )
    client.key_value_set(f"{key}/{process_index}", json.dumps(fp, sort_keys=True))
    for other in range(process_count):
        if other == process_index:
            continue
        theirs = json.loads(client.blocking_key_value_get(f"{key}/{other}", timeout_ms))
        compare_fingerprints(fp, theirs, process_index, other)


# ------------------------------------------------------------------ selection

def _cuda():
    """The CUDA extension with peer memory, or None; its layout constants checked once."""
    module = _ffi.cuda_module()
    if module is None or not hasattr(module, "can_access_peer"):
        return None
    if not _CONSTANTS_CHECKED:
        check_extension_constants(module)
        _CONSTANTS_CHECKED.append(True)
    return module


_CONSTANTS_CHECKED: list[bool] = []


def check_extension_constants(module) -> None:
    """Raises RuntimeError where the extension's ``workspace_constants()`` (where it has it)
    disagree with this module's sizes: a workspace sized here would not be the one the kernels
    address. Keys are matched by name without a leading ``k`` and case (``kSignalBytes`` and
    ``signal_bytes`` are one)."""
    report = getattr(module, "workspace_constants", None)
    if report is None:
        return
    got = {_plain(k): v for k, v in dict(report()).items()}
    known = {_plain(k): (k, v) for k, v in EXTENSION_CONSTANTS.items()}
    shared = sorted(set(got) & set(known))
    if not shared:
        raise RuntimeError(
            f"jax_mok peer transport: the CUDA extension's workspace_constants() {dict(report())} "
            f"name none of {sorted(EXTENSION_CONSTANTS)}")
    wrong = [f"{known[k][0]}: Python {known[k][1]}, extension {got[k]}" for k in shared
             if int(got[k]) != known[k][1]]
    if wrong:
        raise RuntimeError("jax_mok peer transport: the workspace layout differs between "
                           "jax_mok/ep/workspace.py and the CUDA extension: " + "; ".join(wrong))


def _plain(name: str) -> str:
    """``kSignalBytes`` / ``signal_bytes`` / ``SIGNAL_BYTES`` -> ``signalbytes``."""
    if len(name) > 1 and name[0] == "k" and name[1].isupper():
        name = name[1:]
    return name.replace("_", "").lower()


def _groups(mesh, axis: str) -> list[list]:
    """Devices of each expert group, ordered by their rank on ``axis``."""
    devices = np.asarray(mesh.devices)
    moved = np.moveaxis(devices, list(mesh.axis_names).index(axis), -1)
    return [list(row) for row in moved.reshape(-1, moved.shape[-1])]


def bootstrap_path(mesh, axis: str, hosts: int | None = None) -> tuple[str | None, str]:
    """Which bootstrap applies to ``mesh``'s groups along ``axis``, and why (None: none does).

    ``hosts``: how many distinct hosts the processes run on, when known (``workspace_for``
    exchanges host names); ``JAX_MOK_PEER_BOOTSTRAP=ipc|fabric`` forces a multi-process path
    (a debugging aid of the env registry, jax_mok/tuning.py).
    """
    if not isinstance(mesh, jax.sharding.Mesh):
        return None, "an AbstractMesh has no devices to bootstrap; use a concrete Mesh"
    groups = _groups(mesh, axis)
    processes = {d.process_index for g in groups for d in g}
    if len(processes) == 1:
        return "peer_access", "one process drives every device of the group: peer access"
    forced = tuning.read("JAX_MOK_PEER_BOOTSTRAP")
    if forced is not None:
        return forced, f"JAX_MOK_PEER_BOOTSTRAP={forced}"
    if hosts == 1:
        return "ipc", (f"{len(processes)} processes on one host: CUDA IPC handles through "
                       "jax.distributed")
    module = _cuda()
    local = [d for g in groups for d in g if d.process_index == jax.process_index()]
    fabric = (module is not None and hasattr(module, "fabric_supported") and bool(local)
              and all(module.fabric_supported(int(d.local_hardware_id))[0] for d in local))
    if fabric:
        return "fabric", "the driver offers CU_MEM_HANDLE_TYPE_FABRIC handles (NVLink fabric)"
    if hosts is not None:
        return None, f"the group spans {hosts} hosts and the driver offers no fabric handles"
    return "ipc", (f"{len(processes)} processes: CUDA IPC handles through jax.distributed "
                   "(needs every process on one host; opening a handle fails otherwise)")


def _host_count(client, key: str, process_index: int, process_count: int) -> int:
    """Distinct host names among the processes, through the key-value store."""
    client.key_value_set(f"{key}/{process_index}", socket.gethostname())
    names = {client.blocking_key_value_get(f"{key}/{i}", 60_000) for i in range(process_count)}
    return len(names)


def peer_transport_available(mesh, axis: str = "expert") -> tuple[bool, str]:
    """Whether ``transport="peer"`` can run on ``mesh`` along ``axis``, with the reason."""
    module = _cuda()
    if module is None:
        return False, "the CUDA extension jax_mok._mok_cuda (with peer memory) is not built"
    if (device := _ffi.cuda_device_limits()) is not None:
        return False, device
    if not isinstance(mesh, jax.sharding.Mesh):
        return False, ("an AbstractMesh (e.g. the ambient mesh under jit) has no devices; pass a "
                       "concrete jax.sharding.Mesh as mesh=...")
    devices = mesh.devices
    if axis not in mesh.axis_names:
        return False, f"axis {axis!r} is not an axis of the mesh {tuple(mesh.axis_names)}"
    for d in np.asarray(devices).reshape(-1):
        if d.platform not in ("gpu", "cuda"):
            return False, f"device {d} is on platform {d.platform!r}, not a CUDA GPU"
    groups = _groups(mesh, axis)
    if len(groups[0]) > MAX_EP:
        return False, f"the expert axis has {len(groups[0])} devices; at most {MAX_EP}"
    if len(groups[0]) < 2:
        return False, "the expert axis has one device: nothing to exchange"
    me = jax.process_index()
    for group in groups:
        local = [d for d in group if d.process_index == me]
        for a in local:
            for b in local:
                if a is not b and not module.can_access_peer(int(a.local_hardware_id),
                                                             int(b.local_hardware_id)):
                    return False, (f"devices {a} and {b} are not NVLink peers (no peer access "
                                   "or no native peer atomics)")
    if len({d.process_index for g in groups for d in g}) > 1 and kv_client() is None:
        return False, "the group spans processes but jax.distributed is not initialised"
    path, reason = bootstrap_path(mesh, axis)
    if path is None:
        return False, reason
    return True, f"{path}: {reason}"


# ------------------------------------------------------------------ bootstrap (GPU only)

_LOCK = threading.Lock()
_WORKSPACES: dict[tuple, int] = {}
_GENERATION = [0]  # bumped by reset(): fresh ids and key-value keys (keys cannot be overwritten)


def workspace_for(mesh, axis: str, spec: WorkspaceSpec, config=None, *,
                  limit_bytes: int = DEFAULT_LIMIT_BYTES) -> int:
    """The id of a bootstrapped workspace for ``spec`` on ``mesh``'s groups (created once).

    Single process: allocate on every device, enable peer access, link raw pointers. Several
    processes: allocate locally, export an IPC (or fabric) handle, exchange it through
    ``jax.distributed``'s key-value store, open the peers' handles. ``limit_bytes``: see
    :meth:`WorkspaceSpec.check_fits`.
    """
    spec.check_fits(limit_bytes)
    groups = _groups(mesh, axis)
    key = (tuple(int(d.id) for g in groups for d in g), axis, spec)
    with _LOCK:
        if key in _WORKSPACES:
            return _WORKSPACES[key]
        module = _cuda()
        ok, reason = peer_transport_available(mesh, axis)
        if not ok or module is None:
            raise NotImplementedError(f"transport='peer' is not available here: {reason}")
        ws_id = zlib.crc32(repr((key, _GENERATION[0])).encode()) & 0x7FFFFFFF
        while ws_id in _WORKSPACES.values():
            ws_id = (ws_id + 1) & 0x7FFFFFFF
        me, count = jax.process_index(), jax.process_count()
        client = kv_client() if count > 1 else None
        hosts = _host_count(client, f"jax_mok/host/{ws_id}", me, count) if client else 1
        path, why = bootstrap_path(mesh, axis, hosts)
        if path is None:
            raise NotImplementedError(f"transport='peer' is not available here: {why}")
        fp = fingerprint(spec, config, getattr(mesh, "shape", None), axis)
        fp["workspace_id"], fp["bootstrap"] = ws_id, path  # a path disagreement is a mismatch
        exchange_fingerprint(fp, f"jax_mok/fp/{ws_id}", me, count)
        for g, group in enumerate(groups):
            for rank, d in enumerate(group):
                if d.process_index == me:
                    module.workspace_alloc(ws_id, int(d.local_hardware_id), rank, len(group),
                                           spec.total_bytes, path == "fabric")
                    if client is not None:
                        handle = module.workspace_export(ws_id, int(d.local_hardware_id))
                        client.key_value_set(f"jax_mok/ws/{ws_id}/{g}/{rank}", handle.hex())
        for g, group in enumerate(groups):
            for d in group:
                if d.process_index != me:
                    continue
                for peer_rank, p in enumerate(group):
                    if p is d:
                        continue
                    if p.process_index == me:
                        module.workspace_link_local(ws_id, int(d.local_hardware_id), peer_rank,
                                                    int(p.local_hardware_id))
                    else:
                        handle = bytes.fromhex(client.blocking_key_value_get(
                            f"jax_mok/ws/{ws_id}/{g}/{peer_rank}", 60_000))
                        module.workspace_open_peer(ws_id, int(d.local_hardware_id), peer_rank,
                                                   handle)
                module.workspace_finalize(ws_id, int(d.local_hardware_id))
        _WORKSPACES[key] = ws_id
        errors.start_watchdog()  # deferred checks' errors are logged even if no call follows
        return ws_id


def reset() -> None:
    """Frees every workspace of this process (after an error poisoned one, or at teardown).
    Compiled programs that captured an old workspace id fail cleanly afterwards."""
    with _LOCK:
        module = _cuda()
        if module is not None and _WORKSPACES:
            module.workspace_free_all()
        _WORKSPACES.clear()
        _GENERATION[0] += 1


__all__ = [
    "WorkspaceSpec",
    "bootstrap_path",
    "compare_fingerprints",
    "exchange_fingerprint",
    "fingerprint",
    "kv_client",
    "peer_transport_available",
    "reset",
    "workspace_for",
]
