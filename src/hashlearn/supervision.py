"""Supervision for learned codes, metrics and search trees: pairs, thresholds, neighbours.

Every supervised method in hashlearn takes either labels, ``fit(X, y)``, or explicit pairs,
``fit(X, pairs=P, similar=s)`` with ``P`` an ``(m, 2)`` array of row indices into ``X`` and
``s`` a boolean array of length ``m`` (True: the two rows are similar). :func:`resolve_pairs`
turns either form into checked pairs, so every method reads supervision the same way.

Neighbour-based supervision (Norouzi & Fleet, *Minimal Loss Hashing for Compact Binary Codes*, ICML 2011 §6.1, Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §5): two
points are neighbours when their Euclidean distance is below a threshold chosen so that each
training point has ``K`` neighbours on average (:func:`neighbor_threshold`).
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.multiclass import check_classification_targets
from sklearn.utils.validation import check_array

from hashlearn._utils.knn import exact_knn
from hashlearn._utils.validation import check_int

__all__ = [
    "check_pairs",
    "check_supervision",
    "resolve_pairs",
    "pairs_from_labels",
    "pairs_from_label_neighbourhoods",
    "neighbor_threshold",
    "neighbors_within",
    "pairs_from_neighbors",
    "sample_pairs",
    "other_rows",
    "squared_distances",
]


def check_pairs(pairs, similar, n_samples: int, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate explicit supervision: ``(pairs int64 (m, 2), similar bool (m,))``."""
    pairs_arr = np.asarray(pairs)
    if pairs_arr.ndim != 2 or pairs_arr.shape[1] != 2:
        raise ValueError(
            f"pairs passed to {owner} must have shape (m, 2). Got shape {pairs_arr.shape}."
        )
    if pairs_arr.size and not np.issubdtype(pairs_arr.dtype, np.integer):
        raise TypeError(
            f"pairs passed to {owner} must hold integer row indices. Got dtype {pairs_arr.dtype}."
        )
    pairs_arr = pairs_arr.astype(np.int64, copy=False)
    if pairs_arr.size and (pairs_arr.min() < 0 or pairs_arr.max() >= n_samples):
        raise ValueError(
            f"pairs passed to {owner} index rows of X, which has {n_samples} "
            f"rows; got indices in [{pairs_arr.min()}, {pairs_arr.max()}]."
        )
    if similar is None:
        raise ValueError(f"{owner} needs similar=... (one bool per pair) with pairs=...")
    similar_arr = np.asarray(similar)
    if similar_arr.shape != (pairs_arr.shape[0],):
        raise ValueError(
            f"similar passed to {owner} must have shape ({pairs_arr.shape[0]},), "
            f"one value per pair. Got shape {similar_arr.shape}."
        )
    if similar_arr.dtype != np.bool_:
        if similar_arr.size and not np.isin(similar_arr, (0, 1)).all():
            raise ValueError(f"similar passed to {owner} must be booleans (or 0/1).")
        similar_arr = similar_arr.astype(bool)
    return pairs_arr, similar_arr


def _check_labels(y, n_samples: int, owner: str) -> np.ndarray:
    y = np.asarray(y)
    if y.ndim != 1 or len(y) != n_samples:
        raise ValueError(
            f"y passed to {owner} must be one label per row of X ({n_samples}). "
            f"Got shape {y.shape}."
        )
    if len(np.unique(y)) < 2:
        raise ValueError(
            f"y passed to {owner} has 1 class: with a single class there are no "
            "dissimilar pairs to learn from; pass at least two classes."
        )
    return y


def check_supervision(y, pairs, similar, n_samples: int, owner: str, *, targets: bool = True):
    """The supervision of a fit, checked: ``(y, None, None)`` for labels (at least two
    classes, one label per row; with ``targets``, classification targets as scikit-learn
    defines them) or ``(None, pairs, similar)`` as :func:`check_pairs` returns them. Exactly
    one of ``y`` and ``pairs`` must be given."""
    if pairs is not None and y is not None:
        raise ValueError(f"{owner} takes labels y or pairs=..., not both.")
    if pairs is not None:
        return (None, *check_pairs(pairs, similar, n_samples, owner))
    if similar is not None:
        raise ValueError(f"{owner} got similar=... without pairs=...")
    if y is None:
        raise ValueError(
            f"{owner} requires y to be passed, but the target y is None: it is supervised, "
            "call fit(X, y) with labels or fit(X, pairs=P, similar=s)."
        )
    y = np.asarray(y)
    if targets and y.ndim == 1 and len(y) == n_samples:
        check_classification_targets(y)
    return _check_labels(y, n_samples, owner), None, None


