"""Kernel functions for kernel-based hashing and metric learning, validated.

A kernel :math:`\\kappa(x, y) = \\phi(x)^T \\phi(y)` is an inner product in a (possibly
implicit) feature space. Kernelized LSH (Grauman & Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013 §4.3, eqs. 24-32) needs
only kernel values between the input and a small sample, so any Mercer kernel works,
including kernels on non-vector objects (sets, strings, graphs).

Kernels by name (all on dense float rows):

* ``"linear"``: :math:`x^T y`;
* ``"rbf"``: :math:`\\exp(-\\gamma \\|x - y\\|^2)` (``gamma=None``: ``1 / (d \\cdot
  \\mathrm{Var}(X))``, scikit-learn's ``"scale"``, fixed at fit time by the caller);
* ``"chi2"``: exponential :math:`\\chi^2`, :math:`\\exp(-\\gamma \\sum_i (x_i - y_i)^2 /
  (x_i + y_i))` for non-negative histograms (the image kernel of survey Fig. 16);
* ``"intersection"``: histogram intersection :math:`\\sum_i \\min(x_i, y_i)` (non-negative).

Or a callable ``kernel(a, b) -> float`` on the user's own objects (evaluated pair by pair,
so keep the sample small), or ``"precomputed"`` (the caller passes kernel matrices).
Kernel matrices are checked: finite everywhere, and symmetric when a set is compared with
itself (:func:`check_kernel_matrix`).

:func:`log_message` is the progress log of the kernel and metric-learning estimators whose
fits can take more than a few seconds (their ``verbose`` parameter): messages go to
``logging.getLogger("hashlearn")``.
"""

from __future__ import annotations

import logging
import sys
from collections.abc import Callable, Sequence
from typing import Any

import numpy as np
from sklearn.metrics.pairwise import (
    chi2_kernel,
    linear_kernel,
    rbf_kernel,
)

__all__ = [
    "KERNELS",
    "check_kernel",
    "kernel_matrix",
    "check_kernel_matrix",
    "intersection_kernel",
    "default_gamma",
    "log_message",
]

LOGGER = logging.getLogger("hashlearn")


def log_message(verbose: bool | int, message: str, *args: Any) -> None:
    """Progress message of a long fit, to the ``"hashlearn"`` logger.

    ``verbose=False``: logged at DEBUG level (shown only if the application asks for it).
    ``verbose=True``: logged at INFO level; when that logger would not show INFO messages
    (no handler configured, or a higher level), the message is written to stderr instead, so
    ``verbose=True`` is always visible.
    """
    if not verbose:
        LOGGER.debug(message, *args)
    elif LOGGER.isEnabledFor(logging.INFO) and LOGGER.hasHandlers():
        LOGGER.info(message, *args)
    else:
        print("[hashlearn] " + (message % args if args else message), file=sys.stderr)


KERNELS = ("linear", "rbf", "chi2", "intersection", "precomputed")


def intersection_kernel(X: np.ndarray, Y: np.ndarray, *, block: int = 256) -> np.ndarray:
    """Histogram intersection :math:`K_{ij} = \\sum_k \\min(X_{ik}, Y_{jk})`, blocked."""
    out = np.empty((X.shape[0], Y.shape[0]), dtype=np.float64)
    for start in range(0, X.shape[0], block):
        stop = min(start + block, X.shape[0])
        out[start:stop] = np.minimum(X[start:stop, None, :], Y[None, :, :]).sum(axis=2)
    return out


def default_gamma(X: np.ndarray) -> float:
    """scikit-learn's ``gamma="scale"``: ``1 / (n_features * X.var())`` (1.0 if X is constant)."""
    var = float(np.var(X))
    return 1.0 / (X.shape[1] * var) if var > 0 else 1.0


def check_kernel(kernel: Any, owner: str) -> str | Callable:
    """Validate a kernel argument: one of :data:`KERNELS` or a callable."""
    if callable(kernel):
        return kernel
    if isinstance(kernel, str) and kernel in KERNELS:
        return kernel
    raise ValueError(
        f"The 'kernel' parameter of {owner} must be a str among {list(KERNELS)} "
        f"or a callable kernel(a, b) -> float. Got {kernel!r} instead."
    )


def check_kernel_matrix(
    K: Any,
    name: str,
    owner: str,
    *,
    symmetric: bool = False,
    shape: tuple[int | None, int | None] = (None, None),
) -> np.ndarray:
    """A finite float64 kernel matrix; ``symmetric=True`` also checks ``K == K.T``."""
    K = np.asarray(K, dtype=np.float64)
    if K.ndim != 2:
        raise ValueError(f"{name} of {owner} must be a 2-D kernel matrix. Got shape {K.shape}.")
    for axis, want in enumerate(shape):
        if want is not None and K.shape[axis] != want:
            raise ValueError(
                f"{name} of {owner} must have {want} "
                f"{'rows' if axis == 0 else 'columns'}. Got shape {K.shape}."
            )
    if not np.all(np.isfinite(K)):
        raise ValueError(
            f"{name} of {owner} contains NaN or infinite kernel values "
            f"({int(np.count_nonzero(~np.isfinite(K)))} entries)."
        )
    if symmetric:
        if K.shape[0] != K.shape[1]:
            raise ValueError(f"{name} of {owner} must be square. Got shape {K.shape}.")
        scale = max(float(np.abs(K).max(initial=0.0)), 1e-300)
        asym = float(np.abs(K - K.T).max(initial=0.0))
        if asym > 1e-8 * scale:
            raise ValueError(
                f"{name} of {owner} is not symmetric: max |K - K^T| = {asym:.3g} "
                f"(max |K| = {scale:.3g}); a kernel must satisfy "
                "k(a, b) == k(b, a)."
            )
    return K


def kernel_matrix(
    A: Any,
    B: Any,
    kernel: str | Callable,
    *,
    gamma: float | None = None,
    owner: str = "kernel_matrix",
) -> np.ndarray:
    """Kernel values ``K[i, j] = kernel(A[i], B[j])`` as a finite float64 matrix.

    ``A`` and ``B`` are 2-D float arrays for the named kernels, or sequences of arbitrary
    objects for a callable. ``"precomputed"`` is not evaluated here (the caller holds K).
    """
    if callable(kernel):
        a_items: Sequence = A
        b_items: Sequence = B
        K = np.empty((len(a_items), len(b_items)), dtype=np.float64)
        for i, a in enumerate(a_items):
            for j, b in enumerate(b_items):
                value = kernel(a, b)
                try:
                    K[i, j] = value
                except (TypeError, ValueError):
                    raise TypeError(
                        f"the kernel callable of {owner} must return a real number; "
                        f"got {type(value).__name__}."
                    ) from None
        return check_kernel_matrix(K, "the kernel callable's values", owner)
    if kernel == "linear":
        K = linear_kernel(A, B)
    elif kernel == "rbf":
        K = rbf_kernel(A, B, gamma=gamma)
    elif kernel in ("chi2", "intersection"):
        for name, M in (("X", A), ("sample", B)):
            if np.any(np.asarray(M) < 0):
                raise ValueError(
                    f"the {kernel!r} kernel of {owner} needs non-negative "
                    f"histograms; {name} has negative entries."
                )
        K = (
            chi2_kernel(A, B, gamma=1.0 if gamma is None else gamma)
            if kernel == "chi2"
            else intersection_kernel(np.asarray(A, np.float64), np.asarray(B, np.float64))
        )
    else:
        raise ValueError(f"kernel_matrix of {owner} cannot evaluate kernel {kernel!r}.")
    return check_kernel_matrix(K, "the kernel matrix", owner)
