"""Information-theoretic metric learning (ITML; Davis et al. 2007, as used by Jain, Kulis &
Grauman, "Fast similarity search for learned metrics", Sec. 3.1).

ITML learns a Mahalanobis matrix :math:`A \\succ 0`, :math:`d_A(x, y) = (x-y)^T A (x-y)`
(eq. 1), that stays as close as possible to a prior :math:`A_0` in LogDet divergence while
similar pairs end up closer than ``u`` and dissimilar pairs farther than ``l`` (eq. 2):

.. math::

    \\min_{A \\succeq 0} D_{\\ell d}(A, A_0) \\;\\text{s.t.}\\;
    d_A(x_i, x_j) \\le u \\;(i,j) \\in S, \\quad d_A(x_i, x_j) \\ge l \\;(i,j) \\in D.

It is solved by cyclic Bregman projections onto one constraint at a time, each a rank-one
update :math:`A_{t+1} = A_t + \\beta_t A_t v_t v_t^T A_t` with :math:`v_t = x_i - x_j`
(eq. 3), with slack variables weighted by ``gamma`` so that an infeasible set of constraints
still has a solution. The projections run in one numba kernel that updates ``A`` in place
(O(d^2) per projection), so a fit takes milliseconds where a numpy loop takes seconds.

``u`` and ``l`` are percentiles of the pair distances under ``A0`` (Davis et al. use the
5th / 95th). With ``gamma="auto"`` (default) the slack weight and the percentiles are chosen
by cross-validated k-NN accuracy on the training data, and the prior metric itself (no
learning) is one of the candidates, so the learned metric is never worse than ``A0`` on
validation data.
"""

from __future__ import annotations

import numbers

import numba
import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from hashlearn._validation import check_int, check_real
from hashlearn.io import Persistable, persistable
from hashlearn.supervision import check_pairs, pairs_from_labels

__all__ = ["ITML", "GAMMA_GRID", "PERCENTILE_GRID"]

#: slack weights tried by ``gamma="auto"``
GAMMA_GRID = (0.01, 0.1, 1.0)
#: (lower, upper) distance percentiles tried by ``gamma="auto"``
PERCENTILE_GRID = ((5.0, 95.0), (1.0, 99.0))


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _bregman_step(p, delta, lam, bhat, gamma_proj, gamma):
    """One ITML projection's scalars (Davis et al. 2007, Alg. 1): returns (alpha, beta) and
    updates ``lam`` / ``bhat`` (1-element views) in place."""
    alpha = min(lam[0], delta * gamma_proj * (1.0 / p - 1.0 / bhat[0]))
    lam[0] -= alpha
    beta = delta * alpha / (1.0 - delta * alpha * p)
    if gamma != np.inf:
        bhat[0] = 1.0 / (1.0 / bhat[0] + alpha * delta / gamma)
    return alpha, beta


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def itml_projections(A, V, delta, bhat, lam, gamma, max_iter, tol):
    """Cyclic Bregman projections of ITML (paper eq. 3) over the difference vectors ``V``.

    ``A`` (d, d) is updated in place; ``delta`` is +1 for a similar pair, -1 for a
    dissimilar one; ``bhat`` (slack targets, start at u / l) and ``lam`` (dual variables,
    start at 0) are updated in place. Returns ``(passes, converged)``: convergence is the
    relative L1 change of the dual variables over a pass falling below ``tol`` (the
    criterion of Davis et al.'s code).
    """
    m, d = V.shape
    w = np.empty(d)
    lam_old = np.empty(m)
    gamma_proj = 1.0 if gamma == np.inf else gamma / (gamma + 1.0)
    for it in range(max_iter):
        lam_old[:] = lam
        for c in range(m):
            p = 0.0
            for a in range(d):
                s = 0.0
                for b in range(d):
                    s += A[a, b] * V[c, b]
                w[a] = s
                p += s * V[c, a]
            if p <= 1e-12:
                continue
            alpha, beta = _bregman_step(
                p, delta[c], lam[c : c + 1], bhat[c : c + 1], gamma_proj, gamma
            )
            if beta == 0.0:
                continue
            for a in range(d):
                ba = beta * w[a]
                for b in range(d):
                    A[a, b] += ba * w[b]
        num = 0.0
        den = 0.0
        for c in range(m):
            num += abs(lam[c] - lam_old[c])
            den += abs(lam[c]) + abs(lam_old[c])
        if den == 0.0 or num / den < tol:
            return it + 1, True
    return max_iter, False


