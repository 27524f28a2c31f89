"""Search structures over binary codes and integer bucket keys.

Binary-code indexes follow :mod:`hashlearn.index.base`'s faiss-like conventions and are built
by name through :func:`make_index`; ``TableIndex`` and ``MinHashLSHIndex`` hold integer keys.
"""

from hashlearn.index.base import BinaryIndex, available_indexes, make_index, register_index
from hashlearn.index.cascade import Cascade
from hashlearn.index.flat import FlatIndex
from hashlearn.index.hamming_ball import HammingBallIndex
from hashlearn.index.ivf import IVFIndex
from hashlearn.index.ivf_residual import ResidualIVFIndex
from hashlearn.index.mih import MultiIndexHashing
from hashlearn.index.minhash_lsh import MinHashLSHIndex
from hashlearn.index.permutation import PermutationIndex
from hashlearn.index.table import TableIndex

__all__ = [
    "BinaryIndex",
    "Cascade",
    "FlatIndex",
    "HammingBallIndex",
    "IVFIndex",
    "MinHashLSHIndex",
    "MultiIndexHashing",
    "PermutationIndex",
    "ResidualIVFIndex",
    "TableIndex",
    "available_indexes",
    "make_index",
    "register_index",
]
