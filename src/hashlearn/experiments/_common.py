"""What the reproductions share: loading the real datasets, splits, writing reports."""

from __future__ import annotations

import fcntl
import json
import os
import re
from pathlib import Path
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist

__all__ = [
    "REAL_DATASETS",
    "load_real",
    "available_real",
    "split_queries",
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


def split_queries(
    n: int,
    n_queries: int,
    random_state=None,
    *,
    y: np.ndarray | None = None,
    per_class: bool = False,
) -> tuple[np.ndarray, np.ndarray]:
    """``(database rows, query rows)``: ``n_queries`` random held-out queries (or that many
    per class with ``per_class=True``), the rest the database; both sorted."""
    rng = check_random_state(random_state)
    if per_class:
        if y is None:
            raise ValueError("per_class=True needs labels y.")
        query = np.concatenate(
            [rng.permutation(np.flatnonzero(y == c))[:n_queries] for c in np.unique(y)]
        )
    else:
        query = rng.choice(n, size=min(n_queries, n - 1), replace=False)
    mask = np.zeros(n, bool)
    mask[query] = True
    return np.flatnonzero(~mask), np.flatnonzero(mask)


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
