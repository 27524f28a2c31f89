"""Locality-sensitive hash functions for a learned Mahalanobis metric (Jain, Kulis &
Grauman, "Fast similarity search for learned metrics", Sec. 3.2).

Explicit form (eq. 6), for inputs of moderate dimension: with the learned ``A = G^T G``,
each bit is :math:`h_{r,A}(x) = [r^T G x \\ge 0]` with :math:`r \\sim N(0, I)`, so two
points collide with probability :math:`1 - \\frac{1}{\\pi}\\cos^{-1}\\frac{x_i^T A x_j}
{\\|G x_i\\| \\|G x_j\\|}` (eq. 7): SimHash in the learned space. :class:`MetricLSH`.

Implicit form (eq. 8), for sparse inputs of 10^5+ dimensions where ``A`` cannot be stored:
kernelized ITML (:class:`hashlearn.metric.KernelITML`, linear kernel) gives
:math:`G = I + \\Phi S \\Phi^T` over the ``c`` constrained points, hence

.. math::  r^T G \\phi(x) = r^T \\phi(x) + \\sum_i \\gamma^r_i \\phi(x_i)^T \\phi(x),
   \\qquad \\gamma^r = S^T \\Phi^T r,

computed once after learning. ``r`` is never materialised: its entry for (bit, coordinate)
is a Gaussian drawn from a seeded hash of the pair, generated on demand for each
non-zero of the input, and the second term is read from the stored non-zeros of
:math:`\\sum_i \\gamma^r_i \\phi(x_i)` by binary search, so hashing an item costs
O(nnz(x) * (n_bits + log z)) for ``z`` stored columns, independent of the dimension.
:class:`KernelMetricLSH`.

Bits depend on the factor ``G``, not only on ``A = G^T G``: any factor gives the collision
probability of eq. 7, but two forms give the *same bits* only for the same ``r`` and the same
``G``. :class:`MetricLSH` uses the Cholesky factor of ``A``; :class:`KernelMetricLSH` uses
Lemma 2's :math:`G = I + \\Phi S \\Phi^T`, which differs in general. The explicit form
reproduces the implicit bits with ``MetricLSH.from_metric(G=k.metric_factor(),
components=k.hyperplanes())`` (dense, small ``d`` only); the mean is not subtracted by the
implicit form (``center`` does not apply to it).

Both expose ``metric_distances`` so ``Searcher(hasher, index, rerank="metric")`` ranks the
hashed candidates by the learned distance (Sec. 3.3).
"""

from __future__ import annotations

import numba
import numpy as np
import scipy.sparse as sp
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from hashlearn._utils.kernel_args import frozen
from hashlearn._utils.postings import find
from hashlearn._utils.primitives import GOLDEN_GAMMA, mix64, splitmix64
from hashlearn._utils.validation import DEPRECATED, check_int, renamed_param
from hashlearn.hashers._linear import LinearForm
from hashlearn.hashers.base import BaseHasher, register_hasher
from hashlearn.io import persistable
from hashlearn.metric.itml import ITML, metric_factor
from hashlearn.metric.kernel_itml import KernelITML

__all__ = ["MetricLSH", "KernelMetricLSH", "hashed_normal", "hashed_hyperplanes"]

# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def hashed_normal(seed, bit, coord):
    """Standard normal value of hyperplane ``bit`` at coordinate ``coord`` (splitmix64 hash
    of (seed, bit, coord), then Box-Muller): the same triple always gives the same value."""
    key = mix64(np.uint64(seed) * GOLDEN_GAMMA + np.uint64(bit))
    key = mix64(key ^ (np.uint64(coord) + np.uint64(0x632BE59BD9B4E019)))
    key2 = splitmix64(key)
    u1 = (float(key >> np.uint64(11)) + 1.0) * 1.1102230246251565e-16  # (0, 1]
    u2 = float(key2 >> np.uint64(11)) * 1.1102230246251565e-16
    return np.sqrt(-2.0 * np.log(u1)) * np.cos(2.0 * np.pi * u2)


