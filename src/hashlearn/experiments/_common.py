"""What the reproductions share: loading the real datasets and a user's data, writing reports."""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np

from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist

__all__ = [
    "REAL_DATASETS",
    "load_real",
    "load_user_data",
    "available_real",
    "write_section",
    "write_json",
    "markdown_table",
]

REAL_DATASETS = ("digits", "fashion-mnist")


def available_real(data_dir: str | os.PathLike | None = None) -> list[str]:
    """The real datasets present on this machine (digits always is)."""
    names = ["digits"]
    if fashion_mnist_available(data_dir):
        names.append("fashion-mnist")
    return names


def load_real(
    name: str, data_dir: str | os.PathLike | None = None
) -> tuple[np.ndarray, np.ndarray]:
    """``(X float32, y int64)`` of ``"digits"`` or ``"fashion-mnist"`` (raw pixel values).

    Fashion-MNIST is its 60k training rows followed by its 10k test rows.
    """
    if name == "digits":
        return load_digits()
    if name == "fashion-mnist":
        return load_fashion_mnist(data_dir, subset="all")
    raise ValueError(f"Unknown dataset {name!r}; expected one of {REAL_DATASETS}.")


def load_user_data(path: str | os.PathLike) -> tuple[np.ndarray, np.ndarray | None]:
    """``(X, y or None)`` from a user's file for ``hashlearn reproduce NAME --data FILE``.

    ``.npy``: the rows ``X`` (no labels); ``.npz``: arrays ``X`` and optionally ``y``;
    ``.h5`` / ``.hdf5``: datasets ``X`` and optionally ``y``, or an ann-benchmarks file's
    ``train`` rows. Read without pickle; a missing array raises ``ValueError``.
    """
    path = Path(path)
    suffix = path.suffix.lower()
    if suffix == ".npy":
        return np.load(path, allow_pickle=False), None
    if suffix == ".npz":
        with np.load(path, allow_pickle=False) as f:
            if "X" not in f:
                raise ValueError(f"{path} holds no array 'X' (found {sorted(f.files)}).")
            return f["X"], (f["y"] if "y" in f else None)
    if suffix in (".h5", ".hdf5"):
        import h5py

        with h5py.File(path, "r") as f:
            name = "X" if "X" in f else "train" if "train" in f else None
            if name is None:
                raise ValueError(f"{path} holds no dataset 'X' or 'train' (found {sorted(f)}).")
            return f[name][()], (f["y"][()] if "y" in f else None)
    raise ValueError(f"--data must be a .npy, .npz, .h5 or .hdf5 file. Got {path.name!r}.")


def write_section(path: str | os.PathLike, name: str, markdown: str) -> None:
    """Replace (or append) section ``name`` of a markdown file between HTML-comment markers.

    Atomic (temporary file + rename) and serialised with a lock file, so concurrent runs
    writing different sections never lose each other's.
    """
    path = Path(path)
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else "# Measured results\n"
        pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
        text = (
            pattern.sub(lambda _: block, text)
            if pattern.search(text)
            else (text.rstrip() + "\n\n" + block + "\n")
        )
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


def write_json(path: str | os.PathLike, data: Any) -> None:
    """Write ``data`` as indented JSON (numpy scalars and arrays converted), atomically."""
    path = Path(path)

    def default(value: Any) -> Any:
        if isinstance(value, np.generic):
            return value.item()
        if isinstance(value, np.ndarray):
            return value.tolist()
        raise TypeError(f"not JSON-serialisable: {type(value).__name__}")

    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps(data, indent=1, default=default))
    os.replace(tmp, path)


def markdown_table(header, rows) -> str:
    """A GitHub markdown table; floats shown with 3 decimals."""

    def cell(c: Any) -> str:
        return f"{c:.3f}" if isinstance(c, float | np.floating) else str(c)

    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(cell(c) for c in row) + " |" for row in rows]
    return "\n".join(lines)
