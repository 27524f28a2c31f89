"""``hashlearn index``: build, search and inspect the one searcher from the command line.

::

    hashlearn index build EMB.npy --hasher itq --bits N|auto [--metric cosine|ip|euclidean] --out DIR
        [--ranking hamming|asymmetric]
    hashlearn index search DIR QUERIES.npy -k 10 [--overfetch 16] [--out RESULT.npy]
    hashlearn index info DIR

    # the same searcher over a ShardedIndex on a Dask cluster
    hashlearn index build EMB.npy --out DIR --scheduler tcp://host:8786 [--shards N] ...
    hashlearn index search DIR QUERIES.npy -k 10 --scheduler tcp://host:8786
    # ... or on a LocalCluster of N workers started for the duration of the command
    hashlearn index build EMB.npy --out DIR --local-cluster 4 [--local-threads]

The index is an :class:`~hashlearn.embeddings.EmbeddingIndex`, the preset of
:class:`hashlearn.Searcher` for dense embeddings: any registered hasher by name, a Hamming
shortlist of ``k * overfetch`` candidates (or, with ``--ranking asymmetric``, the candidates
of highest asymmetric score against the query's projections: Gordo et al., TPAMI 2014),
exact refinement by cosine similarity, inner product or Euclidean distance. Results follow the library's one convention: similarities
largest first, distances smallest first.

Inputs are ``.npy`` float matrices (memory-mapped), TEXMEX ``.fvecs`` files, or
ann-benchmarks HDF5 files (``.hdf5`` / ``.h5``: ``build`` reads the ``train`` dataset,
``search`` the ``test`` dataset). ``build`` reads the matrix in chunks (``--chunk-size``
rows), so memory stays bounded whatever its size: the hasher is fitted on a sample of
``--fit-size`` rows taken from evenly spaced blocks, an empty index is saved, and every
chunk is encoded and appended to it in place (:meth:`hashlearn.embeddings.EmbeddingIndex.open`).
The index is built in a temporary sibling directory and renamed into place at the end, so an
interrupted build never leaves a half-built index at ``--out``.

**Sharded (Dask).** With ``--scheduler ADDRESS`` (or ``--local-cluster N``) ``build`` fits
the hasher on the client exactly as above (same sample, same options), then builds a
:class:`hashlearn.Searcher` over a :class:`~hashlearn.distributed.ShardedIndex` of
``--shards`` shards (default: one per worker). The input is a dask array of ``--chunk-size``
row blocks, each *read by a worker* from the file (checked and L2-normalised for cosine
exactly as :class:`~hashlearn.embeddings.EmbeddingIndex` does), then encoded and kept with
its vectors on that worker: the rows never pass through the client, so **the input file and
``--out`` must be on a filesystem the workers see** (same absolute path). A sharded ``DIR``
holds ``sharded.json`` (the command's manifest: hasher, bits, metric, overfetch, dimension,
vectors, shards and rows per shard) and ``searcher/``, a :meth:`hashlearn.Searcher.save` over
the sharded index whose ``shard-*`` / ``vectors-*`` directories the workers write
(``hashlearn.load(DIR / "searcher", client=client)`` loads it in Python). ``search`` on a
sharded ``DIR`` needs ``--scheduler`` or ``--local-cluster`` (the workers load the shards
from the path) and returns exactly the ids and scores of the local build; ``info`` reads the
manifest alone and needs no scheduler.

Errors (a wrong dimension or dtype, NaN, a missing or damaged index, an unreachable
scheduler, ``--shards`` without a scheduler) are one line on stderr and exit status 2.
"""

from __future__ import annotations

import contextlib
import json
import os
import secrets
import shutil
import sys
import time
from collections.abc import Callable
from pathlib import Path

import click
import numpy as np

from hashlearn.embeddings import (
    _RERANK,
    COARSE_QUANTIZERS,
    DEFAULT_COARSE_QUANTIZER,
    EmbeddingIndex,
    _normalized,
    bytes_per_vector,
    check_embeddings,
)
from hashlearn.hashers import available_hashers
from hashlearn.index.ivf import IVFIndex
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


# ------------------------------------------------------------------------------- Dask

_MANIFEST = "sharded.json"
_SEARCHER = "searcher"


