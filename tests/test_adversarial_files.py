"""Adversarial files, inputs and command lines (issue 13): one regression test per defect.

Each test here failed on the code before the fix: crafted ``meta.json`` accepted, writes
through planted symbolic links, unchecked hasher state, an unverified ``open``, deletion of
files the library did not write, leftover temporary directories, ``np.matrix`` queries giving
wrong results, huge ``k`` as a bare ``MemoryError``, tracebacks from the command line, a
crash at import without a writable numba cache, and corrupted datasets.
"""

from __future__ import annotations

import hashlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest

import hashlearn
from hashlearn import io
from hashlearn.hashers import RandomHyperplaneLSH
from hashlearn.index import FlatIndex

needs_symlinks = pytest.mark.skipif(not hasattr(os, "symlink"), reason="needs symlinks")


def _codes(seed: int, n: int, n_bits: int = 64) -> np.ndarray:
    rng = np.random.default_rng(seed)
    return rng.integers(0, 256, (n, (n_bits + 7) // 8), dtype=np.uint8)


@pytest.fixture
def saved(tmp_path) -> Path:
    index = FlatIndex(64)
    index.add(_codes(0, 50))
    path = tmp_path / "idx"
    index.save(path)
    return path


def _edit_meta(path: Path, fn) -> None:
    meta = json.loads((path / "meta.json").read_text())
    fn(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def _rehash(path: Path, name: str) -> None:
    """Make meta.json's checksum of array ``name`` match the file again (a crafted save)."""

    def fix(meta):
        entry = meta["arrays"][name]
        entry["sha256"] = hashlib.sha256((path / entry["file"]).read_bytes()).hexdigest()

    _edit_meta(path, fix)


# ------------------------------------------------------------------ Files 3: format_version


@pytest.mark.parametrize("version", [0, -1, True, 1.0, "1", None, [1]])
def test_format_version_must_be_a_supported_positive_int(saved, version):
    _edit_meta(saved, lambda m: m.update(format_version=version))
    with pytest.raises(ValueError, match="format_version|format version"):
        io.load(saved)


def _set(path_in_meta, value):
    def fn(meta):
        node = meta
        for key in path_in_meta[:-1]:
            node = node[key]
        node[path_in_meta[-1]] = value

    return fn


@pytest.mark.parametrize(
    "damage",
    [
        _set(["generation"], "1"),
        _set(["generation"], 0),
        _set(["generation"], True),
        _set(["arrays", "words", "shape"], [True, 1]),
        _set(["arrays", "words", "shape"], [-50, 1]),
        _set(["arrays", "words", "dtype"], "|O"),
        _set(["arrays", "words", "dtype"], "not a dtype"),
        _set(["arrays", "words", "dtype"], "uint64"),  # not the canonical '<u8'
        _set(["arrays", "words", "sha256"], "xyz"),
        _set(["arrays", "words", "file"], "ids.g1.npy"),  # another array's file
        _set(["arrays", "words", "file"], "words.g7.npy"),  # not this generation's
        _set(["arrays", "words", "extra"], 1),
        _set(["arrays", "words", "appended"], [{"rows": -1, "sha256": "0" * 64}]),
        _set(["arrays", "words", "appended"], [{"rows": 10**6, "sha256": "0" * 64}]),
        _set(["arrays", "words", "appended"], "none"),
        _set(["surprise"], {}),
    ],
)
def test_every_meta_field_is_type_checked(saved, damage):
    _edit_meta(saved, damage)
    for verify in (True, False):
        with pytest.raises(ValueError, match="meta.json is corrupted"):
            io.load(saved, verify=verify)


def test_appended_row_counts_must_equal_the_header(tmp_path):
    """A meta.json whose appended rows disagree with the .npy header is refused unverified."""
    path = tmp_path / "idx"
    index = FlatIndex(64)
    index.add(_codes(0, 20))
    index.save(path)
    opened = FlatIndex.open(path)
    opened.add(_codes(1, 5))
    opened.add(_codes(2, 5))

    def shift(meta):  # move one row from the header's count to the first appended block
        for entry in meta["arrays"].values():
            entry["appended"][0]["rows"] += 1

    _edit_meta(path, shift)
    with pytest.raises(ValueError, match="header"):
        io.load(path, verify=False)


def test_npy_header_dtype_must_match_meta(saved):
    words = np.load(saved / "words.g1.npy")
    np.save(saved / "words.g1.npy", words.view(np.int64))  # same bytes, other header
    _rehash(saved, "words")
    with pytest.raises(ValueError, match="dtype"):
        io.load(saved)


def test_trailing_bytes_after_a_plain_array_are_refused(saved):
    with open(saved / "ids.g1.npy", "ab") as f:
        f.write(b"\0" * 8)
    _rehash(saved, "ids")
    with pytest.raises(ValueError, match="ids.g1.npy"):
        io.load(saved)


# ------------------------------------------------------------- io.require_array / state


def test_require_array_checks_presence_dtype_shape_and_bounds():
    arrays = {"postings": np.array([0, 3, 1], np.int32), "words": np.zeros((4, 2), np.uint64)}
    assert io.require_array(arrays, "postings", np.int32, 1, low=0, high=4) is arrays["postings"]
    io.require_array(arrays, "words", np.uint64, shape=(None, 2))
    cases = [
        (("missing", np.int32), "missing"),
        (("postings", np.int64), "dtype"),
        (("postings", np.int32, 2), "dimension"),
        (("words", np.uint64), None),
    ]
    for args, match in cases:
        if match is None:
            io.require_array(arrays, *args)
            continue
        with pytest.raises(ValueError, match=match):
            io.require_array(arrays, *args)
    with pytest.raises(ValueError, match="shape"):
        io.require_array(arrays, "words", np.uint64, shape=(4, 3))
    with pytest.raises(ValueError, match=r"values in \[0, 3\]"):
        io.require_array(arrays, "postings", np.int32, low=0, high=3)
    with pytest.raises(ValueError, match="state entry 'next_id'"):
        io.require_state({"next_id": True}, "next_id", int)
    assert io.require_state({"next_id": 4}, "next_id", int, low=0) == 4
    assert io.require_state({}, "tau", float, optional=True) is None


# ------------------------------------------------------------------ Files 2: no symlinks


@needs_symlinks
@pytest.mark.parametrize("planted", ["words.g2.npy", "ids.g2.npy", "meta.json.tmp"])
def test_save_never_writes_through_a_planted_symlink(saved, tmp_path, planted):
    victim = tmp_path / "victim"
    victim.write_bytes(b"precious")
    os.symlink(victim, saved / planted)
    index = FlatIndex.load(saved)
    index.add(_codes(3, 2))
    with pytest.raises(ValueError, match="symbolic link"):
        index.save(saved)
    assert victim.read_bytes() == b"precious"
    assert len(FlatIndex.load(saved)) == 50  # the save is untouched and still loads


@needs_symlinks
def test_append_in_place_never_writes_through_a_symlink(saved, tmp_path):
    victim = tmp_path / "victim.npy"
    (saved / "words.g1.npy").rename(victim)
    os.symlink(victim, saved / "words.g1.npy")
    before = victim.read_bytes()
    for verify in (True, False):
        with pytest.raises(ValueError, match="symbolic link"):
            FlatIndex.open(saved, verify=verify).add(_codes(4, 3))
    with pytest.raises(ValueError, match="symbolic link"):
        io.append_rows(saved, {"words": np.zeros((1, 1), np.uint64)})
    assert victim.read_bytes() == before


@needs_symlinks
def test_first_save_never_writes_through_a_dangling_link(tmp_path):
    victim = tmp_path / "victim"
    os.symlink(victim, tmp_path / "idx")
    index = FlatIndex(64)
    index.add(_codes(0, 3))
    with pytest.raises(ValueError, match="symbolic link"):
        index.save(tmp_path / "idx")
    assert not victim.exists()


# ------------------------------------------------------------ Files 4: open verifies


def test_open_verifies_the_checksums_by_default(saved):
    raw = bytearray((saved / "words.g1.npy").read_bytes())
    raw[-3] ^= 0x40
    (saved / "words.g1.npy").write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        FlatIndex.open(saved)
    assert len(FlatIndex.open(saved, verify=False)) == 50  # the explicit fast path


# --------------------------------------------------- Files 5: delete only our own files


def test_save_keeps_files_it_did_not_write(saved):
    mine = {
        "notes.npy": b"user data",
        "draft.tmp": b"user draft",
        "embeddings.g1.npy.bak": b"backup",
    }
    for name, content in mine.items():
        (saved / name).write_bytes(content)
    index = FlatIndex.load(saved)
    index.add(_codes(5, 2))
    index.save(saved)
    index.save(saved)
    for name, content in mine.items():
        assert (saved / name).read_bytes() == content
    names = {p.name for p in saved.iterdir()}
    assert names == {"meta.json", "words.g3.npy", "ids.g3.npy", *mine}


def test_save_removes_leftovers_of_an_interrupted_save(saved):
    """Array files of a generation never committed, and a dead writer's meta tmp, go."""
    (saved / "words.g2.npy").write_bytes(b"half written")
    (saved / "meta.json.tmp").write_bytes(b"{")
    index = FlatIndex.load(saved)
    index.save(saved)
    assert sorted(p.name for p in saved.iterdir()) == ["ids.g3.npy", "meta.json", "words.g3.npy"]
    assert len(FlatIndex.load(saved)) == 50


def test_files_of_a_crash_after_the_commit_are_removed_by_the_next_save(saved):
    """A kill between meta.json's replace and the deletion leaves superseded files; the
    next save deletes them because the committed meta.json named them."""
    index = FlatIndex.load(saved)
    old = {p.name: p.read_bytes() for p in saved.glob("*.npy")}
    index.save(saved)  # generation 2; now put generation 1's files back, as a crash would
    for name, content in old.items():
        (saved / name).write_bytes(content)
    index.save(saved)
    assert sorted(p.name for p in saved.iterdir()) == ["ids.g3.npy", "meta.json", "words.g3.npy"]


def _dead_pid() -> int:
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def test_stale_temp_dirs_of_a_killed_first_save_are_removed(tmp_path):
    index = FlatIndex(64)
    index.add(_codes(0, 5))
    dead = tmp_path / f".idx.tmp-{_dead_pid()}-0123abcd"
    dead.mkdir()
    (dead / "words.g1.npy").write_bytes(b"x" * 100)
    (dead / "ids.g1.npy").write_bytes(b"x" * 10)
    alive = tmp_path / f".idx.tmp-{os.getpid()}-89abcdef"  # a save in progress: kept
    alive.mkdir()
    foreign = tmp_path / f".idx.tmp-{_dead_pid()}-fedcba98"  # not only our files: kept
    foreign.mkdir()
    (foreign / "thesis.pdf").write_bytes(b"%PDF")
    old = tmp_path / f".idx.tmp-{os.getpid()}-00000000"  # older than the age limit
    old.mkdir()
    a_day_ago = time.time() - io.STALE_TEMP_AGE_S - 60
    os.utime(old, (a_day_ago, a_day_ago))
    index.save(tmp_path / "idx")
    assert not dead.exists() and not old.exists()
    assert alive.is_dir() and (foreign / "thesis.pdf").exists()
    index.save(tmp_path / "idx")  # saves over an existing save clean up too
    assert len(FlatIndex.load(tmp_path / "idx")) == 5


def _killed_first_save(save, after: int = 1) -> None:
    """Run ``save()`` in a forked child that SIGKILLs itself once it has written ``after``
    array files, so the temporary directory of the first save is left behind half-written."""
    pid = os.fork()
    if pid == 0:  # pragma: no cover - the child
        try:
            write_array, written = np.lib.format.write_array, []

            def write_then_die(*args, **kwargs):
                write_array(*args, **kwargs)
                written.append(1)
                if len(written) == after:
                    os.kill(os.getpid(), signal.SIGKILL)

            np.lib.format.write_array = write_then_die
            save()
        finally:
            os._exit(3)
    _, status = os.waitpid(pid, 0)
    assert os.WIFSIGNALED(status) and os.WTERMSIG(status) == signal.SIGKILL


def _temp_dirs(directory: Path) -> list[str]:
    return sorted(p.name for p in directory.iterdir() if ".tmp-" in p.name)


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
@pytest.mark.parametrize("then", ["save", "load"])
def test_killed_first_saves_are_removed_by_the_next_save_or_load_beside_them(tmp_path, then):
    """Issue 29: 13 killed first saves left 234 MiB of temporaries until the next save of
    the same path. Now a save or load of any path in the directory removes those of dead
    processes, composites' (a temporary holding component directories) included."""
    index = FlatIndex(64)
    index.add(_codes(0, 1000))
    index.save(tmp_path / "kept")
    X = np.random.default_rng(0).standard_normal((50, 8))
    searcher = hashlearn.Searcher(RandomHyperplaneLSH(64, random_state=0), rerank="euclidean")
    searcher.fit(X).add(X)
    _killed_first_save(lambda: index.save(tmp_path / "a"))
    assert len(_temp_dirs(tmp_path)) == 1
    _killed_first_save(lambda: index.save(tmp_path / "b"))  # removes a's
    assert len(_temp_dirs(tmp_path)) == 1
    # a composite killed once its own arrays and one component are on disk: removes b's
    _killed_first_save(lambda: searcher.save(tmp_path / "searcher"), after=4)
    (temp,) = _temp_dirs(tmp_path)
    assert temp.startswith(".searcher.tmp-") and (tmp_path / temp / "meta.json").is_file()
    assert any(p.is_dir() for p in (tmp_path / temp).iterdir())
    alive = tmp_path / f".d.tmp-{os.getpid()}@{io._host_tag()}-01234567"  # a save under way
    alive.mkdir()
    elsewhere = tmp_path / f".e.tmp-{_dead_pid()}@00000000-01234567"  # another machine's
    elsewhere.mkdir()
    if then == "save":
        index.save(tmp_path / "z")
    else:
        assert len(hashlearn.load(tmp_path / "kept")) == 1000
    assert _temp_dirs(tmp_path) == sorted([alive.name, elsewhere.name])
    assert not any((tmp_path / name).exists() for name in ("a", "b", "searcher"))


# ----------------------------------------------------------- Files 3: hasher state


@pytest.fixture
def saved_hasher(tmp_path) -> Path:
    X = np.random.default_rng(0).standard_normal((40, 6))
    path = tmp_path / "lsh"
    RandomHyperplaneLSH(16, random_state=0).fit(X).save(path)
    return path


@pytest.mark.parametrize("key", ["encode", "transform", "__class__", "_bits", "n_bits", "x y_"])
def test_hasher_state_cannot_set_arbitrary_attributes(saved_hasher, key):
    _edit_meta(saved_hasher, lambda m: m["state"].update({key: 1}))
    with pytest.raises(ValueError, match=key):
        io.load(saved_hasher)


@io.persistable
class _DeclaredLSH(RandomHyperplaneLSH):
    """A hasher declaring its fitted attributes and their shapes (the class-level hooks)."""

    _fitted_attributes = frozenset({"n_bits_", "n_features_in_", "components_", "mean_", "offset_"})
    _state_shapes = {
        "components_": ("n_bits_", "n_features_in_"),
        "mean_": ("n_features_in_",),
        "offset_": ("n_bits_",),
    }


def test_declared_fitted_attributes_and_shapes_are_enforced(tmp_path):
    X = np.random.default_rng(0).standard_normal((40, 6))
    hasher = _DeclaredLSH(16, random_state=0).fit(X)
    hasher.save(tmp_path / "h")
    assert isinstance(io.load(tmp_path / "h"), _DeclaredLSH)
    _edit_meta(tmp_path / "h", lambda m: m["state"].update(extra_=1))
    with pytest.raises(ValueError, match="extra_"):
        io.load(tmp_path / "h")
    hasher.mean_ = np.zeros(7)  # encode never reads it: only the declaration catches it
    hasher.save(tmp_path / "h2")
    with pytest.raises(ValueError, match="mean_ has shape"):
        io.load(tmp_path / "h2")


def test_hasher_params_must_be_constructor_parameters(saved_hasher):
    _edit_meta(saved_hasher, lambda m: m["params"].update(encode=1))
    with pytest.raises(ValueError, match="encode"):
        io.load(saved_hasher)


@pytest.mark.parametrize("n_bits", [32, 12, 8])
def test_edited_n_bits_is_refused(saved_hasher, n_bits):
    def edit(meta):
        meta["params"]["n_bits"] = n_bits
        if "n_bits_" in meta["state"]:
            meta["state"]["n_bits_"] = n_bits

    _edit_meta(saved_hasher, edit)
    with pytest.raises(ValueError, match="n_bits|bits"):
        io.load(saved_hasher)


@pytest.mark.parametrize("name", ["components_", "offset_"])
@pytest.mark.parametrize("axis", [0, -1])
def test_hasher_arrays_of_the_wrong_shape_are_refused(saved_hasher, name, axis):
    meta = json.loads((saved_hasher / "meta.json").read_text())
    entry = meta["arrays"][name]
    arr = np.load(saved_hasher / entry["file"])
    bad = np.concatenate([arr, arr.take([0], axis=axis)], axis=axis)  # one row/column more
    np.save(saved_hasher / entry["file"], bad)
    entry["shape"] = list(bad.shape)
    (saved_hasher / "meta.json").write_text(json.dumps(meta))
    _rehash(saved_hasher, name)
    with pytest.raises(ValueError, match="inconsistent"):
        io.load(saved_hasher)


def test_hasher_arrays_must_be_finite(saved_hasher):
    meta = json.loads((saved_hasher / "meta.json").read_text())
    name, entry = next((k, v) for k, v in meta["arrays"].items() if v["dtype"][1] == "f")
    arr = np.load(saved_hasher / entry["file"])
    arr.flat[0] = np.nan
    np.save(saved_hasher / entry["file"], arr)
    _rehash(saved_hasher, name)
    with pytest.raises(ValueError, match="NaN"):
        io.load(saved_hasher)


def test_a_valid_hasher_save_still_round_trips(saved_hasher):
    X = np.random.default_rng(1).standard_normal((10, 6))
    loaded = hashlearn.load(saved_hasher)
    expected = RandomHyperplaneLSH(16, random_state=0).fit(
        np.random.default_rng(0).standard_normal((40, 6))
    )
    np.testing.assert_array_equal(loaded.encode(X), expected.encode(X))


# ------------------------------------------------------------------------------ Inputs


@pytest.fixture(scope="module")
def flat64():
    index = FlatIndex(64)
    index.add(_codes(0, 200))
    return index


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_matrix_queries_give_the_ndarray_results(flat64):
    queries = _codes(1, 7)
    expected = flat64.search(queries, 5)
    for got, want in zip(flat64.search(np.asmatrix(queries), 5), expected, strict=True):
        np.testing.assert_array_equal(got, want)
    for got, want in zip(
        flat64.range_search(np.asmatrix(queries), 28), flat64.range_search(queries, 28), strict=True
    ):
        np.testing.assert_array_equal(got, want)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_matrix_codes_are_added_like_an_ndarray():
    a, b = FlatIndex(64), FlatIndex(64)
    a.add(_codes(0, 30))
    b.add(np.asmatrix(_codes(0, 30)))
    np.testing.assert_array_equal(a.codes, b.codes)


def test_masked_queries_are_refused_when_anything_is_masked(flat64):
    queries = _codes(1, 4)
    unmasked = np.ma.masked_array(queries, mask=np.zeros(queries.shape, bool))
    for got, want in zip(flat64.search(unmasked, 3), flat64.search(queries, 3), strict=True):
        np.testing.assert_array_equal(got, want)
    masked = np.ma.masked_array(queries, mask=np.zeros(queries.shape, bool))
    masked[1, 2] = np.ma.masked
    with pytest.raises(ValueError, match="queries.*masked"):
        flat64.search(masked, 3)
    with pytest.raises(ValueError, match="codes.*masked"):
        FlatIndex(64).add(masked)


@pytest.mark.filterwarnings("ignore::PendingDeprecationWarning")
def test_hasher_input_matrix_is_converted_and_masked_values_refused():
    pytest.importorskip("hashlearn.hashers.base")
    from hashlearn.hashers import base

    if "as_plain_array" not in vars(base):
        pytest.xfail("hashers/base.py _check_X does not call _validation.as_plain_array yet")
    X = np.random.default_rng(0).standard_normal((30, 5))
    hasher = RandomHyperplaneLSH(16, random_state=0).fit(X)
    np.testing.assert_array_equal(hasher.encode(np.asmatrix(X)), hasher.encode(X))
    masked = np.ma.masked_array(X, mask=np.zeros(X.shape, bool))
    masked[0, 0] = np.ma.masked
    with pytest.raises(ValueError, match="X.*masked"):
        hasher.encode(masked)


@pytest.mark.parametrize("k", [2**31, 2**40, 2**62])
def test_huge_k_is_a_value_error_naming_k(flat64, k):
    with pytest.raises(ValueError, match="'k'"):
        flat64.search(_codes(1, 3), k)


def test_check_k_bounds_k_by_int32_and_by_memory():
    from hashlearn._utils.validation import K_MAX, check_k

    assert check_k(10, 5) == 10 and check_k(2**20, 1) == 2**20
    for bad in (0, -1, K_MAX + 1, True, 2.0, "3", None):
        with pytest.raises(ValueError, match="'k'"):
            check_k(bad, 5)
    with pytest.raises(ValueError, match="'k'.*memory"):
        check_k(K_MAX, 10**9)  # 12 bytes * 2**31 * 10**9 fits no machine


# -------------------------------------------------------------------- The command line


def _write_idx(path: Path, arr: np.ndarray, compress: bool = False) -> None:
    import gzip

    codes = {"uint8": 0x08, "int32": 0x0C}
    data = bytes([0, 0, codes[arr.dtype.name], arr.ndim])
    data += (
        np.asarray(arr.shape, ">i4").tobytes() + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    )
    path.write_bytes(gzip.compress(data) if compress else data)


def _fashion_dir(root: Path, damage: str) -> Path:
    """A tiny Fashion-MNIST directory (train gzipped, test plain) with one defect."""
    directory = root / f"fashion-{damage}"
    directory.mkdir()
    for part, n in (("train", 6), ("t10k", 4)):
        images = np.zeros((n, 28, 28), np.uint8)
        labels = np.arange(n, dtype=np.uint8)
        compress = part == "train"
        suffix = ".gz" if compress else ""
        _write_idx(directory / f"{part}-images-idx3-ubyte{suffix}", images, compress)
        _write_idx(directory / f"{part}-labels-idx1-ubyte{suffix}", labels, compress)
    train_images = directory / "train-images-idx3-ubyte.gz"
    if damage == "truncated-gz":
        train_images.write_bytes(train_images.read_bytes()[:40])
    elif damage == "wrong-magic":
        (directory / "t10k-images-idx3-ubyte").write_bytes(b"\x08\x03\x00\x00" + b"\0" * 100)
    elif damage == "wrong-counts":
        _write_idx(directory / "t10k-labels-idx1-ubyte", np.arange(3, dtype=np.uint8))
    elif damage == "wrong-labels":
        _write_idx(directory / "t10k-labels-idx1-ubyte", np.full(4, 200, np.uint8))
    elif damage == "bad-gzip-crc":
        raw = bytearray(train_images.read_bytes())
        raw[-6] ^= 0xFF  # the CRC32 trailer
        train_images.write_bytes(bytes(raw))
    return directory


def _write_ann_file(path: Path, **override) -> Path:
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(0)
    arrays = {
        "train": rng.standard_normal((30, 4)).astype(np.float32),
        "test": rng.standard_normal((3, 4)).astype(np.float32),
        "neighbors": rng.integers(0, 30, (3, 5)).astype(np.int32),
        "distances": rng.random((3, 5)).astype(np.float32),
    }
    attrs = {"distance": "euclidean"}
    for key, value in override.items():
        (attrs if key in ("distance", "type") else arrays)[key] = value
    with h5py.File(path, "w") as f:
        for key, value in attrs.items():
            if value is not None:
                f.attrs[key] = value
        for key, value in arrays.items():
            if value is None:
                continue
            if isinstance(value, dict):
                f.create_group(key)
            else:
                f.create_dataset(key, data=value)
    return path


@pytest.fixture(scope="module")
def cli_files(tmp_path_factory):
    pytest.importorskip("h5py")
    root = tmp_path_factory.mktemp("cli")
    files = {"root": root}
    files["good"] = _write_ann_file(root / "good.hdf5")
    files["text"] = root / "notes.hdf5"
    files["text"].write_text("not an HDF5 file\n")
    files["truncated"] = root / "truncated.hdf5"
    files["truncated"].write_bytes(files["good"].read_bytes()[:300])
    files["no-neighbors"] = _write_ann_file(root / "no-neighbors.hdf5", neighbors=None)
    files["no-distance"] = _write_ann_file(root / "no-distance.hdf5", distance=None)
    files["sparse"] = _write_ann_file(root / "sparse.hdf5", type="sparse")
    files["shapes"] = _write_ann_file(root / "shapes.hdf5", test=np.zeros((3, 5), np.float32))
    files["strings"] = _write_ann_file(
        root / "strings.hdf5", train=np.array([b"a", b"b"] * 15).reshape(30, 1)
    )
    files["group"] = _write_ann_file(root / "group.hdf5", train={})
    files["ids"] = _write_ann_file(root / "ids.hdf5", neighbors=np.full((3, 5), 99, np.int32))
    files["afile"] = root / "afile"
    files["afile"].write_text("x")
    for damage in ("truncated-gz", "wrong-magic", "wrong-counts", "wrong-labels", "bad-gzip-crc"):
        files[damage] = _fashion_dir(root, damage)
    files["empty"] = root / "empty-dir"
    files["empty"].mkdir()
    return files


def _cli_cases(f):
    """(arguments, a substring the one-line error must contain): 35 erroneous invocations."""
    out = str(f["root"] / "out")
    under_file = str(f["afile"] / "sub")
    demo_fashion = ["demo", "--dataset", "fashion-mnist", "--quick", "--out", out, "--data-dir"]
    bench = ["bench", "ann"]
    return [
        (["nope"], "nope"),
        (["--nope"], "--nope"),
        (["info", "extra"], "extra"),
        (["demo", "--bits", "0"], "--bits"),
        (["demo", "--bits", "abc"], "--bits"),
        (["demo", "--n-queries", "0"], "--n-queries"),
        (["demo", "--n-queries", "5000", "--out", out], "n_queries"),
        (["demo", "--dataset", "nope"], "--dataset"),
        (["demo", "--hashers", "lsh,nope", "--out", out], "nope"),
        (["demo", "--seed", "-1"], "--seed"),
        (["demo", "--quick", "--out", str(f["afile"])], "--out"),
        (["demo", "--quick", "--out", under_file], "--out"),
        ([*demo_fashion, str(f["empty"])], "apt-get"),
        ([*demo_fashion, str(f["truncated-gz"])], "train-images-idx3-ubyte.gz"),
        ([*demo_fashion, str(f["bad-gzip-crc"])], "train-images-idx3-ubyte.gz"),
        ([*demo_fashion, str(f["wrong-magic"])], "t10k-images-idx3-ubyte"),
        ([*demo_fashion, str(f["wrong-counts"])], "t10k-labels-idx1-ubyte"),
        ([*demo_fashion, str(f["wrong-labels"])], "t10k-labels-idx1-ubyte"),
        (["reproduce", "nope"], "nope"),
        (["reproduce", "survey", "--quick", "--out", str(f["afile"])], "--out"),
        (
            ["reproduce", "survey", "--quick", "--out", out, "--results", str(f["empty"])],
            "--results",
        ),
        (["reproduce", "survey", "--quick", "--out", out, "--results", under_file], "--results"),
        (
            ["reproduce", "search-forest", "--quick", "--out", out, "--data-dir"]
            + [str(f["truncated-gz"])],
            "train-images-idx3-ubyte.gz",
        ),
        ([*bench], "FILE"),
        ([*bench, str(f["root"] / "missing.hdf5")], "missing.hdf5"),
        ([*bench, str(f["empty"])], "empty-dir"),
        ([*bench, str(f["text"]), "--out", out], "notes.hdf5"),
        ([*bench, str(f["truncated"]), "--out", out], "truncated.hdf5"),
        ([*bench, str(f["no-neighbors"]), "--out", out], "neighbors"),
        ([*bench, str(f["no-distance"]), "--out", out], "distance"),
        ([*bench, str(f["sparse"]), "--out", out], "sparse"),
        ([*bench, str(f["shapes"]), "--out", out], "shapes"),
        ([*bench, str(f["strings"]), "--out", out], "train"),
        ([*bench, str(f["group"]), "--out", out], "train"),
        ([*bench, str(f["ids"]), "--out", out, "--index", "flat"], "ids.hdf5"),
        ([*bench, str(f["good"]), "--out", str(f["afile"])], "--out"),
        ([*bench, str(f["good"]), "--out", out, "--results", under_file], "--results"),
        ([*bench, str(f["good"]), "--index", "nope"], "--index"),
        ([*bench, str(f["good"]), "-k", "0"], "-k"),
        ([*bench, str(f["good"]), "--out", out, "-k", "6"], "k=6 exceeds the 5 ground-truth"),
        ([*bench, str(f["good"]), "--bits", "0"], "--bits"),
    ]


def _no_real_work(monkeypatch) -> None:
    """Make any case that slips past the checks fail at once instead of running for minutes."""
    from hashlearn.experiments import ann_bench, survey

    def started(*args, **kwargs):
        raise AssertionError("the work started although the invocation is erroneous")

    monkeypatch.setattr(ann_bench, "sweep", started)
    monkeypatch.setattr(survey, "run", started)


def test_every_erroneous_invocation_is_one_line_with_status_2(cli_files, monkeypatch):
    from click.testing import CliRunner

    from hashlearn.cli import main

    _no_real_work(monkeypatch)
    cases = _cli_cases(cli_files)
    assert len(cases) >= 31
    for args, needle in cases:
        result = CliRunner().invoke(main, args)
        where = f"hashlearn {' '.join(args)}:\n{result.output}"
        assert result.exit_code == 2, where
        assert not isinstance(result.exception, Exception) or isinstance(
            result.exception, SystemExit
        ), where
        lines = result.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("Error: "), where
        assert "Traceback" not in result.output, where
        assert needle in lines[0], where


def test_unwritable_outputs_are_refused_before_the_work(cli_files, tmp_path, monkeypatch):
    """An --out or --results that cannot be written is reported before the run starts (it
    was noticed only after the whole run)."""
    from click.testing import CliRunner

    from hashlearn.cli import check_output_dir, check_output_file, main

    _no_real_work(monkeypatch)
    readonly = tmp_path / "ro"
    readonly.mkdir()
    readonly.chmod(0o500)
    try:
        if os.access(readonly, os.W_OK):  # root ignores permission bits
            target = cli_files["afile"] / "results.md"
        else:
            target = readonly / "results.md"
        start = time.perf_counter()
        result = CliRunner().invoke(
            main,
            ["bench", "ann", str(cli_files["good"]), "--out", str(tmp_path / "o"), "--results"]
            + [str(target)],
        )
        assert result.exit_code == 2 and "--results" in result.stderr
        assert not (tmp_path / "o").exists()
        assert time.perf_counter() - start < 5
    finally:
        readonly.chmod(0o700)
    assert check_output_dir(tmp_path / "new" / "deeper") == tmp_path / "new" / "deeper"
    assert not (tmp_path / "new").exists()  # the check creates nothing
    assert check_output_file(tmp_path / "r.md") == tmp_path / "r.md"


def test_a_real_process_prints_one_line_without_traceback(cli_files):
    proc = subprocess.run(
        [sys.executable, "-m", "hashlearn", "bench", "ann", str(cli_files["text"])],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.count("\n") == 1 and proc.stderr.startswith("Error: "), proc.stderr
    assert "notes.hdf5" in proc.stderr


# ------------------------------------------------------------------------ numba's cache


def _run_without_numba_cache_dir(tmp_path: Path, code: str) -> tuple[str, Path]:
    """Run ``code`` in a Python with no home directory, NUMBA_CACHE_DIR and the user cache
    unwritable and a read-only copy of hashlearn (every ``__pycache__`` unusable)."""
    import shutil

    package = Path(hashlearn.__file__).parent
    site = tmp_path / "site"
    shutil.copytree(package, site / "hashlearn", ignore=shutil.ignore_patterns("__pycache__"))
    for directory in [site / "hashlearn", *(site / "hashlearn").rglob("*")]:
        if directory.is_dir():
            (directory / "__pycache__").write_bytes(b"")  # a file: no cache can go there
    blocker = tmp_path / "a-file"
    blocker.write_bytes(b"")
    readonly = tmp_path / "readonly"
    readonly.mkdir()
    readonly.chmod(0o500)  # read-only for a normal user; root is stopped by the file below
    temp = tmp_path / "tmp"
    temp.mkdir()
    env = {k: v for k, v in os.environ.items() if k not in ("HOME", "NUMBA_CACHE_DIR")}
    env.update(
        PYTHONPATH=str(site),
        PYTHONDONTWRITEBYTECODE="1",
        NUMBA_CACHE_DIR=str(readonly if not os.access(readonly, os.W_OK) else blocker / "c"),
        XDG_CACHE_HOME=str(blocker / "xdg"),
        TMPDIR=str(temp),
    )
    script = (
        "import hashlearn\n"
        "from hashlearn._utils import numba_config as _numba_config\n"
        f"assert hashlearn.__file__.startswith({str(site)!r}), hashlearn.__file__\n"
        "print(_numba_config.CACHE_FALLBACK)\n" + code
    )
    try:
        proc = subprocess.run(
            [sys.executable, "-c", script],
            env=env,
            cwd=tmp_path,
            capture_output=True,
            text=True,
            timeout=300,
            check=False,
        )
    finally:
        readonly.chmod(0o700)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stdout, temp


def test_import_works_without_any_writable_numba_cache_dir(tmp_path):
    """Importing used to raise numba's "cannot cache function ... no locator available"
    there; now numba's cache points at a private temporary directory."""
    out, temp = _run_without_numba_cache_dir(tmp_path, "")
    fallback = Path(out.split("\n")[0])
    assert fallback.parent == temp and fallback.is_dir()
    assert fallback.stat().st_mode & 0o077 == 0  # private to the user


@pytest.mark.slow
def test_kernels_compile_and_cache_without_any_writable_numba_cache_dir(tmp_path):
    code = (
        "import numpy as np\n"
        "from hashlearn.index import FlatIndex\n"
        "index = FlatIndex(64)\n"
        "index.add(np.arange(24, dtype=np.uint8).reshape(3, 8))\n"
        "print(index.search(np.zeros((1, 8), np.uint8), 2)[1].tolist())\n"
    )
    out, temp = _run_without_numba_cache_dir(tmp_path, code)
    fallback, result = out.split("\n")[:2]
    assert result == "[[0, 1]]"
    assert any(Path(fallback).rglob("*.nbi"))  # compiled kernels were cached there


# ----------------------------------------------------------------- fuzzing the loaders
#
# Each fuzz target runs a few hundred examples in the fast suite and 10^4 in the slow one
# (`make test-all`, CI's full run): every damaged input is loaded or refused with a
# ValueError (FileNotFoundError for a save whose meta.json is gone), never another error.

from hypothesis import HealthCheck, given, settings  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

FUZZ_FAST = settings(
    max_examples=200,
    deadline=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
    database=None,
)
FUZZ_FULL = settings(FUZZ_FAST, max_examples=10_000)


def _save_template() -> dict[str, bytes]:
    import tempfile

    with tempfile.TemporaryDirectory() as tmp:
        index = FlatIndex(64)
        index.add(_codes(0, 12), ids=np.arange(12) * 3 + 1)
        index.save(Path(tmp) / "idx")
        opened = FlatIndex.open(Path(tmp) / "idx")
        opened.add(_codes(1, 3))  # an appended block too
        return {p.name: p.read_bytes() for p in (Path(tmp) / "idx").iterdir()}


_TEMPLATE = _save_template()
json_values = st.recursive(
    st.none() | st.booleans() | st.integers(-(2**70), 2**70) | st.floats() | st.text(max_size=8),
    lambda inner: (
        st.lists(inner, max_size=3) | st.dictionaries(st.text(max_size=6), inner, max_size=3)
    ),
    max_leaves=6,
)


def _paths(node, prefix=()):
    yield prefix
    if isinstance(node, dict):
        for key, value in node.items():
            yield from _paths(value, (*prefix, key))
    elif isinstance(node, list):
        for i, value in enumerate(node):
            yield from _paths(value, (*prefix, i))


@st.composite
def damaged_saves(draw):
    files = dict(_TEMPLATE)
    meta = json.loads(files["meta.json"])
    kind = draw(st.sampled_from(["meta-value", "meta-delete", "meta-bytes", "array", "both"]))
    if kind in ("meta-value", "meta-delete", "both"):
        paths = [p for p in _paths(meta) if p]
        path = draw(st.sampled_from(paths))
        parent = meta
        for key in path[:-1]:
            parent = parent[key]
        if kind == "meta-delete":
            del parent[path[-1]]
        else:
            parent[path[-1]] = draw(json_values)
        files["meta.json"] = json.dumps(meta).encode()
    if kind == "meta-bytes":
        raw = bytearray(files["meta.json"])
        for _ in range(draw(st.integers(1, 4))):
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        files["meta.json"] = bytes(raw)
    if kind in ("array", "both"):
        name = draw(st.sampled_from(sorted(n for n in files if n.endswith(".npy"))))
        raw = bytearray(files[name])
        action = draw(st.sampled_from(["flip", "truncate", "extend", "header"]))
        if action == "flip":
            for _ in range(draw(st.integers(1, 8))):
                raw[draw(st.integers(0, len(raw) - 1))] ^= 1 << draw(st.integers(0, 7))
        elif action == "truncate":
            del raw[draw(st.integers(0, len(raw) - 1)) :]
        elif action == "extend":
            raw += draw(st.binary(min_size=1, max_size=64))
        else:  # rewrite the .npy header's dict
            header = draw(st.sampled_from([b"'<u8'", b"'<i8'", b"'|u1'", b"'|O'", b"(1,)"]))
            start = raw.find(b"'descr': ") + len(b"'descr': ")
            raw[start : start + len(header)] = header
        files[name] = bytes(raw)
        if draw(st.booleans()) and kind == "array":  # a crafted save: checksums made to match
            meta = json.loads(files["meta.json"])
            for entry in meta["arrays"].values():
                if entry["file"] == name and "appended" not in entry:
                    entry["sha256"] = hashlib.sha256(files[name]).hexdigest()
            files["meta.json"] = json.dumps(meta).encode()
    return files, draw(st.booleans()), draw(st.booleans())


def _check_damaged_save(case) -> None:
    import tempfile

    files, mmap, verify = case
    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "idx"
        path.mkdir()
        for name, content in files.items():
            (path / name).write_bytes(content)
        try:
            loaded = io.load(path, mmap=mmap, verify=verify)
        except ValueError as exc:
            assert str(exc)
            return
        assert isinstance(loaded, FlatIndex)
        D, I = loaded.search(_codes(9, 2), 4)  # a loaded index must be usable
        assert D.shape == I.shape == (2, 4)
        del loaded, D, I


@FUZZ_FAST
@given(damaged_saves())
def test_fuzz_damaged_saves(case):
    _check_damaged_save(case)


@pytest.mark.slow
@FUZZ_FULL
@given(damaged_saves())
def test_fuzz_damaged_saves_full(case):
    _check_damaged_save(case)


def _idx_bytes(arr: np.ndarray) -> bytes:
    codes = {"uint8": 0x08, "int8": 0x09, "int16": 0x0B, "int32": 0x0C, "float32": 0x0D}
    head = bytes([0, 0, codes[arr.dtype.name], arr.ndim]) + np.asarray(arr.shape, ">i4").tobytes()
    return head + arr.astype(arr.dtype.newbyteorder(">")).tobytes()


@st.composite
def damaged_idx(draw):
    import gzip

    dtype = draw(st.sampled_from(["uint8", "int8", "int16", "int32", "float32"]))
    shape = draw(st.lists(st.integers(0, 5), min_size=0, max_size=3))
    raw = bytearray(_idx_bytes(np.zeros(shape, dtype)))
    for _ in range(draw(st.integers(0, 3))):
        action = draw(st.sampled_from(["flip", "truncate", "extend"]))
        if action == "flip" and raw:
            raw[draw(st.integers(0, len(raw) - 1))] = draw(st.integers(0, 255))
        elif action == "truncate":
            del raw[draw(st.integers(0, len(raw))) :]
        else:
            raw += draw(st.binary(max_size=16))
    data = bytes(raw)
    if draw(st.booleans()):
        data = bytearray(gzip.compress(data, compresslevel=1))
        if draw(st.booleans()):
            cut = draw(st.integers(0, len(data)))
            data = data[:cut] if draw(st.booleans()) else data
            if data and draw(st.booleans()):
                data[draw(st.integers(0, len(data) - 1))] ^= 0xFF
        data = bytes(data)
    return data


def _check_idx(data: bytes) -> None:
    import tempfile

    from hashlearn.datasets import read_idx

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x-idx1-ubyte"
        path.write_bytes(data)
        try:
            arr = read_idx(path)
        except ValueError as exc:
            assert str(path) in str(exc)
            return
        assert isinstance(arr, np.ndarray) and arr.dtype.isnative


@FUZZ_FAST
@given(damaged_idx())
def test_fuzz_idx_files(data):
    _check_idx(data)


@pytest.mark.slow
@FUZZ_FULL
@given(damaged_idx())
def test_fuzz_idx_files_full(data):
    _check_idx(data)


# ------------------------------------------------------------------------------ datasets


@pytest.mark.parametrize(
    ("damage", "culprit"),
    [
        ("truncated-gz", "train-images-idx3-ubyte.gz"),
        ("bad-gzip-crc", "train-images-idx3-ubyte.gz"),
        ("wrong-magic", "t10k-images-idx3-ubyte"),
        ("wrong-counts", "t10k-labels-idx1-ubyte"),
        ("wrong-labels", "t10k-labels-idx1-ubyte"),
    ],
)
def test_corrupted_fashion_mnist_is_one_value_error_naming_the_file(tmp_path, damage, culprit):
    from hashlearn.datasets import load_fashion_mnist

    directory = _fashion_dir(tmp_path, damage)
    with pytest.raises(ValueError) as info:
        load_fashion_mnist(directory)
    assert str(directory / culprit) in str(info.value)


@pytest.mark.parametrize(
    "name", ["text", "truncated", "no-neighbors", "sparse", "shapes", "strings", "group", "ids"]
)
def test_files_that_are_not_ann_benchmarks_are_a_value_error_naming_them(cli_files, name):
    from hashlearn.datasets import check_ann_benchmarks, load_ann_benchmarks

    path = cli_files[name]
    for reader in (load_ann_benchmarks, check_ann_benchmarks):
        with pytest.raises(ValueError) as info:
            reader(path)
        assert str(path) in str(info.value)
    assert load_ann_benchmarks(cli_files["good"]).train.shape == (30, 4)


def _check_fvecs(data: bytes) -> None:
    import tempfile

    from hashlearn.datasets import read_fvecs

    with tempfile.TemporaryDirectory() as tmp:
        path = Path(tmp) / "x.fvecs"
        path.write_bytes(data)
        try:
            X = read_fvecs(path)
        except ValueError as exc:
            assert str(path) in str(exc)
            return
        assert X.dtype == np.float32 and X.ndim == 2
        assert len(data) == X.shape[0] * (4 + 4 * X.shape[1])


fvecs_bytes = st.one_of(
    st.binary(max_size=64),
    st.builds(
        lambda d, n, tail: (np.int32(d).tobytes() + b"\0" * 4 * d) * n + tail,
        st.integers(-2, 6),
        st.integers(0, 4),
        st.binary(max_size=6),
    ),
)


@FUZZ_FAST
@given(fvecs_bytes)
def test_fuzz_fvecs_files(data):
    _check_fvecs(data)


@pytest.mark.slow
@FUZZ_FULL
@given(fvecs_bytes)
def test_fuzz_fvecs_files_full(data):
    _check_fvecs(data)


def test_a_kill_during_the_deletion_orphans_nothing(saved, monkeypatch):
    """Leftovers of an interrupted save and the old generation are recorded in the new
    meta.json before it is committed: a save killed while deleting them (simulated by an
    unlink that raises) leaves them to the next save, which removes them."""
    (saved / "words.g2.npy").write_bytes(b"half written")
    index = FlatIndex.load(saved)

    def killed(*args, **kwargs):
        raise KeyboardInterrupt

    with monkeypatch.context() as patch:
        patch.setattr(io.os, "unlink", killed)
        with pytest.raises(KeyboardInterrupt):
            index.save(saved)
    assert len(FlatIndex.load(saved)) == 50  # generation 3 is committed
    assert "words.g2.npy" in {p.name for p in saved.iterdir()}
    index.save(saved)
    assert sorted(p.name for p in saved.iterdir()) == ["ids.g4.npy", "meta.json", "words.g4.npy"]