# ----------------------------------------------------------------------------- helpers


def pair_distances(X: np.ndarray, pairs: np.ndarray, A: np.ndarray | None = None) -> np.ndarray:
    """Squared Mahalanobis distances ``d_A`` (eq. 1) of the row pairs (identity if no A)."""
    V = X[pairs[:, 0]] - X[pairs[:, 1]]
    if A is None:
        return np.einsum("ij,ij->i", V, V)
    return np.einsum("ij,jk,ik->i", V, A, V)


def metric_factor(A: np.ndarray) -> np.ndarray:
    """``G`` with ``A = G^T G`` (upper-triangular Cholesky factor; eigen-decomposition with
    tiny eigenvalues clipped if Cholesky fails)."""
    try:
        return np.linalg.cholesky(A).T.copy()
    except np.linalg.LinAlgError:
        vals, vecs = np.linalg.eigh((A + A.T) / 2)
        return (vecs * np.sqrt(np.clip(vals, 0.0, None))).T.copy()


def check_spd(A0, d: int, name: str, owner: str) -> np.ndarray:
    """A symmetric positive-definite ``(d, d)`` float64 matrix, or a ValueError."""
    A0 = check_array(A0, dtype=np.float64, ensure_2d=True)
    if A0.shape != (d, d):
        raise ValueError(
            f"{name} of {owner} must have shape ({d}, {d}) to match X. Got {A0.shape}."
        )
    if not np.allclose(A0, A0.T, rtol=1e-8, atol=1e-10 * max(1.0, np.abs(A0).max())):
        raise ValueError(f"{name} of {owner} must be symmetric.")
    try:
        np.linalg.cholesky(A0)
    except np.linalg.LinAlgError:
        raise ValueError(
            f"{name} of {owner} must be positive definite (it is singular or "
            "has a negative eigenvalue)."
        ) from None
    return A0


def knn_accuracy(Z_train, y_train, Z_val, y_val, k: int) -> float:
    """k-NN accuracy (majority vote, ties to the nearest voter) of Euclidean neighbours in Z."""
    sq = (
        np.einsum("ij,ij->i", Z_val, Z_val)[:, None]
        - 2 * Z_val @ Z_train.T
        + np.einsum("ij,ij->i", Z_train, Z_train)[None, :]
    )
    k = min(k, len(y_train))
    nn = np.argsort(sq, axis=1, kind="stable")[:, :k]
    votes = y_train[nn]
    pred = np.empty(len(y_val), dtype=y_train.dtype)
    for row in range(len(y_val)):
        labels, first, counts = np.unique(votes[row], return_index=True, return_counts=True)
        best = counts == counts.max()
        pred[row] = labels[best][np.argmin(first[best])]
    return float(np.mean(pred == y_val))


def default_num_constraints(y: np.ndarray) -> int:
    """20 c^2 for c classes (the setting of Davis et al. and Jain et al.)."""
    return 20 * len(np.unique(y)) ** 2


# ----------------------------------------------------------------------------- estimator


