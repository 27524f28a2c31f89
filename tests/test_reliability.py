"""Reliability: fuzzed public entry points, kill -9 during append/save, damaged files,
concurrent searches, and a 10M-code build and search under a memory cap."""

from __future__ import annotations

import json
import os
import select
import signal
import subprocess
import sys
import textwrap
import threading
import time
from pathlib import Path

import numpy as np
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import hashlearn
from hashlearn import codes as codes_mod
from hashlearn import io
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.index.flat import FlatIndex
from hashlearn.index.mih import MultiIndexHashing

FUZZ = settings(
    max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture]
)

dtypes = st.sampled_from(
    [
        np.uint8,
        np.int8,
        np.uint16,
        np.int32,
        np.int64,
        np.float32,
        np.float64,
        np.bool_,
        np.complex64,
    ]
)
shapes = hnp.array_shapes(min_dims=0, max_dims=3, min_side=0, max_side=6)


@st.composite
def arbitrary_arrays(draw):
    dtype = draw(dtypes)
    shape = draw(shapes)
    return draw(hnp.arrays(dtype=dtype, shape=shape))


def _index(kind, n_bits):
    rng = np.random.default_rng(n_bits)
    index = FlatIndex(n_bits) if kind == "flat" else MultiIndexHashing(n_bits)
    bits = rng.integers(0, 2, (50, n_bits)).astype(np.uint8)
    index.add(codes_mod.pack_bits(bits))
    return index


INDEXES = {(kind, b): _index(kind, b) for kind in ("flat", "mih") for b in (7, 16, 64)}


# ------------------------------------------------------------------------------ fuzzing


@FUZZ
@given(
    kind=st.sampled_from(["flat", "mih"]),
    n_bits=st.sampled_from([7, 16, 64]),
    queries=arbitrary_arrays(),
    k=st.one_of(st.integers(-3, 10**9), st.floats(allow_nan=True), st.none(), st.booleans()),
)
def test_search_accepts_valid_input_and_rejects_the_rest_cleanly(kind, n_bits, queries, k):
    index = INDEXES[kind, n_bits]
    valid_q = (
        queries.dtype == np.uint8
        and queries.ndim == 2
        and queries.shape[1] == (n_bits + 7) // 8
        and not (n_bits % 8 and queries.size and (queries[:, -1] >> (n_bits % 8)).any())
    )
    valid_k = isinstance(k, int) and not isinstance(k, bool) and k >= 1
    if valid_q and valid_k and k > 10**6:
        k = 10**6  # huge k is valid; cap the memory of the padded result in the test
    try:
        D, I = index.search(queries, k)
    except (TypeError, ValueError) as exc:
        assert not (valid_q and valid_k), exc
        assert "queries" in str(exc) or "'k'" in str(exc)
        return
    assert valid_q and valid_k
    assert D.shape == I.shape == (len(queries), k)
    assert (I[:, len(index) :] == -1).all()
    flat = INDEXES["flat", n_bits]
    if kind == "mih" and k <= 60:
        for got, want in zip((D, I), flat.search(queries, k), strict=True):
            np.testing.assert_array_equal(got, want)


@FUZZ
@given(
    kind=st.sampled_from(["flat", "mih"]),
    radius=st.one_of(st.integers(-2, 70), st.floats(allow_nan=True)),
)
def test_range_search_radius_fuzz(kind, radius):
    index = INDEXES[kind, 16]
    q = np.zeros((3, 2), np.uint8)
    if isinstance(radius, int) and 0 <= radius <= 16:
        lims, D, I = index.range_search(q, radius)
        assert lims[-1] == len(D) == len(I)
    else:
        with pytest.raises(ValueError, match="radius"):
            index.range_search(q, radius)


