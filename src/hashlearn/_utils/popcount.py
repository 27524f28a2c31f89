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

import functools
import os

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


# ------------------------------------------------------------------ the wide (AVX-512) path
#
# Eight codes per step, as faiss's AVX-512 build does (``hamming_distance/avx512-inl.h``):
# the ``8 W`` words of 8 consecutive ``W``-word codes are ``W`` vectors of 8 words; one XOR
# with the query's words laid out the same way, one ``VPOPCNTQ`` each, then lane shuffles and
# adds fold the ``W`` per-word counts of each code into one lane, giving the 8 distances in one
# vector; a vector compare with the acceptance bound gives 8 bits of a pass mask. Unlike the
# portable form this does not depend on LLVM's loop vectoriser (which kept 256-bit vectors
# and per-code shuffles on AVX-512 CPUs). Plain LLVM IR again, so it is exact on any CPU,
# but fastest where ``ctpop.v8i64`` is one instruction: :func:`kernel_path` says where the
# kernels take it.

KERNEL_ENV_VAR = "HASHLEARN_KERNEL"
_KERNEL_CHOICES = ("auto", "wide", "portable")


@functools.cache
def _target_features() -> frozenset[str]:
    """The feature string numba compiles with, split: ``NUMBA_CPU_FEATURES`` when set, else
    the host CPU's features as LLVM reports them (``NUMBA_CPU_NAME`` alone keeps the host's
    features). numba's on-disk cache keys every kernel by target triple, CPU name and
    feature string (``codegen.magic_tuple()``), so a kernel compiled on one CPU is never
    loaded on another."""
    from numba.core import config
    from numba.core.codegen import get_host_cpu_features

    features = config.CPU_FEATURES  # type: ignore[attr-defined]
    if features is None:
        features = get_host_cpu_features()
    return frozenset(features.split(","))


def target_has_vpopcntdq() -> bool:
    """Whether the CPU numba compiles for has AVX-512 VPOPCNTDQ (one ``VPOPCNTQ`` per 8 words)."""
    return "+avx512vpopcntdq" in _target_features()


#: On AVX2 CPUs without VPOPCNTDQ LLVM lowers the wide form's ``ctpop.v8i64`` to a PSHUFB
#: nibble table over two 256-bit halves; that form still beat the portable kernel up to 2
#: words (1M codes, 1 thread, AVX-512 disabled in numba's target on a Zen 4: 64 bits 0.27
#: vs 0.40 ms per query in a batch, 128 bits 0.57 vs 0.72, and 0.68 vs 0.94 one query per
#: call, where the portable kernel lost to faiss's AVX2 code, 0.85x) and was level or
#: slightly slower from 4 words up (256-1024 bits: 0.97-1.04x).
_WIDE_AVX2_MAX_WORDS = 2
#: A lone query streams the codes from memory once; over codes of 8 words or more the
#: portable kernel's code-by-code loop kept up with memory better than the 8-code steps
#: (1M codes, 1 thread, Zen 4 with VPOPCNTDQ, one query per call: 512 bits 1.89 vs 2.15 ms,
#: 1024 bits 4.06 vs 6.38 ms; at 256 bits the wide path won, 0.87-0.99 vs 1.14-1.19 ms).
_LONE_PORTABLE_MIN_WORDS = 8

_FORCED: str | None = None  # set_kernel_path's choice; None: the environment's


def _path_choice() -> str:
    return _env_choice() if _FORCED is None else _FORCED


@functools.cache  # read once: a search must not pay for it
def _env_choice() -> str:
    raw = os.environ.get(KERNEL_ENV_VAR, "auto").strip().lower() or "auto"
    if raw not in _KERNEL_CHOICES:
        raise ValueError(
            f"The environment variable {KERNEL_ENV_VAR} must be one of {_KERNEL_CHOICES}. "
            f"Got {raw!r} instead."
        )
    return raw


