"""Boosted search forest (Li, Ning, Cao, Zhang, Gong & Huang, "Learning to search
efficiently in high dimensions", boosted-search-forest.txt).

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
does not follow from setting dL/dc = 0).

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
* The eigenvector of eq. 18 (computed on the node's centred data, plus the node's top
  principal direction as a fallback candidate) gives the direction; the offset ``b`` is then
  chosen exactly, by scanning ``n_thresholds`` quantiles for the largest gain (eq. 17's
  "choose the split that maximises J_k(1) + J_k(2)").
* Trees grow best-first (largest gain first) up to ``max_leaves`` leaves / ``max_depth``.
* Split thresholds lie midway between consecutive distinct training scores, and one kernel
  (:func:`hashlearn.forest.base.node_scores` / ``tree_leaves``) routes points at fit and at
  query time, so a training point's leaf while boosting is its leaf in the index.

**Query time** (§3.4). The candidates of a query ``q`` are ``X_q = {x : T(q, x) > 0}``, the
items sharing ``q``'s leaf in at least one tree (a ``TableIndex`` over ``keys``). They are
ranked by the learned ensemble selection function itself,
``T(q, x) = sum_m c_m 1(leaf_m(q) == leaf_m(x))`` (eq. 8), i.e. by the summed weights
``c_m`` (``tree_weights_``) of the trees in which ``x`` shares ``q``'s leaf, descending, ties
by id: :meth:`BoostedSearchForest.candidates`. (``TableIndex.candidates_csr`` alone ranks by
the unweighted collision count.)
"""

from __future__ import annotations

import time
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.neighbors import NearestNeighbors
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted
from threadpoolctl import threadpool_limits

from hashlearn._validation import check_int, check_real
from hashlearn.forest.base import BaseBucketer, TreeBuilder, node_scores, tree_leaves
from hashlearn.io import persistable
from hashlearn.kernels import log_message

__all__ = ["BoostedSearchForest"]

_MIN_RANDOM_PAIRS = 20


