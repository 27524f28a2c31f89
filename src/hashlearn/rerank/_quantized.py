"""An 8-bit copy of float vectors with a certified error per vector, for screening re-ranking
candidates before their exact distances are computed.

Scalar quantization with one step for every column: ``x_hat_j = lo_j + step * c_j`` with
``c_j`` in 0..255 (uint8), ``lo_j`` the column's smallest finite value and ``step`` the widest
column range over 255. Because the step is shared, the distance of two quantized vectors is an
integer sum, ``|q_hat - x_hat|^2 = step^2 sum_j (a_j - c_j)^2``, computed exactly (no rounding
to bound). Each vector keeps an upper bound on ``|x - x_hat|`` (its quantization error plus the
float64 rounding of computing it, ``inf`` for a vector with a non-finite value), so by the
triangle inequality ``|q - x|`` lies within ``step sqrt(sum) +- (err_q + err_x)``. Values
outside a column's range (queries) are clamped, and the clamping is part of their error: the
bound holds for any input, it is only looser.

Codes are padded with zero columns to a multiple of :data:`COLUMN_BLOCK`, so
:func:`code_sqdist` runs whole SIMD blocks (zero pads add nothing to the sum).
"""

from __future__ import annotations

from typing import NamedTuple

import numpy as np
from llvmlite import ir
from numba import njit, types
from numba.core import cgutils
from numba.extending import intrinsic

__all__ = [
    "COLUMN_BLOCK",
    "Quantized",
    "quantize",
    "quantize_row",
    "quantize_rows",
    "code_sqdist",
    "tagged_sqdist",
]

COLUMN_BLOCK = 32  # codes per SIMD block of :func:`code_sqdist`
_LEVELS = 255
#: the largest code of a uint16 copy (12 bits: a difference squared, doubled, fits 2^25, so
#: :func:`code_sqdist`'s int32 lanes hold the sums of rows up to :data:`MAX_WIDE_COLUMNS`)
WIDE_LEVELS = 4095
MAX_WIDE_COLUMNS = 4096
NO_TAG = 15  # the tag of a tagged code (:func:`tagged_sqdist`) that tells nothing
_U64 = 2.0**-53
_UNDERFLOW_ROOT = 2.0**-536  # root of twice float64's smallest subnormal
#: widest padded row :func:`code_sqdist` sums without overflowing its int32 lanes
MAX_COLUMNS = 500_000


class Quantized(NamedTuple):
    """The 8-bit copy of a float matrix (see the module docstring)."""

    codes: np.ndarray  # (n, padded d) uint8
    lo: np.ndarray  # (d,) float64, column offsets
    step: float
    err: np.ndarray  # (n,) float64, >= |x - x_hat| (inf where x is not finite)
    sqnorm: np.ndarray  # (n,) float64, |x|^2 (float64 sum)
    err_cap: float  # the largest finite err (-1 where none is)


@njit(nogil=True, cache=True)
def _column_ranges(V):  # pragma: no cover - compiled
    """Smallest and largest finite value of each column (``inf`` / ``-inf`` where none)."""
    d = V.shape[1]
    lo = np.full(d, np.inf)
    hi = np.full(d, -np.inf)
    for i in range(V.shape[0]):
        for j in range(d):
            x = np.float64(V[i, j])
            if x < lo[j] and x > -np.inf:
                lo[j] = x
            if x > hi[j] and x < np.inf:
                hi[j] = x
    return lo, hi


@njit(nogil=True, inline="always")
def quantize_row(X, i, lo, step, levels, codes, row):
    """Row ``i`` of ``X`` into ``codes[row]`` (0..``levels``); returns its error bound and
    ``|x|^2``. The bound holds for float64 sums in any order (callers may vectorise), and
    any code is valid: its error is measured."""
    d = X.shape[1]
    inv = 1.0 / step
    e = 0.0  # sum of the computed residuals squared
    mag = 0.0  # sum of (|x| + |lo| + step c)^2: the scale of the residuals' rounding
    sq = 0.0
    for j in range(d):
        x = np.float64(X[i, j])
        y = (x - lo[j]) * inv
        c = min(np.rint(y), float(levels)) if y >= 0.0 else 0.0  # NaN -> 0
        codes[row, j] = c
        r = x - (lo[j] + step * c)
        e += r * r
        m = abs(x) + abs(lo[j]) + step * c
        mag += m * m
        sq += x * x
    if not (e < np.inf and mag < np.inf):  # NaN or inf anywhere in the row
        return np.inf, sq
    # each residual is exact to 3u of its magnitude, the sum to (d + 2) u; squares that
    # underflow are each off by at most 2^-1075, which moves the root by at most
    # sqrt(d) 2^-537
    err = np.sqrt(e) * (1.0 + (d + 4) * _U64) + 4.0 * _U64 * np.sqrt(mag)
    return err + np.sqrt(d + 1.0) * _UNDERFLOW_ROOT, sq