@numba.njit(cache=True, nogil=True)
def _projection_csr(data, indices, indptr, n_bits, seed, support, weights, out):
    """``out[row] += R x + W x`` over the non-zeros of CSR ``x``: the hashed hyperplanes
    plus the learned term, whose non-zero columns ``support`` (sorted; empty for none) are
    found by binary search (``weights`` (n_bits, len(support)))."""
    for row in range(len(indptr) - 1):
        for p in range(indptr[row], indptr[row + 1]):
            col = indices[p]
            v = data[p]
            for b in range(n_bits):
                out[row, b] += v * hashed_normal(seed, b, col)
            j = find(support, col)
            if j >= 0:
                for b in range(n_bits):
                    out[row, b] += v * weights[b, j]


def hashed_projection(X, n_bits: int, seed: int, support=None, weights=None) -> np.ndarray:
    """``X @ R.T`` for the hashed Gaussian hyperplanes ``R`` (n_bits, d), touching only the
    non-zeros of X (dense or sparse); plus ``X[:, support] @ weights.T`` when given."""
    X = sp.csr_matrix(X)
    out = np.zeros((X.shape[0], n_bits))
    support = np.zeros(0, np.int64) if support is None else support
    weights = np.zeros((n_bits, 0)) if weights is None else weights
    _projection_csr(
        frozen(X.data, np.float64),
        frozen(X.indices, np.int64),
        frozen(X.indptr, np.int64),
        n_bits,
        np.uint64(seed),
        frozen(support, np.int64),
        frozen(weights, np.float64),
        out,
    )
    return out


def hashed_hyperplanes(n_bits: int, n_features: int, seed: int) -> np.ndarray:
    """The hyperplanes ``R`` (n_bits, n_features) that :func:`hashed_projection` uses,
    materialised (for tests and for building the explicit form with the same ``r``)."""
    return hashed_projection(sp.identity(n_features, format="csr"), n_bits, seed).T.copy()


def _check_differences(Z, d: int):
    """Dense float64 or CSR differences with ``d`` columns."""
    if sp.issparse(Z):
        Z = sp.csr_matrix(Z, dtype=np.float64)
    else:
        Z = np.asarray(Z, dtype=np.float64)
    if Z.ndim != 2 or Z.shape[1] != d:
        raise ValueError(f"Z must be a 2-D array of differences with {d} columns. Got {Z.shape}.")
    return Z


# ----------------------------------------------------------------------------- explicit


class _LearnedMetricHasher(BaseHasher):
    """What both learned-metric hashers share: ITML's slack weight ``slack`` (formerly
    ``gamma``), and saves without the fitted learner ``metric_`` (its arrays are saved)."""

    _renamed_params = {"gamma": "slack"}

    def _learner_params(self, rng) -> dict:
        """The parameters this hasher passes to its metric learner (ITML or KernelITML),
        with a seed drawn from ``rng``."""
        return {
            "slack": renamed_param(self, "gamma", "slack"),
            "num_constraints": self.num_constraints,
            "random_state": rng.randint(2**31 - 1),
        }

    def _check_candidates(self, queries, candidates) -> tuple[np.ndarray, np.ndarray]:
        """``metric_distances``' inputs as float arrays: queries (b, d), candidates (b, c, d)."""
        check_is_fitted(self)
        queries = np.asarray(queries, np.float64)
        candidates = np.asarray(candidates, np.float64)
        if (
            queries.ndim != 2
            or candidates.ndim != 3
            or candidates.shape[0] != len(queries)
            or candidates.shape[2] != queries.shape[1]
        ):
            raise ValueError(
                f"queries must be (b, d) and candidates (b, c, d). Got "
                f"{queries.shape} and {candidates.shape}."
            )
        return queries, candidates

    def _get_state(self):
        metric = self.__dict__.pop("metric_", None)
        try:
            return super()._get_state()
        finally:
            self.metric_ = metric

    @classmethod
    def _from_state(cls, params, state, arrays):
        obj = super()._from_state(params, state, arrays)
        obj.metric_ = None
        return obj


