"""``hashlearn index``: build, search and inspect the one searcher from the command line.

::

    hashlearn index build EMB.npy --hasher itq --bits 256 [--metric cosine|ip|euclidean] --out DIR
    hashlearn index search DIR QUERIES.npy -k 10 [--overfetch 16] [--out RESULT.npy]
    hashlearn index info DIR

The index is an :class:`~hashlearn.embeddings.EmbeddingIndex`, the preset of
:class:`hashlearn.Searcher` for dense embeddings: any registered hasher by name, a Hamming
shortlist of ``k * overfetch`` candidates, exact refinement by cosine similarity, inner
product or Euclidean distance. Results follow the library's one convention: similarities
largest first, distances smallest first. (A ``--scheduler`` option for a Dask build or
search belongs in ``build`` / ``search`` below: the same searcher over a
:class:`~hashlearn.distributed.ShardedIndex`.)

Inputs are ``.npy`` float matrices (memory-mapped), TEXMEX ``.fvecs`` files, or
ann-benchmarks HDF5 files (``.hdf5`` / ``.h5``: ``build`` reads the ``train`` dataset,
``search`` the ``test`` dataset). ``build`` reads the matrix in chunks (``--chunk-size``
rows), so memory stays bounded whatever its size: the hasher is fitted on a sample of
``--fit-size`` rows taken from evenly spaced blocks, an empty index is saved, and every
chunk is encoded and appended to it in place (:meth:`hashlearn.embeddings.EmbeddingIndex.open`).
The index is built in a temporary sibling directory and renamed into place at the end, so an
interrupted build never leaves a half-built index at ``--out``.

Errors (a wrong dimension or dtype, NaN, a missing or damaged index) are one line on stderr
and exit status 2.
"""

from __future__ import annotations

import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

from hashlearn.embeddings import EmbeddingIndex, check_embeddings
from hashlearn.hashers import available_hashers
from hashlearn.io import atomic_path

__all__ = ["index"]

_HDF5 = (".hdf5", ".h5")


class IndexCommandError(click.ClickException):
    """A user error of ``hashlearn index``: one line on stderr, exit status 2.

    Examples
    --------
    >>> err = IndexCommandError("q.npy has dimension 16;   the index holds 384-d vectors.")
    >>> err.exit_code, err.format_message()
    (2, 'q.npy has dimension 16; the index holds 384-d vectors.')
    """

    exit_code = 2

    def __init__(self, message: str):
        super().__init__(" ".join(str(message).split()))


def _one_line_errors(fn):
    """Turn the library's errors into one-line messages with exit status 2."""

    import functools

    @functools.wraps(fn)
    def wrapper(*args, **kwargs):
        try:
            return fn(*args, **kwargs)
        except click.ClickException:
            raise
        except (ValueError, TypeError, FileNotFoundError, OSError, RuntimeError) as exc:
            raise IndexCommandError(str(exc)) from None

    return wrapper


# ------------------------------------------------------------------------------ inputs


class Matrix:
    """Rows ``[start, stop)`` of an on-disk float matrix, read on demand.

    Examples
    --------
    >>> import numpy as np
    >>> X = np.arange(20.0).reshape(10, 2)
    >>> m = Matrix(10, 2, lambda a, b: X[a:b], "X")
    >>> m.sample(4, n_blocks=2)[:, 0].tolist()  # two blocks of two rows, evenly spaced
    [0.0, 2.0, 16.0, 18.0]
    """

    def __init__(self, n: int, d: int, read: Callable[[int, int], np.ndarray], label: str):
        self.n, self.d, self.read, self.label = n, d, read, label

    def sample(self, size: int, n_blocks: int = 32) -> np.ndarray:
        """About ``size`` rows from ``n_blocks`` evenly spaced blocks (all rows if fewer)."""
        if self.n <= size:
            return self.read(0, self.n)
        n_blocks = min(n_blocks, size)
        per = size // n_blocks
        starts = np.linspace(0, self.n - per, n_blocks).astype(np.int64)
        return np.concatenate([self.read(int(s), int(s) + per) for s in starts])


