"""Population counts of XORed code words: the Hamming distance primitives of every kernel.

Codes are C-contiguous ``uint64`` word arrays (see :mod:`hashlearn._utils.primitives`). Two
primitives, both numba intrinsics so they inline into the kernels that call them:

* :func:`popcount64` -- one word, LLVM's scalar ``ctpop`` (one POPCNT instruction);
* :func:`code_distance` -- a whole code: the words go through LLVM's *vector* ``ctpop`` 8 at
  a time (one 512-bit XOR, one ``VPOPCNTQ`` and one horizontal sum on a CPU with
  AVX-512 VPOPCNTDQ), then word by word for the rest.

The vector form is plain LLVM IR, not an instruction: LLVM lowers it to whatever the CPU
numba compiles for has -- ``VPOPCNTQ`` with AVX-512 VPOPCNTDQ, a ``PSHUFB`` nibble table
with AVX2 or SSSE3, scalar POPCNTs otherwise -- so the same kernel is exact everywhere and
fast where the hardware allows. ``tests/test_popcount.py`` checks both the host build and
a build for a generic x86-64 CPU (``NUMBA_CPU_NAME=generic``) against numpy.
"""

from __future__ import annotations

import numpy as np
from llvmlite import ir
from numba import njit
from numba.core import cgutils, types
from numba.extending import intrinsic

__all__ = ["popcount64", "trailing_zeros64", "leading_zeros64", "code_distance"]

_U0 = np.uint64(0)
_U1 = np.uint64(1)
_U8 = np.uint64(8)


@intrinsic
def popcount64(typingctx, x):
    """Population count of a uint64 through LLVM's ``ctpop`` (one POPCNT instruction)."""
    sig = types.int64(types.uint64)

    def codegen(context, builder, signature, args):
        fn = builder.module.declare_intrinsic("llvm.ctpop", [ir.IntType(64)])
        return builder.call(fn, args)

    return sig, codegen


def _zero_count(llvm_name: str, doc: str):
    """An intrinsic ``f(x: uint64) -> int64`` calling LLVM's ``llvm_name`` (``cttz`` or
    ``ctlz``) with ``x`` known nonzero (one TZCNT/BSF or LZCNT/BSR)."""

    @intrinsic
    def zero_count(typingctx, x):
        sig = types.int64(types.uint64)

        def codegen(context, builder, signature, args):
            i64 = ir.IntType(64)
            fn = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(i64, [i64, ir.IntType(1)]), llvm_name
            )
            return builder.call(fn, [args[0], ir.Constant(ir.IntType(1), 1)])

        return sig, codegen

    zero_count.__doc__ = doc
    return zero_count


trailing_zeros64 = _zero_count("llvm.cttz.i64", "Index of the lowest set bit of a nonzero uint64.")
leading_zeros64 = _zero_count(
    "llvm.ctlz.i64", "Number of zero bits above the highest set bit of a nonzero uint64."
)


def _vector_xor_popcount(lanes: int):
    """An intrinsic ``f(a, ao, b, bo) = sum(popcount(a[ao:ao+lanes] ^ b[bo:bo+lanes]))``.

    ``a`` and ``b`` are uint64 arrays, ``ao`` and ``bo`` word offsets (callers guarantee
    ``lanes`` words from each); one unaligned vector load of each, a vector XOR, LLVM's
    ``llvm.ctpop.v<lanes>i64`` and ``llvm.vector.reduce.add``.
    """
    vector = ir.VectorType(ir.IntType(64), lanes)

    @intrinsic
    def xor_popcount(typingctx, a, ao, b, bo):
        sig = types.int64(a, ao, b, bo)

        def codegen(context, builder, signature, args):
            loaded = []
            for array_type, array, offset in (
                (signature.args[0], args[0], args[1]),
                (signature.args[2], args[2], args[3]),
            ):
                data = context.make_array(array_type)(context, builder, array).data
                ptr = builder.bitcast(builder.gep(data, [offset]), vector.as_pointer())
                loaded.append(builder.load(ptr, align=8))
            ctpop = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vector, [vector]), f"llvm.ctpop.v{lanes}i64"
            )
            total = cgutils.get_or_insert_function(
                builder.module,
                ir.FunctionType(ir.IntType(64), [vector]),
                f"llvm.vector.reduce.add.v{lanes}i64",
            )
            counts = builder.call(ctpop, [builder.xor(loaded[0], loaded[1])])
            return builder.call(total, [counts])

        return sig, codegen

    return xor_popcount


xor_popcount8 = _vector_xor_popcount(8)


@njit(nogil=True, inline="always")
def code_distance(a, ao, b, bo, n_words):
    """Hamming distance between ``a[ao:ao+W]`` and ``b[bo:bo+W]`` (uint64 word arrays).

    ``ao`` and ``bo`` must be ``np.uint64`` (numba turns a uint64 + int64 sum into a float).
    With ``n_words`` a compile-time constant the loops unroll completely.
    """
    d = 0
    w = _U0
    end = np.uint64(n_words)
    while w + _U8 <= end:
        d += xor_popcount8(a, ao + w, b, bo + w)
        w += _U8
    while w < end:
        d += popcount64(a[ao + w] ^ b[bo + w])
        w += _U1
    return d
