"""One-time warnings: the library says once per process why it chose something the caller did
not ask for (a fallback to the reference, a default resolved differently on a mesh), so that a
training loop calling the layer thousands of times is not flooded."""

from __future__ import annotations

import warnings

# Keys already warned about; tests reset it (monkeypatch) to see a warning again.
_warned: set[object] = set()


def warn_once(key: object, message: str, *, stacklevel: int = 2) -> None:
    """``warnings.warn(message)`` the first time ``key`` is seen; ``stacklevel`` counts from the
    caller of this function, as ``warnings.warn``'s does from its own caller."""
    if key in _warned:
        return
    _warned.add(key)
    warnings.warn(message, stacklevel=stacklevel + 1)
