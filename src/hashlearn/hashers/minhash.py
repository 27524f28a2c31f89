"""Min-Hash signatures of sets (Broder; Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §4.1).

Min-Hash embeds sets so that collisions measure the normalised set overlap, the Jaccard
similarity :math:`\\mathrm{sim}(S_1, S_2) = |S_1 \\cap S_2| / |S_1 \\cup S_2|`. Draw a random
ordering of the token vocabulary; the Min-Hash key of a set is its first token in that order.
Two sets get the same key exactly when the first token of their union (a uniformly random
token of :math:`S_1 \\cup S_2`) lies in both, so

.. math::

    \\Pr[\\mathrm{minhash}(S_1) = \\mathrm{minhash}(S_2)] = \\mathrm{sim}(S_1, S_2).

``n_hashes`` independent orderings give a signature; concatenations of keys ("bands") are
the hash-table keys of :class:`hashlearn.index.minhash_lsh.MinHashLSHIndex`.

The orderings are random linear hash functions :math:`\\pi(x) = (a\\,g(x) + b) \\bmod P`
over the Mersenne prime :math:`P = 2^{31} - 1`, where :math:`g` is a fixed 64-bit mixer
(splitmix64) reduced mod P so that any non-negative int64 token is accepted. Distinct
tokens collide under :math:`g` with probability about :math:`2^{-31}` (negligible), and the
linear family is approximately min-wise independent, which the tests check against the
Jaccard similarity with binomial tolerances.

Sets are given as a sequence of iterables of non-negative integer token ids, or as the rows
of a scipy.sparse matrix (a row's set is its non-zero columns). Empty sets have no minimum
and are an error.
"""

from __future__ import annotations

import numbers

import numba
import numpy as np
import scipy.sparse as sp
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils import check_random_state
from sklearn.utils.validation import check_is_fitted

from hashlearn._utils.primitives import splitmix64
from hashlearn._utils.validation import check_int
from hashlearn.io import Persistable, persistable, require_array

__all__ = ["MinHash", "as_token_csr", "jaccard_similarity"]

MERSENNE_31 = np.int64((1 << 31) - 1)


def as_token_csr(sets, name: str = "sets", owner: str = "MinHash") -> tuple[np.ndarray, np.ndarray]:
    """``(indptr int64, tokens int64)``: the sets in CSR form, validated (no empty set)."""
    if sp.issparse(sets):
        csr = sp.csr_matrix(sets)
        csr.eliminate_zeros()
        indptr = csr.indptr.astype(np.int64)
        tokens = csr.indices.astype(np.int64)
    else:
        if isinstance(sets, (str, bytes)) or not hasattr(sets, "__len__"):
            raise TypeError(
                f"{name} of {owner} must be a sequence of sets of integer token "
                f"ids or a scipy.sparse matrix. Got {type(sets).__name__}."
            )
        lengths = np.zeros(len(sets) + 1, np.int64)
        chunks = []
        for i, s in enumerate(sets):
            if isinstance(s, (str, bytes)):
                raise TypeError(
                    f"{name}[{i}] of {owner} is a string; pass token ids "
                    "(e.g. hash your shingles to integers first)."
                )
            arr = np.asarray(s if isinstance(s, np.ndarray) else list(s))
            if arr.size and not np.issubdtype(arr.dtype, np.integer):
                raise TypeError(
                    f"{name}[{i}] of {owner} must hold integer token ids. Got dtype {arr.dtype}."
                )
            arr = arr.astype(np.int64).ravel()
            chunks.append(arr)
            lengths[i + 1] = arr.size
        indptr = np.cumsum(lengths)
        tokens = np.concatenate(chunks) if chunks else np.zeros(0, np.int64)
    if tokens.size and tokens.min() < 0:
        raise ValueError(
            f"{name} of {owner} must hold non-negative token ids. Got {int(tokens.min())}."
        )
    sizes = np.diff(indptr)
    if sizes.size and sizes.min() == 0:
        raise ValueError(
            f"{name} of {owner} contains an empty set (item "
            f"{int(np.argmin(sizes))}); Min-Hash of an empty set is undefined."
        )
    return indptr, tokens


def jaccard_similarity(a, b) -> float:
    """Exact :math:`|a \\cap b| / |a \\cup b|` of two iterables of tokens (the oracle)."""
    a, b = set(a), set(b)
    union = len(a | b)
    return len(a & b) / union if union else 0.0


@numba.njit(cache=True, nogil=True)
def _mix(x: np.int64) -> np.int64:
    """splitmix64 finaliser reduced mod 2^31 - 1: a fixed scramble of token ids."""
    return np.int64(splitmix64(np.uint64(x)) % np.uint64(2147483647))


