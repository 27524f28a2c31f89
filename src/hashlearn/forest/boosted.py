"""Boosted search forest (Li, Ning, Cao, Zhang, Gong & Huang, "Learning to search
efficiently in high dimensions", Li et al., NIPS 2011).

Learning to search: instead of codes whose Hamming distance mimics similarity, learn the
*candidate-selection function* of an inverted index directly. A selection function
``T(q, x) > 0`` returns a candidate set whose quality ``Q = sum s(q, x) 1(T > 0)`` (eq. 1)
should be high and whose cost ``C = sum 1(T > 0)`` (eq. 2) low; with a Lagrange multiplier
``lam`` the objective over pairs of database items is (eq. 5-6)

.. math:: \\max_T \\sum_{ij} z_{ij} 1(T(x_i, x_j) > 0), \\qquad
          z_{ij} = 1 - \\lambda \\text{ (similar)}, \\; -\\lambda \\text{ (dissimilar)} .

**Algorithm 1** (boosting, eq. 7-15). ``T = sum_m c_m t_m`` where ``t_m(x_i, x_j) = 1`` when
both reach the same leaf of tree ``m``. Pair weights are ``w_ij = exp(-z_ij T(x_i, x_j))``
(eq. 10): similar pairs already together lose weight, dissimilar pairs that keep colliding
gain it. The tree weight minimising the exponential loss (eq. 14) is

.. math:: c = \\log \\frac{(1-\\lambda) P_w(t=1, s=1)}{\\lambda P_w(t=1, s=0)}

(eq. 15 as derived from eq. 14; the printed eq. 15 has ``t = 0`` in the denominator, which
does not follow from setting dL/dc = 0). **Deviation**: ``c`` is clipped to ``[1e-3, 50]``,
so a tree whose ``c <= 0`` (it joins more weighted dissimilar than similar mass; Algorithm 1
does not say what to do then) stays in the forest at weight 1e-3: its leaves still add
candidates (``T > 0``) while it barely moves their ranking. ``raw_tree_weights_`` keeps the
unclipped values.

**Algorithm 2** (a search tree). The tree objective is additive over leaves,
``J = sum_k J_k`` with ``J_k = sum_ij w_ij z_ij t(x_i, x_j; l_k)`` (eq. 16-17); a leaf is
split when the best split raises ``J_k(1) + J_k(2)`` above ``J_k``. Splits are hyperplanes
``p^T x + b > 0`` whose direction is the top eigenvector of ``X~ M X~^T`` with
``M_ij = w_ij z_ij`` (eq. 18), or axis stumps for large nodes, as the paper suggests.

Implementation choices (documented deviations, all within the paper's framework):

* Pairs are re-sampled for every tree (``n_pairs`` per tree): ``similar_fraction`` of them
  join a point to one of its ``k_similar`` nearest neighbours (or to a same-label point), the
  rest are uniform random pairs. Each sampled pair carries its importance weight, so sums
  over the sample estimate the paper's sums over *all* pairs; ``w_ij`` is recomputed from the
  ensemble ``T`` learnt so far (eq. 10), which is Algorithm 1's weight update.
* ``J_k = sum_{similar ij in l_k} w_ij - lam * sum_{all ij in l_k} w_ij``: the cost term over
  all pairs of a leaf of ``m`` items is ``lam * wbar_k * m (m - 1)``, with ``wbar_k`` the mean
  weight of the random pairs that reach the leaf (inherited from the parent when fewer than
  20 do). This keeps the cost term defined deep in the tree, where a fixed sample of random
  pairs runs out; the gain of a split into ``m_1 + m_2`` is then
  ``2 lam wbar m_1 m_2 - (weight of the similar pairs it cuts)``.
* **Deviation from eq. 18**: the direction is the top eigenvector of ``X~^T (S + S^T) X~``
  over the node's sampled *similar* pairs only (``S_ab = w_ab`` of those pairs), not of
  ``M = w z`` over all pairs. Under the cost model above (weight ``wbar`` on each of a
  node's pairs) the dissimilar pairs' part of ``M`` is ``-lam wbar (1 1^T - I)``, whose
  term on centred data is ``+lam wbar X~^T X~``, the node's covariance; its top
  eigenvector, the principal direction, is tried as a second candidate. The split search
  thus sees the two terms of eq. 18 apart (and picks the better by the exact gain), never
  their sum.
* The eigenvector of the similar-pair term (computed on the node's centred data, plus the
  node's top principal direction as a fallback candidate) gives the direction; the offset
  ``b`` is then
  chosen exactly, by scanning ``n_thresholds`` quantiles for the largest gain (eq. 17's
  "choose the split that maximises J_k(1) + J_k(2)").
* Trees grow best-first (largest gain first) up to ``max_leaves`` leaves / ``max_depth``.
* The eigenvectors of eq. 18 (and the fallback principal direction) are computed exactly
  in a reduced form for small nodes and approximated by 16 Lanczos steps when the reduced
  problem is larger than 16 (see ``_candidate_directions``). The direction finding and the
  split search run in numba; the threshold search is one sweep over the node's pairs (each
  pair's interval placed among the sorted candidates by binary search, then prefix sums),
  ``O(pairs log n_thresholds)`` instead of a pass over the pairs per candidate.
* Split thresholds lie midway between consecutive distinct training scores, and one kernel
  (:func:`hashlearn.forest.base.node_scores` / ``tree_leaves``) routes points at fit and at
  query time, so a training point's leaf while boosting is its leaf in the index.

**Query time** (§3.4). The candidates of a query ``q`` are ``X_q = {x : T(q, x) > 0}``, the
items sharing ``q``'s leaf in at least one tree (a ``TableIndex`` over ``keys``). They are
ranked by the learned ensemble selection function itself,
``T(q, x) = sum_m c_m 1(leaf_m(q) == leaf_m(x))`` (eq. 8), i.e. by the summed weights
``c_m`` (``tree_weights_``) of the trees in which ``x`` shares ``q``'s leaf, descending, ties
by id: :meth:`BoostedSearchForest.candidates`. (``TableIndex.candidates_csr`` alone ranks by
the unweighted collision count. Measured on Fashion-MNIST with the search-forest
reproduction's settings, the count finds more of the true 100-NN among the first M
candidates than T at every M and depth, e.g. 0.701 against 0.599 at M = 200, depth 10,
paired over 5 seeds: ``docs/reproductions.md``, "Deviations".)
"""

