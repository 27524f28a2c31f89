"""Minimal loss hashing, MLH (Norouzi & Fleet, ICML 2011; minimal-loss-hashing.txt).

MLH learns a linear threshold hash :math:`b(x; W) = \\operatorname{thr}(W x)` (eq. 1; one bit
per row of :math:`W`, an optional offset through a constant input) that minimises a
pairwise loss on Hamming distances. The loss advocated by the paper is the hinge-like

.. math::

    \\ell_\\rho(m, s) = \\begin{cases} \\max(m - \\rho + 1, 0) & s = 1 \\\\
                                     \\lambda \\max(\\rho - m + 1, 0) & s = 0 \\end{cases}
    \\qquad (4)

with :math:`m = \\|h - g\\|_H`: similar pairs should be within :math:`\\rho` bits, dissimilar
pairs further than :math:`\\rho`. BRE's loss :math:`\\ell_{bre}(m, d) = (m / q - d / 2)^2`
(eq. 2) fits the same framework (``loss="bre"``).

The empirical loss is discontinuous, so MLH minimises the structural-SVM-style upper bound

.. math::

    \\max_{g_i, g_j} [\\epsilon \\ell(\\|g_i - g_j\\|_H, s_{ij}) + g_i^T W x_i + g_j^T W x_j]
    - \\max_{h_i} h_i^T W x_i - \\max_{h_j} h_j^T W x_j \\qquad (10, 11)

The first max, *loss-adjusted inference* (eq. 12), is solved exactly in
:math:`O(q \\log q)` (§4.1): with :math:`\\Delta_k` the gain of setting bit :math:`k` of the
two codes different rather than equal, the best codes at distance :math:`m` flip the
:math:`m` largest :math:`\\Delta_k`; one sort serves all :math:`m`, and the best :math:`m` wins.
Learning is the perceptron-like rule (eq. 14),
:math:`W \\leftarrow W + \\eta [\\psi(x, b(x)) + \\psi(x', b(x')) - \\psi(x, \\tilde b) -
\\psi(x', \\tilde b')]` with :math:`\\psi(x, h) = h x^T`, over mini-batches with momentum 0.9,
rows of :math:`W` renormalised to unit length after each step, :math:`W` initialised by LSH
(§5), and ``pairs_per_epoch`` pairs sampled afresh each epoch.

Codes are :math:`h \\in \\{0, 1\\}^q` as in the paper (§4.1's :math:`\\zeta_k(1, 0)` etc.).
"""

from __future__ import annotations

import numba
import numpy as np
from sklearn.utils import check_random_state

from hashlearn._validation import check_int, check_real
from hashlearn.hashers.base import BaseHasher, register_hasher
from hashlearn.io import persistable
from hashlearn.supervision import pairs_from_labels

__all__ = [
    "MinimalLossHashing",
    "loss_adjusted_inference",
    "hinge_loss",
    "bre_loss",
    "select_mlh_hyperparameters",
]

_HINGE, _BRE = 0, 1
_LOSSES = {"hinge": _HINGE, "bre": _BRE}


# ----------------------------------------------------------------------------- kernels


@numba.njit(cache=True, nogil=True)
def _pair_loss(m, target, kind, rho, lam, q):
    """``l_rho(m, s)`` (eq. 4; ``target`` = s in {0, 1}) or ``l_bre`` (eq. 2; target = d / 2)."""
    if kind == 0:
        if target > 0.5:
            return max(m - rho + 1.0, 0.0)
        return lam * max(rho - m + 1.0, 0.0)
    r = m / q - target
    return r * r


@numba.njit(cache=True, nogil=True)
def _infer_pair(a, c, target, kind, rho, lam, eps, gi, gj, delta, order_buf):
    """Exact loss-adjusted inference (eq. 12, §4.1) for one pair with scores ``a = W x_i``,
    ``c = W x_j``. Writes the codes into ``gi``, ``gj`` and returns ``(m, objective)`` where
    objective = eps * loss(m) + gi.a + gj.c. Ties between distances go to the smaller m."""
    q = a.shape[0]
    base = 0.0
    for k in range(q):
        same = a[k] + c[k]
        if same < 0.0:
            same = 0.0
        diff = a[k] if a[k] >= c[k] else c[k]
        base += same
        delta[k] = diff - same
    order = np.argsort(-delta)
    best_m = 0
    best = eps * _pair_loss(0.0, target, kind, rho, lam, q)
    run = 0.0
    for m in range(1, q + 1):
        run += delta[order[m - 1]]
        val = run + eps * _pair_loss(float(m), target, kind, rho, lam, q)
        if val > best:
            best = val
            best_m = m
    for k in range(q):
        order_buf[k] = 0
    for t in range(best_m):
        order_buf[order[t]] = 1
    for k in range(q):
        if order_buf[k]:  # bits differ: (1, 0) if zeta(1,0) = a >= zeta(0,1) = c
            if a[k] >= c[k]:
                gi[k] = 1.0
                gj[k] = 0.0
            else:
                gi[k] = 0.0
                gj[k] = 1.0
        else:  # bits equal: (1, 1) if a + c >= 0 = zeta(0, 0)
            v = 1.0 if a[k] + c[k] >= 0.0 else 0.0
            gi[k] = v
            gj[k] = v
    return best_m, best + base


