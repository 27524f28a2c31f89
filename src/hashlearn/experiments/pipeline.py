"""One evaluation loop for every reproduction: method specs run over a data set.

A reproduction is data, protocol settings, the claims it checks and its plots; the loop that
fits each method, encodes (or searches) the database and the queries and measures the result
lives here, once, and uses only the public API (:func:`hashlearn.hashers.make_hasher`,
:class:`hashlearn.Searcher`, the indexes, :mod:`hashlearn.evaluate`).

* Specs -- a method of a reproduction. :class:`MethodSpec`: a registered hasher, its
  parameters and the supervision it trains on; measured on the ``(n_queries, n_db)`` Hamming
  distances. :class:`SearchSpec`: the same hasher behind a :class:`~hashlearn.Searcher` (an
  index and a re-ranking stage); measured on the neighbours found
  (:class:`SearchResult`). :class:`BucketerSpec`: a bucketer (search forest, k-means
  trees, LSH tables) whose keys feed an inverted :class:`~hashlearn.index.table.TableIndex`;
  measured on the keys (:class:`BucketKeys`).
* :class:`Split` -- a database, held-out queries, their labels and ground truths.
* Measures -- ``measure(output, split, n_bits) -> {column: value}`` over a spec's output:
  :func:`precision_at_radius`, :func:`recall_at_m_curve`, :func:`pr_curve_auc` and
  :func:`knn_error` over Hamming distances; :func:`knn_error_of_neighbors` and
  :func:`searched_fraction` over search results; :func:`candidate_recall_curve` over keys.
* :func:`run_specs` -- every spec x code length x seed (one model per seed), one tidy record
  (a flat dict) each; a progress bar ``progress(total=, desc=)`` advanced once per model.
* :func:`summarize` -- mean and standard deviation over seeds, for tables and claims.
* :func:`claim` / :func:`write_claims` -- the claims a reproduction checks, as rows (paper,
  claim, data, verdict, margin with its 95 % paired t interval, n, baseline as run) in
  ``claims.json`` and a markdown table; the statistic is :mod:`hashlearn.experiments._stats`.

A user runs a paper's protocol on their own data the same way::

    >>> import numpy as np
    >>> from hashlearn.experiments.pipeline import MethodSpec, Split, run_specs, recall_at_m_curve
    >>> rng = np.random.RandomState(0)
    >>> X = rng.randn(300, 16).astype(np.float32)
    >>> split = Split.holdout(X, n_queries=50, random_state=0).with_euclidean_truth(10)
    >>> specs = [MethodSpec("LSH", "lsh"), MethodSpec("ITQ", "itq")]
    >>> records = run_specs(specs, split, bits=[8], seeds=[0], measures=[recall_at_m_curve([50])])
    >>> sorted(r["method"] for r in records), sorted(records[0])[:4]
    (['ITQ', 'LSH'], ['bits', 'encode_cpu_s', 'fit_cpu_s', 'method'])
"""

from __future__ import annotations

import inspect
import math
import os
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state

from hashlearn._utils.validation import check_int
from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import (
    exact_knn,
    fraction_searched,
    knn_classification_error,
    pr_auc,
    precision_recall_at_radius,
    precision_recall_curve,
    recall_at_m,
    relevance_from_labels,
    relevance_from_neighbors,
)
from hashlearn.experiments.checkpoints import Checkpoints
from hashlearn.experiments.checkpoints import current as current_checkpoints
from hashlearn.hashers import make_hasher
from hashlearn.index.table import TableIndex
from hashlearn.search import Searcher
from hashlearn.supervision import neighbor_threshold, neighbors_within, pairs_from_neighbors

__all__ = [
    "MethodSpec",
    "SearchSpec",
    "BucketerSpec",
    "SearchResult",
    "BucketKeys",
    "Split",
    "Measure",
    "run_specs",
    "summarize",
    "precision_at_radius",
    "answered_at_radius",
    "recall_at_m_curve",
    "pr_curve_auc",
    "knn_error",
    "knn_error_of_neighbors",
    "neighbor_vote_error",
    "searched_fraction",
    "candidate_recall_curve",
    "claim",
    "write_claims",
    "rows_as_run",
    "mean_table",
    "RunOptions",
    "reproduction",
]

SUPERVISION = ("none", "labels", "neighbors", "all-pairs")

#: ``measure(output, split, n_bits) -> {column: value}``; a value is a float or a 1-D array.
#: ``output`` is what the spec produces: Hamming distances, a SearchResult or BucketKeys.
Measure = Callable[[Any, "Split", int], Mapping[str, Any]]


def _resolve(params: Mapping[str, Any], n_bits: int) -> dict[str, Any]:
    """Parameters with callables of the code length evaluated."""
    return {k: (v(n_bits) if callable(v) else v) for k, v in params.items()}


def _call_text(name: str, params: Mapping[str, Any]) -> str:
    """``name(k=v, ...)``; a parameter given as a callable of the code length shows as
    ``f(bits)``."""
    args = ", ".join(f"{k}={'f(bits)' if callable(v) else repr(v)}" for k, v in params.items())
    return f"{name}({args})"