def open_matrix(path: Path, role: str) -> Matrix:
    """The matrix in ``path`` (.npy, .fvecs, or ann-benchmarks HDF5: ``train`` for the base,
    ``test`` for queries). Raises one-line-able errors for anything else."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{role} file {path} does not exist.")
    suffix = path.suffix.lower()
    if suffix == ".npy":
        try:
            arr = np.load(path, mmap_mode="r", allow_pickle=False)
        except (ValueError, OSError, EOFError) as exc:
            raise ValueError(f"{path} is not a readable .npy array: {exc}") from None
        if arr.dtype.kind != "f":
            raise TypeError(
                f"{path} holds dtype {arr.dtype}; {role} must be a float matrix "
                "(float16/32/64) of shape (n, d)."
            )
        if arr.ndim != 2:
            raise ValueError(f"{path} has shape {arr.shape}; {role} must be 2-D (n, d).")
        return Matrix(arr.shape[0], arr.shape[1], lambda a, b: np.asarray(arr[a:b]), str(path))
    if suffix == ".fvecs":
        from hashlearn.datasets import read_fvecs

        size = path.stat().st_size
        if size < 4:
            raise ValueError(f"{path} is empty or truncated; not an .fvecs file.")
        d = int(np.fromfile(path, dtype="<i4", count=1)[0])
        record = 4 + 4 * d
        if d < 1 or size % record:
            raise ValueError(
                f"{path} is not a valid .fvecs file (first dimension {d}, size {size} bytes)."
            )
        read_fvecs(path, count=1)  # checks the first record
        return Matrix(
            size // record, d, lambda a, b: read_fvecs(path, count=b - a, offset=a), str(path)
        )
    if suffix in _HDF5:
        try:
            import h5py
        except ImportError:
            raise ImportError(
                "reading HDF5 needs h5py: pip install h5py (or hashlearn[hdf5])."
            ) from None
        key = "train" if role == "embeddings" else "test"
        try:
            f = h5py.File(path, "r")
        except OSError as exc:
            raise ValueError(f"{path} is not a readable HDF5 file: {exc}") from None
        if key not in f:
            keys = sorted(f.keys())
            f.close()
            raise ValueError(
                f"{path} has no '{key}' dataset (found {keys}); expected an ann-benchmarks file."
            )
        dset = f[key]
        if dset.ndim != 2 or dset.dtype.kind != "f":
            shape, dtype = dset.shape, dset.dtype
            f.close()
            raise ValueError(
                f"{path}['{key}'] has shape {shape} dtype {dtype}; expected a float matrix."
            )
        return Matrix(dset.shape[0], dset.shape[1], lambda a, b: dset[a:b], f"{path}[{key}]")
    raise ValueError(
        f"{path}: unknown {role} format {suffix!r}; use .npy, .fvecs or ann-benchmarks .hdf5."
    )


def _save_npy(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` atomically (temporary sibling + rename); never through a symlink."""
    if path.is_symlink():
        raise ValueError(f"{path} is a symbolic link; refusing to write through it.")
    path.parent.mkdir(parents=True, exist_ok=True)
    with atomic_path(path) as tmp, open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)


def _progress(total: int, label: str):
    from tqdm.auto import tqdm

    return tqdm(total=total, desc=label, unit="vec", unit_scale=True, file=sys.stderr)


# -------------------------------------------------------------------------------- group


@click.group(name="index")
def index() -> None:
    """Build and search binary-code indexes over float embeddings (cosine, inner product or
    Euclidean)."""


def _count_option(flag: str, default: int | None, minimum: int = 1, help: str | None = None):
    """An integer option of at least ``minimum``; its default shown in ``--help``."""
    return click.option(
        flag,
        default=default,
        show_default=default is not None,
        type=click.IntRange(min=minimum),
        help=help,
    )


@index.command()
@click.argument("embeddings", type=click.Path(dir_okay=False, path_type=Path))
@click.option(
    "--out",
    "out",
    required=True,
    type=click.Path(file_okay=False, path_type=Path),
    help="Directory of the index to create.",
)
@click.option(
    "--hasher",
    default="itq",
    show_default=True,
    type=click.Choice(sorted(available_hashers())),
    help="Hash family; 'sign' is plain binary quantization.",
)
@_count_option("--bits", 256)
@click.option(
    "--metric",
    default="cosine",
    show_default=True,
    type=click.Choice(["cosine", "ip", "euclidean"]),
    help="Refine by cosine similarity, inner product (scores, largest first) or Euclidean "
    "distance (smallest first).",
)
@_count_option("--overfetch", 16, help="Default over-fetch factor saved with the index.")
@_count_option("--fit-size", 50_000, minimum=2, help="Rows the hasher is fitted on.")
@_count_option("--chunk-size", 65_536)
@_count_option("--seed", 0, minimum=0)
@click.option("--force", is_flag=True, help="Replace an existing index at --out.")
@_one_line_errors
def build(embeddings, out, hasher, bits, metric, overfetch, fit_size, chunk_size, seed, force):
    """Build an index from EMBEDDINGS (.npy, .fvecs or ann-benchmarks .hdf5 'train')."""
    out = Path(out)
    if out.is_symlink():
        raise IndexCommandError(f"{out} is a symbolic link; refusing to write through it.")
    if out.exists() and not force:
        raise IndexCommandError(f"{out} already exists; pass --force to replace it.")
    matrix = open_matrix(embeddings, "embeddings")
    if matrix.n == 0:
        raise IndexCommandError(f"{matrix.label} holds no vectors.")
    t0 = time.perf_counter()
    idx = EmbeddingIndex(hasher, n_bits=bits, metric=metric, overfetch=overfetch, random_state=seed)
    idx.fit(check_embeddings(matrix.sample(fit_size), "embeddings", "hashlearn index build"))
    t_fit = time.perf_counter() - t0
    tmp = out.parent / f".{out.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
    try:
        idx.save(tmp)
        opened = EmbeddingIndex.open(tmp)
        with _progress(matrix.n, "encoding") as bar:
            for start in range(0, matrix.n, chunk_size):
                chunk = matrix.read(start, min(start + chunk_size, matrix.n))
                try:
                    opened.add(chunk, chunk_size=chunk_size)
                except ValueError as exc:
                    raise ValueError(f"rows {start}..{start + len(chunk) - 1}: {exc}") from None
                bar.update(len(chunk))
        if out.exists():
            shutil.rmtree(out)
        os.rename(tmp, out)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    mem = opened.memory_per_vector()
    click.echo(
        f"built {out}: {matrix.n} vectors of dimension {matrix.d}, {hasher} {bits} bits, "
        f"{metric}; codes {mem['code']} B/vector (float {mem['float']} B); fit {t_fit:.1f} s, "
        f"total {time.perf_counter() - t0:.1f} s"
    )


