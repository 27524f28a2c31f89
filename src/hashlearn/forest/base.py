"""Bucketers: estimators mapping each item to one integer key per table.

A bucketer (Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 §3.4) is the learned half of an inverted index: a
forest of search trees sends an item to one leaf per tree, LSH tables to one bucket per
table, and the leaf / bucket numbers are the "index words" under which
:class:`hashlearn.index.table.TableIndex` files the item. Every bucketer has
``fit(X, y=None)``, ``keys(X) -> (n, n_tables) int64`` and ``n_tables``.

Key layout: bits 0..39 hold the leaf or bucket number, bits 40..62 a 23-bit tag
(``key_tag_``) derived from the bucketer's learned arrays, so an index built by one bucketer
can recognise (and refuse) the keys of another.

This module also holds the binary hyperplane tree shared by the boosted search forest
(projection and stump splits) and the bisecting k-means tree: internal node ``v`` sends
``x`` to ``left_[v]`` when ``s_v(x) > threshold_[v]`` and to ``right_[v]`` otherwise, with
``s_v(x) = x[feature_[v]]`` (a stump) or ``s_v(x) = proj_[-feature_[v] - 1] . x`` (a
hyperplane, the paper's ``p^T x + b > 0`` with ``threshold = -b``).
"""

from __future__ import annotations

import hashlib

import numba
import numpy as np
from sklearn.base import BaseEstimator
from sklearn.utils.validation import check_is_fitted, validate_data

from hashlearn._utils.dense import row_dot
from hashlearn._utils.parallel import available_cores, parallel_chunks
from hashlearn._utils.validation import check_y
from hashlearn.io import Persistable, check_estimator_state, estimator_from_state, estimator_state

__all__ = [
    "BaseBucketer",
    "TreeBuilder",
    "node_scores",
    "tree_leaves",
    "weighted_candidates_csr",
    "KEY_TAG_SHIFT",
    "KEY_LOCAL_MASK",
]

#: A bucketer's key is ``(tag << KEY_TAG_SHIFT) | local``: ``local`` the leaf or bucket in a
#: table, in ``[0, 2**40)``; ``tag`` (23 bits, ``KEY_TAG_MASK``) names the fitted bucketer,
#: so an index built from one bucketer's keys refuses another's (``TableIndex(key_tag=)``).
KEY_TAG_SHIFT = 40
KEY_LOCAL_MASK = (1 << KEY_TAG_SHIFT) - 1
KEY_TAG_MASK = (1 << 23) - 1