@persistable
class ITML(Persistable, TransformerMixin, BaseEstimator):
    """Information-theoretic metric learning (Davis et al. 2007; Jain et al. eq. 2-3).

    Parameters
    ----------
    gamma : float or "auto", default="auto"
        Slack weight: large values enforce the constraints strictly, small values stay near
        ``A0``. ``"auto"`` picks it (with the percentiles) from :data:`GAMMA_GRID` x
        :data:`PERCENTILE_GRID` by ``validation_folds``-fold cross-validated k-NN accuracy
        on the training labels (or held-out pair AUC with explicit pairs); keeping ``A0``
        is a candidate too, so the result is never worse than ``A0`` on validation data.
    lower_percentile, upper_percentile : float, default=5, 95
        ``u`` (similar pairs must be closer) and ``l`` (dissimilar pairs farther) are these
        percentiles of the constrained pairs' distances under ``A0``. Ignored with
        ``gamma="auto"``.
    num_constraints : int, optional
        Pairs sampled from labels (half similar); default ``20 c^2`` for ``c`` classes.
    A0 : array (d, d), optional
        Symmetric positive-definite prior; default the identity (Euclidean distance).
    max_iter : int, default=1000
        Cap on passes over the constraints.
    tol : float, default=1e-3
        Convergence threshold on the relative change of the dual variables per pass.
    n_neighbors : int, default=4
        k of the validation k-NN classifier (``gamma="auto"``).
    validation_folds : int, default=3
        Folds of the ``gamma="auto"`` selection.
    random_state : int, RandomState or None
        Seed of the constraint sampling and folds.

    Attributes
    ----------
    A_ : ndarray (d, d)
        Learned Mahalanobis matrix.
    G_ : ndarray (d, d)
        Factor with ``A_ = G_.T @ G_``; ``transform(X) = X @ G_.T``.
    gamma_, lower_percentile_, upper_percentile_ : float
        The slack weight and percentiles used (chosen ones with ``"auto"``).
    learned_ : bool
        False when validation preferred ``A0`` (then ``A_ = A0``).
    bounds_ : ndarray (2,)
        ``(u, l)``.
    n_iter_ : int
        Passes over the constraints; ``converged_`` says whether ``tol`` was met.
    violated_fraction_ : float
        Fraction of the constraints violated at the end (similar pair farther than ``u`` or
        dissimilar pair closer than ``l``, beyond 1% relative tolerance).
    validation_scores_ : ndarray (n_candidates,)
        With ``"auto"``: mean validation score of ``A0`` (first) and of each grid point.
    """

    def __init__(
        self,
        gamma="auto",
        lower_percentile: float = 5.0,
        upper_percentile: float = 95.0,
        num_constraints: int | None = None,
        A0=None,
        max_iter: int = 1000,
        tol: float = 1e-3,
        n_neighbors: int = 4,
        validation_folds: int = 3,
        random_state=None,
    ):
        self.gamma = gamma
        self.lower_percentile = lower_percentile
        self.upper_percentile = upper_percentile
        self.num_constraints = num_constraints
        self.A0 = A0
        self.max_iter = max_iter
        self.tol = tol
        self.n_neighbors = n_neighbors
        self.validation_folds = validation_folds
        self.random_state = random_state

    # ------------------------------------------------------------------------- fitting

    def _check_params(self, X) -> np.ndarray:
        owner = type(self).__name__
        if not (isinstance(self.gamma, str) and self.gamma == "auto"):
            check_real(self.gamma, "gamma", owner, low=0.0, low_open=True)
        check_real(self.lower_percentile, "lower_percentile", owner, low=0.0, high=100.0)
        check_real(self.upper_percentile, "upper_percentile", owner, low=0.0, high=100.0)
        if self.num_constraints is not None:
            check_int(self.num_constraints, "num_constraints", owner)
        check_int(self.max_iter, "max_iter", owner)
        check_real(self.tol, "tol", owner, low=0.0, low_open=True)
        check_int(self.n_neighbors, "n_neighbors", owner)
        check_int(self.validation_folds, "validation_folds", owner, low=2)
        d = X.shape[1]
        return np.eye(d) if self.A0 is None else check_spd(self.A0, d, "A0", owner)

    def fit(self, X, y=None, *, pairs=None, similar=None):
        """Learn ``A`` from labels ``y`` (sampled pairs) or explicit ``pairs``/``similar``."""
        owner = type(self).__name__
        if sp.issparse(X):
            raise TypeError(
                f"{owner} needs dense input (the explicit d x d form); got a "
                "scipy.sparse matrix. Use KernelITML for sparse data."
            )
        X = validate_data(self, X, dtype=np.float64, reset=True, ensure_min_samples=2)
        A0 = self._check_params(X)
        rng = check_random_state(self.random_state)
        if pairs is not None and y is not None:
            raise ValueError(f"{owner}.fit takes labels y or pairs=..., not both.")
        if pairs is None and similar is not None:
            raise ValueError(f"{owner}.fit got similar=... without pairs=...")
        if pairs is None and y is None:
            raise ValueError(
                f"{owner} requires y to be passed, but the target y is None: pass labels, fit(X, y), or pairs, "
                "fit(X, pairs=P, similar=s)."
            )
        if pairs is not None:
            pairs, similar = check_pairs(pairs, similar, X.shape[0], owner)
        else:
            y = np.asarray(y)
            if y.shape != (X.shape[0],):
                raise ValueError(
                    f"y passed to {owner} must be one label per row of X "
                    f"({X.shape[0]}). Got shape {y.shape}."
                )
            if len(np.unique(y)) < 2:
                raise ValueError(
                    f"y passed to {owner} holds a single class, so there are no "
                    "dissimilar pairs to learn from; pass at least two classes."
                )
        if isinstance(self.gamma, str):
            gamma, lo, hi, learned, scores = self._select(X, y, pairs, similar, A0, rng)
        else:
            gamma, lo, hi, learned, scores = (
                float(self.gamma),
                float(self.lower_percentile),
                float(self.upper_percentile),
                True,
                None,
            )
        if pairs is None:
            n = self.num_constraints or default_num_constraints(y)
            pairs, similar = pairs_from_labels(y, n, random_state=rng, owner=owner)
        result = _fit_itml(X, pairs, similar, A0, gamma, lo, hi, self.max_iter, self.tol)
        if not learned:
            result["A"] = A0.copy()
        self.A_ = result["A"]
        self.G_ = metric_factor(self.A_)
        self.gamma_, self.lower_percentile_, self.upper_percentile_ = gamma, lo, hi
        self.learned_ = bool(learned)
        self.bounds_ = result["bounds"]
        self.n_iter_, self.converged_ = result["n_iter"], result["converged"]
        self.violated_fraction_ = violated_fraction(X, pairs, similar, self.A_, self.bounds_)
        self.validation_scores_ = np.zeros(0) if scores is None else np.asarray(scores)
        return self

    def _select(self, X, y, pairs, similar, A0, rng):
        """Cross-validated choice among A0 and the (gamma, percentiles) grid."""
        grid = [(g, lo, hi) for g in GAMMA_GRID for lo, hi in PERCENTILE_GRID]
        scores = np.zeros(len(grid) + 1)
        if y is not None:
            _, counts = np.unique(y, return_counts=True)
            folds = min(self.validation_folds, int(counts.min()))
            if folds < 2:
                return 1.0, 5.0, 95.0, False, None
            splitter = StratifiedKFold(folds, shuffle=True, random_state=rng.randint(2**31 - 1))
            G0 = metric_factor(A0)
            for train, val in splitter.split(X, y):
                Xt, yt = X[train], y[train]
                if len(np.unique(yt)) < 2:
                    continue
                n = self.num_constraints or default_num_constraints(yt)
                p, s = pairs_from_labels(yt, n, random_state=rng)
                scores[0] += knn_accuracy(Xt @ G0.T, yt, X[val] @ G0.T, y[val], self.n_neighbors)
                for c, (g, lo, hi) in enumerate(grid, 1):
                    A = _fit_itml(Xt, p, s, A0, g, lo, hi, self.max_iter, self.tol)["A"]
                    G = metric_factor(A)
                    scores[c] += knn_accuracy(Xt @ G.T, yt, X[val] @ G.T, y[val], self.n_neighbors)
        else:
            order = rng.permutation(len(pairs))
            for fold in np.array_split(order, self.validation_folds):
                train = np.setdiff1d(order, fold)
                if similar[fold].all() or not similar[fold].any():
                    continue
                scores[0] += roc_auc_score(similar[fold], -pair_distances(X, pairs[fold], A0))
                for c, (g, lo, hi) in enumerate(grid, 1):
                    A = _fit_itml(
                        X, pairs[train], similar[train], A0, g, lo, hi, self.max_iter, self.tol
                    )["A"]
                    scores[c] += roc_auc_score(similar[fold], -pair_distances(X, pairs[fold], A))
        scores /= self.validation_folds
        best = int(np.argmax(scores))  # ties keep A0 (index 0) or the earlier grid point
        if best == 0:
            return 1.0, 5.0, 95.0, False, scores
        g, lo, hi = grid[best - 1]
        return g, lo, hi, True, scores

    # ------------------------------------------------------------------------ applying

    def transform(self, X) -> np.ndarray:
        """``X @ G_.T``: Euclidean distances of the result are the learned ``sqrt(d_A)``."""
        check_is_fitted(self)
        if sp.issparse(X):
            raise TypeError(
                f"{type(self).__name__}.transform needs dense input; got a scipy.sparse matrix."
            )
        X = validate_data(self, X, dtype=np.float64, reset=False, ensure_min_samples=0)
        return X @ self.G_.T

    def pair_distances(self, X, Y) -> np.ndarray:
        """Squared learned distances ``d_A(x_i, y_i)`` (eq. 1) of matching rows of X, Y."""
        check_is_fitted(self)
        Z = self.transform(X) - self.transform(Y)
        return np.einsum("ij,ij->i", Z, Z)

    # --------------------------------------------------------------------- persistence

    def _get_state(self):
        check_is_fitted(self)
        params = self.get_params(deep=False)
        arrays = {
            "A_": self.A_,
            "G_": self.G_,
            "bounds_": self.bounds_,
            "validation_scores_": self.validation_scores_,
        }
        if params.pop("A0") is not None:
            arrays["A0"] = np.asarray(self.A0, np.float64)
        state = {
            k: getattr(self, k)
            for k in (
                "gamma_",
                "lower_percentile_",
                "upper_percentile_",
                "learned_",
                "n_iter_",
                "converged_",
                "violated_fraction_",
                "n_features_in_",
            )
        }
        if not all(v is None or isinstance(v, (str, bool, numbers.Real)) for v in params.values()):
            raise TypeError(
                f"cannot save {type(self).__name__}: parameters must be numbers, "
                "strings, bools or None (pass random_state as an int)."
            )
        return params, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        arrays = dict(arrays)
        obj = cls(**params, A0=arrays.pop("A0", None))
        for key, value in {**state, **arrays}.items():
            setattr(obj, key, value)
        return obj