def kernel_path(n_words: int, lone: bool = False) -> str:
    """The Hamming kernel path for codes of ``n_words`` 64-bit words: ``"wide"`` or
    ``"portable"``; ``lone``: for a scan of one query.

    :func:`set_kernel_path`, else ``HASHLEARN_KERNEL`` (``wide`` / ``portable`` force a
    path: both are exact on any CPU; ``auto``, the default, decides): the wide path on a CPU
    with AVX-512 VPOPCNTDQ, and on one with AVX2 up to ``_WIDE_AVX2_MAX_WORDS`` words;
    the portable one otherwise, and for a lone query over codes of
    ``_LONE_PORTABLE_MIN_WORDS`` words or more.
    """
    choice = _path_choice()
    if choice != "auto":
        return choice
    features = _target_features()
    if lone and n_words >= _LONE_PORTABLE_MIN_WORDS:
        return "portable"
    if "+avx512vpopcntdq" in features:
        return "wide"
    if "+avx2" in features and n_words <= _WIDE_AVX2_MAX_WORDS:
        return "wide"
    return "portable"


def set_kernel_path(path: str | None) -> None:
    """Force the wide (``"wide"``) or portable (``"portable"``) path, or ``None`` to decide again
    from the environment and the CPU. For tests and benchmarks comparing the two."""
    global _FORCED
    if path not in (None, "wide", "portable"):
        raise ValueError(f"path must be 'wide', 'portable' or None. Got {path!r} instead.")
    _FORCED = path
    _env_choice.cache_clear()


def kernel_path_description() -> str:
    """One line for ``hashlearn info``: which Hamming kernel path this process uses and why."""
    choice = _path_choice()
    if choice != "auto":
        how = (
            f"{choice} at every code length (forced: {KERNEL_ENV_VAR}={choice} or set_kernel_path)"
        )
        if choice == "wide" and not target_has_vpopcntdq():
            how += "; this CPU lacks AVX-512 VPOPCNTDQ"
        return how
    if kernel_path(1) == "portable":
        return "portable: LLVM-lowered popcount (the CPU numba compiles for has no AVX2)"
    if kernel_path(_WIDE_AVX2_MAX_WORDS + 1) == "wide":
        return "wide: 512-bit XOR + VPOPCNTQ over 8 codes per step (AVX-512 VPOPCNTDQ)"
    return (
        f"wide form on AVX2 up to {64 * _WIDE_AVX2_MAX_WORDS} bits, portable above "
        "(the CPU numba compiles for lacks AVX-512 VPOPCNTDQ)"
    )


_LANES = 8  # codes per step: 8 x 64-bit lanes, one 512-bit vector


