"""Input validation shared by every public entry point.

Errors follow scikit-learn's wording: they name the argument, say what was expected and
what came. Nothing here coerces silently: a float array where codes are expected is an
error, not a cast.
"""

from __future__ import annotations

import numbers
from typing import Any

import numpy as np

__all__ = [
    "check_int",
    "check_real",
    "check_codes",
    "check_ids",
    "n_bytes_for",
]


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
    ok = isinstance(value, numbers.Real) and not isinstance(value, bool) and np.isfinite(value)
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


def check_codes(
    codes: Any, n_bits: int, name: str = "codes", *, allow_empty: bool = True
) -> np.ndarray:
    """Validate packed binary codes: a 2-D ``uint8`` array of width ``ceil(n_bits / 8)``.

    The padding bits above ``n_bits`` in the last byte must be zero, otherwise Hamming
    distances would count bits that are not part of the code.
    """
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
    arr = np.asarray(ids)
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
