"""Boosted similarity-sensitive coding, PSH / BoostSSC (binary-codes-survey.txt §3.3.1).

Each bit is a decision stump on one input dimension, :math:`h_l(x) = [x_{d_l} > T_l]`. The
stumps are chosen by GentleBoost on pairs of items labelled similar (:math:`z_n = 1`) or
dissimilar (:math:`z_n = -1`). The weak learner of round ``l`` scores a pair by whether both
items fall on the same side of the stump (eq. 14),

.. math::

    f_l(x_i, x_j) = \\alpha_l\\,[h_l(x_i) = h_l(x_j)] + \\beta_l,

and its dimension, threshold and coefficients minimise the weighted square loss
:math:`\\sum_n w^n (z_n - f_l(x_i^n, x_j^n))^2` (eq. 15) with GentleBoost's weights
:math:`w^n \\propto \\exp(-z_n \\sum_{k<l} f_k(x_i^n, x_j^n))`.

Torralba's constraint (the default, ``weighted=False``) makes all :math:`\\alpha_l` equal,
so the learned similarity is an affine function of the Hamming distance between the codes,
:math:`F = \\alpha\\,n_{same} + \\beta`: each round picks its stump with the weak learner of
eq. 15, then the common :math:`(\\alpha, \\beta)` are refitted on the exponential loss (a
two-parameter Newton step), so the loss decreases round by round. With ``weighted=True``
each round keeps its own :math:`\\alpha_l` (Shakhnarovich's PSH): the similarity is a weighted Hamming distance
:math:`\\sum_l \\alpha_l |h_l(x_i) - h_l(x_j)|`, available as :meth:`weighted_hamming` and as
``metric_distances`` for ``Searcher(rerank="metric")``.

Training cost: thresholds are searched over ``n_thresholds`` quantiles per dimension; a numba
kernel accumulates, for every (dimension, threshold), the weighted sums of the pairs that
fall on the same side, in O(pairs x dims) per round.
"""

from __future__ import annotations

import numba
import numpy as np
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from hashlearn._validation import check_int
from hashlearn.codes import unpack_bits
from hashlearn.hashers.base import BaseHasher, register_hasher
from hashlearn.io import persistable
from hashlearn.supervision import resolve_pairs

__all__ = ["BoostedSimilarityHashing"]


@numba.njit(cache=True, nogil=True)
def _same_side_sums(lo_pos, hi_pos, wz, w, n_thr, sum_wz, sum_w):
    """For every dimension k and threshold a, sums of w*z and w over pairs on the same side.

    A pair with per-dimension min at threshold position ``lo_pos`` and max at ``hi_pos`` is on
    the same side of threshold ``a`` iff ``a < lo_pos`` (both above) or ``a >= hi_pos``
    (both at or below). Histogram the positions, then prefix sums.
    """
    n_pairs, n_dims = lo_pos.shape
    above_wz = np.zeros((n_dims, n_thr + 1))
    above_w = np.zeros((n_dims, n_thr + 1))
    below_wz = np.zeros((n_dims, n_thr + 1))
    below_w = np.zeros((n_dims, n_thr + 1))
    for n in range(n_pairs):
        a = wz[n]
        b = w[n]
        for k in range(n_dims):
            above_wz[k, lo_pos[n, k]] += a
            above_w[k, lo_pos[n, k]] += b
            below_wz[k, hi_pos[n, k]] += a
            below_w[k, hi_pos[n, k]] += b
    for k in range(n_dims):
        # above: pairs with lo_pos > a  -> suffix sums from a + 1
        acc_wz = 0.0
        acc_w = 0.0
        for a in range(n_thr, -1, -1):
            if a < n_thr:
                sum_wz[k, a] = acc_wz
                sum_w[k, a] = acc_w
            acc_wz += above_wz[k, a]
            acc_w += above_w[k, a]
        # below: pairs with hi_pos <= a -> prefix sums up to a
        acc_wz = 0.0
        acc_w = 0.0
        for a in range(n_thr):
            acc_wz += below_wz[k, a]
            acc_w += below_w[k, a]
            sum_wz[k, a] += acc_wz
            sum_w[k, a] += acc_w