from __future__ import annotations

import heapq
import time
import warnings
from typing import Any

import numba
import numpy as np
from sklearn.neighbors import NearestNeighbors
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from hashlearn._utils.dense import dot, matvec, rank_one_update
from hashlearn._utils.validation import check_int, check_real
from hashlearn.forest.base import BaseBucketer, TreeBuilder, _score, node_scores, tree_leaves
from hashlearn.io import persistable
from hashlearn.kernels import log_message
from hashlearn.supervision import sample_pairs

__all__ = ["BoostedSearchForest"]

_MIN_RANDOM_PAIRS = 20
_NO_PROJ = np.zeros((1, 1))
_NO_FEATURES = np.zeros(0, np.int64)


class _Node:
    __slots__ = ("node", "rows", "sim", "rand", "wbar", "depth", "split", "gain")

    def __init__(self, node, rows, sim, rand, wbar, depth):
        self.node, self.rows, self.sim, self.rand = node, rows, sim, rand
        self.wbar, self.depth = wbar, depth
        self.split = None
        self.gain = -np.inf


@numba.njit(cache=True, nogil=True)
def _best_threshold_kernel(v_rows, v_a, v_b, weight, cost, min_leaf, n_thresholds):
    m = v_rows.shape[0]
    s = np.sort(v_rows)
    # the candidates: distinct quantiles q (ascending), each with its threshold and sides
    q_cand = np.empty(n_thresholds)
    mid_cand = np.empty(n_thresholds)
    left_cand = np.empty(n_thresholds, np.int64)
    n_cand = 0
    r = 0
    for t in range(1, n_thresholds + 1):
        p = (t * (m - 1)) // (n_thresholds + 1)
        q = s[p]
        if n_cand and q == q_cand[n_cand - 1]:
            continue  # the same candidate again
        r = max(r, p + 1)
        while r < m and s[r] <= q:
            r += 1
        if r >= m:
            break  # no larger value: this and every later candidate split nothing off
        upper = s[r]
        mid = q / 2.0 + upper / 2.0
        if not (mid > q and mid < upper):
            mid = q  # adjacent floats: v > q is the same split
        q_cand[n_cand] = q
        mid_cand[n_cand] = mid
        left_cand[n_cand] = m - r
        n_cand += 1
    # a pair is cut by candidate t iff lo <= q_t < hi: it starts being cut at the first
    # q_t >= lo and stops at the first q_t >= hi (one sweep over the pairs, O(log n_cand) each)
    starts = np.zeros(n_cand + 1)
    stops = np.zeros(n_cand + 1)
    qs = q_cand[:n_cand]
    for k in range(weight.shape[0]):
        lo = min(v_a[k], v_b[k])
        hi = max(v_a[k], v_b[k])
        starts[np.searchsorted(qs, lo)] += weight[k]
        stops[np.searchsorted(qs, hi)] += weight[k]
    best_theta = mid_cand[0] if n_cand else np.nan
    best_gain = -np.inf
    started = 0.0
    stopped = 0.0
    for t in range(n_cand):
        started += starts[t]
        stopped += stops[t]
        m_left = left_cand[t]
        m_right = m - m_left
        if m_left < min_leaf or m_right < min_leaf:
            continue
        gain = 2.0 * cost * float(m_left) * float(m_right) - (started - stopped)
        if gain > best_gain:
            best_gain = gain
            best_theta = mid_cand[t]
    return best_theta, best_gain