class BaseBucketer(Persistable, BaseEstimator):
    """Base class of bucketers: ``fit(X, y=None)``, ``keys(X)``, ``n_tables``.

    Subclasses implement ``_fit(X, y)`` (setting learned attributes ending in ``_``) and
    ``_local_keys(X, n_threads) -> (n, n_tables) int64`` with values in ``[0, 2**40)``.
    """

    n_tables: int  # a parameter (LSHTables) or a property (forests: n_trees)

    def fit(self, X, y=None):
        """Learn the tables from ``X`` (and ``y`` where the bucketer uses labels)."""
        X = validate_data(self, X, reset=True, dtype=np.float64, ensure_min_samples=2)
        y = check_y(y, X.shape[0])
        self._fit(X, y)
        self.key_tag_ = self._compute_tag()
        return self

    def keys(self, X, *, n_threads: int | None = None) -> np.ndarray:
        """One key per table for every row of ``X``: int64 ``(n, n_tables)``.

        Rows are processed on ``n_threads`` threads (default: every core); a row's keys do
        not depend on the thread count or on the other rows of ``X``.
        """
        check_is_fitted(self, "key_tag_")
        X = validate_data(self, X, reset=False, dtype=np.float64, ensure_min_samples=0)
        local = self._local_keys(np.ascontiguousarray(X), n_threads)
        return local | np.int64(self.key_tag_ << KEY_TAG_SHIFT)

    def leaves(self, X, *, n_threads: int | None = None) -> np.ndarray:
        """Keys without the tag: the leaf / bucket number in each table."""
        return self.keys(X, n_threads=n_threads) & KEY_LOCAL_MASK

    def table_weights(self) -> np.ndarray:
        """Weight of each table in the ranking score of :meth:`candidates` (all ones here;
        the boosted search forest returns its learned tree weights)."""
        check_is_fitted(self, "key_tag_")
        return np.ones(self.n_tables, np.float64)

    def candidates(
        self, index, X, *, n_threads: int | None = None
    ) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Candidates of every row of ``X`` in ``index`` (a :class:`TableIndex` built from
        this bucketer's keys), ranked: CSR ``(lims, ids, scores)``.

        The candidates of query ``q`` are the items sharing its key in at least one table,
        ``ids[lims[q]:lims[q+1]]``, ordered by the score
        ``T(q, x) = sum_l w_l 1(key_l(q) == key_l(x))`` descending, then id ascending, with
        ``w = table_weights()`` (see :func:`weighted_candidates_csr`).
        """
        return weighted_candidates_csr(
            index, self.keys(X, n_threads=n_threads), self.table_weights(), n_threads=n_threads
        )

    # ------------------------------------------------------------------ for subclasses

    def _fit(self, X, y) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _local_keys(self, X, n_threads) -> np.ndarray:  # pragma: no cover - abstract
        raise NotImplementedError

    def _compute_tag(self) -> int:
        h = hashlib.sha256(type(self).__name__.encode())
        for key in sorted(vars(self)):
            value = getattr(self, key)
            if key.endswith("_") and not key.startswith("_") and key != "key_tag_":
                h.update(key.encode())
                h.update(
                    np.ascontiguousarray(value).tobytes()
                    if isinstance(value, np.ndarray)
                    else repr(value).encode()
                )
        return int.from_bytes(h.digest()[:4], "little") & KEY_TAG_MASK

    # ------------------------------------------------------------------ persistence

    def _get_state(self):
        check_is_fitted(self, "key_tag_")
        return estimator_state(self)

    @classmethod
    def _from_state(cls, params, state, arrays):
        return estimator_from_state(cls, params, state, arrays)

    def _check_state(self) -> None:
        """Structure of a loaded bucketer, checked before any kernel walks it: the generic
        checks, the key tag, the trees' node arrays (:func:`check_tree_arrays`) and any
        per-tree weights. Raises ``ValueError``."""
        check_estimator_state(self)
        d = getattr(self, "n_features_in_", None)
        if not isinstance(d, int) or isinstance(d, bool) or d < 1:
            raise ValueError(f"n_features_in_ must be a positive int, got {d!r}")
        tag = getattr(self, "key_tag_", None)
        if not isinstance(tag, int) or isinstance(tag, bool) or not 0 <= tag < 1 << 23:
            raise ValueError(f"key_tag_ must be an int in [0, 2**23), got {tag!r}")
        if hasattr(self, "roots_"):
            check_tree_arrays(self, d)
            weights = getattr(self, "tree_weights_", None)
            if weights is not None and np.shape(weights) != self.roots_.shape:
                raise ValueError(
                    f"tree_weights_ has shape {np.shape(weights)}, expected {self.roots_.shape}"
                )


# ------------------------------------------------------------------------ binary trees


class TreeBuilder:
    """Accumulates the nodes of binary hyperplane / stump trees into flat arrays."""

    def __init__(self, n_features: int):
        self.n_features = n_features
        self.left: list[int] = []
        self.right: list[int] = []
        self.feature: list[int] = []
        self.threshold: list[float] = []
        self.leaf_id: list[int] = []
        self.proj: list[np.ndarray] = []
        self.roots: list[int] = []
        self.n_leaves: list[int] = []

    def new_node(self) -> int:
        self.left.append(-1)
        self.right.append(-1)
        self.feature.append(0)
        self.threshold.append(0.0)
        self.leaf_id.append(-1)
        return len(self.left) - 1

    def set_split(
        self, node: int, feature: int | None, direction: np.ndarray | None, threshold: float
    ) -> tuple[int, int]:
        """Make ``node`` internal; ``feature`` for a stump or ``direction`` for a hyperplane.
        Returns the new (left, right) children: left takes ``s(x) > threshold``."""
        if feature is None:
            self.proj.append(np.asarray(direction, np.float64))
            self.feature[node] = -len(self.proj)
        else:
            self.feature[node] = int(feature)
        self.threshold[node] = float(threshold)
        left, right = self.new_node(), self.new_node()
        self.left[node], self.right[node] = left, right
        return left, right

    def finish_tree(self, root: int) -> None:
        """Number the leaves of the tree under ``root`` (depth-first, left first)."""
        count, stack = 0, [root]
        while stack:
            v = stack.pop()
            if self.left[v] < 0:
                self.leaf_id[v] = count
                count += 1
            else:
                stack.append(self.right[v])
                stack.append(self.left[v])
        self.roots.append(root)
        self.n_leaves.append(count)

    def arrays(self) -> dict[str, np.ndarray]:
        proj = np.stack(self.proj) if self.proj else np.zeros((0, self.n_features), np.float64)
        return {
            "roots_": np.asarray(self.roots, np.int64),
            "left_": np.asarray(self.left, np.int64),
            "right_": np.asarray(self.right, np.int64),
            "feature_": np.asarray(self.feature, np.int64),
            "threshold_": np.asarray(self.threshold, np.float64),
            "leaf_id_": np.asarray(self.leaf_id, np.int64),
            "proj_": proj,
            "n_leaves_": np.asarray(self.n_leaves, np.int64),
        }


@numba.njit(cache=True, nogil=True)
def _score(X, i, f, proj):
    """``s_v(x_i)`` of a split: ``X[i, f]`` for a stump (``f >= 0``), else the dot product of
    row ``-f - 1`` of ``proj`` with ``X[i]``.

    The one place a split score is computed, at fit time (:func:`node_scores`) and at query
    time (:func:`tree_leaves`), so a training point reaches the same leaf in both. The sum
    runs in one fixed order (:func:`hashlearn._utils.dense.row_dot`: four interleaved partial
    sums, combined pairwise), so the result depends neither on the caller nor on the CPU.
    """
    if f >= 0:
        return X[i, f]
    return row_dot(proj, -f - 1, X, i)


@numba.njit(cache=True, nogil=True)
def _node_scores_kernel(X, rows, f, proj, out):
    for k in range(rows.shape[0]):
        out[k] = _score(X, rows[k], f, proj)


def node_scores(
    X: np.ndarray, rows: np.ndarray, feature: int | None, direction: np.ndarray | None
) -> np.ndarray:
    """Split scores ``s(x)`` of ``X[rows]`` for a stump on ``feature`` or a hyperplane
    ``direction``, with exactly the arithmetic of :func:`tree_leaves`.

    ``X`` must be C-contiguous float64 (as ``fit`` and ``keys`` make it).
    """
    rows = np.ascontiguousarray(rows, dtype=np.int64)
    out = np.empty(len(rows), np.float64)
    if feature is None:
        proj = np.ascontiguousarray(np.asarray(direction, np.float64).reshape(1, -1))
        _node_scores_kernel(X, rows, -1, proj, out)
    else:
        _node_scores_kernel(X, rows, int(feature), np.zeros((1, X.shape[1])), out)
    return out


def check_tree_arrays(trees, n_features: int) -> None:
    """Refuse node arrays a tree walk could not follow safely (a damaged or crafted save).

    ``trees`` has the attributes of :meth:`TreeBuilder.arrays`. Every array must have its
    dtype and a common length ``m``; roots lie in ``[0, m)``; an internal node has both
    children, and its children come after it (as :class:`TreeBuilder` numbers them), which
    rules out cycles and keeps every walk inside the arrays; a stump's feature lies in
    ``[0, n_features)`` and a hyperplane's row in ``proj_``; leaves have ids in
    ``[0, max(n_leaves_))``; thresholds are finite. O(m). Raises ``ValueError``.
    """
    ints = ("roots_", "left_", "right_", "feature_", "leaf_id_", "n_leaves_")
    for name in (*ints, "threshold_", "proj_"):
        value = getattr(trees, name, None)
        want = np.float64 if name in ("threshold_", "proj_") else np.int64
        ndim = 2 if name == "proj_" else 1
        if not isinstance(value, np.ndarray) or value.dtype != want or value.ndim != ndim:
            raise ValueError(f"{name} must be a {ndim}-D {np.dtype(want)} array")
    left, right, feature = trees.left_, trees.right_, trees.feature_
    m = left.shape[0]
    for name in ("right_", "feature_", "threshold_", "leaf_id_"):
        if getattr(trees, name).shape[0] != m:
            raise ValueError(f"{name} must have one entry per node ({m})")
    roots = trees.roots_
    if roots.size == 0 or trees.n_leaves_.shape != roots.shape:
        raise ValueError("the forest needs at least one tree and one n_leaves_ entry per tree")
    if roots.min() < 0 or roots.max() >= m:
        raise ValueError(f"roots_ must index nodes in [0, {m})")
    inner = left >= 0
    if (left < -1).any() or (right < -1).any() or (inner != (right >= 0)).any():
        raise ValueError("left_/right_ must be -1 (leaf) or both child indices")
    node = np.arange(m)
    if ((left[inner] <= node[inner]) | (right[inner] <= node[inner])).any() or (
        inner.any() and max(left.max(), right.max()) >= m
    ):
        raise ValueError("a child must come after its parent and lie inside the node arrays")
    proj = trees.proj_
    if proj.shape[1] != n_features and proj.shape[0] > 0:
        raise ValueError(f"proj_ must have {n_features} columns, got {proj.shape[1]}")
    f = feature[inner]
    if f.size and (f.max() >= n_features or f.min() < -proj.shape[0]):
        raise ValueError("feature_ of a split must be a feature index or a row of proj_")
    leaf = trees.leaf_id_[~inner]
    if leaf.size and (leaf.min() < 0 or leaf.max() >= trees.n_leaves_.max()):
        raise ValueError("leaf_id_ of a leaf must lie in [0, max(n_leaves_))")
    if not (np.isfinite(trees.threshold_).all() and np.isfinite(proj).all()):
        raise ValueError("thresholds and projections must be finite")


#: rows walked down a tree together, one level at a time: their split scores are
#: independent, so the CPU overlaps them and the next hyperplanes' loads instead of waiting
#: on one row's chain of scores and turns (200k rows x 32 trees of 64-d hyperplanes: 1.8
#: vs 3.1 s CPU; 4 and 16 lanes measured the same as 8)
_WALK_LANES = 8


@numba.njit(cache=True, nogil=True)
def _tree_leaves_range(start, stop, X, roots, left, right, feature, threshold, leaf_id, proj, out):
    # tree by tree over the chunk: one tree's hyperplanes stay in cache for all its rows
    # (item by item, every row would sweep the whole forest's proj_, tens of MB)
    node = np.empty(_WALK_LANES, np.int64)
    for t in range(roots.shape[0]):
        for i0 in range(start, stop, _WALK_LANES):
            lanes = min(_WALK_LANES, stop - i0)
            for j in range(lanes):
                node[j] = roots[t]
            moving = True
            while moving:
                moving = False
                for j in range(lanes):
                    v = node[j]
                    if left[v] >= 0:
                        s = _score(X, i0 + j, feature[v], proj)
                        node[j] = left[v] if s > threshold[v] else right[v]
                        moving = True
            for j in range(lanes):
                out[i0 + j, t] = leaf_id[node[j]]


def tree_leaves(X: np.ndarray, arrays, *, n_threads: int | None = None) -> np.ndarray:
    """Leaf number of every row of ``X`` in every tree: int64 ``(n, n_trees)``.

    ``arrays`` is an object with the attributes of :meth:`TreeBuilder.arrays`. Rows are
    routed in parallel on ``n_threads`` threads (default: every core) by a GIL-free kernel;
    the leaf of a row does not depend on the thread count or on the other rows.
    """
    X = np.ascontiguousarray(X, dtype=np.float64)
    out = np.empty((X.shape[0], len(arrays.roots_)), np.int64)
    roots = np.ascontiguousarray(arrays.roots_, dtype=np.int64)
    left = np.ascontiguousarray(arrays.left_, dtype=np.int64)
    right = np.ascontiguousarray(arrays.right_, dtype=np.int64)
    feature = np.ascontiguousarray(arrays.feature_, dtype=np.int64)
    threshold = np.ascontiguousarray(arrays.threshold_, dtype=np.float64)
    leaf_id = np.ascontiguousarray(arrays.leaf_id_, dtype=np.int64)
    proj = np.ascontiguousarray(arrays.proj_, dtype=np.float64)
    if proj.shape[0] == 0:
        proj = np.zeros((1, X.shape[1]), np.float64)

    # blocks of rows walked tree by tree: large blocks reuse each tree's nodes (measured
    # 3x fewer CPU seconds at 16384 rows than at 256 for 32 trees of 64-d hyperplanes),
    # small enough that a batch still spreads over the threads
    n = X.shape[0]
    cores = available_cores() if n_threads is None else max(1, int(n_threads))
    block = int(min(16384, max(256, -(-n // (4 * cores)))))
    n_blocks = -(-n // block)

    def kernel(first: int, last: int) -> None:
        for b in range(first, last):
            _tree_leaves_range(
                b * block,
                min(n, (b + 1) * block),
                X,
                roots,
                left,
                right,
                feature,
                threshold,
                leaf_id,
                proj,
                out,
            )

    parallel_chunks(kernel, n_blocks, n_threads, min_chunk=1)
    return out


# ------------------------------------------------------------------ weighted candidates


def weighted_candidates_csr(
    index, query_keys, weights, *, n_threads: int | None = None
) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Candidates of a :class:`~hashlearn.index.table.TableIndex` ranked by a weighted vote
    of the tables: CSR ``(lims, ids int64, scores float64)``.

    The candidate set is the paper's ``{x : T(q, x) > 0}``, the items sharing the query's
    key in at least one table; each is scored by the ensemble selection function
    ``T(q, x) = sum_l w_l 1(key_l(q) == key_l(x))`` (Li, Ning, Cao, Zhang, Gong & Huang,
    "Learning to Search Efficiently in High Dimensions", NIPS 2011, eq. 8, with ``w_l`` the
    tree weights ``c_m`` of eq. 15 for a boosted search forest) and ordered by score
    descending, then id ascending. The weights are summed in table order. With unit weights
    the score is the collision count of ``TableIndex.candidates_csr``.

    ``weights`` must be positive and finite, one per table.
    """
    if not callable(getattr(index, "weighted_candidates_csr", None)):  # no upward import
        raise TypeError(f"index must be a TableIndex. Got {type(index).__name__} instead.")
    return index.weighted_candidates_csr(query_keys, weights, n_threads=n_threads)
