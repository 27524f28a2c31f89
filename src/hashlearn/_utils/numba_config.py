"""Make numba's on-disk cache optional: hashlearn imports even where nothing is writable.

hashlearn's kernels are compiled with ``@njit(cache=True)``. numba looks for a writable cache
directory when a decorated function is *defined*, i.e. at import, trying in turn
``NUMBA_CACHE_DIR``, the ``__pycache__`` next to the source file and the user-wide cache
(``$XDG_CACHE_HOME/numba`` or ``~/.cache/numba``), and raises ``RuntimeError`` when none is
writable: a user without a home directory running a read-only installation could not import
hashlearn at all. This module, imported first by ``hashlearn/__init__.py``, checks those
locations the same way and, only when none of them can be written, points numba's cache at a
private directory of the system's temporary directory (owned by the user, mode 0700, not a
link; else a fresh one for this process). Compiled kernels then live there; nothing else
changes. :data:`CACHE_FALLBACK` records the directory chosen, or None.
"""

from __future__ import annotations

import os
import stat
import tempfile
from pathlib import Path

__all__ = ["CACHE_FALLBACK", "ensure_numba_cache"]

CACHE_FALLBACK: str | None = None
_PACKAGE = Path(__file__).resolve().parent


def _writable_dir(path: Path) -> bool:
    """Whether ``path`` is, or could be created as, a directory this process can write to."""
    probe = path
    while not os.path.lexists(probe):
        if probe.parent == probe:
            return False
        probe = probe.parent
    if not probe.is_dir():
        return False
    if probe != path:  # numba would create the rest: the ancestor must take new entries
        return os.access(probe, os.W_OK | os.X_OK)
    try:  # os.access misses read-only mounts: try a file
        with tempfile.TemporaryFile(dir=path):
            pass
    except OSError:
        return False
    return True


def _in_tree_writable() -> bool:
    """Whether every package directory of hashlearn can hold its ``__pycache__``."""
    for directory in [_PACKAGE, *(p for p in _PACKAGE.rglob("*") if p.is_dir())]:
        if directory.name == "__pycache__" or not any(directory.glob("*.py")):
            continue
        if not _writable_dir(directory / "__pycache__"):
            return False
    return True


def _user_wide_dir() -> Path | None:
    base = os.environ.get("XDG_CACHE_HOME") or os.path.expanduser("~/.cache")
    path = Path(base) / "numba"
    return path if path.is_absolute() else None  # "~" unresolvable: no home directory


def _private_temp_dir() -> str:
    """``$TMPDIR/hashlearn-numba-<uid>``, if it is ours alone, else a new private one."""
    uid = os.getuid() if hasattr(os, "getuid") else None
    if uid is not None:
        path = Path(tempfile.gettempdir()) / f"hashlearn-numba-{uid}"
        try:
            path.mkdir(mode=0o700, exist_ok=True)
            info = os.lstat(path)
            if (
                stat.S_ISDIR(info.st_mode)
                and info.st_uid == uid
                and not info.st_mode & 0o077
                and _writable_dir(path)
            ):
                return str(path)
        except OSError:
            pass
    # someone else's, a link or unusable: compiled code is never loaded from a directory
    # another user could have written; a fresh private directory costs only recompilation
    return tempfile.mkdtemp(prefix="hashlearn-numba-")


def ensure_numba_cache() -> str | None:
    """Point numba's cache at a private temporary directory when no location it would try
    is writable; returns that directory, or None when numba's own choice works."""
    global CACHE_FALLBACK
    configured = os.environ.get("NUMBA_CACHE_DIR")
    if configured and _writable_dir(Path(configured)):
        return None
    if _in_tree_writable():
        return None
    user_wide = _user_wide_dir()
    if user_wide is not None and _writable_dir(user_wide):
        return None
    try:
        fallback = _private_temp_dir()
    except OSError:  # not even the temporary directory: leave numba to report it
        return None
    os.environ["NUMBA_CACHE_DIR"] = fallback
    try:
        from numba.core import config
    except ImportError:  # pragma: no cover - numba is a dependency
        return None
    config.CACHE_DIR = fallback  # type: ignore[attr-defined]  # read when each cached function is defined
    CACHE_FALLBACK = fallback
    return fallback


ensure_numba_cache()
