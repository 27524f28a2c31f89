"""Hash function families: each a scikit-learn estimator with ``fit`` / ``encode``."""

from hashlearn.hashers.base import BaseHasher, available_hashers, make_hasher, register_hasher
from hashlearn.hashers.lsh import RandomHyperplaneLSH

__all__ = ["BaseHasher", "RandomHyperplaneLSH", "available_hashers", "make_hasher",
           "register_hasher"]
