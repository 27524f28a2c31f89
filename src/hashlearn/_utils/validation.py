"""Input validation shared by every public entry point.

Errors follow scikit-learn's wording: they name the argument, say what was expected and
what came. Nothing here coerces silently: a float array where codes are expected is an
error, not a cast.
"""

from __future__ import annotations

import functools
import math
import numbers
import os
import warnings
from typing import Any

import numpy as np

__all__ = [
    "K_MAX",
    "as_plain_array",
    "check_int",
    "check_k",
    "check_real",
    "check_codes",
    "check_ids",
    "check_y",
    "n_bytes_for",
    "DEPRECATED",
    "renamed_param",
]

#: Largest ``k`` any search accepts: result positions are int32-addressable in the kernels.
K_MAX = 2**31 - 1


#: default of a constructor parameter's old name after a rename, kept for one release
DEPRECATED = "deprecated"


def renamed_param(estimator: Any, old: str, new: str) -> Any:
    """The value of parameter ``new`` of ``estimator``, formerly called ``old``.

    For one release after a rename the constructor keeps ``old`` (default
    :data:`DEPRECATED`): when it was set, its value wins and a ``DeprecationWarning`` says
    to pass ``new`` instead. Call it in ``fit``, never in ``__init__``.
    """
    value = getattr(estimator, old, DEPRECATED)
    if isinstance(value, str) and value == DEPRECATED:
        return getattr(estimator, new)
    warnings.warn(
        f"The '{old}' parameter of {type(estimator).__name__} is renamed '{new}'; '{old}' "
        f"will be removed in the next release. Pass {new}={value!r} instead.",
        DeprecationWarning,
        stacklevel=3,
    )
    return value


def check_y(y: Any, n_samples: int) -> np.ndarray | None:
    """``y`` as an array of one label (or target) per row of ``X``; ``None`` stays ``None``."""
    if y is None:
        return None
    y = np.asarray(y)
    if y.shape != (n_samples,):
        raise ValueError(
            f"y must have shape ({n_samples},), one label per row of X. Got shape {y.shape}."
        )
    return y


def n_bytes_for(n_bits: int) -> int:
    """Bytes a packed code of ``n_bits`` bits occupies (the last byte zero-padded)."""
    return (int(n_bits) + 7) // 8


def check_int(
    value: Any, name: str, owner: str, *, low: int | None = 1, high: int | None = None
) -> int:
    """Validate an integer parameter in ``[low, high]`` and return it as ``int``."""
    lo = "-inf" if low is None else str(low)
    hi = "inf" if high is None else str(high)
    ok = isinstance(value, numbers.Integral) and not isinstance(value, bool)
    if ok and ((low is not None and value < low) or (high is not None and value > high)):
        ok = False
    if not ok:
        raise ValueError(
            f"The {name!r} parameter of {owner} must be an int in the range [{lo}, {hi}]. "
            f"Got {value!r} instead."
        )
    return int(value)


def check_real(
    value: Any,
    name: str,
    owner: str,
    *,
    low: float | None = None,
    high: float | None = None,
    low_open: bool = False,
) -> float:
    """Validate a finite real parameter in ``[low, high]`` (``(low, high]`` if ``low_open``)."""
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if ok and low is not None and (value <= low if low_open else value < low):
        ok = False
    if ok and high is not None and value > high:
        ok = False
    if not ok:
        left = "(" if low_open else "["
        lo = "-inf" if low is None else str(low)
        hi = "inf" if high is None else str(high)
        raise ValueError(
            f"The {name!r} parameter of {owner} must be a finite float in the range "
            f"{left}{lo}, {hi}]. Got {value!r} instead."
        )
    return float(value)


@functools.cache  # two sysconf calls were a fifth of a one-query search's overhead
def _physical_memory() -> int | None:
    """Bytes of physical memory, or None where the platform does not say."""
    try:
        return int(os.sysconf("SC_PHYS_PAGES")) * int(os.sysconf("SC_PAGE_SIZE"))
    except (AttributeError, ValueError, OSError):
        return None


def check_k(k: Any, n_queries: int, owner: str = "search", *, bytes_per_result: int = 12) -> int:
    """Validate the number of neighbours ``k`` of a search over ``n_queries`` queries.

    ``k`` must be an int in ``[1, K_MAX]`` (``K_MAX = 2**31 - 1``), and the result arrays,
    ``n_queries * k * bytes_per_result`` bytes (12 for int32 distances + int64 ids), must
    fit in the machine's physical memory; otherwise a ``ValueError`` naming ``k`` is
    raised before anything is allocated (instead of a ``MemoryError`` naming nothing).
    ``k`` larger than the index is fine: rows are padded with ``-1``.
    """
    k = check_int(k, "k", owner, low=1, high=K_MAX)
    n_queries = int(n_queries)
    need = n_queries * k * int(bytes_per_result)
    memory = _physical_memory()
    if memory is not None and need > memory:
        raise ValueError(
            f"The 'k' parameter of {owner} is too large: k={k} for {n_queries} queries needs "
            f"{need / 2**30:.1f} GiB of results ({bytes_per_result} bytes each), more than "
            f"this machine's {memory / 2**30:.1f} GiB of memory. Search with a smaller k or "
            "fewer queries at a time."
        )
    return k