def _cluster_options(fn):
    """``--scheduler`` / ``--local-cluster`` / ``--local-threads`` / ``--timeout``."""
    fn = click.option(
        "--timeout",
        default=10.0,
        show_default=True,
        type=click.FloatRange(min=0, min_open=True),
        help="Seconds to wait for the scheduler.",
    )(fn)
    fn = click.option(
        "--local-threads",
        is_flag=True,
        help="With --local-cluster: workers are threads of this process, not processes.",
    )(fn)
    fn = _count_option(
        "--local-cluster",
        None,
        help="Start a Dask LocalCluster of this many workers for the command.",
    )(fn)
    return click.option(
        "--scheduler",
        default=None,
        help="Address of a Dask scheduler (tcp://host:8786): build or search a sharded index.",
    )(fn)


@contextlib.contextmanager
def _dask_client(scheduler: str | None, local_cluster: int | None, threads: bool, timeout: float):
    """A ``distributed.Client`` for ``--scheduler`` or a ``LocalCluster`` of ``local_cluster``
    workers (closed on exit); ``None`` when neither is given."""
    if scheduler is not None and local_cluster is not None:
        raise IndexCommandError("pass --scheduler or --local-cluster, not both.")
    if scheduler is None and local_cluster is None:
        if threads:
            raise IndexCommandError("--local-threads needs --local-cluster N.")
        yield None
        return
    from hashlearn.distributed import connect

    if scheduler is not None:
        client = connect(scheduler, timeout=timeout)
        try:
            with client.as_current():  # distributed.wait inside ShardedIndex needs a current one
                yield client
        finally:
            client.close()
        return
    from distributed import Client, LocalCluster

    cluster = LocalCluster(
        n_workers=local_cluster,
        threads_per_worker=1,
        processes=not threads,
        dashboard_address=":0",
    )
    try:
        with Client(cluster, set_as_default=False) as client, client.as_current():
            yield client
    finally:
        cluster.close()


def _read_rows(path: str, start: int, stop: int, cosine: bool) -> np.ndarray:
    """Rows ``[start, stop)`` of the embeddings file, as ``EmbeddingIndex.add`` prepares them
    (finite float32, L2-normalised for cosine); run by a Dask worker."""
    chunk = open_matrix(Path(path), "embeddings").read(start, stop)
    try:
        X = check_embeddings(chunk, "embeddings", "hashlearn index build")
    except ValueError as exc:
        raise ValueError(f"rows {start}..{stop - 1}: {exc}") from None
    return _normalized(X) if cosine else X


def _dask_rows(matrix: Matrix, path: Path, chunk_size: int, cosine: bool):
    """The rows of ``matrix`` as a dask array of ``chunk_size``-row blocks, each read by the
    worker that computes it (:func:`_read_rows`)."""
    import dask
    import dask.array as da

    blocks = [
        da.from_delayed(
            dask.delayed(_read_rows, pure=True)(
                str(path), a, min(a + chunk_size, matrix.n), cosine
            ),
            shape=(min(a + chunk_size, matrix.n) - a, matrix.d),
            dtype=np.float32,
        )
        for a in range(0, matrix.n, chunk_size)
    ]
    return da.concatenate(blocks, axis=0)


def _read_manifest(directory: Path) -> dict | None:
    """The manifest of a sharded save, or ``None`` for a local index."""
    file = Path(directory) / _MANIFEST
    if not file.is_file():
        return None
    try:
        manifest = json.loads(file.read_text())
    except ValueError as exc:
        raise ValueError(f"{file} is not a readable manifest: {exc}") from None
    keys = ("hasher", "bits", "metric", "overfetch", "vectors", "dimension", "rows_per_shard")
    if not isinstance(manifest, dict) or not all(key in manifest for key in keys):
        raise ValueError(f"{file} is not a valid manifest: it needs the keys {list(keys)}.")
    return manifest


def _write_manifest(directory: Path, manifest: dict) -> None:
    file = Path(directory) / _MANIFEST
    with atomic_path(file) as tmp, open(tmp, "w") as f:
        json.dump(manifest, f, indent=2)


