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
    "claims_overview",
    "write_json",
    "markdown_table",
    "PAPER_LSH",
    "LIBRARY_LSH",
    "lsh_specs",
]

REAL_DATASETS = ("digits", "fashion-mnist")

#: LSH as every reproduced paper defines it: Charikar's random hyperplanes, normals drawn
#: i.i.d. from N(0, I), through the origin (Charikar, STOC 2002, Sec. 3; the survey's
#: Sec. 4.1 eq. for h_r; Norouzi & Fleet 2011, Sec. 6; Jain et al. 2008, eq. 6 with A = I)
PAPER_LSH = {"directions": "gaussian", "center": False}
#: the name of the extra row running the library's stronger default (orthogonal, centred)
LIBRARY_LSH = "LSH (library default: orthogonal, centred)"


def lsh_specs(name: str = "LSH", **kw) -> list:
    """The papers' LSH (``name``, :data:`PAPER_LSH`) and the library's default as an extra,
    clearly named row (:data:`LIBRARY_LSH`); ``kw`` go to both
    :class:`~hashlearn.experiments.pipeline.MethodSpec`."""
    from hashlearn.experiments.pipeline import MethodSpec

    return [MethodSpec(name, "lsh", PAPER_LSH, **kw), MethodSpec(LIBRARY_LSH, "lsh", **kw)]


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


def _replace_section(text: str, name: str, markdown: str, *, first: bool = False) -> str:
    """``text`` with section ``name`` (between HTML-comment markers) set to ``markdown``; a
    new section goes at the end, or with ``first`` before the first existing section."""
    start, end = f"<!-- {name}:start -->", f"<!-- {name}:end -->"
    block = f"{start}\n{markdown.rstrip()}\n{end}"
    pattern = re.compile(re.escape(start) + ".*?" + re.escape(end), re.S)
    if pattern.search(text):
        return pattern.sub(lambda _: block, text)
    marker = re.search(r"^<!-- [^\n]*:start -->", text, re.M) if first else None
    if marker is None:
        return text.rstrip() + "\n\n" + block + "\n"
    return text[: marker.start()] + block + "\n\n" + text[marker.start() :]


def write_section(path: str | os.PathLike, name: str, markdown: str) -> None:
    """Replace (or append) section ``name`` of a markdown file between HTML-comment markers,
    then refresh the file's claims overview (:func:`claims_overview`) when any section
    holds a claims table.

    Atomic (temporary file + rename) and serialised with a lock file, so concurrent runs
    writing different sections never lose each other's.
    """
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    with open(path.with_name(path.name + ".lock"), "w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        text = path.read_text() if path.exists() else "# Measured results\n"
        text = _replace_section(text, name, markdown)
        overview = claims_overview(text)
        if overview:
            text = _replace_section(text, CLAIMS_SECTION, overview, first=True)
        tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
        tmp.write_text(text)
        os.replace(tmp, path)


# ------------------------------------------------------------------------------ claims overview

CLAIMS_SECTION = "claims"
CLAIMS_HEADER = ("paper", "claim", "data", "result", "margin", "95% CI", "n", "baseline as run")
#: the header of claims tables written before the intervals (single margins, no baseline)
LEGACY_CLAIMS_HEADER = ("paper", "claim", "data", "result", "margin", "seeds")
FINDINGS_HEADER = ("claim", "data", "finding")


def _tables(text: str, header: tuple[str, ...]) -> list[tuple[str, list[str]]]:
    """Every row of every markdown table in ``text`` whose header is ``header``, with the
    name of the marked section it sits in; the claims overview's own section is skipped."""
    head = "| " + " | ".join(header) + " |"
    rows: list[tuple[str, list[str]]] = []
    section: str | None = None
    in_table = False
    for line in text.splitlines():
        marker = re.fullmatch(r"<!-- (.+):(start|end) -->", line.strip())
        if marker:
            section = marker.group(1) if marker.group(2) == "start" else None
            in_table = False
        elif line.strip() == head:
            in_table = section not in (None, CLAIMS_SECTION)
        elif in_table and section is not None and line.startswith("|"):
            cells = [c.strip() for c in line.strip().strip("|").split(" | ")]
            if len(cells) == len(header) and not set(line) <= set("|-: "):
                rows.append((section, cells))
        else:
            in_table = False
    return rows


def claims_overview(text: str) -> str:
    """The "Claims" table of a results file: every row of every section's claims table
    (header :data:`CLAIMS_HEADER`, as :func:`~hashlearn.experiments.pipeline.write_claims`
    writes it) with the section it comes from, and for a claim that does not hold the
    finding of the ablation that explains it (rows of a table headed
    :data:`FINDINGS_HEADER`, matched on claim and data). Rows of sections written before
    the intervals (:data:`LEGACY_CLAIMS_HEADER`) are kept, marked as such: their result is
    a single margin's sign, not a verdict. Empty when no section has claims."""
    claims = _tables(text, CLAIMS_HEADER)
    legacy = [
        (
            section,
            [
                *cells[:3],
                f"{cells[3]} (sign only, no interval)",
                cells[4],
                "not computed (run before the intervals)",
                cells[5],
                "not recorded",
            ],
        )
        for section, cells in _tables(text, LEGACY_CLAIMS_HEADER)
    ]
    claims += legacy
    if not claims:
        return ""
    findings = {(c[0], c[1]): c[2] for _, c in _tables(text, FINDINGS_HEADER)}
    counts = {v: sum(cells[3] == v for _, cells in claims) for v in ("holds", "fails", "tie")}
    rows = [
        [*cells, section, "" if cells[3] == "holds" else findings.get((cells[1], cells[2]), "")]
        for section, cells in claims
    ]
    stale = (
        f" {len(legacy)} rows come from runs made before the intervals (one margin, its sign "
        "taken as the result): they await a re-run and count in none of these."
        if legacy
        else ""
    )
    return "\n".join(
        [
            "## Claims",
            "",
            f"Every claim the reproductions check, gathered from their sections below: "
            f"{counts['holds']} hold, {counts['fails']} fail, {counts['tie']} tie, of "
            f"{len(claims)}.{stale} The margin is the mean paired difference (method minus "
            "the baseline as run, over n seeds or partitions, signed so that positive is the "
            "paper's direction); 95% CI is Student's paired t interval of that mean "
            "(`hashlearn.experiments._stats`). A claim holds when the interval lies above 0, "
            "fails when it lies below 0, and is a tie otherwise; 'why not' gives the "
            "ablation's finding for a claim that does not hold.",
            "",
            markdown_table([*CLAIMS_HEADER, "section", "why not (ablation)"], rows),
        ]
    )


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