@persistable
@register_hasher("metric-lsh")
class MetricLSH(_LearnedMetricHasher):
    """Hash functions ``[r^T G (x - mean) >= 0]`` for a learned metric ``A = G^T G`` (eq. 6).

    Parameters
    ----------
    n_bits : int, default=32
        Code length.
    metric : {"itml", "euclidean", "precomputed"}, default="itml"
        ``"itml"`` learns ``A`` with :class:`hashlearn.metric.ITML` from the labels or pairs
        given to ``fit``; ``"euclidean"`` uses ``A = I`` (plain SimHash, the paper's
        baseline); ``"precomputed"`` is what :meth:`from_metric` builds around a given ``A``.
    slack : float or "auto", default="auto"
        ITML's slack weight (``"auto"``: chosen by validation, see ITML).
    num_constraints : int, optional
        ITML's sampled pairs (default ``20 c^2``).
    center : bool, default=True
        Subtract the training mean first (the learned distance is translation invariant;
        centring balances the bits on non-negative data such as pixels).
    random_state : int, RandomState or None
        Seed of ITML's constraints and of the hyperplanes.
    gamma : deprecated
        Former name of ``slack``; when set it wins, with a ``DeprecationWarning``. Removed
        in the next release.

    Attributes
    ----------
    G_ : ndarray (d, d)
        Metric factor, ``A_ = G_.T @ G_``.
    components_ : ndarray (n_bits, d)
        Random hyperplanes ``r``.
    projection_ : ndarray (n_bits, d)
        ``components_ @ G_`` (precomputed ``r^T G``).
    mean_ : ndarray (d,)
    metric_ : ITML or None
        The fitted ITML (not saved; its ``A_``, ``G_`` are).

    Examples
    --------
    >>> from hashlearn import load_digits
    >>> from hashlearn.hashers import MetricLSH
    >>> X, y = load_digits()
    >>> h = MetricLSH(n_bits=32, num_constraints=200, random_state=0).fit(X[:300], y[:300])
    >>> h.encode(X[:4]).shape
    (4, 4)
    """

    supervised = True

    def __init__(
        self,
        n_bits: int = 32,
        metric: str = "itml",
        slack="auto",
        num_constraints: int | None = None,
        center: bool = True,
        random_state=None,
        gamma=DEPRECATED,
    ):
        self.n_bits = n_bits
        self.metric = metric
        self.slack = slack
        self.num_constraints = num_constraints
        self.center = center
        self.random_state = random_state
        self.gamma = gamma

    @classmethod
    def from_metric(
        cls, metric=None, n_bits: int = 32, *, G=None, components=None, mean=None, random_state=None
    ) -> MetricLSH:
        """A fitted hasher for a given metric: a fitted :class:`ITML` (or any object with
        ``A_``), a matrix ``A``, or its factor ``G=`` directly. ``components`` fixes the
        hyperplanes ``r`` (n_bits, d); ``mean`` the centre (default none)."""
        check_int(n_bits, "n_bits", cls.__name__)
        if (metric is None) == (G is None):
            raise ValueError(
                "MetricLSH.from_metric takes a metric (ITML or A) or G=..., exactly one."
            )
        if G is None:
            A = getattr(metric, "A_", metric)
            A = np.asarray(A, np.float64)
            if A.ndim != 2 or A.shape[0] != A.shape[1]:
                raise ValueError(f"A must be a square matrix. Got shape {A.shape}.")
            if not np.allclose(A, A.T):
                raise ValueError("A must be symmetric.")
            G = metric_factor(A)
        G = np.asarray(G, np.float64)
        if G.ndim != 2 or G.shape[0] != G.shape[1]:
            raise ValueError(f"G must be a square matrix. Got shape {G.shape}.")
        d = G.shape[1]
        obj = cls(
            n_bits=n_bits, metric="precomputed", center=mean is not None, random_state=random_state
        )
        if components is None:
            components = check_random_state(random_state).standard_normal((n_bits, d))
        components = np.asarray(components, np.float64)
        if components.shape != (n_bits, d):
            raise ValueError(f"components must have shape ({n_bits}, {d}). Got {components.shape}.")
        obj.G_ = G
        obj.mean_ = np.zeros(d) if mean is None else np.asarray(mean, np.float64).reshape(d)
        obj._set_hyperplanes(components)
        obj.n_features_in_ = d
        obj.metric_ = metric if isinstance(metric, ITML) else None
        return obj

    def _set_hyperplanes(self, components: np.ndarray) -> None:
        self.components_ = components
        self.projection_ = components @ self.G_
        self.offset_ = self.projection_ @ self.mean_

    def _fit(self, X, y, pairs, similar) -> None:
        if self.metric not in ("itml", "euclidean", "precomputed"):
            raise ValueError(
                f"The 'metric' parameter of MetricLSH must be 'itml', "
                f"'euclidean' or 'precomputed'. Got {self.metric!r} instead."
            )
        rng = check_random_state(self.random_state)
        d = X.shape[1]
        self.metric_ = None
        if self.metric == "itml":
            self.metric_ = ITML(**self._learner_params(rng))
            self.metric_.fit(X, y, pairs=pairs, similar=similar)
            self.G_ = self.metric_.G_
        elif self.metric == "euclidean":
            self.G_ = np.eye(d)
        elif getattr(self, "G_", None) is None or self.G_.shape[1] != d:
            raise ValueError(
                "metric='precomputed' needs a hasher built by "
                "MetricLSH.from_metric for inputs of this dimension."
            )
        self.mean_ = np.asarray(X.mean(axis=0), np.float64).ravel() if self.center else np.zeros(d)
        self._set_hyperplanes(rng.standard_normal((self.n_bits, d)))

    def _linear_form(self) -> LinearForm:
        return LinearForm(self.projection_, shift=-self.offset_)  # X @ projection_.T - offset_

    @property
    def A_(self) -> np.ndarray:
        """The learned Mahalanobis matrix ``G_.T @ G_``."""
        check_is_fitted(self, "G_")
        return self.G_.T @ self.G_

    def metric_transform(self) -> np.ndarray:
        """``G_``: the learned distance is ``|G_ (x - q)|^2`` (Jain, Kulis & Grauman 2008,
        eq. 6), the squared Euclidean distance of the mapped vectors; the refine stage
        (:class:`hashlearn.rerank.refiner.Refiner`) maps the kept vectors once and runs its
        Euclidean kernel."""
        check_is_fitted(self, "G_")
        return self.G_

    def metric_distances(self, queries, candidates) -> np.ndarray:
        """Squared learned distances ``(c - q)^T A (c - q)``: queries (b, d), candidates
        (b, c, d) -> (b, c) (for ``Searcher(rerank="metric")``)."""
        queries, candidates = self._check_candidates(queries, candidates)
        Z = (candidates - queries[:, None, :]) @ self.G_.T
        return np.einsum("bcd,bcd->bc", Z, Z)

    def metric_distances_from_differences(self, Z) -> np.ndarray:
        """Squared learned distances ``|G z|^2`` of the rows ``z`` of ``Z`` (dense or
        scipy.sparse differences ``x - q``), ``(rows,)``; O(nnz(Z) d) for sparse ``Z``."""
        check_is_fitted(self)
        Z = _check_differences(Z, self.G_.shape[1])
        GZ = np.asarray(Z @ self.G_.T)
        return np.einsum("ij,ij->i", GZ, GZ)