def _best_threshold(
    v_rows: np.ndarray,
    v_a: np.ndarray,
    v_b: np.ndarray,
    weight: np.ndarray,
    cost: float,
    min_leaf: int,
    n_thresholds: int,
) -> tuple[float, float]:
    """Best ``theta`` for the split ``v > theta`` and its gain (eq. 17 with the all-pairs
    cost term): ``2 * cost * m_left * m_right - sum(weight of pairs cut)``.

    The candidates are ``n_thresholds`` quantiles of ``v_rows``; each threshold is put
    midway between the quantile and the next larger distinct value (as scikit-learn's tree
    splitter does), never on a training value, so no training point lies on a split plane.
    Returns ``(nan, -inf)`` when every value is equal (numba kernel; the first best
    candidate wins ties). The cut weights of all candidates come from one sweep: a pair
    ``(lo, hi)`` is cut by ``q`` iff ``lo <= q < hi``.
    """
    theta, gain = _best_threshold_kernel(
        np.ascontiguousarray(v_rows, dtype=np.float64),
        np.ascontiguousarray(v_a, dtype=np.float64),
        np.ascontiguousarray(v_b, dtype=np.float64),
        np.ascontiguousarray(weight, dtype=np.float64),
        float(cost),
        int(min_leaf),
        int(n_thresholds),
    )
    return float(theta), float(gain)


_LANCZOS_STEPS = 16
_FAST = {"reassoc", "nsz", "arcp", "contract"}  # direction finding only, never routing


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _apply_node_matrix(pairs, Xc, a_loc, b_loc, pw, v, out, u, t):
    """``out = A v`` without forming ``A``: ``A = Xc^T (S + S^T) Xc`` when ``pairs`` (eq. 18),
    else ``A = Xc^T Xc`` (the scatter matrix)."""
    m, d = Xc.shape
    matvec(Xc, v, u)
    for i in range(m):
        t[i] = 0.0 if pairs else u[i]
    if pairs:
        for e in range(pw.shape[0]):
            t[a_loc[e]] += pw[e] * u[b_loc[e]]
            t[b_loc[e]] += pw[e] * u[a_loc[e]]
    out[:] = 0.0
    for i in range(m):
        ti = t[i]
        for j in range(d):
            out[j] += Xc[i, j] * ti


@numba.njit(cache=True, nogil=True, fastmath=_FAST)
def _lanczos(pairs, Xc, a_loc, b_loc, pw, n_steps):
    """``n_steps`` Lanczos steps with full re-orthogonalisation on ``A`` (see
    :func:`_apply_node_matrix`), started from a fixed generic vector: the basis ``V``
    (steps, d), the diagonal ``alpha`` (steps,) and the off-diagonal ``beta`` (steps - 1,)
    of the tridiagonal matrix. Stops early when the Krylov space is exhausted."""
    m, d = Xc.shape
    k = min(n_steps, d)
    V = np.zeros((k, d))
    alpha = np.zeros(k)
    beta = np.zeros(k)
    w = np.empty(d)
    u = np.empty(m)
    t = np.empty(m)
    for j in range(d):
        V[0, j] = 1.0 + j / d
    norm = np.sqrt(dot(V[0], V[0]))
    for j in range(d):
        V[0, j] /= norm
    steps = 0
    scale = 0.0
    for j in range(k):
        _apply_node_matrix(pairs, Xc, a_loc, b_loc, pw, V[j], w, u, t)
        alpha[j] = dot(w, V[j])
        scale = max(scale, abs(alpha[j]))
        for _rep in range(2):
            for i in range(j + 1):
                c = dot(w, V[i])
                for q in range(d):
                    w[q] -= c * V[i, q]
        b = np.sqrt(dot(w, w))
        steps = j + 1
        if j + 1 == k or b <= 1e-10 * max(scale, 1e-300):
            break
        beta[j] = b
        for q in range(d):
            V[j + 1, q] = w[q] / b
    return V[:steps], alpha[:steps], beta[: steps - 1]


@numba.njit(cache=True, nogil=True)
def _lanczos_top(pairs, Xc, a_loc, b_loc, pw, n_steps, n_vec):
    """Top ``n_vec`` Ritz vectors (columns ``(d, n_vec)``, largest eigenvalue last) of ``A``
    from :func:`_lanczos`; with fewer Ritz vectors than asked the top one is repeated."""
    V, alpha, beta = _lanczos(pairs, Xc, a_loc, b_loc, pw, n_steps)
    k = alpha.shape[0]
    T = np.diag(alpha)
    for j in range(k - 1):
        T[j, j + 1] = T[j + 1, j] = beta[j]
    vecs = np.linalg.eigh(T)[1]
    ritz = np.ascontiguousarray(V.T) @ np.ascontiguousarray(vecs[:, max(0, k - n_vec) :])
    out = np.empty((V.shape[1], n_vec))
    for c in range(n_vec):
        col = ritz.shape[1] - n_vec + c
        out[:, c] = ritz[:, col if col >= 0 else ritz.shape[1] - 1]
    return out


