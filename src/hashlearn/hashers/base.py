"""The contract every hash function family in hashlearn follows.

A hasher is a scikit-learn estimator. Hyper-parameters are set in ``__init__`` only (nothing
is computed there); ``fit`` learns attributes ending in ``_`` and returns ``self``;
``encode(X)`` returns packed ``uint8`` codes (LSB first, see :mod:`hashlearn.codes`);
``transform`` is ``encode`` so hashers drop into pipelines; ``project(X)`` returns the
real-valued scores that are thresholded at 0, where the family has them. The same
``random_state`` gives identical codes.

Supervised families take labels, ``fit(X, y)``, or pairs, ``fit(X, pairs=P, similar=s)``
(:mod:`hashlearn.supervision`); unsupervised ones ignore both.

``fit`` sets ``n_bits_``, the code length actually produced. It equals ``n_bits`` except for
families whose number of bits is bounded by the data (e.g. PCA-based codes have at most
``min(n_samples, n_features)`` principal directions): those clip it with a ``UserWarning`` at
fit time, as scikit-learn's own estimators do (e.g. ``QuantileTransformer.n_quantiles``), and
their codes then have ``n_bits_`` bits.
"""

from __future__ import annotations

import warnings
from dataclasses import replace

import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils.validation import check_is_fitted, validate_data

from hashlearn._utils.validation import as_plain_array, check_int, check_y
from hashlearn.codes import pack_bits
from hashlearn.hashers._linear import LinearForm
from hashlearn.io import Persistable, estimator_from_state, estimator_state
from hashlearn.supervision import check_pairs

__all__ = [
    "BaseHasher",
    "register_hasher",
    "make_hasher",
    "available_hashers",
    "estimator_state",
]


_HASHERS: dict[str, type[BaseHasher]] = {}


def register_hasher(name: str):
    """Class decorator: make a hasher constructible as ``make_hasher(name, n_bits=...)``."""

    def decorate(cls):
        _HASHERS[name] = cls
        return cls

    return decorate


def make_hasher(name: str, **params) -> BaseHasher:
    """Build a hasher by registry name, e.g. ``make_hasher("lsh", n_bits=32)``."""
    try:
        cls = _HASHERS[name]
    except KeyError:
        raise ValueError(f"Unknown hasher {name!r}; available: {sorted(_HASHERS)}.") from None
    return cls(**params)


def available_hashers() -> dict[str, type[BaseHasher]]:
    """Registry name -> hasher class, for every family hashlearn implements."""
    return dict(sorted(_HASHERS.items()))


def power_of_two_scale(X: np.ndarray) -> float:
    """The power of two ``2**e`` with ``max|X| / 2**e`` in ``[0.5, 1)`` (1.0 for zeros).

    Dividing by it is exact, so a computation on ``X / scale`` gives the same numbers, scaled,
    as on ``X`` wherever ``X``'s own would not overflow (the squares of 1e300 do): the one
    way a hasher's fit is made to hold for data of any finite magnitude."""
    biggest = float(np.max(np.abs(X))) if X.size else 0.0
    return float(np.ldexp(1.0, int(np.frexp(biggest)[1]))) if biggest > 0 else 1.0


def _check_finite_model(est, X) -> None:
    """Refuse a fit whose model is not finite (data whose magnitude overflows float64 in the
    family's computation, e.g. the variances of 1e300 values): a ``ValueError`` naming the
    fitted array, instead of a model that encodes garbage (and could not be loaded back)."""
    for key, value in vars(est).items():
        # arrays only: a scalar may be a documented NaN sentinel (BoostedSimilarityHashing's
        # alpha_ with weighted=True)
        if not key.endswith("_") or key.startswith("_") or not isinstance(value, np.ndarray):
            continue
        if value.dtype.kind in "fc" and not np.isfinite(value).all():
            values = X.data if sp.issparse(X) else X
            biggest = (
                f" (largest magnitude {np.abs(values).max():.3g})"
                if isinstance(values, np.ndarray) and values.size
                else ""
            )
            raise ValueError(
                f"{type(est).__name__}.fit: its fitted {key} is not finite: X{biggest} "
                "overflows float64 in this computation. Rescale X (e.g. "
                "sklearn.preprocessing.MaxAbsScaler)."
            )


