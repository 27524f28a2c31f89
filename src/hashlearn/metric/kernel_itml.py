"""Kernelized ITML (Davis et al. 2007; Jain, Kulis & Grauman, eq. 4 and Lemmas 1-2).

When the input dimension is too large for a d x d matrix (sparse bags of words or of
quantised patches), ITML runs on the kernel matrix of the ``c`` constrained points instead:
:math:`K_{t+1} = K_t + \\beta_t K_t (e_i - e_j)(e_i - e_j)^T K_t` (eq. 4), with the same
projection parameters :math:`\\beta_t` as the explicit update (eq. 3). Alongside, the c x c
matrix ``S`` of Lemma 2 is updated so that the learned factor is
:math:`G = I + \\Phi S \\Phi^T` (with :math:`A_0 = I`), never formed:

.. math::

    S_{t+1} = S_t + \\alpha_t (I + S_t K_0)(e_i - e_j)(e_i - e_j)^T (I + K_0 S_t^T)(I + K_0 S_t),

with :math:`\\alpha_t = (\\sqrt{1 + p_t \\beta_t} - 1) / p_t` from Lemma 1 and
:math:`p_t = (e_i - e_j)^T K_t (e_i - e_j)`. Written this way both updates cost O(c^2) per
projection, against ITML's O(d^2): with ``c`` = 200 constrained points of 16-d data a fit
was 100s of times slower than ITML on the same constraints (this form is the oracle of
``tests/test_metric.py``).

The fit therefore runs the same projections in a basis of the span of the constrained
points: with the eigendecomposition :math:`K_0 = U \\Sigma^2 U^T = L L^T` of rank ``r``
(:math:`r \\le \\min(c, d)` for the linear kernel), every iterate is
:math:`K_t = L B_t L^T` and Lemma 2's factor is :math:`G_t = I + Q (C_t - I) Q^T` on that
span, where :math:`B_t, C_t` (r x r) follow eq. 3 and Lemma 1 on the vectors
:math:`v = L_i - L_j` (:func:`hashlearn.metric.itml.itml_projections` with ``C``, O(r^2)
per projection); at the end :math:`K = L B L^T` and
:math:`S = U \\Sigma^{-1} (C - I) \\Sigma^{-1} U^T`, the same :math:`G = I + \\Phi S \\Phi^T` as
the incremental Lemma 2 update. With the linear kernel a fit costs about twice ITML's
projections (two r x r updates) plus one c x c eigendecomposition. Eigenvalues below
``rank_tol`` times the largest are dropped (the directions in which no constraint can act).

The learned kernel of any two inputs follows from ``S`` and kernel values against the
constrained points, :math:`k_x = \\Phi^T \\phi(x)`:
:math:`\\phi(x)^T A \\phi(y) = k(x, y) + k_x^T (S + S^T + S^T K_0 S) k_y`.
With the linear kernel on the same constraints this is exactly ITML with ``A0 = I``.
"""

from __future__ import annotations

import numbers
import time
import warnings

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_array, check_is_fitted

from hashlearn._utils.validation import DEPRECATED, check_int, check_real, renamed_param
from hashlearn.io import (
    Persistable,
    check_fitted_items,
    persistable,
    renamed_params,
    require_array,
)
from hashlearn.kernels import kernel_matrix, log_message
from hashlearn.metric.itml import (
    check_projection_params,
    default_num_constraints,
    itml_projections,
)
from hashlearn.supervision import check_supervision, pairs_from_labels

__all__ = ["KernelITML"]

_KERNELS = ("linear", "rbf", "precomputed")


def _pair_distances(K, local) -> np.ndarray:
    """Squared kernel distances ``K_ii + K_jj - 2 K_ij`` of the pairs ``local`` (m, 2)."""
    return (
        K[local[:, 0], local[:, 0]] + K[local[:, 1], local[:, 1]] - 2 * K[local[:, 0], local[:, 1]]
    )