@numba.njit(cache=True, nogil=True)
def _pair_rows(a_loc, b_loc, m):
    """The distinct rows of the pairs' endpoints in order of first appearance, ``(r,)``, and
    each row's slot in that list (-1 for rows in no pair), ``(m,)``."""
    slot = np.full(m, -1, np.int64)
    rows = np.empty(2 * a_loc.shape[0], np.int64)
    r = 0
    for e in range(2 * a_loc.shape[0]):
        i = a_loc[e] if e < a_loc.shape[0] else b_loc[e - a_loc.shape[0]]
        if slot[i] < 0:
            slot[i] = r
            rows[r] = i
            r += 1
    return rows[:r], slot


@numba.njit(cache=True, nogil=True)
def _candidate_directions(Xc, sub, a_loc, b_loc, pw):
    """Candidate split directions of a node, rows of a ``(k, d)`` array: the top two
    eigenvectors of ``A = X~^T (S + S^T) X~`` (eq. 18, ``S_ab = w_ab z_ab``; only when the
    node holds similar pairs) and the top principal direction of ``sub`` (the centred node
    data or a sample of it: a cheap fallback candidate).

    Small problems are solved exactly: when the pairs touch ``r < d`` distinct rows
    ``Y = X~[U]``, ``A = Y^T S' Y`` has rank ``<= r`` and, with ``Y^T = Q R``, its
    eigenvectors for nonzero eigenvalues are ``Q u`` for the eigenvectors ``u`` of the
    ``r x r`` matrix ``R S' R^T`` (the top eigenvalue of ``A`` is positive whenever a pair
    has positive weight, so the reduction never drops it); the principal direction likewise
    comes from the ``m x m`` Gram matrix when ``m < d``. When that reduced problem is larger
    than ``_LANCZOS_STEPS`` (16), the top eigenvectors are approximated by 16 Lanczos steps
    with full re-orthogonalisation, applying ``A`` implicitly (``O(m d + pairs)`` per step).
    (A numba kernel: the eigen-solvers are LAPACK's, called without Python in between.)
    """
    d = Xc.shape[1]
    n_pairs = a_loc.shape[0]
    out = np.zeros((1 if n_pairs == 0 else 3, d))
    k = 0
    if n_pairs:
        rows, slot = _pair_rows(a_loc, b_loc, Xc.shape[0])
        r = rows.shape[0]
        if min(r, d) > _LANCZOS_STEPS:
            vecs = _lanczos_top(True, Xc, a_loc, b_loc, pw, _LANCZOS_STEPS, 2)
        elif r < d:
            S2 = np.zeros((r, r))  # S + S^T
            for e in range(n_pairs):
                S2[slot[a_loc[e]], slot[b_loc[e]]] += pw[e]
                S2[slot[b_loc[e]], slot[a_loc[e]]] += pw[e]
            Y = np.empty((d, r))
            for j in range(r):
                Y[:, j] = Xc[rows[j]]
            Q, R = np.linalg.qr(Y)
            R = np.ascontiguousarray(R)
            B = R @ S2 @ np.ascontiguousarray(R.T)
            vecs = np.ascontiguousarray(Q) @ np.ascontiguousarray(
                np.linalg.eigh(0.5 * (B + B.T))[1]
            )
        else:
            A = np.zeros((d, d))
            for e in range(n_pairs):
                rank_one_update(A, pw[e], Xc[a_loc[e]], Xc[b_loc[e]])
            vecs = np.linalg.eigh(A + A.T)[1]
        out[0] = vecs[:, -1]
        out[1] = vecs[:, -2] if vecs.shape[1] > 1 else vecs[:, -1]
        k = 2
    m_sub = sub.shape[0]
    if min(m_sub, d) > _LANCZOS_STEPS:
        no_rows = np.zeros(0, np.int64)
        out[k] = _lanczos_top(False, sub, no_rows, no_rows, np.zeros(0), _LANCZOS_STEPS, 1)[:, 0]
    elif m_sub < d:
        v = np.ascontiguousarray(sub.T) @ np.ascontiguousarray(
            np.linalg.eigh(sub @ np.ascontiguousarray(sub.T))[1][:, -1]
        )
        norm = np.sqrt(np.sum(v * v))
        if norm > 0:
            out[k] = v / norm
        else:
            out[k, 0] = 1.0
    else:
        out[k] = np.linalg.eigh(np.ascontiguousarray(sub.T) @ sub)[1][:, -1]
    return out