@numba.njit(cache=True, nogil=True)
def _infer_batch(A, C, targets, kind, rho, lam, eps, Gi, Gj, M, V):
    q = A.shape[1]
    delta = np.empty(q)
    buf = np.empty(q, np.int8)
    for p in range(A.shape[0]):
        m, v = _infer_pair(A[p], C[p], targets[p], kind, rho, lam, eps, Gi[p], Gj[p], delta, buf)
        M[p] = m
        V[p] = v


@numba.njit(cache=True, nogil=True, fastmath=True)
def _project_point(W, x, out):
    q, d = W.shape
    for k in range(q):
        s = 0.0
        for t in range(d):
            s += W[k, t] * x[t]
        out[k] = s


@numba.njit(cache=True, nogil=True)
def _objective(W, X, pairs, targets, kind, rho, lam, eps):
    """Mean empirical loss (eq. 3) and mean upper bound (eq. 11, divided by eps so it bounds
    the loss itself) over ``pairs``."""
    q = W.shape[0]
    a = np.empty(q)
    c = np.empty(q)
    gi = np.empty(q)
    gj = np.empty(q)
    delta = np.empty(q)
    buf = np.empty(q, np.int8)
    total_loss = 0.0
    total_bound = 0.0
    for p in range(pairs.shape[0]):
        _project_point(W, X[pairs[p, 0]], a)
        _project_point(W, X[pairs[p, 1]], c)
        m_b = 0
        score_b = 0.0
        for k in range(q):
            bi = a[k] >= 0.0
            bj = c[k] >= 0.0
            if bi != bj:
                m_b += 1
            if bi:
                score_b += a[k]
            if bj:
                score_b += c[k]
        _, best = _infer_pair(a, c, targets[p], kind, rho, lam, eps, gi, gj, delta, buf)
        total_loss += _pair_loss(float(m_b), targets[p], kind, rho, lam, q)
        total_bound += (best - score_b) / eps
    n = max(pairs.shape[0], 1)
    return total_loss / n, total_bound / n


@numba.njit(cache=True, nogil=True)
def _train_epoch(
    W, velocity, X, pairs, targets, kind, rho, lam, eps, learning_rate, momentum, batch_size
):
    """One pass of the perceptron-like rule (eq. 14) over ``pairs`` in mini-batches, with
    momentum and unit-length rows of ``W`` (§5). Updates ``W`` and ``velocity`` in place."""
    q, d = W.shape
    a = np.empty(q)
    c = np.empty(q)
    gi = np.empty(q)
    gj = np.empty(q)
    delta = np.empty(q)
    buf = np.empty(q, np.int8)
    grad = np.zeros((q, d))
    n_pairs = pairs.shape[0]
    for start in range(0, n_pairs, batch_size):
        stop = min(start + batch_size, n_pairs)
        grad[:, :] = 0.0
        for p in range(start, stop):
            xi = X[pairs[p, 0]]
            xj = X[pairs[p, 1]]
            _project_point(W, xi, a)
            _project_point(W, xj, c)
            _infer_pair(a, c, targets[p], kind, rho, lam, eps, gi, gj, delta, buf)
            for k in range(q):
                # gradient of (15): psi(x, g~) - psi(x, b)
                ui = gi[k] - (1.0 if a[k] >= 0.0 else 0.0)
                uj = gj[k] - (1.0 if c[k] >= 0.0 else 0.0)
                if ui != 0.0:
                    for t in range(d):
                        grad[k, t] += ui * xi[t]
                if uj != 0.0:
                    for t in range(d):
                        grad[k, t] += uj * xj[t]
        scale = 1.0 / (stop - start)
        for k in range(q):
            norm = 0.0
            for t in range(d):
                velocity[k, t] = momentum * velocity[k, t] + grad[k, t] * scale
                W[k, t] -= learning_rate * velocity[k, t]
                norm += W[k, t] * W[k, t]
            norm = np.sqrt(norm)
            if norm > 0.0:
                for t in range(d):
                    W[k, t] /= norm


