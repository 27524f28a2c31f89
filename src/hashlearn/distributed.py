"""Dask: encode a dask array with a fitted hasher, and a sharded index whose shards -- codes
and, when it refines, the vectors -- live on the workers.

A :class:`ShardedIndex` is an index like the local ones (faiss's ``IndexBinaryShards``):
made empty (``ShardedIndex(client, n_bits=64, n_shards=2)``), then ``add``, ``search``,
``range_search``, ``remove``, ``save`` / ``load``. Each shard is an ordinary hashlearn index
(FlatIndex by default, or MultiIndexHashing, ...) built *on* a worker and kept there as a
Dask future, so codes never travel back to the client. A search sends the (small) query
codes to every shard, each worker returns its own exact top-k ``(D, I)``, and the client
merges the ``n_shards`` lists by ``(distance, id)``. Since every shard's list is exact and
complete up to k, the merged list equals the single-machine index's result, ties included.

With :meth:`ShardedIndex.attach_refiner` each shard also keeps the vectors of its ids in a
:class:`hashlearn.rerank.refiner.Refiner` on the same worker, and
:meth:`ShardedIndex.refine_search` shortlists and refines in two rounds -- the global
Hamming top-``n_candidates`` merged from the shards' own, then each shard refines the
candidates it holds -- so a :class:`hashlearn.Searcher` over it returns what a local one
returns, and float vectors never cross the network at search time (only queries, ids and
scores). See ``docs/distributed.md``.

Only public Dask APIs are used (``Client.scatter``/``submit``/``gather``,
``dask.array.map_blocks``, ``to_delayed``).
"""

from __future__ import annotations

import os
import re
from collections.abc import Sequence

import numpy as np

from hashlearn._utils.seqlock import SeqLock
from hashlearn._utils.validation import check_codes, check_ids, check_int, check_k
from hashlearn.index._storage import ID_MAX
from hashlearn.index.base import make_index

__all__ = ["connect", "encode", "ShardedIndex", "merge_topk"]


def connect(address: str, *, timeout: float = 10.0):
    """A ``distributed.Client`` for the scheduler at ``address``; fails within ``timeout`` s.

    An unreachable scheduler raises ``ConnectionError`` naming the address, instead of
    Dask's default of retrying for a long time.
    """
    from distributed import Client

    if not isinstance(address, str) or not address:
        raise ValueError(
            f"address must be a scheduler address such as 'tcp://host:8786'. Got {address!r}."
        )
    if not (isinstance(timeout, (int, float)) and timeout > 0):
        raise ValueError(f"timeout must be a positive number of seconds. Got {timeout!r}.")
    try:
        return Client(address, timeout=f"{float(timeout)}s", set_as_default=False)
    except (OSError, TimeoutError) as exc:
        raise ConnectionError(
            f"could not reach the Dask scheduler at {address!r} within {timeout} s: {exc}"
        ) from None


def encode(hasher, X):
    """Encode a dask array ``X (n, d)`` row-block by row-block with a fitted hasher.

    Returns a lazy dask array of packed codes ``uint8 (n, ceil(n_bits / 8))`` with X's row
    chunks (``map_blocks``); X must be chunked along rows only.
    """
    import dask.array as da

    if not isinstance(X, da.Array):
        raise TypeError(f"X must be a dask.array.Array. Got {type(X).__name__} instead.")
    if X.ndim != 2:
        raise ValueError(f"X must be 2-D. Got shape {X.shape} instead.")
    if len(X.chunks[1]) != 1:
        X = X.rechunk({1: -1})
    code_size = (int(getattr(hasher, "n_bits_", hasher.n_bits)) + 7) // 8
    return X.map_blocks(hasher.encode, dtype=np.uint8, chunks=(X.chunks[0], (code_size,)))


def _top_columns(D: np.ndarray, I: np.ndarray, k: int) -> np.ndarray:
    """Column order of each row's ``k`` smallest ``(D, I)``, ``-1`` ids last."""
    big = np.iinfo(np.int64).max
    i_key = np.where(I < 0, big, I)
    if np.issubdtype(D.dtype, np.floating):
        d_key = np.where(I < 0, np.inf, D)
    else:
        d_key = np.where(I < 0, big, D.astype(np.int64))
    return np.lexsort((i_key, d_key), axis=1)[:, :k]


