"""Semantic hashing with stacked RBMs fine-tuned by NCA (Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §3.3.2).

A deep encoder maps an input to ``n_bits`` logistic units whose thresholded states are the
code (Salakhutdinov & Hinton's semantic hashing, as applied to Gist by Torralba et al.).
Training has two stages:

1. **Greedy pre-training.** A stack of restricted Boltzmann machines, each trained with
   one-step contrastive divergence (CD-1) on the activation probabilities of the layer below
   (eqs. 16-18). The first RBM has Gaussian visible units (unit variance, on standardised
   inputs: footnote 7), the others binary visible units; all hidden units are binary
   logistic, :math:`p(h_j = 1 | v) = \\sigma(b_j + \\sum_i w_{ij} v_i)` (eq. 18).
2. **Fine-tuning.** The units are made deterministic, :math:`f(x|W)` the top-layer
   probabilities, and the weights are moved by back-propagation to maximise the NCA
   objective

   .. math::

       O_{NCA} = \\sum_n \\sum_{l : c^n = c^l} p_{nl}, \\qquad
       p_{nl} = \\frac{e^{-\\|f(x^n) - f(x^l)\\|^2}}{\\sum_{m \\ne n} e^{-\\|f(x^n) - f(x^m)\\|^2}},

   evaluated on random mini-batches (Adam steps instead of the paper's conjugate gradient).
   "Same class" comes from labels ``y``; from ``pairs``/``similar`` (listed similar pairs);
   or, with neither, from Euclidean neighbours (the ``n_neighbors`` nearest items within a
   batch), the unsupervised variant of survey Fig. 13.

Bit ``l`` is ``[f_l(x) >= 1/2]``, i.e. the top-layer pre-activation ``>= 0`` (:meth:`project`).
Plain numpy; no torch needed.
"""

from __future__ import annotations

import numpy as np
import scipy.sparse as sp
from scipy.special import expit
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from hashlearn._utils.validation import check_int, check_real
from hashlearn.hashers.base import BaseHasher, estimator_state, register_hasher
from hashlearn.io import estimator_from_state, persistable
from hashlearn.kernels import log_message
from hashlearn.supervision import squared_distances

__all__ = ["RBMHashing"]


def _cd1_layer(
    data: np.ndarray,
    n_hidden: int,
    *,
    gaussian: bool,
    epochs: int,
    lr: float,
    batch_size: int,
    weight_decay: float,
    rng: np.random.RandomState,
) -> tuple[np.ndarray, np.ndarray]:
    """Train one RBM with CD-1 (eq. 18 sampling); returns ``(W (v, h), hidden bias (h,))``."""
    n, n_visible = data.shape
    W = 0.01 * rng.standard_normal((n_visible, n_hidden))
    b_hid = np.zeros(n_hidden)
    b_vis = (
        np.zeros(n_visible)
        if gaussian
        else np.log(
            np.clip(data.mean(0), 1e-3, 1 - 1e-3) / (1 - np.clip(data.mean(0), 1e-3, 1 - 1e-3))
        )
    )
    vel_W = np.zeros_like(W)
    vel_h = np.zeros_like(b_hid)
    vel_v = np.zeros_like(b_vis)
    for epoch in range(epochs):
        momentum = 0.5 if epoch < 2 else 0.9
        order = rng.permutation(n)
        for start in range(0, n, batch_size):
            v0 = data[order[start : start + batch_size]]
            m = len(v0)
            ph0 = expit(v0 @ W + b_hid)
            h0 = (rng.random_sample(ph0.shape) < ph0).astype(np.float64)
            if gaussian:  # mean of the Gaussian visible units (unit variance)
                v1 = h0 @ W.T + b_vis
            else:
                v1 = expit(h0 @ W.T + b_vis)
            ph1 = expit(v1 @ W + b_hid)
            grad_W = (v0.T @ ph0 - v1.T @ ph1) / m - weight_decay * W
            vel_W = momentum * vel_W + lr * grad_W
            vel_h = momentum * vel_h + lr * (ph0 - ph1).mean(0)
            vel_v = momentum * vel_v + lr * (v0 - v1).mean(0)
            W += vel_W
            b_hid += vel_h
            b_vis += vel_v
    return W, b_hid


