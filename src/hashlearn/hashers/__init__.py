"""Hash function families: each a scikit-learn estimator with ``fit`` / ``encode``."""

from hashlearn.hashers.base import BaseHasher, available_hashers, make_hasher, register_hasher
from hashlearn.hashers.boosted import BoostedSimilarityHashing
from hashlearn.hashers.bre import BinaryReconstructiveEmbedding
from hashlearn.hashers.klsh import KernelizedLSH
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.metric_lsh import KernelMetricLSH, MetricLSH
from hashlearn.hashers.minhash import MinHash
from hashlearn.hashers.mlh import MinimalLossHashing, select_mlh_hyperparameters
from hashlearn.hashers.pca import IterativeQuantization, PCAHashing
from hashlearn.hashers.rank import RankHashing
from hashlearn.hashers.rbm import RBMHashing
from hashlearn.hashers.sign import SignHashing
from hashlearn.hashers.sikh import ShiftInvariantKernelHashing
from hashlearn.hashers.spectral import SpectralHashing

__all__ = [
    "BaseHasher",
    "BinaryReconstructiveEmbedding",
    "BoostedSimilarityHashing",
    "IterativeQuantization",
    "KernelMetricLSH",
    "KernelizedLSH",
    "MetricLSH",
    "MinHash",
    "MinimalLossHashing",
    "PCAHashing",
    "RBMHashing",
    "RandomHyperplaneLSH",
    "RankHashing",
    "ShiftInvariantKernelHashing",
    "SignHashing",
    "SpectralHashing",
    "available_hashers",
    "make_hasher",
    "register_hasher",
    "select_mlh_hyperparameters",
]