def rows_as_run(specs: Iterable[Any]) -> str:
    """Markdown table naming the class and parameters behind every row of a report
    (library defaults for the parameters not shown; ``n_bits`` and ``random_state`` set per
    column and seed)."""
    from hashlearn.experiments._common import markdown_table

    rows = {s.name: f"`{s.as_run()}`" for s in specs}
    return markdown_table(["row", "as run"], [[k, v] for k, v in rows.items()])


def _set_seed(estimator, seed: int):
    if "random_state" in inspect.signature(type(estimator)).parameters:
        estimator.set_params(random_state=seed)
    return estimator


@dataclass(frozen=True)
class MethodSpec:
    """A method of a reproduction: a registered hasher, its parameters, its supervision.

    ``supervision``: ``"none"`` fits on the training rows alone; ``"labels"`` passes their
    labels; ``"neighbors"`` passes ``n_pairs`` pairs labelled by the Euclidean threshold that
    gives each point ``n_neighbors`` neighbours on average (Norouzi & Fleet, *Minimal Loss
    Hashing for Compact Binary Codes*, ICML 2011, Sec. 6.1), ``similar_fraction`` of them
    joining a point to one of its neighbours and the rest uniform (``0``: all uniform, so
    similar pairs come at their base rate); ``"all-pairs"`` passes every
    pair of training rows labelled by that threshold (their Sec. 6.1 with 1000 points).
    The training rows are the split's ``train_rows`` (default: the whole database), of which
    a random ``n_train`` when given. ``params`` may hold callables of the code length, e.g.
    ``{"p": lambda b: 10 * b}``. ``deterministic=True``: fitted once, for the first seed
    (e.g. spectral hashing). ``max_bits_dim=True``: skipped where the code length exceeds
    the input dimension (PCA hashing, ITQ). ``fitted`` names fitted attributes copied into
    each record (e.g. the hyper-parameters a hasher chose).
    """

    name: str
    hasher: str
    params: Mapping[str, Any] = field(default_factory=dict)
    supervision: str = "none"
    n_neighbors: int = 50
    n_pairs: int = 100_000
    n_train: int | None = None
    deterministic: bool = False
    max_bits_dim: bool = False
    fitted: tuple[str, ...] = ()
    similar_fraction: float = 0.5

    def __post_init__(self) -> None:
        if self.supervision not in SUPERVISION:
            raise ValueError(
                f"The 'supervision' parameter of {type(self).__name__} must be a str among "
                f"{list(SUPERVISION)}. Got {self.supervision!r} instead."
            )

    def build(self, n_bits: int, seed: int):
        """The hasher for ``n_bits`` bits and ``seed`` (``random_state`` where it takes one)."""
        hasher = make_hasher(self.hasher, n_bits=n_bits, **_resolve(self.params, n_bits))
        return _set_seed(hasher, seed)

    def as_run(self) -> str:
        """The class and parameters behind this row, e.g.
        ``RandomHyperplaneLSH(directions='gaussian', center=False)``."""
        from hashlearn.hashers import available_hashers

        text = _call_text(available_hashers()[self.hasher].__name__, self.params)
        if self.supervision == "labels":
            text += " on labels"
        elif self.supervision == "all-pairs":
            text += f" on all training pairs ({self.n_neighbors}-NN threshold)"
        elif self.supervision == "neighbors":
            share = (
                "uniform"
                if self.similar_fraction == 0
                else f"{self.similar_fraction:.0%} joining neighbours"
            )
            text += f" on {self.n_pairs} pairs ({self.n_neighbors}-NN threshold, {share})"
        if self.n_train is not None:
            text += f", fitted on {self.n_train} rows"
        return text

    def applies(self, n_bits: int, split: Split) -> bool:
        """Whether the method runs at ``n_bits`` on ``split`` (see ``max_bits_dim``)."""
        return not (self.max_bits_dim and n_bits > split.X_db.shape[1])

    def training_rows(self, split: Split, seed: int) -> np.ndarray:
        """Database rows the method is fitted on."""
        rows = split.train_rows
        if rows is None:
            rows = np.arange(split.X_db.shape[0])
        if self.n_train is not None and self.n_train < len(rows):
            rng = check_random_state(seed)
            rows = np.sort(rng.choice(rows, self.n_train, replace=False))
        return rows

    def fit(self, hasher, split: Split, seed: int):
        """Fit ``hasher`` on the training rows of ``split`` with this spec's supervision."""
        rows = self.training_rows(split, seed)
        X = split.X_db[rows]
        if self.supervision == "none":
            return hasher.fit(X)
        if self.supervision == "labels":
            if split.y_db is None:
                raise ValueError(f"method {self.name!r} trains on labels; the split has none.")
            return hasher.fit(X, split.y_db[rows])
        key = (
            self.supervision,
            self.n_train,
            self.n_neighbors,
            self.n_pairs,
            self.similar_fraction,
            seed,
        )
        if key not in split.memo:  # the same pairs for every code length and method
            if self.supervision == "all-pairs":
                within = neighbors_within(X, X, neighbor_threshold(X, self.n_neighbors))
                upper = np.triu_indices(X.shape[0], 1)
                split.memo[key] = np.stack(upper, axis=1).astype(np.int64), within[upper]
            else:
                split.memo[key] = pairs_from_neighbors(
                    X,
                    self.n_neighbors,
                    self.n_pairs,
                    similar_fraction=self.similar_fraction,
                    random_state=seed,
                )
        pairs, similar = split.memo[key]
        return hasher.fit(X, pairs=pairs, similar=similar)

    def evaluate(
        self, split: Split, n_bits: int, seed: int, fits: dict | None = None
    ) -> tuple[Any, dict[str, Any], Any]:
        """``(Hamming distances (n_q, n_db), timing and fitted columns, the hasher)``."""
        hasher, columns = self._fitted_hasher(split, n_bits, seed, fits)
        start = time.process_time()
        codes_q, codes_db = hasher.encode(split.X_q), hasher.encode(split.X_db)
        columns["encode_cpu_s"] = time.process_time() - start
        return hamming_cdist(codes_q, codes_db, n_bits), columns, hasher

    def _fitted_hasher(self, split: Split, n_bits: int, seed: int, fits: dict | None = None):
        """The fitted hasher and its columns; ``fits`` (a dict kept by the caller for one
        split) memoizes fits, so specs differing only in their search reuse one model."""
        key = (
            self.hasher,
            repr(sorted(_resolve(self.params, n_bits).items())),
            self.supervision,
            self.n_neighbors,
            self.n_pairs,
            self.similar_fraction,
            self.n_train,
            n_bits,
            seed,
        )
        if fits is not None and key in fits:
            hasher, fit_s = fits[key]
        else:
            hasher = self.build(n_bits, seed)
            start = time.process_time()
            self.fit(hasher, split, seed)
            fit_s = time.process_time() - start
            if fits is not None:
                fits[key] = (hasher, fit_s)
        columns: dict[str, Any] = {"fit_cpu_s": fit_s}
        for name in self.fitted:
            value = getattr(hasher, name)
            columns[name] = value.item() if isinstance(value, np.generic) else value
        return hasher, columns