def _build_sharded(client, idx: EmbeddingIndex, matrix: Matrix, path, shards, chunk_size, tmp):
    """Build a Searcher over a ShardedIndex of ``shards`` shards with the fitted preset
    ``idx``'s hasher and refine stage from the rows of ``matrix`` (read by the workers); save
    it to ``tmp / searcher``. Returns the rows per shard."""
    from hashlearn.distributed import ShardedIndex
    from hashlearn.search import Searcher

    if shards is None:
        shards = max(1, len(client.scheduler_info()["workers"]))
    assert idx.n_bits_ is not None, "fitted"  # idx.fit ran before
    sharded = ShardedIndex(client, n_bits=idx.n_bits_, n_shards=shards)
    # EmbeddingIndex's refine stage (metric, screen=False), so both give the same numbers
    searcher = Searcher(idx.hasher_, sharded, rerank=_RERANK[idx.metric], screen=False)
    searcher.add(_dask_rows(matrix, Path(path).resolve(), chunk_size, idx.metric == "cosine"))
    tmp.mkdir()
    searcher.save(tmp / _SEARCHER)
    return sharded.shard_sizes()


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


def _count_or_word(value: str, flag: str, words: tuple[str, ...]) -> int | str:
    """``value`` of ``flag``: one of ``words`` as it is, else a positive integer."""
    if value in words:
        return value
    if not value.isdigit() or int(value) < 1:
        allowed = ", ".join(["a positive integer", *map(repr, words[:-1])])
        raise IndexCommandError(f"{flag} must be {allowed} or {words[-1]!r}; got {value!r}.")
    return int(value)


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
@click.option(
    "--bits",
    default="auto",
    show_default=True,
    metavar="N|auto",
    help="Code length; auto: 256 (at most the dimension), or the dimension for residual "
    "lists over 3M vectors or more with itq, pca or sign (EmbeddingIndex's n_bits).",
)
@click.option(
    "--metric",
    default="cosine",
    show_default=True,
    type=click.Choice(["cosine", "ip", "euclidean"]),
    help="Refine by cosine similarity, inner product (scores, largest first) or Euclidean "
    "distance (smallest first).",
)
@_count_option("--overfetch", 16, help="Default over-fetch factor saved with the index.")
@click.option(
    "--ranking",
    default="hamming",
    show_default=True,
    type=click.Choice(["hamming", "asymmetric"]),
    help="Shortlist by Hamming distance of the query's code, or by the asymmetric score of "
    "its projections against the codes (more true neighbours per candidate; local index only).",
)
@click.option(
    "--coarse",
    default="auto",
    show_default=True,
    metavar="N|auto|none",
    help="An IVF coarse stage of N lists (--coarse-quantizer), probed as k x overfetch needs, built in "
    "memory, then saved; auto: about 4 sqrt(n) lists from 100,000 vectors up, a flat scan "
    "below (and on a sharded build); none: a flat scan.",
)
@click.option(
    "--coarse-quantizer",
    default=DEFAULT_COARSE_QUANTIZER,
    show_default=True,
    type=click.Choice(list(COARSE_QUANTIZERS)),
    help="The coarse lists: k-majority lists of the codes, k-means lists of the projections, "
    "or k-means (residual) or k-majority (residual-k-majority) lists holding residual codes "
    "ranked by RaBitQ's estimator.",
)
@_count_option("--fit-size", 50_000, minimum=2, help="Rows the hasher is fitted on.")
@_count_option("--chunk-size", 65_536)
@_count_option("--seed", 0, minimum=0)
@click.option("--force", is_flag=True, help="Replace an existing index at --out.")
@_count_option("--shards", None, help="Shards of a sharded build.  [default: one per worker]")
@_cluster_options
@_one_line_errors
def build(
    embeddings,
    out,
    hasher,
    bits,
    metric,
    overfetch,
    ranking,
    coarse,
    coarse_quantizer,
    fit_size,
    chunk_size,
    seed,
    force,
    shards,
    scheduler,
    local_cluster,
    local_threads,
    timeout,
):
    """Build an index from EMBEDDINGS (.npy, .fvecs or ann-benchmarks .hdf5 'train')."""
    out = Path(out)
    if shards is not None and scheduler is None and local_cluster is None:
        raise IndexCommandError("--shards needs --scheduler ADDRESS or --local-cluster N.")
    if ranking != "hamming" and (scheduler is not None or local_cluster is not None):
        raise IndexCommandError("--ranking asymmetric needs a local index (no --scheduler).")
    sharded = scheduler is not None or local_cluster is not None
    bits = _count_or_word(bits, "--bits", ("auto",))
    coarse = _count_or_word(coarse, "--coarse", ("auto", "none"))
    if coarse == "none" or (coarse == "auto" and sharded):
        coarse = None
    if coarse is not None and sharded:
        raise IndexCommandError("--coarse N needs a local index (no --scheduler).")
    if out.is_symlink():
        raise IndexCommandError(f"{out} is a symbolic link; refusing to write through it.")
    if out.exists() and not force:
        raise IndexCommandError(f"{out} already exists; pass --force to replace it.")
    matrix = open_matrix(embeddings, "embeddings")
    if matrix.n == 0:
        raise IndexCommandError(f"{matrix.label} holds no vectors.")
    with _dask_client(scheduler, local_cluster, local_threads, timeout) as client:
        t0 = time.perf_counter()
        idx = EmbeddingIndex(
            hasher,
            n_bits=bits,
            metric=metric,
            overfetch=overfetch,
            random_state=seed,
            ranking=ranking,
            coarse=coarse,
            coarse_quantizer=coarse_quantizer,
        )
        idx.fit(check_embeddings(matrix.sample(fit_size), "embeddings", "hashlearn index build"))
        if coarse is not None and client is None:  # lists for the whole matrix, not a chunk
            rows = max(idx.coarse_sample_size(matrix.n), 1)
            idx.train_coarse(matrix.sample(rows), n_total=matrix.n)  # auto: maybe flat
        flat = not isinstance(idx.codes_, IVFIndex)
        t_fit = time.perf_counter() - t0
        tmp = out.parent / f".{out.name}.building-{os.getpid()}-{secrets.token_hex(4)}"
        try:
            if client is None:
                if flat:  # appended to the save chunk by chunk
                    idx.save(tmp)
                opened = EmbeddingIndex.open(tmp) if flat else idx.reserve(matrix.n)
                with _progress(matrix.n, "encoding") as bar:
                    for start in range(0, matrix.n, chunk_size):
                        chunk = matrix.read(start, min(start + chunk_size, matrix.n))
                        try:
                            opened.add(chunk, chunk_size=chunk_size)
                        except ValueError as exc:
                            raise ValueError(
                                f"rows {start}..{start + len(chunk) - 1}: {exc}"
                            ) from None
                        bar.update(len(chunk))
                if not flat:
                    idx.calibrate_probe()  # the residual lists' probe, sized on every row
                    idx.save(tmp)
            else:
                rows = _build_sharded(client, idx, matrix, embeddings, shards, chunk_size, tmp)
                manifest = {"hasher": hasher, "bits": idx.n_bits_, "metric": metric}
                manifest.update(overfetch=overfetch, vectors=matrix.n, dimension=matrix.d)
                manifest.update(shards=len(rows), rows_per_shard=rows, searcher=_SEARCHER)
                _write_manifest(tmp, manifest)
            if out.exists():
                shutil.rmtree(out)
            os.rename(tmp, out)
        except BaseException:
            shutil.rmtree(tmp, ignore_errors=True)
            raise
    mem = idx.memory_per_vector()  # per vector, from the fitted preset's dimension and bits
    where = "" if client is None else f", {len(rows)} shards of {rows} rows"
    lists = idx.codes_.list_sizes if isinstance(idx.codes_, IVFIndex) else ()
    coarse_note = f", IVF coarse stage ({len(lists)} lists)" if len(lists) else ""
    click.echo(
        f"built {out}: {matrix.n} vectors of dimension {matrix.d}, {hasher} {idx.n_bits_} bits, "
        f"{metric}, {ranking} ranking{coarse_note}{where}; codes {mem['code']} B/vector (float {mem['float']} B); "
        f"fit {t_fit:.1f} s, "
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
@_cluster_options
@_one_line_errors
def search(
    directory,
    queries,
    k,
    overfetch,
    out,
    threads,
    no_verify,
    scheduler,
    local_cluster,
    local_threads,
    timeout,
):
    """Search the index in DIRECTORY for the rows of QUERIES (.npy, .fvecs or .hdf5 'test')."""
    manifest = _read_manifest(directory)
    distributed = scheduler is not None or local_cluster is not None
    if manifest is None and distributed:
        raise IndexCommandError(
            f"{directory} is a local index; --scheduler / --local-cluster apply to a sharded one."
        )
    if manifest is not None and not distributed:
        raise IndexCommandError(
            f"{directory} is a sharded index; pass --scheduler ADDRESS or --local-cluster N."
        )
    matrix = open_matrix(queries, "queries")
    with _dask_client(scheduler, local_cluster, local_threads, timeout) as client:
        if client is None:
            idx = EmbeddingIndex.load(directory, mmap=True, verify=not no_verify)
            dim, default_overfetch = idx.dim_, idx.overfetch
        else:
            from hashlearn.search import Searcher

            sharded = Searcher.load(
                Path(directory) / _SEARCHER, verify=not no_verify, client=client
            )
            dim, default_overfetch = manifest["dimension"], manifest["overfetch"]
        if matrix.d != dim:
            raise IndexCommandError(
                f"{matrix.label} has dimension {matrix.d}; the index at {directory} holds "
                f"{dim}-d vectors."
            )
        Q = check_embeddings(matrix.read(0, matrix.n), "queries", "hashlearn index search", dim)
        factor = default_overfetch if overfetch is None else overfetch
        t0 = time.perf_counter()
        if client is None:
            scores, ids = idx.search(Q, k, overfetch=factor, n_threads=threads)
        else:  # queries prepared as EmbeddingIndex.search prepares them
            Q = _normalized(Q) if manifest["metric"] == "cosine" else Q
            scores, ids = sharded.search(Q, k, k_factor=factor, n_threads=threads)
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
        f"{len(Q)} queries, k={k}, overfetch={factor}: "
        f"{elapsed:.3f} s ({len(Q) / max(elapsed, 1e-9):.0f} queries/s)",
        err=True,
    )


