"""Dask: encode a dask array with a fitted hasher, and a sharded index whose shards live on
the workers.

A :class:`ShardedIndex` splits a database of packed codes into shards; each shard is an
ordinary hashlearn index (FlatIndex by default, or MultiIndexHashing, ...) built *on* a
worker and kept there as a Dask future, so codes never travel back to the client. A search
sends the (small) query codes to every shard, each worker returns its own exact top-k
``(D, I)``, and the client merges the ``n_shards`` lists by ``(distance, id)``. Since every
shard's list is exact and complete up to k, the merged list equals the single-machine index's
result, ties included (smaller id first). See ``docs/distributed.md`` for running against a
real cluster and the memory model.

Only public Dask APIs are used (``Client.scatter``/``submit``/``gather``,
``dask.array.map_blocks``, ``to_delayed``).
"""

from __future__ import annotations

import os
from collections.abc import Sequence

import numpy as np

from hashlearn._utils.validation import check_codes, check_ids, check_int
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


def merge_topk(D: np.ndarray, I: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Merge per-shard top-k lists concatenated along axis 1 into one top-k by (distance, id).

    ``-1`` padding sorts after every real result and stays ``-1``.
    """
    big = np.iinfo(np.int64).max
    d_key = np.where(I < 0, big, D.astype(np.int64))
    i_key = np.where(I < 0, big, I)
    order = np.lexsort((i_key, d_key), axis=1)[:, :k]
    D_out = np.take_along_axis(D, order, axis=1).astype(np.int32)
    I_out = np.take_along_axis(I, order, axis=1).astype(np.int64)
    if D_out.shape[1] < k:  # fewer columns than k (single empty shard)
        pad = k - D_out.shape[1]
        D_out = np.pad(D_out, ((0, 0), (0, pad)), constant_values=-1)
        I_out = np.pad(I_out, ((0, 0), (0, pad)), constant_values=-1)
    return D_out, I_out


# ---------------------------------------------------------------- functions run on workers


def _build_shard(codes, ids, n_bits, index, index_params):
    shard = make_index(index, n_bits=n_bits, **index_params)
    shard.add(np.ascontiguousarray(codes), ids=ids)
    if hasattr(shard, "build"):
        shard.build()
    return shard


def _load_shard(path, mmap):
    from hashlearn import io

    return io.load(path, mmap=mmap)


def _replay(shard, ops):
    """Apply logged ``("add", codes, ids)`` / ``("remove", ids)`` operations in order."""
    for op in ops:
        if op[0] == "add":
            shard.add(np.ascontiguousarray(op[1]), ids=op[2])
        else:
            shard.remove(op[1])
    if ops and hasattr(shard, "build"):
        shard.build()
    return shard


def _search_shard(shard, queries, k):
    return shard.search(queries, k, n_threads=1)


def _shard_len(shard):
    return len(shard)


def _shard_bits(shard):
    return int(shard.n_bits)


def _shard_holds(shard, ids):
    return np.isin(ids, shard.ids)


def _save_shard(shard, path):
    from hashlearn import io

    io.save(shard, path)
    return len(shard)


def _wait(futures) -> None:
    """Wait for shard futures and raise the first build error -- without gathering the shards
    themselves to the client (they stay on their workers)."""
    from distributed import wait

    wait(futures)
    for future in futures:
        if future.status == "error":
            future.result()  # raises the worker's exception


_RECOVERABLE = ("lost", "cancelled", "error")
_MAX_ATTEMPTS = 3


class _Source:
    """How to rebuild one shard: a base (client-side arrays, a dask block's lineage, a saved
    shard on a shared path, or an index object) plus the log of ``add`` / ``remove`` calls
    made since (client-side copies of their codes and ids)."""

    def __init__(self, kind: str, payload, ops=None):
        self.kind, self.payload, self.ops = kind, payload, list(ops or [])


class ShardedIndex:
    """An index split into shards held by Dask workers; exact fan-out search.

    Build with :meth:`from_codes` (a numpy array on the client), :meth:`from_dask_array`
    (a dask array, e.g. the output of :func:`encode`; blocks are never gathered),
    :meth:`from_shards` (indexes or futures of indexes) or :meth:`load` (a :meth:`save`).
    ``search`` returns exactly what one index over all codes returns.

    Every shard remembers its *source*: the client's codes (``from_codes``), the dask
    array's lineage (``from_dask_array``), the saved shard on a shared path (``load``, and
    after ``save``), or the index object (``from_shards``), plus a log of the ``add`` /
    ``remove`` calls made since. When a worker is lost or the cluster restarts
    (``client.restart()``), the shards whose futures are gone are rebuilt from their source
    and the search is retried, so results stay those of one index over the current codes.

    Examples
    --------
    >>> import numpy as np
    >>> from distributed import Client, LocalCluster
    >>> from hashlearn.distributed import ShardedIndex
    >>> cluster = LocalCluster(n_workers=1, processes=False, dashboard_address=None)
    >>> client = Client(cluster)
    >>> codes = np.array([[0b0000], [0b0001], [0b0111], [0b1111]], np.uint8)
    >>> index = ShardedIndex.from_codes(client, codes, n_bits=8, n_shards=2)
    >>> D, I = index.search(codes[:1], k=2)
    >>> D.tolist(), I.tolist()
    ([[0, 1]], [[0, 1]])
    >>> index.add(np.array([[0b0000]], np.uint8), ids=[10]).tolist()
    [10]
    >>> index.search(codes[:1], k=2)[1].tolist()
    [[0, 10]]
    >>> client.close(); cluster.close()
    """

    def __init__(
        self,
        client,
        shard_futures: Sequence,
        n_bits: int,
        *,
        sources: Sequence[_Source] | None = None,
        index: str = "flat",
        index_params: dict | None = None,
    ):
        self.client = client
        self.shards = list(shard_futures)
        self.n_bits = check_int(n_bits, "n_bits", "ShardedIndex")
        self.index_name = index
        self.index_params = dict(index_params or {})
        if sources is not None and len(sources) != len(self.shards):
            raise ValueError("one source per shard is needed.")
        self._sources = list(sources) if sources is not None else [None] * len(self.shards)

    # ---------------------------------------------------------------------- construction

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
        (views of ``codes``; do not modify it afterwards) to rebuild a lost shard, until
        :meth:`save` moves the source to disk."""
        n_bits = check_int(n_bits, "n_bits", "ShardedIndex.from_codes")
        codes = check_codes(codes, n_bits, "codes")
        n_shards = check_int(n_shards, "n_shards", "ShardedIndex.from_codes")
        n = len(codes)
        ids = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n)
        if len(np.unique(ids)) != n:
            raise ValueError("ids must be distinct.")
        bounds = [n * s // n_shards for s in range(n_shards + 1)]
        sources = [
            _Source("arrays", (codes[bounds[s] : bounds[s + 1]], ids[bounds[s] : bounds[s + 1]]))
            for s in range(n_shards)
        ]
        obj = cls._from_sources(client, n_bits, sources, index, index_params)
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
        obj = cls._from_sources(client, n_bits, sources, index, index_params)
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
        futures = [s if hasattr(s, "key") else client.scatter(s) for s in shards]
        lengths = client.gather([client.submit(_shard_bits, f, pure=False) for f in futures])
        if len(set(lengths)) != 1:
            raise ValueError(f"all shards must have the same code length; got n_bits {lengths}.")
        sources = [None if hasattr(s, "key") else _Source("object", s) for s in shards]
        return cls(client, futures, lengths[0], sources=sources)

    @classmethod
    def _from_sources(cls, client, n_bits, sources, index, index_params) -> ShardedIndex:
        """An index whose shards are built on the cluster from ``sources`` (one a shard)."""
        obj = cls(
            client,
            [None] * len(sources),
            n_bits,
            sources=sources,
            index=index,
            index_params=index_params,
        )
        obj.shards = [obj._submit_source(s) for s in range(len(sources))]
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
        c = self.client
        if src.kind == "arrays":
            codes, ids = src.payload
            [data] = c.scatter([codes], hash=False)
            base = c.submit(
                _build_shard,
                data,
                ids,
                self.n_bits,
                self.index_name,
                self.index_params,
                pure=False,
            )
        elif src.kind == "delayed":
            block, (start, stop) = src.payload
            [data] = c.compute([block])
            base = c.submit(
                _build_shard,
                data,
                np.arange(start, stop, dtype=np.int64),
                self.n_bits,
                self.index_name,
                self.index_params,
                pure=False,
            )
        elif src.kind == "path":
            path, mmap = src.payload
            base = c.submit(_load_shard, path, mmap, pure=False)
        else:  # "object"
            [base] = c.scatter([src.payload], hash=False)
        if src.ops:
            base = c.submit(_replay, base, list(src.ops), pure=False)
        return base

    def _check_shards(self) -> list[int]:
        """Rebuild every shard whose future is lost, cancelled or failed; returns them."""
        lost = [s for s, f in enumerate(self.shards) if f.status in _RECOVERABLE]
        for s in lost:
            self.shards[s] = self._submit_source(s)
        return lost

    def _run(self, fn, *args):
        """``fn(shard, *args)`` on every shard, gathered; lost shards are rebuilt from their
        source and the call retried (at most 3 attempts)."""
        for attempt in range(_MAX_ATTEMPTS):
            self._check_shards()
            futures = [self.client.submit(fn, f, *args, pure=False) for f in self.shards]
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
        for s in todo:
            self.shards[s] = self._submit_source(
                check_int(s, "shard", "rebuild", low=0, high=self.n_shards - 1)
            )
        _wait(self.shards)

    # -------------------------------------------------------------------------- queries

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return int(sum(self._run(_shard_len)))

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact k-NN over all shards: ``(D int32 (m, k), I int64 (m, k))`` by (distance, id)."""
        queries = check_codes(queries, self.n_bits, "queries")
        k = check_int(k, "k", "ShardedIndex.search")
        if len(queries) == 0:
            return np.full((0, k), -1, np.int32), np.full((0, k), -1, np.int64)
        results = self._run(_search_shard, np.ascontiguousarray(queries), k)
        D = np.concatenate([r[0] for r in results], axis=1)
        I = np.concatenate([r[1] for r in results], axis=1)
        return merge_topk(D, I, k)

    # ------------------------------------------------------------------------ mutations

    def _holders(self, ids: np.ndarray) -> np.ndarray:
        """``bool (n_shards, len(ids))``: which shard holds each id."""
        return np.array(self._run(_shard_holds, ids)).reshape(self.n_shards, len(ids))

    def add(self, codes: np.ndarray, ids) -> np.ndarray:
        """Add codes with explicit ``ids`` (distinct, held by no shard); they go to the
        currently smallest shard. Returns the ids."""
        codes = check_codes(codes, self.n_bits, "codes")
        ids = check_ids(ids, len(codes))
        if len(np.unique(ids)) != len(ids):
            raise ValueError("ids must be distinct.")
        if not len(ids):
            return ids
        held = self._holders(ids).any(axis=0)
        if held.any():
            raise ValueError(f"ids already in the index: {ids[held][:5].tolist()}.")
        s = int(np.argmin(self._run(_shard_len)))
        codes, ids = np.array(codes, copy=True), np.array(ids, copy=True)
        self._mutate(s, ("add", codes, ids))
        return ids

    def remove(self, ids) -> int:
        """Remove ids from the shards holding them; every id must be present (else
        ``ValueError`` and nothing is removed). Returns the number removed."""
        arr = np.asarray(ids)
        ids = np.unique(check_ids(arr, arr.shape[0] if arr.ndim == 1 else -1))
        if not len(ids):
            return 0
        holders = self._holders(ids)
        missing = ~holders.any(axis=0)
        if missing.any():
            raise ValueError(f"ids not in the index: {ids[missing][:5].tolist()}.")
        for s in np.flatnonzero(holders.any(axis=1)):
            self._mutate(int(s), ("remove", ids[holders[s]]))
        return len(ids)

    def _mutate(self, s: int, op) -> None:
        """Apply ``op`` to shard ``s`` as a new future (the old key is released, so no stale
        replica is ever searched) and log it in the shard's source."""
        for attempt in range(_MAX_ATTEMPTS):
            self._check_shards()
            future = self.client.submit(_replay, self.shards[s], [op], pure=False)
            try:
                _wait([future])
                break
            except Exception:  # noqa: BLE001
                if attempt == _MAX_ATTEMPTS - 1 or self.shards[s].status not in _RECOVERABLE:
                    raise
        self.shards[s] = future
        if self._sources[s] is not None:
            self._sources[s].ops.append(op)

    # ---------------------------------------------------------------------- persistence

    def save(self, path, *, mmap_on_rebuild: bool = True) -> None:
        """Save every shard with hashlearn's own format into ``path`` (a directory that the
        workers and the client both see, e.g. a shared filesystem), atomically.

        Layout: ``meta.json`` (:func:`hashlearn.io.write_dir`; code length, index kind, the
        shard directory names) and one sub-directory per shard written *by the worker
        holding it* (:func:`hashlearn.io.save`). Over an existing save, new shard
        directories are written first, then ``meta.json`` is replaced atomically, then the
        old ones are deleted. Afterwards each shard's source is its saved directory (the
        client drops its copies), so a lost shard is reloaded from disk
        (memory-mapped when ``mmap_on_rebuild``).
        """
        import secrets
        import shutil
        from pathlib import Path

        from hashlearn import io

        path = Path(path).absolute()
        token = secrets.token_hex(6)
        names = [f"shard-{s:05d}-{token}" for s in range(self.n_shards)]
        fresh = not path.exists()
        if not fresh and not (path / "meta.json").is_file():
            raise FileExistsError(
                f"{path} exists and is not a hashlearn save (no meta.json); refusing to "
                "overwrite it."
            )
        target = path.parent / f".{path.name}.tmp-{token}" if fresh else path
        params = {"n_bits": self.n_bits, "index": self.index_name}
        state = {"shards": names, "index_params": self.index_params}
        try:
            if fresh:
                io.write_dir(target, "ShardedIndex", params, {"shards": []}, {})
            self._run_each(_save_shard, [str(target / name) for name in names])
            io.write_dir(target, "ShardedIndex", params, state, {})
            if fresh:
                os.rename(target, path)
        except BaseException:
            if fresh:
                shutil.rmtree(target, ignore_errors=True)
            raise
        for child in path.iterdir():
            if child.name.startswith("shard-") and child.name not in names:
                shutil.rmtree(child, ignore_errors=True)
        self._sources = [_Source("path", (str(path / name), mmap_on_rebuild)) for name in names]

    def _run_each(self, fn, per_shard_args: Sequence) -> list:
        """``fn(shard_s, per_shard_args[s])`` on every shard, with recovery as ``_run``."""
        for attempt in range(_MAX_ATTEMPTS):
            self._check_shards()
            futures = [
                self.client.submit(fn, f, a, pure=False)
                for f, a in zip(self.shards, per_shard_args, strict=True)
            ]
            try:
                return self.client.gather(futures)
            except Exception:  # noqa: BLE001
                if attempt == _MAX_ATTEMPTS - 1 or not any(
                    f.status in _RECOVERABLE for f in self.shards
                ):
                    raise
        raise AssertionError("unreachable")

    @classmethod
    def load(cls, client, path, *, mmap: bool = False) -> ShardedIndex:
        """Load what :meth:`save` wrote: each shard is loaded by a worker from ``path``
        (memory-mapped when ``mmap``), and reloaded from there if its worker is lost."""
        import re
        from pathlib import Path

        from hashlearn import io

        path = Path(path).absolute()
        meta, _ = io.read_dir(path)
        if meta["class"] != "ShardedIndex":
            raise TypeError(f"{path} holds a {meta['class']}, not a ShardedIndex.")
        try:
            n_bits = io.require_state(meta["params"], "n_bits", int, low=1)
            index = io.require_state(meta["params"], "index", str)
            names = meta["state"].get("shards")
            index_params = meta["state"].get("index_params") or {}
            if not (
                isinstance(names, list)
                and names
                and all(
                    isinstance(n, str) and re.fullmatch(r"shard-[0-9]{5}-[0-9a-f]{12}", n)
                    for n in names
                )
            ) or not isinstance(index_params, dict):
                raise ValueError("'shards' must be a non-empty list of shard directory names")
        except ValueError as exc:
            raise ValueError(f"{path}: the saved ShardedIndex is inconsistent: {exc}") from None
        sources = [_Source("path", (str(path / name), mmap)) for name in names]
        obj = cls._from_sources(client, n_bits, sources, index, index_params)
        bits = client.gather([client.submit(_shard_bits, f, pure=False) for f in obj.shards])
        if set(bits) != {n_bits}:
            raise ValueError(f"{path}: shards of {sorted(set(bits))} bits in a {n_bits}-bit save")
        return obj

    def __repr__(self) -> str:
        return f"ShardedIndex(n_bits={self.n_bits}, n_shards={self.n_shards})"