@dataclass(frozen=True)
class SearchResult:
    """What a :class:`SearchSpec` found: ``ids`` ``(n_q, k)`` (-1 pads), nearest first, and
    ``n_examined`` ``(n_q,)``, the database items each query's search touched."""

    ids: np.ndarray
    n_examined: np.ndarray


@dataclass(frozen=True)
class SearchSpec(MethodSpec):
    """A hasher behind a :class:`~hashlearn.Searcher`: ``index`` (a registry name, or a
    callable ``index(n_bits, seed)`` returning an index object), ``rerank`` (as Searcher's;
    ``"metric"`` for the hasher's learned metric) and ``n_candidates`` (``"all"``: every
    database item is re-ranked -- an exhaustive scan under the re-ranking distance). The
    database is added through the Searcher and the queries searched for ``k`` neighbours;
    ``search_cpu_s`` is the CPU time of encoding the queries, finding the candidates and
    re-ranking them."""

    index: Any = "flat"
    rerank: Any = None
    k: int = 10
    n_candidates: Any = None

    def evaluate(
        self, split: Split, n_bits: int, seed: int, fits: dict | None = None
    ) -> tuple[Any, dict[str, Any], Any]:
        hasher, columns = self._fitted_hasher(split, n_bits, seed, fits)
        n_db = split.X_db.shape[0]
        index = self.index(n_bits, seed) if callable(self.index) else self.index
        n_candidates = n_db if self.n_candidates == "all" else self.n_candidates
        searcher = Searcher(hasher, index, rerank=self.rerank, n_candidates=n_candidates)
        start = time.process_time()
        searcher.add(split.X_db)
        columns["encode_cpu_s"] = time.process_time() - start
        start = time.process_time()
        _, ids = searcher.search(split.X_q, self.k)
        columns["search_cpu_s"] = time.process_time() - start
        if callable(getattr(searcher.index, "candidates", None)) and self.n_candidates != "all":
            codes_q = hasher.encode(split.X_q)
            _, n_examined = searcher.index.candidates(codes_q, return_counts=True)
        else:
            n_examined = np.full(split.X_q.shape[0], min(n_db, n_candidates or n_db))
        return SearchResult(ids, np.asarray(n_examined, np.int64)), columns, hasher


@dataclass(frozen=True)
class BucketKeys:
    """What a :class:`BucketerSpec` produced: the keys of the queries and of the database,
    ``(n, n_tables)`` int64, tables in the order the bucketer built them."""

    queries: np.ndarray
    database: np.ndarray
    bucketer: Any