def _fit_common_alpha(
    n_same: np.ndarray, z: np.ndarray, start: np.ndarray, n_iter: int = 20
) -> np.ndarray:
    """(alpha, beta) minimising mean exp(-z (alpha * n_same + beta)) by damped Newton."""
    theta = start.astype(np.float64).copy()
    design = np.stack([n_same, np.ones_like(n_same)], axis=1)
    for _ in range(n_iter):
        e = np.exp(-z * (design @ theta))
        grad = -(design * (z * e)[:, None]).mean(axis=0)
        hess = (design * e[:, None]).T @ design / len(z) + 1e-9 * np.eye(2)
        step = np.linalg.solve(hess, grad)
        loss0 = e.mean()
        t = 1.0
        while t > 1e-4 and np.exp(-z * (design @ (theta - t * step))).mean() > loss0:
            t *= 0.5
        theta = theta - t * step
        if np.abs(t * step).max() < 1e-8:
            break
    return theta


@persistable
@register_hasher("boosted-ssc")
class BoostedSimilarityHashing(BaseHasher):
    """BoostSSC / PSH: GentleBoost stumps on pairs, one bit per stump (survey §3.3.1).

    Parameters
    ----------
    n_bits : int
        Boosting rounds = bits.
    weighted : bool, default=False
        False: Torralba's Hamming constraint, all :math:`\\alpha_l` equal. True: free
        :math:`\\alpha_l` per bit (weighted Hamming distance, PSH).
    n_pairs : int, default=20000
        Pairs sampled from labels (half similar) when ``fit(X, y)``.
    n_thresholds : int, default=32
        Candidate thresholds per dimension (quantiles of the training data).
    max_features : int or None
        Dimensions examined per round (a random subset, redrawn each round); None: all.
    random_state : int, RandomState or None

    Attributes
    ----------
    features_ : ndarray (n_bits,) int64
        Dimension :math:`d_l` of each stump.
    thresholds_ : ndarray (n_bits,)
        Threshold :math:`T_l`: bit l is ``x[d_l] > T_l``.
    alphas_, betas_ : ndarray (n_bits,)
        Regression coefficients of eq. 14 (all alphas equal unless ``weighted``).
    train_loss_ : ndarray (n_bits,)
        Weighted exponential loss :math:`\\sum_n \\exp(-z_n F(x_i^n, x_j^n))` / N after each round.
    """

    supervised = True

    def __init__(
        self,
        n_bits: int = 32,
        weighted: bool = False,
        n_pairs: int = 20000,
        n_thresholds: int = 32,
        max_features: int | None = None,
        random_state=None,
    ):
        self.n_bits = n_bits
        self.weighted = weighted
        self.n_pairs = n_pairs
        self.n_thresholds = n_thresholds
        self.max_features = max_features
        self.random_state = random_state

    def _fit(self, X, y, pairs, similar) -> None:
        owner = type(self).__name__
        n_pairs = check_int(self.n_pairs, "n_pairs", owner, low=2)
        n_thr = check_int(self.n_thresholds, "n_thresholds", owner, low=1, high=4096)
        n_dims = X.shape[1]
        if self.max_features is not None:
            check_int(self.max_features, "max_features", owner, high=n_dims)
        rng = check_random_state(self.random_state)
        pairs, similar = resolve_pairs(
            X, y, pairs, similar, n_pairs=n_pairs, owner=owner, random_state=rng
        )
        if similar.all() or not similar.any():
            raise ValueError(
                f"{owner} needs both similar and dissimilar pairs; got only "
                f"{'similar' if similar.all() else 'dissimilar'} ones."
            )
        X = np.asarray(X, dtype=np.float64)
        # candidate thresholds: per-dimension quantiles (midpoints keep them off data values)
        qs = np.linspace(0.0, 1.0, n_thr + 2)[1:-1]
        grid = np.quantile(X, qs, axis=0).T  # (d, n_thr), non-decreasing per row
        xi, xj = X[pairs[:, 0]], X[pairs[:, 1]]
        lo, hi = np.minimum(xi, xj), np.maximum(xi, xj)
        lo_pos = np.empty(lo.shape, np.int16)
        hi_pos = np.empty(hi.shape, np.int16)
        for k in range(n_dims):
            lo_pos[:, k] = np.searchsorted(grid[k], lo[:, k], side="left")
            hi_pos[:, k] = np.searchsorted(grid[k], hi[:, k], side="left")
        z = np.where(similar, 1.0, -1.0)
        score = np.zeros(len(z))
        features = np.zeros(self.n_bits, np.int64)
        thresholds = np.zeros(self.n_bits)
        alphas = np.zeros(self.n_bits)
        betas = np.zeros(self.n_bits)
        losses = np.zeros(self.n_bits)
        n_same = np.zeros(len(z))
        shared = np.zeros(2)
        for bit in range(self.n_bits):
            w = np.exp(-z * score)
            w /= w.sum()
            if self.max_features is None:
                dims = np.arange(n_dims)
            else:
                dims = np.sort(rng.choice(n_dims, self.max_features, replace=False))
            sum_wz = np.zeros((len(dims), n_thr))
            sum_w = np.zeros((len(dims), n_thr))
            _same_side_sums(
                np.ascontiguousarray(lo_pos[:, dims]),
                np.ascontiguousarray(hi_pos[:, dims]),
                w * z,
                w,
                n_thr,
                sum_wz,
                sum_w,
            )
            tot_wz, tot_w = float((w * z).sum()), 1.0
            s1, w1 = sum_wz, sum_w  # same side: f = alpha + beta
            s0, w0 = tot_wz - s1, tot_w - w1  # different sides: f = beta
            eps = 1e-12
            # weak learner of eq. 15: free alpha, beta = weighted means on each side
            gain = s1**2 / np.maximum(w1, eps) + s0**2 / np.maximum(w0, eps)
            best = np.unravel_index(np.argmax(gain), gain.shape)
            beta = s0[best] / max(w0[best], eps)
            alpha = s1[best] / max(w1[best], eps) - beta
            k = int(dims[best[0]])
            thr = float(grid[k, best[1]])
            same = (xi[:, k] > thr) == (xj[:, k] > thr)
            features[bit], thresholds[bit] = k, thr
            if self.weighted:
                score += alpha * same + beta
                alphas[bit], betas[bit] = alpha, beta
            else:
                # Hamming constraint: one alpha for all bits. Refit the common (alpha, beta)
                # of F = alpha * n_same + beta on the exponential loss (Newton, 2 params).
                n_same += same
                shared = _fit_common_alpha(n_same, z, shared)
                score = shared[0] * n_same + shared[1]
                alphas[: bit + 1] = shared[0]
                betas[: bit + 1] = shared[1] / (bit + 1)
            losses[bit] = float(np.exp(-z * score).mean())
        self.features_ = features
        self.thresholds_ = thresholds
        self.alphas_ = alphas
        self.betas_ = betas
        self.train_loss_ = losses

    def _project(self, X) -> np.ndarray:
        return np.asarray(X, dtype=np.float64)[:, self.features_] - self.thresholds_

    def _bits(self, X) -> np.ndarray:
        return self._project(X) > 0  # h_l(x) = [x_{d_l} > T_l], strict as in the survey

    def weighted_hamming(self, codes_a: np.ndarray, codes_b: np.ndarray) -> np.ndarray:
        """:math:`\\sum_l \\alpha_l |h_l(a) - h_l(b)|` between all rows of two packed code sets."""
        check_is_fitted(self)
        bits_a = unpack_bits(codes_a, self.n_bits).astype(np.float64)
        bits_b = unpack_bits(codes_b, self.n_bits).astype(np.float64)
        alpha = np.abs(self.alphas_)
        return (bits_a * alpha) @ (1 - bits_b).T + ((1 - bits_a) * alpha) @ bits_b.T

    def metric_distances(self, queries: np.ndarray, candidates: np.ndarray) -> np.ndarray:
        """Weighted Hamming distance ``(b, c)`` for ``Searcher(rerank="metric")``."""
        check_is_fitted(self)
        q_bits = self._project(np.asarray(queries)) > 0
        b, c, d = np.asarray(candidates).shape
        c_bits = (self._project(np.asarray(candidates).reshape(b * c, d)) > 0).reshape(b, c, -1)
        return (np.abs(self.alphas_) * (q_bits[:, None, :] != c_bits)).sum(axis=2)