class _Node:
    __slots__ = ("node", "rows", "sim", "rand", "wbar", "depth", "split", "gain")

    def __init__(self, node, rows, sim, rand, wbar, depth):
        self.node, self.rows, self.sim, self.rand = node, rows, sim, rand
        self.wbar, self.depth = wbar, depth
        self.split = None
        self.gain = -np.inf


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
    Returns ``(nan, -inf)`` when every value is equal.
    """
    m = len(v_rows)
    sorted_v = np.sort(v_rows)
    picks = (np.arange(1, n_thresholds + 1) * (m - 1)) // (n_thresholds + 1)
    qs = np.unique(sorted_v[picks])
    m_right = np.searchsorted(sorted_v, qs, side="right")
    valid = m_right < m  # a larger value exists
    qs, m_right = qs[valid], m_right[valid]
    if len(qs) == 0:
        return float("nan"), -np.inf
    upper = sorted_v[m_right]  # the next distinct value above each candidate
    mids = qs / 2.0 + upper / 2.0
    # adjacent floats: the midpoint rounds onto one of them; v > qs is the same split
    mids = np.where((mids > qs) & (mids < upper), mids, qs)
    m_left = m - m_right
    if len(weight):
        lo, hi = np.minimum(v_a, v_b), np.maximum(v_a, v_b)
        o_lo, o_hi = np.argsort(lo), np.argsort(hi)
        cum_lo = np.concatenate([[0.0], np.cumsum(weight[o_lo])])
        cum_hi = np.concatenate([[0.0], np.cumsum(weight[o_hi])])
        cut = (
            cum_lo[np.searchsorted(lo[o_lo], qs, side="right")]
            - cum_hi[np.searchsorted(hi[o_hi], qs, side="right")]
        )
    else:
        cut = np.zeros(len(qs))
    gain = 2.0 * cost * m_left.astype(np.float64) * m_right - cut
    gain[(m_left < min_leaf) | (m_right < min_leaf)] = -np.inf
    best = int(np.argmax(gain))
    return float(mids[best]), float(gain[best])


@persistable
class BoostedSearchForest(BaseBucketer):
    """Boosted search forest: search trees learnt by boosting for recall vs. candidate cost.

    boosted-search-forest.txt, Algorithm 1 (boosting, eq. 7-15) and Algorithm 2 (tree
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
        ``c_m`` of eq. 15.
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
    def n_tables(self) -> int:
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
        n = X.shape[0]
        self._check_params(n)
        rng = check_random_state(self.random_state)
        lam = float(self.lam)
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
                    stacklevel=3,
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

        n_sim = max(1, int(round(self.n_pairs * self.similar_fraction)))
        n_rand = max(1, self.n_pairs - n_sim)
        builder = TreeBuilder(X.shape[1])
        train_leaves = np.zeros((n, 0), np.int64)
        weights = []
        start = time.process_time()
        for m in range(self.n_trees):
            # --- pairs for this tree, with importance weights (sums estimate all pairs)
            if neighbors is None:
                eligible = np.concatenate([r for r in class_rows if len(r) >= 2])
                sa = eligible[rng.randint(len(eligible), size=n_sim)]
                rows_of = [class_rows[c] for c in y_codes[sa]]
                sb = np.array([r[rng.randint(len(r))] for r in rows_of], np.int64)
                same = sb == sa
                while same.any():  # re-draw self pairs
                    sb[same] = [
                        rows_of[i][rng.randint(len(rows_of[i]))] for i in np.flatnonzero(same)
                    ]
                    same = sb == sa
                sizes = np.array([len(class_rows[c]) for c in y_codes[sa]], np.float64)
                alpha_sim = len(eligible) * (sizes - 1.0) / n_sim
            else:
                sa = rng.randint(n, size=n_sim).astype(np.int64)
                sb = neighbors[sa, rng.randint(neighbors.shape[1], size=n_sim)]
                alpha_sim = np.full(n_sim, n * neighbors.shape[1] / n_sim)
            ra = rng.randint(n, size=n_rand).astype(np.int64)
            rb = (ra + 1 + rng.randint(n - 1, size=n_rand)) % n
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
            c_m = float(np.log(max((1.0 - lam) * w_sim_t, 1e-300) / (lam * w_dis_t)))
            c_m = float(np.clip(c_m, 1e-3, 50.0))
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
        open_nodes = [start]
        leaves: list[_Node] = []
        n_leaves = 1
        while open_nodes:
            best = max(range(len(open_nodes)), key=lambda i: open_nodes[i].gain)
            node = open_nodes[best]
            if node.gain <= 0 or n_leaves >= max_leaves:
                break
            open_nodes.pop(best)
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
                open_nodes.append(child_node)
            # the sides of the rows below are written again by their own splits
        leaves = open_nodes
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
        Xn = X[node.rows]
        cost = lam * node.wbar
        # local indices of the similar pairs' endpoints
        where[node.rows] = np.arange(m)
        a_loc, b_loc = where[sa[node.sim]], where[sb[node.sim]]
        pw = sim_weight[node.sim]
        use_stump = self.split == "stump" or (self.split == "hybrid" and m > self.stump_above)
        best = (-np.inf, None)
        if use_stump:
            for f in range(X.shape[1]):
                v = Xn[:, f]
                if v[0] == v.max() and v[0] == v.min():
                    continue
                theta, gain = _best_threshold(
                    v, v[a_loc], v[b_loc], pw, cost, min_leaf, self.n_thresholds
                )
                if gain > best[0]:
                    best = (gain, (f, None, theta))
        else:
            mean = Xn.mean(axis=0)
            Xc = Xn - mean
            directions = []
            if len(pw):
                S = sp.coo_matrix((pw, (a_loc, b_loc)), shape=(m, m)).tocsr()
                A = Xc.T @ (S @ Xc)
                A = A + A.T
                vals, vecs = np.linalg.eigh(A)
                directions += [vecs[:, -1], vecs[:, -2]] if len(vals) > 1 else [vecs[:, -1]]
            # the node's top principal direction (a cheap fallback candidate)
            sub = Xc if m <= 2000 else Xc[rng.choice(m, 2000, replace=False)]
            directions.append(np.linalg.eigh(sub.T @ sub)[1][:, -1])
            for p in directions:
                v = node_scores(X, node.rows, None, p)
                if v.max() == v.min():
                    continue
                theta, gain = _best_threshold(
                    v, v[a_loc], v[b_loc], pw, cost, min_leaf, self.n_thresholds
                )
                if gain > best[0]:
                    best = (gain, (None, p.astype(np.float64), theta))
        node.gain, node.split = best

    def table_weights(self) -> np.ndarray:
        """The tree weights ``c_m`` of eq. 15 (``tree_weights_``): :meth:`candidates` ranks
        by ``T(q, x) = sum_m c_m t_m(q, x)``, the boosted selection function of eq. 8."""
        check_is_fitted(self, "key_tag_")
        return np.asarray(self.tree_weights_, np.float64)

    def _local_keys(self, X, n_threads=None) -> np.ndarray:
        return tree_leaves(X, self, n_threads=n_threads)
