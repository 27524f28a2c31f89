"""Saving and loading models and indexes without pickle.

A saved object is a directory::

    meta.json          format name and version, class, parameters, JSON state, and for
                       every array its file, shape, dtype and sha256
    <name>.g<N>.npy    one .npy file per array (read with allow_pickle=False, mmap-able)

Loading never executes code: the class named in ``meta.json`` is looked up in a registry of
hashlearn's own persistable classes, never imported by a name the file gives. :func:`load`
reads every save: an object made of saved components (``Searcher``, ``EmbeddingIndex``,
``ShardedIndex``; :func:`write_composite`) goes to its class's own ``load``, found in a fixed
table of ``"module:Class"`` strings (:func:`register_composite`) imported on first use.

Crash safety. A new directory is written as a temporary sibling and renamed into place.
Over an existing save, array files of a new *generation* ``N`` are written and fsynced
first, then ``meta.json`` is replaced atomically (``os.replace``), and only then are the
previous generation's files deleted. A process killed at any point leaves either the old or
the new ``meta.json``, each with all of its arrays intact. (Renaming a whole directory over an
existing one is not atomic on POSIX, hence the two-step scheme.)

Appending rows (:func:`append_rows`, used by :meth:`hashlearn.index.FlatIndex.open`). Rows are
appended *in place* to the end of an array's ``.npy`` file, past the bytes ``meta.json``
describes, fsynced, and only then is ``meta.json`` replaced with the longer shape and one more
checksum (one per appended block: ``appended: [{"rows", "sha256"}]``; the original
``sha256`` keeps covering the bytes of the original save). The ``.npy`` header keeps the
original shape; the shape in ``meta.json`` is authoritative. A crash before the replace
leaves trailing bytes the old ``meta.json`` does not cover, so the old index still loads and
verifies; the next append truncates them first. An append costs O(new rows), never a copy.

Hostile or damaged files. :func:`load` verifies every sha256 by default (``verify=False`` is
the explicit fast path) and checks the structure either way: ``meta.json``'s fields and types
(``format_version`` a supported positive int, array file names of the committed generation,
canonical plain dtypes), every ``.npy`` header against it (dtype, shape, appended row counts,
file size), then the class's own invariants in ``_from_state`` (:func:`require_array` and
:func:`require_state` are the helpers; hasher state goes through
:func:`estimator_from_state`). Any failure is a ``ValueError``. Files are opened without
following symbolic links and created exclusively (``O_CREAT | O_EXCL | O_NOFOLLOW``); a save
directory holding a link is refused, so nothing is ever written through a link. A save
deletes only files hashlearn wrote: those the previous ``meta.json`` named (or recorded as
superseded), array files of generations never committed, and its own temporaries, including
the ``.NAME.tmp-PID@HOST-XXXXXXXX`` directories of interrupted first saves (of any path in
the same directory, removed at the next save or load there) whose process is gone.
Writers of one directory are serialised by an advisory lock (``flock``).
"""

from __future__ import annotations

import contextlib
import copy
import errno
import hashlib
import importlib
import inspect
import json
import numbers
import os
import re
import secrets
import shutil
import socket
import stat
import time
import tokenize
import uuid
import warnings
from collections.abc import Iterable, Iterator, Mapping
from pathlib import Path
from typing import Any, Literal, TypeGuard

import numpy as np

from hashlearn._utils.validation import DEPRECATED

__all__ = [
    "FORMAT_VERSION",
    "atomic_path",
    "SUPPORTED_VERSIONS",
    "Persistable",
    "save",
    "load",
    "persistable",
    "register_composite",
    "write_dir",
    "write_composite",
    "read_dir",
    "append_rows",
    "require_array",
    "require_state",
    "estimator_state",
    "estimator_from_state",
    "renamed_params",
    "check_params",
    "check_fitted_items",
    "check_estimator_state",
]

FORMAT_NAME = "hashlearn"
FORMAT_VERSION = 1
#: the format versions :func:`load` reads (a positive int; anything else is refused)
SUPPORTED_VERSIONS = (1,)
_META = "meta.json"
_REGISTRY: dict[str, Any] = {}  # class name -> class (its _get_state/_from_state)
#: class name -> "module:Class" of the objects saved as components plus their own
#: ``meta.json`` (:func:`write_composite`), loaded by their own ``load`` classmethod. Strings,
#: resolved when such a save is loaded: ``io`` imports none of them (no import cycle).
_COMPOSITES: dict[str, str] = {
    "Searcher": "hashlearn.search:Searcher",
    "EmbeddingIndex": "hashlearn.embeddings:EmbeddingIndex",
    "ShardedIndex": "hashlearn.distributed:ShardedIndex",
}


def persistable(cls: type) -> type:
    """Class decorator: make ``cls`` loadable by :func:`load` under its class name.

    The class implements ``_get_state() -> (params, state, arrays)`` and the classmethod
    ``_from_state(params, state, arrays)``.
    """
    _REGISTRY[cls.__name__] = cls
    return cls


def register_composite(class_name: str, target: str) -> None:
    """Make :func:`load` hand a save of class ``class_name`` to ``target``'s ``load``.

    ``target`` is ``"module:Class"``, imported only when such a save is loaded; the class's
    ``load(path, *, mmap=..., verify=..., **kwargs)`` classmethod reads its own components.
    For objects saved with :func:`write_composite` (e.g. ``Searcher``, ``EmbeddingIndex``).
    """
    module, sep, attr = target.partition(":")
    if not (sep and module and attr.isidentifier()):
        raise ValueError(f"target must be 'module:Class', got {target!r}")
    _COMPOSITES[class_name] = target


def _composite_class(class_name: str) -> Any:
    module, _, attr = _COMPOSITES[class_name].partition(":")
    return getattr(importlib.import_module(module), attr)


