"""Saving and loading: round trips, generations, tampering, no pickle, crash safety."""

from __future__ import annotations

import hashlib
import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import numpy as np
import pytest
from sklearn.exceptions import NotFittedError

import hashlearn
from conftest import brute_knn, pack_le, unpack_le
from hashlearn import io
from hashlearn.hashers import RandomHyperplaneLSH
from hashlearn.index import FlatIndex


def random_index(n_bits=100, n=300, seed=0):
    rng = np.random.default_rng(seed)
    bits = (rng.random((n, n_bits)) < 0.5).astype(np.uint8)
    bits[n // 2 :] = bits[: n - n // 2]  # duplicates: ties
    ids = rng.choice(10 * n, size=n, replace=False)
    index = FlatIndex(n_bits)
    index.add(pack_le(bits), ids=ids)
    queries = (rng.random((15, n_bits)) < 0.5).astype(np.uint8)
    return index, bits, ids, queries


def assert_same_search(a, b, queries, k=12, radius=None):
    Da, Ia = a.search(queries, k)
    Db, Ib = b.search(queries, k)
    np.testing.assert_array_equal(Da, Db)
    np.testing.assert_array_equal(Ia, Ib)
    if radius is not None:
        for x, y in zip(
            a.range_search(queries, radius), b.range_search(queries, radius), strict=True
        ):
            np.testing.assert_array_equal(x, y)


def array_files(path: Path) -> list[str]:
    return sorted(p.name for p in path.iterdir() if p.suffix == ".npy")


# ---------------------------------------------------------------------------- round trips


@pytest.mark.parametrize("mmap", [False, True])
def test_flat_index_round_trip(tmp_path, mmap):
    index, bits, ids, q_bits = random_index()
    queries = pack_le(q_bits)
    path = tmp_path / "idx"
    index.save(path)
    loaded = FlatIndex.load(path, mmap=mmap)
    assert type(loaded) is FlatIndex
    assert loaded.n_bits == index.n_bits and len(loaded) == len(index)
    np.testing.assert_array_equal(loaded.ids, np.sort(ids))
    np.testing.assert_array_equal(unpack_le(loaded.codes, 100), bits[np.argsort(ids)])
    assert_same_search(loaded, index, queries, radius=45)
    D, I = brute_knn(q_bits, bits, ids, 12)
    np.testing.assert_array_equal(loaded.search(queries, 12)[1], I)
    # the loaded index keeps working as an index: numbering continues, add / remove work
    assert loaded.add(queries[:2]).tolist() == index.add(queries[:2]).tolist()
    loaded.remove(ids[:10])
    index.remove(ids[:10])
    assert_same_search(loaded, index, queries, radius=45)
    # and the files on disk did not change
    assert_same_search(FlatIndex.load(path), hashlearn.load(path), queries)
    assert len(FlatIndex.load(path)) == 300


def test_empty_index_round_trip(tmp_path):
    index = FlatIndex(70)
    index.add(np.zeros((2, 9), np.uint8))
    index.remove([0, 1])
    index.save(tmp_path / "e")
    for mmap in (False, True):
        loaded = FlatIndex.load(tmp_path / "e", mmap=mmap)
        assert len(loaded) == 0
        D, I = loaded.search(np.zeros((2, 9), np.uint8), 3)
        assert D.tolist() == I.tolist() == [[-1] * 3] * 2
        assert loaded.add(np.zeros((1, 9), np.uint8)).tolist() == [2]


@pytest.mark.parametrize("center", [True, False])
@pytest.mark.parametrize("mmap", [False, True])
def test_lsh_round_trip(tmp_path, center, mmap):
    rng = np.random.default_rng(1)
    X = rng.standard_normal((200, 12)) + 3.0
    hasher = RandomHyperplaneLSH(n_bits=45, center=center, random_state=5).fit(X)
    hasher.save(tmp_path / "h")
    loaded = RandomHyperplaneLSH.load(tmp_path / "h", mmap=mmap)
    assert type(loaded) is RandomHyperplaneLSH
    assert loaded.get_params() == hasher.get_params()
    assert loaded.n_features_in_ == 12
    Y = rng.standard_normal((50, 12)) + 3.0
    np.testing.assert_array_equal(loaded.encode(Y), hasher.encode(Y))
    np.testing.assert_array_equal(loaded.project(Y), hasher.project(Y))
    np.testing.assert_array_equal(loaded.components_, hasher.components_)
    np.testing.assert_array_equal(loaded.mean_, hasher.mean_)
    generic = io.load(tmp_path / "h")
    np.testing.assert_array_equal(generic.encode(Y), hasher.encode(Y))


def test_unfitted_or_unsaveable_hasher_is_refused(tmp_path):
    with pytest.raises(NotFittedError):
        RandomHyperplaneLSH(8).save(tmp_path / "u")
    assert not (tmp_path / "u").exists()
    X = np.random.default_rng(0).standard_normal((10, 3))
    hasher = RandomHyperplaneLSH(8, random_state=np.random.RandomState(0)).fit(X)
    with pytest.raises(TypeError, match="random_state"):
        hasher.save(tmp_path / "r")

    class NotRegistered(FlatIndex):
        pass

    with pytest.raises(TypeError, match="persistable"):
        io.save(NotRegistered(8), tmp_path / "n")


def test_load_checks_the_class(tmp_path):
    index, *_ = random_index()
    index.save(tmp_path / "idx")
    X = np.random.default_rng(0).standard_normal((10, 3))
    RandomHyperplaneLSH(8, random_state=0).fit(X).save(tmp_path / "h")
    with pytest.raises(TypeError, match="FlatIndex"):
        RandomHyperplaneLSH.load(tmp_path / "idx")
    with pytest.raises(TypeError, match="RandomHyperplaneLSH"):
        FlatIndex.load(tmp_path / "h")


# ---------------------------------------------------------------------------- generations


def test_saving_over_a_save_writes_a_new_generation_and_removes_the_old(tmp_path):
    path = tmp_path / "idx"
    index, bits, ids, q_bits = random_index()
    index.save(path)
    assert array_files(path) == ["ids.g1.npy", "words.g1.npy"]
    index.remove(ids[:100])
    index.add(pack_le(q_bits), ids=[10**6 + i for i in range(len(q_bits))])
    index.save(path)
    assert array_files(path) == ["ids.g2.npy", "words.g2.npy"]
    assert sorted(p.name for p in path.iterdir()) == ["ids.g2.npy", "meta.json", "words.g2.npy"]
    assert json.loads((path / "meta.json").read_text())["generation"] == 2
    assert_same_search(FlatIndex.load(path), index, pack_le(q_bits), radius=40)
    assert_same_search(FlatIndex.load(path, mmap=True), index, pack_le(q_bits))


def test_save_back_over_the_mmap_it_was_loaded_from(tmp_path):
    path = tmp_path / "idx"
    index, bits, ids, q_bits = random_index()
    index.save(path)
    loaded = FlatIndex.load(path, mmap=True)
    loaded.save(path)  # reads generation 1 through the map while writing generation 2
    loaded.add(pack_le(q_bits))
    loaded.save(path)
    index.add(pack_le(q_bits))
    assert array_files(path) == ["ids.g3.npy", "words.g3.npy"]
    assert_same_search(FlatIndex.load(path), index, pack_le(q_bits), radius=40)


def test_saved_directory_has_ordinary_permissions(tmp_path):
    """The save is as readable as a directory made with mkdir (umask), like its files."""
    index, *_ = random_index()
    index.save(tmp_path / "idx")
    (tmp_path / "plain").mkdir()
    mode = (tmp_path / "idx").stat().st_mode & 0o777
    assert mode == (tmp_path / "plain").stat().st_mode & 0o777, oct(mode)


def test_refuses_to_overwrite_a_directory_that_is_not_a_save(tmp_path):
    index, *_ = random_index()
    target = tmp_path / "mine"
    target.mkdir()
    (target / "notes.txt").write_text("precious")
    with pytest.raises(FileExistsError, match="hashlearn"):
        index.save(target)
    assert sorted(p.name for p in target.iterdir()) == ["notes.txt"]
    assert (target / "notes.txt").read_text() == "precious"
    afile = tmp_path / "afile"
    afile.write_text("x")
    with pytest.raises(FileExistsError):
        index.save(afile)
    assert afile.read_text() == "x"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["afile", "mine"]  # no leftovers


# ------------------------------------------------------------------------ damaged saves


@pytest.fixture
def saved(tmp_path):
    index, bits, ids, q_bits = random_index()
    path = tmp_path / "idx"
    index.save(path)
    return path


@pytest.mark.parametrize("mmap", [False, True])
def test_flipped_byte_fails_the_checksum(saved, mmap):
    words = saved / "words.g1.npy"
    raw = bytearray(words.read_bytes())
    raw[-5] ^= 0x10
    words.write_bytes(bytes(raw))
    with pytest.raises(ValueError, match="checksum"):
        FlatIndex.load(saved, mmap=mmap)


@pytest.mark.parametrize("mmap", [False, True])
@pytest.mark.parametrize("keep", [0, 5, 60, -8])
def test_truncated_array_file_is_a_clear_value_error(saved, mmap, keep):
    words = saved / "words.g1.npy"
    raw = words.read_bytes()
    words.write_bytes(raw[:keep] if keep >= 0 else raw[:keep])
    with pytest.raises(ValueError, match="words.g1.npy.*(truncated|corrupted)"):
        FlatIndex.load(saved, mmap=mmap, verify=False)
    with pytest.raises(ValueError, match="checksum"):
        FlatIndex.load(saved, mmap=mmap)


def test_missing_array_file(saved):
    (saved / "ids.g1.npy").unlink()
    with pytest.raises(ValueError, match="missing"):
        FlatIndex.load(saved)


def edit_meta(path: Path, fn) -> None:
    meta = json.loads((path / "meta.json").read_text())
    fn(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def test_newer_format_version_asks_to_upgrade(saved):
    edit_meta(saved, lambda m: m.update(format_version=999))
    with pytest.raises(ValueError, match="(?i)upgrade"):
        FlatIndex.load(saved)


def test_unknown_class_is_refused_without_importing_anything(saved):
    edit_meta(saved, lambda m: m.update({"class": "subprocess.Popen"}))
    with pytest.raises(ValueError, match="unknown class"):
        io.load(saved)


@pytest.mark.parametrize(
    "content",
    [
        b"",
        b"{not json",
        b'{"format": "hashlearn", "form',
        b"\xff\xfe\x00garbage",
        b"[1, 2]",
        b'"hashlearn"',
        b'{"format": "other", "format_version": 1}',
    ],
)
def test_unreadable_meta_json_is_a_value_error(saved, content):
    (saved / "meta.json").write_bytes(content)
    with pytest.raises(ValueError, match="meta.json"):
        FlatIndex.load(saved)


def _arrays_list(m):
    m["arrays"] = list(m["arrays"])


def _entry_without_file(m):
    del m["arrays"]["words"]["file"]


def _entry_without_sha(m):
    del m["arrays"]["words"]["sha256"]


def _entry_is_a_string(m):
    m["arrays"]["ids"] = "ids.g1.npy"


def _class_is_a_list(m):
    m["class"] = ["FlatIndex"]


def _params_is_a_list(m):
    m["params"] = [100]


@pytest.mark.parametrize(
    "damage",
    [
        _arrays_list,
        _entry_without_file,
        _entry_without_sha,
        _entry_is_a_string,
        _class_is_a_list,
        _params_is_a_list,
    ],
)
def test_structurally_corrupted_meta_json_is_a_value_error(saved, damage):
    """read_dir promises that every check failure is a ValueError, not a KeyError etc."""
    edit_meta(saved, damage)
    with pytest.raises(ValueError):
        FlatIndex.load(saved)


# ------------------------------------------------------------------------------ no pickle


def test_loading_never_unpickles(saved, monkeypatch):
    """Arrays are read from their .npy header and bytes: no pickle, no np.load with pickle."""
    import pickle

    def refuse(*args, **kwargs):
        raise AssertionError("something was unpickled")

    calls = []
    real_load = np.load

    def spy(*args, **kwargs):
        calls.append(kwargs)
        return real_load(*args, **kwargs)

    monkeypatch.setattr(pickle, "load", refuse)
    monkeypatch.setattr(pickle, "loads", refuse)
    monkeypatch.setattr(np, "load", spy)
    FlatIndex.load(saved)
    FlatIndex.load(saved, mmap=True, verify=False)
    assert all(kw.get("allow_pickle") is False for kw in calls)


def test_object_arrays_cannot_be_saved(tmp_path):
    with pytest.raises(TypeError, match="object"):
        io.write_dir(
            tmp_path / "o",
            "FlatIndex",
            {"n_bits": 8},
            {"next_id": 0},
            {"ids": np.array([1, None], dtype=object)},
        )
    assert not (tmp_path / "o").exists()
    assert list(tmp_path.iterdir()) == []  # the temporary sibling is gone too
    X = np.random.default_rng(0).standard_normal((10, 3))
    hasher = RandomHyperplaneLSH(8, random_state=0).fit(X)
    hasher.mean_ = np.array(list(hasher.mean_), dtype=object)
    with pytest.raises(TypeError, match="object"):
        hasher.save(tmp_path / "h")


class _Exploit:
    def __init__(self, marker):
        self.marker = marker

    def __reduce__(self):
        return (os.mkdir, (self.marker,))


def test_a_pickled_array_in_a_save_is_never_unpickled(saved, tmp_path):
    marker = str(tmp_path / "pwned")
    evil = saved / "ids.g1.npy"
    np.save(evil, np.array([_Exploit(marker)], dtype=object), allow_pickle=True)
    sha = hashlib.sha256(evil.read_bytes()).hexdigest()  # a consistent, malicious save

    def point_to_evil(m):
        m["arrays"]["ids"]["sha256"] = sha
        m["arrays"]["ids"]["dtype"] = "|O"
        m["arrays"]["ids"]["shape"] = [1]

    edit_meta(saved, point_to_evil)
    for mmap in (False, True):
        for verify in (False, True):
            with pytest.raises(ValueError):
                FlatIndex.load(saved, mmap=mmap, verify=verify)
    assert not os.path.exists(marker)


# --------------------------------------------------------------------------- crash safety

_VERSIONS = textwrap.dedent("""
    import numpy as np
    from hashlearn.index import FlatIndex

    def make_version(v, n=300_000):
        rng = np.random.default_rng(v)
        index = FlatIndex(256)
        index.add(rng.integers(0, 256, (n, 32), dtype=np.uint8),
                  ids=np.arange(n, dtype=np.int64) * 2 + v)
        return index
""")

_CHILD = _VERSIONS + textwrap.dedent("""
    import os, sys
    path = sys.argv[1]
    versions = [make_version(1), make_version(2)]
    print("ready", flush=True)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:  # save versions 1, 2, 1, ... over the same directory until killed
            try:
                i = 1
                while True:
                    versions[i % 2].save(path)
                    i += 1
            finally:
                os._exit(3)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("reaped", flush=True)
""")


def _readline(proc, timeout=20.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError("the saving subprocess did not answer in time")
    return proc.stdout.readline().strip()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_killing_a_save_midway_leaves_a_loadable_index(tmp_path):
    namespace: dict = {}
    exec(_VERSIONS, namespace)
    versions = {v: namespace["make_version"](v) for v in (1, 2)}
    rng = np.random.default_rng(9)
    queries = rng.integers(0, 256, (4, 32), dtype=np.uint8)
    expected = {v: index.search(queries, 5) for v, index in versions.items()}
    path = tmp_path / "idx"
    versions[1].save(path)  # generation 1; the child saves over it

    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(Path(hashlearn.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    seen = set()
    try:
        assert _readline(proc) == "ready"
        for delay in (0.0, 0.011, 0.037, 0.06, 0.093, 0.15, 0.26):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            pid = int(_readline(proc))
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            assert _readline(proc) == "reaped"
            loaded = FlatIndex.load(path)  # verifies every checksum
            version = int(loaded.ids[0]) % 2 or 2
            seen.add(version)
            reference = versions[version]
            np.testing.assert_array_equal(loaded.ids, reference.ids)
            np.testing.assert_array_equal(loaded.codes, reference.codes)
            D, I = loaded.search(queries, 5)
            np.testing.assert_array_equal(D, expected[version][0])
            np.testing.assert_array_equal(I, expected[version][1])
            mapped = FlatIndex.load(path, mmap=True)
            np.testing.assert_array_equal(mapped.search(queries, 5)[1], expected[version][1])
    finally:
        proc.stdin.close()
        proc.wait(timeout=20)
    # a later save cleans up whatever an interrupted save left behind
    versions[2].save(path)
    meta = json.loads((path / "meta.json").read_text())
    g = meta["generation"]
    assert sorted(p.name for p in path.iterdir()) == [
        f"ids.g{g}.npy",
        "meta.json",
        f"words.g{g}.npy",
    ]
    np.testing.assert_array_equal(FlatIndex.load(path).search(queries, 5)[1], expected[2][1])