@njit(nogil=True, cache=True, fastmath={"reassoc", "contract"})
def _quantize_rows(X, lo, step, levels, codes, err, sqnorm):  # pragma: no cover - compiled
    """Codes (0..``levels``) of the rows of ``X``, and their error bounds and squared norms
    (:func:`quantize_row`, vectorised)."""
    for i in range(X.shape[0]):
        err[i], sqnorm[i] = quantize_row(X, i, lo, step, levels, codes, i)


def quantize_rows(X: np.ndarray, lo: np.ndarray, step: float, width: int, wide: bool = False):
    """``(codes, err, sqnorm)`` of the rows of ``X`` on the grid ``(lo, step)``: uint8 codes
    (uint16 codes up to :data:`WIDE_LEVELS` with ``wide``) padded with zeros to ``width``
    columns, the bound on each row's ``|x - x_hat|`` and its ``|x|^2``. Values outside the
    grid are clamped (their error is counted)."""
    m = X.shape[0]
    codes = np.zeros((m, width), np.uint16 if wide else np.uint8)
    err = np.empty(m)
    sqnorm = np.empty(m)
    levels = float(WIDE_LEVELS if wide else _LEVELS)
    _quantize_rows(X, lo, float(step), levels, codes, err, sqnorm)
    return codes, err, sqnorm