def merge_topk(D: np.ndarray, I: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists concatenated along axis 1 into one top-k by (distance, id).

    ``-1`` padding sorts after every real result and keeps its distance (``-1`` for Hamming
    distances, the refiner's padding for float scores). Integer distances come back int32,
    float ones float32.
    """
    order = _top_columns(D, I, k)
    floating = np.issubdtype(D.dtype, np.floating)
    D_out = np.take_along_axis(D, order, axis=1).astype(np.float32 if floating else np.int32)
    I_out = np.take_along_axis(I, order, axis=1).astype(np.int64)
    if D_out.shape[1] < k:  # fewer columns than k (single empty shard)
        pad = k - D_out.shape[1]
        D_out = np.pad(D_out, ((0, 0), (0, pad)), constant_values=np.inf if floating else -1)
        I_out = np.pad(I_out, ((0, 0), (0, pad)), constant_values=-1)
    return D_out, I_out


def _split(lengths: Sequence[int], m: int) -> np.ndarray:
    """Rows of an add of ``m`` per shard: ``m // n`` each, one more for the ``m % n``
    smallest shards (ties by shard number), so shards stay within a few rows of each other."""
    n = len(lengths)
    sizes = np.full(n, m // n, np.int64)
    sizes[np.argsort(np.asarray(lengths), kind="stable")[: m % n]] += 1
    return sizes


def _is_dask(x) -> bool:
    return hasattr(x, "__dask_graph__")


# ---------------------------------------------------------------- the object on a worker


class _Shard:
    """One shard, held by a worker: a binary-code index and, when the sharded index refines,
    the hasher and a :class:`~hashlearn.rerank.refiner.Refiner` of the same ids' vectors."""

    __slots__ = ("index", "hasher", "refiner")

    def __init__(self, index, refiner_spec=None, refiner=None):
        self.index = index
        self.hasher = None if refiner_spec is None else refiner_spec[1]
        if refiner is None and refiner_spec is not None:
            refiner = _make_refiner(*refiner_spec)
        self.refiner = refiner

    def add(self, codes, ids, vectors) -> None:
        if self.refiner is not None:  # checked (features, dtype) before anything changes
            vectors = self.refiner.store.prepare(vectors, "vectors")
        if codes is None:
            codes = self.hasher.encode(vectors)
        self.index.add(np.ascontiguousarray(codes), ids=ids)
        if self.refiner is not None:
            self.refiner.store.add(vectors, ids)

    def remove(self, ids) -> None:
        self.index.remove(ids)
        if self.refiner is not None:
            self.refiner.remove(ids)


def _make_refiner(metric, hasher, screen):
    from hashlearn.rerank.refiner import Refiner

    return Refiner(metric, hasher=hasher, screen=screen)


class _Lazy:
    """A row block of codes and of vectors (``None`` where absent), each a numpy array or a
    dask ``Delayed`` block; the delayed ones are computed together on the worker that
    applies the block, with Dask's synchronous scheduler: the block's graph travels, its
    data never passes through the client."""

    def __init__(self, codes, vectors):
        self.codes, self.vectors = codes, vectors

    def compute(self):
        import dask

        parts = [self.codes, self.vectors]
        todo = [i for i, p in enumerate(parts) if _is_dask(p)]
        values = dask.compute(*(parts[i] for i in todo), scheduler="sync")
        for i, value in zip(todo, values, strict=True):
            parts[i] = value
        return (None if parts[0] is None else np.asarray(parts[0])), parts[1]


# ---------------------------------------------------------------- functions run on workers


def _new_shard(n_bits, index, index_params, refiner_spec):
    return _Shard(make_index(index, n_bits=n_bits, **index_params), refiner_spec)


def _build_shard(codes, ids, n_bits, index, index_params):
    shard = _new_shard(n_bits, index, index_params, None)
    shard.index.add(np.ascontiguousarray(codes), ids=ids)
    if hasattr(shard.index, "build"):
        shard.index.build()
    return shard


def _as_shard(obj):
    return obj if isinstance(obj, _Shard) else _Shard(obj)


def _load_shard(index_path, vectors_path, mmap, verify, refiner_spec):
    """A shard from its saved index and, for a refining index, its saved vectors (written by
    :func:`_save_shard`), restored into a new Refiner (every invariant checked)."""
    from hashlearn import io

    index = io.load(index_path, mmap=mmap, verify=verify)
    if vectors_path is None:
        return _Shard(index)
    shard = _Shard(index, refiner_spec)
    meta, arrays = io.read_dir(vectors_path, mmap=mmap, verify=verify)
    if meta["class"] != _VECTORS_CLASS:
        raise ValueError(f"{vectors_path} holds a {meta['class']}, not a shard's vectors.")
    shard.refiner.store.restore(meta["state"], arrays, direct=mmap == "direct")
    if not np.array_equal(shard.refiner.store.state.ids, index.ids):
        raise ValueError(f"{vectors_path}: the vectors' ids differ from the shard's codes' ids.")
    return shard


def _apply(shard, ops):
    """Apply logged operations in order: ``("add", codes, ids, vectors)``, ``("lazy",
    _Lazy, ids)`` and ``("remove", ids)``."""
    for op in ops:
        if op[0] == "add":
            shard.add(op[1], op[2], op[3])
        elif op[0] == "lazy":
            codes, vectors = op[1].compute()
            shard.add(codes, op[2], vectors)
        else:
            shard.remove(op[1])
    if ops and hasattr(shard.index, "build"):
        shard.index.build()
    return shard


def _search_shard(shard, queries, k, n_threads):
    return shard.index.search(queries, k, n_threads=n_threads)


def _range_shard(shard, queries, radius, n_threads):
    return shard.index.range_search(queries, radius, n_threads=n_threads)


def _refine_shard(shard, args):
    X, candidates, k, n_threads = args
    return shard.refiner.refine(X, candidates, k, n_threads=n_threads)


def _shard_len(shard):
    return len(shard.index)


def _shard_bits(shard):
    return int(shard.index.n_bits)


def _shard_next_id(shard):
    ids = shard.index.ids
    return int(ids[-1]) + 1 if len(ids) else 0


def _shard_holds(shard, ids):
    return np.isin(ids, shard.index.ids)


def _save_shard(shard, paths):
    """Save a shard's index (:func:`hashlearn.io.save`) and its Refiner's vectors
    (:func:`hashlearn.io.write_dir` of ``VectorStore.arrays()``), on its worker."""
    from hashlearn import io

    index_path, vectors_path = paths
    io.save(shard.index, index_path)
    if vectors_path is not None:
        state, arrays = shard.refiner.store.arrays()
        io.write_dir(vectors_path, _VECTORS_CLASS, {}, state, arrays)
    return len(shard.index)


def _settle(futures) -> None:
    """Wait until every future is done, through their own client (which need not be the
    default one: :func:`connect` makes none the default)."""
    from distributed import wait

    if futures:
        with futures[0].client.as_current():
            wait(futures)


def _wait(futures) -> None:
    """Wait for shard futures and raise the first build error -- without gathering the shards
    themselves to the client (they stay on their workers)."""
    _settle(futures)
    for future in futures:
        if future.status == "error":
            future.result()  # raises the worker's exception


_RECOVERABLE = ("lost", "cancelled", "error")
_MAX_ATTEMPTS = 3
_SHARD_NAME = re.compile(r"(shard|vectors)-[0-9]{5}-[0-9a-f]{12}")
_HASHER_NAME = re.compile(r"hasher-[0-9a-f]{12}")
_VECTORS_CLASS = "ShardVectors"  # a shard's kept vectors; read by _load_shard only


class _Source:
    """How to rebuild one shard: a base (nothing, client-side arrays, a dask block's lineage,
    a saved shard on a shared path, or an index object) plus the log of ``add`` / ``remove``
    calls made since (client-side codes and ids, vectors by reference, dask blocks as their
    lineage). A saved shard keeps the source it had before the save as ``fallback``, used
    when the save's directory is gone (deleted, or moved, as a composite's first save
    moves its temporary directory into place)."""

    def __init__(self, kind: str, payload, ops=None, fallback: _Source | None = None):
        self.kind, self.payload, self.ops = kind, payload, list(ops or [])
        self.fallback = fallback


class ShardedIndex:
    """An index split into ``n_shards`` shards held by Dask workers; exact fan-out search.

    Made empty like any index, then filled with :meth:`add` (numpy arrays, or dask arrays
    whose blocks are computed on the workers). Alternative constructors: :meth:`from_codes`
    (a numpy array on the client), :meth:`from_dask_array` (a dask array of codes, e.g. the
    output of :func:`encode`; blocks are never gathered), :meth:`from_shards` (indexes or
    futures of indexes) and :meth:`load` (a :meth:`save`). ``search`` and ``range_search``
    return exactly what one :class:`~hashlearn.index.flat.FlatIndex` over all codes
    returns, ties by id; ids follow the local indexes' conventions (distinct non-negative
    int64, automatic ones from one past the largest id ever added).

    Every shard remembers its *source*: nothing (an empty shard), the client's codes
    (``from_codes``), the dask array's lineage (``from_dask_array``), the saved shard on a
    shared path (``load``, and after ``save``), or the index object (``from_shards``), plus
    a log of the ``add`` / ``remove`` calls made since. When a worker is lost or the cluster
    restarts (``client.restart()``), the shards whose futures are gone are rebuilt from their
    source and the call is retried, so results stay those of one index over the current
    codes. Writers are serialised by a lock, and a search that overlapped a write runs
    again (a seqlock; the last try waits for the lock), so each result is that of one
    state of the whole index (for the writers of this client).

    Parameters
    ----------
    client : distributed.Client
    n_bits : int
        Code length.
    n_shards : int
        Number of shards (one per worker thread is the baseline, see ``docs/distributed.md``).
    index : str
        Registry name of each shard's index (:func:`hashlearn.index.base.make_index`).
    index_params : dict, optional
        Its parameters.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client, LocalCluster
    >>> from hashlearn.distributed import ShardedIndex
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> index = ShardedIndex(client, n_bits=8, n_shards=2)
    >>> codes = np.array([[0b0000], [0b0001], [0b0111], [0b1111]], np.uint8)
    >>> index.add(codes).tolist()
    [0, 1, 2, 3]
    >>> D, I = index.search(codes[:1], k=2)
    >>> D.tolist(), I.tolist()
    ([[0, 1]], [[0, 1]])
    >>> index.add(np.array([[0b0000]], np.uint8), ids=[10]).tolist()
    [10]
    >>> index.search(codes[:1], k=2)[1].tolist()
    [[0, 10]]
    >>> client.close(); cluster.close()
    """

    _sources: list[_Source | None]  # per shard; None: a future, cannot be rebuilt
    shards: list  # per shard, the future of its index on a worker

    def __init__(
        self,
        client,
        n_bits: int = 64,
        n_shards: int = 2,
        *,
        index: str = "flat",
        index_params: dict | None = None,
    ):
        n_shards = check_int(n_shards, "n_shards", "ShardedIndex")
        self._setup(client, n_bits, index, index_params, 0)
        make_index(index, n_bits=self.n_bits, **self.index_params)  # bad names fail here
        self._sources = [_Source("empty", None) for _ in range(n_shards)]
        self.shards = [self._submit_source(s) for s in range(n_shards)]
        _wait(self.shards)

    def _setup(self, client, n_bits, index, index_params, next_id) -> None:
        self.client = client
        self.n_bits = check_int(n_bits, "n_bits", "ShardedIndex")
        if not isinstance(index, str):
            raise TypeError(f"index must be an index registry name. Got {type(index).__name__}.")
        if index_params is not None and not isinstance(index_params, dict):
            raise TypeError(f"index_params must be a dict. Got {type(index_params).__name__}.")
        self.index_name = index
        self.index_params = dict(index_params or {})
        self._next_id = int(next_id)
        self._refiner: tuple | None = None  # (metric, hasher, screen)
        self._seq = SeqLock(_MAX_ATTEMPTS, reentrant=True)  # one state of all shards
        self._lock = self._seq.lock
        self._sources = []
        self.shards = []

    # ---------------------------------------------------------------------- construction

    @classmethod
    def _wrap(cls, client, n_bits, sources, index, index_params, next_id) -> ShardedIndex:
        """An index whose shards are built on the cluster from ``sources`` (one a shard)."""
        obj = cls.__new__(cls)
        obj._setup(client, n_bits, index, index_params, next_id)
        obj._sources = list(sources)
        obj.shards = [obj._submit_source(s) for s in range(len(sources))]
        return obj

    @classmethod
    def from_codes(
        cls,
        client,
        codes: np.ndarray,
        *,
        n_bits: int,
        n_shards: int,
        ids=None,
        index: str = "flat",
        **index_params,
    ) -> ShardedIndex:
        """Split ``codes`` into ``n_shards`` contiguous shards and build one index per shard
        on the workers. ``ids`` default to ``0..n-1``. The client keeps each shard's codes
        (views of ``codes``; do not modify it afterwards) to rebuild a lost shard."""
        n_bits = check_int(n_bits, "n_bits", "ShardedIndex.from_codes")
        codes = check_codes(codes, n_bits, "codes")
        n_shards = check_int(n_shards, "n_shards", "ShardedIndex.from_codes")
        n = len(codes)
        ids = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n)
        bounds = [n * s // n_shards for s in range(n_shards + 1)]
        sources = [
            _Source("arrays", (codes[bounds[s] : bounds[s + 1]], ids[bounds[s] : bounds[s + 1]]))
            for s in range(n_shards)
        ]
        next_id = int(ids.max()) + 1 if n else 0
        obj = cls._wrap(client, n_bits, sources, index, index_params, next_id)
        _wait(obj.shards)  # surface build errors now, not at the first search
        return obj

    @classmethod
    def from_dask_array(
        cls, client, codes, *, n_bits: int, index: str = "flat", **index_params
    ) -> ShardedIndex:
        """One shard per row block of a dask array of packed codes; ids are row numbers.
        A lost shard is rebuilt by recomputing its block from the array's graph."""
        import dask.array as da

        n_bits = check_int(n_bits, "n_bits", "ShardedIndex.from_dask_array")
        if not isinstance(codes, da.Array):
            raise TypeError(f"codes must be a dask.array.Array. Got {type(codes).__name__}.")
        code_size = (n_bits + 7) // 8
        if codes.ndim != 2 or codes.shape[1] != code_size or codes.dtype != np.uint8:
            raise ValueError(
                f"codes must be uint8 of shape (n, {code_size}) for {n_bits}-bit "
                f"codes. Got {codes.dtype} {codes.shape} instead."
            )
        if len(codes.chunks[1]) != 1:
            codes = codes.rechunk({1: -1})
        blocks = list(codes.to_delayed().ravel())
        starts = np.concatenate([[0], np.cumsum(codes.chunks[0])]).astype(np.int64)
        sources = [
            _Source("delayed", (block, (int(starts[i]), int(starts[i + 1]))))
            for i, block in enumerate(blocks)
        ]
        obj = cls._wrap(client, n_bits, sources, index, index_params, int(starts[-1]))
        _wait(obj.shards)
        return obj

    @classmethod
    def from_shards(cls, client, shards: Sequence) -> ShardedIndex:
        """Wrap existing indexes (sent to the workers) or futures of indexes.

        All shards must have the same code length, and their ids must not overlap (ids are
        not checked across shards: keep them disjoint). Index objects are kept on the client
        to rebuild a lost shard; a shard given as a future cannot be rebuilt (``save`` the
        index to make it durable).
        """
        if not shards:
            raise ValueError("shards must not be empty.")
        obj = cls.__new__(cls)
        obj._setup(client, 1, "flat", None, 0)
        obj._sources = [None if hasattr(s, "key") else _Source("object", s) for s in shards]
        obj.shards = [
            client.submit(_as_shard, s, pure=False) if hasattr(s, "key") else obj._submit_source(i)
            for i, s in enumerate(shards)
        ]
        bits = obj._run(_shard_bits)
        if len(set(bits)) != 1:
            raise ValueError(f"all shards must have the same code length; got n_bits {bits}.")
        obj.n_bits = bits[0]
        obj._next_id = max(obj._run(_shard_next_id))
        return obj

    # ------------------------------------------------------------------------- recovery

    def _submit_source(self, s: int):
        """A new future of shard ``s`` rebuilt from its source (base + logged operations)."""
        src = self._sources[s]
        if src is None:
            raise RuntimeError(
                f"shard {s} was lost and has no source to rebuild it from (it was passed to "
                "from_shards as a future); save() the index to make its shards durable."
            )
        return self._submit(src, s)

    def _submit(self, src: _Source, s: int):
        c = self.client
        build = (self.n_bits, self.index_name, self.index_params)
        if src.kind == "path" and src.fallback is not None and not os.path.isdir(src.payload[0]):
            base = self._submit(src.fallback, s)  # the save is gone: as before it
        elif src.kind == "empty":  # placed round-robin on the workers: one shard per worker
            workers = sorted(c.scheduler_info().get("workers", {}))
            # a preference, not a pin; with no worker known yet (a cluster still starting),
            # none: dask refuses allow_other_workers without workers
            where = (
                {"workers": [workers[s % len(workers)]], "allow_other_workers": True}
                if workers
                else {}
            )
            base = c.submit(_new_shard, *build, self._refiner, pure=False, **where)
        elif src.kind == "arrays":
            codes, ids = src.payload
            [data] = c.scatter([codes], hash=False)
            base = c.submit(_build_shard, data, ids, *build, pure=False)
        elif src.kind == "delayed":
            block, (start, stop) = src.payload
            [data] = c.compute([block])
            base = c.submit(
                _build_shard, data, np.arange(start, stop, dtype=np.int64), *build, pure=False
            )
        elif src.kind == "path":
            base = c.submit(_load_shard, *src.payload, self._refiner, pure=False)
        else:  # "object"
            [obj] = c.scatter([src.payload], hash=False)
            base = c.submit(_as_shard, obj, pure=False)
        if src.ops:
            base = c.submit(_apply, base, list(src.ops), pure=False)
        return base

    def _check_shards(self) -> list[int]:
        """Rebuild every shard whose future is lost, cancelled or failed; returns them."""
        lost = [s for s, f in enumerate(self.shards) if f.status in _RECOVERABLE]
        for s in lost:
            self.shards[s] = self._submit_source(s)
        return lost

    def _run(self, fn, *args, each: Sequence | None = None) -> list:
        """``fn(shard, *args)`` on every shard (``fn(shard_s, each[s])`` with ``each``),
        gathered; lost shards are rebuilt from their source and the call retried (at most 3
        attempts)."""
        for attempt in range(_MAX_ATTEMPTS):
            self._check_shards()
            if each is None:
                futures = [self.client.submit(fn, f, *args, pure=False) for f in self.shards]
            else:
                futures = [
                    self.client.submit(fn, f, a, pure=False)
                    for f, a in zip(self.shards, each, strict=True)
                ]
            try:
                return self.client.gather(futures)
            except Exception as exc:  # noqa: BLE001 - a worker loss surfaces as many types
                if isinstance(exc, (ValueError, TypeError)) and not any(
                    f.status in _RECOVERABLE for f in self.shards
                ):
                    raise  # an error of the call itself, not of the cluster
                if attempt == _MAX_ATTEMPTS - 1:
                    raise
                if not any(f.status in _RECOVERABLE for f in self.shards):
                    # the failure was not attributed to a shard (e.g. a worker died while
                    # holding one): rebuild every shard from its source
                    self.shards = [self._submit_source(s) for s in range(self.n_shards)]
        raise AssertionError("unreachable")

    def rebuild(self, shards: Sequence[int] | None = None) -> None:
        """Rebuild the given shards (default: every shard) from their sources now."""
        todo = range(self.n_shards) if shards is None else shards
        with self._lock:
            for s in todo:
                self.shards[s] = self._submit_source(
                    check_int(s, "shard", "rebuild", low=0, high=self.n_shards - 1)
                )
            _wait(self.shards)

    # -------------------------------------------------------------------------- queries

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    @property
    def code_size(self) -> int:
        """Bytes per packed code."""
        return (self.n_bits + 7) // 8

    def __len__(self) -> int:
        return sum(self.shard_sizes())

    def shard_sizes(self) -> list[int]:
        """The number of codes each shard holds, in shard order."""
        return [int(n) for n in self._run(_shard_len)]

    def search(
        self, queries: np.ndarray, k: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Exact k-NN over all shards: ``(D int32 (m, k), I int64 (m, k))`` by (distance, id),
        padded with ``-1``. ``n_threads`` is each shard search's (default 1: one shard per
        worker thread)."""
        queries = check_codes(queries, self.n_bits, "queries")
        k = check_k(k, len(queries), "ShardedIndex.search")
        if len(queries) == 0:
            return np.full((0, k), -1, np.int32), np.full((0, k), -1, np.int64)
        results = self._consistent(
            self._run, _search_shard, np.ascontiguousarray(queries), k, n_threads or 1
        )
        D = np.concatenate([r[0] for r in results], axis=1)
        I = np.concatenate([r[1] for r in results], axis=1)
        return merge_topk(D, I, k)

    def range_search(
        self, queries: np.ndarray, radius: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """All codes within Hamming distance ``<= radius`` (faiss: ``< radius``), over all
        shards: ``(lims int64 (m+1,), D int32, I int64)``, each query's results sorted by
        (distance, id) as :meth:`hashlearn.index.flat.FlatIndex.range_search` sorts them."""
        queries = check_codes(queries, self.n_bits, "queries")
        radius = check_int(radius, "radius", "ShardedIndex.range_search", low=0, high=self.n_bits)
        m = len(queries)
        results = self._consistent(
            self._run, _range_shard, np.ascontiguousarray(queries), radius, n_threads or 1
        )
        rows = np.concatenate([np.repeat(np.arange(m), np.diff(r[0])) for r in results])
        D = np.concatenate([r[1] for r in results]).astype(np.int32)
        I = np.concatenate([r[2] for r in results]).astype(np.int64)
        order = np.lexsort((I, D, rows))
        lims = np.zeros(m + 1, np.int64)
        np.cumsum(np.bincount(rows, minlength=m), out=lims[1:])
        return lims, D[order], I[order]

    # ------------------------------------------------------------------------- refining

    def attach_refiner(self, metric: str, hasher, screen: bool = True) -> None:
        """Keep each shard's vectors on its worker in a
        :class:`~hashlearn.rerank.refiner.Refiner` ``(metric, hasher, screen)``, for
        :meth:`refine_search`. Call it on an empty index, before the first ``add`` (again
        with the same arguments: nothing changes); from then on ``add`` takes the vectors of
        the codes."""
        with self._lock:
            if self._refiner is not None:
                if self._refiner == (metric, hasher, screen):  # the hasher compared by identity
                    return
                metric0, _, screen0 = self._refiner
                raise ValueError(
                    f"this index already refines with metric={metric0!r}, screen={screen0} and "
                    "its own hasher (index.hasher); pass those to Searcher."
                )
            if any(src is None or src.kind != "empty" or src.ops for src in self._sources):
                raise ValueError(
                    "attach_refiner must be called on an empty index, before the first add."
                )
            self._refiner = _refiner_spec(metric, hasher, screen)
            self.shards = [self._submit_source(s) for s in range(self.n_shards)]
            _wait(self.shards)

    @property
    def hasher(self):
        """The hasher of the attached refiner (``None`` without one): a loaded refining index
        goes back under a Searcher as ``Searcher(index.hasher, index, rerank=...)``."""
        return None if self._refiner is None else self._refiner[1]

    def refine_search(
        self, X, codes: np.ndarray, k: int, n_candidates: int, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray]:
        """Shortlist and refine on the workers: ``(D float32 (m, k), I int64 (m, k))``.

        Round 1: every shard returns its Hamming top-``n_candidates`` and the client merges
        them into the global top-``n_candidates`` by (distance, id) -- what one index over
        all codes returns. Round 2: each shard refines the candidates it holds with its
        Refiner and returns its top ``k``; the client merges them by (distance, id), or
        (similarity, id) largest first for ``"inner_product"`` / ``"cosine"``. Only the
        queries, ids and scores cross the network, never a database vector.
        """
        if self._refiner is None:
            raise ValueError("refine_search needs attach_refiner(...) before the first add.")
        from hashlearn.rerank.refiner import MissingVectorsError

        codes = check_codes(codes, self.n_bits, "codes")
        m = len(codes)
        if getattr(X, "shape", (None,))[0] != m:
            raise ValueError(f"X must have one row per code ({m}). Got {type(X).__name__}.")
        k = check_k(k, m, "ShardedIndex.refine_search")
        n_candidates = check_int(n_candidates, "n_candidates", "ShardedIndex.refine_search")
        args = (X, np.ascontiguousarray(codes), k, n_candidates, n_threads or 1)
        return self._consistent(self._refine_once, *args, retry_on=MissingVectorsError)

    def _refine_once(self, X, codes, k, n_candidates, threads):
        """The two rounds of :meth:`refine_search` on checked arguments."""
        from hashlearn.rerank.refiner import SIMILARITIES

        short = self._run(_search_shard, codes, n_candidates, threads)
        D = np.concatenate([r[0] for r in short], axis=1)
        I = np.concatenate([r[1] for r in short], axis=1)
        owner = np.repeat(np.arange(self.n_shards), [r[1].shape[1] for r in short])
        order = _top_columns(D, I, n_candidates)
        cand = np.take_along_axis(I, order, axis=1)
        held_by = np.where(cand >= 0, owner[order], -1)
        each = []
        for s in range(self.n_shards):
            mine = held_by == s
            first = np.argsort(~mine, axis=1, kind="stable")  # this shard's ids first, in order
            width = max(1, int(mine.sum(axis=1).max(initial=0)))
            own = np.take_along_axis(np.where(mine, cand, -1), first, axis=1)[:, :width]
            each.append((X, own, k, threads))
        refined = self._run(_refine_shard, each=each)
        D = np.concatenate([r[0] for r in refined], axis=1)
        I = np.concatenate([r[1] for r in refined], axis=1)
        if self._refiner[0] in SIMILARITIES:  # largest first, padded with -inf
            D, I = merge_topk(-D, I, k)
            return -D, I
        return merge_topk(D, I, k)

    def _consistent(self, fn, *args, retry_on=()):
        """``fn(*args)`` as of one state of the whole index: a write reaches the shards at
        different moments, so a search that overlapped one, or failed with ``retry_on``,
        runs again (:class:`~hashlearn._utils.seqlock.SeqLock`)."""
        return self._seq.read(fn, *args, retry_on=retry_on)

    # ------------------------------------------------------------------------ mutations

    def _holders(self, ids: np.ndarray) -> np.ndarray:
        """``bool (n_shards, len(ids))``: which shard holds each id."""
        return np.array(self._run(_shard_holds, ids)).reshape(self.n_shards, len(ids))

    def add(self, codes=None, ids=None, vectors=None) -> np.ndarray:
        """Add codes ``(n, ceil(n_bits/8))`` uint8 with optional distinct int ids; returns
        the ids (int64, in the order of the rows).

        Without ``ids`` the rows are numbered from one past the largest id ever added, as
        the local indexes do; explicit ids already in the index raise ``ValueError``. After
        :meth:`attach_refiner`, ``vectors`` (the rows the codes encode) are required and
        ``codes`` may be ``None``: each shard's worker then encodes them with the hasher.
        ``codes`` and ``vectors`` may be numpy arrays (rows split evenly over the shards,
        the smallest shards taking the extra rows) or dask arrays (each row block goes to
        the currently smallest shard and is computed, encoded and stored by that shard's
        worker: its data never passes through the client).
        """
        with self._seq.writing():
            if codes is None and vectors is None:
                raise ValueError("add needs codes (or, with a refiner, the vectors to encode).")
            if self._refiner is None and vectors is not None:
                raise ValueError(
                    "vectors are kept only by a refining index: call attach_refiner(...) "
                    "before the first add."
                )
            if self._refiner is not None and vectors is None:
                raise ValueError("this index refines: add needs vectors=, the rows coded.")
            if codes is not None and not _is_dask(codes):
                codes = check_codes(codes, self.n_bits, "codes")
            n = _rows(codes if codes is not None else vectors, "codes")
            if vectors is not None and _rows(vectors, "vectors") != n:
                raise ValueError(f"vectors has {_rows(vectors, 'vectors')} rows; codes has {n}.")
            ids = self._new_ids(ids, n)
            if n == 0:
                return ids
            if _is_dask(codes) or _is_dask(vectors):
                self._add_lazy(codes, vectors, ids)
            else:
                sizes = _split(self._run(_shard_len), n)
                bounds = np.concatenate([[0], np.cumsum(sizes)])
                plan = {}
                for s in np.flatnonzero(sizes):
                    a, b = bounds[s], bounds[s + 1]
                    part = None if codes is None else np.array(codes[a:b], copy=True)
                    rows = None if vectors is None else vectors[a:b]
                    plan[int(s)] = [("add", part, ids[a:b].copy(), rows)]
                self._mutate(plan)
            self._next_id = max(self._next_id, int(ids.max()) + 1)
            return ids

    def _new_ids(self, ids, n: int) -> np.ndarray:
        """Ids for ``n`` new rows: validated explicit ones, or the next ``n`` automatic ones."""
        if ids is None:
            if self._next_id + n - 1 > ID_MAX:
                raise ValueError(
                    "ShardedIndex: the int64 id space is exhausted: automatic ids would run "
                    f"from {self._next_id} past {ID_MAX}. Pass explicit ids instead."
                )
            return np.arange(self._next_id, self._next_id + n, dtype=np.int64)
        ids = check_ids(ids, n)
        if n:
            held = self._holders(ids).any(axis=0)
            if held.any():
                raise ValueError(
                    f"ids already in the index: {ids[held][:5].tolist()}. "
                    "Remove them first to replace their items."
                )
        return ids

    def _add_lazy(self, codes, vectors, ids: np.ndarray) -> None:
        """Route each row block of the dask array(s) to the currently smallest shard, as a
        ``("lazy", _Lazy, ids)`` operation its worker computes; one task per shard."""
        if _is_dask(codes) and (codes.dtype != np.uint8 or codes.shape[1] != self.code_size):
            raise ValueError(
                f"codes must be uint8 of shape (n, {self.code_size}) for {self.n_bits}-bit "
                f"codes. Got {codes.dtype} {codes.shape} instead."
            )
        chunks = (vectors if _is_dask(vectors) else codes).chunks[0]
        if any(np.isnan(c) for c in chunks):
            raise ValueError("dask arrays added need known chunk sizes (compute_chunk_sizes()).")
        bounds = np.concatenate([[0], np.cumsum(chunks)]).astype(np.int64)
        spans = list(zip(bounds[:-1], bounds[1:], strict=True))

        def blocks(x):
            if x is None:
                return [None] * len(spans)
            if _is_dask(x):
                return list(x.rechunk({0: chunks, 1: -1}).to_delayed().ravel())
            return [x[a:b] for a, b in spans]

        code_blocks, vector_blocks = blocks(codes), blocks(vectors)
        lengths = np.array(self._run(_shard_len), np.int64)
        ops: list[list] = [[] for _ in range(self.n_shards)]
        for b, (a, z) in enumerate(spans):
            s = int(np.argmin(lengths))
            lengths[s] += z - a
            ops[s].append(("lazy", _Lazy(code_blocks[b], vector_blocks[b]), ids[a:z].copy()))
        self._mutate({s: ops[s] for s in range(self.n_shards) if ops[s]})

    def remove(self, ids, *, missing: str = "raise") -> int:
        """Remove ids from the shards holding them; the other ids stay as they are.

        ``missing="raise"`` (default) refuses ids that are not in the index with a
        ``ValueError`` and removes nothing; ``"ignore"`` skips them. Returns the number
        removed.
        """
        if missing not in ("raise", "ignore"):
            raise ValueError(f"missing must be 'raise' or 'ignore'. Got {missing!r}.")
        arr = np.asarray(ids)
        if arr.ndim != 1:
            raise ValueError(f"ids must be a 1-D array of integers. Got shape {arr.shape}.")
        unique = np.unique(arr)
        ids = check_ids(unique, len(unique))
        with self._seq.writing():
            if not len(ids):
                return 0
            holders = self._holders(ids)
            absent = ~holders.any(axis=0)
            if missing == "raise" and absent.any():
                raise ValueError(f"ids not in the index: {ids[absent][:5].tolist()}.")
            self._mutate(
                {int(s): [("remove", ids[holders[s]])] for s in np.flatnonzero(holders.any(axis=1))}
            )
            return int((~absent).sum())

    def _mutate(self, plan: dict[int, list]) -> None:
        """Apply ``plan[s]`` (a list of operations) to each shard ``s``, all shards at once,
        each as a new future (the old key is released, so no stale replica is ever
        searched), and log them in the shards' sources. A shard lost meanwhile is rebuilt
        and its operations applied again (3 attempts); shards that succeeded stay done."""
        pending = dict(plan)
        for attempt in range(_MAX_ATTEMPTS):
            self._check_shards()
            futures = {
                s: self.client.submit(_apply, self.shards[s], ops, pure=False)
                for s, ops in pending.items()
            }
            _settle(list(futures.values()))
            for s, future in futures.items():
                if future.status == "finished":
                    self.shards[s] = future
                    done = pending.pop(s)  # also for a shard given as a future (no source)
                    source = self._sources[s]
                    if source is not None:
                        source.ops.extend(done)
            if not pending:
                return
            lost = any(self.shards[s].status in _RECOVERABLE for s in pending)
            if attempt == _MAX_ATTEMPTS - 1 or not lost:
                futures[next(iter(pending))].result()  # raises the worker's exception
        raise RuntimeError(f"shards {sorted(pending)} could not be updated.")

    # ---------------------------------------------------------------------- persistence

    def save(self, path, *, mmap_on_rebuild: bool = True) -> None:
        """Save every shard with hashlearn's own format into ``path`` (a directory that the
        workers and the client both see, e.g. a shared filesystem), atomically.

        Layout: ``meta.json`` (:func:`hashlearn.io.write_dir`: code length, index kind, next
        id, the shard directory names, the refiner's metric and screen), one ``shard-*``
        directory per shard and, for a refining index, one ``vectors-*`` directory per shard
        (its Refiner) -- both written *by the worker holding the shard* -- and the hasher
        (``hasher-*``, :func:`hashlearn.io.save`). Over an existing save the new directories
        are written first, then ``meta.json`` is replaced atomically, then the old ones are
        deleted. Afterwards a lost shard is reloaded from its saved directory (memory-mapped
        when ``mmap_on_rebuild``); the source it had before is kept for when that directory
        is gone (deleted, or moved as a composite's first save moves it).
        """
        import secrets
        import shutil
        from pathlib import Path

        from hashlearn import io

        path = Path(path).absolute()
        with self._lock:
            token = secrets.token_hex(6)
            names = [f"shard-{s:05d}-{token}" for s in range(self.n_shards)]
            refines = self._refiner is not None
            vnames = [f"vectors-{s:05d}-{token}" if refines else None for s in range(self.n_shards)]
            hasher_name = f"hasher-{token}"
            fresh = not path.exists()
            if not fresh and not (path / "meta.json").is_file():
                raise FileExistsError(
                    f"{path} exists and is not a hashlearn save (no meta.json); refusing to "
                    "overwrite it."
                )
            # a first save is built in a temporary sibling named as hashlearn.io names them
            # (removed by a later save or load beside it if this process dies meanwhile)
            tmp = f".{path.name}.tmp-{os.getpid()}-{secrets.token_hex(8)}"
            target = path.parent / tmp if fresh else path
            params = {"n_bits": self.n_bits, "index": self.index_name}
            state = {"shards": names, "index_params": self.index_params, "next_id": self._next_id}
            keep = set(names)
            if self._refiner is not None:  # refines
                metric, hasher, screen = self._refiner
                if not isinstance(metric, str):
                    raise TypeError(
                        "cannot save a ShardedIndex whose refiner's metric is a callable; "
                        "register it with hashlearn.search.register_reranker(name)."
                    )
                state.update(vectors=vnames, hasher=hasher_name, metric=metric, screen=screen)
                keep |= {v for v in vnames if v is not None} | {hasher_name}
            try:
                if fresh:
                    io.write_dir(target, "ShardedIndex", params, {"shards": []}, {})
                if refines:
                    io.save(hasher, target / hasher_name)
                each = [
                    (str(target / n), v and str(target / v))
                    for n, v in zip(names, vnames, strict=True)
                ]
                self._run(_save_shard, each=each)
                io.write_dir(target, "ShardedIndex", params, state, {})
                if fresh:
                    os.rename(target, path)
            except BaseException:
                if fresh:
                    shutil.rmtree(target, ignore_errors=True)
                raise
            for child in path.iterdir():
                old = _SHARD_NAME.fullmatch(child.name) or _HASHER_NAME.fullmatch(child.name)
                if old and child.name not in keep:
                    shutil.rmtree(child, ignore_errors=True)
            self._sources = [
                _Source(
                    "path",
                    (str(path / n), v and str(path / v), mmap_on_rebuild, False),
                    fallback=old,
                )
                for n, v, old in zip(names, vnames, self._sources, strict=True)
            ]

    @classmethod
    def load(
        cls, *args, client=None, mmap: bool | str = False, verify: bool = True
    ) -> ShardedIndex:
        """Load what :meth:`save` wrote: ``load(path, *, client=None, mmap=False)`` (the
        client defaults to ``distributed.get_client()``; ``hashlearn.load(path, client=...)``
        lands here), or the older ``load(client, path, mmap=False)``.

        Each shard (and its vectors) is loaded by a worker from ``path`` (memory-mapped when
        ``mmap``; ``mmap="direct"``: a shard's refine reads only the rows it rescores,
        :mod:`hashlearn.rerank.rowfile`; every sha256 checked when ``verify``), and reloaded
        from there if its worker is lost.
        """
        from pathlib import Path

        from hashlearn import io

        if len(args) == 2 and client is None:
            client, path = args
        elif len(args) == 1:
            [path] = args
        else:
            raise TypeError("use ShardedIndex.load(path, *, client=None, mmap=False).")
        if client is None:
            from distributed import get_client

            client = get_client()
        path = Path(path).absolute()
        meta, _ = io.read_dir(path, verify=verify)
        if meta["class"] != "ShardedIndex":
            raise TypeError(f"{path} holds a {meta['class']}, not a ShardedIndex.")
        try:
            state = meta["state"]
            n_bits = io.require_state(meta["params"], "n_bits", int, low=1)
            index = io.require_state(meta["params"], "index", str)
            names = _names(state.get("shards"), "shard")
            index_params = state.get("index_params") or {}
            if not isinstance(index_params, dict):
                raise ValueError("'index_params' must be a dict")
            next_id = None
            if "next_id" in state:  # absent from saves made before sharded refinement
                next_id = io.require_state(state, "next_id", int, low=0, high=ID_MAX + 1)
            vnames: Sequence[str | None] = [None] * len(names)
            if "vectors" in state:
                vnames = _names(state["vectors"], "vectors")
                if len(vnames) != len(names):
                    raise ValueError("one 'vectors' directory per shard is needed")
                metric = io.require_state(state, "metric", str)
                hasher_name = io.require_state(state, "hasher", str)
                if not _HASHER_NAME.fullmatch(hasher_name):
                    raise ValueError("'hasher' must name a hasher-* directory")
                screen = io.require_state(state, "screen", bool)
        except ValueError as exc:
            raise ValueError(f"{path}: the saved ShardedIndex is inconsistent: {exc}") from None
        obj = cls.__new__(cls)
        obj._setup(client, n_bits, index, index_params, 0)
        if vnames[0] is not None:
            obj._refiner = _refiner_spec(metric, io.load(path / hasher_name), screen)
        obj._sources = [
            _Source("path", (str(path / n), v and str(path / v), mmap, verify))
            for n, v in zip(names, vnames, strict=True)
        ]
        obj.shards = [obj._submit_source(s) for s in range(len(names))]
        bits = obj._run(_shard_bits)
        if set(bits) != {n_bits}:
            raise ValueError(f"{path}: shards of {sorted(set(bits))} bits in a {n_bits}-bit save")
        obj._next_id = next_id if next_id is not None else max(obj._run(_shard_next_id))
        return obj

    def __repr__(self) -> str:
        return f"ShardedIndex(n_bits={self.n_bits}, n_shards={self.n_shards})"


def _refiner_spec(metric, hasher, screen) -> tuple:
    """``(metric, hasher, screen)`` checked by building a Refiner on the client (bad names,
    a hasher without a learned metric for ``"metric"``: ``ValueError`` / ``TypeError``)."""
    if not callable(getattr(hasher, "encode", None)):
        raise TypeError(f"hasher must be a fitted hasher. Got {type(hasher).__name__}.")
    _make_refiner(metric, hasher, screen)
    return (metric, hasher, bool(screen))


def _names(value, prefix: str) -> list[str]:
    """Saved directory names ``<prefix>-NNNNN-<token>`` (a non-empty list)."""
    if not (
        isinstance(value, list)
        and value
        and all(
            isinstance(n, str) and _SHARD_NAME.fullmatch(n) and n.startswith(prefix + "-")
            for n in value
        )
    ):
        raise ValueError(f"'{prefix}s' must be a non-empty list of {prefix} directory names")
    return value


def _rows(x, name: str) -> int:
    """Rows of a 2-D array (numpy, scipy.sparse or dask)."""
    shape = getattr(x, "shape", None)
    if shape is None or len(shape) != 2:
        raise ValueError(f"{name} must be a 2-D array. Got {type(x).__name__}.")
    return int(shape[0])