def _gather_lanes(builder, vectors, flat):
    """A ``<8 x i64>`` whose lane ``c`` is lane ``flat[c]`` of the concatenated ``vectors``,
    built by two-source ``shufflevector`` s (``VPERMT2Q``), one per further source vector."""
    i32 = ir.IntType(32)

    def mask(lanes):
        return ir.Constant(ir.VectorType(i32, _LANES), [ir.Constant(i32, x) for x in lanes])

    sources = sorted({f // _LANES for f in flat})
    first = sources[0]
    second = sources[1] if len(sources) > 1 else first
    lanes = [
        f % _LANES if f // _LANES == first else _LANES + f % _LANES if f // _LANES == second else 0
        for f in flat
    ]
    acc = builder.shuffle_vector(vectors[first], vectors[second], mask(lanes))
    for s in sources[2:]:
        lanes = [_LANES + f % _LANES if f // _LANES == s else c for c, f in enumerate(flat)]
        acc = builder.shuffle_vector(acc, vectors[s], mask(lanes))
    return acc


def _fold_codes(builder, counts, n_words):
    """Per-code sums of the per-word counts of 8 codes of ``n_words`` words (``n_words``
    vectors, the codes' words in order): one ``<8 x i64>`` of distances, code ``c`` in lane c.

    Codes over 8 words first add their vectors (a code is whole vectors); pairs of vectors
    then fold adjacent lanes (even + odd lanes) while a code spans an even count of lanes;
    an odd span left over (3 words) is gathered lane by lane.
    """
    vectors, span = list(counts), n_words
    if span > _LANES and span % _LANES == 0:
        per_code = span // _LANES
        vectors = [_sum(builder, vectors[c * per_code : (c + 1) * per_code]) for c in range(_LANES)]
        span = _LANES
    while span % 2 == 0:
        evens = [2 * j for j in range(_LANES)]
        odds = [2 * j + 1 for j in range(_LANES)]
        vectors = [
            builder.add(_gather_lanes(builder, pair, evens), _gather_lanes(builder, pair, odds))
            for pair in zip(vectors[0::2], vectors[1::2], strict=True)
        ]
        span //= 2
    if span > 1:
        vectors = [
            _sum(
                builder,
                [
                    _gather_lanes(builder, vectors, [c * span + w for c in range(_LANES)])
                    for w in range(span)
                ],
            )
        ]
    return vectors[0]


def _sum(builder, values):
    total = values[0]
    for v in values[1:]:
        total = builder.add(total, v)
    return total


@intrinsic
def wide_mini_block(typingctx, db, o, queries, qo, tau, out, width):
    """Distances of 64 consecutive codes to one query, 8 codes per 512-bit step, and the mask
    of those below ``tau`` (bit ``u`` for code ``u``).

    ``db`` and ``queries`` are uint64 word arrays, ``o`` and ``qo`` the word offsets of the
    first code and of the query (callers guarantee ``64 W`` and ``W`` words); ``out`` an
    int64 array of at least 64 receiving the distances, or None for the mask alone (no
    stores: the scan's common case, where no code passes); ``width`` a tuple whose *length*
    is the word count ``W`` (a compile-time constant: one straight-line body per width).
    """
    n_words = len(width)
    store = not isinstance(out, types.NoneType)
    sig = types.uint64(db, o, queries, qo, tau, out, width)

    def codegen(context, builder, signature, args):
        db_v, o_v, q_v, qo_v, tau_v, out_v = args[:6]
        i64 = ir.IntType(64)
        vec = ir.VectorType(i64, _LANES)
        vec_ptr = vec.as_pointer()

        def data(array_type, value):
            return context.make_array(array_type)(context, builder, value).data

        db_data = data(signature.args[0], db_v)
        q_data = data(signature.args[2], q_v)
        out_data = data(signature.args[5], out_v) if store else None
        ctpop = cgutils.get_or_insert_function(
            builder.module, ir.FunctionType(vec, [vec]), f"llvm.ctpop.v{_LANES}i64"
        )
        # the query's words laid out as 8 codes' words: lane l of vector j is word
        # (8 j + l) mod W; the pattern repeats every W / gcd(W, 8) vectors
        q_words = [
            builder.load(builder.gep(q_data, [builder.add(qo_v, ir.Constant(i64, w))]))
            for w in range(n_words)
        ]
        patterns = {}
        for j in range(n_words):
            key = tuple((_LANES * j + lane) % n_words for lane in range(_LANES))
            if key not in patterns:
                v = ir.Constant(vec, None)
                for lane, w in enumerate(key):
                    v = builder.insert_element(v, q_words[w], ir.Constant(ir.IntType(32), lane))
                patterns[key] = v
        query = [
            patterns[tuple((_LANES * j + lane) % n_words for lane in range(_LANES))]
            for j in range(n_words)
        ]
        bound = builder.insert_element(
            ir.Constant(vec, None), tau_v, ir.Constant(ir.IntType(32), 0)
        )
        bound = builder.shuffle_vector(
            bound,
            ir.Constant(vec, None),
            ir.Constant(ir.VectorType(ir.IntType(32), _LANES), [0] * _LANES),
        )
        mask = ir.Constant(i64, 0)
        for step in range(64 // _LANES):
            counts = []
            for j in range(n_words):
                offset = builder.add(o_v, ir.Constant(i64, (step * n_words + j) * _LANES))
                ptr = builder.bitcast(builder.gep(db_data, [offset]), vec_ptr)
                words = builder.load(ptr, align=8)
                counts.append(builder.call(ctpop, [builder.xor(words, query[j])]))
            dist = _fold_codes(builder, counts, n_words)
            if store:
                out_ptr = builder.bitcast(
                    builder.gep(out_data, [ir.Constant(i64, step * _LANES)]), vec_ptr
                )
                builder.store(dist, out_ptr, align=8)
            below = builder.icmp_signed("<", dist, bound)
            bits = builder.zext(builder.bitcast(below, ir.IntType(_LANES)), i64)
            mask = builder.or_(mask, builder.shl(bits, ir.Constant(i64, step * _LANES)))
        return mask

    return sig, codegen
