"""Checkpoints of a reproduction: every finished task of :func:`~hashlearn.experiments.
pipeline.run_specs` (one seed and code length: its records and fitted models) kept on disk,
so that a long run that stops (Ctrl-C, a lost session, a full disk) goes on where it stopped
with ``hashlearn reproduce NAME --resume``.

A task is found again by a key hashed from what decides its result: the loop's name, the
specs as run (:meth:`MethodSpec.as_run`), the seeds and code lengths, the split's arrays,
the measures (and the values they close over) and the hashlearn version. Change the code of
a method without changing any of these, and ``--resume`` would reuse stale results: resume
only the command that stopped, with the same code.

Files (in ``OUT/checkpoints/``): ``KEY.json`` (the records' scalars, written last and
atomically, so a task counts as done only once it is whole), ``KEY.npz`` (their arrays,
read without pickle) and ``KEY-model-I`` (fitted models, through :func:`hashlearn.save`).
Records that hold anything else, or models that cannot be saved when models are wanted,
are not checkpointed: that task runs again.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import shutil
from collections.abc import Iterator, Sequence
from contextvars import ContextVar
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp

__all__ = ["Checkpoints", "current"]

_ACTIVE: ContextVar[Checkpoints | None] = ContextVar("hashlearn_checkpoints", default=None)
_ARRAY = "__array__"


def current() -> Checkpoints | None:
    """The checkpoints of the reproduction running in this context, if any."""
    return _ACTIVE.get()


def _digest_array(h, a: Any) -> None:
    if a is None:
        h.update(b"none")
    elif sp.issparse(a):
        a = sp.csr_matrix(a)
        h.update(repr(a.shape).encode())
        for part in (a.data, a.indices, a.indptr):
            _digest_array(h, part)
    else:
        a = np.ascontiguousarray(a)
        h.update(f"{a.dtype.str}{a.shape}".encode())
        h.update(a.tobytes())


def _split_digest(split: Any) -> str:
    h = hashlib.sha256()
    for name in ("X_db", "X_q", "y_db", "y_q", "train_rows"):
        _digest_array(h, getattr(split, name, None))
    for name in ("truth", "relevance"):
        for k, v in sorted(getattr(split, name, {}).items()):
            h.update(k.encode())
            _digest_array(h, v)
    return h.hexdigest()


def _measure_text(measure: Any) -> str:
    """A measure's name and the values it closes over (its settings)."""
    cells = getattr(measure, "__closure__", None) or ()
    values = []
    for cell in cells:
        try:
            v = cell.cell_contents
        except ValueError:  # an empty cell
            continue
        if callable(v):  # a function's repr holds its address: name it instead
            values.append(getattr(v, "__qualname__", type(v).__name__))
        else:
            values.append(repr(v.tolist()) if isinstance(v, np.ndarray) else repr(v))
    return f"{getattr(measure, '__qualname__', repr(measure))}({', '.join(values)})"


def _plain(value: Any) -> Any:
    """``value`` as a JSON cell, or ``None`` when it is not a scalar JSON keeps exactly
    (a numpy scalar keeps its dtype)."""
    if isinstance(value, np.generic) and value.dtype.kind in "biuf":
        return {"v": value.item(), "dtype": value.dtype.str}
    if value is None or isinstance(value, bool | int | float | str):
        return {"v": value}
    return None


def _value(cell: dict, arrays: dict) -> Any:
    if _ARRAY in cell:
        return arrays[cell[_ARRAY]]
    if "dtype" in cell:
        return np.dtype(cell["dtype"]).type(cell["v"])
    return cell["v"]


class Checkpoints:
    """The finished tasks of one reproduction, under ``directory``. ``resume=False`` clears
    the checkpoints an earlier run left there."""

    def __init__(self, directory: str | os.PathLike, *, resume: bool) -> None:
        self.directory = Path(directory)
        if self.directory.is_symlink():
            raise ValueError(f"{self.directory} is a symbolic link; refusing to write through it.")
        if not resume:
            self.clear()
        self.directory.mkdir(parents=True, exist_ok=True)
        self.restored = 0

    @contextlib.contextmanager
    def active(self) -> Iterator[Checkpoints]:
        """Make these the checkpoints :func:`run_specs` uses in this context."""
        token = _ACTIVE.set(self)
        try:
            yield self
        finally:
            _ACTIVE.reset(token)

    def clear(self) -> None:
        """Remove the checkpoint directory (the run is whole, or starts afresh)."""
        if self.directory.is_dir() and not self.directory.is_symlink():
            shutil.rmtree(self.directory)

    def keys(
        self, desc: str, tasks: Sequence[Sequence[tuple[int, int, Any]]], split: Any, measures
    ) -> list[str]:
        """The key of each task (``(seed, n_bits, spec)`` triples) run on ``split``; the
        split's arrays are hashed once for all of them."""
        from hashlearn import __version__

        digest, measured = _split_digest(split), [_measure_text(m) for m in measures]
        keys = []
        for task in tasks:
            runs = [[int(seed), int(bits), spec.name, spec.as_run()] for seed, bits, spec in task]
            text = json.dumps([__version__, desc, runs, digest, measured])
            keys.append(hashlib.sha256(text.encode()).hexdigest()[:24])
        return keys

    def load(self, key: str, with_models: bool) -> tuple[list[dict], list] | None:
        """The records and models of a finished task, or ``None`` when it must run."""
        from hashlearn.io import load

        manifest = self.directory / f"{key}.json"
        if not manifest.is_file() or manifest.is_symlink():
            return None
        try:
            meta = json.loads(manifest.read_text())
            arrays = {}
            if meta["arrays"]:
                with np.load(self.directory / f"{key}.npz", allow_pickle=False) as npz:
                    arrays = {name: npz[name] for name in npz.files}
            records = [
                {col: _value(cell, arrays) for col, cell in r.items()} for r in meta["records"]
            ]
            models: list = [None] * len(records)
            if with_models:
                if None in meta["models"]:
                    return None
                models = [load(self.directory / name) for name in meta["models"]]
        except (OSError, ValueError, KeyError, TypeError):
            return None  # damaged or from another version: run the task again
        self.restored += 1
        return records, models

    def save(self, key: str, records: Sequence[dict], models: Sequence[Any]) -> None:
        """Keep a finished task (skipped when its records or models cannot be kept)."""
        from hashlearn.experiments._common import write_json
        from hashlearn.io import save

        arrays: dict[str, Any] = {}
        rows = []
        for i, record in enumerate(records):
            row = {}
            for col, value in record.items():
                if isinstance(value, np.ndarray) and value.dtype != object:
                    arrays[f"{i}:{col}"] = value
                    row[col] = {_ARRAY: f"{i}:{col}"}
                elif (cell := _plain(value)) is not None:
                    row[col] = cell
                else:
                    return
            rows.append(row)
        if arrays:
            tmp = self.directory / f".{key}.{os.getpid()}.npz"
            with open(tmp, "wb") as f:
                np.savez(f, **arrays)  # no object arrays: nothing is pickled
            os.replace(tmp, self.directory / f"{key}.npz")
        names: list[str | None] = []
        for i, model in enumerate(models):
            try:
                save(model, self.directory / f"{key}-model-{i}")
                names.append(f"{key}-model-{i}")
            except (TypeError, ValueError, AttributeError, OSError):
                names.append(None)  # not persistable: a run that wants models reruns the task
        write_json(
            self.directory / f"{key}.json",
            {"records": rows, "arrays": bool(arrays), "models": names},
        )
