"""Every estimator hashlearn ships passes scikit-learn's own estimator checks.

Each estimator is listed once, with small settings so the checks stay quick; the defaults
that matter for accuracy are tested elsewhere. Parameters that cannot fit tiny data (more
bits than features, more landmarks than samples) must be clipped with a warning at fit time,
as scikit-learn's own estimators do, so they are *not* shrunk here.
"""

from __future__ import annotations

from sklearn.utils.estimator_checks import parametrize_with_checks

from hashlearn.forest import BoostedSearchForest, KMeansTree, LSHTables
from hashlearn.hashers import (
    BinaryReconstructiveEmbedding,
    BoostedSimilarityHashing,
    IterativeQuantization,
    KernelizedLSH,
    KernelMetricLSH,
    MetricLSH,
    MinimalLossHashing,
    PCAHashing,
    RandomHyperplaneLSH,
    RankHashing,
    RBMHashing,
    ShiftInvariantKernelHashing,
    SignHashing,
    SpectralHashing,
)
from hashlearn.metric import ITML, KernelITML

ESTIMATORS = [
    # unsupervised hashers
    RandomHyperplaneLSH(n_bits=16, random_state=0),
    SignHashing(n_bits=8),
    PCAHashing(n_bits=8),
    IterativeQuantization(n_bits=8, n_iter=5, random_state=0),
    SpectralHashing(n_bits=8, random_state=0),
    ShiftInvariantKernelHashing(n_bits=16, random_state=0),
    KernelizedLSH(n_bits=8, random_state=0),
    RBMHashing(n_bits=8, hidden_layers=(16,), pretrain_epochs=1, finetune_epochs=1, random_state=0),
    # supervised hashers and learned metrics
    MinimalLossHashing(n_bits=8, random_state=0),
    BinaryReconstructiveEmbedding(n_bits=8, random_state=0),
    BoostedSimilarityHashing(n_bits=8, n_pairs=500, random_state=0),
    RankHashing(n_bits=8, n_epochs=1, random_state=0),
    MetricLSH(n_bits=8, random_state=0),
    KernelMetricLSH(n_bits=8, random_state=0),
    ITML(random_state=0),
    KernelITML(random_state=0),
    # bucketers
    BoostedSearchForest(n_trees=2, max_depth=4, n_pairs=500, random_state=0),
    KMeansTree(n_trees=2, max_depth=3, random_state=0),
    LSHTables(n_tables=2, bits_per_table=4, random_state=0),
]


@parametrize_with_checks(ESTIMATORS)
def test_sklearn_contract(estimator, check):
    check(estimator)
