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
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import secrets
import shutil
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import numpy as np

__all__ = ["FORMAT_VERSION", "Persistable", "save", "load", "persistable", "write_dir", "read_dir"]

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
        raise ValueError(f"{path}: unknown class {meta['class']!r} in {_META}; known: "
                         f"{sorted(_REGISTRY)}.")
    try:
        return cls._from_state(meta["params"], meta["state"], arrays)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: the saved {meta['class']} is inconsistent: {exc}") from None


# ------------------------------------------------------------------------------------------


def _sha256(path: Path) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 22), b""):
            h.update(chunk)
    return h.hexdigest()


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


def _write_arrays(directory: Path, arrays: Mapping[str, np.ndarray], generation: int
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
        entries[name] = {"file": file, "shape": list(arr.shape), "dtype": arr.dtype.str,
                         "sha256": _sha256(directory / file)}
    return entries


def write_dir(path: str | os.PathLike, class_name: str, params: Mapping[str, Any],
              state: Mapping[str, Any], arrays: Mapping[str, np.ndarray]) -> None:
    """Write a save directory (see the module docstring for the crash-safety scheme)."""
    path = Path(path)
    old_meta = None
    if path.exists():
        if not (path / _META).is_file():
            raise FileExistsError(
                f"{path} exists and is not a hashlearn save (no {_META}); refusing to "
                "overwrite it."
            )
        old_meta = _read_meta(path)
    generation = 1 if old_meta is None else int(old_meta.get("generation", 0)) + 1
    meta: dict[str, Any] = {
        "format": FORMAT_NAME, "format_version": FORMAT_VERSION, "class": class_name,
        "generation": generation, "params": dict(params), "state": dict(state),
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


def read_dir(path: str | os.PathLike, *, mmap: bool = False, verify: bool = True
             ) -> tuple[dict[str, Any], dict[str, np.ndarray]]:
    """Read a save directory: ``(meta, arrays)``; every check failure is a ``ValueError``."""
    path = Path(path)
    meta = _read_meta(path)
    arrays = {}
    for name, entry in meta["arrays"].items():
        file = path / entry["file"]
        if not file.is_file():
            raise ValueError(f"{path}: array file {entry['file']} is missing.")
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