@dataclass(frozen=True)
class BucketerSpec:
    """A bucketer (a search forest, k-means trees, LSH tables): ``bucketer`` its class,
    ``params`` its parameters (callables of the depth allowed), ``depth_param`` the name
    of the parameter that the code-length loop of :func:`run_specs` sets (the depth of a
    tree, the bits of a table). Fitted on ``n_train`` random database rows; the output is
    :class:`BucketKeys`."""

    name: str
    bucketer: Callable[..., Any]
    params: Mapping[str, Any] = field(default_factory=dict)
    depth_param: str = "max_depth"
    n_train: int | None = None
    deterministic: bool = False

    def applies(self, n_bits: int, split: Split) -> bool:
        return True

    def as_run(self) -> str:
        """The class and parameters behind this row (the depth set per column)."""
        return _call_text(self.bucketer.__name__, self.params)

    def evaluate(
        self, split: Split, depth: int, seed: int, fits: dict | None = None
    ) -> tuple[Any, dict[str, Any], Any]:
        params = {**_resolve(self.params, depth), self.depth_param: depth}
        bucketer = _set_seed(self.bucketer(**params), seed)
        rows = MethodSpec.training_rows(self, split, seed)  # type: ignore[arg-type]
        start = time.process_time()
        bucketer.fit(split.X_db[rows])
        columns: dict[str, Any] = {"fit_cpu_s": time.process_time() - start}
        start = time.process_time()
        keys = BucketKeys(bucketer.keys(split.X_q), bucketer.keys(split.X_db), bucketer)
        columns["encode_cpu_s"] = time.process_time() - start
        return keys, columns, bucketer


@dataclass(frozen=True)
class Split:
    """A database and held-out queries, with labels and ground truths when known.

    ``truth`` maps a ground-truth name to per-query neighbour id lists ``(n_q, K)`` (``-1``
    pads); ``relevance`` maps a name to a boolean ``(n_q, n_db)`` relevance matrix;
    ``train_rows`` the database rows methods are fitted on (default: all of them).
    """

    X_db: Any
    X_q: Any
    y_db: np.ndarray | None = None
    y_q: np.ndarray | None = None
    truth: Mapping[str, np.ndarray] = field(default_factory=dict)
    relevance: Mapping[str, np.ndarray] = field(default_factory=dict)
    train_rows: np.ndarray | None = None
    #: supervision computed from this split (pairs), shared by the specs run on it
    memo: dict = field(default_factory=dict, init=False, repr=False, compare=False)

    @classmethod
    def holdout(cls, X, y=None, *, n_queries: int, random_state=None) -> Split:
        """``n_queries`` random rows as queries, the rest as the database (order kept)."""
        X = X if sp.issparse(X) else np.asarray(X)
        n = X.shape[0]
        if not 1 <= n_queries < n:
            raise ValueError(f"n_queries must be in [1, {n - 1}] for {n} rows. Got {n_queries}.")
        rng = check_random_state(random_state)
        is_query = np.zeros(n, bool)
        is_query[rng.choice(n, n_queries, replace=False)] = True
        return cls._from_mask(X, y, is_query)

    @classmethod
    def per_class(cls, X, y, *, n_per_class: int, random_state=None) -> Split:
        """``n_per_class`` random queries of every class held out, the rest the database
        (Jain, Kulis & Grauman, *Fast Image Search for Learned Metrics*, CVPR 2008, Sec. 4)."""
        y = np.asarray(y)
        rng = check_random_state(random_state)
        is_query = np.zeros(len(y), bool)
        for c in np.unique(y):
            is_query[rng.permutation(np.flatnonzero(y == c))[:n_per_class]] = True
        return cls._from_mask(X if sp.issparse(X) else np.asarray(X), y, is_query)

    @classmethod
    def _from_mask(cls, X, y, is_query: np.ndarray) -> Split:
        y = None if y is None else np.asarray(y)
        db, q = np.flatnonzero(~is_query), np.flatnonzero(is_query)
        return cls(
            X_db=X[db],
            X_q=X[q],
            y_db=None if y is None else y[db],
            y_q=None if y is None else y[q],
        )

    def with_train_per_class(self, n_per_class: int, random_state=None) -> Split:
        """``train_rows``: ``n_per_class`` random labelled database rows of every class."""
        if self.y_db is None:
            raise ValueError("with_train_per_class needs labels y.")
        rng = check_random_state(random_state)
        rows = [
            rng.permutation(np.flatnonzero(self.y_db == c))[:n_per_class]
            for c in np.unique(self.y_db)
        ]
        return replace(self, train_rows=np.sort(np.concatenate(rows)))

    def with_euclidean_truth(self, k: int, name: str = "euclidean") -> Split:
        """Add the exact ``k`` Euclidean nearest neighbours of each query as ``truth[name]``."""
        _, ids = exact_knn(self.X_db, self.X_q, k)
        return replace(self, truth={**self.truth, name: ids})

    def with_label_relevance(self, name: str = "label") -> Split:
        """Add ``relevance[name]``: a database item is relevant when it shares the label."""
        if self.y_db is None or self.y_q is None:
            raise ValueError("with_label_relevance needs labels y.")
        rel = relevance_from_labels(self.y_q.astype(np.int64), self.y_db.astype(np.int64))
        return replace(self, relevance={**self.relevance, name: rel})

    def with_threshold_relevance(self, n_neighbors: int, name: str = "euclidean") -> Split:
        """Add ``relevance[name]``: items within the Euclidean threshold that gives each point
        ``n_neighbors`` neighbours on average (the MLH protocol, Sec. 6.1)."""
        radius = neighbor_threshold(self.X_db, n_neighbors)
        rel = neighbors_within(self.X_q, self.X_db, radius)
        return replace(self, relevance={**self.relevance, name: rel})

    def relevant(self, name: str) -> np.ndarray:
        """Relevance matrix ``name``, from ``relevance`` or built from ``truth``."""
        if name in self.relevance:
            return self.relevance[name]
        if name in self.truth:
            return relevance_from_neighbors(self.truth[name], self.X_db.shape[0])
        raise KeyError(
            f"the split has no ground truth {name!r}; it has "
            f"{sorted({*self.truth, *self.relevance})}."
        )