def pairs_from_labels(
    y,
    n_pairs: int,
    *,
    similar_fraction: float = 0.5,
    random_state=None,
    owner: str = "pairs_from_labels",
) -> tuple[np.ndarray, np.ndarray]:
    """Sample ``n_pairs`` distinct-row pairs: about ``similar_fraction`` of them from the same
    class (similar), the rest from different classes (dissimilar).

    Similar pairs pick a random anchor, then a random other member of its class (classes
    with one member are skipped); dissimilar pairs are drawn uniformly and rejected while
    labels agree. Returns ``(pairs int64 (n_pairs, 2), similar bool (n_pairs,))``.
    """
    y = _check_labels(y, len(np.asarray(y)), owner)
    n_pairs = check_int(n_pairs, "n_pairs", owner)
    if not 0.0 <= similar_fraction <= 1.0:
        raise ValueError(
            f"similar_fraction passed to {owner} must be in [0, 1]. Got {similar_fraction!r}."
        )
    rng = check_random_state(random_state)
    _, codes, counts = np.unique(y, return_inverse=True, return_counts=True)
    order = np.argsort(codes, kind="stable")
    starts = np.concatenate([[0], np.cumsum(counts)])
    n_sim = int(round(n_pairs * similar_fraction))
    if n_sim and counts.max() < 2:
        raise ValueError(
            f"y passed to {owner} has no class with two members, so there are no similar pairs."
        )
    # similar: anchor among rows whose class has >= 2 members, partner another class member
    eligible = np.flatnonzero(counts[codes] >= 2)
    a = eligible[rng.randint(len(eligible), size=n_sim)]
    c = codes[a]
    offset = rng.randint(counts[c] - 1)  # skip the anchor's own slot
    rank_a = np.empty(len(y), np.int64)
    rank_a[order] = np.arange(len(y)) - starts[codes[order]]
    offset = offset + (offset >= rank_a[a])
    b = order[starts[c] + offset]
    # dissimilar: uniform pairs, redrawn while labels agree
    n_dis = n_pairs - n_sim
    da = rng.randint(len(y), size=n_dis)
    db = rng.randint(len(y), size=n_dis)
    bad = codes[da] == codes[db]
    while bad.any():
        db[bad] = rng.randint(len(y), size=int(bad.sum()))
        bad = codes[da] == codes[db]
    pairs = np.stack([np.concatenate([a, da]), np.concatenate([b, db])], axis=1)
    similar = np.concatenate([np.ones(n_sim, bool), np.zeros(n_dis, bool)])
    perm = rng.permutation(n_pairs)
    return pairs[perm].astype(np.int64), similar[perm]


