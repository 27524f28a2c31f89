"""The library-wide thread setting (issue 18 item 3)."""

from __future__ import annotations

import threading
import time

import numpy as np
import pytest

import hashlearn
from hashlearn._utils import parallel as _parallel
from hashlearn._utils.parallel import available_cores, parallel_chunks


@pytest.fixture(autouse=True)
def _restore(monkeypatch):
    monkeypatch.delenv("HASHLEARN_NUM_THREADS", raising=False)
    hashlearn.set_num_threads(None)
    yield
    hashlearn.set_num_threads(None)


def _threads_used(m: int, n_threads) -> int:
    """Distinct threads that ran chunks of an ``m``-query call."""
    seen = set()
    barrier_lock = threading.Lock()

    def kernel(start, stop):
        with barrier_lock:
            seen.add(threading.get_ident())
        # keep each chunk busy long enough that idle workers take the other chunks
        threading.Event().wait(0.002)

    parallel_chunks(kernel, m, n_threads)
    return len(seen)


def test_default_is_every_core():
    assert hashlearn.get_num_threads() == available_cores()


def test_set_and_reset():
    hashlearn.set_num_threads(3)
    assert hashlearn.get_num_threads() == 3
    hashlearn.set_num_threads(None)
    assert hashlearn.get_num_threads() == available_cores()


def test_environment_variable(monkeypatch):
    monkeypatch.setenv("HASHLEARN_NUM_THREADS", "5")
    assert hashlearn.get_num_threads() == 5
    hashlearn.set_num_threads(2)  # the function wins over the environment
    assert hashlearn.get_num_threads() == 2
    hashlearn.set_num_threads(None)
    assert hashlearn.get_num_threads() == 5


@pytest.mark.parametrize("raw", ["0", "-1", "two", "1.5", "2000"])
def test_bad_environment_variable(monkeypatch, raw):
    monkeypatch.setenv("HASHLEARN_NUM_THREADS", raw)
    with pytest.raises(ValueError, match="HASHLEARN_NUM_THREADS"):
        hashlearn.get_num_threads()


@pytest.mark.parametrize("bad", [0, -2, 1.5, "4", True, 5000])
def test_bad_argument(bad):
    with pytest.raises(ValueError, match="'n'"):
        hashlearn.set_num_threads(bad)


def test_setting_is_the_default_of_every_call():
    hashlearn.set_num_threads(1)
    assert _threads_used(4096, None) == 1
    hashlearn.set_num_threads(3)
    assert _threads_used(4096, None) == 3
    # an explicit per-call value still wins
    assert _threads_used(4096, 2) == 2


def test_environment_is_the_default_of_every_call(monkeypatch):
    monkeypatch.setenv("HASHLEARN_NUM_THREADS", "1")
    assert _threads_used(4096, None) == 1


def test_search_results_do_not_depend_on_threads():
    rng = np.random.default_rng(1)
    db = rng.integers(0, 256, size=(2000, 8), dtype=np.uint8)
    q = rng.integers(0, 256, size=(500, 8), dtype=np.uint8)
    index = hashlearn.FlatIndex(64)
    index.add(db)
    hashlearn.set_num_threads(1)
    D1, I1 = index.search(q, 7)
    hashlearn.set_num_threads(4)
    D4, I4 = index.search(q, 7)
    np.testing.assert_array_equal(D1, D4)
    np.testing.assert_array_equal(I1, I4)


def test_exported():
    assert "set_num_threads" in hashlearn.__all__ and "get_num_threads" in hashlearn.__all__
    assert hashlearn.set_num_threads is _parallel.set_num_threads


# ------------------------------------------------ n_threads bounds BLAS and OpenMP too


def _native_counts() -> list[int]:
    from threadpoolctl import threadpool_info

    return [info["num_threads"] for info in threadpool_info()]


def _blas_and_scan_work(a, b, index, queries) -> None:
    for _ in range(30):
        a @ b  # numpy's BLAS: on every core unless bounded
    index.search(queries, 10, n_threads=1)


@pytest.mark.skipif(available_cores() < 2, reason="one CPU: nothing else could run beside")
def test_one_thread_call_uses_one_cpu():
    """Inside ``bounded_threads(1)`` a BLAS-heavy call plus a one-thread scan spends its CPU
    time on the calling thread: other threads (OpenBLAS workers, which otherwise take half
    the products and spin after each) use under 10 % of it. CPU time of the process minus
    that of this thread, so a busy machine (less CPU than wall) cannot hide a helper."""
    rng = np.random.default_rng(0)
    a = rng.standard_normal((1000, 384), dtype=np.float32)
    b = rng.standard_normal((384, 256), dtype=np.float32)
    index = hashlearn.FlatIndex(256)
    index.add(rng.integers(0, 256, (20_000, 32), dtype=np.uint8))
    queries = rng.integers(0, 256, (50, 32), dtype=np.uint8)
    _blas_and_scan_work(a, b, index, queries)  # warm: BLAS workers started, kernels compiled
    before = _native_counts()
    with _parallel.bounded_threads(1) as threads:
        assert threads == 1
        assert max(_native_counts(), default=1) == 1
        threading.Event().wait(0.3)  # let workers woken before the bound go back to sleep
        process, own = time.process_time(), time.thread_time()
        _blas_and_scan_work(a, b, index, queries)
        own = time.thread_time() - own
        others = time.process_time() - process - own
    assert _native_counts() == before  # restored
    assert own > 0.02
    assert others <= 0.1 * own, (others, own)


def test_bounded_threads_follows_the_library_setting():
    hashlearn.set_num_threads(1)
    with _parallel.bounded_threads() as threads:
        assert threads == 1
        assert max(_native_counts(), default=1) == 1
    with pytest.raises(ValueError, match="n_threads"):
        with _parallel.bounded_threads(0):
            pass


@pytest.mark.skipif(available_cores() < 2, reason="one CPU: nothing else could run beside")
def test_one_thread_embedding_search_uses_one_cpu():
    """``EmbeddingIndex.search(n_threads=1)`` (a Searcher underneath: encoding by BLAS, the
    scan, the refine kernel) spends its CPU time on the calling thread: other threads use
    under 10 % of it, though numpy's BLAS was left on every core before the call."""
    rng = np.random.default_rng(1)
    X = rng.standard_normal((8_000, 384), dtype=np.float32)
    Q = rng.standard_normal((1_000, 384), dtype=np.float32)
    index = hashlearn.EmbeddingIndex(n_bits=256, random_state=0).fit(X[:2_000]).add(X)
    index.search(Q, 10, n_threads=1)  # warm: kernels compiled
    X[:500] @ X[:500].T  # numpy's BLAS on every core: its workers started, then idle
    threading.Event().wait(0.3)
    process, own = time.process_time(), time.thread_time()
    for _ in range(3):
        index.search(Q, 10, n_threads=1)
    own = time.thread_time() - own
    others = time.process_time() - process - own
    assert own > 0.02
    assert others <= 0.1 * own, (others, own)
