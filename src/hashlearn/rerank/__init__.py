"""Refinement: exact rescoring of candidates (dense, CSR) and the screens that prune it.

:class:`~hashlearn.rerank.refiner.Refiner` is the one entry point (it owns a
:class:`~hashlearn.rerank.store.VectorStore` and picks the kernel path); the kernels live in
the private modules beside it.
"""

from hashlearn.rerank.refiner import Refiner, available_rerankers, register_reranker
from hashlearn.rerank.store import VectorStore

__all__ = ["Refiner", "VectorStore", "available_rerankers", "register_reranker"]