def as_plain_array(X: Any, name: str) -> Any:
    """``X`` as a plain ``numpy.ndarray`` when it is an ndarray subclass; else unchanged.

    ``np.matrix`` (and any other subclass, e.g. ``np.memmap``) becomes a base-class view of
    the same data, so row indexing and reshapes behave like an ndarray's. A masked array
    is accepted only when nothing is masked (its data is used); masked entries raise a
    ``ValueError``, since no value can stand in for them.
    """
    if not isinstance(X, np.ndarray) or type(X) is np.ndarray:
        return X
    if isinstance(X, np.ma.MaskedArray):
        mask = np.ma.getmask(X)
        if mask is not np.ma.nomask and np.any(mask):
            raise ValueError(
                f"{name} is a masked array with {int(np.count_nonzero(mask))} masked "
                "value(s); fill them (X.filled(value)) or drop those rows first."
            )
        return np.asarray(np.ma.getdata(X))
    return np.asarray(X)


def check_codes(
    codes: Any, n_bits: int, name: str = "codes", *, allow_empty: bool = True
) -> np.ndarray:
    """Validate packed binary codes: a 2-D ``uint8`` array of width ``ceil(n_bits / 8)``.

    The padding bits above ``n_bits`` in the last byte must be zero, otherwise Hamming
    distances would count bits that are not part of the code. ndarray subclasses are
    converted by :func:`as_plain_array` (``np.matrix``) or refused (masked values); the
    returned array is always a plain ``numpy.ndarray``.
    """
    codes = as_plain_array(codes, name)
    if not isinstance(codes, np.ndarray):
        raise TypeError(
            f"{name} must be a numpy.ndarray of dtype uint8 (packed bits, LSB first). "
            f"Got {type(codes).__name__} instead."
        )
    if codes.dtype != np.uint8:
        raise TypeError(
            f"{name} must have dtype uint8 (packed bits, see hashlearn.codes.pack_bits). "
            f"Got dtype {codes.dtype} instead."
        )
    width = n_bytes_for(n_bits)
    if codes.ndim != 2:
        hint = " Use codes.reshape(1, -1) for a single code." if codes.ndim == 1 else ""
        raise ValueError(
            f"{name} must be a 2-D array of shape (n, {width}) for {n_bits}-bit codes. "
            f"Got an array with {codes.ndim} dimension(s), shape {codes.shape}.{hint}"
        )
    if codes.shape[1] != width:
        raise ValueError(
            f"{name} has {codes.shape[1]} bytes per code; {n_bits}-bit codes take {width} "
            f"bytes. Got shape {codes.shape}."
        )
    if not allow_empty and codes.shape[0] == 0:
        raise ValueError(f"{name} must contain at least one code. Got shape {codes.shape}.")
    spare = width * 8 - n_bits
    if spare and codes.shape[0]:
        mask = np.uint8((0xFF << (8 - spare)) & 0xFF)
        if np.any(codes[:, -1] & mask):
            raise ValueError(
                f"{name} has non-zero padding bits: bits {n_bits}..{width * 8 - 1} of the last "
                f"byte must be 0 for {n_bits}-bit codes (LSB-first layout). Codes packed "
                "MSB first (numpy's default packbits) can be converted with "
                "hashlearn.codes.from_msb_first."
            )
    return codes


def check_ids(ids: Any, n: int, name: str = "ids") -> np.ndarray:
    """Validate external ids: ``n`` distinct non-negative integers, returned as int64."""
    arr = np.asarray(as_plain_array(ids, name))
    if arr.ndim != 1 or arr.shape[0] != n:
        raise ValueError(f"{name} must be a 1-D array of length {n}. Got shape {arr.shape}.")
    if n and not np.issubdtype(arr.dtype, np.integer):
        raise TypeError(f"{name} must contain integers. Got dtype {arr.dtype}.")
    arr = arr.astype(np.int64, copy=False)
    if n and arr.min() < 0:
        raise ValueError(
            f"{name} must be non-negative (-1 marks a missing result). Got min {arr.min()}."
        )
    if n > 1:
        sorted_ids = np.sort(arr)
        dup = sorted_ids[1:][sorted_ids[1:] == sorted_ids[:-1]]
        if dup.size:
            raise ValueError(f"{name} contains duplicates, e.g. {int(dup[0])}.")
    return arr
