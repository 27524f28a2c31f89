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
(eq. 3), with slack variables weighted by ``slack`` (Davis et al.'s :math:`\\gamma`) so that
an infeasible set of constraints still has a solution. The projections run in one numba kernel that updates ``A`` in place
(O(d^2) per projection), so a fit takes milliseconds where a numpy loop takes seconds.

``u`` and ``l`` are percentiles of the pair distances under ``A0`` (Davis et al. use the
5th / 95th). With ``slack="auto"`` (default) the slack weight and the percentiles are chosen
by cross-validated k-NN accuracy on the training data (held-out pair AUC with explicit
pairs) over :data:`SLACK_GRID` x :data:`PERCENTILE_GRID`; when the best slack weight is at an
end of the grid, the grid is extended by a factor of 10 beyond it (``grid_extensions``
times at most). The fit always learns: the prior ``A0`` is not a candidate, its
cross-validated score is reported beside the candidates' (``cv_results_``), and a
``UserWarning`` says so when the learned metric scores below it.

Measured (k-NN accuracy, 4 neighbours, 2000 held-out points, 20 c^2 constraints): the best
slack weight is interior to 1e-4..1e2 at about 0.01-0.1 on digits and on Fashion-MNIST
(PCA-32), e.g. 0.971 at 0.01 vs 0.963 Euclidean (digits, 300 training points) and 0.738 at
0.1 vs 0.704 (Fashion-MNIST, 300 points); large values (1-100) over-fit the constraints and
fall below Euclidean. The former grid (0.01, 0.1, 1) had its best value on its lower edge.
"""

from __future__ import annotations

import numbers
import warnings
from collections.abc import Callable

import numba
import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.metrics import roc_auc_score
from sklearn.model_selection import StratifiedKFold
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted, validate_data

from hashlearn._utils.dense import dot, matvec, rank_one_update
from hashlearn._utils.validation import DEPRECATED, check_int, check_real, renamed_param
from hashlearn._utils.vote import majority_vote
from hashlearn.io import (
    Persistable,
    check_fitted_items,
    persistable,
    renamed_params,
    require_array,
    require_state,
)
from hashlearn.kernels import log_message
from hashlearn.supervision import check_supervision, pairs_from_labels

__all__ = ["ITML", "SLACK_GRID", "PERCENTILE_GRID"]

#: slack weights tried by ``slack="auto"`` (extended beyond an edge that scores best)
SLACK_GRID = (0.001, 0.01, 0.1, 1.0)
#: former name of :data:`SLACK_GRID`, kept for one release
GAMMA_GRID = SLACK_GRID
#: (lower, upper) distance percentiles tried by ``slack="auto"``
PERCENTILE_GRID = ((5.0, 95.0), (1.0, 99.0))


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _bregman_step(p, t, delta, lam, bhat, slack):
    """The scalars of ITML's projection onto constraint ``t`` (Davis et al. 2007, Alg. 1,
    whose slack weight :math:`\\gamma` is ``slack``) at ``p = v^T A v``: returns
    ``(alpha, beta)`` and updates ``lam[t]`` / ``bhat[t]`` in place; ``(0, 0)`` (no update)
    when ``p <= 1e-12``, a pair whose points coincide under the current metric."""
    if p <= 1e-12:
        return 0.0, 0.0
    d = delta[t]
    slack_proj = 1.0 if slack == np.inf else slack / (slack + 1.0)
    alpha = min(lam[t], d * slack_proj * (1.0 / p - 1.0 / bhat[t]))
    lam[t] -= alpha
    beta = d * alpha / (1.0 - d * alpha * p)
    if slack != np.inf:
        bhat[t] = 1.0 / (1.0 / bhat[t] + alpha * d / slack)
    return alpha, beta


@numba.njit(cache=True, nogil=True, inline="always")
def _duals_settled(lam, lam_old, tol):
    """Convergence of a pass of projections: the relative L1 change of the dual variables
    below ``tol`` (the criterion of Davis et al.'s code)."""
    num = 0.0
    den = 0.0
    for t in range(lam.shape[0]):
        num += abs(lam[t] - lam_old[t])
        den += abs(lam[t]) + abs(lam_old[t])
    return den == 0.0 or num / den < tol


@numba.njit(cache=True, nogil=True)
def itml_projections(A, V, delta, bhat, lam, slack, max_iter, tol, C=None):
    """Cyclic Bregman projections of ITML (paper eq. 3) over the difference vectors ``V``:
    per constraint ``v``, ``w = A v``, ``p = v^T w`` and ``A += beta w w^T``.

    ``A`` (d, d) is updated in place; ``delta`` is +1 for a similar pair, -1 for a
    dissimilar one; ``bhat`` (slack targets, start at u / l) and ``lam`` (dual variables,
    start at 0) are updated in place. With ``C`` (d, d) given (KernelITML's factored
    solver, where ``A`` is its ``B``), Lemma 1's factor is updated alongside:
    ``C += alpha_L (C v) w^T`` with ``alpha_L = (sqrt(1 + p beta) - 1) / p``. Returns
    ``(passes, converged)``: convergence is the relative L1 change of the dual variables
    over a pass falling below ``tol`` (the criterion of Davis et al.'s code).
    """
    m, d = V.shape
    w = np.empty(d)
    cv = np.empty(d)
    lam_old = np.empty(m)
    for it in range(max_iter):
        for t in range(m):
            lam_old[t] = lam[t]
        for t in range(m):
            v = V[t]
            matvec(A, v, w)
            p = dot(w, v)
            if C is not None:
                matvec(C, v, cv)
            alpha, beta = _bregman_step(p, t, delta, lam, bhat, slack)
            if beta == 0.0:
                continue
            if C is not None:
                rank_one_update(C, (np.sqrt(1.0 + p * beta) - 1.0) / p, cv, w)
            rank_one_update(A, beta, w, w)
        if _duals_settled(lam, lam_old, tol):
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
    classes, codes = np.unique(y_train, return_inverse=True)
    # a voter's rank as its distance: a tie goes to the class of the nearest voter
    rank = np.broadcast_to(np.arange(k), nn.shape)
    pred = classes[majority_vote(codes[nn], rank, len(classes))]
    return float(np.mean(pred == y_val))


def _cv_results(candidates, splits: np.ndarray, prior: np.ndarray) -> dict:
    """``cv_results_`` in scikit-learn's ``GridSearchCV`` layout from the candidates
    ``(slack, lower, upper)``, their fold scores ``splits`` (n_candidates, n_folds) and the
    prior's fold scores."""
    means = splits.mean(axis=1)
    order = np.argsort(-means, kind="stable")
    rank = np.empty(len(means), np.int64)
    rank[order] = np.arange(1, len(means) + 1)
    res: dict = {
        "param_slack": np.array([c[0] for c in candidates]),
        "param_lower_percentile": np.array([c[1] for c in candidates]),
        "param_upper_percentile": np.array([c[2] for c in candidates]),
        "params": [
            {"slack": g, "lower_percentile": lo, "upper_percentile": hi} for g, lo, hi in candidates
        ],
    }
    for k in range(splits.shape[1]):
        res[f"split{k}_test_score"] = splits[:, k]
    res.update(mean_test_score=means, std_test_score=splits.std(axis=1), rank_test_score=rank)
    for k in range(len(prior)):
        res[f"prior_split{k}_test_score"] = float(prior[k])
    res.update(prior_mean_test_score=float(prior.mean()), prior_std_test_score=float(prior.std()))
    return res


def check_projection_params(est) -> None:
    """Check the hyper-parameters ITML and KernelITML share: ``lower_percentile``,
    ``upper_percentile``, ``num_constraints``, ``max_iter`` and ``tol``."""
    owner = type(est).__name__
    check_real(est.lower_percentile, "lower_percentile", owner, low=0.0, high=100.0)
    check_real(est.upper_percentile, "upper_percentile", owner, low=0.0, high=100.0)
    if est.num_constraints is not None:
        check_int(est.num_constraints, "num_constraints", owner)
    check_int(est.max_iter, "max_iter", owner)
    check_real(est.tol, "tol", owner, low=0.0, low_open=True)


def default_num_constraints(y: np.ndarray) -> int:
    """20 c^2 for c classes (the setting of Davis et al. and Jain et al.)."""
    return 20 * len(np.unique(y)) ** 2


# ----------------------------------------------------------------------------- estimator


_ITML_FITTED = (
    "A_",
    "G_",
    "bounds_",
    "slack_",
    "lower_percentile_",
    "upper_percentile_",
    "learned_",
    "n_iter_",
    "converged_",
    "violated_fraction_",
    "n_features_in_",
    "best_score_",
    "prior_score_",
)


@persistable
class ITML(Persistable, TransformerMixin, BaseEstimator):
    """Information-theoretic metric learning (Davis et al. 2007; Jain et al. eq. 2-3).

    Parameters
    ----------
    slack : float or "auto", default="auto"
        Slack weight (Davis et al.'s :math:`\\gamma`): large values enforce the constraints
        strictly, small values stay near ``A0``. ``"auto"`` picks it (with the percentiles) from ``slack_grid`` x
        ``percentile_grid`` by ``validation_folds``-fold cross-validated k-NN accuracy on the
        training labels (or held-out pair AUC with explicit pairs), extending the grid beyond
        an edge value that scores best. The fit always learns a metric; the prior's
        cross-validated score is reported in ``cv_results_`` and a ``UserWarning`` is issued
        when the learned metric scores below it.
    lower_percentile, upper_percentile : float, default=5, 95
        ``u`` (similar pairs must be closer) and ``l`` (dissimilar pairs farther) are these
        percentiles of the constrained pairs' distances under ``A0``. Ignored with
        ``slack="auto"``.
    num_constraints : int, optional
        Pairs sampled from labels (half similar); default ``20 c^2`` for ``c`` classes.
    A0 : array (d, d), optional
        Symmetric positive-definite prior; default the identity (Euclidean distance).
    max_iter : int, default=1000
        Cap on passes over the constraints.
    tol : float, default=1e-3
        Convergence threshold on the relative change of the dual variables per pass.
    n_neighbors : int, default=4
        k of the validation k-NN classifier (``slack="auto"``).
    validation_folds : int, default=3
        Folds of the ``slack="auto"`` selection.
    slack_grid : tuple of float, optional
        Slack weights tried by ``"auto"``; default :data:`SLACK_GRID`.
    percentile_grid : tuple of (float, float), optional
        ``(lower, upper)`` percentile pairs tried by ``"auto"``; default
        :data:`PERCENTILE_GRID`.
    grid_extensions : int, default=2
        How many times ``"auto"`` may extend the slack-weight grid by a factor of 10 beyond
        the end whose value scores best (0: never).
    random_state : int, RandomState or None
        Seed of the constraint sampling and folds.
    verbose : bool, default=False
        Log each ``"auto"`` candidate's cross-validated score at INFO level to the
        ``"hashlearn"`` logger, and make sure they are shown.
    gamma, gamma_grid : deprecated
        Former names of ``slack`` and ``slack_grid`` (``gamma`` is the kernel width
        everywhere else in hashlearn); when set they win, with a ``DeprecationWarning``.
        Removed in the next release.

    Attributes
    ----------
    A_ : ndarray (d, d)
        Learned Mahalanobis matrix.
    G_ : ndarray (d, d)
        Factor with ``A_ = G_.T @ G_``; ``transform(X) = X @ G_.T``.
    slack_, lower_percentile_, upper_percentile_ : float
        The slack weight and percentiles used (chosen ones with ``"auto"``).
    learned_ : bool
        Whether ``A_`` differs from ``A0`` (False only if no constraint moved it).
    bounds_ : ndarray (2,)
        ``(u, l)``.
    n_iter_ : int
        Passes over the constraints; ``converged_`` says whether ``tol`` was met.
    violated_fraction_ : float
        Fraction of the constraints violated at the end (similar pair farther than ``u`` or
        dissimilar pair closer than ``l``, beyond 1% relative tolerance).
    cv_results_ : dict
        With ``"auto"`` (empty otherwise, or when the classes are too small to
        cross-validate): in scikit-learn's ``GridSearchCV`` layout, one entry per candidate,
        ``"param_slack"``, ``"param_lower_percentile"``, ``"param_upper_percentile"``,
        ``"params"``, ``"split<k>_test_score"``, ``"mean_test_score"``,
        ``"std_test_score"``, ``"rank_test_score"``; plus the prior's
        ``"prior_split<k>_test_score"``, ``"prior_mean_test_score"`` and
        ``"prior_std_test_score"`` on the same folds.
    best_score_, prior_score_ : float
        Mean cross-validated score of the chosen candidate and of ``A0`` (NaN without CV).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.metric import ITML
    >>> rng = np.random.RandomState(0)
    >>> y = rng.randint(0, 3, 90)
    >>> X = rng.randn(90, 4)
    >>> X[:, 0] += 2.0 * y  # one informative feature among noise
    >>> itml = ITML(random_state=0).fit(X, y)
    >>> itml.learned_, itml.A_.shape
    (True, (4, 4))
    >>> sorted(k for k in itml.cv_results_ if k.startswith(("mean", "prior_mean")))
    ['mean_test_score', 'prior_mean_test_score']
    >>> bool(itml.best_score_ == itml.cv_results_["mean_test_score"].max())
    True
    """

    def __init__(
        self,
        slack="auto",
        lower_percentile: float = 5.0,
        upper_percentile: float = 95.0,
        num_constraints: int | None = None,
        A0=None,
        max_iter: int = 1000,
        tol: float = 1e-3,
        n_neighbors: int = 4,
        validation_folds: int = 3,
        slack_grid=None,
        percentile_grid=None,
        grid_extensions: int = 2,
        random_state=None,
        verbose: bool = False,
        gamma=DEPRECATED,
        gamma_grid=DEPRECATED,
    ):
        self.slack = slack
        self.lower_percentile = lower_percentile
        self.upper_percentile = upper_percentile
        self.num_constraints = num_constraints
        self.A0 = A0
        self.max_iter = max_iter
        self.tol = tol
        self.n_neighbors = n_neighbors
        self.validation_folds = validation_folds
        self.slack_grid = slack_grid
        self.percentile_grid = percentile_grid
        self.grid_extensions = grid_extensions
        self.random_state = random_state
        self.verbose = verbose
        self.gamma = gamma
        self.gamma_grid = gamma_grid

    #: constructor parameters renamed, old name -> new name (the old one kept one release)
    _renamed_params = {"gamma": "slack", "gamma_grid": "slack_grid"}

    # ------------------------------------------------------------------------- fitting

    def _check_params(self, X, slack, slack_grid) -> np.ndarray:
        owner = type(self).__name__
        if not (isinstance(slack, str) and slack == "auto"):
            check_real(slack, "slack", owner, low=0.0, low_open=True)
        check_projection_params(self)
        check_int(self.n_neighbors, "n_neighbors", owner)
        check_int(self.validation_folds, "validation_folds", owner, low=2)
        check_int(self.grid_extensions, "grid_extensions", owner, low=0)
        self._grids(slack_grid)
        d = X.shape[1]
        return np.eye(d) if self.A0 is None else check_spd(self.A0, d, "A0", owner)

    def _grids(self, slack_grid) -> tuple[tuple[float, ...], tuple[tuple[float, float], ...]]:
        """Validated ``(slack_grid, percentile_grid)``."""
        owner = type(self).__name__
        slacks = SLACK_GRID if slack_grid is None else slack_grid
        pcts = PERCENTILE_GRID if self.percentile_grid is None else self.percentile_grid
        try:
            slacks = tuple(slacks)
            pcts = tuple(tuple(p) for p in pcts)
        except TypeError:
            raise ValueError(
                f"The 'slack_grid' and 'percentile_grid' parameters of {owner} must be "
                f"sequences. Got {slack_grid!r} and {self.percentile_grid!r} instead."
            ) from None
        if not slacks:
            raise ValueError(f"The 'slack_grid' parameter of {owner} must not be empty.")
        slacks = tuple(
            sorted({check_real(g, "slack_grid", owner, low=0.0, low_open=True) for g in slacks})
        )
        if not pcts or any(
            len(p) != 2 or not (0.0 <= float(p[0]) < float(p[1]) <= 100.0) for p in pcts
        ):
            raise ValueError(
                f"The 'percentile_grid' parameter of {owner} must be a non-empty sequence of "
                f"(lower, upper) pairs with 0 <= lower < upper <= 100. Got "
                f"{self.percentile_grid!r} instead."
            )
        return slacks, tuple((float(lo), float(hi)) for lo, hi in pcts)

    def fit(self, X, y=None, *, pairs=None, similar=None):
        """Learn ``A`` from labels ``y`` (sampled pairs) or explicit ``pairs``/``similar``."""
        owner = type(self).__name__
        if sp.issparse(X):
            raise TypeError(
                f"{owner} needs dense input (the explicit d x d form); got a "
                "scipy.sparse matrix. Use KernelITML for sparse data."
            )
        X = validate_data(self, X, dtype=np.float64, reset=True, ensure_min_samples=2)
        slack = renamed_param(self, "gamma", "slack")
        slack_grid = renamed_param(self, "gamma_grid", "slack_grid")
        A0 = self._check_params(X, slack, slack_grid)
        rng = check_random_state(self.random_state)
        y, pairs, similar = check_supervision(y, pairs, similar, X.shape[0], f"{owner}.fit")
        self.cv_results_ = {}
        self.best_score_ = self.prior_score_ = float("nan")
        if isinstance(slack, str):
            slack, lo, hi = self._select(X, y, pairs, similar, A0, slack_grid, rng)
        else:
            slack = float(slack)
            lo, hi = float(self.lower_percentile), float(self.upper_percentile)
        if pairs is None:
            n = self.num_constraints or default_num_constraints(y)
            pairs, similar = pairs_from_labels(y, n, random_state=rng, owner=owner)
        result = _fit_itml(X, pairs, similar, A0, slack, lo, hi, self.max_iter, self.tol)
        self.A_ = result["A"]
        self.G_ = metric_factor(self.A_)
        self.slack_, self.lower_percentile_, self.upper_percentile_ = slack, lo, hi
        self.learned_ = bool(not np.array_equal(self.A_, A0))
        self.bounds_ = result["bounds"]
        self.n_iter_, self.converged_ = result["n_iter"], result["converged"]
        self.violated_fraction_ = violated_fraction(X, pairs, similar, self.A_, self.bounds_)
        return self

    def _cv_folds(self, X, y, pairs, similar, rng) -> list:
        """``(X_fit, pairs, similar, score(A) -> float)`` per validation fold."""
        folds: list[tuple[np.ndarray, np.ndarray, np.ndarray, Callable[[np.ndarray], float]]] = []
        if y is not None:
            _, counts = np.unique(y, return_counts=True)
            n_folds = min(self.validation_folds, int(counts.min()))
            if n_folds < 2:
                return folds
            splitter = StratifiedKFold(n_folds, shuffle=True, random_state=rng.randint(2**31 - 1))
            for train, val in splitter.split(X, y):
                Xt, yt, Xv, yv = X[train], y[train], X[val], y[val]
                n = self.num_constraints or default_num_constraints(yt)
                p, s = pairs_from_labels(yt, n, random_state=rng)

                def knn_score(A, Xt=Xt, yt=yt, Xv=Xv, yv=yv):
                    G = metric_factor(A)
                    return knn_accuracy(Xt @ G.T, yt, Xv @ G.T, yv, self.n_neighbors)

                folds.append((Xt, p, s, knn_score))
        else:
            order = rng.permutation(len(pairs))
            for fold in np.array_split(order, self.validation_folds):
                train = np.setdiff1d(order, fold)
                if len({*similar[fold]}) < 2 or len({*similar[train]}) < 2:
                    continue

                def auc_score(A, fold=fold):
                    return roc_auc_score(similar[fold], -pair_distances(X, pairs[fold], A))

                folds.append((X, pairs[train], similar[train], auc_score))
        return folds

    def _select(self, X, y, pairs, similar, A0, slack_grid, rng) -> tuple[float, float, float]:
        """Cross-validated choice of (slack, percentiles) on a grid extended past a best
        edge; fills ``cv_results_``, ``best_score_``, ``prior_score_``."""
        owner = type(self).__name__
        slacks, pcts = self._grids(slack_grid)
        folds = self._cv_folds(X, y, pairs, similar, rng)
        if not folds:
            warnings.warn(
                f"{owner}(slack='auto') cannot cross-validate (a class has fewer than 2 "
                "members, or the pairs hold a single kind); it uses slack=1.0 and the "
                "percentiles (5, 95).",
                UserWarning,
                stacklevel=3,
            )
            return 1.0, 5.0, 95.0
        prior = np.array([score(A0) for *_, score in folds])
        log_message(self.verbose, "ITML: prior A0, cv score %.4f", prior.mean())
        candidates: list[tuple[float, float, float]] = []
        split_scores: list[np.ndarray] = []

        def evaluate(g):
            for lo, hi in pcts:
                fold_scores = np.array(
                    [
                        score(_fit_itml(Xf, p, s, A0, g, lo, hi, self.max_iter, self.tol)["A"])
                        for Xf, p, s, score in folds
                    ]
                )
                candidates.append((g, lo, hi))
                split_scores.append(fold_scores)
                log_message(
                    self.verbose,
                    "ITML: slack=%g, percentiles (%g, %g), cv score %.4f",
                    g,
                    lo,
                    hi,
                    fold_scores.mean(),
                )

        for g in slacks:
            evaluate(g)
        tried = list(slacks)
        for _ in range(self.grid_extensions):
            means = np.array([f.mean() for f in split_scores])
            best_slack = candidates[int(np.argmax(means))][0]
            if best_slack == min(tried):
                new = best_slack / 10.0
            elif best_slack == max(tried):
                new = best_slack * 10.0
            else:
                break
            tried.append(new)
            log_message(self.verbose, "ITML: best slack on the grid's edge; trying %g", new)
            evaluate(new)
        self.cv_results_ = res = _cv_results(candidates, np.array(split_scores), prior)
        means = res["mean_test_score"]
        best = int(np.argmax(means))  # ties: the earlier candidate
        self.best_score_, self.prior_score_ = float(means[best]), float(prior.mean())
        if self.best_score_ < self.prior_score_:
            warnings.warn(
                f"{owner}: the learned metric's cross-validated score "
                f"{self.best_score_:.4f} is below the prior's (A0) {self.prior_score_:.4f}; "
                "the constraints do not help on this data (see cv_results_).",
                UserWarning,
                stacklevel=3,
            )
        return candidates[best]

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

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.target_tags.required = True
        return tags

    # --------------------------------------------------------------------- persistence

    @property
    def gamma_(self) -> float:
        """Deprecated alias of ``slack_`` (removed in the next release)."""
        warnings.warn(
            "ITML.gamma_ is renamed slack_; gamma_ will be removed in the next release.",
            DeprecationWarning,
            stacklevel=2,
        )
        return self.slack_

    _CV_ARRAYS = (
        "param_slack",
        "param_lower_percentile",
        "param_upper_percentile",
        "mean_test_score",
        "std_test_score",
        "rank_test_score",
    )

    def _get_state(self):
        check_is_fitted(self)
        params = renamed_params(type(self), self.get_params(deep=False))
        arrays = {"A_": self.A_, "G_": self.G_, "bounds_": self.bounds_}
        if params.pop("A0") is not None:
            arrays["A0"] = np.asarray(self.A0, np.float64)
        grids = {}
        for key in ("slack_grid", "percentile_grid"):
            value = params.pop(key)
            grids[key] = None if value is None else np.asarray(value, np.float64).tolist()
        # every fitted attribute but the arrays above is a JSON scalar
        state = {k: getattr(self, k) for k in _ITML_FITTED if k not in arrays}
        state["grids"] = grids
        cv = getattr(self, "cv_results_", {})
        for key, value in cv.items():
            if isinstance(value, np.ndarray):
                arrays["cv_" + key] = value
            elif key != "params":
                state["cv_" + key] = value
        if not all(v is None or isinstance(v, (str, bool, numbers.Real)) for v in params.values()):
            raise TypeError(
                f"cannot save {type(self).__name__}: parameters must be numbers, "
                "strings, bools or None (pass random_state as an int)."
            )
        return params, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        arrays = dict(arrays)
        state = dict(state)
        params = renamed_params(cls, params)
        if "gamma_" in state:  # saved before the rename
            state["slack_"] = state.pop("gamma_")
        grids = state.pop("grids", {}) or {}
        slack_grid = grids.get("slack_grid", grids.get("gamma_grid"))
        percentile_grid = grids.get("percentile_grid")
        obj = cls(
            **params,
            A0=arrays.pop("A0", None),
            slack_grid=None if slack_grid is None else tuple(slack_grid),
            percentile_grid=(
                None if percentile_grid is None else tuple(tuple(p) for p in percentile_grid)
            ),
        )
        cv = {}
        for source in (state, arrays):
            for key in [k for k in source if k.startswith("cv_")]:
                cv[key[3:]] = source.pop(key)
        if "param_gamma" in cv:  # saved before the rename
            cv["param_slack"] = cv.pop("param_gamma")
        if "param_slack" in cv:
            cv["params"] = [
                {"slack": float(g), "lower_percentile": float(lo), "upper_percentile": float(hi)}
                for g, lo, hi in zip(
                    cv["param_slack"],
                    cv["param_lower_percentile"],
                    cv["param_upper_percentile"],
                    strict=True,
                )
            ]
        obj.cv_results_ = cv
        for key in ("best_score_", "prior_score_"):  # NaN when cross-validation could not run
            score = state.pop(key, None)
            if not (
                score is None or isinstance(score, float | int) and not isinstance(score, bool)
            ):
                raise ValueError(f"state entry {key!r} must be a number, got {score!r}")
            setattr(obj, key, None if score is None else float(score))
        check_fitted_items(cls, state, arrays, _ITML_FITTED)
        for key, value in {**state, **arrays}.items():
            setattr(obj, key, value)
        d = require_state(state, "n_features_in_", int, low=1)
        require_array(arrays, "A_", np.float64, shape=(d, d))
        require_array(arrays, "G_", np.float64, shape=(None, d))
        require_array(arrays, "bounds_", np.float64, shape=(2,))
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


def _fit_itml(X, pairs, similar, A0, slack, lo, hi, max_iter, tol) -> dict:
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
        A, V, delta, bhat, lam, float(slack), int(max_iter), float(tol)
    )
    A = (A + A.T) / 2
    return {
        "A": A,
        "bounds": np.array([u, ell]),
        "n_iter": int(n_iter),
        "converged": bool(converged),
    }
