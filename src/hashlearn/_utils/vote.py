"""Majority vote of labelled neighbours: the one vote of k-NN classification in hashlearn.

Used by :mod:`hashlearn.evaluate.classification` (Hamming-space k-NN and neighbour
selection) and by ITML's cross-validated k-NN accuracy
(:func:`hashlearn.metric.itml.knn_accuracy`).
"""

from __future__ import annotations

import numpy as np

__all__ = ["majority_vote"]


def majority_vote(voter_class: np.ndarray, voter_dist: np.ndarray, n_classes: int) -> np.ndarray:
    """Class index per row by majority vote; ``-1`` where a row has no voter.

    ``voter_class`` ``(b, L)`` holds class indices (``-1`` = not a voter). Ties between classes
    go to the class whose nearest voter is closest, then to the smaller class index.
    """
    b = voter_class.shape[0]
    valid = voter_class >= 0
    slot = (voter_class + n_classes * np.arange(b)[:, None])[valid]
    votes = np.bincount(slot, minlength=b * n_classes).reshape(b, n_classes)
    nearest = np.full(b * n_classes, np.inf)
    np.minimum.at(nearest, slot, voter_dist[valid].astype(np.float64))
    nearest = nearest.reshape(b, n_classes)
    candidate = votes == votes.max(axis=1, keepdims=True)
    near = np.where(candidate, nearest, np.inf)
    candidate &= near == near.min(axis=1, keepdims=True)
    return np.where(valid.any(axis=1), np.argmax(candidate, axis=1), -1)
