"""Errors of the peer transport that no call reported: the deferred check's side.

With ``PeerTuning(check="deferred")`` a peer call does not wait for its kernels, so an exchange
that fails on the device (a rank that never ran the matching call, timed out after
``timeout_ms``) is known only later: the kernel writes the first error of its workspace into a
word of pinned host memory (docs/peer-transport.md, "Bounded waits and errors"). Such an error
is never lost; it reaches the user three ways, none of which synchronizes with the GPU:

- the next peer call of this process, on any workspace, fails with its message;
- :func:`peer_errors` lists the errors, :func:`check_peer` raises them, at any time;
- a watchdog thread, started with the first workspace, logs each new error once, at once, on
  the ``jax_mok`` logger (so a program that makes no further peer call still says what went
  wrong while it runs).

With the default ``check="sync"`` every peer call reports its own error when it returns; these
functions then find nothing that was not raised already.
"""

from __future__ import annotations

import logging
import threading

from jax_mok.kernels import _ffi

_LOG = logging.getLogger("jax_mok")
# The watchdog's period: reading the words takes microseconds, and a timed-out exchange has
# already waited timeout_ms (10 s by default), so half a second adds little to the report.
POLL_SECONDS = 0.5


def peer_errors() -> list[str]:
    """The errors of this process's peer workspaces (one message per workspace and device whose
    error word a kernel set, or that a failed call poisoned), oldest workspace first; ``[]``
    without the CUDA extension or without workspaces. Reads host memory only: it never waits
    for the GPU. A workspace with an error stays unusable until
    :func:`jax_mok.ep.workspace.reset`."""
    module = _ffi.cuda_module()
    if module is None or not hasattr(module, "peer_errors"):
        return []
    return [str(m) for m in module.peer_errors()]


def check_peer() -> None:
    """Raises ``RuntimeError`` with every message of :func:`peer_errors`, if any.

    Call it where a program wants to know that its deferred peer calls went well without a
    synchronization of its own, e.g. after each training step or before a checkpoint."""
    errors = peer_errors()
    if errors:
        raise RuntimeError("jax_mok peer transport: " + str(len(errors)) + " error(s):\n  "
                           + "\n  ".join(errors)
                           + "\n(jax_mok.ep.workspace.reset() frees the workspaces)")


class _Watchdog:
    """One daemon thread that polls :func:`peer_errors` and logs each new message once."""

    def __init__(self):
        self._lock = threading.Lock()
        self._thread: threading.Thread | None = None
        self._stop = threading.Event()
        self._seen: set[str] = set()

    def start(self) -> None:
        with self._lock:
            if self._thread is not None and self._thread.is_alive():
                return
            self._stop.clear()
            self._thread = threading.Thread(target=self._run, name="jax_mok-peer-watchdog",
                                            daemon=True)
            self._thread.start()

    def stop(self) -> None:
        with self._lock:
            thread, self._thread = self._thread, None
        if thread is not None:
            self._stop.set()
            thread.join()

    def running(self) -> bool:
        with self._lock:
            return self._thread is not None and self._thread.is_alive()

    def poll(self) -> list[str]:
        """Logs and returns the messages not seen before (the thread's body, callable alone)."""
        new = [m for m in peer_errors() if m not in self._seen]
        for message in new:
            self._seen.add(message)
            _LOG.error("%s", message)
        return new

    def _run(self) -> None:
        while not self._stop.wait(POLL_SECONDS):
            try:
                self.poll()
            except Exception as exc:  # a watchdog that dies silently would hide the next error
                _LOG.error("jax_mok peer watchdog stopped: %r", exc)
                return


WATCHDOG = _Watchdog()


def start_watchdog() -> None:
    """Starts the watchdog (idempotent); :mod:`jax_mok.ep.workspace` calls it for each new
    workspace."""
    WATCHDOG.start()


__all__ = ["POLL_SECONDS", "WATCHDOG", "check_peer", "peer_errors", "start_watchdog"]