class Persistable:
    """Mixin giving ``save(path)`` and ``Class.load(path, mmap=..., verify=...)``."""

    def save(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path`` atomically (no pickle; see :mod:`hashlearn.io`)."""
        save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False, verify: bool = True):
        """Load what :meth:`save` wrote; ``mmap=True`` maps the arrays read-only.

        Every array's sha256 is verified by default; ``verify=False`` is the explicit fast
        path that trusts the bytes on disk (the structure is checked either way).
        """
        found = _read_meta(Path(path))["class"]
        if found in _COMPOSITES and not issubclass(_composite_class(found), cls):
            raise TypeError(f"{path} holds a {found}, not a {cls.__name__}.")
        obj = load(path, mmap=mmap, verify=verify)
        if not isinstance(obj, cls):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a {cls.__name__}.")
        return obj


def save(obj: Any, path: str | os.PathLike) -> None:
    """Save a hashlearn model or index to the directory ``path`` (atomically)."""
    cls_name = type(obj).__name__
    if cls_name in _COMPOSITES and _composite_class(cls_name) is type(obj):
        obj.save(path)  # a composite writes its own components (write_composite)
        return
    cls = _REGISTRY.get(cls_name)
    if cls is not type(obj):
        raise TypeError(f"{cls_name} is not a persistable hashlearn class.")
    params, state, arrays = obj._get_state()
    write_dir(path, cls_name, params, state, arrays)


def load(
    path: str | os.PathLike, *, mmap: bool | str = False, verify: bool = True, **kwargs: Any
) -> Any:
    """Load anything hashlearn saved: a model, an index, or a composite (``Searcher``,
    ``EmbeddingIndex``, ``ShardedIndex``; see :func:`register_composite`), whose own
    ``load`` classmethod then reads its components. ``kwargs`` go to that ``load``: a
    ``ShardedIndex`` needs ``client=`` (a ``dask.distributed.Client``).

    ``mmap=True`` maps the arrays read-only instead of reading them (``mmap="direct"``: a
    composite's float vectors are then read row by row, :mod:`hashlearn.rerank.rowfile`,
    its other arrays mapped); ``verify`` (the
    default) checks every array's sha256 (reads each file once); ``verify=False`` is the
    explicit fast path that trusts the bytes on disk.

    Every structural check (``meta.json`` types, parameters the class takes, ``.npy``
    headers, sizes, the class's own invariants in ``_from_state``) runs either way, so a
    damaged save raises ``ValueError``. A load that races with another process's save of the
    same path returns the old or the new state: when the files it read were superseded
    meanwhile, it reads again. Temporaries of interrupted saves beside ``path`` whose process
    is gone are removed first (see :func:`write_dir`).
    """
    path = Path(path)
    check_mmap(mmap)
    _remove_stale_temp_dirs(path)
    head = _read_meta(path)
    if head["class"] in _COMPOSITES:
        cls = _composite_class(head["class"])
        check_params(cls, head["params"], path)
        return _load_composite(cls, path, dict(kwargs, mmap=mmap, verify=verify))
    if kwargs:
        raise TypeError(
            f"load() got unexpected keyword arguments {sorted(kwargs)}: {path} holds a "
            f"{head['class']}, which takes only mmap and verify."
        )
    for attempt in range(_LOAD_RETRIES):
        seen: list[dict[str, Any]] = []
        try:
            meta, arrays = _read_dir(path, mmap=bool(mmap), verify=verify, seen=seen)
            break
        except (ValueError, FileNotFoundError):
            if attempt + 1 < _LOAD_RETRIES and seen and _generation_moved(path, seen[0]):
                continue
            raise
    cls = _REGISTRY.get(meta["class"])
    if cls is None:
        raise ValueError(
            f"{path}: unknown class {meta['class']!r} in {_META}; known: "
            f"{sorted({*_REGISTRY, *_COMPOSITES})}."
        )
    check_params(cls, meta["params"], path)
    try:
        return cls._from_state(meta["params"], meta["state"], arrays)
    except (KeyError, TypeError, ValueError, IndexError, AttributeError) as exc:
        raise ValueError(f"{path}: the saved {meta['class']} is inconsistent: {exc}") from None


def _load_composite(cls: Any, path: Path, options: dict[str, Any]) -> Any:
    """``cls.load(path, **options)``; ``verify`` is dropped where that ``load`` has no such
    argument, and a missing required one (a ``ShardedIndex``'s ``client``) is named."""
    parameters = inspect.signature(cls.load).parameters
    if not any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
        if "verify" not in parameters and options["verify"] is True:
            del options["verify"]  # a load without the option verifies anyway
    missing = [
        name
        for name, p in parameters.items()
        if name != "path"
        and p.default is inspect.Parameter.empty
        and p.kind not in (inspect.Parameter.VAR_POSITIONAL, inspect.Parameter.VAR_KEYWORD)
        and name not in options
    ]
    if missing:
        needed = ", ".join(f"{name}=..." for name in missing)
        raise TypeError(
            f"{path} holds a {cls.__name__}: load it with hashlearn.load(path, {needed})."
        )
    if "path" in parameters:
        return cls.load(path=path, **options)
    return cls.load(path, **options)


def _constructor_params(cls: type) -> set[str] | None:
    """The parameter names ``cls(...)`` takes, plus the old names of renamed ones; ``None``
    when it takes any keyword."""
    if hasattr(cls, "_get_param_names"):
        names = set(cls._get_param_names())
    else:
        parameters = inspect.signature(cls).parameters
        if any(p.kind is inspect.Parameter.VAR_KEYWORD for p in parameters.values()):
            return None
        names = {n for n, p in parameters.items() if p.kind is not p.VAR_POSITIONAL}
    return names | set(getattr(cls, "_renamed_params", {}))


def check_params(cls: type, params: Mapping[str, Any], path: str | os.PathLike = "") -> None:
    """Refuse saved ``params`` that ``cls``'s constructor does not take (old names of renamed
    parameters, see :func:`renamed_params`, are accepted): a ``ValueError`` naming them."""
    allowed = _constructor_params(cls)
    if allowed is None:
        return
    unknown = sorted(set(params) - allowed)
    if unknown:
        where = f"{path}: " if str(path) else ""
        raise ValueError(
            f"{where}the saved {cls.__name__} has unknown parameters {unknown} in {_META}; "
            f"{cls.__name__} takes {sorted(allowed)}."
        )


_LOAD_RETRIES = 5


def _generation_moved(path: Path, meta: Mapping[str, Any]) -> bool:
    """Whether ``path``'s ``meta.json`` changed since ``meta`` was read from it."""
    try:
        current = _read_meta(path)
    except (ValueError, OSError):
        return False
    return current != meta


# ------------------------------------------------------------------------------------------
# Helpers for ``_from_state``: every check failure is a ValueError naming what is wrong.


def require_array(
    arrays: Mapping[str, np.ndarray],
    name: str,
    dtype: Any,
    ndim: int | None = None,
    shape: tuple[int | None, ...] | None = None,
    *,
    low: int | None = None,
    high: int | None = None,
) -> np.ndarray:
    """The saved array ``arrays[name]``, checked, for a class's ``_from_state``.

    ``dtype`` must match exactly (``np.dtype(dtype) == arr.dtype``: no cast happens),
    ``ndim`` the number of dimensions, ``shape`` the shape (``None`` entries match any
    length; giving ``shape`` implies its ``ndim``). For integer arrays ``low`` / ``high``
    bound every value (``low <= v < high``, one O(n) pass). A missing array or any mismatch
    raises ``ValueError`` naming the array, which :func:`load` reports as an inconsistent
    save. Returns the array unchanged (a memory map stays one).
    """
    if name not in arrays:
        raise ValueError(f"array {name!r} is missing; found {sorted(arrays)}")
    arr = arrays[name]
    if not isinstance(arr, np.ndarray):
        raise ValueError(f"array {name!r} is a {type(arr).__name__}, not an array")
    expected = np.dtype(dtype)
    if arr.dtype != expected:
        raise ValueError(f"array {name!r} has dtype {arr.dtype}, expected {expected}")
    if shape is not None:
        ndim = len(shape)
    if ndim is not None and arr.ndim != ndim:
        raise ValueError(f"array {name!r} has {arr.ndim} dimension(s), expected {ndim}")
    if shape is not None:
        for axis, (got, want) in enumerate(zip(arr.shape, shape, strict=True)):
            if want is not None and got != want:
                raise ValueError(
                    f"array {name!r} has shape {arr.shape}, expected "
                    f"{tuple('*' if v is None else v for v in shape)} (axis {axis})"
                )
    if (low is not None or high is not None) and arr.size:
        if expected.kind not in "iu":
            raise TypeError(f"require_array bounds apply to integer arrays, not {expected}")
        lo, hi = arr.min(), arr.max()
        if (low is not None and lo < low) or (high is not None and hi >= high):
            raise ValueError(
                f"array {name!r} has values in [{lo}, {hi}], expected them in "
                f"[{'-inf' if low is None else low}, {'inf' if high is None else high})"
            )
    return arr


def require_state(
    state: Mapping[str, Any],
    name: str,
    kind: type | tuple[type, ...],
    *,
    low: float | None = None,
    high: float | None = None,
    optional: bool = False,
) -> Any:
    """The saved JSON scalar ``state[name]``, checked, for a class's ``_from_state``.

    ``kind`` is ``int``, ``float``, ``str``, ``bool`` or a tuple of them; ``bool`` is never
    accepted as a number and an ``int`` is accepted where ``float`` is. ``low`` / ``high``
    bound numbers (inclusive); floats must be finite. ``optional`` lets the key be absent
    (or null), returning ``None``. Failures raise ``ValueError`` naming the key.
    """
    if name not in state or state[name] is None:
        if optional:
            return None
        raise ValueError(f"state entry {name!r} is missing")
    value = state[name]
    kinds = kind if isinstance(kind, tuple) else (kind,)
    ok = False
    for k in kinds:
        if k is bool:
            ok = ok or isinstance(value, bool)
        elif k is int:
            ok = ok or (isinstance(value, int) and not isinstance(value, bool))
        elif k is float:
            ok = ok or (
                isinstance(value, int | float)
                and not isinstance(value, bool)
                and bool(np.isfinite(value))
            )
        else:
            ok = ok or isinstance(value, k)
    if not ok:
        names = " or ".join(k.__name__ for k in kinds)
        raise ValueError(f"state entry {name!r} must be a {names}, got {value!r}")
    if isinstance(value, int | float) and not isinstance(value, bool):
        if (low is not None and value < low) or (high is not None and value > high):
            raise ValueError(f"state entry {name!r} = {value!r} is outside [{low}, {high}]")
    return value


# ------------------------------------------------------------------------------------------
# Files: opened without following links, created exclusively, sized and checksummed.

_O_NOFOLLOW = getattr(os, "O_NOFOLLOW", 0)
_O_CLOEXEC = getattr(os, "O_CLOEXEC", 0)
_O_BINARY = getattr(os, "O_BINARY", 0)
_ARRAY_FILE = re.compile(r"(?P<name>[A-Za-z_][A-Za-z0-9_]*)\.g(?P<gen>[0-9]{1,18})\.npy")
_META_TMP = re.compile(re.escape(_META) + r"\.tmp(?:-(?P<pid>[0-9]{1,10})-[0-9a-f]{8})?")
_SHA256 = re.compile(r"[0-9a-f]{64}")
#: a temporary directory of an interrupted first save is removed by a later save of the
#: same path once its process is gone, or after this many seconds whatever its pid says
STALE_TEMP_AGE_S = 24 * 3600


def _open_file(file: Path, flags: int, mode: int = 0o666) -> int:
    """``os.open`` that never follows a symbolic link (the last path component)."""
    try:
        return os.open(file, flags | _O_NOFOLLOW | _O_CLOEXEC | _O_BINARY, mode)
    except OSError as exc:
        if exc.errno == errno.ELOOP or (exc.errno == errno.EEXIST and os.path.islink(file)):
            raise ValueError(
                f"{file} is a symbolic link; hashlearn never reads or writes the files of a "
                "save through links."
            ) from None
        raise


def _create_file(file: Path):
    """A new regular file opened for writing: fails if anything (a link too) has the name."""
    fd = _open_file(file, os.O_WRONLY | os.O_CREAT | os.O_EXCL)
    return os.fdopen(fd, "wb")


def _open_regular(file: Path, mode: str = "rb"):
    """An existing regular file, opened without following links (``rb`` or ``r+b``)."""
    flags = os.O_RDONLY if mode == "rb" else os.O_RDWR
    fd = _open_file(file, flags)
    if not stat.S_ISREG(os.fstat(fd).st_mode):
        os.close(fd)
        raise ValueError(f"{file} is not a regular file.")
    return os.fdopen(fd, mode)


def _sha256_of(f, start: int = 0, stop: int | None = None) -> str:
    """sha256 of the bytes ``start:stop`` of an open file (to its end by default)."""
    h = hashlib.sha256()
    f.seek(start)
    left = None if stop is None else stop - start
    while left is None or left > 0:
        chunk = f.read(1 << 22 if left is None else min(1 << 22, left))
        if not chunk:
            break
        h.update(chunk)
        if left is not None:
            left -= len(chunk)
    return h.hexdigest()


def _sha256(path: Path, start: int = 0, stop: int | None = None) -> str:
    """sha256 of the bytes ``start:stop`` of a file (the whole file by default)."""
    with _open_regular(path) as f:
        return _sha256_of(f, start, stop)


def _read_header(f, file: Path) -> tuple[tuple[int, ...], bool, np.dtype, int]:
    """``(shape, fortran_order, dtype, data offset)`` from an open ``.npy`` file."""
    try:
        f.seek(0)
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        elif version == (2, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        else:
            raise ValueError(f"unsupported .npy version {version}")
    except (
        ValueError,
        OSError,
        EOFError,
        SyntaxError,
        TypeError,
        RecursionError,
        tokenize.TokenError,  # numpy's header parser tokenizes the header's dict
    ) as exc:
        raise ValueError(f"{file} is corrupted or truncated: {exc}") from None
    if dtype.hasobject:
        raise ValueError(f"{file} holds Python objects (dtype {dtype}); it is never unpickled.")
    return tuple(int(v) for v in shape), bool(fortran), dtype, f.tell()


def _npy_layout(file: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(header shape, dtype, data offset)`` of a C-order ``.npy`` file."""
    with _open_regular(file) as f:
        shape, fortran, dtype, offset = _read_header(f, file)
    if fortran:
        raise ValueError("only C-order arrays of plain dtypes can be appended to")
    return shape, dtype, offset


def _read_array(
    directory: Path, entry: Mapping[str, Any], *, mmap: bool, verify: bool
) -> np.ndarray:
    """One saved array, checked against its ``meta.json`` entry: the ``.npy`` header's
    dtype and shape (plus the appended row counts), the file's size, and with ``verify``
    the sha256 of every block. Never follows a link; never unpickles."""
    file = directory / entry["file"]
    try:
        f = _open_regular(file)
    except FileNotFoundError:
        raise ValueError(f"{directory}: array file {entry['file']} is missing.") from None
    with f:
        shape = tuple(entry["shape"])
        appended = entry.get("appended")
        if verify and appended is None and _sha256_of(f) != entry["sha256"]:
            raise ValueError(
                f"{file}: checksum mismatch; the file was modified or truncated after saving."
            )
        header_shape, fortran, dtype, offset = _read_header(f, file)
        if dtype.str != entry["dtype"]:
            raise ValueError(
                f"{file}: the file holds dtype {dtype.str}, {_META} says {entry['dtype']}."
            )
        if appended is None:
            header_rows = shape[0] if shape else 0
            if header_shape != shape:
                raise ValueError(
                    f"{file}: expected shape {shape} dtype {entry['dtype']}, found shape "
                    f"{header_shape} dtype {dtype.str}."
                )
        else:
            header_rows = shape[0] - sum(block["rows"] for block in appended)
            if fortran or header_shape[1:] != shape[1:] or header_shape[:1] != (header_rows,):
                raise ValueError(
                    f"{file}: its header says shape {header_shape}; {_META} says shape "
                    f"{shape} of which {shape[0] - header_rows} appended rows, so the header "
                    f"should hold {(header_rows, *shape[1:])}."
                )
        count = int(np.prod(shape, dtype=np.int64))
        row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
        end = offset + count * dtype.itemsize
        size = os.fstat(f.fileno()).st_size
        if size < end or (appended is None and size != end):
            raise ValueError(
                f"{file} is corrupted or truncated: {size} bytes, expected "
                f"{'at least ' if appended is not None else ''}{end} for shape {shape}."
            )
        if verify and appended is not None:
            stop = offset + header_rows * row_bytes
            ranges = [(0, stop, entry["sha256"])]
            for block in appended:
                ranges.append((stop, stop + block["rows"] * row_bytes, block["sha256"]))
                stop += block["rows"] * row_bytes
            for start, stop, digest in ranges:
                if _sha256_of(f, start, stop) != digest:
                    raise ValueError(
                        f"{file}: checksum mismatch in bytes {start}:{stop}; the file was "
                        "modified or truncated after saving."
                    )
        order: Literal["C", "F"] = "F" if fortran else "C"
        if count == 0:
            return np.zeros(shape, dtype, order=order)
        if mmap:
            mapped = np.memmap(f, dtype=dtype, mode="r", offset=offset, shape=shape, order=order)
            mapped.filename = os.path.abspath(file)  # numpy leaves None for an fd's file
            return mapped
        buf = bytearray(count * dtype.itemsize)
        f.seek(offset)
        if f.readinto(buf) != len(buf):
            raise ValueError(f"{file} is truncated.")
        return np.frombuffer(buf, dtype=dtype).reshape(shape, order=order)


def _lock_dir(path: Path):
    """An exclusive advisory lock on the save directory (one writer at a time), or None."""
    try:
        import fcntl
    except ImportError:  # pragma: no cover - not POSIX
        return None
    fd = os.open(path, os.O_RDONLY | getattr(os, "O_DIRECTORY", 0) | _O_CLOEXEC)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
    except OSError:  # pragma: no cover - a filesystem without flock
        pass
    return fd


def _unlock_dir(fd) -> None:
    if fd is not None:
        os.close(fd)  # closing releases the flock


def _refuse_links(path: Path) -> list[os.DirEntry]:
    """The entries of a save directory; a ``ValueError`` if any is a symbolic link."""
    with os.scandir(path) as it:
        entries = list(it)
    links = sorted(e.name for e in entries if e.is_symlink())
    if links:
        raise ValueError(
            f"{path} holds symbolic links ({', '.join(links[:5])}); hashlearn refuses to "
            "write into a save directory holding links. Remove them first."
        )
    return entries


def _pid_alive(pid: int) -> bool:
    if pid == os.getpid():
        return True
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except (PermissionError, OverflowError, OSError):
        return True  # another user's process, or we cannot tell: assume it is alive
    return True


def _stale(pid: int | None, mtime: float) -> bool:
    """Whether a temporary of the process ``pid`` is abandoned."""
    return (pid is not None and not _pid_alive(pid)) or time.time() - mtime > STALE_TEMP_AGE_S


def _ours_only(directory: Path, depth: int = 2) -> bool:
    """Whether ``directory`` holds only regular files named as a save's files are, and (a
    composite's components, ``depth`` levels down) directories holding only such files."""
    with os.scandir(directory) as it:
        for e in it:
            if e.is_symlink():
                return False
            if e.is_dir(follow_symlinks=False):
                if depth == 0 or not _ours_only(Path(e.path), depth - 1):
                    return False
            elif not (
                e.is_file(follow_symlinks=False)
                and (
                    e.name == _META or _ARRAY_FILE.fullmatch(e.name) or _META_TMP.fullmatch(e.name)
                )
            ):
                return False
    return True


def _host_tag() -> str:
    """8 hex digits naming this machine in temporary names: a process id is checked only
    on the machine that wrote it (a shared filesystem is seen by several)."""
    return hashlib.sha256(socket.gethostname().encode("utf-8", "replace")).hexdigest()[:8]


#: ``.NAME.tmp-PID@HOST-TOKEN``: a save's temporary directory beside its target (older
#: versions wrote ``.NAME.tmp-PID-TOKEN``, without the host)
_TEMP_DIR = re.compile(
    r"\.(?P<name>.+)\.tmp-(?P<pid>[0-9]{1,10})(?:@(?P<host>[0-9a-f]{8}))?-[0-9a-f]{8}(?:[0-9a-f]{8})?"
)


def _temp_sibling(path: Path) -> Path:
    """A fresh name for the temporary directory of a first save of ``path``."""
    return path.parent / f".{path.name}.tmp-{os.getpid()}@{_host_tag()}-{secrets.token_hex(4)}"


def _remove_stale_temp_dirs(path: Path) -> None:
    """Remove the temporary siblings (``.NAME.tmp-PID@HOST-TOKEN``) of interrupted first saves
    of any path in ``path``'s directory: only real directories holding only a save's files,
    whose process is gone (by its id, on this machine), or that are older than
    :data:`STALE_TEMP_AGE_S`. Anything else is left alone. Runs at every save and load, so
    a killed save's files last until the next save or load beside it."""
    try:
        with os.scandir(path.parent) as it:
            candidates = [(e, m) for e in it if (m := _TEMP_DIR.fullmatch(e.name))]
    except OSError:
        return
    host = _host_tag()
    for e, match in candidates:
        try:
            if e.is_symlink() or not e.is_dir(follow_symlinks=False):
                continue
            pid = int(match["pid"]) if match["host"] in (None, host) else None
            if _stale(pid, e.stat(follow_symlinks=False).st_mtime) and _ours_only(Path(e.path)):
                shutil.rmtree(e.path)
        except OSError:
            continue


def append_rows(
    path: str | os.PathLike, rows: Mapping[str, np.ndarray], state: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Append ``rows[name]`` along axis 0 to the saved arrays ``name`` of ``path``, in place.

    Every array named must exist, with the same dtype and trailing shape. ``state`` entries
    replace those of the saved JSON state. The new ``meta.json`` is written atomically after
    the data is on disk (see the module docstring); returns it. Array files are opened
    without following links, and a directory holding links is refused.
    """
    path = Path(path)
    lock = _lock_dir(path)
    try:
        return _append_rows_locked(path, rows, state)
    finally:
        _unlock_dir(lock)


def _append_rows_locked(
    path: Path, rows: Mapping[str, np.ndarray], state: Mapping[str, Any] | None
) -> dict[str, Any]:
    _refuse_links(path)
    meta = _read_meta(path)
    prepared = {}
    for name, new in rows.items():
        entry = meta["arrays"].get(name)
        if entry is None:
            raise ValueError(f"{path} has no array {name!r} to append to.")
        new = np.ascontiguousarray(new)
        if new.dtype.str != entry["dtype"] or list(new.shape[1:]) != entry["shape"][1:]:
            raise ValueError(
                f"rows for {name!r} must have dtype {entry['dtype']} and shape "
                f"(m, {entry['shape'][1:]}); got {new.dtype.str} {new.shape}."
            )
        if not entry["shape"]:
            raise ValueError(f"{path}: array {name!r} is 0-dimensional; rows cannot be appended.")
        prepared[name] = (entry, new)
    for entry, _ in prepared.values():  # the header must describe what meta.json says
        file = path / entry["file"]
        header_shape, dtype, offset = _npy_layout(file)
        header_rows = entry["shape"][0] - sum(b["rows"] for b in entry.get("appended", ()))
        if dtype.str != entry["dtype"] or list(header_shape) != [header_rows, *entry["shape"][1:]]:
            raise ValueError(
                f"{file}: header {header_shape} {dtype.str} does not match {_META}; "
                "refusing to append."
            )
    if any("appended" not in entry for entry, _ in prepared.values()):
        # first make meta.json checksum the current bytes as a range, so bytes of a crashed
        # append past them never invalidate it
        for entry, _ in prepared.values():
            entry.setdefault("appended", [])
        _write_meta(path, meta)
    for entry, new in prepared.values():
        file = path / entry["file"]
        header_shape, dtype, offset = _npy_layout(file)
        row_bytes = new.itemsize * int(np.prod(new.shape[1:], dtype=np.int64))
        end = offset + entry["shape"][0] * row_bytes
        with _open_regular(file, "r+b") as f:
            if os.fstat(f.fileno()).st_size < end:
                raise ValueError(f"{file} is truncated; refusing to append.")
            f.truncate(end)  # bytes of an append that crashed before its meta.json
            f.seek(end)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
            digest = _sha256_of(f, end, end + new.nbytes)
        entry["appended"].append({"rows": int(new.shape[0]), "sha256": digest})
        entry["shape"][0] += int(new.shape[0])
    if state:
        meta["state"].update(state)
    _write_meta(path, meta)
    return meta


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success flush it to disk and rename it to
    ``path`` (``os.replace``): the one way hashlearn writes a single file atomically.

    The caller writes the whole file to the yielded path. If the block raises, the temporary
    file is removed and ``path`` is left as it was; a crash never leaves a half-written file.
    """
    path = Path(path)
    # A fresh name rather than mkstemp, so the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}{path.suffix}")
    try:
        yield tmp
        _fsync_file(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY | _O_CLOEXEC)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def _fsync_dir(path: Path) -> None:
    try:
        _fsync_file(path)
    except OSError:  # some filesystems cannot fsync a directory
        pass


def _json_default(value: Any) -> Any:
    if isinstance(value, np.integer):
        return int(value)
    if isinstance(value, np.floating):
        return float(value)
    if isinstance(value, np.bool_):
        return bool(value)
    raise TypeError(f"cannot save a value of type {type(value).__name__} in {_META}")


def _write_arrays(
    directory: Path, arrays: Mapping[str, np.ndarray], generation: int
) -> dict[str, Any]:
    entries = {}
    for name, arr in arrays.items():
        if not isinstance(name, str) or not name.isidentifier() or not name.isascii():
            raise ValueError(f"array name {name!r} must be an ASCII identifier")
        arr = np.asarray(arr)
        if arr.dtype.hasobject:
            raise TypeError(f"array {name!r} has dtype object; only plain dtypes are saved")
        arr = np.ascontiguousarray(arr)
        file = f"{name}.g{generation}.npy"
        with _create_file(directory / file) as f:
            np.lib.format.write_array(f, arr, allow_pickle=False)
            f.flush()
            os.fsync(f.fileno())
        entries[name] = {
            "file": file,
            "shape": list(arr.shape),
            "dtype": arr.dtype.str,
            "sha256": _sha256(directory / file),
        }
    return entries


def write_dir(
    path: str | os.PathLike,
    class_name: str,
    params: Mapping[str, Any],
    state: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
) -> None:
    """Write a save directory (see the module docstring for the crash-safety scheme).

    Files are created exclusively and never through links; a save directory holding a link
    is refused. Only files this library wrote are ever deleted: those the previous
    ``meta.json`` named (and the ones it recorded as superseded), array files of
    generations it never committed, and its own temporaries of processes that are gone.
    """
    path = Path(path)
    if path.is_symlink() and not path.exists():
        raise ValueError(f"{path} is a dangling symbolic link; refusing to save through it.")
    _remove_stale_temp_dirs(path)
    if not path.exists():
        _write_new_dir(path, class_name, params, state, arrays)
        return
    if not path.is_dir() or not (path / _META).is_file():
        raise FileExistsError(
            f"{path} exists and is not a hashlearn save (no {_META}); refusing to overwrite it."
        )
    lock = _lock_dir(path)
    try:
        _write_over(path, class_name, params, state, arrays)
    finally:
        _unlock_dir(lock)


def write_composite(
    path: str | os.PathLike,
    components: Mapping[str, Any],
    is_component: Any,
    class_name: str,
    params: Mapping[str, Any],
    state: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
) -> None:
    """Save an object made of saved objects: its own ``meta.json`` and arrays in ``path``,
    each of ``components`` (sub-directory name -> persistable object) saved below it.

    A first save is built in a temporary sibling and renamed into place. Over an existing
    save the new components are written first, then ``meta.json`` is replaced atomically
    (:func:`write_dir`), then the entries that ``is_component(name)`` recognises as the old
    components (or their temporaries) are deleted: a crash at any point leaves the old or the
    new object loadable. The component names should be fresh (e.g. carry a random token).
    """
    path = Path(path)
    if path.exists():
        if not (path / _META).is_file():
            raise FileExistsError(
                f"{path} exists and is not a hashlearn save (no meta.json); refusing to "
                "overwrite it."
            )
        for name, component in components.items():
            save(component, path / name)
        write_dir(path, class_name, params, state, arrays)  # the atomic switch
        for child in path.iterdir():
            if child.name not in components and is_component(child.name):
                shutil.rmtree(child, ignore_errors=True)
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(path)
    try:
        write_dir(tmp, class_name, params, state, arrays)
        for name, component in components.items():
            save(component, tmp / name)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise


def _new_meta(class_name, params, state, generation) -> dict[str, Any]:
    return {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "class": class_name,
        "generation": generation,
        "params": dict(params),
        "state": dict(state),
    }


def _write_new_dir(path, class_name, params, state, arrays) -> None:
    meta = _new_meta(class_name, params, state, 1)
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = _temp_sibling(path)
    tmp.mkdir()  # unlike mkdtemp (0700) this honours the umask, like any directory
    try:
        meta["arrays"] = _write_arrays(tmp, arrays, 1)
        _write_meta(tmp, meta)
        os.rename(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    _fsync_dir(path.parent)


def _write_over(path, class_name, params, state, arrays) -> None:
    entries = _refuse_links(path)
    old_meta = _read_meta(path)
    old_gen = old_meta["generation"]
    # generations above the committed one belong to saves that were interrupted: skip them
    present = {e.name: _ARRAY_FILE.fullmatch(e.name) for e in entries}
    seen = [int(m["gen"]) for m in present.values() if m]
    generation = max([old_gen, *seen]) + 1
    old_files = {e["file"] for e in old_meta["arrays"].values()}
    # what this save deletes once it is committed: the files the previous meta.json named,
    # those it recorded as superseded that a crash left behind, and the array files of
    # generations above the committed one (written by interrupted saves, never named by a
    # meta.json). All are recorded in the new meta.json, so after a crash during the
    # deletion the next save finishes it.
    uncommitted = {n for n, m in present.items() if m and old_gen < int(m["gen"]) < generation}
    superseded = sorted(
        old_files | (set(old_meta.get("superseded", ())) & set(present)) | uncommitted
    )
    meta = _new_meta(class_name, params, state, generation)
    meta["arrays"] = _write_arrays(path, arrays, generation)
    meta["superseded"] = superseded
    _write_meta(path, meta)
    doomed = set(superseded)
    for name in present:
        tmp = _META_TMP.fullmatch(name)
        if tmp and (tmp["pid"] is None or not _pid_alive(int(tmp["pid"]))):
            doomed.add(name)
    doomed -= {e["file"] for e in meta["arrays"].values()}
    for name in sorted(doomed):
        try:
            if stat.S_ISREG(os.lstat(path / name).st_mode):
                os.unlink(path / name)
        except FileNotFoundError:
            pass


def _write_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    tmp = directory / f"{_META}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        with _create_file(tmp) as f:
            f.write(
                json.dumps(meta, indent=1, sort_keys=True, default=_json_default).encode("utf-8")
            )
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, directory / _META)
    except BaseException:
        try:
            if stat.S_ISREG(os.lstat(tmp).st_mode):
                os.unlink(tmp)
        except OSError:
            pass
        raise
    _fsync_dir(directory)


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / _META
    try:
        with _open_regular(meta_path) as f:
            raw = f.read(_META_MAX_BYTES + 1)
    except (FileNotFoundError, NotADirectoryError):
        raise FileNotFoundError(f"{path} is not a hashlearn save: {_META} is missing.") from None
    if len(raw) > _META_MAX_BYTES:
        raise ValueError(f"{meta_path} is corrupted: larger than {_META_MAX_BYTES} bytes.")
    try:
        meta = json.loads(raw.decode("utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError, RecursionError) as exc:
        raise ValueError(f"{meta_path} is corrupted: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{meta_path} is not a hashlearn metadata file.")
    version = meta.get("format_version")
    if type(version) is not int or version < 1:
        raise ValueError(
            f"{meta_path} is corrupted: 'format_version' must be a positive int, got {version!r}."
        )
    if version not in SUPPORTED_VERSIONS:
        raise ValueError(
            f"{path} was written in format version {version!r}; this hashlearn reads versions "
            f"{', '.join(map(str, SUPPORTED_VERSIONS))}. Upgrade hashlearn to load it."
        )
    _check_structure(meta, meta_path)
    return meta


_META_MAX_BYTES = 1 << 28  # a meta.json holds parameters and scalars, never data
_TOP_KEYS = {"format", "format_version", "class", "generation", "params", "state", "arrays"}
_ENTRY_KEYS = {"file", "shape", "dtype", "sha256", "appended"}


def _is_int(value: Any) -> TypeGuard[int]:
    return type(value) is int


def _check_structure(meta: dict[str, Any], meta_path: Path) -> None:
    """Every entry :func:`read_dir` and ``_from_state`` rely on, with its type and range."""

    def corrupted(what: str) -> ValueError:
        return ValueError(f"{meta_path} is corrupted: {what}.")

    unknown = set(meta) - _TOP_KEYS - {"superseded"}
    if unknown:
        raise corrupted(f"unknown keys {sorted(unknown)}")
    if not isinstance(meta.get("class"), str):
        raise corrupted("'class' must be a class name")
    generation = meta.get("generation")
    if not _is_int(generation) or not 1 <= generation < 10**18:
        raise corrupted(f"'generation' must be a positive int, got {generation!r}")
    for key in ("params", "state", "arrays"):
        if not isinstance(meta.get(key), dict):
            raise corrupted(f"{key!r} must be a JSON object")
    superseded = meta.get("superseded", [])
    if not isinstance(superseded, list) or not all(
        isinstance(v, str) and _ARRAY_FILE.fullmatch(v) for v in superseded
    ):
        raise corrupted("'superseded' must be a list of array file names")
    for name, entry in meta["arrays"].items():
        if not name.isidentifier() or not name.isascii():
            raise corrupted(f"array name {name!r} is not an identifier")
        if not isinstance(entry, dict):
            raise corrupted(f"array entry {name!r} must be a JSON object")
        if set(entry) - _ENTRY_KEYS:
            raise corrupted(f"array {name!r} has unknown keys {sorted(set(entry) - _ENTRY_KEYS)}")
        file, shape = entry.get("file"), entry.get("shape")
        if file != f"{name}.g{generation}.npy":
            # a plain file name inside the save, of this generation: never a path that leaves
            # the directory, never another array's file
            raise corrupted(
                f"array {name!r} has file name {file!r}; expected {name}.g{generation}.npy"
            )
        if not (isinstance(shape, list) and all(_is_int(v) and v >= 0 for v in shape)):
            raise corrupted(f"array {name!r} has an invalid shape {shape!r}")
        if len(shape) > 32:
            raise corrupted(f"array {name!r} has {len(shape)} dimensions")
        dtype = entry.get("dtype")
        if not isinstance(dtype, str):
            raise corrupted(f"array {name!r} has no valid 'dtype'")
        try:
            parsed = np.dtype(dtype)
        except (TypeError, ValueError, SyntaxError):
            raise corrupted(f"array {name!r} has an invalid dtype {dtype!r}") from None
        if parsed.hasobject or parsed.str != dtype or parsed.itemsize == 0:
            raise corrupted(f"array {name!r} has dtype {dtype!r}; only plain dtypes load")
        if not isinstance(entry.get("sha256"), str) or not _SHA256.fullmatch(entry["sha256"]):
            raise corrupted(f"array {name!r} has no valid 'sha256'")
        if "appended" in entry:
            blocks = entry["appended"]
            if not isinstance(blocks, list) or not all(
                isinstance(b, dict)
                and set(b) == {"rows", "sha256"}
                and _is_int(b["rows"])
                and b["rows"] >= 0
                and isinstance(b["sha256"], str)
                and _SHA256.fullmatch(b["sha256"])
                for b in blocks
            ):
                raise corrupted(f"array {name!r} has an invalid 'appended' list")
            if not shape or sum(b["rows"] for b in blocks) > shape[0]:
                raise corrupted(
                    f"array {name!r}: the appended rows exceed its shape {tuple(shape)}"
                )


def read_dir(
    path: str | os.PathLike, *, mmap: bool | str = False, verify: bool = True
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a save directory: ``(meta, arrays)``; every check failure is a ``ValueError``.

    Files are opened without following links; every array's ``.npy`` header must agree
    with ``meta.json`` (dtype, shape, appended row counts) and its size with the header.
    ``mmap``: False (read), True or ``"direct"`` (mapped read-only).
    """
    return _read_dir(Path(path), mmap=check_mmap(mmap), verify=verify, seen=[])


def check_mmap(mmap: bool | str) -> bool:
    """Whether ``mmap`` (True, False or ``"direct"``) maps arrays; anything else: ValueError."""
    if mmap is True or mmap is False or mmap == "direct":
        return bool(mmap)
    raise ValueError(f"mmap must be True, False or 'direct', got {mmap!r}")


def _read_dir(
    path: Path, *, mmap: bool, verify: bool, seen: list
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    meta = _read_meta(path)
    seen.append(copy.deepcopy(meta))
    arrays = {}
    for name, entry in meta["arrays"].items():
        try:
            arrays[name] = _read_array(path, entry, mmap=mmap, verify=verify)
        except OSError as exc:
            raise ValueError(f"{path / entry['file']} cannot be read: {exc}") from None
    return meta, arrays


def estimator_state(
    est: Any, skip_params: tuple[str, ...] = ()
) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    """``_get_state`` of a scikit-learn estimator: its parameters (JSON scalars only) and its
    fitted attributes ending in ``_`` (arrays go to ``.npy`` files, scalars to the state).

    Parameters named in ``skip_params`` are left out (and not required to be JSON scalars):
    the caller stores them in its own form (e.g. a tuple of layer sizes as a list)."""
    params = renamed_params(type(est), est.get_params(deep=False))
    params = {k: v for k, v in params.items() if k not in skip_params}
    for key, value in params.items():
        if not (value is None or isinstance(value, (str, bool, numbers.Real))):
            raise TypeError(
                f"cannot save {type(est).__name__}: parameter {key}={value!r} is not a "
                "number, string, bool or None (e.g. pass random_state as an int)."
            )
    state: dict[str, Any] = {}
    arrays: dict[str, np.ndarray] = {}
    for key, value in vars(est).items():
        if not key.endswith("_") or key.startswith("_"):
            continue
        if isinstance(value, np.ndarray):
            arrays[key] = value
        elif value is None or isinstance(value, (str, bool, numbers.Real)):
            state[key] = value
        else:
            raise TypeError(f"cannot save attribute {key} of type {type(value).__name__}.")
    return params, state, arrays


def renamed_params(cls: type, params: Mapping[str, Any]) -> dict[str, Any]:
    """``params`` of a saved ``cls`` with the parameters renamed since under their new names.

    ``cls._renamed_params`` maps old to new names (see
    :func:`hashlearn._utils.validation.renamed_param`); a file saved before the rename, or with the
    deprecated keyword set, loads as the estimator that passes the new keyword.
    """
    params = dict(params)
    for old, new in getattr(cls, "_renamed_params", {}).items():
        value = params.pop(old, DEPRECATED)
        if not (isinstance(value, str) and value == DEPRECATED):
            params[new] = value
    return params


def estimator_from_state(
    cls: type,
    params: Mapping[str, Any],
    state: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    *,
    extra_params: Mapping[str, Any] | None = None,
) -> Any:
    """Inverse of :func:`estimator_state`: construct with ``params``, set the fitted
    attributes, then check them. Everything a ``meta.json`` could smuggle in is refused:

    * ``params`` must be parameters of the constructor (``cls._get_param_names()``), with
      JSON scalar values;
    * a state or array key must be a *fitted attribute*: a name ending in ``_`` (not
      starting with one) that the class itself does not define, so nothing shadows a method
      or property such as ``encode``; a class listing its fitted attributes in
      ``_fitted_attributes`` accepts only those;
    * float values and arrays must be finite.

    Then ``obj._check_state()`` runs when the class defines it (it raises ``ValueError`` on
    parameters and arrays that do not fit together), else the generic
    :func:`check_estimator_state`, which also honours a class's declared
    ``_state_shapes``, e.g. ``{"components_": ("n_bits_", "n_features_in_")}``.
    ``extra_params`` are constructor parameters that are not JSON scalars (e.g. a tuple of
    layer sizes), already checked by the caller.
    """
    owner = cls.__name__
    params = renamed_params(cls, params)
    allowed = set(cls._get_param_names()) if hasattr(cls, "_get_param_names") else None
    for key, value in params.items():
        if allowed is not None and key not in allowed:
            raise ValueError(f"{key!r} is not a parameter of {owner}")
        if not (value is None or isinstance(value, str | bool | int | float)):
            raise ValueError(f"parameter {key}={value!r} is not a JSON scalar")
    check_fitted_items(cls, state, arrays, getattr(cls, "_fitted_attributes", None))
    params = {**params, **(extra_params or {})}
    obj = cls(**params)
    for key, value in {**state, **arrays}.items():
        setattr(obj, key, value)
    check = getattr(obj, "_check_state", None)
    if callable(check):
        check()
    else:
        check_estimator_state(obj)
    return obj


def check_fitted_items(
    cls: type,
    state: Mapping[str, Any],
    arrays: Mapping[str, np.ndarray],
    allowed: Iterable[str] | None = None,
) -> None:
    """Refuse saved fitted attributes that could not have come from ``cls.fit``.

    Every key of ``state`` and ``arrays`` must be a fitted-attribute name (ending in ``_``,
    not starting with one) that the class itself does not define (so nothing shadows a
    method such as ``encode``), and one of ``allowed`` when given; arrays must be numeric
    and finite, state values finite JSON scalars. Raises ``ValueError``.
    """
    owner = cls.__name__
    allowed = None if allowed is None else set(allowed)
    overlap = set(state) & set(arrays)
    if overlap:
        raise ValueError(f"{sorted(overlap)} are both in the state and the arrays")
    for key, value in {**state, **arrays}.items():
        if not (
            isinstance(key, str)
            and key.isidentifier()
            and key.endswith("_")
            and not key.startswith("_")
        ):
            raise ValueError(f"{key!r} is not a fitted attribute (a name ending in '_')")
        if hasattr(cls, key):
            raise ValueError(f"{key!r} would shadow {owner}.{key}; it is not a fitted attribute")
        if allowed is not None and key not in allowed:
            raise ValueError(f"{key!r} is not one of the fitted attributes of {owner}")
        if isinstance(value, np.ndarray):
            if value.dtype.kind not in "biufc":
                raise ValueError(f"array {key!r} has dtype {value.dtype}, not a numeric one")
            if value.dtype.kind in "fc" and not np.isfinite(value).all():
                raise ValueError(f"array {key!r} holds NaN or infinite values")
        elif not (value is None or isinstance(value, str | bool | int | float)):
            raise ValueError(f"state entry {key!r} is not a JSON scalar")
        elif isinstance(value, float) and not np.isfinite(value):
            raise ValueError(f"state entry {key!r} is not finite: {value!r}")


def check_estimator_state(obj: Any) -> None:
    """The generic consistency check of a loaded estimator (``_check_state``'s default).

    ``n_bits`` must be a positive int and ``n_bits_`` (when fitted) an int in
    ``[1, n_bits]``; ``n_features_in_`` a positive int. Every fitted attribute named in the
    class's ``_state_shapes`` (a mapping ``name -> shape``, each dimension an int, ``None``
    for any, or the name of an int attribute or parameter such as ``"n_bits_"``) must have
    that shape. A hasher (it has ``_bits`` and
    ``_check_X``) then encodes a two-row probe of ``n_features_in_`` columns: it must run
    and give exactly ``n_bits_`` (else ``n_bits``) bits per row, so an edited ``n_bits`` or
    an array of the wrong shape is refused here instead of giving codes of the wrong width
    later. Raises ``ValueError``.
    """
    owner = type(obj).__name__
    n_bits = getattr(obj, "n_bits", None)
    if n_bits is not None and not (_is_int(n_bits) and n_bits >= 1):
        raise ValueError(f"n_bits must be a positive int, got {n_bits!r}")
    width = n_bits
    if "n_bits_" in vars(obj):
        width = obj.n_bits_
        if not (_is_int(width) and 1 <= width <= (n_bits or width)):
            raise ValueError(f"n_bits_ must be an int in [1, n_bits={n_bits}], got {width!r}")
    d = vars(obj).get("n_features_in_")
    if d is not None and not (_is_int(d) and d >= 1):
        raise ValueError(f"n_features_in_ must be a positive int, got {d!r}")
    for attr, spec in getattr(type(obj), "_state_shapes", {}).items():
        value = vars(obj).get(attr)
        if value is None:
            continue
        want = tuple(_resolve_dim(obj, dim) for dim in spec)
        got = np.shape(value)
        if len(got) != len(want) or any(
            w is not None and g != w for g, w in zip(got, want, strict=False)
        ):
            shown = tuple("*" if w is None else w for w in want)
            raise ValueError(f"{attr} has shape {got}, expected {shown} ({spec})")
    if width is None or d is None or not (hasattr(obj, "_bits") and hasattr(obj, "_check_X")):
        return
    probe = np.linspace(-1.0, 1.0, 2 * d).reshape(2, d)
    try:
        with warnings.catch_warnings(), np.errstate(all="ignore"):
            warnings.simplefilter("ignore")
            bits = np.asarray(obj._bits(obj._check_X(probe, reset=False)))
    except (ValueError, TypeError, IndexError, ArithmeticError, np.linalg.LinAlgError) as exc:
        raise ValueError(f"its fitted arrays do not fit its parameters: {exc}") from None
    if bits.shape != (2, width):
        raise ValueError(
            f"{owner} with n_bits={n_bits} should encode {width} bits per row, but its "
            f"fitted arrays give {bits.shape[1] if bits.ndim == 2 else bits.shape}"
        )


def _resolve_dim(obj: Any, dim: Any) -> int | None:
    if dim is None or _is_int(dim):
        return dim
    value = getattr(obj, dim, None)
    if not _is_int(value):
        raise ValueError(f"{dim} must be an int to check the shapes, got {value!r}")
    return value
