"""Learned metrics: ITML (explicit d x d Mahalanobis) and its kernelized form.

Jain, Kulis & Grauman, "Fast similarity search for learned metrics", Sec. 3.1 and 3.2.2.
"""

from hashlearn.metric.itml import ITML
from hashlearn.metric.kernel_itml import KernelITML

__all__ = ["ITML", "KernelITML"]