def pairs_from_label_neighbourhoods(
    X,
    y,
    n_neighbors: int,
    *,
    max_anchors: int = 10_000,
    max_candidates: int = 20_000,
    max_flops: float = 3e11,
    random_state=None,
    owner: str = "pairs_from_label_neighbourhoods",
) -> tuple[np.ndarray, np.ndarray]:
    """Label supervision where a nearest-neighbour search acts: each anchor row joined to its
    ``n_neighbors`` nearest rows (Euclidean) of its own class (similar) and to its
    ``n_neighbors`` nearest rows of other classes (dissimilar); plus, per anchor,
    ``n_neighbors`` uniform random pairs and ``n_neighbors`` pairs of
    :func:`pairs_from_labels` among the anchors (half within a class), all labelled by
    class.

    The near pairs are the target neighbours and impostors of Weinberger & Saul, *Distance
    Metric Learning for Large Margin Nearest Neighbor Classification* (JMLR 2009); the pairs
    across the whole set keep classes together and apart globally (without them a 16-bit
    code of well-separated classes learnt from near pairs split classes across bins). The
    neighbours are :func:`~hashlearn.evaluate.exact_knn`'s, searched among at most
    ``max_candidates`` rows (a random sample beyond), for at most ``max_anchors`` anchors
    (fewer where ``max_flops`` multiply-adds of distance products would be exceeded, but at
    least 1000). Returns ``(pairs int64 (m, 2), similar bool (m,))`` in row indices of
    ``X``, sorted by anchor.
    """
    X = check_array(X, dtype=np.float64)
    n, d = X.shape
    y = _check_labels(y, n, owner)
    k = check_int(n_neighbors, "n_neighbors", owner)
    rng = check_random_state(random_state)
    pool = np.arange(n) if n <= max_candidates else np.sort(rng.choice(n, max_candidates, False))
    cap = int(min(max_anchors, max(1000, max_flops / (2.0 * len(pool) * max(d, 1)))))
    anchors = pool if len(pool) <= cap else np.sort(rng.choice(pool, cap, replace=False))
    chunks = []
    for c in np.unique(y[anchors]):
        own = pool[y[pool] == c]
        rest = pool[y[pool] != c]
        at = anchors[y[anchors] == c]
        if len(own) > 1:  # the k nearest of its class, itself left out
            near = own[exact_knn(X[own], X[at], min(k + 1, len(own)))[1]]
            other = near != at[:, None]
            keep = other & (np.cumsum(other, axis=1) <= k)
            rows = np.broadcast_to(at[:, None], near.shape)
            chunks.append(np.stack([rows[keep], near[keep]], axis=1))
        if len(rest):
            near = rest[exact_knn(X[rest], X[at], min(k, len(rest)))[1]]
            chunks.append(np.stack([np.repeat(at, near.shape[1]), near.ravel()], axis=1))
    a = np.repeat(anchors, k)
    chunks.append(np.stack([a, other_rows(a, n, rng)], axis=1))
    chunks.append(anchors[pairs_from_labels(y[anchors], len(a), random_state=rng, owner=owner)[0]])
    pairs = np.concatenate(chunks).astype(np.int64)
    pairs = pairs[np.argsort(pairs[:, 0], kind="stable")]
    return pairs, y[pairs[:, 0]] == y[pairs[:, 1]]


def resolve_pairs(
    X,
    y,
    pairs,
    similar,
    *,
    n_pairs: int,
    owner: str,
    random_state=None,
    similar_fraction: float = 0.5,
) -> tuple[np.ndarray, np.ndarray]:
    """Supervision as checked pairs, from explicit ``pairs``/``similar`` or from labels ``y``.

    Exactly one of ``y`` and ``pairs`` must be given; with labels, ``n_pairs`` pairs are
    sampled by :func:`pairs_from_labels`.
    """
    y, pairs, similar = check_supervision(y, pairs, similar, X.shape[0], owner, targets=False)
    if pairs is not None:
        return pairs, similar
    return pairs_from_labels(
        y, n_pairs, similar_fraction=similar_fraction, random_state=random_state, owner=owner
    )


