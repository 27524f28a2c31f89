"""Packed codes: layout, conversions, Hamming distances and their validation."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from conftest import SPECIAL_BITS, brute_distances, pack_le, unpack_le
from hashlearn import codes as hc
from hashlearn.index import FlatIndex

SETTINGS = settings(max_examples=60, deadline=None)


@st.composite
def bit_rows(draw, max_bits: int = 300, max_n: int = 20):
    n_bits = draw(
        st.one_of(
            st.sampled_from([b for b in SPECIAL_BITS if b <= max_bits]), st.integers(1, max_bits)
        )
    )
    n = draw(st.integers(0, max_n))
    seed = draw(st.integers(0, 2**32 - 1))
    density = draw(st.sampled_from([0.0, 0.05, 0.5, 0.95, 1.0]))
    rng = np.random.default_rng(seed)
    return (rng.random((n, n_bits)) < density).astype(np.uint8)


# ---------------------------------------------------------------------------- pack/unpack


@SETTINGS
@given(bits=bit_rows())
def test_pack_unpack_round_trip_and_lsb_first_layout(bits):
    n, n_bits = bits.shape
    codes = hc.pack_bits(bits)
    assert codes.dtype == np.uint8
    assert codes.shape == (n, (n_bits + 7) // 8)
    # layout by hand: bit j in byte j // 8 at bit j % 8
    for j in range(n_bits):
        np.testing.assert_array_equal((codes[:, j // 8] >> (j % 8)) & 1, bits[:, j])
    # padding bits of the last byte are zero
    spare = codes.shape[1] * 8 - n_bits
    if spare and n:
        assert not np.any(codes[:, -1] >> (8 - spare))
    np.testing.assert_array_equal(codes, np.packbits(bits, axis=1, bitorder="little"))
    np.testing.assert_array_equal(codes, pack_le(bits))
    back = hc.unpack_bits(codes, n_bits)
    assert back.shape == bits.shape
    np.testing.assert_array_equal(back, bits)
    # bools pack the same as 0/1 integers and floats
    np.testing.assert_array_equal(hc.pack_bits(bits.astype(bool)), codes)
    np.testing.assert_array_equal(hc.pack_bits(bits.astype(np.float32)), codes)


def test_pack_bits_single_bits_by_hand():
    bits = np.zeros((1, 13), np.uint8)
    bits[0, 0] = 1
    assert hc.pack_bits(bits).tolist() == [[1, 0]]
    bits[0, 0], bits[0, 7] = 0, 1
    assert hc.pack_bits(bits).tolist() == [[128, 0]]
    bits[0, 7], bits[0, 8], bits[0, 12] = 0, 1, 1
    assert hc.pack_bits(bits).tolist() == [[0, 1 + 16]]


@SETTINGS
@given(bits=bit_rows())
def test_msb_first_conversions_match_numpy_default_packbits(bits):
    n, n_bits = bits.shape
    lsb = hc.pack_bits(bits)
    msb = np.packbits(bits, axis=1)  # numpy's default: big bit order
    np.testing.assert_array_equal(hc.to_msb_first(lsb, n_bits), msb)
    np.testing.assert_array_equal(hc.from_msb_first(msb, n_bits), lsb)
    np.testing.assert_array_equal(
        np.unpackbits(hc.to_msb_first(lsb, n_bits), axis=1, count=n_bits), bits
    )


def test_from_msb_first_rejects_lsb_codes_with_padding():
    # 3 bits LSB-first: byte 0b00000111; read as MSB-first, bits 3..7 would be set
    codes = np.array([[0b00000111]], np.uint8)
    with pytest.raises(ValueError, match="padding"):
        hc.from_msb_first(codes, 3)
    with pytest.raises(TypeError, match="codes"):
        hc.from_msb_first(codes.astype(np.int64), 3)


# ------------------------------------------------------------------------------ distances


@st.composite
def two_code_sets(draw):
    n_bits = draw(st.one_of(st.sampled_from(SPECIAL_BITS), st.integers(1, 600)))
    m = draw(st.integers(0, 12))
    n = draw(st.integers(0, 40))
    seed = draw(st.integers(0, 2**32 - 1))
    rng = np.random.default_rng(seed)
    p = draw(st.sampled_from([0.02, 0.5, 0.98]))
    a = (rng.random((m, n_bits)) < p).astype(np.uint8)
    b = (rng.random((n, n_bits)) < p).astype(np.uint8)
    if m and n:
        b[: min(m, n)] = a[: min(m, n)]  # some zero distances
    return n_bits, a, b


@SETTINGS
@given(problem=two_code_sets())
def test_hamming_cdist_equals_sum_of_bit_differences(problem):
    n_bits, a_bits, b_bits = problem
    a, b = pack_le(a_bits), pack_le(b_bits)
    expected = brute_distances(a_bits, b_bits)
    out = hc.hamming_cdist(a, b, n_bits)
    assert out.dtype == np.int32
    assert out.shape == (len(a), len(b))
    np.testing.assert_array_equal(out, expected)
    # without n_bits the whole bytes are compared; zero padding changes nothing
    np.testing.assert_array_equal(hc.hamming_cdist(a, b), expected)


@SETTINGS
@given(problem=two_code_sets())
def test_hamming_distance_rowwise_and_one_to_many(problem):
    n_bits, a_bits, b_bits = problem
    a, b = pack_le(a_bits), pack_le(b_bits)
    expected = brute_distances(a_bits, b_bits)
    r = min(len(a), len(b))
    rowwise = hc.hamming_distance(a[:r], b[:r])
    assert rowwise.shape == (r,)
    np.testing.assert_array_equal(rowwise, np.diagonal(expected)[:r])
    if len(a):
        one = hc.hamming_distance(a[0], b)
        assert one.shape == (len(b),)
        np.testing.assert_array_equal(one, expected[0])


def test_hamming_cdist_non_contiguous_and_misaligned_inputs():
    rng = np.random.default_rng(3)
    n_bits = 128
    bits = (rng.random((40, n_bits)) < 0.5).astype(np.uint8)
    codes = pack_le(bits)
    expected = brute_distances(bits[::2], bits)
    np.testing.assert_array_equal(hc.hamming_cdist(codes[::2], codes, n_bits), expected)
    np.testing.assert_array_equal(
        hc.hamming_cdist(codes[::2], np.asfortranarray(codes), n_bits), expected
    )
    buf = np.zeros(codes.size + 1, np.uint8)  # C-contiguous but not 8-byte aligned
    buf[1:] = codes.ravel()
    shifted = buf[1:].reshape(codes.shape)
    np.testing.assert_array_equal(hc.hamming_cdist(codes[::2], shifted, n_bits), expected)


def test_known_distances_by_hand():
    a = hc.pack_bits(np.array([[1, 0, 1, 1, 0, 0, 0, 0, 1, 1]]))
    b = hc.pack_bits(np.array([[1, 1, 1, 0, 0, 0, 0, 0, 1, 0], [0] * 10, [1] * 10]))
    assert hc.hamming_cdist(a, b, 10).tolist() == [[3, 5, 5]]
    assert hc.hamming_distance(a[0], b).tolist() == [3, 5, 5]


# ----------------------------------------------------------------------------- validation


@pytest.mark.parametrize("n_bits", [1, 3, 9, 65, 250])
def test_non_zero_padding_bits_are_rejected(n_bits):
    width = (n_bits + 7) // 8
    codes = np.zeros((2, width), np.uint8)
    codes[1, -1] = np.uint8(1 << (n_bits % 8))  # the first padding bit
    with pytest.raises(ValueError, match="padding"):
        hc.unpack_bits(codes, n_bits)
    with pytest.raises(ValueError, match="padding"):
        hc.to_msb_first(codes, n_bits)
    with pytest.raises(ValueError, match="padding"):
        hc.hamming_cdist(codes, np.zeros((1, width), np.uint8), n_bits)
    with pytest.raises(ValueError, match="padding"):
        FlatIndex(n_bits).add(codes)
    index = FlatIndex(n_bits)
    index.add(np.zeros((1, width), np.uint8))
    with pytest.raises(ValueError, match="padding"):
        index.search(codes, 1)


def test_wrong_dtype_ndim_width_name_the_argument():
    good = np.zeros((3, 2), np.uint8)
    with pytest.raises(TypeError, match="codes"):
        hc.unpack_bits(good.astype(np.int64), 16)
    with pytest.raises(TypeError, match="codes"):
        hc.unpack_bits(good.tolist(), 16)
    with pytest.raises(ValueError, match="codes.*2-D"):
        hc.unpack_bits(good[0], 16)
    with pytest.raises(ValueError, match="codes"):
        hc.unpack_bits(good, 24)  # 3 bytes expected
    with pytest.raises(ValueError, match="n_bits"):
        hc.unpack_bits(good, 0)
    with pytest.raises(TypeError, match="a"):
        hc.hamming_cdist(good.astype(np.float32), good, 16)
    with pytest.raises(TypeError, match="b"):
        hc.hamming_cdist(good, good.astype(bool), 16)
    with pytest.raises(ValueError, match="b"):
        hc.hamming_cdist(good, np.zeros((3, 3), np.uint8), 16)
    with pytest.raises(ValueError, match="n_bits"):
        hc.hamming_cdist(good, good, -4)
    with pytest.raises(TypeError, match="a"):
        hc.hamming_distance(good.astype(np.int16), good)
    with pytest.raises(TypeError, match="b"):
        hc.hamming_distance(good, [0, 1])
    with pytest.raises(ValueError, match="a and b"):
        hc.hamming_distance(good, np.zeros((3, 3), np.uint8))
    with pytest.raises(ValueError, match="bits"):
        hc.pack_bits(np.array([0, 1, 1]))
    with pytest.raises(ValueError, match="bits"):
        hc.pack_bits(np.array([[0, 2, 1]]))
    with pytest.raises(ValueError, match="bits"):
        hc.pack_bits(np.array([[0, np.nan]]))
    with pytest.raises(TypeError, match="bits"):
        hc.pack_bits(np.array([["0", "1"]]))


# ---------------------------------------------------------------------------------- faiss


@pytest.mark.parametrize("n_bits", [1, 5, 8, 13, 64, 100, 257])
def test_byte_layout_equals_faiss_pack_bitstrings(faiss, n_bits):
    rng = np.random.default_rng(n_bits)
    bits = (rng.random((30, n_bits)) < 0.5).astype(np.int32)
    expected = faiss.pack_bitstrings(bits, 1)
    np.testing.assert_array_equal(hc.pack_bits(bits), expected)
    np.testing.assert_array_equal(unpack_le(expected, n_bits), bits)


@pytest.mark.parametrize("n_bits", [8, 64, 96, 256])
def test_byte_layout_equals_faiss_real_to_binary(faiss, n_bits):
    rng = np.random.default_rng(n_bits)
    x = rng.standard_normal((20, n_bits)).astype(np.float32)
    expected = np.zeros((20, n_bits // 8), np.uint8)
    for i in range(20):
        out = np.zeros(n_bits // 8, np.uint8)
        faiss.real_to_binary(n_bits, faiss.swig_ptr(x[i]), faiss.swig_ptr(out))
        expected[i] = out
    np.testing.assert_array_equal(hc.pack_bits(x > 0), expected)


@pytest.mark.parametrize("n_bits", [8, 32, 64, 128, 200, 256, 512])
def test_flat_index_matches_faiss_index_binary_flat(faiss, n_bits):
    rng = np.random.default_rng(n_bits)
    n, m, k = 500, 25, 20
    # few distinct codes -> many ties; faiss orders ties arbitrarily, so compare distances
    pool = rng.integers(0, 256, (40, n_bits // 8), dtype=np.uint8)
    db = pool[rng.integers(0, len(pool), n)]
    queries = rng.integers(0, 256, (m, n_bits // 8), dtype=np.uint8)
    queries[:5] = db[:5]
    ours = FlatIndex(n_bits)
    ours.add(db)
    theirs = faiss.IndexBinaryFlat(n_bits)
    theirs.add(db)
    D, I = ours.search(queries, k)
    fD, fI = theirs.search(queries, k)
    np.testing.assert_array_equal(D, fD)
    np.testing.assert_array_equal(
        hc.hamming_cdist(queries, db, n_bits),
        brute_distances(unpack_le(queries, n_bits), unpack_le(db, n_bits)),
    )
    # faiss's ids have the distances faiss reports; ours are the smallest ids among ties
    full = hc.hamming_cdist(queries, db, n_bits)
    np.testing.assert_array_equal(np.take_along_axis(full, fI, axis=1), fD)
    # range search: ours means <= r, faiss means < r
    r = n_bits // 2 - 2
    lims, RD, RI = ours.range_search(queries, r)
    flims, fRD, fRI = theirs.range_search(queries, r + 1)
    np.testing.assert_array_equal(lims, flims)
    for i in range(m):
        got = sorted(
            zip(RD[lims[i] : lims[i + 1]].tolist(), RI[lims[i] : lims[i + 1]].tolist(), strict=True)
        )
        want = sorted(
            zip(
                fRD[flims[i] : flims[i + 1]].tolist(),
                fRI[flims[i] : flims[i + 1]].tolist(),
                strict=True,
            )
        )
        assert got == want