# ------------------------------------------------------------------------- public helpers


def hinge_loss(m, similar, rho: float, lam: float) -> np.ndarray:
    """The hinge-like loss :math:`\\ell_\\rho(m, s)` of eq. (4), elementwise."""
    m = np.asarray(m, dtype=np.float64)
    s = np.asarray(similar, dtype=bool)
    return np.where(s, np.maximum(m - rho + 1.0, 0.0), lam * np.maximum(rho - m + 1.0, 0.0))


def bre_loss(m, target, n_bits: int) -> np.ndarray:
    """BRE's loss :math:`(m / q - d / 2)^2` of eq. (2); ``target`` is :math:`d / 2 \\in [0, 1]`."""
    return (np.asarray(m, dtype=np.float64) / n_bits - np.asarray(target, dtype=np.float64)) ** 2


def loss_adjusted_inference(
    scores_i,
    scores_j,
    target,
    *,
    loss: str = "hinge",
    rho: float = 3.0,
    lam: float = 0.5,
    epsilon: float = 1.0,
):
    """Exact loss-adjusted inference (eq. 12) in :math:`O(q \\log q)` per pair (§4.1).

    ``scores_i``, ``scores_j``: ``(n, q)`` or ``(q,)`` arrays of :math:`W x_i`, :math:`W x_j`;
    ``target``: the similarity label :math:`s` (hinge loss) or :math:`d / 2` (BRE loss), one per
    pair. Returns ``(g_i, g_j, m, value)``: codes in {0, 1} (uint8), their Hamming distance
    and the maximised objective :math:`\\epsilon\\,\\ell(m) + g_i^T W x_i + g_j^T W x_j`.
    """
    if loss not in _LOSSES:
        raise ValueError(
            f"The 'loss' parameter of loss_adjusted_inference must be one of "
            f"{sorted(_LOSSES)}. Got {loss!r} instead."
        )
    A = np.atleast_2d(np.asarray(scores_i, dtype=np.float64))
    C = np.atleast_2d(np.asarray(scores_j, dtype=np.float64))
    if A.shape != C.shape:
        raise ValueError(
            f"scores_i and scores_j must have the same shape. Got {A.shape} and {C.shape}."
        )
    t = np.broadcast_to(np.asarray(target, dtype=np.float64), (A.shape[0],)).copy()
    Gi = np.empty_like(A)
    Gj = np.empty_like(A)
    M = np.empty(A.shape[0], np.int64)
    V = np.empty(A.shape[0])
    _infer_batch(
        np.ascontiguousarray(A),
        np.ascontiguousarray(C),
        t,
        _LOSSES[loss],
        float(rho),
        float(lam),
        float(epsilon),
        Gi,
        Gj,
        M,
        V,
    )
    out = Gi.astype(np.uint8), Gj.astype(np.uint8), M, V
    if np.ndim(scores_i) == 1:
        return out[0][0], out[1][0], int(out[2][0]), float(out[3][0])
    return out


def _bre_targets(X, P, scale):
    """BRE targets in [0, 1]: Kulis & Darrell's squared distance divided by ``scale``, the
    largest squared distance among random training pairs (clipped at 1)."""
    diff = X[P[:, 0]] - X[P[:, 1]]
    return np.minimum(np.einsum("ij,ij->i", diff, diff) / scale, 1.0)


def _bre_scale(X, rng) -> float:
    a = rng.randint(len(X), size=10000)
    b = rng.randint(len(X), size=10000)
    diff = X[a] - X[b]
    return float(np.einsum("ij,ij->i", diff, diff).max()) or 1.0


# ----------------------------------------------------------------------------- estimator