# ----------------------------------------------------------------------------- implicit


@persistable
@register_hasher("kernel-metric-lsh")
class KernelMetricLSH(_LearnedMetricHasher):
    """Implicit learned-metric hash functions for sparse high-dimensional data (eq. 8).

    ``fit`` learns kernelized ITML (linear kernel, ``A0 = I``) over the constrained points,
    then computes ``gamma^r = S^T Phi^T r`` for every bit and stores the non-zeros of
    ``sum_i gamma^r_i phi(x_i)``; ``encode`` costs O(nnz(x) * (n_bits + log z)) per row,
    whatever the dimension (no dense row and no column slicing of ``X``).

    Parameters
    ----------
    n_bits : int, default=32
    slack : float, default=1.0
        ITML's slack weight.
    num_constraints : int, optional
        Pairs sampled from labels (default ``20 c^2``).
    max_iter : int, default=1000
    random_state : int, RandomState or None
        Seed of the constraints and of the hashed hyperplanes.
    gamma : deprecated
        Former name of ``slack``; when set it wins, with a ``DeprecationWarning``. Removed
        in the next release.

    Attributes
    ----------
    n_iter_ : int
        Passes of the kernelized ITML fit.
    seed_ : int
        Seed of the hashed hyperplanes (:func:`hashed_hyperplanes` materialises them).
    support_ : ndarray (z,)
        Columns where any constrained point is non-zero.
    weights_ : ndarray (n_bits, z)
        ``sum_i gamma^r_i phi(x_i)`` on ``support_``, one row per bit.
    S_, K0_ : ndarray (c, c)
        Lemma 2's coefficients and the constrained points' input kernel.
    constrained_data_, constrained_indices_, constrained_indptr_ : ndarray
        The constrained points (CSR).

    Examples
    --------
    >>> import numpy as np
    >>> import scipy.sparse as sp
    >>> from hashlearn.hashers import KernelMetricLSH
    >>> rng = np.random.RandomState(0)
    >>> y = rng.randint(0, 2, 40)
    >>> rows, cols = np.repeat(np.arange(40), 10), rng.randint(0, 10**6, 400)  # 10 per row
    >>> X = sp.csr_matrix((rng.rand(400), (rows, cols)), shape=(40, 10**6))
    >>> X = (X + sp.csr_matrix((np.ones(40), (np.arange(40), y)), shape=X.shape)).tocsr()
    >>> h = KernelMetricLSH(n_bits=16, num_constraints=60, random_state=0).fit(X, y)
    >>> h.encode(X[:3]).shape
    (3, 2)
    """

    supervised = True
    accept_sparse = True

    def __init__(
        self,
        n_bits: int = 32,
        slack: float = 1.0,
        num_constraints: int | None = None,
        max_iter: int = 1000,
        random_state=None,
        gamma=DEPRECATED,
    ):
        self.n_bits = n_bits
        self.slack = slack
        self.num_constraints = num_constraints
        self.max_iter = max_iter
        self.random_state = random_state
        self.gamma = gamma

    def _fit(self, X, y, pairs, similar) -> None:
        rng = check_random_state(self.random_state)
        kitml = KernelITML(kernel="linear", max_iter=self.max_iter, **self._learner_params(rng))
        kitml.fit(X, y, pairs=pairs, similar=similar)
        self.metric_ = kitml
        self.n_iter_ = kitml.n_iter_
        Phi = sp.csr_matrix(kitml.constrained_, dtype=np.float64)
        self.seed_ = int(rng.randint(2**31 - 1))
        self.S_, self.K0_ = kitml.S_, kitml.K0_
        self.constrained_data_, self.constrained_indices_, self.constrained_indptr_ = (
            Phi.data,
            Phi.indices.astype(np.int64),
            Phi.indptr.astype(np.int64),
        )
        r_phi = hashed_projection(Phi, self.n_bits, self.seed_)  # (c, b): r^T phi(x_i)
        gammas = self.S_.T @ r_phi  # (c, b)
        self.support_ = np.unique(Phi.indices).astype(np.int64)
        self.weights_ = np.asarray((Phi[:, self.support_].T @ gammas).T)  # (b, z)

    def _phi(self) -> sp.csr_matrix:
        return sp.csr_matrix(
            (self.constrained_data_, self.constrained_indices_, self.constrained_indptr_),
            shape=(len(self.constrained_indptr_) - 1, self.n_features_in_),
        )

    def _project(self, X) -> np.ndarray:
        return hashed_projection(X, self.n_bits, self.seed_, self.support_, self.weights_)

    def hyperplanes(self) -> np.ndarray:
        """The hashed hyperplanes ``r`` (n_bits, n_features), materialised."""
        check_is_fitted(self)
        return hashed_hyperplanes(self.n_bits, self.n_features_in_, self.seed_)

    def metric_factor(self) -> np.ndarray:
        """Dense ``G = I + Phi^T S Phi`` (d x d; only for small d, e.g. to compare with the
        explicit form)."""
        check_is_fitted(self)
        Phi = self._phi().toarray()
        return np.eye(self.n_features_in_) + Phi.T @ self.S_ @ Phi

    def metric_kernel_form(self):
        """``(Phi, U, w)`` with the learned distance (Jain, Kulis & Grauman 2008, eq. 8)
        ``|z|^2 + t^T M t = |z|^2 + sum_j w_j ((Phi z) U)_j^2`` (``z = x - q``, ``Phi`` the c
        constrained points as CSR rows, ``M = S + S^T + S^T K0 S = U diag(w) U^T``): the
        refine stage keeps ``(Phi x) U`` as c side features per vector, so a pair costs
        O(nnz + c) instead of O(nnz + c^2). Computed once per fit (the same tuple object
        until the next fit)."""
        check_is_fitted(self, "S_")
        cached = getattr(self, "_kernel_form", None)
        if cached is None or cached[0] is not self.S_:
            w, U = np.linalg.eigh(self.S_ + self.S_.T + self.S_.T @ self.K0_ @ self.S_)
            cached = self._kernel_form = (self.S_, (self._phi(), U, w))
        return cached[1]

    def metric_distances(self, queries, candidates) -> np.ndarray:
        """Squared learned distances ``|G (c - q)|^2 = |z|^2 + t^T M t`` with ``t = Phi z``,
        ``M = S + S^T + S^T K0 S``: queries (b, d), candidates (b, c, d) -> (b, c)."""
        queries, candidates = self._check_candidates(queries, candidates)
        b, c, d = candidates.shape
        Z = (candidates - queries[:, None, :]).reshape(b * c, d)
        T = np.asarray((self._phi() @ Z.T).T)  # (b c, n_constrained)
        M = self.S_ + self.S_.T + self.S_.T @ self.K0_ @ self.S_
        out = np.einsum("ij,ij->i", Z, Z) + np.einsum("ij,jk,ik->i", T, M, T)
        return out.reshape(b, c)

    def metric_distances_from_differences(self, Z) -> np.ndarray:
        """Squared learned distances ``|z|^2 + t^T M t`` (``t = Phi z``) of the rows of the
        differences ``Z`` (dense or scipy.sparse CSR), ``(rows,)``, without densifying:
        O(nnz(z) + c^2) per row for the c constrained points (``Searcher(rerank="metric")``
        on sparse vectors uses it)."""
        check_is_fitted(self)
        Z = _check_differences(Z, self.n_features_in_)
        Zs = sp.csr_matrix(Z)
        sq = np.asarray(Zs.multiply(Zs).sum(axis=1)).ravel()
        T = np.asarray((Zs @ self._phi().T).todense())  # (rows, c)
        M = self.S_ + self.S_.T + self.S_.T @ self.K0_ @ self.S_
        return sq + np.einsum("ij,jk,ik->i", T, M, T)
