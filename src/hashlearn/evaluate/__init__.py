"""Ground truth and the evaluation measures of the papers.

Numbers published for hashing methods move with three choices that papers rarely state, so
every measure here states them:

* **Aggregation** -- pooled over all query--item pairs (the MLH evaluation code: one ratio of
  sums) or averaged per query (a mean of per-query ratios).
* **Empty retrieval** -- what a query that retrieves nothing (or has nothing relevant) scores.
  When *no* query qualifies for a mean, the mean is ``0.0``, never NaN.
* **Ties in Hamming rank** -- a Hamming distance takes only ``b + 1`` values, so many items
  tie. Rankings break ties by a rule: ``"random"`` (a seeded random key per query--item
  pair; the same ``random_state`` gives the same order), ``"index"`` (smaller
  database index first) or, for average precision, ``"pessimistic"`` / ``"optimistic"``.

Hamming distance matrices are ``(n_queries, n_db)`` integer arrays, e.g. from
:func:`hashlearn.codes.hamming_cdist`; relevance is a boolean matrix of the same shape, e.g.
from :func:`relevance_from_labels` or :func:`relevance_from_neighbors`. A radius means
distance ``<= r``, as in the papers.

Measures and their sources:

* precision / recall within Hamming radius ``R`` and the PR curve over ``R = 0..b``
  (Norouzi & Fleet, *Minimal Loss Hashing*, Sec. 6);
* recall of the true K nearest neighbours among the first ``M`` retrieved
  (Grauman & Fergus, *Learning binary hash codes*, Fig. 11);
* k-NN classification with an absolute radius or a relative threshold of the ``k`` nearest
  non-empty Hamming bins (*Learning bit vectors with LambdaRank*, Sec. 3);
* k-NN accuracy and the fraction of the database searched (Jain, Kulis & Grauman,
  *Fast image search for learned metrics*, Sec. 4);
* mean average precision over the Hamming ranking (common practice; ties bracketed).
"""

from __future__ import annotations

from hashlearn.evaluate.classification import (
    bin_threshold,
    fraction_searched,
    hamming_neighbors,
    knn_classification_error,
    knn_classify,
    knn_classify_exact,
    knn_regress,
)
from hashlearn.evaluate.ground_truth import (
    exact_knn,
    relevance_from_labels,
    relevance_from_neighbors,
)
from hashlearn.evaluate.retrieval import (
    hamming_ranking,
    mean_average_precision,
    pr_auc,
    precision_recall_at_radius,
    precision_recall_curve,
    recall_at_m,
    recall_at_m_from_ids,
)

__all__ = [
    "exact_knn",
    "relevance_from_labels",
    "relevance_from_neighbors",
    "precision_recall_at_radius",
    "precision_recall_curve",
    "pr_auc",
    "hamming_ranking",
    "recall_at_m",
    "recall_at_m_from_ids",
    "mean_average_precision",
    "knn_classify",
    "knn_classification_error",
    "hamming_neighbors",
    "knn_regress",
    "bin_threshold",
    "knn_classify_exact",
    "fraction_searched",
]
