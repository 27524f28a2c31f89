"""Dense linear-algebra loops shared by numba kernels (ITML's projections, MLH's training,
the boosted search forest's Lanczos steps): one home for the dot product, the
matrix-vector product and the rank-one update. Written as loops: numba compiles array
expressions (``a[:] = b``, ``np.sum(a * b)``) much more slowly.

Those three reorder their sums (``fastmath`` ``reassoc`` and ``contract``: vectorised,
fused multiply-adds), so results agree with numpy to rounding, not to the last bit.
:func:`row_dot` is the exception: one fixed order of operations, the same bits on every CPU,
for results that must not move (the search forest's split scores).
"""

from __future__ import annotations

import numba
from llvmlite import ir
from numba import types
from numba.core import cgutils
from numba.extending import intrinsic, overload

__all__ = ["dot", "matvec", "rank_one_update", "row_dot"]


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def dot(x, y):
    """``x^T y`` for vectors of equal length."""
    s = 0.0
    for i in range(x.shape[0]):
        s += x[i] * y[i]
    return s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def matvec(M, x, out):
    """``out = M x`` for ``M`` (q, d), ``x`` (d,), ``out`` (q,)."""
    q, d = M.shape
    for k in range(q):
        s = 0.0
        for t in range(d):
            s += M[k, t] * x[t]
        out[k] = s


@numba.njit(cache=True, nogil=True, fastmath={"reassoc", "contract"})
def rank_one_update(M, scale, x, y):
    """``M += scale * x y^T`` in place for ``M`` (q, d), ``x`` (q,), ``y`` (d,)."""
    q, d = M.shape
    for k in range(q):
        sk = scale * x[k]
        for t in range(d):
            M[k, t] += sk * y[t]


@intrinsic
def _four_lane_sums(typingctx, a, a_start, b, b_start, n):
    """``(s0, s1, s2, s3)`` with ``s_l = sum of a.flat[a_start + j] * b.flat[b_start + j]``
    over ``j = l, l + 4, ... < n`` (``n`` a multiple of 4; C-contiguous float64 arrays):
    each product rounded, each lane summed in increasing ``j``, no fused multiply-add. As
    LLVM IR on ``<4 x double>`` vectors, which every x86-64 CPU computes lane by lane in
    exactly that order (one AVX instruction, two SSE2 ones)."""
    result = types.UniTuple(types.float64, 4)
    sig = result(a, a_start, b, b_start, n)

    def codegen(context, builder, signature, args):
        vector = ir.VectorType(ir.DoubleType(), 4)
        i64 = ir.IntType(64)
        a_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        b_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        acc = cgutils.alloca_once_value(builder, ir.Constant(vector, [0.0] * 4))
        with cgutils.for_range(builder, builder.udiv(args[4], ir.Constant(i64, 4))) as loop:
            j = builder.mul(loop.index, ir.Constant(i64, 4))
            loaded = []
            for data, start in ((a_data, args[1]), (b_data, args[3])):
                ptr = builder.gep(data, [builder.add(start, j)])
                loaded.append(builder.load(builder.bitcast(ptr, vector.as_pointer()), align=8))
            builder.store(builder.fadd(builder.load(acc), builder.fmul(*loaded)), acc)
        total = builder.load(acc)
        lanes = [builder.extract_element(total, ir.Constant(ir.IntType(32), k)) for k in range(4)]
        return context.make_tuple(builder, result, lanes)

    return sig, codegen


def row_dot(A, a_row, B, b_row):  # pragma: no cover - compiled through the overload
    """``A[a_row] . B[b_row]`` (2-D float64, equal widths) in one fixed order: four partial
    sums over the columns ``j = l mod 4`` (``l = 0..3``, the leftover columns into the
    first), each product rounded, combined as ``(s0 + s1) + (s2 + s3)``. Bit-identical on
    every CPU and to the plain loop it replaced; vectorised for C-contiguous arrays (about
    2.5x faster at 64 columns), a scalar loop otherwise."""
    raise NotImplementedError("row_dot is for numba kernels")


@overload(row_dot, inline="always")
def _row_dot_impl(A, a_row, B, b_row):
    if A.layout == "C" and B.layout == "C":

        def vectorised(A, a_row, B, b_row):
            d = A.shape[1]
            n4 = d - d % 4
            s0, s1, s2, s3 = _four_lane_sums(A, a_row * d, B, b_row * d, n4)
            for j in range(n4, d):
                s0 += A[a_row, j] * B[b_row, j]
            return (s0 + s1) + (s2 + s3)

        return vectorised

    def loop(A, a_row, B, b_row):
        d = A.shape[1]
        s0 = s1 = s2 = s3 = 0.0
        j = 0
        while j + 4 <= d:
            s0 += A[a_row, j] * B[b_row, j]
            s1 += A[a_row, j + 1] * B[b_row, j + 1]
            s2 += A[a_row, j + 2] * B[b_row, j + 2]
            s3 += A[a_row, j + 3] * B[b_row, j + 3]
            j += 4
        while j < d:
            s0 += A[a_row, j] * B[b_row, j]
            j += 1
        return (s0 + s1) + (s2 + s3)

    return loop
