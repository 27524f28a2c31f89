"""Packed binary codes and Hamming distances.

Layout (the same as faiss's binary indexes, so codes move between the two unchanged):
a code of ``b`` bits is ``ceil(b / 8)`` bytes; bit ``j`` lives in byte ``j // 8`` at bit
``j % 8``, least significant bit first; unused bits of the last byte are zero.

numpy's default ``np.packbits`` (and e.g. usearch) packs the *most* significant bit first;
:func:`from_msb_first` / :func:`to_msb_first` convert between the two.
"""

from __future__ import annotations

import numpy as np

from hashlearn._utils import range_scan as _range_scan
from hashlearn._utils.parallel import parallel_chunks
from hashlearn._utils.validation import check_codes, check_int, n_bytes_for

__all__ = [
    "n_bytes_for",
    "pack_bits",
    "unpack_bits",
    "from_msb_first",
    "to_msb_first",
    "hamming_distance",
    "hamming_cdist",
    "as_words",
]

_POPCOUNT8 = np.array([bin(v).count("1") for v in range(256)], dtype=np.uint8)
_REVERSE8 = np.array([int(f"{v:08b}"[::-1], 2) for v in range(256)], dtype=np.uint8)


def pack_bits(bits) -> np.ndarray:
    """Pack an ``(n, b)`` array of 0/1 (or bool) into ``uint8`` codes ``(n, ceil(b/8))``.

    Bit ``j`` goes to byte ``j // 8``, bit ``j % 8`` (LSB first); padding bits are 0.
    """
    arr = np.asarray(bits)
    if arr.ndim != 2:
        raise ValueError(f"bits must be a 2-D array (n, n_bits). Got shape {arr.shape}.")
    if arr.dtype != np.bool_:
        if not (np.issubdtype(arr.dtype, np.integer) or np.issubdtype(arr.dtype, np.floating)):
            raise TypeError(f"bits must be bool or numeric 0/1. Got dtype {arr.dtype}.")
        if arr.size and not np.isin(arr, (0, 1)).all():
            raise ValueError("bits must contain only 0 and 1 (or booleans).")
        arr = arr.astype(np.bool_)
    return np.packbits(arr, axis=1, bitorder="little")


def unpack_bits(codes: np.ndarray, n_bits: int) -> np.ndarray:
    """Inverse of :func:`pack_bits`: ``(n, n_bits)`` array of ``uint8`` 0/1."""
    n_bits = check_int(n_bits, "n_bits", "unpack_bits")
    check_codes(codes, n_bits)
    return np.unpackbits(codes, axis=1, count=n_bits, bitorder="little")


def from_msb_first(codes: np.ndarray, n_bits: int) -> np.ndarray:
    """Convert codes packed most-significant-bit first (``np.packbits`` default) to LSB first.

    In MSB-first packing bit ``j`` sits at position ``7 - j % 8`` of byte ``j // 8``;
    reversing the bits of every byte moves it to ``j % 8``, for any code length.
    """
    n_bits = check_int(n_bits, "n_bits", "from_msb_first")
    if not isinstance(codes, np.ndarray) or codes.dtype != np.uint8:
        raise TypeError("codes must be a numpy.ndarray of dtype uint8.")
    return check_codes(_REVERSE8[codes], n_bits)


def to_msb_first(codes: np.ndarray, n_bits: int) -> np.ndarray:
    """Convert hashlearn (LSB-first) codes to numpy's default MSB-first packing."""
    n_bits = check_int(n_bits, "n_bits", "to_msb_first")
    check_codes(codes, n_bits)
    return _REVERSE8[codes]


def hamming_distance(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """Hamming distances between packed codes, broadcasting over leading dimensions.

    ``a`` of shape ``(n_bytes,)`` against ``b`` of shape ``(n, n_bytes)`` gives the one-to-many
    distances ``(n,)``; two ``(n, n_bytes)`` arrays give the row-wise distances.
    """
    for name, arr in (("a", a), ("b", b)):
        if not isinstance(arr, np.ndarray) or arr.dtype != np.uint8:
            raise TypeError(f"{name} must be a numpy.ndarray of dtype uint8 (packed codes).")
    if a.shape[-1:] != b.shape[-1:]:
        raise ValueError(
            f"a and b must have the same number of bytes per code. Got {a.shape} and {b.shape}."
        )
    return _POPCOUNT8[np.bitwise_xor(a, b)].sum(axis=-1, dtype=np.int32)


def as_words(codes: np.ndarray) -> np.ndarray:
    """View packed ``uint8`` codes as a flat C-contiguous ``uint64`` word array.

    Each code is zero-padded to a whole number of 64-bit words; no copy when the width is
    already a multiple of 8 bytes and the array is C-contiguous.
    """
    n, width = codes.shape
    n_words = max(1, (width + 7) // 8)
    if width == n_words * 8 and codes.flags.c_contiguous:
        return codes.reshape(-1).view(np.uint64)
    padded = np.zeros((n, n_words * 8), dtype=np.uint8)
    padded[:, :width] = codes
    return padded.reshape(-1).view(np.uint64)


def hamming_cdist(a: np.ndarray, b: np.ndarray, n_bits: int | None = None) -> np.ndarray:
    """All pairwise Hamming distances: ``(m, n)`` int32 for codes ``a`` (m) and ``b`` (n)."""
    if n_bits is None:
        if not isinstance(a, np.ndarray) or a.ndim != 2:
            raise ValueError("a must be a 2-D uint8 array of packed codes.")
        n_bits = a.shape[1] * 8
    n_bits = check_int(n_bits, "n_bits", "hamming_cdist")
    check_codes(a, n_bits, "a")
    check_codes(b, n_bits, "b")
    out = np.empty((a.shape[0], b.shape[0]), dtype=np.int32)
    if out.size:
        n_words = (n_bytes_for(n_bits) + 7) // 8
        a_words, b_words = as_words(a), as_words(b)
        parallel_chunks(
            lambda start, stop: _range_scan.hamming_cdist(
                a_words, b_words, n_words, out, start, stop
            ),
            out.shape[0],
            None,
        )
    return out