@index.command()
@click.argument("directory", type=click.Path(file_okay=False, path_type=Path))
@_one_line_errors
def info(directory):
    """Describe the index in DIRECTORY (a sharded one from its manifest: no scheduler)."""
    m = _read_manifest(directory)
    if m is None:
        idx = EmbeddingIndex.load(directory, mmap=True, verify=False)
        m = {"hasher": idx.hasher_name, "bits": idx.n_bits_, "metric": idx.metric}
        m.update(overfetch=idx.overfetch, vectors=len(idx), dimension=idx.dim_)
        m.update(ranking=idx.ranking)
        if isinstance(idx.codes_, IVFIndex):
            sizes = idx.codes_.list_sizes
            kind = idx.coarse_quantizer
            m.update(
                coarse=f"IVF, {len(sizes)} {kind} lists ({idx.coarse}), "
                f"{sizes.max()} codes in the largest"
            )
        mem = idx.memory_per_vector()
    else:
        mem = bytes_per_vector(m["bits"], m["dimension"])
    disk = sum(p.stat().st_size for p in Path(directory).rglob("*") if p.is_file())
    euclidean = m["metric"] == "euclidean"
    rows = [
        ("hasher", m["hasher"]),
        ("bits", m["bits"]),
        ("metric", m["metric"]),
        ("scores", "distances, smallest first" if euclidean else "similarities"),
        ("overfetch", m["overfetch"]),
        ("ranking", m.get("ranking", "hamming")),
        ("coarse stage", m.get("coarse", "none (a flat scan)")),
        ("vectors", m["vectors"]),
        ("dimension", m["dimension"]),
    ]
    if "rows_per_shard" in m:
        rows.append(("sharded", f"{len(m['rows_per_shard'])} shards (Dask)"))
        rows.append(("rows per shard", " ".join(map(str, m["rows_per_shard"]))))
    rows += [
        ("code bytes/vector", mem["code"]),
        ("scan RAM bytes/vector", mem["scan"]),
        ("coarse bytes/vector", mem.get("coarse", 0)),
        ("float bytes/vector", mem["float"]),
        ("code / float memory", f"1/{mem['float'] / mem['code']:.1f}" if mem["code"] else "-"),
        ("disk bytes", disk),
    ]
    width = max(len(name) for name, _ in rows)
    click.echo("\n".join(f"{name:<{width}}  {value}" for name, value in rows))
