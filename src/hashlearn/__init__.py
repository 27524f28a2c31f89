"""hashlearn: learned hashing and fast similarity search.

Learn binary codes from data (``hashlearn.hashers``), index a database of codes
(``hashlearn.index``), search it, re-rank (``Searcher``) and evaluate against exact ground
truth (``hashlearn.evaluate``). See ``DESIGN.md`` for how the papers map to modules.
"""

from hashlearn import codes, datasets, evaluate, io
from hashlearn.codes import hamming_cdist, hamming_distance, pack_bits, unpack_bits
from hashlearn.datasets import load_digits, load_fashion_mnist
from hashlearn.hashers import BaseHasher, RandomHyperplaneLSH, make_hasher
from hashlearn.index import FlatIndex, make_index
from hashlearn.io import load, save
from hashlearn.search import Searcher

__version__ = "0.1.0"

__all__ = [
    "BaseHasher",
    "FlatIndex",
    "RandomHyperplaneLSH",
    "Searcher",
    "codes",
    "datasets",
    "evaluate",
    "hamming_cdist",
    "hamming_distance",
    "io",
    "load",
    "load_digits",
    "load_fashion_mnist",
    "make_hasher",
    "make_index",
    "pack_bits",
    "save",
    "unpack_bits",
]
