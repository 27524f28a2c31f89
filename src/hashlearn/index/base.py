"""What every binary-code index shares: the faiss-like API, validation, ids, threads.

Conventions (all indexes):

* ``search(queries, k) -> (D, I)``: ``D`` int32 Hamming distances and ``I`` int64 ids, both
  ``(m, k)``, sorted by (distance, id); fewer than ``k`` results pad with ``-1`` / ``-1``.
* ``range_search(queries, radius) -> (lims, D, I)`` in CSR form, like faiss: the results of
  query ``i`` are ``D[lims[i]:lims[i+1]]``. **Radius means distance <= radius**, as in the
  papers; faiss's ``range_search`` means ``< radius``, so pass ``radius - 1`` here for the
  same results.
* ``remove(ids)`` never renumbers the remaining ids (faiss's flat index does).
* ids are distinct non-negative int64; ``add`` without ids numbers from one past the largest
  id ever added.
"""

from __future__ import annotations

import numpy as np

from hashlearn._validation import check_codes, check_int
from hashlearn.io import Persistable

__all__ = ["BinaryIndex", "register_index", "make_index", "available_indexes"]

_INDEXES: dict[str, type[BinaryIndex]] = {}


def register_index(name: str):
    """Class decorator: make an index constructible as ``make_index(name, ...)``."""

    def decorate(cls):
        _INDEXES[name] = cls
        cls.registry_name = name
        return cls

    return decorate


def make_index(name: str, n_bits: int, **params) -> BinaryIndex:
    """Build an index by registry name, e.g. ``make_index("flat", n_bits=64)``."""
    try:
        cls = _INDEXES[name]
    except KeyError:
        raise ValueError(f"Unknown index {name!r}; available: {sorted(_INDEXES)}.") from None
    return cls(n_bits, **params)


def available_indexes() -> list[str]:
    """Registry names accepted by :func:`make_index`."""
    return sorted(_INDEXES)


class BinaryIndex(Persistable):
    """Base class of indexes over packed binary codes of ``n_bits`` bits."""

    registry_name = ""

    def __init__(self, n_bits: int):
        self.n_bits = check_int(n_bits, "n_bits", type(self).__name__)

    @property
    def code_size(self) -> int:
        """Bytes per packed code."""
        return (self.n_bits + 7) // 8

    # subclasses provide: __len__, ids, add, search, range_search, remove, _get_state,
    # _from_state.

    def __len__(self) -> int:  # pragma: no cover - abstract
        raise NotImplementedError

    def _check_queries(self, queries) -> np.ndarray:
        return check_codes(queries, self.n_bits, "queries")

    def _check_k(self, k) -> int:
        return check_int(k, "k", f"{type(self).__name__}.search")

    def _check_radius(self, radius) -> int:
        return check_int(
            radius, "radius", f"{type(self).__name__}.range_search", low=0, high=self.n_bits
        )

    def __repr__(self) -> str:
        return f"{type(self).__name__}(n_bits={self.n_bits}, ntotal={len(self)})"
