"""Sign bits: one bit per input dimension, the "binary quantization" of vector databases.

Bit :math:`j` of :math:`x` is :math:`[x_{d_j} - \\mu_{d_j} > 0]` for the selected
dimensions :math:`d_j`; with ``center=False`` (the default, what vector databases call binary
quantization) :math:`\\mu = 0` and the bit is the sign of the coordinate itself, with
``center=True`` :math:`\\mu` is the training mean, which balances the bits when the
embeddings are not centred. The comparison is strict, as in vector databases: a zero
coordinate gives bit 0, so non-negative data with zeros (pixels, counts) still gets informative
codes (with ``>= 0`` every bit of such data would be 1). Nothing else is learned: this is the baseline every learned code
(ITQ, spectral hashing, ...) should beat at the same number of bits.

Code length. ``n_bits == n_features`` keeps every dimension (the usual setting). A smaller
``n_bits`` keeps the ``n_bits`` dimensions of largest training variance
(``select="variance"``, ties broken by the lower dimension index) or the first ``n_bits``
dimensions (``select="first"``). A code cannot have more sign bits than the data has
dimensions: a larger ``n_bits`` is clipped to ``n_features`` at fit time with a
``UserWarning`` and ``n_bits_`` says how many bits the codes have.
"""

from __future__ import annotations

import warnings

import numpy as np

from hashlearn.hashers.base import BaseHasher, power_of_two_scale, register_hasher
from hashlearn.io import persistable

__all__ = ["SignHashing"]

_SELECT = ("variance", "first")


@persistable
@register_hasher("sign")
class SignHashing(BaseHasher):
    """One sign bit per dimension (binary quantization), optionally centred.

    Parameters
    ----------
    n_bits : int, default=32
        Code length: ``n_features`` for one bit per dimension; fewer keeps a subset of the
        dimensions (see ``select``); more is clipped to ``n_features`` with a warning.
    center : bool, default=False
        Subtract the training mean before taking signs. ``False`` is the plain binary
        quantization of vector databases (threshold every coordinate at 0).
    select : {"variance", "first"}, default="variance"
        Which dimensions to keep when ``n_bits < n_features``: those of largest training
        variance, or the first ``n_bits``.
    random_state : None
        Unused (nothing is random); accepted so every baseline takes it.

    Attributes
    ----------
    n_bits_ : int
        Code length produced (``min(n_bits, n_features)``).
    dims_ : ndarray int64 (n_bits_,)
        The input dimension of each bit.
    mean_ : ndarray (n_features,)
        Subtracted before taking signs (zeros when ``center=False``).

    Examples
    --------
    >>> import numpy as np
    >>> from hashlearn.hashers import SignHashing
    >>> X = np.array([[0.5, -1.0, 2.0], [-0.5, 1.0, -2.0]])
    >>> h = SignHashing(n_bits=3).fit(X)
    >>> h.encode(X).tolist()  # bits LSB first: [1, 0, 1] -> 5 and [0, 1, 0] -> 2
    [[5], [2]]
    >>> SignHashing(n_bits=1, select="first").fit(X).dims_.tolist()
    [0]
    """

    def __init__(
        self,
        n_bits: int = 32,
        center: bool = False,
        select: str = "variance",
        random_state=None,
    ):
        self.n_bits = n_bits
        self.center = center
        self.select = select
        self.random_state = random_state

    def _fit(self, X, y, pairs, similar) -> None:
        owner = type(self).__name__
        if not isinstance(self.center, (bool, np.bool_)):
            raise ValueError(
                f"The 'center' parameter of {owner} must be a bool. Got {self.center!r} instead."
            )
        if self.select not in _SELECT:
            raise ValueError(
                f"The 'select' parameter of {owner} must be one of {list(_SELECT)}. "
                f"Got {self.select!r} instead."
            )
        d = X.shape[1]
        n_bits = int(self.n_bits)
        if n_bits > d:
            warnings.warn(
                f"n_bits ({n_bits}) is greater than n_features ({d}) of the training data. "
                f"{owner} sets n_bits_={d}: its codes have {d} bits, one per dimension.",
                UserWarning,
                stacklevel=3,
            )
            n_bits = d
        mean = X.mean(axis=0, dtype=np.float64)
        if n_bits == d:
            dims = np.arange(d, dtype=np.int64)
        elif self.select == "first":
            dims = np.arange(n_bits, dtype=np.int64)
        else:
            # ranked on X / scale (exact): squares of 1e300 would overflow to equal infinities
            var = (((X - mean) / power_of_two_scale(X)) ** 2).mean(axis=0)
            dims = np.sort(np.argsort(-var, kind="stable")[:n_bits]).astype(np.int64)
        self.n_bits_ = n_bits
        self.dims_ = dims
        self.mean_ = mean if self.center else np.zeros(d)

    def _project(self, X) -> np.ndarray:
        return X[:, self.dims_] - self.mean_[self.dims_].astype(X.dtype, copy=False)

    def _bits(self, X) -> np.ndarray:
        return self._project(X) > 0  # strict: a zero coordinate is bit 0