def symmetric_factor_coefficients(K0: np.ndarray, K: np.ndarray, rtol: float = 1e-10) -> np.ndarray:
    """``S`` with ``G = I + Phi S Phi^T`` the symmetric square root of the learned ``A``,
    computed from the input and learned kernels alone (``K0 = V Sigma^2 V^T``):
    ``S = V Sigma^-1 ((Sigma^-1 V^T K V Sigma^-1)^{1/2} - I) Sigma^-1 V^T`` on the range of
    ``K0``. Used when the incremental Lemma 2 update is numerically unstable."""
    vals, vecs = np.linalg.eigh((K0 + K0.T) / 2)
    keep = vals > rtol * max(vals.max(), 1e-300)
    V, inv_sigma = vecs[:, keep], 1.0 / np.sqrt(vals[keep])
    B = (inv_sigma[:, None] * (V.T @ K @ V)) * inv_sigma[None, :]
    bvals, bvecs = np.linalg.eigh((B + B.T) / 2)
    root = (bvecs * np.sqrt(np.clip(bvals, 0.0, None))) @ bvecs.T - np.eye(len(B))
    W = V * inv_sigma[None, :]
    return W @ root @ W.T


_KERNEL_ITML_FITTED = (
    "constrained_index_",
    "constrained_",
    "K0_",
    "K_",
    "S_",
    "bounds_",
    "n_iter_",
    "rank_",
    "lemma2_stable_",
    "converged_",
    "violated_fraction_",
    "n_features_in_",
)