# ---------------------------------------------------------------------------- measures


def precision_at_radius(radius: int, truth: str, aggregate: str = "per_query") -> Measure:
    """Precision and recall within Hamming ``radius`` (MLH Sec. 6.1); an empty retrieval
    scores 0 per query (``aggregate="pooled"``: one ratio of sums, as the MLH code)."""
    tag = f"@r{radius}" + ("" if aggregate == "per_query" else f"_{aggregate}")

    def measure(d: np.ndarray, split: Split, n_bits: int) -> dict[str, float]:
        p, r = precision_recall_at_radius(d, split.relevant(truth), radius, aggregate=aggregate)
        return {f"precision{tag}": p, f"recall{tag}": r}

    return measure


def answered_at_radius(radius: int) -> Measure:
    """Fraction of the queries that retrieve at least one item within Hamming ``radius``
    (what a pooled precision averages over: the others retrieve nothing)."""

    def measure(d: np.ndarray, split: Split, n_bits: int) -> dict[str, float]:
        return {f"answered@r{radius}": float(np.mean((np.asarray(d) <= radius).any(axis=1)))}

    return measure


def recall_at_m_curve(m_values: Iterable[int], truth: str = "euclidean") -> Measure:
    """Fraction of the true neighbours among the first M of the Hamming ranking (random
    ties, seeded), for every M (Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale
    Image Search*, 2013, Fig. 11)."""
    m_values = [int(m) for m in m_values]

    def measure(d: np.ndarray, split: Split, n_bits: int) -> dict[str, Any]:
        curve = recall_at_m(d, split.truth[truth], m_values, random_state=0)
        out: dict[str, Any] = {
            f"recall@{m}": float(v) for m, v in zip(m_values, curve, strict=True)
        }
        out["recall_curve"] = curve
        return out

    return measure


def pr_curve_auc(truth: str, aggregate: str = "pooled") -> Measure:
    """Area under the precision-recall curve over Hamming radii 0..b (MLH Sec. 6.2)."""

    def measure(d: np.ndarray, split: Split, n_bits: int) -> dict[str, Any]:
        p, r = precision_recall_curve(d, split.relevant(truth), n_bits, aggregate=aggregate)
        return {"pr_auc": pr_auc(p, r), "precision_curve": p, "recall_curve_pr": r}

    return measure


def knn_error(*, radius: int | None = None, n_bins: int | None = None) -> Measure:
    """k-NN classification error over Hamming distances with an absolute (``radius``) or a
    relative (``n_bins`` nearest non-empty bins) threshold (the LambdaRank bit-vectors
    paper, Sec. 3)."""
    tag = f"knn_error@r{radius}" if radius is not None else f"knn_error@{n_bins}bins"

    def measure(d: np.ndarray, split: Split, n_bits: int) -> dict[str, float]:
        if split.y_db is None or split.y_q is None:
            raise ValueError(f"{tag} needs labels y.")
        err = knn_classification_error(
            d, split.y_db.astype(np.int64), split.y_q.astype(np.int64), radius=radius, k=n_bins
        )
        return {tag: err}

    return measure


def neighbor_vote_error(ids, distances, y_db, y_q) -> float:
    """k-NN error of given neighbour lists: ``ids`` ``(m, k)`` database rows (-1 pads) with
    their ``distances``; every listed item votes, a tie between classes goes to the class of
    the nearest voter (:func:`hashlearn.evaluate.knn_classify`'s conventions)."""
    ids = np.asarray(ids)
    far = int(np.max(distances, initial=0)) + 1
    dense = np.full((ids.shape[0], len(y_db)), far, np.int64)
    rows, slots = np.nonzero(ids >= 0)
    dense[rows, ids[rows, slots]] = np.asarray(distances)[rows, slots]
    return knn_classification_error(
        dense, np.asarray(y_db, np.int64), np.asarray(y_q, np.int64), radius=far - 1
    )


def knn_error_of_neighbors() -> Measure:
    """k-NN classification error of a search's neighbours: all ``k`` vote, a tie between
    classes going to the class of the nearest voter (:func:`neighbor_vote_error` with the
    neighbour ranks as distances)."""

    def measure(result: SearchResult, split: Split, n_bits: int) -> dict[str, float]:
        ranks = np.broadcast_to(np.arange(result.ids.shape[1]), result.ids.shape)
        err = neighbor_vote_error(result.ids, ranks, split.y_db, split.y_q)
        return {"knn_error": err, "knn_accuracy": 1.0 - err}

    return measure


def searched_fraction() -> Measure:
    """Mean fraction of the database a search examined per query (Jain et al., Fig. 1)."""

    def measure(result: SearchResult, split: Split, n_bits: int) -> dict[str, float]:
        return {"searched": fraction_searched(result.n_examined, split.X_db.shape[0])}

    return measure


