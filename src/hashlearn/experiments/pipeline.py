"""One evaluation loop for every reproduction: method specs run over a data set.

A reproduction is data, protocol settings, the claims it checks and its plots; the loop that
fits each method, encodes the database and the queries and measures the codes lives here,
once, and uses only the public API (:func:`hashlearn.hashers.make_hasher`,
:func:`hashlearn.codes.hamming_cdist`, :mod:`hashlearn.evaluate`).

* :class:`MethodSpec` -- a method: a display name, a registered hasher, its parameters and
  the supervision it trains on (none, the labels, or Euclidean-neighbour pairs).
* :class:`Split` -- a database, held-out queries, their labels and ground truths.
* Measures -- functions ``measure(distances, split, n_bits) -> {column: value}`` over the
  ``(n_queries, n_db)`` Hamming distances; :func:`precision_at_radius`,
  :func:`recall_at_m_curve`, :func:`pr_curve_auc` and :func:`knn_error` build the papers'.
* :func:`run_specs` -- every spec x code length x seed, one tidy record (a flat dict) each.
* :func:`summarize` -- mean and standard deviation over seeds, for tables and claims.

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
import time
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

import numpy as np
from sklearn.utils import check_random_state

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import (
    exact_knn,
    knn_classification_error,
    pr_auc,
    precision_recall_at_radius,
    precision_recall_curve,
    recall_at_m,
    relevance_from_labels,
    relevance_from_neighbors,
)
from hashlearn.hashers import make_hasher
from hashlearn.supervision import neighbor_threshold, pairs_from_neighbors

__all__ = [
    "MethodSpec",
    "Split",
    "Measure",
    "run_specs",
    "summarize",
    "precision_at_radius",
    "recall_at_m_curve",
    "pr_curve_auc",
    "knn_error",
]

SUPERVISION = ("none", "labels", "neighbors")

#: ``measure(distances, split, n_bits) -> {column: value}``; a value is a float or a 1-D array.
Measure = Callable[[np.ndarray, "Split", int], Mapping[str, Any]]


@dataclass(frozen=True)
class MethodSpec:
    """A method of a reproduction: a registered hasher, its parameters, its supervision.

    ``supervision``: ``"none"`` fits on the database alone; ``"labels"`` passes the
    database labels; ``"neighbors"`` passes pairs labelled by the Euclidean threshold that
    gives each point ``n_neighbors`` neighbours on average (Norouzi & Fleet, *Minimal Loss
    Hashing for Compact Binary Codes*, ICML 2011, Sec. 6.1), ``n_pairs`` of them.
    ``params`` may hold callables of the code length, e.g. ``{"p": lambda b: 10 * b}``.
    """

    name: str
    hasher: str
    params: Mapping[str, Any] = field(default_factory=dict)
    supervision: str = "none"
    n_neighbors: int = 50
    n_pairs: int = 100_000

    def __post_init__(self) -> None:
        if self.supervision not in SUPERVISION:
            raise ValueError(
                f"The 'supervision' parameter of MethodSpec must be a str among "
                f"{list(SUPERVISION)}. Got {self.supervision!r} instead."
            )

    def build(self, n_bits: int, seed: int):
        """The hasher for ``n_bits`` bits and ``seed`` (``random_state`` where it takes one)."""
        params = {k: (v(n_bits) if callable(v) else v) for k, v in self.params.items()}
        hasher = make_hasher(self.hasher, n_bits=n_bits, **params)
        if "random_state" in inspect.signature(type(hasher)).parameters:
            hasher.set_params(random_state=seed)
        return hasher

    def fit(self, hasher, split: Split, seed: int):
        """Fit ``hasher`` on the database of ``split`` with this spec's supervision."""
        if self.supervision == "none":
            return hasher.fit(split.X_db)
        if self.supervision == "labels":
            if split.y_db is None:
                raise ValueError(f"method {self.name!r} trains on labels; the split has none.")
            return hasher.fit(split.X_db, split.y_db)
        pairs, similar = pairs_from_neighbors(
            split.X_db, self.n_neighbors, self.n_pairs, random_state=seed
        )
        return hasher.fit(split.X_db, pairs=pairs, similar=similar)


