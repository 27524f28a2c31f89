"""On-disk indexes: memory-mapped open, in-place append with atomic metadata, crash safety."""

from __future__ import annotations

import json

import numpy as np
import pytest

from hashlearn import io
from hashlearn.index.flat import FlatIndex
from hashlearn.index.mih import MultiIndexHashing


def codes(seed, n, code_size=8):
    return np.random.default_rng(seed).integers(0, 256, (n, code_size), dtype=np.uint8)


def reference(parts, ids_parts, q, k, n_bits=64):
    flat = FlatIndex(n_bits)
    for part, ids in zip(parts, ids_parts, strict=True):
        flat.add(part, ids)
    return flat.search(q, k)


def test_open_is_mapped_and_searches_like_memory(tmp_path):
    db, q = codes(0, 4000), codes(1, 30)
    index = FlatIndex(64)
    index.add(db)
    index.save(tmp_path / "idx")
    opened = FlatIndex.open(tmp_path / "idx")
    assert isinstance(opened._words, np.memmap)
    for got, want in zip(opened.search(q, 10), index.search(q, 10), strict=True):
        np.testing.assert_array_equal(got, want)


def test_append_in_place_then_reload_verified(tmp_path):
    parts = [codes(s, 1000 + s) for s in range(3)]
    q = codes(9, 25)
    index = FlatIndex(64)
    index.add(parts[0])
    index.save(tmp_path / "idx")
    file_before = json.loads((tmp_path / "idx" / "meta.json").read_text())["arrays"]["words"][
        "file"
    ]
    opened = FlatIndex.open(tmp_path / "idx")
    opened.add(parts[1])  # auto ids: appended in place
    opened.add(parts[2], ids=np.arange(5000, 5000 + len(parts[2])))
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    assert meta["arrays"]["words"]["file"] == file_before  # same file, grown in place
    assert len(meta["arrays"]["words"]["appended"]) == 2
    ids = [np.arange(1000), np.arange(1000, 2001), np.arange(5000, 6002)]
    want = reference(parts, ids, q, 10)
    for got, expected in zip(opened.search(q, 10), want, strict=True):
        np.testing.assert_array_equal(got, expected)
    for mmap in (False, True):
        loaded = FlatIndex.load(tmp_path / "idx", mmap=mmap, verify=True)
        assert len(loaded) == 3003
        for got, expected in zip(loaded.search(q, 10), want, strict=True):
            np.testing.assert_array_equal(got, expected)
    assert opened.add(codes(3, 2))[0] == 6002  # numbering continues past the largest id


def test_out_of_order_add_and_remove_write_a_new_generation(tmp_path):
    db, q = codes(0, 500), codes(1, 10)
    index = FlatIndex(64)
    index.add(db, ids=np.arange(500) * 2 + 10)
    index.save(tmp_path / "idx")
    opened = FlatIndex.open(tmp_path / "idx")
    opened.add(codes(2, 3), ids=[1, 3, 5])  # smaller ids: merged, new generation
    opened.remove([10, 12])
    loaded = FlatIndex.load(tmp_path / "idx")
    assert len(loaded) == 501 and loaded.ids[:3].tolist() == [1, 3, 5]
    for got, want in zip(loaded.search(q, 5), opened.search(q, 5), strict=True):
        np.testing.assert_array_equal(got, want)


def test_crash_during_append_leaves_previous_index_valid(tmp_path):
    index = FlatIndex(64)
    index.add(codes(0, 300))
    index.save(tmp_path / "idx")
    FlatIndex.open(tmp_path / "idx").add(codes(1, 10))
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    words_file = tmp_path / "idx" / meta["arrays"]["words"]["file"]
    with open(words_file, "ab") as f:  # an append that died before replacing meta.json
        f.write(b"\x07" * 8 * 123)
    loaded = FlatIndex.load(tmp_path / "idx", verify=True)
    assert len(loaded) == 310
    opened = FlatIndex.open(tmp_path / "idx")
    opened.add(codes(2, 5))  # the next append drops the dead bytes first
    loaded = FlatIndex.load(tmp_path / "idx", verify=True)
    assert len(loaded) == 315
    np.testing.assert_array_equal(loaded.codes[-5:], codes(2, 5))


def test_truncated_and_tampered_appended_files_are_detected(tmp_path):
    index = FlatIndex(64)
    index.add(codes(0, 300))
    index.save(tmp_path / "idx")
    FlatIndex.open(tmp_path / "idx").add(codes(1, 10))
    meta = json.loads((tmp_path / "idx" / "meta.json").read_text())
    words_file = tmp_path / "idx" / meta["arrays"]["words"]["file"]
    data = bytearray(words_file.read_bytes())
    data[-3] ^= 0xFF
    words_file.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="checksum"):
        FlatIndex.load(tmp_path / "idx")
    words_file.write_bytes(bytes(data[:-40]))
    with pytest.raises(ValueError, match="truncated"):
        FlatIndex.load(tmp_path / "idx", verify=False)


def test_append_rows_validates(tmp_path):
    index = FlatIndex(64)
    index.add(codes(0, 3))
    index.save(tmp_path / "idx")
    with pytest.raises(ValueError, match="no array"):
        io.append_rows(tmp_path / "idx", {"nope": np.zeros(3)})
    with pytest.raises(ValueError, match="dtype"):
        io.append_rows(tmp_path / "idx", {"ids": np.zeros(3, np.float32)})


def test_mih_opens_mapped(tmp_path):
    index = MultiIndexHashing(64)
    index.add(codes(0, 3000))
    index.save(tmp_path / "mih")
    q = codes(1, 20)
    loaded = MultiIndexHashing.load(tmp_path / "mih", mmap=True, verify=False)
    flat = getattr(loaded, "_flat", None)  # the layout before / after the copy-on-write store
    words = flat._words if flat is not None else loaded._store.snapshot.rows["words"]
    assert isinstance(words, np.memmap)
    for got, want in zip(loaded.search(q, 10), index.search(q, 10), strict=True):
        np.testing.assert_array_equal(got, want)
