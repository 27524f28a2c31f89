"""Supervision for learned codes and metrics: similar / dissimilar pairs.

Every supervised method in hashlearn takes either labels, ``fit(X, y)``, or explicit pairs,
``fit(X, pairs=P, similar=s)`` with ``P`` an ``(m, 2)`` array of row indices into ``X`` and
``s`` a boolean array of length ``m`` (True: the two rows are similar).
"""

from __future__ import annotations

import numpy as np

__all__ = ["check_pairs"]


def check_pairs(pairs, similar, n_samples: int, owner: str) -> tuple[np.ndarray, np.ndarray]:
    """Validate explicit supervision: ``(pairs int64 (m, 2), similar bool (m,))``."""
    pairs_arr = np.asarray(pairs)
    if pairs_arr.ndim != 2 or pairs_arr.shape[1] != 2:
        raise ValueError(f"pairs passed to {owner} must have shape (m, 2). "
                         f"Got shape {pairs_arr.shape}.")
    if pairs_arr.size and not np.issubdtype(pairs_arr.dtype, np.integer):
        raise TypeError(f"pairs passed to {owner} must hold integer row indices. "
                        f"Got dtype {pairs_arr.dtype}.")
    pairs_arr = pairs_arr.astype(np.int64, copy=False)
    if pairs_arr.size and (pairs_arr.min() < 0 or pairs_arr.max() >= n_samples):
        raise ValueError(f"pairs passed to {owner} index rows of X, which has {n_samples} "
                         f"rows; got indices in [{pairs_arr.min()}, {pairs_arr.max()}].")
    if similar is None:
        raise ValueError(f"{owner} needs similar=... (one bool per pair) with pairs=...")
    similar_arr = np.asarray(similar)
    if similar_arr.shape != (pairs_arr.shape[0],):
        raise ValueError(f"similar passed to {owner} must have shape ({pairs_arr.shape[0]},), "
                         f"one value per pair. Got shape {similar_arr.shape}.")
    if similar_arr.dtype != np.bool_:
        if similar_arr.size and not np.isin(similar_arr, (0, 1)).all():
            raise ValueError(f"similar passed to {owner} must be booleans (or 0/1).")
        similar_arr = similar_arr.astype(bool)
    return pairs_arr, similar_arr