@numba.njit(cache=True, nogil=True)
def _best_split_kernel(X, rows, proj, feature_list, a_loc, b_loc, pw, cost, min_leaf, n_thresholds):
    """Best split of a node over candidate splits: ``proj`` rows (hyperplanes, when
    ``feature_list`` is empty) or the stumps on ``feature_list``. Scores use the forest's
    split-score kernel (the arithmetic of ``keys``). Returns (candidate, theta, gain); the
    first best candidate wins ties."""
    m = rows.shape[0]
    n_cand = proj.shape[0] if feature_list.shape[0] == 0 else feature_list.shape[0]
    v = np.empty(m)
    v_a = np.empty(a_loc.shape[0])
    v_b = np.empty(a_loc.shape[0])
    best_c = -1
    best_theta = np.nan
    best_gain = -np.inf
    for c in range(n_cand):
        f = -(c + 1) if feature_list.shape[0] == 0 else feature_list[c]
        for i in range(m):
            v[i] = _score(X, rows[i], f, proj)
        for e in range(a_loc.shape[0]):
            v_a[e] = v[a_loc[e]]
            v_b[e] = v[b_loc[e]]
        theta, gain = _best_threshold_kernel(v, v_a, v_b, pw, cost, min_leaf, n_thresholds)
        if gain > best_gain:
            best_c, best_theta, best_gain = c, theta, gain
    return best_c, best_theta, best_gain


def _sample_similar(n, n_sim, y_codes, class_rows, neighbors, rng):
    """``n_sim`` similar pairs ``(sa, sb)`` with importance weights ``alpha_sim`` (so that
    weighted sums estimate sums over all similar pairs): an anchor and another row of its
    class, or an anchor and one of its ``neighbors``."""
    if neighbors is None:
        eligible = np.concatenate([r for r in class_rows if len(r) >= 2])
        sa = eligible[rng.randint(len(eligible), size=n_sim)]
        rows_of = [class_rows[c] for c in y_codes[sa]]
        sb = np.array([r[rng.randint(len(r))] for r in rows_of], np.int64)
        same = sb == sa
        while same.any():  # re-draw self pairs
            sb[same] = [rows_of[i][rng.randint(len(rows_of[i]))] for i in np.flatnonzero(same)]
            same = sb == sa
        sizes = np.array([len(class_rows[c]) for c in y_codes[sa]], np.float64)
        alpha_sim = len(eligible) * (sizes - 1.0) / n_sim
    else:
        sa = rng.randint(n, size=n_sim).astype(np.int64)
        sb = neighbors[sa, rng.randint(neighbors.shape[1], size=n_sim)]
        alpha_sim = np.full(n_sim, n * neighbors.shape[1] / n_sim)
    return sa, sb, alpha_sim