@numba.njit(cache=True, nogil=True)
def _signatures(indptr, tokens, coef_a, coef_b, out):
    """out[i, h] = min over tokens x of set i of (a_h * g(x) + b_h) mod (2^31 - 1)."""
    prime = np.int64(2147483647)
    n_hashes = coef_a.shape[0]
    for i in range(indptr.shape[0] - 1):
        for h in range(n_hashes):
            out[i, h] = prime
        for p in range(indptr[i], indptr[i + 1]):
            g = _mix(tokens[p])
            for h in range(n_hashes):
                value = (coef_a[h] * g + coef_b[h]) % prime
                if value < out[i, h]:
                    out[i, h] = value


@persistable
class MinHash(Persistable, TransformerMixin, BaseEstimator):
    """Min-Hash signatures: ``n_hashes`` random min-wise orderings (survey §4.1).

    Parameters
    ----------
    n_hashes : int, default=128
        Signature length; the fraction of equal entries of two signatures estimates the
        Jaccard similarity with standard deviation :math:`\\sqrt{J(1-J)/n}`.
    random_state : int, RandomState or None

    Attributes
    ----------
    coef_a_, coef_b_ : ndarray (n_hashes,) int64
        The linear orderings :math:`(a\\,g(x) + b) \\bmod (2^{31}-1)`, ``a >= 1``.

    ``fit(sets)`` draws the orderings (the sets are only validated: Min-Hash is
    data-independent); ``transform(sets)`` returns ``(n, n_hashes)`` int64 signatures.
    Not a vector hasher: it takes sets, not rows of floats.

    Examples
    --------
    >>> from hashlearn.hashers import MinHash
    >>> sets = [{1, 2, 3, 4}, {1, 2, 3, 5}, {7, 8, 9}]
    >>> mh = MinHash(n_hashes=256, random_state=0).fit(sets)
    >>> sig = mh.transform(sets)
    >>> sig.shape
    (3, 256)
    >>> est = mh.estimate_jaccard(sig[[0, 0]], sig[[1, 2]])  # pairwise; true values 0.6 and 0
    >>> bool(abs(est[0] - 0.6) < 0.1), float(est[1])
    (True, 0.0)
    """

    def __init__(self, n_hashes: int = 128, random_state=None):
        self.n_hashes = n_hashes
        self.random_state = random_state

    def fit(self, sets=None, y=None):
        """Draw the ``n_hashes`` orderings; ``sets`` (if given) are validated only."""
        n_hashes = check_int(self.n_hashes, "n_hashes", "MinHash")
        if sets is not None:
            as_token_csr(sets)
        rng = check_random_state(self.random_state)
        self.coef_a_ = rng.randint(1, int(MERSENNE_31), size=n_hashes).astype(np.int64)
        self.coef_b_ = rng.randint(0, int(MERSENNE_31), size=n_hashes).astype(np.int64)
        return self

    def transform(self, sets) -> np.ndarray:
        """Signatures ``int64 (n, n_hashes)`` of the sets."""
        check_is_fitted(self)
        indptr, tokens = as_token_csr(sets)
        out = np.empty((len(indptr) - 1, len(self.coef_a_)), dtype=np.int64)
        _signatures(indptr, tokens, self.coef_a_, self.coef_b_, out)
        return out

    def estimate_jaccard(self, signatures_a: np.ndarray, signatures_b: np.ndarray) -> np.ndarray:
        """Row-wise fraction of equal signature entries (unbiased Jaccard estimate)."""
        a, b = np.asarray(signatures_a), np.asarray(signatures_b)
        if a.shape != b.shape or a.ndim != 2 or a.shape[1] != len(self.coef_a_):
            raise ValueError(
                f"signatures must both have shape (n, {len(self.coef_a_)}). "
                f"Got {a.shape} and {b.shape}."
            )
        return (a == b).mean(axis=1)

    def __sklearn_tags__(self):
        tags = super().__sklearn_tags__()
        tags.input_tags.two_d_array = False
        tags.input_tags.sparse = True
        return tags

    def _get_state(self):
        check_is_fitted(self)
        params = self.get_params(deep=False)
        if not (
            params["random_state"] is None or isinstance(params["random_state"], numbers.Integral)
        ):
            raise TypeError("cannot save MinHash: pass random_state as an int or None.")
        return params, {}, {"coef_a_": self.coef_a_, "coef_b_": self.coef_b_}

    @classmethod
    def _from_state(cls, params, state, arrays):
        if set(state) or set(arrays) != {"coef_a_", "coef_b_"}:
            raise ValueError(
                f"a MinHash save holds coef_a_ and coef_b_ only; found {sorted({*state, *arrays})}"
            )
        obj = cls(**params)
        n = check_int(obj.n_hashes, "n_hashes", "MinHash")
        obj.coef_a_ = require_array(
            arrays, "coef_a_", np.int64, shape=(n,), low=1, high=int(MERSENNE_31)
        )
        obj.coef_b_ = require_array(
            arrays, "coef_b_", np.int64, shape=(n,), low=0, high=int(MERSENNE_31)
        )
        return obj