def candidate_recall_curve(truth: str, tree_counts: Sequence[int]) -> Measure:
    """Recall of the true neighbours in the candidate set against its size as tables are
    added (Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011, Fig.
    2): for the first ``t`` tables of every ``t`` in ``tree_counts``, the candidates are the
    items sharing a key with the query in at least one of them (an inverted
    :class:`TableIndex`); the curve gives their mean number and the mean fraction of each
    query's true neighbours among them. Candidate sets only grow with ``t``, so recall never
    falls along a curve."""
    tree_counts = sorted({int(t) for t in tree_counts})

    def measure(keys: BucketKeys, split: Split, n_bits: int) -> dict[str, Any]:
        relevant = split.relevant(truth)
        n_true = np.maximum(relevant.sum(axis=1), 1)
        counts = [t for t in tree_counts if t <= keys.database.shape[1]]
        sizes, recalls = [], []
        for t in counts:
            index = TableIndex(t)
            index.add(keys.database[:, :t])
            lims, ids, _ = index.candidates_csr(keys.queries[:, :t])
            query_of = np.repeat(np.arange(len(lims) - 1), np.diff(lims))
            hits = np.bincount(query_of[relevant[query_of, ids]], minlength=len(lims) - 1)
            sizes.append(float(np.diff(lims).mean()))
            recalls.append(float(np.mean(hits / n_true)))
        return {
            "trees": np.asarray(counts),
            "mean_candidates": np.asarray(sizes),
            "candidate_recall": np.asarray(recalls),
        }

    return measure


# ------------------------------------------------------------------------------- loop


def run_specs(
    specs: Iterable[MethodSpec | BucketerSpec],
    split: Split,
    *,
    bits: Iterable[int],
    seeds: Iterable[int],
    measures: Iterable[Measure],
    progress: Callable[..., Any] | None = None,
    desc: str = "methods",
    models: dict | None = None,
    fits: dict | None = None,
    n_jobs: int = 1,
) -> list[dict[str, Any]]:
    """Fit, encode (or search) and measure every spec at every code length and seed.

    Returns one record per (method, bits, seed): ``method``, ``bits``, ``seed``,
    ``fit_cpu_s``, ``encode_cpu_s`` (``search_cpu_s`` for a search) and every measure's
    columns (a spec with ``deterministic=True`` runs for the first seed only; one whose
    ``applies(bits, split)`` is false is skipped). ``progress`` is a tqdm-like factory
    ``progress(total=..., desc=...)`` whose bar is advanced once per fitted model.
    ``models``, when given a dict, receives each fitted model under ``(method, bits, seed)``.
    ``fits``: a dict kept across calls on the same split; a hasher spec whose hasher,
    parameters, supervision, code length and seed match an earlier fit reuses that model
    (its ``fit_cpu_s`` is the original fit's).

    ``n_jobs``: worker processes (forked, one BLAS and one hashlearn thread each). Every
    (seed, code length) is one task, so fits reused within it stay reused; the records come
    back in the sequential order and, every fit being seeded, with the same values as
    ``n_jobs=1`` run with one BLAS thread, except the CPU-time columns (each worker's own
    CPU time).
    """
    specs, bits, seeds, measures = list(specs), list(bits), list(seeds), list(measures)
    n_jobs = check_int(n_jobs, "n_jobs", "run_specs", low=1)
    tasks = [
        [
            (seed, n_bits, spec)
            for spec in specs
            if spec.applies(n_bits, split) and not (spec.deterministic and i > 0)
        ]
        for i, seed in enumerate(seeds)
        for n_bits in bits
    ]
    tasks = [task for task in tasks if task]
    bar = progress(total=sum(map(len, tasks)), desc=desc) if progress else None
    fits = {} if fits is None else fits
    done: dict[int, tuple] = {}
    checkpoints = current_checkpoints()
    keys: list[str] = []
    if checkpoints is not None:  # tasks an earlier, stopped run finished (--resume)
        keys = checkpoints.keys(desc, tasks, split, measures)
        for i, key in enumerate(keys):
            found = checkpoints.load(key, models is not None)
            if found is not None:
                done[i] = found
                if bar is not None:
                    bar.update(len(tasks[i]))
    todo = [i for i in range(len(tasks)) if i not in done]

    def finished(i: int, task_records, task_models) -> None:
        done[i] = (task_records, task_models)
        if checkpoints is not None:
            checkpoints.save(keys[i], task_records, task_models)

    try:
        if n_jobs == 1 or len(todo) <= 1:
            step = bar.update if bar is not None else None
            for i in todo:
                task_records, task_models, _ = _run_task(tasks[i], split, measures, fits, step)
                finished(i, task_records, task_models)
        else:

            def on_result(i: int, result) -> None:
                task_records, task_models, new_fits = result
                fits.update(new_fits)
                finished(i, task_records, task_models)
                if bar is not None:
                    bar.update(len(task_records))

            _run_forked(tasks, todo, split, measures, fits, n_jobs, on_result)
    finally:
        if bar is not None:
            bar.close()
    records: list[dict[str, Any]] = []
    for i in range(len(tasks)):
        task_records, task_models = done[i]
        _collect(task_records, task_models, records, models)
    return records