@FUZZ
@given(codes=arbitrary_arrays(), n_bits=st.integers(-2, 40))
def test_codes_functions_fuzz(codes, n_bits):
    """unpack/cdist take only valid packed codes; pack takes only 2-D 0/1 arrays; whatever
    is accepted round-trips exactly."""
    valid_codes = (
        codes.dtype == np.uint8
        and codes.ndim == 2
        and n_bits >= 1
        and codes.shape[1] == (n_bits + 7) // 8
        and not (n_bits % 8 and codes.size and (codes[:, -1] >> (n_bits % 8)).any())
    )
    try:
        bits = codes_mod.unpack_bits(codes, n_bits)
    except (TypeError, ValueError):
        assert not valid_codes
    else:
        assert valid_codes and bits.shape == (len(codes), n_bits)
        np.testing.assert_array_equal(codes_mod.pack_bits(bits), codes)
        d = codes_mod.hamming_cdist(codes, codes, n_bits)
        np.testing.assert_array_equal(d, (bits[:, None, :] != bits[None, :, :]).sum(axis=2))
    numeric = codes.dtype == np.bool_ or codes.dtype.kind in "iuf"
    valid_bits = (
        codes.ndim == 2 and numeric and bool(np.isin(codes, (0, 1)).all())
        if codes.dtype.kind != "c"
        else False
    )
    try:
        packed = codes_mod.pack_bits(codes)
    except (TypeError, ValueError):
        assert not valid_bits
    else:
        assert valid_bits
        assert packed.shape == (len(codes), (codes.shape[1] + 7) // 8)
        if codes.shape[1]:  # zero-bit codes pack to zero bytes and cannot be unpacked
            np.testing.assert_array_equal(
                codes_mod.unpack_bits(packed, codes.shape[1]), codes.astype(np.uint8)
            )


@FUZZ
@given(
    X=hnp.arrays(
        np.float64,
        hnp.array_shapes(min_dims=1, max_dims=3, max_side=5),
        elements=st.floats(allow_nan=True, allow_infinity=True, width=64),
    )
)
def test_hasher_encode_fuzz_never_returns_garbage(X):
    hasher = RandomHyperplaneLSH(n_bits=12, random_state=0).fit(
        np.random.default_rng(0).normal(size=(20, 4))
    )
    try:
        out = hasher.encode(X)
    except (TypeError, ValueError):
        assert X.ndim != 2 or X.shape[1] != 4 or X.shape[0] == 0 or not np.isfinite(X).all()
        return
    assert X.ndim == 2 and X.shape[1] == 4 and np.isfinite(X).all()
    assert out.dtype == np.uint8 and out.shape == (len(X), 2)


@FUZZ
@given(
    blob=st.binary(max_size=300),
    field=st.sampled_from(["meta", "class", "version", "shape", "file", "arrays"]),
)
def test_io_load_of_damaged_metadata_is_a_clear_error(tmp_path_factory, blob, field):
    path = tmp_path_factory.mktemp("save") / "idx"
    _index("flat", 16).save(path)
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    if field == "meta":
        meta_path.write_bytes(blob)
    else:
        if field == "class":
            meta["class"] = blob.decode("latin-1")
        elif field == "version":
            meta["format_version"] = len(blob) + 2
        elif field == "shape":
            meta["arrays"]["words"]["shape"] = [len(blob), 3]
        elif field == "file":
            meta["arrays"]["ids"]["file"] = "../" + blob.hex() + ".npy"
        else:
            meta["arrays"] = blob.hex()
        meta_path.write_text(json.dumps(meta))
    try:
        loaded = io.load(path)
    except (ValueError, FileNotFoundError) as exc:
        assert str(path) in str(exc) or "meta.json" in str(exc) or "saved" in str(exc)
        return
    assert isinstance(loaded, FlatIndex)  # e.g. a blob that happens to be valid metadata


def test_truncated_and_version_mismatched_saves(tmp_path):
    index = _index("mih", 64)
    index.save(tmp_path / "mih")
    meta = json.loads((tmp_path / "mih" / "meta.json").read_text())
    postings = tmp_path / "mih" / meta["arrays"]["table_postings"]["file"]
    postings.write_bytes(postings.read_bytes()[:-16])
    with pytest.raises(ValueError, match="checksum"):
        MultiIndexHashing.load(tmp_path / "mih")
    with pytest.raises(ValueError, match="truncated|corrupted"):
        MultiIndexHashing.load(tmp_path / "mih", verify=False)
    index.save(tmp_path / "v")
    meta = json.loads((tmp_path / "v" / "meta.json").read_text())
    meta["format_version"] = io.FORMAT_VERSION + 1
    (tmp_path / "v" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="format version"):
        io.load(tmp_path / "v")
    with pytest.raises(TypeError, match="not a FlatIndex"):
        index.save(tmp_path / "w") or FlatIndex.load(tmp_path / "w")


# -------------------------------------------------------------------- kill -9 mid-write

_CHILD = textwrap.dedent("""
    import os, sys
    import numpy as np
    from hashlearn.index.flat import FlatIndex
    from hashlearn.index.mih import MultiIndexHashing
    path, mih_path = sys.argv[1], sys.argv[2]
    rng = np.random.default_rng(0)
    chunk = rng.integers(0, 256, (20_000, 8), dtype=np.uint8)
    mihs = []
    for v in (1, 2):
        m = MultiIndexHashing(64)
        m.add(np.random.default_rng(v).integers(0, 256, (100_000, 8), dtype=np.uint8),
              ids=np.arange(100_000) * 2 + v)
        mihs.append(m.build())
    print("ready", flush=True)
    for line in sys.stdin:
        pid = os.fork()
        if pid == 0:
            try:
                index = FlatIndex.open(path)
                i = 0
                while True:  # append chunks in place, and save MIH versions, until killed
                    index.add(chunk)
                    mihs[i % 2].save(mih_path)
                    i += 1
            finally:
                os._exit(3)
        print(pid, flush=True)
        os.waitpid(pid, 0)
        print("reaped", flush=True)
""")


def _readline(proc, timeout=60.0) -> str:
    ready, _, _ = select.select([proc.stdout], [], [], timeout)
    if not ready:
        raise AssertionError("the writing subprocess did not answer in time")
    return proc.stdout.readline().strip()


@pytest.mark.skipif(not hasattr(os, "fork"), reason="needs fork")
def test_kill_9_during_appends_and_mih_saves_repeated(tmp_path):
    chunk = np.random.default_rng(0).integers(0, 256, (20_000, 8), dtype=np.uint8)
    path, mih_path = tmp_path / "flat", tmp_path / "mih"
    FlatIndex(64).save(path)
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(Path(hashlearn.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", _CHILD, str(path), str(mih_path)],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        text=True,
        env=env,
    )
    q = np.random.default_rng(5).integers(0, 256, (5, 8), dtype=np.uint8)
    try:
        assert _readline(proc) == "ready"
        for delay in (0.05, 0.13, 0.21, 0.34, 0.02):
            proc.stdin.write("go\n")
            proc.stdin.flush()
            pid = int(_readline(proc))
            time.sleep(delay)
            os.kill(pid, signal.SIGKILL)
            assert _readline(proc) == "reaped"
            loaded = FlatIndex.load(path, verify=True)
            assert len(loaded) % len(chunk) == 0
            reps = len(loaded) // len(chunk)
            if reps:
                np.testing.assert_array_equal(loaded.codes[-len(chunk) :], chunk)
                assert loaded.ids[-1] == len(loaded) - 1
            if (mih_path / "meta.json").exists():
                mih = MultiIndexHashing.load(mih_path, verify=True)
                version = int(mih.ids[0]) % 2 or 2
                ref = FlatIndex(64)
                ref.add(mih.codes, ids=mih.ids)
                assert len(mih) == 100_000 and version in (1, 2)
                for got, want in zip(mih.search(q, 5), ref.search(q, 5), strict=True):
                    np.testing.assert_array_equal(got, want)
    finally:
        proc.stdin.close()
        proc.wait(timeout=30)


# ------------------------------------------------------------------- concurrent threads


@pytest.mark.parametrize("kind", ["flat", "mih"])
def test_eight_threads_searching_concurrently_agree(kind):
    rng = np.random.default_rng(2)
    index = FlatIndex(64) if kind == "flat" else MultiIndexHashing(64)
    index.add(rng.integers(0, 256, (30_000, 8), dtype=np.uint8))
    q = rng.integers(0, 256, (200, 8), dtype=np.uint8)
    expected = index.search(q, 10, n_threads=1)
    results: list = [None] * 8
    barrier = threading.Barrier(8)

    def work(t):
        barrier.wait()
        results[t] = [index.search(q, 10, n_threads=2) for _ in range(3)]

    threads = [threading.Thread(target=work, args=(t,)) for t in range(8)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    for per_thread in results:
        for D, I in per_thread:
            np.testing.assert_array_equal(D, expected[0])
            np.testing.assert_array_equal(I, expected[1])


# ------------------------------------------------------------------ 10M under a memory cap

_CAPPED = textwrap.dedent("""
    import resource, sys
    import numpy as np
    margin = int(sys.argv[1])
    from hashlearn.index.flat import FlatIndex  # import (and numba) before the cap
    from hashlearn.index.mih import MultiIndexHashing
    probe = FlatIndex(64); probe.add(np.zeros((300, 8), np.uint8)); probe.search(probe.codes[:2], 3)
    with open("/proc/self/status") as f:
        vm = [int(line.split()[1]) * 1024 for line in f if line.startswith("VmSize:")][0]
    resource.setrlimit(resource.RLIMIT_AS, (vm + margin, vm + margin))
    n = 10_000_000
    codes = np.empty((n, 8), np.uint8)
    rng = np.random.default_rng(0)
    for start in range(0, n, 1_000_000):
        codes[start:start + 1_000_000] = rng.integers(0, 256, (1_000_000, 8), dtype=np.uint8)
    index = FlatIndex(64)
    index.add(codes)
    del codes
    q = index.codes[[5, 5_000_000, 9_999_999]].copy()
    D, I = index.search(q, 3, n_threads=1)
    assert D[:, 0].tolist() == [0, 0, 0], D
    assert I[:, 0].tolist() == [5, 5_000_000, 9_999_999], I
    print("ok", flush=True)
""")


@pytest.mark.skipif(not os.path.exists("/proc/self/status"), reason="needs Linux /proc")
def test_ten_million_codes_build_and_search_under_a_memory_cap():
    """80 MB of codes + 80 MB of ids: the build must fit in ~600 MB above the interpreter."""
    env = dict(
        os.environ,
        PYTHONPATH=os.pathsep.join(
            [str(Path(hashlearn.__file__).parents[1]), os.environ.get("PYTHONPATH", "")]
        ),
    )
    # the child caps its address space at its own footprint after imports plus 600 MB
    out = subprocess.run(
        [sys.executable, "-c", _CAPPED, str(600 * 2**20)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode == 0 and out.stdout.strip() == "ok", out.stderr[-2000:]
    # and the cap is real: the same build does not fit in 100 MB
    out = subprocess.run(
        [sys.executable, "-c", _CAPPED, str(100 * 2**20)],
        capture_output=True,
        text=True,
        env=env,
        timeout=120,
    )
    assert out.returncode != 0 and "MemoryError" in out.stderr
