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

from collections.abc import Sequence

import numpy as np

from hashlearn._validation import check_codes, check_ids, check_int
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
    code_size = (int(hasher.n_bits) + 7) // 8
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


def _search_shard(shard, queries, k):
    return shard.search(queries, k, n_threads=1)


def _shard_len(shard):
    return len(shard)


def _shard_bits(shard):
    return int(shard.n_bits)


class ShardedIndex:
    """An index split into shards held by Dask workers; exact fan-out search.

    Build with :meth:`from_codes` (a numpy array on the client), :meth:`from_dask_array`
    (a dask array, e.g. the output of :func:`encode`; blocks are never gathered) or
    :meth:`from_shards` (indexes or futures of indexes). ``search`` returns exactly what
    one index over all codes returns.
    """

    def __init__(self, client, shard_futures: Sequence, n_bits: int):
        self.client = client
        self.shards = list(shard_futures)
        self.n_bits = check_int(n_bits, "n_bits", "ShardedIndex")

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
        on the workers. ``ids`` default to ``0..n-1``."""
        n_bits = check_int(n_bits, "n_bits", "ShardedIndex.from_codes")
        codes = check_codes(codes, n_bits, "codes")
        n_shards = check_int(n_shards, "n_shards", "ShardedIndex.from_codes")
        n = len(codes)
        ids = np.arange(n, dtype=np.int64) if ids is None else check_ids(ids, n)
        if len(np.unique(ids)) != n:
            raise ValueError("ids must be distinct.")
        bounds = [n * s // n_shards for s in range(n_shards + 1)]
        futures = []
        for s in range(n_shards):
            part, part_ids = codes[bounds[s] : bounds[s + 1]], ids[bounds[s] : bounds[s + 1]]
            [data] = client.scatter([part], hash=False)
            futures.append(
                client.submit(_build_shard, data, part_ids, n_bits, index, index_params, pure=False)
            )
        client.gather(futures)  # surface build errors now, not at the first search
        return cls(client, futures, n_bits)

    @classmethod
    def from_dask_array(
        cls, client, codes, *, n_bits: int, index: str = "flat", **index_params
    ) -> ShardedIndex:
        """One shard per row block of a dask array of packed codes; ids are row numbers."""
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
        blocks = client.compute(list(codes.to_delayed().ravel()))
        starts = np.concatenate([[0], np.cumsum(codes.chunks[0])])
        futures = [
            client.submit(
                _build_shard,
                block,
                np.arange(starts[i], starts[i + 1]),
                n_bits,
                index,
                index_params,
                pure=False,
            )
            for i, block in enumerate(blocks)
        ]
        client.gather(futures)
        return cls(client, futures, n_bits)

    @classmethod
    def from_shards(cls, client, shards: Sequence) -> ShardedIndex:
        """Wrap existing indexes (sent to the workers) or futures of indexes.

        All shards must have the same code length, and their ids must not overlap (ids are
        not checked across shards: keep them disjoint).
        """
        if not shards:
            raise ValueError("shards must not be empty.")
        futures = [s if hasattr(s, "key") else client.scatter(s) for s in shards]
        lengths = client.gather([client.submit(_shard_bits, f, pure=False) for f in futures])
        if len(set(lengths)) != 1:
            raise ValueError(f"all shards must have the same code length; got n_bits {lengths}.")
        return cls(client, futures, lengths[0])

    # -------------------------------------------------------------------------- queries

    @property
    def n_shards(self) -> int:
        return len(self.shards)

    def __len__(self) -> int:
        return int(
            sum(
                self.client.gather(
                    [self.client.submit(_shard_len, s, pure=False) for s in self.shards]
                )
            )
        )

    def search(self, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
        """Exact k-NN over all shards: ``(D int32 (m, k), I int64 (m, k))`` by (distance, id)."""
        queries = check_codes(queries, self.n_bits, "queries")
        k = check_int(k, "k", "ShardedIndex.search")
        if len(queries) == 0:
            return np.full((0, k), -1, np.int32), np.full((0, k), -1, np.int64)
        [q] = self.client.scatter([queries], broadcast=True, hash=False)
        results = self.client.gather(
            [self.client.submit(_search_shard, s, q, k, pure=False) for s in self.shards]
        )
        D = np.concatenate([r[0] for r in results], axis=1)
        I = np.concatenate([r[1] for r in results], axis=1)
        return merge_topk(D, I, k)

    def __repr__(self) -> str:
        return f"ShardedIndex(n_bits={self.n_bits}, n_shards={self.n_shards})"
