"""K-means trees: the unsupervised tree baseline of Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 (§1, §4).

A vocabulary tree (Nister & Stewenius; Muja & Lowe's k-means trees) partitions the space by
hierarchical k-means; its leaves are the index words. Here each tree is *bisecting*
(branching factor 2, so a tree of depth ``D`` spends ``D`` bits per item, the unit the paper
uses to compare trees with Hamming codes): a node's items are split by 2-means (Lloyd's
iterations from two random items of the node), and the child of a point is its nearer
centroid, i.e. the side of the bisecting hyperplane

.. math:: 2 (c_1 - c_2)^\\top x > \\lVert c_1 \\rVert^2 - \\lVert c_2 \\rVert^2 .

Every tree starts from its own random initialisations (the paper's "k-means trees with
random initializations"), which is what makes a forest of them useful at all.
"""

from __future__ import annotations

import numpy as np
from sklearn.utils import check_random_state

from hashlearn._utils.validation import check_int
from hashlearn.forest.base import BaseBucketer, TreeBuilder, node_scores, tree_leaves
from hashlearn.io import persistable

__all__ = ["KMeansTree"]


def _two_means(
    X: np.ndarray, rng: np.random.RandomState, n_iter: int
) -> tuple[np.ndarray, np.ndarray] | None:
    """Lloyd's 2-means from two random distinct rows; ``None`` if all rows coincide."""
    first = rng.randint(len(X))
    second = rng.randint(len(X) - 1)
    second += second >= first
    c = X[[first, second]].copy()
    if np.array_equal(c[0], c[1]):
        far = np.argmax(((X - c[0]) ** 2).sum(1))
        c[1] = X[far]
        if np.array_equal(c[0], c[1]):
            return None
    side = None
    for _ in range(n_iter):
        new_side = 2.0 * X @ (c[0] - c[1]) > (c[0] @ c[0] - c[1] @ c[1])
        if side is not None and np.array_equal(new_side, side):
            break
        side = new_side
        if side.all() or not side.any():
            break
        c[0], c[1] = X[side].mean(0), X[~side].mean(0)
    return c[0], c[1]


@persistable
class KMeansTree(BaseBucketer):
    """A forest of bisecting k-means trees (hierarchical 2-means), one random start per tree.

    Parameters
    ----------
    n_trees : int
        Number of trees (tables of the inverted index).
    max_depth : int
        Depth of each tree: at most ``2**max_depth`` leaves.
    min_samples_leaf : int
        A node with fewer than ``2 * min_samples_leaf`` items, or a split leaving fewer on
        one side, stays a leaf.
    n_iter : int
        Lloyd iterations per 2-means split.
    random_state : int, RandomState or None

    Attributes
    ----------
    roots_, left_, right_, feature_, threshold_, leaf_id_, proj_, n_leaves_ : ndarray
        The trees in the flat layout of :class:`hashlearn.forest.base.TreeBuilder` (every
        split is a hyperplane row of ``proj_``).

    Examples
    --------
    >>> from hashlearn.datasets import load_digits
    >>> from hashlearn.forest.kmeans_tree import KMeansTree
    >>> X, _ = load_digits()
    >>> KMeansTree(n_trees=2, max_depth=4, random_state=0).fit(X).leaves(X[:3]).shape
    (3, 2)
    """

    def __init__(
        self,
        n_trees: int = 8,
        max_depth: int = 10,
        min_samples_leaf: int = 1,
        n_iter: int = 20,
        random_state=None,
    ):
        self.n_trees = n_trees
        self.max_depth = max_depth
        self.min_samples_leaf = min_samples_leaf
        self.n_iter = n_iter
        self.random_state = random_state

    @property
    def n_tables(self) -> int:  # type: ignore[override]  # a parameter elsewhere
        return self.n_trees

    def _fit(self, X, y) -> None:
        owner = "KMeansTree"
        n_trees = check_int(self.n_trees, "n_trees", owner)
        max_depth = check_int(self.max_depth, "max_depth", owner, high=40)
        min_leaf = check_int(self.min_samples_leaf, "min_samples_leaf", owner)
        n_iter = check_int(self.n_iter, "n_iter", owner)
        rng = check_random_state(self.random_state)
        builder = TreeBuilder(X.shape[1])
        for _ in range(n_trees):
            root, _leaves = self._grow_tree(X, builder, rng, max_depth, min_leaf, n_iter)
            builder.finish_tree(root)
        for key, value in builder.arrays().items():
            setattr(self, key, value)
        if np.any(self.n_leaves_ < 2):
            raise ValueError(
                "KMeansTree: a tree has a single leaf (all rows of X coincide); "
                "it would return the whole database for every query."
            )

    def _grow_tree(self, X, builder, rng, max_depth, min_leaf, n_iter):
        """One bisecting 2-means tree, breadth first; returns its root and the leaves as
        ``(node, training rows)`` pairs."""
        root = builder.new_node()
        frontier = [(root, np.arange(len(X)))]
        leaves = []
        for _depth in range(max_depth):
            next_frontier = []
            for node, rows in frontier:
                centroids = None
                if len(rows) >= 2 * min_leaf and len(rows) >= 2:
                    centroids = _two_means(X[rows], rng, n_iter)
                if centroids is None:
                    leaves.append((node, rows))
                    continue
                c1, c2 = centroids
                direction = 2.0 * (c1 - c2)
                threshold = float(c1 @ c1 - c2 @ c2)
                # the same kernel as keys(), so fit-time leaves are the query-time ones
                side = node_scores(X, rows, None, direction) > threshold
                if min(side.sum(), (~side).sum()) < min_leaf:
                    leaves.append((node, rows))
                    continue
                left, right = builder.set_split(node, None, direction, threshold)
                next_frontier += [(left, rows[side]), (right, rows[~side])]
            frontier = next_frontier
        return root, leaves + frontier

    def _local_keys(self, X, n_threads=None) -> np.ndarray:
        return tree_leaves(X, self, n_threads=n_threads)