@persistable
@register_hasher("mlh")
class MinimalLossHashing(BaseHasher):
    """Minimal loss hashing (Norouzi & Fleet 2011): a linear threshold hash learned by
    minimising the upper bound (eq. 11) on the hinge-like loss (eq. 4) with the
    perceptron-like rule (eq. 14).

    Parameters
    ----------
    n_bits : int, default=32
        Code length q.
    rho : float or None, default=None
        Hamming threshold of eq. (4), in ``[0, n_bits]``. ``None`` uses ``max(1, n_bits / 8)``
        (the paper lets rho grow linearly with the code length).
    lam : float, default=0.5
        Slope ratio lambda of eq. (4) for dissimilar pairs, ``>= 0``.
    epsilon : float, default=0.1
        Scale of the loss in loss-adjusted inference (§5), ``> 0``.
    learning_rate : float, default=0.05
    momentum : float, default=0.9
    batch_size : int, default=100
        Pairs per mini-batch.
    n_epochs : int, default=10
        The paper uses 100 for validation and 2000 for training on large sets.
    pairs_per_epoch : int, default=100_000
        Pairs sampled afresh in every epoch (§5).
    loss : {"hinge", "bre"}, default="hinge"
        ``"bre"`` minimises the BRE loss :math:`(m/q - t_{ij})^2` (eq. 2) in the same
        framework (BRE2 of §6.2). As in Kulis & Darrell's BRE, the target is the squared
        distance scaled to [0, 1], :math:`t_{ij} = \\|x_i - x_j\\|^2 / s` with ``s`` the largest
        squared distance among 10 000 random training pairs (``bre_scale_``; eq. 2 as printed
        uses half the unsquared distance of unit vectors, which asks neighbours to sit a
        quarter of the bits apart and did much worse here); supervision only decides which
        pairs are sampled. The loss lies in [0, 1], so ``epsilon`` of the order of ``n_bits``
        balances it against the scores.
    fit_offset : bool, default=True
        Append a constant input so each bit has an offset (footnote 1).
    monitor_pairs : int, default=5000
        Size of a fixed sample of training pairs on which the empirical loss and the bound are
        recorded after every epoch (``loss_history_``, ``bound_history_``); 0 disables it.
    random_state : int, RandomState or None

    Attributes
    ----------
    components_ : ndarray (n_bits, n_features)
    offset_ : ndarray (n_bits,)
        Bits are ``components_ @ x + offset_ >= 0``.
    rho_ : float
    bre_scale_ : float
        Squared-distance scale of the BRE targets (1 for the hinge loss).
    loss_history_, bound_history_ : ndarray (n_epochs + 1,)
        Mean loss (eq. 3) and mean bound (eq. 11 / epsilon) on the monitor pairs, before
        training and after every epoch.
    """

    supervised = True

    def __init__(
        self,
        n_bits: int = 32,
        rho=None,
        lam: float = 0.5,
        epsilon: float = 0.1,
        learning_rate: float = 0.05,
        momentum: float = 0.9,
        batch_size: int = 100,
        n_epochs: int = 10,
        pairs_per_epoch: int = 100_000,
        loss: str = "hinge",
        fit_offset: bool = True,
        monitor_pairs: int = 5000,
        random_state=None,
    ):
        self.n_bits = n_bits
        self.rho = rho
        self.lam = lam
        self.epsilon = epsilon
        self.learning_rate = learning_rate
        self.momentum = momentum
        self.batch_size = batch_size
        self.n_epochs = n_epochs
        self.pairs_per_epoch = pairs_per_epoch
        self.loss = loss
        self.fit_offset = fit_offset
        self.monitor_pairs = monitor_pairs
        self.random_state = random_state

    def _check_params(self) -> dict:
        owner = type(self).__name__
        q = self.n_bits
        if self.loss not in _LOSSES:
            raise ValueError(
                f"The 'loss' parameter of {owner} must be one of "
                f"{sorted(_LOSSES)}. Got {self.loss!r} instead."
            )
        rho = (
            max(1.0, q / 8.0)
            if self.rho is None
            else check_real(self.rho, "rho", owner, low=0.0, high=float(q))
        )
        return dict(
            rho=float(rho),
            lam=check_real(self.lam, "lam", owner, low=0.0),
            eps=check_real(self.epsilon, "epsilon", owner, low=0.0, low_open=True),
            lr=check_real(self.learning_rate, "learning_rate", owner, low=0.0, low_open=True),
            momentum=check_real(self.momentum, "momentum", owner, low=0.0, high=1.0),
            batch_size=check_int(self.batch_size, "batch_size", owner),
            n_epochs=check_int(self.n_epochs, "n_epochs", owner, low=0),
            pairs_per_epoch=check_int(self.pairs_per_epoch, "pairs_per_epoch", owner),
            monitor_pairs=check_int(self.monitor_pairs, "monitor_pairs", owner, low=0),
            kind=_LOSSES[self.loss],
        )

    def _fit(self, X, y, pairs, similar) -> None:
        p = self._check_params()
        owner = type(self).__name__
        rng = check_random_state(self.random_state)
        X = np.asarray(X, dtype=np.float64)
        n, d = X.shape
        if n < 2:
            raise ValueError(f"{owner} needs at least 2 training points; got {n}.")
        Xa = np.hstack([X, np.ones((n, 1))]) if self.fit_offset else np.ascontiguousarray(X)
        if y is not None:
            # validates labels (two classes, one per row) once, before training
            pairs_from_labels(y, 1, random_state=0, owner=owner)
        bre_scale = _bre_scale(X, rng) if p["kind"] == _BRE else 1.0

        def sample(n_pairs):
            if y is not None:
                P, s = pairs_from_labels(y, n_pairs, random_state=rng, owner=owner)
            else:
                idx = rng.randint(len(pairs), size=n_pairs)
                P, s = pairs[idx], similar[idx]
            if p["kind"] == _BRE:
                t = _bre_targets(X, P, bre_scale)
            else:
                t = s.astype(np.float64)
            return np.ascontiguousarray(P), np.minimum(t, 1.0)

        if pairs is not None and len(pairs) == 0:
            raise ValueError(f"pairs passed to {owner} is empty.")
        # LSH initialisation (§5): N(0, 1) entries, unit rows
        W = rng.standard_normal((self.n_bits, Xa.shape[1]))
        if self.fit_offset:
            W[:, -1] = 0.0
        W /= np.linalg.norm(W, axis=1, keepdims=True)
        velocity = np.zeros_like(W)
        args = (_LOSSES[self.loss], p["rho"], p["lam"], p["eps"])
        losses, bounds = [], []
        monitor = sample(p["monitor_pairs"]) if p["monitor_pairs"] else None

        def record():
            if monitor is not None:
                lo, bo = _objective(W, Xa, monitor[0], monitor[1], *args)
                losses.append(lo)
                bounds.append(bo)

        record()
        for _ in range(p["n_epochs"]):
            P, t = sample(p["pairs_per_epoch"])
            _train_epoch(W, velocity, Xa, P, t, *args, p["lr"], p["momentum"], p["batch_size"])
            record()
        self.rho_ = p["rho"]
        self.bre_scale_ = bre_scale
        self.components_ = W[:, :d].copy()
        self.offset_ = W[:, d].copy() if self.fit_offset else np.zeros(self.n_bits)
        self.loss_history_ = np.asarray(losses, dtype=np.float64)
        self.bound_history_ = np.asarray(bounds, dtype=np.float64)

    def _project(self, X) -> np.ndarray:
        return X @ self.components_.T + self.offset_

    def objective(self, X, y=None, *, pairs=None, similar=None, n_pairs: int = 10_000):
        """Mean empirical loss (eq. 3) and mean upper bound (eq. 11 / epsilon) of the fitted
        hash on supervision pairs over ``X`` (``n_pairs`` sampled from labels ``y``)."""
        from hashlearn.supervision import resolve_pairs

        p = self._check_params()
        X = self._check_X(X, reset=False).astype(np.float64)
        P, s = resolve_pairs(
            X, y, pairs, similar, n_pairs=n_pairs, owner=type(self).__name__, random_state=0
        )
        Xa = np.hstack([X, np.ones((len(X), 1))])
        W = np.hstack([self.components_, self.offset_[:, None]])
        if p["kind"] == _BRE:
            t = _bre_targets(X, P, self.bre_scale_)
        else:
            t = s.astype(np.float64)
        return _objective(W, Xa, P, t, p["kind"], p["rho"], p["lam"], p["eps"])


