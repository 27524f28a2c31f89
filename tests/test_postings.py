"""Sorted-key + CSR posting tables against a dict oracle."""

from __future__ import annotations

import numba
import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from hashlearn._utils.postings import build_table, find, find_many, merge_tables, remove_from_table


def _as_dict(table):
    keys, offsets, ids = table
    assert np.all(np.diff(keys) > 0)
    return {int(k): ids[offsets[j] : offsets[j + 1]].tolist() for j, k in enumerate(keys)}


def _oracle(keys, ids):
    out = {}
    for k, i in zip(keys, ids, strict=True):
        out.setdefault(int(k), []).append(int(i))
    return {k: sorted(v) for k, v in out.items()}


@numba.njit
def _find_all(keys, queries):
    out = np.empty(len(queries), np.int64)
    for i in range(len(queries)):
        out[i] = find(keys, queries[i])
    return out


@settings(max_examples=60, deadline=None)
@given(
    st.lists(
        st.tuples(st.integers(-50, 50), st.integers(0, 10**6)),
        max_size=60,
        unique_by=lambda t: t[1],
    ),
    st.lists(st.integers(-60, 60), max_size=20),
)
def test_build_find_merge_remove(entries, queries):
    keys = np.array([k for k, _ in entries], np.int64)
    ids = np.array([i for _, i in entries], np.int64)
    table = build_table(keys, ids)
    assert _as_dict(table) == _oracle(keys, ids)
    q = np.array(queries, np.int64)
    expected = [int(np.flatnonzero(table[0] == v)[0]) if v in table[0] else -1 for v in q]
    assert find_many(table[0], q).tolist() == expected
    assert _find_all(table[0], q).tolist() == expected
    half = len(entries) // 2
    merged = merge_tables(
        build_table(keys[:half], ids[:half]), build_table(keys[half:], ids[half:])
    )
    assert _as_dict(merged) == _oracle(keys, ids)
    dropped = remove_from_table(table, ids[::2])
    assert _as_dict(dropped) == _oracle(keys[1::2], ids[1::2])


def test_build_table_rejects_mismatched_shapes():
    import pytest

    with pytest.raises(ValueError, match="same length"):
        build_table(np.zeros(3), np.zeros(2))