@index.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@click.argument("queries", type=click.Path(dir_okay=False, path_type=Path))
@_count_option("-k", 10)
@_count_option(
    "--overfetch",
    None,
    help="Candidates rescored per query, as a multiple of k.  [default: the index's]",
)
@click.option(
    "--out",
    "out",
    default=None,
    type=click.Path(dir_okay=False, path_type=Path),
    help="Write the ids (int64, m x k) here and the scores next to it as <stem>.scores.npy; "
    "without it, print query, rank, id, score (a similarity, or a Euclidean distance) as "
    "tab-separated lines.",
)
@_count_option("--threads", None, help="Search threads.")
@click.option("--no-verify", is_flag=True, help="Skip the checksums of the index files.")
@_one_line_errors
def search(directory, queries, k, overfetch, out, threads, no_verify):
    """Search the index in DIRECTORY for the rows of QUERIES (.npy, .fvecs or .hdf5 'test')."""
    idx = EmbeddingIndex.load(directory, mmap=True, verify=not no_verify)
    matrix = open_matrix(queries, "queries")
    if matrix.d != idx.dim_:
        raise IndexCommandError(
            f"{matrix.label} has dimension {matrix.d}; the index at {directory} holds "
            f"{idx.dim_}-d vectors."
        )
    Q = check_embeddings(matrix.read(0, matrix.n), "queries", "hashlearn index search", idx.dim_)
    t0 = time.perf_counter()
    scores, ids = idx.search(Q, k, overfetch=overfetch, n_threads=threads)
    elapsed = time.perf_counter() - t0
    if out is not None:
        out = Path(out)
        _save_npy(out, ids)
        _save_npy(out.with_name(out.stem + ".scores.npy"), scores)
    else:
        lines = []
        for i in range(len(ids)):
            for r in range(k):
                if ids[i, r] >= 0:
                    lines.append(f"{i}\t{r}\t{ids[i, r]}\t{scores[i, r]:.6f}")
        if lines:
            click.echo("\n".join(lines))
    click.echo(
        f"{len(Q)} queries, k={k}, overfetch={overfetch or idx.overfetch}: "
        f"{elapsed:.3f} s ({len(Q) / max(elapsed, 1e-9):.0f} queries/s)",
        err=True,
    )


@index.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@_one_line_errors
def info(directory):
    """Describe the index in DIRECTORY."""
    idx = EmbeddingIndex.load(directory, mmap=True, verify=False)
    mem = idx.memory_per_vector()
    disk = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    rows = [
        ("hasher", idx.hasher_name),
        ("bits", idx.n_bits),
        ("metric", idx.metric),
        ("scores", "distances, smallest first" if idx.metric == "euclidean" else "similarities"),
        ("overfetch", idx.overfetch),
        ("vectors", len(idx)),
        ("dimension", idx.dim_),
        ("code bytes/vector", mem["code"]),
        ("scan RAM bytes/vector", mem["scan"]),
        ("float bytes/vector", mem["float"]),
        ("code / float memory", f"1/{mem['float'] / mem['code']:.1f}" if mem["code"] else "-"),
        ("disk bytes", disk),
    ]
    width = max(len(name) for name, _ in rows)
    click.echo("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