# ------------------------------------------------------------------ hyper-parameter search


def _pair_average_precision(distances: np.ndarray, similar: np.ndarray) -> float:
    """Average precision of ranking pairs by Hamming distance (ties share their precision)."""
    from sklearn.metrics import average_precision_score

    if similar.all() or not similar.any():
        return float("nan")
    return float(average_precision_score(similar, -distances.astype(np.float64)))


def select_mlh_hyperparameters(
    X,
    y=None,
    *,
    pairs=None,
    similar=None,
    n_bits: int = 32,
    rho_values=None,
    lam_values=(0.2, 0.5, 1.0),
    epsilon_values=(0.03, 0.1, 0.3),
    validation_fraction=0.1,
    n_epochs: int = 10,
    score="average_precision",
    random_state=None,
    **mlh_params,
):
    """Choose rho, lambda and epsilon of :class:`MinimalLossHashing` on a held-out set (§5).

    ``validation_fraction`` of the rows of ``X`` are held out; MLH is trained on pairs among
    the remaining rows for each grid point, and scored by the average precision of ranking
    held-out pairs (each with at least one held-out row) by Hamming distance, or with
    ``score=R`` (an int) by the precision within Hamming radius ``R`` (the quantity of
    Fig. 2) averaged over held-out rows, a row retrieving nothing scoring 0. Returns
    ``(best_params: dict, table: list[dict])``. ``rho_values`` defaults to ``q/16, q/8, q/4``
    (at least 1).
    """
    from sklearn.utils.validation import check_array

    from hashlearn.codes import hamming_distance
    from hashlearn.supervision import check_pairs

    owner = "select_mlh_hyperparameters"
    X = check_array(X, dtype=np.float64)
    if score != "average_precision":
        score = check_int(score, "score", owner, low=0)
    n = X.shape[0]
    n_bits = check_int(n_bits, "n_bits", owner)
    check_real(validation_fraction, "validation_fraction", owner, low=0.0, high=1.0, low_open=True)
    rng = check_random_state(random_state)
    n_val = max(1, int(round(validation_fraction * n)))
    if n - n_val < 2:
        raise ValueError(f"{owner}: too few rows ({n}) to hold out {n_val} for validation.")
    held = np.zeros(n, bool)
    held[rng.choice(n, n_val, replace=False)] = True
    if pairs is not None:
        if y is not None:
            raise ValueError(f"{owner} takes labels y or pairs=..., not both.")
        P, s = check_pairs(pairs, similar, n, owner)
        train_mask = ~held[P[:, 0]] & ~held[P[:, 1]]
        val_P, val_s = P[~train_mask], s[~train_mask]
        val_row = np.where(held[val_P[:, 0]], val_P[:, 0], val_P[:, 1])
        train_rows = np.flatnonzero(~held)
        remap = np.full(n, -1, np.int64)
        remap[train_rows] = np.arange(len(train_rows))
        fit_kw = dict(pairs=remap[P[train_mask]], similar=s[train_mask])
    elif y is not None:
        y = np.asarray(y)
        if y.shape != (n,):
            raise ValueError(f"y passed to {owner} must have shape ({n},). Got {y.shape}.")
        train_rows = np.flatnonzero(~held)
        val_rows = np.flatnonzero(held)
        a = val_rows[rng.randint(len(val_rows), size=20000)]
        b = train_rows[rng.randint(len(train_rows), size=20000)]
        val_P, val_s = np.stack([a, b], 1), y[a] == y[b]
        val_row = a
        fit_kw = dict(y=y[train_rows])
    else:
        raise ValueError(f"{owner} needs labels y or pairs=..., similar=...")
    if rho_values is None:
        rho_values = sorted({max(1.0, n_bits / f) for f in (16.0, 8.0, 4.0)})
    table = []
    for rho in rho_values:
        for lam in lam_values:
            for eps in epsilon_values:
                h = MinimalLossHashing(
                    n_bits=n_bits,
                    rho=rho,
                    lam=lam,
                    epsilon=eps,
                    n_epochs=n_epochs,
                    monitor_pairs=0,
                    random_state=rng.randint(2**31 - 1),
                    **mlh_params,
                )
                h.fit(X[train_rows], **fit_kw)
                codes = h.encode(X)
                dist = hamming_distance(codes[val_P[:, 0]], codes[val_P[:, 1]])
                dist = np.asarray(dist)
                if score == "average_precision":
                    value = _pair_average_precision(dist, val_s)
                else:  # per held-out row: precision within radius, 0 when empty
                    inside = dist <= score
                    hits = np.bincount(val_row, weights=inside & val_s, minlength=n)
                    got = np.bincount(val_row, weights=inside, minlength=n)
                    rows_seen = np.unique(val_row)
                    prec = np.where(
                        got[rows_seen] > 0, hits[rows_seen] / np.maximum(got[rows_seen], 1), 0.0
                    )
                    value = float(prec.mean())
                table.append(dict(rho=float(rho), lam=float(lam), epsilon=float(eps), score=value))
    scored = [r for r in table if np.isfinite(r["score"])]
    if not scored:
        raise ValueError(
            f"{owner}: the held-out pairs are all similar or all dissimilar; cannot score."
        )
    best = max(scored, key=lambda r: r["score"])
    return {k: best[k] for k in ("rho", "lam", "epsilon")}, table