def quantize(V: np.ndarray) -> Quantized | None:
    """The 8-bit copy of ``V`` (2-D float32/float64, C-ordered), or None where its value
    range overflows float64 or it has more than :data:`MAX_COLUMNS` columns."""
    n, d = V.shape
    width = -(-max(d, 1) // COLUMN_BLOCK) * COLUMN_BLOCK
    if width > MAX_COLUMNS:
        return None
    lo, hi = _column_ranges(V)
    empty = lo > hi  # no finite value in the column
    lo[empty] = 0.0
    with np.errstate(over="ignore", invalid="ignore"):  # an overflowing span is declined
        spans = np.where(empty, 0.0, hi - lo)
    widest = float(spans.max()) if d else 0.0
    if not np.isfinite(widest):
        return None
    step = widest / _LEVELS if widest > 0.0 else 1.0
    if not (np.isfinite(step) and step > 0.0):  # a subnormal range
        step = 1.0
    codes, err, sqnorm = quantize_rows(V, lo, step, width)
    finite = err[np.isfinite(err)]
    err_cap = float(finite.max()) if finite.size else -1.0
    return Quantized(codes, lo, step, err, sqnorm, err_cap)


# ------------------------------------------------------------------- exact code distances


class _Freeze(ir.instructions.Instruction):
    """LLVM's ``freeze`` instruction: its operand unchanged, which LLVM does not fold into
    the instructions around it."""

    def descr(self, buf):
        (value,) = self.operands
        buf.append(f"freeze {value.type} {value.get_reference()}\n")


def _frozen_value(builder, value):
    """``value`` behind a ``freeze`` (where llvmlite lets one be inserted): a masked 16-bit
    operand then stays a masked move feeding the pairwise multiply-add instead of being
    folded into widening and narrowing moves (2x slower on this repository's AMD EPYC)."""
    insert = getattr(builder, "_insert", None)
    if insert is None:
        return value
    instr = _Freeze(builder.block, value.type, "frozen", [value])
    insert(instr)
    return instr


def _sum_sq_diff_codegen(bits: int, tagged: bool):
    """LLVM IR for :func:`_sum_sq_diff` (``tagged``: :func:`_kept_dot`)."""

    def codegen(context, builder, signature, args):
        w = COLUMN_BLOCK
        unroll = 2 if tagged else 4
        code_v = ir.VectorType(ir.IntType(bits), w)
        i16v = ir.VectorType(ir.IntType(16), w)
        i32w = ir.VectorType(ir.IntType(32), w)
        i32h = ir.VectorType(ir.IntType(32), w // 2)
        i64h = ir.VectorType(ir.IntType(64), w // 2)
        i64 = ir.IntType(64)
        evens = ir.Constant(i32h, list(range(0, w, 2)))
        odds = ir.Constant(i32h, list(range(1, w, 2)))
        a_data = context.make_array(signature.args[0])(context, builder, args[0]).data
        b_data = context.make_array(signature.args[2])(context, builder, args[2]).data
        zero = ir.Constant(i32h, [0] * (w // 2))
        accs = [cgutils.alloca_once_value(builder, zero) for _ in range(unroll)]

        def pairwise(x, y):  # x * y in int32 lanes, adjacent lanes added
            prod = builder.mul(builder.sext(x, i32w), builder.sext(y, i32w))
            return builder.add(
                builder.shuffle_vector(prod, prod, evens), builder.shuffle_vector(prod, prod, odds)
            )

        def block(j, acc):
            loaded = []
            for data, start in ((a_data, args[1]), (b_data, args[3])):
                ptr = builder.gep(data, [builder.add(start, j)])
                codes = builder.load(builder.bitcast(ptr, code_v.as_pointer()), align=1)
                loaded.append(codes if bits == 16 else builder.zext(codes, i16v))
            if tagged:  # a * c where the tags are equal or either is NO_TAG
                low = ir.Constant(i16v, [WIDE_LEVELS] * w)
                none = ir.Constant(i16v, [NO_TAG << 12] * w)  # words from here on: NO_TAG
                same = builder.icmp_unsigned("<=", builder.xor(*loaded), low)
                larger = builder.select(
                    builder.icmp_unsigned(">", loaded[0], loaded[1]), loaded[0], loaded[1]
                )
                kept = builder.or_(same, builder.icmp_unsigned(">=", larger, none))
                a, c = (builder.and_(x, low) for x in loaded)
                c_kept = builder.select(kept, c, ir.Constant(i16v, [0] * w))
                term = pairwise(a, _frozen_value(builder, c_kept))
            else:
                diff = builder.sub(*loaded)
                term = pairwise(diff, diff)
            builder.store(builder.add(builder.load(acc), term), acc)

        n = args[4]
        span = ir.Constant(i64, w * unroll)
        rounds = builder.udiv(n, span)
        with cgutils.for_range(builder, rounds) as loop:
            base = builder.mul(loop.index, span)
            for u in range(unroll):
                block(builder.add(base, ir.Constant(i64, w * u)), accs[u])
        done = builder.mul(rounds, span)
        rest = builder.udiv(builder.sub(n, done), ir.Constant(i64, w))
        with cgutils.for_range(builder, rest) as loop:
            block(builder.add(done, builder.mul(loop.index, ir.Constant(i64, w))), accs[0])
        reduce = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(i64, [i64h]), f"llvm.vector.reduce.add.v{w // 2}i64"
        )
        if tagged:  # lanes of non-negative sums below 2^32: added modulo 2^32, then widened
            total = builder.load(accs[0])
            for acc in accs[1:]:
                total = builder.add(total, builder.load(acc))
            return builder.call(reduce, [builder.zext(total, i64h)])
        total = ir.Constant(i64h, [0] * (w // 2))
        for acc in accs:
            total = builder.add(total, builder.sext(builder.load(acc), i64h))
        return builder.call(reduce, [total])

    return codegen


@intrinsic
def _sum_sq_diff(typingctx, a, a_start, b, b_start, n):
    """``sum_j (a.flat[a_start + j] - b.flat[b_start + j])^2`` over ``j < n`` (``n`` a
    multiple of ``COLUMN_BLOCK``; C-contiguous uint8 arrays, or uint16 arrays of codes up to
    :data:`WIDE_LEVELS`) as an int64: LLVM IR on vectors of ``COLUMN_BLOCK`` int16
    differences, squares added pairwise into int32 lanes (the pattern x86 computes with
    ``pmaddwd`` / ``vpdpwssd``), four independent accumulators. Integer arithmetic: the same
    result on every CPU."""
    if a != b or a.dtype not in (types.uint8, types.uint16):
        return None
    return types.int64(a, a_start, b, b_start, n), _sum_sq_diff_codegen(a.dtype.bitwidth, False)


@intrinsic
def _kept_dot(typingctx, a, a_start, b, b_start, n):
    """For uint16 words holding a 12-bit code and a 4-bit tag (``code | tag << 12``):
    ``sum_j a_j c_j`` over the columns whose tags are equal or either is ``NO_TAG`` (int64,
    exact). Each int32 lane gathers at most ``2 WIDE_LEVELS^2`` a block, so up to
    :data:`MAX_WIDE_COLUMNS` columns its sum stays below ``2^32``: the lanes are added
    modulo ``2^32`` and read unsigned."""
    if a != b or a.dtype != types.uint16:
        return None
    return types.int64(a, a_start, b, b_start, n), _sum_sq_diff_codegen(16, True)


@njit(nogil=True, inline="always")
def code_sqdist(A, i, B, p):
    """``sum_j (A[i, j] - B[p, j])^2`` (int64, exact) for code matrices of one dtype (uint8;
    uint16 up to :data:`WIDE_LEVELS`, at most :data:`MAX_WIDE_COLUMNS` wide) and the same
    padded width (a multiple of ``COLUMN_BLOCK``, C-contiguous)."""
    w = A.shape[1]
    return _sum_sq_diff(A, i * w, B, p * w, w)


@njit(nogil=True, inline="always")
def tagged_sqdist(A, i, B, p, a_sq, b_sq):
    """For uint16 matrices of tagged codes (``code | tag << 12``: codes up to
    :data:`WIDE_LEVELS`, tags up to :data:`NO_TAG`; the same padded width, at most
    :data:`MAX_WIDE_COLUMNS`) and their rows' sums of squared codes ``a_sq``, ``b_sq``
    (tags left out): ``sum_j (a_j - c_j)^2``, except that a column whose two
    tags differ and neither is :data:`NO_TAG` adds ``a_j^2 + c_j^2`` (int64, exact). Where a
    tag names the one feature behind a code, different tags mean different features, whose
    vectors are orthogonal: ``|u - v|^2 = |u|^2 + |v|^2``. Computed as ``|a|^2 + |c|^2 - 2
    sum_kept a_j c_j`` (one product a block, :func:`_kept_dot`)."""
    w = A.shape[1]
    return a_sq[i] + b_sq[p] - 2 * _kept_dot(A, i * w, B, p * w, w)
