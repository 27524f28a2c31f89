"""Search structures over binary codes (and, later, integer bucket keys).

All indexes follow :mod:`hashlearn.index.base`'s faiss-like conventions and are built by
name through :func:`make_index`.
"""

from hashlearn.index.base import BinaryIndex, available_indexes, make_index, register_index
from hashlearn.index.flat import FlatIndex

__all__ = ["BinaryIndex", "FlatIndex", "available_indexes", "make_index", "register_index"]