def _run_task(task, split: Split, measures, fits: dict, step=None):
    """Run one (seed, code length)'s jobs, calling ``step(1)`` after each;
    ``(records, models, fits added)``."""
    before = set(fits)
    records, models = [], []
    for seed, n_bits, spec in task:
        output, columns, model = spec.evaluate(split, n_bits, seed, fits)
        record: dict[str, Any] = {"method": spec.name, "bits": n_bits, "seed": seed}
        record.update(columns)
        for measure in measures:
            record.update(measure(output, split, n_bits))
        records.append(record)
        models.append(model)
        if step is not None:
            step(1)
    return records, models, {k: fits[k] for k in fits.keys() - before}


def _collect(task_records, task_models, records, models) -> None:
    records += task_records
    if models is not None:
        for record, model in zip(task_records, task_models, strict=True):
            models[(record["method"], record["bits"], record["seed"])] = model


#: what a forked worker of :func:`_run_forked` reads: the tasks, the split, the measures
_FORKED: dict[str, Any] = {}


def _forked_init() -> None:
    from threadpoolctl import threadpool_limits

    from hashlearn._utils.parallel import set_num_threads

    threadpool_limits(1)  # the workers share the cores: one BLAS thread each
    set_num_threads(1)


def _forked_task(i: int):
    return _run_task(_FORKED["tasks"][i], _FORKED["split"], _FORKED["measures"], _FORKED["fits"])


def _run_forked(tasks, ids, split: Split, measures, fits: dict, n_jobs: int, on_result) -> None:
    """Run ``tasks[i]`` for each ``i`` in ``ids`` on ``n_jobs`` forked workers, handing each
    result to ``on_result(i, result)`` as soon as it is done (the caller puts the records in
    task order), so a stopped run has checkpointed every finished task.

    The workers inherit the tasks, the split and the measures (closures, not picklable)
    through ``fork``; only task numbers go to them and records and fitted models come back.
    On an error (or Ctrl-C) the tasks not yet started are cancelled.
    """
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor, as_completed

    if _FORKED:
        raise RuntimeError("run_specs(n_jobs > 1) cannot be nested.")
    _FORKED.update(tasks=tasks, split=split, measures=measures, fits=fits)
    context = multiprocessing.get_context("fork")
    pool = ProcessPoolExecutor(n_jobs, mp_context=context, initializer=_forked_init)
    try:
        futures = {pool.submit(_forked_task, i): i for i in ids}
        for future in as_completed(futures):
            on_result(futures[future], future.result())
    finally:
        pool.shutdown(wait=True, cancel_futures=True)
        _FORKED.clear()


def summarize(
    records: Iterable[Mapping[str, Any]], value: str, by: Sequence[str] = ("method", "bits")
) -> dict[tuple, tuple[float, float, int]]:
    """``{key: (mean, std, n)}`` of column ``value`` over the records sharing ``by``."""
    groups: dict[tuple, list[float]] = {}
    for rec in records:
        groups.setdefault(tuple(rec[k] for k in by), []).append(float(rec[value]))
    return {key: (float(np.mean(v)), float(np.std(v)), len(v)) for key, v in groups.items()}


# ------------------------------------------------------------------------------ claims


def claim(
    paper: str,
    text: str,
    data: str,
    margin,
    seeds: int | None = None,
    *,
    holds: bool | None = None,
    baseline: str = "",
) -> dict[str, Any]:
    """One row of a reproduction's claims table.

    ``margin``: the paired differences of the claim (one per seed or partition, method minus
    baseline, signed so that positive is the paper's direction), or one number. The verdict
    (:mod:`hashlearn.experiments._stats`): "holds" when the 95 % paired t interval of their
    mean excludes 0 above, "fails" when it excludes 0 below, "tie" otherwise (one number has
    no interval: "tie"). ``holds``, given, is a deterministic check (e.g. exact search finds
    the true neighbours): its verdict is "holds" or "fails" and its interval "exact".
    ``seeds``: must equal the number of differences when given with several. ``baseline``:
    the class and parameters of the row the claim compares against, as run.
    """
    from hashlearn.experiments._stats import paired_t_interval, verdict

    diffs = np.atleast_1d(np.asarray(margin, np.float64))
    if diffs.ndim != 1:
        raise ValueError(f"margin must be a number or a 1-D sequence. Got shape {diffs.shape}.")
    if seeds is not None and diffs.size > 1 and int(seeds) != diffs.size:
        raise ValueError(f"seeds ({seeds}) must equal the number of differences ({diffs.size}).")
    n = diffs.size if seeds is None or diffs.size > 1 else int(seeds)
    stat = paired_t_interval(diffs)
    if holds is not None:
        result, low, high, interval = ("holds" if holds else "fails"), stat.mean, stat.mean, "exact"
    else:
        result, low, high = verdict(stat.low, stat.high), stat.low, stat.high
        interval = "paired t" if diffs.size > 1 else "none"
    return {
        "paper": paper,
        "claim": text,
        "data": data,
        "verdict": result,
        "holds": result == "holds",
        "margin": stat.mean,
        "ci_low": None if math.isnan(low) else low,
        "ci_high": None if math.isnan(high) else high,
        "interval": interval,
        "n": n,
        "seeds": n,
        "baseline": baseline,
    }