@dataclass(frozen=True)
class Split:
    """A database and held-out queries, with labels and ground truths when known.

    ``truth`` maps a ground-truth name to per-query neighbour id lists ``(n_q, K)`` (``-1``
    pads); ``relevance`` maps a name to a boolean ``(n_q, n_db)`` relevance matrix.
    """

    X_db: np.ndarray
    X_q: np.ndarray
    y_db: np.ndarray | None = None
    y_q: np.ndarray | None = None
    truth: Mapping[str, np.ndarray] = field(default_factory=dict)
    relevance: Mapping[str, np.ndarray] = field(default_factory=dict)

    @classmethod
    def holdout(cls, X, y=None, *, n_queries: int, random_state=None) -> Split:
        """``n_queries`` random rows as queries, the rest as the database (order kept)."""
        X = np.asarray(X)
        n = X.shape[0]
        if not 1 <= n_queries < n:
            raise ValueError(f"n_queries must be in [1, {n - 1}] for {n} rows. Got {n_queries}.")
        rng = check_random_state(random_state)
        is_query = np.zeros(n, bool)
        is_query[rng.choice(n, n_queries, replace=False)] = True
        y = None if y is None else np.asarray(y)
        return cls(
            X_db=X[~is_query],
            X_q=X[is_query],
            y_db=None if y is None else y[~is_query],
            y_q=None if y is None else y[is_query],
        )

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
        d2 = (
            (self.X_q.astype(np.float64) ** 2).sum(1)[:, None]
            - 2.0 * self.X_q.astype(np.float64) @ self.X_db.astype(np.float64).T
            + (self.X_db.astype(np.float64) ** 2).sum(1)[None, :]
        )
        return replace(self, relevance={**self.relevance, name: d2 <= radius**2})

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


def recall_at_m_curve(m_values: Sequence[int], truth: str = "euclidean") -> Measure:
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
        err = knn_classification_error(
            d, split.y_db.astype(np.int64), split.y_q.astype(np.int64), radius=radius, k=n_bins
        )
        return {tag: err}

    return measure


# ------------------------------------------------------------------------------- loop


def run_specs(
    specs: Iterable[MethodSpec],
    split: Split,
    *,
    bits: Iterable[int],
    seeds: Iterable[int],
    measures: Iterable[Measure],
    progress: Callable[..., Any] | None = None,
    desc: str = "methods",
) -> list[dict[str, Any]]:
    """Fit, encode and measure every spec at every code length and seed.

    Returns one record per (method, bits, seed): ``method``, ``bits``, ``seed``,
    ``fit_cpu_s``, ``encode_cpu_s`` and every measure's columns. ``progress`` is a
    tqdm-like factory ``progress(total=..., desc=...)`` whose bar is advanced once per fit.
    """
    specs, bits, seeds, measures = list(specs), list(bits), list(seeds), list(measures)
    bar = progress(total=len(specs) * len(bits) * len(seeds), desc=desc) if progress else None
    records = []
    try:
        for seed in seeds:
            for n_bits in bits:
                for spec in specs:
                    hasher = spec.build(n_bits, seed)
                    start = time.process_time()
                    spec.fit(hasher, split, seed)
                    fit_s = time.process_time() - start
                    start = time.process_time()
                    codes_q, codes_db = hasher.encode(split.X_q), hasher.encode(split.X_db)
                    encode_s = time.process_time() - start
                    d = hamming_cdist(codes_q, codes_db, n_bits)
                    record: dict[str, Any] = {
                        "method": spec.name,
                        "bits": n_bits,
                        "seed": seed,
                        "fit_cpu_s": fit_s,
                        "encode_cpu_s": encode_s,
                    }
                    for measure in measures:
                        record.update(measure(d, split, n_bits))
                    records.append(record)
                    if bar is not None:
                        bar.update(1)
    finally:
        if bar is not None:
            bar.close()
    return records


def summarize(
    records: Iterable[Mapping[str, Any]], value: str, by: Sequence[str] = ("method", "bits")
) -> dict[tuple, tuple[float, float, int]]:
    """``{key: (mean, std, n)}`` of column ``value`` over the records sharing ``by``."""
    groups: dict[tuple, list[float]] = {}
    for rec in records:
        groups.setdefault(tuple(rec[k] for k in by), []).append(float(rec[value]))
    return {key: (float(np.mean(v)), float(np.std(v)), len(v)) for key, v in groups.items()}