def violated_fraction(X, pairs, similar, A, bounds, rtol: float = 1e-2) -> float:
    """Fraction of pair constraints that ``A`` violates (d_A > u for similar, < l for
    dissimilar pairs), with relative tolerance ``rtol``."""
    if len(pairs) == 0:
        return 0.0
    dist = pair_distances(X, pairs, A)
    u, ell = bounds
    bad = np.where(similar, dist > u * (1 + rtol), dist < ell * (1 - rtol))
    return float(bad.mean())


def _fit_itml(X, pairs, similar, A0, gamma, lo, hi, max_iter, tol) -> dict:
    """Thresholds from percentiles, then the projections kernel on a copy of A0."""
    pairs = np.asarray(pairs, np.int64)
    dist0 = pair_distances(X, pairs, A0)
    u, ell = np.percentile(dist0, [lo, hi]) if len(dist0) else (1.0, 1.0)
    u, ell = max(float(u), 1e-12), max(float(ell), 1e-12)
    A = np.array(A0, dtype=np.float64, order="C", copy=True)
    V = np.ascontiguousarray(X[pairs[:, 0]] - X[pairs[:, 1]], dtype=np.float64)
    delta = np.where(similar, 1.0, -1.0)
    bhat = np.where(similar, u, ell).astype(np.float64)
    lam = np.zeros(len(pairs))
    n_iter, converged = itml_projections(
        A, V, delta, bhat, lam, float(gamma), int(max_iter), float(tol)
    )
    A = (A + A.T) / 2
    return {
        "A": A,
        "bounds": np.array([u, ell]),
        "n_iter": int(n_iter),
        "converged": bool(converged),
    }