def _interval_cell(c: Mapping[str, Any]) -> str:
    if c["interval"] == "exact":
        return "exact (deterministic check)"
    if c["ci_low"] is None:
        return "none (n = 1)"
    return f"[{c['ci_low']:+.3f}, {c['ci_high']:+.3f}]"


def write_claims(out_dir: str | os.PathLike, claims: Sequence[Mapping[str, Any]]) -> str:
    """Write ``claims.json`` into ``out_dir``; return the claims as a markdown table (margin,
    its 95 % paired t interval, n and the baseline as run)."""
    from hashlearn.experiments._common import CLAIMS_HEADER, markdown_table, write_json

    write_json(Path(out_dir) / "claims.json", list(claims))
    rows = [
        [
            c["paper"],
            c["claim"],
            c["data"],
            c["verdict"],
            f"{c['margin']:+.3f}",
            _interval_cell(c),
            c["n"],
            c["baseline"] or "-",
        ]
        for c in claims
    ]
    return markdown_table(CLAIMS_HEADER, rows)  # the header the claims overview looks for


def mean_table(
    records: Sequence[Mapping[str, Any]],
    value: str,
    *,
    column: str = "bits",
    label: str = "{} bits",
    scale: float = 1.0,
) -> str:
    """Markdown table of column ``value``: a row per method, a column per value of
    ``column`` (``label`` formats its header), mean ± std over the seeds (the mean alone for
    one seed; "n/a" where the method did not run), times ``scale``."""
    from hashlearn.experiments._common import markdown_table

    methods = list(dict.fromkeys(r["method"] for r in records))
    columns = sorted({r[column] for r in records})
    stats = summarize(records, value, by=("method", column))
    rows = []
    for method in methods:
        row = [method]
        for c in columns:
            if (method, c) not in stats:
                row.append("n/a")
                continue
            mean, std, n = stats[(method, c)]
            row.append(f"{scale * mean:.3f}" + (f" ± {scale * std:.3f}" if n > 1 else ""))
        rows.append(row)
    return markdown_table(["method"] + [label.format(c) for c in columns], rows)


@dataclass(frozen=True)
class RunOptions:
    """What ``hashlearn reproduce`` passes every reproduction: ``quick`` (small settings),
    ``seed``, ``data_dir`` (Fashion-MNIST's directory), ``progress`` (the tqdm-like factory
    of :func:`run_specs`), ``X`` / ``y`` (your own data instead of the real datasets) and
    ``n_jobs`` (worker processes of :func:`run_specs`, for the reproductions that use them)."""

    quick: bool = False
    seed: int = 0
    data_dir: Any = None
    progress: Callable[..., Any] | None = None
    X: Any = None
    y: Any = None
    n_jobs: int = 1


def reproduction(settings: Callable[[bool], dict], *, needs_labels: bool = False):
    """Decorator giving a paper module's ``body(out_dir, cfg, opts) -> markdown`` the public
    signature ``run(out_dir, *, quick=False, seed=0, data_dir=None, progress=None, X=None,
    y=None, n_jobs=1, resume=False)``: ``out_dir`` is created, ``cfg = settings(quick)``,
    ``opts`` a :class:`RunOptions`. ``needs_labels``: the protocol needs ``y`` with a user's
    ``X``. Every finished task of :func:`run_specs` is kept in ``out_dir/checkpoints``
    (:mod:`~hashlearn.experiments.checkpoints`) until the run is whole; ``resume=True``
    reuses those an earlier, stopped run of the same command left."""

    def wrap(body: Callable[[Path, dict, RunOptions], str]):
        def run(
            out_dir,
            *,
            quick=False,
            seed=0,
            data_dir=None,
            progress=None,
            X=None,
            y=None,
            n_jobs=1,
            resume=False,
        ) -> str:
            if X is not None and not sp.issparse(X):
                X = np.asarray(X)
                if X.ndim != 2 or X.shape[0] < 2:
                    raise ValueError(f"X must be a 2-D array of rows. Got shape {X.shape}.")
            if y is not None and (X is None or len(y) != X.shape[0]):
                raise ValueError("y must hold one label per row of X.")
            if needs_labels and X is not None and y is None:
                name = body.__module__.rsplit(".", 1)[-1].replace("_", "-")
                raise ValueError(
                    f"{name} needs labels: pass y with X (--data: a .npz or HDF5 file "
                    "holding arrays X and y)."
                )
            out = Path(out_dir)
            out.mkdir(parents=True, exist_ok=True)
            n_jobs = check_int(n_jobs, "n_jobs", "run", low=1)
            opts = RunOptions(quick, seed, data_dir, progress, X, y, n_jobs)
            checkpoints = Checkpoints(out / "checkpoints", resume=bool(resume))
            with checkpoints.active():
                report = body(out, settings(quick), opts)
            checkpoints.clear()
            return report

        run.body, run.settings = body, settings  # type: ignore[attr-defined]  # for other settings: run.body(out, cfg, opts)
        run.__doc__ = body.__doc__
        run.__name__ = run.__qualname__ = body.__name__
        run.__module__ = body.__module__
        return run

    return wrap