@persistable
class KernelITML(Persistable, BaseEstimator):
    """Kernelized ITML over the constrained points (Jain et al. eq. 4, Lemmas 1-2).

    Parameters
    ----------
    kernel : {"linear", "rbf", "precomputed"} or callable, default="linear"
        Input kernel. ``"precomputed"``: ``fit`` takes the square training kernel matrix.
        A callable ``kernel(X, Y) -> (len(X), len(Y))`` is checked for that shape.
    slack : float, default=1.0
        ITML's slack weight (as :class:`hashlearn.metric.ITML`).
    rbf_gamma : float, optional
        Width of the RBF kernel ``exp(-rbf_gamma |x - y|^2)``; default ``1 / n_features``.
    lower_percentile, upper_percentile : float, default=5, 95
        ``u`` / ``l`` from these percentiles of the constrained pairs' kernel distances.
    num_constraints : int, optional
        Pairs sampled from labels; default ``20 c^2`` for ``c`` classes.
    max_iter, tol : int, float
        As :class:`hashlearn.metric.ITML`.
    max_points : int or None, default=2000
        With labels, constraints are sampled among at most this many random training rows
        (with a ``UserWarning`` when there are more): the fit forms and eigendecomposes the
        c x c kernel matrix of the constrained points, O(c^2) memory and O(c^3) time.
        With explicit pairs over more points, a warning only. ``None``: no cap.
    rank_tol : float, default=1e-10
        Eigenvalues of the constrained kernel matrix below ``rank_tol`` times the largest
        are treated as zero.
    warn_flops_per_pass : float, default=2e10
        Warn (``UserWarning``) before fitting when one pass over the constraints costs more
        than this many floating-point operations (``4 m r^2`` for ``m`` constraints, rank
        ``r``), i.e. when a fit may take minutes.
    random_state : int, RandomState or None
        Seed of the constraint sampling.
    verbose : bool, default=False
        Log the fit's steps and its progress (every 2 s of CPU) at INFO level to the
        ``"hashlearn"`` logger, and make sure they are shown.
    gamma : deprecated
        Former name of ``slack`` (``gamma`` is the kernel width everywhere else in
        hashlearn); when set it wins, with a ``DeprecationWarning``. Removed in the next
        release.

    Attributes
    ----------
    constrained_index_ : ndarray (c,)
        Rows of the training ``X`` that appear in a constraint.
    constrained_ : ndarray (c, d) or CSR arrays
        Those points (for kernels other than precomputed); sparse input stays sparse.
    K0_, K_ : ndarray (c, c)
        Input and learned kernel of the constrained points.
    S_ : ndarray (c, c)
        Lemma 2's coefficients: ``G = I + Phi S Phi^T``.
    rank_ : int
        Rank ``r`` of ``K0_`` used by the factored projections.
    lemma2_stable_ : bool
        False when Lemma 2's coefficients came out non-finite; ``S_`` is then the
        symmetric-root coefficients computed from ``K_``
        (:func:`symmetric_factor_coefficients`), which give the same ``A``.
    bounds_ : ndarray (2,)
        ``(u, l)``.
    n_iter_, converged_, violated_fraction_ :
        As :class:`hashlearn.metric.ITML` (violations measured with the learned kernel).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.metric import ITML, KernelITML
    >>> rng = np.random.RandomState(0)
    >>> y = rng.randint(0, 3, 60)
    >>> X = rng.randn(60, 4) + y[:, None]
    >>> from hashlearn.supervision import pairs_from_labels
    >>> pairs, similar = pairs_from_labels(y, 100, random_state=0)
    >>> kit = KernelITML(slack=1.0).fit(X, pairs=pairs, similar=similar)
    >>> kit.rank_  # the linear kernel of 4-d points has rank 4
    4
    >>> itml = ITML(slack=1.0).fit(X, pairs=pairs, similar=similar)
    >>> bool(np.allclose(kit.learned_kernel(X[:3], X[3:6]), X[:3] @ itml.A_ @ X[3:6].T))
    True
    """

    def __init__(
        self,
        kernel="linear",
        slack: float = 1.0,
        rbf_gamma: float | None = None,
        lower_percentile: float = 5.0,
        upper_percentile: float = 95.0,
        num_constraints: int | None = None,
        max_iter: int = 1000,
        tol: float = 1e-3,
        max_points: int | None = 2000,
        rank_tol: float = 1e-10,
        warn_flops_per_pass: float = 2e10,
        random_state=None,
        verbose: bool = False,
        gamma=DEPRECATED,
    ):
        self.kernel = kernel
        self.slack = slack
        self.rbf_gamma = rbf_gamma
        self.lower_percentile = lower_percentile
        self.upper_percentile = upper_percentile
        self.num_constraints = num_constraints
        self.max_iter = max_iter
        self.tol = tol
        self.max_points = max_points
        self.rank_tol = rank_tol
        self.warn_flops_per_pass = warn_flops_per_pass
        self.random_state = random_state
        self.verbose = verbose
        self.gamma = gamma

    #: constructor parameters renamed, old name -> new name (the old one kept one release)
    _renamed_params = {"gamma": "slack"}

    def _log(self, message: str, *args) -> None:
        log_message(self.verbose, "KernelITML: " + message, *args)

    def _pairs_from_labels(self, y, rng):
        """``num_constraints`` pairs sampled from the labels, among at most ``max_points``
        rows (a random subset, with a warning, when there are more)."""
        owner = type(self).__name__
        n_pairs = self.num_constraints or default_num_constraints(y)
        rows = np.arange(len(y))
        if self.max_points is not None and len(y) > self.max_points:
            rows = np.sort(rng.choice(len(y), self.max_points, replace=False))
            if len(np.unique(y[rows])) < 2:
                rows = np.arange(len(y))
            else:
                warnings.warn(
                    f"{owner} samples its {n_pairs} constraints among max_points="
                    f"{self.max_points} random rows of the {len(y)} training rows: the fit "
                    "costs O(c^3) for the c x c kernel matrix of the constrained points. "
                    "Pass max_points=None to use every row.",
                    UserWarning,
                    stacklevel=3,
                )
        pairs, similar = pairs_from_labels(y[rows], n_pairs, random_state=rng, owner=owner)
        return rows[pairs], similar

    # ------------------------------------------------------------------------ kernels

    def _kernel(self, X, Y) -> np.ndarray:
        """Input kernel between rows of X and Y, shape-checked. The named kernels are
        :func:`hashlearn.kernels.kernel_matrix`'s; a callable here takes whole matrices."""
        if not callable(self.kernel):
            width = self.rbf_gamma if self.rbf_gamma is not None else 1.0 / X.shape[1]
            return kernel_matrix(X, Y, self.kernel, gamma=width, owner=type(self).__name__)
        K = self.kernel(X, Y)
        K = K.toarray() if sp.issparse(K) else np.asarray(K, dtype=np.float64)
        if K.shape != (X.shape[0], Y.shape[0]):
            raise ValueError(
                f"kernel of {type(self).__name__} returned shape {K.shape}; "
                f"expected ({X.shape[0]}, {Y.shape[0]})."
            )
        if not np.all(np.isfinite(K)):
            raise ValueError(f"kernel of {type(self).__name__} returned NaN or inf.")
        return K

    def _check_X(self, X, *, reset: bool):
        if self.kernel == "precomputed":
            return check_array(X, dtype=np.float64)
        X = check_array(
            X,
            accept_sparse="csr",
            dtype=(np.float64, np.float32),
            ensure_min_samples=0 if not reset else 1,
        )
        if reset:
            self.n_features_in_ = X.shape[1]
        elif X.shape[1] != self.n_features_in_:
            raise ValueError(
                f"X has {X.shape[1]} features, but {type(self).__name__} was "
                f"fitted with {self.n_features_in_}."
            )
        return X

    # ------------------------------------------------------------------------ fitting

    def _check_params(self) -> float:
        """Validate the hyper-parameters; returns the slack weight (see ``gamma``)."""
        owner = type(self).__name__
        if not (callable(self.kernel) or self.kernel in _KERNELS):
            raise ValueError(
                f"The 'kernel' parameter of {owner} must be one of {_KERNELS} or "
                f"a callable. Got {self.kernel!r} instead."
            )
        slack = renamed_param(self, "gamma", "slack")
        check_real(slack, "slack", owner, low=0.0, low_open=True)
        if self.rbf_gamma is not None:
            check_real(self.rbf_gamma, "rbf_gamma", owner, low=0.0, low_open=True)
        check_projection_params(self)
        if self.max_points is not None:
            check_int(self.max_points, "max_points", owner, low=2)
        check_real(self.rank_tol, "rank_tol", owner, low=0.0, high=1.0)
        check_real(self.warn_flops_per_pass, "warn_flops_per_pass", owner, low=0.0)
        return float(slack)

    def fit(self, X, y=None, *, pairs=None, similar=None):
        """Learn ``S`` from labels ``y`` or explicit ``pairs`` / ``similar``.

        ``X`` is the data (dense or sparse CSR), or with ``kernel="precomputed"`` the square
        kernel matrix of the training points.
        """
        owner = type(self).__name__
        slack = self._check_params()
        X = self._check_X(X, reset=True)
        n = X.shape[0]
        rng = check_random_state(self.random_state)
        if self.kernel == "precomputed" and X.shape != (n, n):
            raise ValueError(
                f"with kernel='precomputed', X passed to {owner}.fit must be the "
                f"square training kernel matrix. Got shape {X.shape}."
            )
        y, pairs, similar = check_supervision(y, pairs, similar, n, f"{owner}.fit")
        if pairs is None:
            pairs, similar = self._pairs_from_labels(y, rng)
        index, inverse = np.unique(pairs.ravel(), return_inverse=True)
        local = inverse.reshape(-1, 2).astype(np.int64)
        K0 = self._constrained_kernel_matrix(X, index)
        u, ell = np.percentile(
            _pair_distances(K0, local), [self.lower_percentile, self.upper_percentile]
        )
        u, ell = max(float(u), 1e-12), max(float(ell), 1e-12)
        U, sigma = self._span(K0)
        B, C = self._projections(U * sigma, local, similar, (u, ell), slack)
        B = (B + B.T) / 2
        # K = L B L^T (eq. 4's result); S with Phi S Phi^T = Q (C - I) Q^T (Lemma 2's G)
        L, W = U * sigma, U / sigma
        K = L @ B @ L.T
        S = W @ (C - np.eye(len(sigma))) @ W.T
        self.lemma2_stable_ = bool(np.all(np.isfinite(S)))
        if not self.lemma2_stable_:
            S = symmetric_factor_coefficients(K0, (K + K.T) / 2)
        self.constrained_index_ = index.astype(np.int64)
        self.K0_, self.K_, self.S_ = K0, (K + K.T) / 2, S
        self.rank_ = len(sigma)
        self.bounds_ = np.array([u, ell])
        dist = _pair_distances(self.K_, local)
        bad = np.where(similar, dist > u * (1 + 1e-2), dist < ell * (1 - 1e-2))
        self.violated_fraction_ = float(bad.mean()) if len(bad) else 0.0
        return self

    def _constrained_kernel_matrix(self, X, index) -> np.ndarray:
        """The symmetrised input kernel ``K0`` of the constrained rows ``index`` of ``X``
        (keeps those rows as ``constrained_`` unless the kernel is precomputed)."""
        owner = type(self).__name__
        c = len(index)
        if self.max_points is not None and c > self.max_points:
            warnings.warn(
                f"{owner}: the given pairs involve {c} points, more than max_points="
                f"{self.max_points}; the fit forms a {c} x {c} kernel matrix and "
                "eigendecomposes it, which may take long. Pass fewer pairs.",
                UserWarning,
                stacklevel=3,
            )
        self._log("kernel matrix of the %d constrained points", c)
        if self.kernel == "precomputed":
            K0 = np.ascontiguousarray(X[np.ix_(index, index)])
            if not np.allclose(K0, K0.T):
                raise ValueError(f"the precomputed kernel passed to {owner}.fit must be symmetric.")
        else:
            Phi = X[index]
            K0 = np.ascontiguousarray(self._kernel(Phi, Phi))
            self.constrained_ = Phi
        return (K0 + K0.T) / 2

    def _span(self, K0) -> tuple[np.ndarray, np.ndarray]:
        """A basis of the constrained points' feature span, ``K0 = L L^T`` with
        ``L = U diag(sigma)`` (c, r): eigenvalues below ``rank_tol`` times the largest
        dropped; a kernel that is not positive semi-definite is refused."""
        c = K0.shape[0]
        self._log("eigendecomposition of the %d x %d kernel matrix", c, c)
        vals, vecs = np.linalg.eigh(K0)
        if vals.min(initial=0.0) < -1e-6 * max(vals.max(initial=0.0), 1e-300):
            raise ValueError(
                f"the kernel of {type(self).__name__} is not positive semi-definite on the "
                f"constrained points (eigenvalue {vals.min():.3g} vs max {vals.max():.3g})."
            )
        keep = vals > self.rank_tol * max(vals.max(initial=0.0), 1e-300)
        return vecs[:, keep], np.sqrt(vals[keep])

    def _projections(self, L, local, similar, bounds, slack) -> tuple[np.ndarray, np.ndarray]:
        """ITML's projections in the span (``itml_projections`` with ``C``), logged every 2 s
        of CPU with ``verbose``; returns ``(B, C)`` and sets ``n_iter_``, ``converged_``."""
        c, r = L.shape
        V = np.ascontiguousarray(L[local[:, 0]] - L[local[:, 1]])
        m = len(local)
        if 4.0 * m * r * r > self.warn_flops_per_pass:
            warnings.warn(
                f"{type(self).__name__}: each pass over the {m} constraints costs about "
                f"{4.0 * m * r * r:.2g} flops (rank {r} of the {c} x {c} kernel matrix); "
                f"a fit of up to max_iter={self.max_iter} passes may take minutes. Lower "
                "num_constraints or max_points, or raise tol.",
                UserWarning,
                stacklevel=3,
            )
        B = np.eye(r)
        C = np.eye(r)
        delta = np.where(similar, 1.0, -1.0)
        bhat = np.where(similar, bounds[0], bounds[1]).astype(np.float64)
        lam = np.zeros(m)
        n_iter, converged = 0, False
        started = time.process_time()
        last_log = started
        while n_iter < self.max_iter and not converged:
            chunk = min(self.max_iter - n_iter, 1 if self.verbose else self.max_iter)
            done, converged = itml_projections(
                B, V, delta, bhat, lam, slack, int(chunk), float(self.tol), C
            )
            n_iter += int(done)
            now = time.process_time()
            if self.verbose and now - last_log > 2.0:
                last_log = now
                self._log(
                    "pass %d of at most %d (%.1f s CPU)", n_iter, self.max_iter, now - started
                )
        self._log(
            "%d passes, converged=%s (%.1f s CPU)",
            n_iter,
            converged,
            time.process_time() - started,
        )
        self.n_iter_, self.converged_ = int(n_iter), bool(converged)
        return B, C

    # ---------------------------------------------------------------------- applying

    @property
    def kernel_coefficients_(self) -> np.ndarray:
        """``M = S + S^T + S^T K0 S``: learned kernel = k(x, y) + k_x^T M k_y."""
        check_is_fitted(self)
        return self.S_ + self.S_.T + self.S_.T @ self.K0_ @ self.S_

    def constrained_kernel(self, X) -> np.ndarray:
        """Input kernel values ``Phi^T phi(x)`` of the rows of X against the constrained
        points, ``(n, c)`` (not for ``kernel="precomputed"``)."""
        check_is_fitted(self)
        if self.kernel == "precomputed":
            raise ValueError(
                "with kernel='precomputed' pass kernel values to "
                "learned_kernel_from_values instead."
            )
        return self._kernel(self._check_X(X, reset=False), self.constrained_)

    def learned_kernel(self, X, Y=None) -> np.ndarray:
        """Learned kernel ``phi(x)^T A phi(y)`` between rows of X and Y (Lemma 2)."""
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        Y = X if Y is None else self._check_X(Y, reset=False)
        return self.learned_kernel_from_values(
            self._kernel(X, Y),
            self._kernel(X, self.constrained_),
            self._kernel(Y, self.constrained_),
        )

    def learned_kernel_from_values(self, K_xy, K_xc, K_yc) -> np.ndarray:
        """Learned kernel from input-kernel values: ``K_xy (n, m)``, and each side against
        the constrained points, ``K_xc (n, c)``, ``K_yc (m, c)``."""
        check_is_fitted(self)
        c = len(self.S_)
        K_xy, K_xc, K_yc = (np.asarray(a, np.float64) for a in (K_xy, K_xc, K_yc))
        if (
            K_xc.ndim != 2
            or K_yc.ndim != 2
            or K_xc.shape[1] != c
            or K_yc.shape[1] != c
            or K_xy.shape != (K_xc.shape[0], K_yc.shape[0])
        ):
            raise ValueError(
                f"kernel values have shapes {K_xy.shape}, {K_xc.shape}, "
                f"{K_yc.shape}; expected (n, m), (n, {c}), (m, {c})."
            )
        return K_xy + K_xc @ self.kernel_coefficients_ @ K_yc.T

    def pair_distances(self, X, Y) -> np.ndarray:
        """Squared learned distances of matching rows of X and Y."""
        check_is_fitted(self)
        X = self._check_X(X, reset=False)
        Y = self._check_X(Y, reset=False)
        M = self.kernel_coefficients_
        kx = self._kernel(X, self.constrained_)
        ky = self._kernel(Y, self.constrained_)
        kxx, kyy, kxy = (
            np.array([self._kernel(P[i : i + 1], Q[i : i + 1])[0, 0] for i in range(P.shape[0])])
            for P, Q in ((X, X), (Y, Y), (X, Y))
        )
        z = kx - ky
        return kxx + kyy - 2 * kxy + np.einsum("ij,jk,ik->i", z, M, z)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self.kernel != "precomputed"
        tags.input_tags.pairwise = self.kernel == "precomputed"
        tags.target_tags.required = True
        return tags

    # -------------------------------------------------------------------- persistence

    def _get_state(self):
        check_is_fitted(self)
        params = renamed_params(type(self), self.get_params(deep=False))
        for key, value in params.items():
            if not (value is None or isinstance(value, (str, bool, numbers.Real))):
                raise TypeError(
                    f"cannot save {type(self).__name__}: parameter {key}={value!r} "
                    "is not a number, string, bool or None."
                )
        arrays = {
            "constrained_index_": self.constrained_index_,
            "K0_": self.K0_,
            "K_": self.K_,
            "S_": self.S_,
            "bounds_": self.bounds_,
        }
        state = {
            "n_iter_": self.n_iter_,
            "rank_": self.rank_,
            "lemma2_stable_": self.lemma2_stable_,
            "converged_": self.converged_,
            "violated_fraction_": self.violated_fraction_,
            "n_features_in_": getattr(self, "n_features_in_", None),
        }
        if hasattr(self, "constrained_"):
            Phi = self.constrained_
            if sp.issparse(Phi):
                Phi = sp.csr_matrix(Phi)
                arrays.update(
                    constrained_data=Phi.data,
                    constrained_indices=Phi.indices,
                    constrained_indptr=Phi.indptr,
                )
                state["constrained_shape"] = list(Phi.shape)
            else:
                arrays["constrained_"] = np.asarray(Phi)
        return params, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        obj = cls(**renamed_params(cls, params))
        arrays = dict(arrays)
        if "constrained_data" in arrays:
            obj.constrained_ = sp.csr_matrix(
                (
                    np.asarray(arrays.pop("constrained_data")),
                    np.asarray(arrays.pop("constrained_indices")),
                    np.asarray(arrays.pop("constrained_indptr")),
                ),
                shape=tuple(state.pop("constrained_shape")),
            )
        state = dict(state)
        if state.get("n_features_in_") is None:
            state.pop("n_features_in_", None)
        check_fitted_items(cls, state, arrays, _KERNEL_ITML_FITTED)
        c = require_array(arrays, "K_", np.float64, ndim=2).shape[0]
        require_array(arrays, "K_", np.float64, shape=(c, c))
        require_array(arrays, "K0_", np.float64, shape=(c, c))
        require_array(arrays, "S_", np.float64, shape=(c, c))
        require_array(arrays, "bounds_", np.float64, shape=(2,))
        if "constrained_" in arrays:
            require_array(arrays, "constrained_", np.float64, shape=(c, None))
        elif getattr(obj, "constrained_", None) is None or obj.constrained_.shape[0] != c:
            raise ValueError(f"the constrained points must be {c} rows")
        for key, value in {**state, **arrays}.items():
            setattr(obj, key, value)
        return obj