@persistable
class BoostedSearchForest(BaseBucketer):
    """Boosted search forest: search trees learnt by boosting for recall vs. candidate cost.

    Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011, Algorithm 1 (boosting, eq. 7-15) and Algorithm 2 (tree
    growth, eq. 16-18). ``keys(X)`` returns each item's leaf in every tree, the "index
    words" of :class:`hashlearn.index.table.TableIndex`.

    Parameters
    ----------
    n_trees : int
        Number of boosted trees M.
    max_depth : int
        Depth limit of a tree (``max_depth`` bits per tree in the paper's accounting).
    max_leaves : int, optional
        Leaf limit of a tree (default ``2**max_depth``).
    lam : float in (0, 1)
        ``lambda`` of eq. 4-6, the price of one candidate: a leaf is worth keeping while the
        fraction of similar pairs among its pairs exceeds about ``lam``.
    split : {"projection", "stump", "hybrid"}
        Hyperplane splits from eq. 18, axis stumps, or stumps for nodes with more than
        ``stump_above`` items and hyperplanes below (the paper's suggestion).
    n_pairs : int
        Pairs sampled per tree.
    similarity : {"knn", "labels"}
        Pair similarity: ``j`` among the ``k_similar`` nearest neighbours of ``i`` in the
        training set (the paper's protocol), or equal labels ``y``. (Not ``similar``:
        elsewhere in hashlearn ``similar`` is the boolean array of
        ``fit(X, pairs=P, similar=s)``.)
    k_similar : int
        K of the K-NN similarity (the paper uses 100 in its database; when fitting on a
        sample, scale it by sample size / database size). Clipped to ``n_samples - 1``
        with a warning.
    similar_fraction : float in (0, 1)
        Fraction of the sampled pairs drawn among similar pairs (importance-weighted).
    min_samples_leaf : int
        Fewest training items a leaf may hold.
    n_thresholds : int
        Candidate offsets (quantiles) tried per split direction.
    stump_above : int
        With ``split="hybrid"``, nodes holding more training items use stumps.
    random_state : int, RandomState or None
    verbose : int, default=0
        ``> 0``: log each tree (leaves, weight, CPU time) to
        ``logging.getLogger("hashlearn")`` (to stderr when that logger shows no INFO).

    Attributes
    ----------
    tree_weights_ : ndarray (n_trees,)
        ``c_m`` of eq. 15, clipped to ``[1e-3, 50]``.
    raw_tree_weights_ : ndarray (n_trees,)
        ``c_m`` of eq. 15 before clipping (``<= 0`` for a tree that joins more weighted
        dissimilar than similar mass; it stays in the forest at weight 1e-3).
    roots_, left_, right_, feature_, threshold_, leaf_id_, proj_, n_leaves_ : ndarray
        The trees (see :class:`hashlearn.forest.base.TreeBuilder`).

    Examples
    --------
    >>> from hashlearn.datasets import load_digits
    >>> from hashlearn.forest.boosted import BoostedSearchForest
    >>> X, _ = load_digits()
    >>> bsf = BoostedSearchForest(n_trees=2, max_depth=6, n_pairs=5000, k_similar=10,
    ...                           random_state=0).fit(X)
    >>> bsf.keys(X[:3]).shape
    (3, 2)
    >>> from hashlearn.index.table import TableIndex
    >>> index = TableIndex(bsf.n_tables, bucketer=bsf)
    >>> index.add(bsf.keys(X)).shape
    (1797,)
    >>> lims, ids, scores = bsf.candidates(index, X[:1])  # ranked by sum of c_m
    >>> int(ids[0]), bool(scores[0] == bsf.tree_weights_.sum())
    (0, True)
    """

    def __init__(
        self,
        n_trees: int = 16,
        max_depth: int = 12,
        max_leaves: int | None = None,
        lam: float = 0.1,
        split: str = "projection",
        n_pairs: int = 100_000,
        similarity: str = "knn",
        k_similar: int = 100,
        similar_fraction: float = 0.5,
        min_samples_leaf: int = 1,
        n_thresholds: int = 32,
        stump_above: int = 2000,
        random_state=None,
        verbose: int = 0,
    ):
        self.n_trees = n_trees
        self.max_depth = max_depth
        self.max_leaves = max_leaves
        self.lam = lam
        self.split = split
        self.n_pairs = n_pairs
        self.similarity = similarity
        self.k_similar = k_similar
        self.similar_fraction = similar_fraction
        self.min_samples_leaf = min_samples_leaf
        self.n_thresholds = n_thresholds
        self.stump_above = stump_above
        self.random_state = random_state
        self.verbose = verbose

    @property
    def n_tables(self) -> int:  # type: ignore[override]  # a parameter elsewhere
        return self.n_trees

    # ------------------------------------------------------------------ validation

    def _check_params(self, n: int) -> None:
        owner = "BoostedSearchForest"
        check_int(self.n_trees, "n_trees", owner)
        check_int(self.max_depth, "max_depth", owner, high=40)
        if self.max_leaves is not None:
            check_int(self.max_leaves, "max_leaves", owner, low=2)
        lam = check_real(self.lam, "lam", owner, low=0.0, high=1.0, low_open=True)
        if lam >= 1.0:
            raise ValueError(
                f"The 'lam' parameter of {owner} must be a float in the open "
                f"range (0, 1). Got {self.lam!r} instead."
            )
        if self.split not in ("projection", "stump", "hybrid"):
            raise ValueError(
                f"The 'split' parameter of {owner} must be 'projection', 'stump' "
                f"or 'hybrid'. Got {self.split!r} instead."
            )
        if self.similarity not in ("knn", "labels"):
            raise ValueError(
                f"The 'similarity' parameter of {owner} must be 'knn' or 'labels'. "
                f"Got {self.similarity!r} instead."
            )
        check_int(self.n_pairs, "n_pairs", owner, low=2)
        check_int(self.k_similar, "k_similar", owner)
        check_int(self.verbose, "verbose", owner, low=0)
        frac = check_real(
            self.similar_fraction, "similar_fraction", owner, low=0.0, high=1.0, low_open=True
        )
        if frac >= 1.0:
            raise ValueError(
                f"The 'similar_fraction' parameter of {owner} must be a float "
                f"in the open range (0, 1). Got {frac!r} instead."
            )
        check_int(self.min_samples_leaf, "min_samples_leaf", owner)
        check_int(self.n_thresholds, "n_thresholds", owner)
        check_int(self.stump_above, "stump_above", owner)

    # ------------------------------------------------------------------ fitting

    def _fit(self, X, y) -> None:
        # C-ordered and writable like the arrays made inside: one kernel specialisation
        X = np.require(X, np.float64, ["C", "W"])
        n = X.shape[0]
        self._check_params(n)
        rng = check_random_state(self.random_state)
        lam = float(self.lam)
        y_codes, class_rows, neighbors, is_similar = self._similarity(X, y)
        n_sim = max(1, int(round(self.n_pairs * self.similar_fraction)))
        n_rand = max(1, self.n_pairs - n_sim)
        builder = TreeBuilder(X.shape[1])
        train_leaves = np.zeros((n, 0), np.int64)
        weights: list[float] = []
        raw_weights: list[float] = []
        start = time.process_time()
        for m in range(self.n_trees):
            # --- pairs for this tree, with importance weights (sums estimate all pairs)
            sa, sb, alpha_sim = _sample_similar(n, n_sim, y_codes, class_rows, neighbors, rng)
            ra, rb = sample_pairs(n, n_rand, rng).T
            r_similar = is_similar(ra, rb)
            # --- eq. 10: w = exp(-z T) from the ensemble so far
            if m:
                c = np.asarray(weights)
                t_sim = (train_leaves[sa] == train_leaves[sb]) @ c
                t_rand = (train_leaves[ra] == train_leaves[rb]) @ c
            else:
                t_sim, t_rand = np.zeros(n_sim), np.zeros(n_rand)
            z_rand = np.where(r_similar, 1.0 - lam, -lam)
            w_sim = np.exp(-(1.0 - lam) * t_sim)
            w_rand = np.exp(-z_rand * t_rand)
            scale = w_rand.mean()  # the loss is invariant to a common scale; keep w ~ 1
            w_sim, w_rand = w_sim / scale, w_rand / scale
            # --- Algorithm 2
            with threadpool_limits(1, user_api="blas"):  # many tiny eigh / matmul calls
                root, leaves_m, leaf_nodes = self._grow_tree(
                    X, builder, sa, sb, alpha_sim * w_sim, ra, rb, w_rand, lam, rng
                )
            if len(leaf_nodes) < 2:
                warnings.warn(
                    f"BoostedSearchForest: tree {m} is empty (no split raises the objective "
                    f"J of eq. 17 at the root) with lam={self.lam}: every item shares its "
                    "single leaf. Raise lam or k_similar.",
                    UserWarning,
                    stacklevel=3,
                )
            builder.finish_tree(root)
            # --- eq. 15: the tree's weight c
            collide_sim = leaves_m[sa] == leaves_m[sb]
            w_sim_t = float((alpha_sim * w_sim)[collide_sim].sum())
            w_all_t = float(
                sum(node.wbar * len(node.rows) * (len(node.rows) - 1.0) for node in leaf_nodes)
            )
            w_dis_t = max(w_all_t - w_sim_t, 1e-12 * max(w_all_t, 1.0))
            raw_c = float(np.log(max((1.0 - lam) * w_sim_t, 1e-300) / (lam * w_dis_t)))
            raw_weights.append(raw_c)
            c_m = float(np.clip(raw_c, 1e-3, 50.0))  # see the module docstring
            weights.append(c_m)
            # leaf numbers as finish_tree assigned them
            train_leaves = np.concatenate([train_leaves, leaves_m[:, None]], axis=1)
            log_message(
                bool(self.verbose),
                "BoostedSearchForest tree %d/%d: %d leaves, c=%.3f, similar pairs colliding "
                "%.3f, %.1f s CPU",
                m + 1,
                self.n_trees,
                len(leaf_nodes),
                c_m,
                float(collide_sim.mean()),
                time.process_time() - start,
            )
        for key, value in builder.arrays().items():
            setattr(self, key, value)
        self.tree_weights_ = np.asarray(weights, np.float64)
        self.raw_tree_weights_ = np.asarray(raw_weights, np.float64)

    def _similarity(self, X, y):
        """Which training pairs are similar: same label (``similarity="labels"``) or one in
        the other's ``k_similar`` Euclidean neighbours. Returns ``(y_codes, class_rows,
        neighbors, is_similar)``, ``is_similar(a, b)`` vectorised over row arrays."""
        n = X.shape[0]
        if self.similarity == "labels":
            if y is None:
                raise ValueError(
                    "BoostedSearchForest requires y to be passed, but the target y is None: "
                    "similarity='labels' needs labels, call fit(X, y)."
                )
            _, y_codes = np.unique(y, return_inverse=True)
            class_rows = [np.flatnonzero(y_codes == c) for c in range(y_codes.max() + 1)]
            if all(len(r) < 2 for r in class_rows):
                raise ValueError("y has no two rows with the same label: no similar pairs.")
            neighbors = None
        else:
            y_codes, class_rows = None, None
            k_similar = int(self.k_similar)
            if k_similar > n - 1:
                warnings.warn(
                    f"k_similar ({k_similar}) is greater than the number of other training "
                    f"rows ({n - 1}). BoostedSearchForest uses k_similar={n - 1}.",
                    UserWarning,
                    stacklevel=4,
                )
                k_similar = n - 1
            neighbors = (
                NearestNeighbors(n_neighbors=k_similar)
                .fit(X)
                .kneighbors(return_distance=False)
                .astype(np.int64)
            )
            nb_keys = np.sort((np.arange(n, dtype=np.int64)[:, None] * n + neighbors).ravel())

        def is_similar(a, b):
            if neighbors is None:
                return y_codes[a] == y_codes[b]
            keys = a * n + b
            pos = np.minimum(np.searchsorted(nb_keys, keys), len(nb_keys) - 1)
            return nb_keys[pos] == keys

        return y_codes, class_rows, neighbors, is_similar

    def _grow_tree(self, X, builder, sa, sb, sim_weight, ra, rb, w_rand, lam, rng):
        """Algorithm 2: best-first growth; returns (root, leaf number per training row,
        the leaf _Node objects)."""
        n = X.shape[0]
        max_leaves = self.max_leaves if self.max_leaves is not None else 2**self.max_depth
        root = builder.new_node()
        start = _Node(
            root, np.arange(n), np.arange(len(sa)), np.arange(len(ra)), float(w_rand.mean()), 0
        )
        where = np.zeros(n, np.int64)  # training row -> position in `where_rows` bookkeeping
        self._find_split(X, start, sa, sb, sim_weight, lam, where, rng)
        # best-first: a heap on (-gain, creation order), so equal gains go first-come
        heap = [(-start.gain, 0, start)]
        counter = 1
        n_leaves = 1
        while heap:
            node = heap[0][2]
            if node.gain <= 0 or n_leaves >= max_leaves:
                break
            heapq.heappop(heap)
            feature, direction, threshold = node.split
            # the same kernel as keys(): a training row reaches the leaf keys() gives it
            left_mask = node_scores(X, node.rows, feature, direction) > threshold
            where[node.rows] = left_mask
            sim_a, sim_b = where[sa[node.sim]], where[sb[node.sim]]
            rnd_a, rnd_b = where[ra[node.rand]], where[rb[node.rand]]
            left, right = builder.set_split(node.node, feature, direction, threshold)
            n_leaves += 1
            for child, side in ((left, 1), (right, 0)):
                rows = node.rows[left_mask == bool(side)]
                sim = node.sim[(sim_a == side) & (sim_b == side)]
                rand = node.rand[(rnd_a == side) & (rnd_b == side)]
                wbar = float(w_rand[rand].mean()) if len(rand) >= _MIN_RANDOM_PAIRS else node.wbar
                child_node = _Node(child, rows, sim, rand, wbar, node.depth + 1)
                if child_node.depth < self.max_depth:
                    self._find_split(X, child_node, sa, sb, sim_weight, lam, where, rng)
                heapq.heappush(heap, (-child_node.gain, counter, child_node))
                counter += 1
            # the sides of the rows below are written again by their own splits
        leaves = [entry[2] for entry in heap]
        leaf_of_row = np.empty(n, np.int64)
        # number leaves like TreeBuilder.finish_tree (depth-first, left first)
        node_leaf = {}
        count, stack = 0, [root]
        while stack:
            v = stack.pop()
            if builder.left[v] < 0:
                node_leaf[v] = count
                count += 1
            else:
                stack.append(builder.right[v])
                stack.append(builder.left[v])
        for leaf in leaves:
            leaf_of_row[leaf.rows] = node_leaf[leaf.node]
        return root, leaf_of_row, leaves

    def _find_split(self, X, node: _Node, sa, sb, sim_weight, lam, where, rng) -> None:
        """Best split of a node (eq. 17-18); sets ``node.split`` and ``node.gain``."""
        m = len(node.rows)
        min_leaf = self.min_samples_leaf
        if m < 2 * min_leaf or m < 2:
            return
        cost = lam * node.wbar
        # local indices of the similar pairs' endpoints
        where[node.rows] = np.arange(m)
        a_loc = np.ascontiguousarray(where[sa[node.sim]])
        b_loc = np.ascontiguousarray(where[sb[node.sim]])
        pw = np.ascontiguousarray(sim_weight[node.sim], dtype=np.float64)
        rows = np.ascontiguousarray(node.rows, dtype=np.int64)
        use_stump = self.split == "stump" or (self.split == "hybrid" and m > self.stump_above)
        best: tuple[float, tuple[Any, Any, Any] | None] = (-np.inf, None)
        if use_stump:
            features = np.arange(X.shape[1], dtype=np.int64)
            c, theta, gain = _best_split_kernel(
                X, rows, _NO_PROJ, features, a_loc, b_loc, pw, cost, min_leaf, self.n_thresholds
            )
            if c >= 0:
                best = (gain, (int(features[c]), None, theta))
        else:
            Xn = X[rows]
            Xc = Xn - Xn.mean(axis=0)
            # the node's top principal direction (a cheap fallback candidate)
            sub = Xc if m <= 2000 else Xc[rng.choice(m, 2000, replace=False)]
            dirs = _candidate_directions(Xc, np.ascontiguousarray(sub), a_loc, b_loc, pw)
            c, theta, gain = _best_split_kernel(
                X, rows, dirs, _NO_FEATURES, a_loc, b_loc, pw, cost, min_leaf, self.n_thresholds
            )
            if c >= 0:
                best = (gain, (None, dirs[c].copy(), theta))
        node.gain, node.split = best

    def table_weights(self) -> np.ndarray:
        """The tree weights ``c_m`` of eq. 15 (``tree_weights_``): :meth:`candidates` ranks
        by ``T(q, x) = sum_m c_m t_m(q, x)``, the boosted selection function of eq. 8."""
        check_is_fitted(self, "key_tag_")
        return np.asarray(self.tree_weights_, np.float64)

    def _local_keys(self, X, n_threads=None) -> np.ndarray:
        return tree_leaves(X, self, n_threads=n_threads)
