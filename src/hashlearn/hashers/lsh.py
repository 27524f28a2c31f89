"""Random-hyperplane LSH (Charikar 2002; survey §4.1).

Each bit is the sign of a random projection, :math:`h_r(x) = [r^T x \\ge 0]`, with :math:`r`
uniformly distributed in direction, so two vectors at angle :math:`\\theta` collide on a bit
with probability :math:`1 - \\theta / \\pi` and the expected Hamming distance is
:math:`b\\,\\theta/\\pi` (Charikar, "Similarity estimation techniques from rounding
algorithms", STOC 2002, Sec. 3).

Two ways to draw the ``b`` directions, both with that per-bit collision probability:

* ``directions="gaussian"``: i.i.d. :math:`r \\sim N(0, I)`, the textbook SimHash; the bits
  are independent.
* ``directions="orthogonal"`` (default): blocks of ``d`` orthonormal directions, each block a
  Haar-random orthogonal matrix (QR of a Gaussian matrix with the signs of ``R``'s diagonal
  folded in), and as many blocks as ``ceil(b / d)`` (the last one partial). Each direction is
  still uniform on the sphere, but directions of one block never repeat each other, so on
  low-dimensional data the bits carry more information (faiss's ``IndexLSH`` draws its
  rotation this way). With ``b <= d`` all directions are orthonormal.

With ``center=True`` the data mean is subtracted first, which makes the bits balanced on data
that is not centred.

The papers' LSH -- Charikar's hyperplanes through the origin with i.i.d. Gaussian normals, the
baseline of the survey (§4.1), of Norouzi & Fleet 2011 (§6), of the LambdaRank bit-vector
paper and, on ``G x``, Jain et al.'s eq. 6 -- is
``RandomHyperplaneLSH(directions="gaussian", center=False)``; the defaults (orthogonal,
centred) are stronger on low-dimensional or non-centred data (0.02-0.04 recall on
digits, issue 31), so the reproductions run the papers' version as their baseline and
the defaults as an extra, named row.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from hashlearn.hashers._linear import LinearForm
from hashlearn.hashers.base import BaseHasher, register_hasher
from hashlearn.io import persistable

__all__ = ["RandomHyperplaneLSH", "orthogonal_directions"]

_DIRECTIONS = ("orthogonal", "gaussian")


def orthogonal_directions(n_bits: int, n_features: int, rng: np.random.RandomState) -> np.ndarray:
    """``(n_bits, n_features)`` unit directions, orthonormal within consecutive blocks of
    ``n_features`` rows: each block holds the first rows of a Haar-random orthogonal matrix
    (reduced QR of a Gaussian matrix, columns' signs fixed by ``sign(diag(R))``)."""
    out = np.empty((n_bits, n_features))
    for start in range(0, n_bits, n_features):
        k = min(n_features, n_bits - start)
        q, r = np.linalg.qr(rng.standard_normal((n_features, k)))
        signs = np.sign(np.diag(r))
        signs[signs == 0] = 1.0
        out[start : start + k] = (q * signs).T
    return out


@persistable
@register_hasher("lsh")
class RandomHyperplaneLSH(BaseHasher):
    """Sign of random projections (Charikar's SimHash), orthogonal or i.i.d. Gaussian.

    Parameters
    ----------
    n_bits : int, default=32
        Code length.
    center : bool, default=True
        Subtract the training mean before projecting.
    directions : {"orthogonal", "gaussian"}, default="orthogonal"
        ``"orthogonal"``: blockwise orthonormal directions (blocks of ``n_features`` when
        ``n_bits > n_features``); ``"gaussian"``: i.i.d. standard normal ones. Both give
        each bit the collision probability ``1 - angle / pi``; orthogonal directions give
        better codes on low-dimensional data (see the module docstring).
    random_state : int, RandomState or None
        Seed of the projections; the same seed gives identical codes.

    Attributes
    ----------
    n_bits_ : int
        Code length (always ``n_bits``).
    components_ : ndarray (n_bits, n_features)
        The hyperplane normals ``r`` (unit rows with ``"orthogonal"``).
    mean_ : ndarray (n_features,)
        Subtracted before projecting (zeros when ``center=False``).

    Accepts scipy.sparse input: the mean is folded into an offset, so ``X`` stays sparse.

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.hashers import RandomHyperplaneLSH
    >>> X = np.random.RandomState(0).randn(20, 4)
    >>> h = RandomHyperplaneLSH(n_bits=6, random_state=0).fit(X)
    >>> h.encode(X[:2]).shape
    (2, 1)
    >>> R = h.components_[:4]  # the first block: 4 orthonormal directions in 4-d
    >>> bool(np.allclose(R @ R.T, np.eye(4)))
    True
    """

    accept_sparse = True

    def __init__(
        self,
        n_bits: int = 32,
        center: bool = True,
        directions: str = "orthogonal",
        random_state=None,
    ):
        self.n_bits = n_bits
        self.center = center
        self.directions = directions
        self.random_state = random_state

    def _fit(self, X, y, pairs, similar) -> None:
        if self.directions not in _DIRECTIONS:
            raise ValueError(
                f"The 'directions' parameter of {type(self).__name__} must be a str among "
                f"{list(_DIRECTIONS)}. Got {self.directions!r} instead."
            )
        rng = check_random_state(self.random_state)
        if self.directions == "gaussian":
            self.components_ = rng.standard_normal((self.n_bits, X.shape[1]))
        else:
            self.components_ = orthogonal_directions(self.n_bits, X.shape[1], rng)
        if self.center:
            self.mean_ = np.asarray(X.mean(axis=0)).ravel()
        else:
            self.mean_ = np.zeros(X.shape[1])
        self.offset_ = self.components_ @ self.mean_

    def _linear_form(self) -> LinearForm:
        # X @ components_.T - offset_: the mean is folded into the offset so X stays sparse
        return LinearForm(self.components_, shift=-self.offset_)
