"""Saving and loading models and indexes without pickle.

A saved object is a directory::

    meta.json          format name and version, class, parameters, JSON state, and for
                       every array its file, shape, dtype and sha256
    <name>.g<N>.npy    one .npy file per array (read with allow_pickle=False, mmap-able)

Loading never executes code: the class named in ``meta.json`` is looked up in a registry of
hashlearn's own persistable classes, never imported by name.

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
"""

from __future__ import annotations

import hashlib
import json
import numbers
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = [
    "FORMAT_VERSION",
    "Persistable",
    "save",
    "load",
    "persistable",
    "write_dir",
    "read_dir",
    "append_rows",
    "require_array",
    "require_state",
]

FORMAT_NAME = "hashlearn"
FORMAT_VERSION = 1
_META = "meta.json"
_REGISTRY: dict[str, type] = {}


def persistable(cls: type) -> type:
    """Class decorator: make ``cls`` loadable by :func:`load` under its class name.

    The class implements ``_get_state() -> (params, state, arrays)`` and the classmethod
    ``_from_state(params, state, arrays)``.
    """
    _REGISTRY[cls.__name__] = cls
    return cls


class Persistable:
    """Mixin giving ``save(path)`` and ``Class.load(path, mmap=..., verify=...)``."""

    def save(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path`` atomically (no pickle; see :mod:`hashlearn.io`)."""
        save(self, path)

    @classmethod
    def load(cls, path: str | os.PathLike, *, mmap: bool = False, verify: bool = True):
        """Load what :meth:`save` wrote; ``mmap=True`` maps the arrays read-only."""
        obj = load(path, mmap=mmap, verify=verify)
        if not isinstance(obj, cls):
            raise TypeError(f"{path} holds a {type(obj).__name__}, not a {cls.__name__}.")
        return obj


def save(obj: Any, path: str | os.PathLike) -> None:
    """Save a hashlearn model or index to the directory ``path`` (atomically)."""
    cls_name = type(obj).__name__
    if _REGISTRY.get(cls_name) is not type(obj):
        raise TypeError(f"{cls_name} is not a persistable hashlearn class.")
    params, state, arrays = obj._get_state()
    write_dir(path, cls_name, params, state, arrays)


def load(path: str | os.PathLike, *, mmap: bool = False, verify: bool = True) -> Any:
    """Load what :func:`save` wrote. ``mmap=True`` maps the arrays read-only instead of
    reading them; ``verify`` checks every array's sha256 (reads each file once)."""
    meta, arrays = read_dir(path, mmap=mmap, verify=verify)
    cls = _REGISTRY.get(meta["class"])
    if cls is None:
        raise ValueError(
            f"{path}: unknown class {meta['class']!r} in {_META}; known: {sorted(_REGISTRY)}."
        )
    try:
        return cls._from_state(meta["params"], meta["state"], arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: the saved {meta['class']} is inconsistent: {exc}") from None


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


def _sha256(path: Path, start: int = 0, stop: int | None = None) -> str:
    """sha256 of the bytes ``start:stop`` of a file (the whole file by default)."""
    h = hashlib.sha256()
    with open(path, "rb") as f:
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


def _npy_layout(file: Path) -> tuple[tuple[int, ...], np.dtype, int]:
    """``(header shape, dtype, data offset)`` of a C-order ``.npy`` file."""
    with open(file, "rb") as f:
        version = np.lib.format.read_magic(f)
        if version == (1, 0):
            shape, fortran, dtype = np.lib.format.read_array_header_1_0(f)
        else:
            shape, fortran, dtype = np.lib.format.read_array_header_2_0(f)
        if fortran or dtype.hasobject:
            raise ValueError("only C-order arrays of plain dtypes can be appended to")
        return tuple(shape), dtype, f.tell()


def _load_appended(file: Path, entry: dict[str, Any], *, mmap: bool, verify: bool) -> np.ndarray:
    """An array grown by :func:`append_rows`: shape from ``meta.json``, blocks verified."""
    header_shape, dtype, offset = _npy_layout(file)
    shape = tuple(entry["shape"])
    row_bytes = int(np.prod(shape[1:], dtype=np.int64)) * dtype.itemsize
    if header_shape[1:] != shape[1:] or dtype.str != entry["dtype"]:
        raise ValueError(f"{file}: header {header_shape} {dtype.str} does not match meta.json")
    end = offset + shape[0] * row_bytes
    if file.stat().st_size < end:
        raise ValueError(
            f"{file} is truncated: {file.stat().st_size} bytes, expected at least {end}."
        )
    if verify:
        stop = offset + header_shape[0] * row_bytes
        ranges = [(0, stop, entry["sha256"])]
        for block in entry["appended"]:
            ranges.append((stop, stop + block["rows"] * row_bytes, block["sha256"]))
            stop += block["rows"] * row_bytes
        for start, stop, digest in ranges:
            if _sha256(file, start, stop) != digest:
                raise ValueError(
                    f"{file}: checksum mismatch in bytes {start}:{stop}; the file "
                    "was modified or truncated after saving."
                )
    if shape[0] == 0:
        return np.zeros(shape, dtype)
    if mmap:
        return np.memmap(file, dtype=dtype, mode="r", offset=offset, shape=shape)
    with open(file, "rb") as f:
        f.seek(offset)
        return np.fromfile(f, dtype=dtype, count=int(np.prod(shape))).reshape(shape)


def append_rows(
    path: str | os.PathLike, rows: Mapping[str, np.ndarray], state: Mapping[str, Any] | None = None
) -> dict[str, Any]:
    """Append ``rows[name]`` along axis 0 to the saved arrays ``name`` of ``path``, in place.

    Every array named must exist, with the same dtype and trailing shape. ``state`` entries
    replace those of the saved JSON state. The new ``meta.json`` is written atomically after
    the data is on disk (see the module docstring); returns it.
    """
    path = Path(path)
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
        prepared[name] = (entry, new)
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
        with open(file, "r+b") as f:
            f.truncate(end)  # bytes of an append that crashed before its meta.json
            f.seek(end)
            f.write(new.tobytes())
            f.flush()
            os.fsync(f.fileno())
        entry.setdefault("appended", []).append(
            {"rows": int(new.shape[0]), "sha256": _sha256(file, end, end + new.nbytes)}
        )
        entry["shape"][0] += int(new.shape[0])
    if state:
        meta["state"].update(state)
    _write_meta(path, meta)
    return meta


def _fsync_file(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
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
        if not name.isidentifier():
            raise ValueError(f"array name {name!r} must be an identifier")
        arr = np.asarray(arr)
        if arr.dtype == object:
            raise TypeError(f"array {name!r} has dtype object; only plain dtypes are saved")
        file = f"{name}.g{generation}.npy"
        np.save(directory / file, arr, allow_pickle=False)
        _fsync_file(directory / file)
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
    """Write a save directory (see the module docstring for the crash-safety scheme)."""
    path = Path(path)
    old_meta = None
    if path.exists():
        if not (path / _META).is_file():
            raise FileExistsError(
                f"{path} exists and is not a hashlearn save (no {_META}); refusing to overwrite it."
            )
        old_meta = _read_meta(path)
    generation = 1 if old_meta is None else int(old_meta.get("generation", 0)) + 1
    meta: dict[str, Any] = {
        "format": FORMAT_NAME,
        "format_version": FORMAT_VERSION,
        "class": class_name,
        "generation": generation,
        "params": dict(params),
        "state": dict(state),
    }
    if old_meta is None:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp = path.parent / f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(4)}"
        tmp.mkdir()  # unlike mkdtemp (0700) this honours the umask, like any directory
        try:
            meta["arrays"] = _write_arrays(tmp, arrays, generation)
            _write_meta(tmp, meta)
            os.rename(tmp, path)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
        _fsync_dir(path.parent)
        return
    meta["arrays"] = _write_arrays(path, arrays, generation)
    _write_meta(path, meta)
    keep = {_META} | {e["file"] for e in meta["arrays"].values()}
    for leftover in path.iterdir():
        if leftover.name not in keep and leftover.suffix in (".npy", ".tmp"):
            leftover.unlink(missing_ok=True)


def _write_meta(directory: Path, meta: Mapping[str, Any]) -> None:
    tmp = directory / (_META + ".tmp")
    with open(tmp, "w", encoding="utf-8") as f:
        json.dump(meta, f, indent=1, sort_keys=True, default=_json_default)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, directory / _META)
    _fsync_dir(directory)


def _read_meta(path: Path) -> dict[str, Any]:
    meta_path = path / _META
    if not meta_path.is_file():
        raise FileNotFoundError(f"{path} is not a hashlearn save: {_META} is missing.")
    try:
        meta = json.loads(meta_path.read_text(encoding="utf-8"))
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{meta_path} is corrupted: {exc}") from None
    if not isinstance(meta, dict) or meta.get("format") != FORMAT_NAME:
        raise ValueError(f"{meta_path} is not a hashlearn metadata file.")
    version = meta.get("format_version")
    if not isinstance(version, int) or version > FORMAT_VERSION:
        raise ValueError(
            f"{path} was written in format version {version!r}; this hashlearn reads versions "
            f"up to {FORMAT_VERSION}. Upgrade hashlearn to load it."
        )
    _check_structure(meta, meta_path)
    return meta


_ARRAY_FILE = re.compile(r"[A-Za-z_][A-Za-z0-9_]*\.g[0-9]+\.npy")


def _check_structure(meta: dict[str, Any], meta_path: Path) -> None:
    """Every entry :func:`read_dir` and ``_from_state`` rely on, with its type."""

    def corrupted(what: str) -> ValueError:
        return ValueError(f"{meta_path} is corrupted: {what}.")

    if not isinstance(meta.get("class"), str):
        raise corrupted("'class' must be a class name")
    for key in ("params", "state", "arrays"):
        if not isinstance(meta.get(key), dict):
            raise corrupted(f"{key!r} must be a JSON object")
    for name, entry in meta["arrays"].items():
        if not isinstance(entry, dict):
            raise corrupted(f"array entry {name!r} must be a JSON object")
        file, shape = entry.get("file"), entry.get("shape")
        if not isinstance(file, str) or not _ARRAY_FILE.fullmatch(file):
            # a plain file name inside the save: never a path that leaves the directory
            raise corrupted(f"array {name!r} has an invalid file name {file!r}")
        if not (isinstance(shape, list) and all(isinstance(v, int) for v in shape)):
            raise corrupted(f"array {name!r} has an invalid shape {shape!r}")
        for key in ("dtype", "sha256"):
            if not isinstance(entry.get(key), str):
                raise corrupted(f"array {name!r} has no valid {key!r}")


def read_dir(
    path: str | os.PathLike, *, mmap: bool = False, verify: bool = True
) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a save directory: ``(meta, arrays)``; every check failure is a ``ValueError``."""
    path = Path(path)
    meta = _read_meta(path)
    arrays = {}
    for name, entry in meta["arrays"].items():
        file = path / entry["file"]
        if not file.is_file():
            raise ValueError(f"{path}: array file {entry['file']} is missing.")
        if "appended" in entry:
            try:
                arrays[name] = _load_appended(file, entry, mmap=mmap, verify=verify)
            except (OSError, EOFError, KeyError, TypeError) as exc:
                raise ValueError(f"{file} is corrupted or truncated: {exc}") from None
            continue
        if verify and _sha256(file) != entry["sha256"]:
            raise ValueError(
                f"{file}: checksum mismatch; the file was modified or truncated after saving."
            )
        try:
            arr = np.load(file, mmap_mode="r" if mmap else None, allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"{file} is corrupted or truncated: {exc}") from None
        if list(arr.shape) != entry["shape"] or arr.dtype.str != entry["dtype"]:
            raise ValueError(
                f"{file}: expected shape {tuple(entry['shape'])} dtype {entry['dtype']}, "
                f"found shape {arr.shape} dtype {arr.dtype.str}."
            )
        arrays[name] = arr
    return meta, arrays


def estimator_state(est: Any) -> tuple[dict[str, Any], dict[str, Any], dict[str, np.ndarray]]:
    """``_get_state`` of a scikit-learn estimator: its parameters (JSON scalars only) and its
    fitted attributes ending in ``_`` (arrays go to ``.npy`` files, scalars to the state)."""
    params = est.get_params(deep=False)
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


def estimator_from_state(
    cls: type, params: Mapping[str, Any], state: Mapping[str, Any], arrays: Mapping[str, np.ndarray]
) -> Any:
    """Inverse of :func:`estimator_state`: construct with ``params``, set fitted attributes."""
    obj = cls(**params)
    for key, value in {**state, **arrays}.items():
        setattr(obj, key, value)
    return obj