def squared_distances(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    """Brute-force squared Euclidean distances ``(len(A), len(B))`` of dense rows, through
    ``|a|^2 - 2 a.b + |b|^2`` (one matrix product; may dip below 0 by rounding)."""
    return (A * A).sum(1)[:, None] - 2.0 * A @ B.T + (B * B).sum(1)[None, :]


def _sq_dists(A: np.ndarray, B: np.ndarray) -> np.ndarray:
    return np.maximum(squared_distances(A, B), 0.0)


def neighbor_threshold(X, n_neighbors: int, *, max_rows: int = 5000, random_state=0) -> float:
    """Euclidean distance threshold giving each point ``n_neighbors`` neighbours on average.

    The MLH protocol (Norouzi & Fleet, *Minimal Loss Hashing for Compact Binary Codes*, ICML 2011 §6.1): a pair is similar when its distance is
    below this threshold. Self-pairs do not count. For more than ``max_rows`` points the
    threshold is estimated on a random subset of rows against all points, which keeps the
    average exact in expectation.
    """
    X = check_array(X, dtype=np.float64)
    n = X.shape[0]
    n_neighbors = check_int(n_neighbors, "n_neighbors", "neighbor_threshold", high=n - 1)
    rng = check_random_state(random_state)
    rows = np.arange(n) if n <= max_rows else np.sort(rng.choice(n, max_rows, replace=False))
    dists = []
    for start in range(0, len(rows), 512):
        block = rows[start : start + 512]
        d = _sq_dists(X[block], X)
        d[np.arange(len(block)), block] = np.inf  # exclude self
        dists.append(d.ravel())
    d = np.concatenate(dists)
    # halfway between the (K * rows)-th and the next smallest distance, so rounding in the
    # distance computation cannot move a pair across the threshold
    kth = n_neighbors * len(rows) - 1
    part = np.partition(d, [kth, kth + 1])
    return float((np.sqrt(part[kth]) + np.sqrt(part[kth + 1])) / 2)


def neighbors_within(X_query, X_db, threshold: float) -> np.ndarray:
    """Boolean ``(m, n)`` matrix: ``True`` where the Euclidean distance is <= ``threshold``."""
    Q = check_array(X_query, dtype=np.float64)
    D = check_array(X_db, dtype=np.float64)
    return _sq_dists(Q, D) <= threshold * threshold


def other_rows(rows: np.ndarray, n_samples: int, rng: np.random.RandomState) -> np.ndarray:
    """For each of ``rows`` a uniformly random *other* row among ``n_samples`` (>= 2)."""
    return (rows + 1 + rng.randint(n_samples - 1, size=len(rows))) % n_samples


def sample_pairs(n_samples: int, n_pairs: int, random_state=None) -> np.ndarray:
    """``n_pairs`` uniform random pairs of distinct rows, int64 ``(n_pairs, 2)``: the one
    sampler of random pairs (a uniform row, then :func:`other_rows`)."""
    n_samples = check_int(n_samples, "n_samples", "sample_pairs", low=2)
    n_pairs = check_int(n_pairs, "n_pairs", "sample_pairs", low=0)
    rng = check_random_state(random_state)
    a = rng.randint(n_samples, size=n_pairs)
    return np.stack([a, other_rows(a, n_samples, rng)], axis=1).astype(np.int64)


def pairs_from_neighbors(
    X, n_neighbors: int, n_pairs: int, *, similar_fraction: float = 0.5, random_state=None
) -> tuple[np.ndarray, np.ndarray]:
    """Pairs labelled by the Euclidean neighbour threshold of :func:`neighbor_threshold`.

    ``similar_fraction`` of the pairs join a point to one of its neighbours within the
    threshold (the rest are uniform random pairs, labelled by the threshold too, so most are
    dissimilar). Returns ``(pairs, similar)`` as :func:`check_pairs` does.
    """
    X = check_array(X, dtype=np.float64)
    rng = check_random_state(random_state)
    thr = neighbor_threshold(X, n_neighbors, random_state=rng)
    n = X.shape[0]
    n_sim = int(round(n_pairs * similar_fraction))
    anchors = rng.randint(n, size=n_sim)
    partners = np.empty(n_sim, np.int64)
    for start in range(0, n_sim, 512):
        block = anchors[start : start + 512]
        within = _sq_dists(X[block], X) <= thr * thr
        within[np.arange(len(block)), block] = False
        for j, row in enumerate(within):
            cand = np.flatnonzero(row)
            partners[start + j] = cand[rng.randint(len(cand))] if len(cand) else -1
    keep = partners >= 0
    sim_pairs = np.stack([anchors[keep], partners[keep]], axis=1)
    rand_pairs = sample_pairs(n, n_pairs - len(sim_pairs), rng)
    d = ((X[rand_pairs[:, 0]] - X[rand_pairs[:, 1]]) ** 2).sum(1)
    pairs = np.concatenate([sim_pairs, rand_pairs]).astype(np.int64)
    similar = np.concatenate([np.ones(len(sim_pairs), bool), d <= thr * thr])
    perm = rng.permutation(len(pairs))
    return pairs[perm], similar[perm]
