"""Bucketers for the inverted :class:`~hashlearn.index.table.TableIndex`
(Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011): the boosted search forest, k-means trees and LSH tables.
Each has ``fit(X, y=None)``, ``keys(X) -> (n, n_tables) int64`` and ``n_tables``."""

from hashlearn.forest.base import BaseBucketer
from hashlearn.forest.boosted import BoostedSearchForest
from hashlearn.forest.kmeans_tree import KMeansTree
from hashlearn.forest.lsh_tables import LSHTables

__all__ = ["BaseBucketer", "BoostedSearchForest", "KMeansTree", "LSHTables"]