class BaseHasher(Persistable, TransformerMixin, BaseEstimator):
    """Base class of binary hash function families.

    Subclasses implement ``_fit(X, y, pairs, similar)`` and one of ``_linear_form()``
    (linear hashers: the scores are ``(X - mean) @ W.T + shift``), ``_project(X)`` (bits
    are ``project(X) >= 0``) or ``_bits(X)``. Class attributes: ``supervised`` (True if
    ``fit`` needs ``y`` or pairs), ``accept_sparse`` (True if ``X`` may be scipy.sparse).
    """

    supervised = False
    accept_sparse = False
    n_bits: int

    # ------------------------------------------------------------------------------ API

    def fit(self, X, y=None, *, pairs=None, similar=None):
        """Learn the hash functions from ``X`` (and ``y`` or ``pairs``/``similar``)."""
        self.n_bits_ = check_int(self.n_bits, "n_bits", type(self).__name__)
        X = self._check_X(X, reset=True)
        if pairs is not None:
            if y is not None:
                raise ValueError(f"{type(self).__name__}.fit takes y or pairs, not both.")
            pairs, similar = check_pairs(pairs, similar, X.shape[0], type(self).__name__)
        elif similar is not None:
            raise ValueError(f"{type(self).__name__}.fit got similar=... without pairs=...")
        y = None if y is None else check_y(y, X.shape[0])  # X may be a list (KLSH on sets)
        if self.supervised and y is None and pairs is None:
            raise ValueError(
                f"{type(self).__name__} requires y to be passed, but the target y is None: "
                "it is supervised, call fit(X, y) with labels or fit(X, pairs=P, similar=s)."
            )
        self._fit(X, y, pairs, similar)
        _check_finite_model(self, X)
        return self

    def encode(self, X) -> np.ndarray:
        """Packed binary codes ``uint8 (n, ceil(n_bits / 8))`` of the rows of ``X``.

        Linear hashers (see :meth:`_linear_form`) encode block by block in the precision of
        ``X``: float32 rows never become float64 and never get a full-size centred copy.
        Their float32 codes equal the codes of the same rows in float64 except at ties, bits
        whose score is within float32 rounding of 0 (:mod:`hashlearn.hashers._linear`).
        """
        check_is_fitted(self)
        form = self._linear_form()
        if form is None:
            return pack_bits(self._bits(self._check_X(X, reset=False)))
        # NaN and infinity are looked for block by block, while each block is in cache
        X = self._check_X(X, reset=False, ensure_all_finite=False)
        if sp.issparse(X):
            form = replace(form, weights_t=self._transposed(form.weights, X.dtype))
        return form.encode(X, check_finite=type(self).__name__)

    def _transposed(self, weights: np.ndarray, dtype) -> np.ndarray:
        """``weights.T`` C-ordered in ``dtype``, kept while ``weights`` is the same array
        (refitting replaces it): sparse encoding of one query at a time would otherwise copy
        the whole matrix per call (one query at 65536 features x 64 bits: 19 ms -> 0.25 ms)."""
        cached = self.__dict__.get("_weights_t_cache")
        if cached is None or cached[0] is not weights or cached[1].dtype != dtype:
            cached = (weights, np.ascontiguousarray(weights.T, dtype=dtype))
            self.__dict__["_weights_t_cache"] = cached
        return cached[1]

    def transform(self, X) -> np.ndarray:
        """Same as :meth:`encode`, so hashers work as pipeline steps."""
        return self.encode(X)

    def project(self, X) -> np.ndarray:
        """Real-valued scores ``(n, n_bits)`` before thresholding at 0."""
        check_is_fitted(self)
        return self._project(self._check_X(X, reset=False))

    # ------------------------------------------------------------------- for subclasses

    def _fit(self, X, y, pairs, similar) -> None:  # pragma: no cover - abstract
        raise NotImplementedError

    def _linear_form(self) -> LinearForm | None:
        """The fitted ``(W, mean, shift)`` of a hasher whose scores are
        ``(X - mean) @ W.T + shift``, or None (the default) for any other family."""
        return None

    def _project(self, X) -> np.ndarray:
        form = self._linear_form()
        if form is None:  # pragma: no cover - abstract
            raise NotImplementedError(f"{type(self).__name__} has no real-valued projection.")
        return form.project(X)

    def _bits(self, X) -> np.ndarray:
        return self._project(X) >= 0

    def _clip_n_bits(self, limit: int, what: str) -> int:
        """Clip ``n_bits_`` to ``limit`` (the most bits the data supports, described by
        ``what``) with a ``UserWarning``; returns the code length to use."""
        n_bits = int(getattr(self, "n_bits_", self.n_bits))
        if n_bits > limit:
            warnings.warn(
                f"n_bits ({n_bits}) is greater than {what} ({limit}) of the training data. "
                f"{type(self).__name__} sets n_bits_={limit}: its codes have {limit} bits.",
                UserWarning,
                stacklevel=4,
            )
            n_bits = int(limit)
        self.n_bits_ = n_bits
        return n_bits

    def _check_X(self, X, *, reset: bool, ensure_all_finite: bool = True):
        X = as_plain_array(X, "X")  # np.matrix -> ndarray; masked values refused
        if sp.issparse(X) and not self.accept_sparse:
            raise TypeError(
                f"{type(self).__name__} needs dense input; got a scipy.sparse "
                "matrix. Use X.toarray() if it fits in memory."
            )
        return validate_data(
            self,
            X,
            reset=reset,
            accept_sparse="csr" if self.accept_sparse else False,
            dtype=(np.float64, np.float32),
            ensure_min_samples=1 if reset else 0,
            ensure_all_finite=ensure_all_finite,
        )

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.sparse = self.accept_sparse
        tags.target_tags.required = self.supervised
        if tags.transformer_tags is not None:
            tags.transformer_tags.preserves_dtype = []  # codes are uint8 whatever X was
        return tags

    # ---------------------------------------------------------------------- persistence

    def _get_state(self):
        check_is_fitted(self)
        return estimator_state(self)

    @classmethod
    def _from_state(cls, params, state, arrays):
        return estimator_from_state(cls, params, state, arrays)
