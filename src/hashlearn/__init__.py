"""hashlearn: learned hashing and fast similarity search.

Learn binary codes from data (``hashlearn.hashers``), index a database of codes
(``hashlearn.index``), search it, re-rank (``Searcher``) and evaluate against exact ground
truth (``hashlearn.evaluate``). See ``DESIGN.md`` for how the papers map to modules.
"""

# first: makes numba's cache optional before any kernel is compiled (see _utils/numba_config.py)
from hashlearn._utils import numba_config  # noqa: F401, I001
from hashlearn import codes, datasets, evaluate, io, kernels, supervision
from hashlearn._utils.parallel import get_num_threads, set_num_threads
from hashlearn.codes import hamming_cdist, hamming_distance, pack_bits, unpack_bits
from hashlearn.datasets import load_digits, load_fashion_mnist, load_stdlib_docstrings
from hashlearn.distributed import ShardedIndex
from hashlearn.embeddings import EmbeddingIndex, load_embeddings
from hashlearn.evaluate import hamming_neighbors, knn_regress
from hashlearn.forest import BoostedSearchForest, KMeansTree, LSHTables
from hashlearn.hashers import (
    BaseHasher,
    BinaryReconstructiveEmbedding,
    BoostedSimilarityHashing,
    IterativeQuantization,
    KernelizedLSH,
    KernelMetricLSH,
    MetricLSH,
    MinHash,
    MinimalLossHashing,
    PCAHashing,
    RandomHyperplaneLSH,
    RankHashing,
    RBMHashing,
    ShiftInvariantKernelHashing,
    SignHashing,
    SpectralHashing,
    make_hasher,
)
from hashlearn.index import (
    Cascade,
    FlatIndex,
    HammingBallIndex,
    MinHashLSHIndex,
    MultiIndexHashing,
    PermutationIndex,
    TableIndex,
    make_index,
)
from hashlearn.io import load, save
from hashlearn.metric import ITML, KernelITML
from hashlearn.search import Searcher

__version__ = "0.1.0"

__all__ = [
    "BaseHasher",
    "BinaryReconstructiveEmbedding",
    "BoostedSearchForest",
    "BoostedSimilarityHashing",
    "Cascade",
    "EmbeddingIndex",
    "FlatIndex",
    "HammingBallIndex",
    "ITML",
    "IterativeQuantization",
    "KMeansTree",
    "KernelITML",
    "KernelMetricLSH",
    "KernelizedLSH",
    "LSHTables",
    "MetricLSH",
    "MinHash",
    "MinHashLSHIndex",
    "MinimalLossHashing",
    "MultiIndexHashing",
    "PCAHashing",
    "PermutationIndex",
    "RBMHashing",
    "RandomHyperplaneLSH",
    "RankHashing",
    "Searcher",
    "ShardedIndex",
    "ShiftInvariantKernelHashing",
    "SignHashing",
    "SpectralHashing",
    "TableIndex",
    "codes",
    "datasets",
    "evaluate",
    "get_num_threads",
    "hamming_cdist",
    "hamming_distance",
    "hamming_neighbors",
    "io",
    "kernels",
    "knn_regress",
    "load",
    "load_digits",
    "load_embeddings",
    "load_fashion_mnist",
    "load_stdlib_docstrings",
    "make_hasher",
    "make_index",
    "pack_bits",
    "save",
    "set_num_threads",
    "supervision",
    "unpack_bits",
]
