"""How arrays are handed to numba kernels: one array type per argument.

numba compiles a kernel once per combination of argument types, and an array's type
includes its layout and whether it is writable: the same kernel called with a C-ordered
array, an F-ordered one and a read-only memory map compiles three times (seconds each on a
fresh installation). :func:`frozen` gives every caller the same type for a kernel's
*inputs*: C-ordered and read-only.
"""

from __future__ import annotations

import numpy as np

__all__ = ["frozen"]


def frozen(a, dtype) -> np.ndarray:
    """``a`` as a C-ordered, read-only array of ``dtype``: a read-only view when it already
    is C-ordered ``dtype`` (no copy; the caller's array stays writable), else a copy."""
    view = np.ascontiguousarray(a, dtype=dtype).view()
    view.flags.writeable = False
    return view