@persistable
@register_hasher("rbm")
class RBMHashing(BaseHasher):
    """Stacked RBMs (Gaussian first layer) + NCA fine-tuning, thresholded (survey §3.3.2).

    Parameters
    ----------
    n_bits : int
        Units of the top (code) layer.
    hidden_layers : tuple of int, default=(256,)
        Sizes of the hidden layers between the input and the code layer.
    pretrain_epochs : int, default=5
        CD-1 epochs per RBM.
    finetune_epochs : int, default=30
        Passes of NCA fine-tuning (each pass: ``n_samples / batch_size`` mini-batches).
    batch_size : int, default=256
        NCA mini-batch (the softmax of eq. NCA runs over a batch).
    pretrain_lr, finetune_lr : float
        CD-1 learning rate (the Gaussian layer uses a tenth) and Adam step size.
    n_neighbors : int, default=10
        Neighbours per item within a batch for the unsupervised (Euclidean) target.
    pretrain_batch_size : int, default=100
        CD-1 mini-batch of the pre-training (Hinton's practical guide uses 10-100).
    weight_decay : float, default=2e-4
        L2 weight decay of the CD-1 updates (Hinton's guide: 1e-2 to 1e-5).
    random_state : int, RandomState or None
    verbose : bool, default=False
        Log each layer and each fine-tuning epoch (NCA objective) at INFO level to the
        ``"hashlearn"`` logger, and make sure they are shown.

    Attributes
    ----------
    mean_, scale_ : ndarray (d,)
        Input standardisation (Gaussian visible units have unit variance).
    n_layers_ : int
    coef{i}_, intercept{i}_ : ndarray
        Weights ``(in, out)`` and biases of layer ``i`` after fine-tuning.
    nca_objective_ : ndarray (finetune_epochs,)
        Mean NCA objective per item (probability mass on same-class items) per epoch.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.hashers import RBMHashing
    >>> X = np.random.RandomState(0).randn(64, 5)
    >>> h = RBMHashing(n_bits=8, hidden_layers=(16,), pretrain_epochs=1, finetune_epochs=2,
    ...                random_state=0).fit(X)
    >>> h.encode(X[:3]).shape
    (3, 1)
    >>> h.n_layers_, h.coef0_.shape, h.coef1_.shape
    (2, (5, 16), (16, 8))
    """

    def __init__(
        self,
        n_bits: int = 32,
        hidden_layers=(256,),
        pretrain_epochs: int = 5,
        finetune_epochs: int = 30,
        batch_size: int = 256,
        pretrain_lr: float = 0.05,
        finetune_lr: float = 0.01,
        n_neighbors: int = 10,
        pretrain_batch_size: int = 100,
        weight_decay: float = 2e-4,
        random_state=None,
        verbose: bool = False,
    ):
        self.n_bits = n_bits
        self.hidden_layers = hidden_layers
        self.pretrain_epochs = pretrain_epochs
        self.finetune_epochs = finetune_epochs
        self.batch_size = batch_size
        self.pretrain_lr = pretrain_lr
        self.finetune_lr = finetune_lr
        self.n_neighbors = n_neighbors
        self.pretrain_batch_size = pretrain_batch_size
        self.weight_decay = weight_decay
        self.random_state = random_state
        self.verbose = verbose

    # --------------------------------------------------------------------------- network

    def _layers(self) -> list[tuple[np.ndarray, np.ndarray]]:
        return [
            (getattr(self, f"coef{i}_"), getattr(self, f"intercept{i}_"))
            for i in range(self.n_layers_)
        ]

    def _forward(self, Z: np.ndarray, layers) -> list[np.ndarray]:
        acts = [Z]
        for W, b in layers:
            acts.append(expit(acts[-1] @ W + b))
        return acts

    def _project(self, X) -> np.ndarray:
        Z = (np.asarray(X, dtype=np.float64) - self.mean_) / self.scale_
        layers = self._layers()
        acts = self._forward(Z, layers[:-1])
        W, b = layers[-1]
        return acts[-1] @ W + b

    # --------------------------------------------------------------------------- fitting

    def _check_params(self) -> tuple[int, ...]:
        owner = type(self).__name__
        hidden = self.hidden_layers
        if isinstance(hidden, (int, np.integer)):
            hidden = (int(hidden),)
        if not isinstance(hidden, (tuple, list)):
            raise ValueError(
                f"The 'hidden_layers' parameter of {owner} must be a tuple of ints. "
                f"Got {hidden!r} instead."
            )
        hidden = tuple(check_int(h, "hidden_layers", owner) for h in hidden)
        for name in ("pretrain_epochs", "finetune_epochs"):
            check_int(getattr(self, name), name, owner, low=0)
        check_int(self.batch_size, "batch_size", owner, low=2)
        check_int(self.n_neighbors, "n_neighbors", owner)
        check_int(self.pretrain_batch_size, "pretrain_batch_size", owner)
        check_real(self.weight_decay, "weight_decay", owner, low=0)
        check_real(self.pretrain_lr, "pretrain_lr", owner, low=0, low_open=True)
        check_real(self.finetune_lr, "finetune_lr", owner, low=0, low_open=True)
        return hidden

    def _fit(self, X, y, pairs, similar) -> None:
        hidden = self._check_params()
        rng = check_random_state(self.random_state)
        X = np.asarray(X, dtype=np.float64)
        self.mean_ = X.mean(axis=0)
        scale = X.std(axis=0)
        self.scale_ = np.where(scale > 1e-8 * max(scale.max(), 1e-300), scale, 1.0)
        Z = (X - self.mean_) / self.scale_
        layers = self._pretrain(Z, (*hidden, self.n_bits), rng)
        objective = self._finetune(Z, y, pairs, similar, layers, rng)
        self.n_layers_ = len(layers)
        for i, (W, b) in enumerate(layers):
            setattr(self, f"coef{i}_", W)
            setattr(self, f"intercept{i}_", b)
        self.nca_objective_ = objective

    def _pretrain(self, Z, sizes, rng) -> list[tuple[np.ndarray, np.ndarray]]:
        """Greedy layer-wise pre-training with CD-1 (eqs. 16-18): ``(W, b)`` per layer."""
        data = Z
        layers = []
        for i, size in enumerate(sizes):
            gaussian = i == 0
            W, b = _cd1_layer(
                data,
                size,
                gaussian=gaussian,
                epochs=self.pretrain_epochs,
                lr=self.pretrain_lr * (0.1 if gaussian else 1.0),
                batch_size=self.pretrain_batch_size,
                weight_decay=self.weight_decay,
                rng=rng,
            )
            layers.append((W, b))
            log_message(
                self.verbose,
                "RBMHashing: pre-trained layer %d (%d -> %d units, CD-1, %d epochs)",
                i + 1,
                data.shape[1],
                size,
                self.pretrain_epochs,
            )
            data = expit(data @ W + b)
        return layers

    def _finetune(self, Z, y, pairs, similar, layers, rng) -> np.ndarray:
        """NCA fine-tuning of ``layers`` in place (Adam ascent on O_NCA over mini-batches of
        the labelled, paired or all rows); returns the objective per epoch."""
        n = Z.shape[0]
        similar_matrix = None
        if pairs is not None:
            sim_pairs = pairs[similar]
            similar_matrix = sp.coo_matrix(
                (
                    np.ones(2 * len(sim_pairs)),
                    (
                        np.r_[sim_pairs[:, 0], sim_pairs[:, 1]],
                        np.r_[sim_pairs[:, 1], sim_pairs[:, 0]],
                    ),
                ),
                shape=(n, n),
            ).tocsr()
            pool = np.unique(pairs.ravel())
        else:
            pool = np.arange(n)
        params = [p for layer in layers for p in layer]
        adam_m = [np.zeros_like(p) for p in params]
        adam_v = [np.zeros_like(p) for p in params]
        step = 0
        batch = min(self.batch_size, len(pool))
        objective = np.zeros(self.finetune_epochs)
        for epoch in range(self.finetune_epochs):
            order = rng.permutation(pool)
            total, count = 0.0, 0
            for start in range(0, max(len(order) - batch + 1, 1), batch):
                idx = order[start : start + batch]
                if len(idx) < 2:
                    continue
                target = self._targets(idx, Z, y, similar_matrix)
                grads, value = self._nca_gradients(Z[idx], target, layers)
                total += value
                count += len(idx)
                step += 1
                flat = [g for pair in grads for g in pair]
                for j, (p, g) in enumerate(zip(params, flat, strict=True)):
                    adam_m[j] = 0.9 * adam_m[j] + 0.1 * g
                    adam_v[j] = 0.999 * adam_v[j] + 0.001 * g * g
                    m_hat = adam_m[j] / (1 - 0.9**step)
                    v_hat = adam_v[j] / (1 - 0.999**step)
                    p += self.finetune_lr * m_hat / (np.sqrt(v_hat) + 1e-8)  # ascent on O_NCA
            objective[epoch] = total / max(count, 1)
            log_message(
                self.verbose,
                "RBMHashing: fine-tuning epoch %d/%d, NCA objective %.4f",
                epoch + 1,
                self.finetune_epochs,
                objective[epoch],
            )
        return objective

    def _targets(self, idx, Z, y, similar_matrix) -> np.ndarray:
        """Boolean (b, b): which batch items count as the same class (diagonal excluded)."""
        if y is not None:
            target = y[idx][:, None] == y[idx][None, :]
        elif similar_matrix is not None:
            target = similar_matrix[idx][:, idx].toarray() > 0
        else:
            Zb = Z[idx]
            dist = squared_distances(Zb, Zb)
            np.fill_diagonal(dist, np.inf)
            k = min(self.n_neighbors, len(idx) - 1)
            nearest = np.argpartition(dist, k - 1, axis=1)[:, :k]
            target = np.zeros(dist.shape, bool)
            target[np.arange(len(idx))[:, None], nearest] = True
            target |= target.T
        np.fill_diagonal(target, False)
        return target

    def _nca_gradients(self, Zb, target, layers):
        """Gradient of O_NCA (summed over the batch) w.r.t. every layer, and O_NCA."""
        acts = self._forward(Zb, layers)
        F = acts[-1]
        dist = np.maximum(squared_distances(F, F), 0.0)
        np.fill_diagonal(dist, np.inf)
        logits = -dist
        logits -= logits.max(axis=1, keepdims=True)
        p = np.exp(logits)
        p /= p.sum(axis=1, keepdims=True)
        mass = (p * target).sum(axis=1)  # P_n: probability of picking a same-class item
        G = p * (mass[:, None] - target)  # dO/dD_nk = p_nk (P_n - T_nk)
        M = G + G.T
        grad_F = 2.0 * (M.sum(axis=1)[:, None] * F - M @ F)
        grads = []
        delta = grad_F * F * (1 - F)
        for i in range(len(layers) - 1, -1, -1):
            W, _ = layers[i]
            grads.append((acts[i].T @ delta / len(Zb), delta.mean(axis=0)))
            if i:
                delta = (delta @ W.T) * acts[i] * (1 - acts[i])
        return grads[::-1], float(mass.sum())

    def _get_state(self):
        check_is_fitted(self)
        hidden = list(self._check_params())
        params, state, arrays = estimator_state(self, skip_params=("hidden_layers",))
        params["hidden_layers"] = hidden  # a JSON list of ints
        return params, state, arrays

    @classmethod
    def _from_state(cls, params, state, arrays):
        params = dict(params)
        hidden = params.pop("hidden_layers", None)
        if not (
            isinstance(hidden, list)
            and all(isinstance(h, int) and not isinstance(h, bool) and h >= 1 for h in hidden)
        ):
            raise ValueError(f"hidden_layers must be a list of positive ints, got {hidden!r}")
        return estimator_from_state(
            cls, params, state, arrays, extra_params={"hidden_layers": tuple(hidden)}
        )
