"""Random-hyperplane LSH (Charikar 2002; survey §4.1).

Each bit is the sign of a Gaussian random projection, :math:`h_r(x) = [r^T x \\ge 0]` with
:math:`r \\sim N(0, I)`, so two vectors at angle :math:`\\theta` collide on a bit with
probability :math:`1 - \\theta / \\pi` and the expected Hamming distance is
:math:`b\\,\\theta/\\pi`. With ``center=True`` the data mean is subtracted first, which makes
the bits balanced on data that is not centred.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from hashlearn.hashers.base import BaseHasher, register_hasher
from hashlearn.io import persistable

__all__ = ["RandomHyperplaneLSH"]


@persistable
@register_hasher("lsh")
class RandomHyperplaneLSH(BaseHasher):
    """Sign of Gaussian random projections (Charikar's SimHash).

    Parameters
    ----------
    n_bits : int
        Code length.
    center : bool, default=True
        Subtract the training mean before projecting.
    random_state : int, RandomState or None
        Seed of the projections; the same seed gives identical codes.

    Attributes
    ----------
    components_ : ndarray (n_bits, n_features)
        The random hyperplane normals ``r``.
    mean_ : ndarray (n_features,)
        Subtracted before projecting (zeros when ``center=False``).

    Accepts scipy.sparse input: the mean is folded into an offset, so ``X`` stays sparse.
    """

    accept_sparse = True

    def __init__(self, n_bits: int = 32, center: bool = True, random_state=None):
        self.n_bits = n_bits
        self.center = center
        self.random_state = random_state

    def _fit(self, X, y, pairs, similar) -> None:
        rng = check_random_state(self.random_state)
        self.components_ = rng.standard_normal((self.n_bits, X.shape[1]))
        if self.center:
            self.mean_ = np.asarray(X.mean(axis=0)).ravel()
        else:
            self.mean_ = np.zeros(X.shape[1])
        self.offset_ = self.components_ @ self.mean_

    def _project(self, X) -> np.ndarray:
        return np.asarray(X @ self.components_.T) - self.offset_
