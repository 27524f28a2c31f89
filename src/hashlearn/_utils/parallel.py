"""Run a GIL-free kernel over chunks of queries on several threads.

Kernels (e.g. :mod:`hashlearn._utils.range_scan`) are serial ``nogil`` functions over a query range; this
module splits the queries into chunks and runs them on a shared thread pool. Threads rather
than numba's ``prange`` keep every call thread-safe, let each call choose its own thread count,
and keep the hot loops out of parfor bodies (which compile them worse).

The library-wide default thread count (used by every ``n_threads=None`` call) is set with
:func:`set_num_threads` or the environment variable ``HASHLEARN_NUM_THREADS``, as numba
(``NUMBA_NUM_THREADS``) and faiss (``omp_set_num_threads``) do.

Fork safety: a forked child inherits the parent's pool object but none of its threads, so a
pool that had been started in the parent would accept work that no thread ever runs (the child
hangs). The pool and its lock are therefore dropped in the child right after ``fork``
(``os.register_at_fork``) and a fresh pool is started on the child's first multi-threaded call.
"""

from __future__ import annotations

import os
import sys
import threading
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager

from hashlearn._utils.validation import check_int

__all__ = [
    "available_cores",
    "bounded_threads",
    "get_num_threads",
    "parallel_chunks",
    "set_num_threads",
]

ENV_VAR = "HASHLEARN_NUM_THREADS"
_MAX_THREADS = 1024

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_MAX_CHUNK = 256
_NUM_THREADS: int | None = None  # set by set_num_threads; None: environment or every core


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def set_num_threads(n: int | None) -> None:
    """Set the thread count used by every search called with ``n_threads=None``.

    Parameters
    ----------
    n : int in [1, 1024] or None
        Threads per call. ``None`` restores the default: the environment variable
        ``HASHLEARN_NUM_THREADS`` when it is set, otherwise every core this process may run on.

    Examples
    --------
    >>> import hashlearn
    >>> hashlearn.set_num_threads(2)
    >>> hashlearn.get_num_threads()
    2
    >>> hashlearn.set_num_threads(None)  # back to the default
    """
    global _NUM_THREADS
    _NUM_THREADS = (
        None if n is None else check_int(n, "n", "set_num_threads", low=1, high=_MAX_THREADS)
    )


def get_num_threads() -> int:
    """The thread count an ``n_threads=None`` call uses now.

    In order: the value given to :func:`set_num_threads`; the environment variable
    ``HASHLEARN_NUM_THREADS`` (read on each call, so it may be set after import); every core
    this process may run on. An environment value that is not an integer in [1, 1024] raises
    ``ValueError``.
    """
    if _NUM_THREADS is not None:
        return _NUM_THREADS
    raw = os.environ.get(ENV_VAR, "").strip()
    if raw:
        try:
            value = int(raw)
        except ValueError:
            value = 0
        if not 1 <= value <= _MAX_THREADS:
            raise ValueError(
                f"The environment variable {ENV_VAR} must be an int in the range "
                f"[1, {_MAX_THREADS}]. Got {raw!r} instead."
            )
        return value
    return available_cores()


def _thread_count(n_threads: int | None, owner: str = "search") -> int:
    """``n_threads`` checked, or :func:`get_num_threads` for None."""
    if n_threads is None:
        return get_num_threads()
    if type(n_threads) is int and 1 <= n_threads <= _MAX_THREADS:  # the common case, fast
        return n_threads
    return check_int(n_threads, "n_threads", owner, low=1, high=_MAX_THREADS)


# ------------------------------------------------------- native thread pools (BLAS, OpenMP)

_LIMITS_LOCK = threading.Lock()
_ACTIVE_LIMITS: list[int] = []  # the bounds of the bounded_threads blocks running now
_SAVED_COUNTS: list = []  # (library controller, its thread count before the first bound)
_CONTROLLER = None  # threadpoolctl's view of the loaded libraries
_CONTROLLER_MODULES = -1  # len(sys.modules) when it was taken: rescan after new imports


def _native_pools():
    """threadpoolctl's controllers of the BLAS and OpenMP libraries loaded in this process.

    numpy and scipy each bring their own OpenBLAS (two libraries, two thread pools), faiss or
    scikit-learn an OpenMP runtime; the scan is redone when modules were imported since."""
    global _CONTROLLER, _CONTROLLER_MODULES
    if _CONTROLLER is None or len(sys.modules) != _CONTROLLER_MODULES:
        from threadpoolctl import ThreadpoolController

        _CONTROLLER = ThreadpoolController()
        _CONTROLLER_MODULES = len(sys.modules)
    return _CONTROLLER.lib_controllers


def _apply_native_limit(limit: int | None) -> None:
    for lib, before in _SAVED_COUNTS:
        lib.set_num_threads(before if limit is None else min(before, limit))


@contextmanager
def bounded_threads(n_threads: int | None = None) -> Iterator[int]:
    """Bound every native thread pool (BLAS, OpenMP) to ``n_threads`` while the block runs.

    ``n_threads=None`` uses :func:`get_num_threads`; yields the count. A search called with
    ``n_threads=1`` then runs on one CPU: without the bound numpy's OpenBLAS runs a query
    batch's matrix product (encoding) on every core, and its worker threads keep spinning
    for a while after each product, beside the single-threaded scan (measured: 39k x 384
    float32, 1000 queries, ``EmbeddingIndex.search(n_threads=1)`` used 2.2x its wall time in
    CPU time; with the bound 1.0x). The pools are process-wide: blocks running at once in
    several threads share the smallest bound; the counts before the first block are
    restored when the last one ends. Free when the bound is at least the core count.
    """
    threads = _thread_count(n_threads)
    if threads >= available_cores():
        yield threads
        return
    with _LIMITS_LOCK:
        if not _ACTIVE_LIMITS:
            _SAVED_COUNTS[:] = [(lib, lib.num_threads) for lib in _native_pools()]
        _ACTIVE_LIMITS.append(threads)
        _apply_native_limit(min(_ACTIVE_LIMITS))
    try:
        yield threads
    finally:
        with _LIMITS_LOCK:
            _ACTIVE_LIMITS.remove(threads)
            _apply_native_limit(min(_ACTIVE_LIMITS) if _ACTIVE_LIMITS else None)
            if not _ACTIVE_LIMITS:
                _SAVED_COUNTS.clear()


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=max(32, available_cores()), thread_name_prefix="hashlearn"
            )
        return _POOL


def _after_fork_in_child() -> None:
    # The inherited pool has no threads in the child (only the forking thread survives) and
    # the inherited lock may have been held by another parent thread at the fork: drop both.
    # The old pool object is not shut down: that would wait on threads that do not exist.
    global _POOL, _POOL_LOCK, _LIMITS_LOCK
    _POOL = None
    _POOL_LOCK = threading.Lock()
    _LIMITS_LOCK = threading.Lock()


if hasattr(os, "register_at_fork"):  # POSIX
    os.register_at_fork(after_in_child=_after_fork_in_child)


def parallel_chunks(
    kernel: Callable[[int, int], None],
    m: int,
    n_threads: int | None,
    *,
    min_chunk: int = 4,
    max_chunk: int = _MAX_CHUNK,
) -> None:
    """Call ``kernel(start, stop)`` over ``[0, m)`` in chunks, on ``n_threads`` threads.

    ``n_threads=None`` uses :func:`get_num_threads`. Each thread takes consecutive chunks of at
    most ``max_chunk`` queries (default 256, bounding per-chunk buffers), so the work is split
    evenly.
    """
    threads = max(1, min(_thread_count(n_threads), m // min_chunk))
    if m == 0:
        return
    max_chunk = max(1, max_chunk)
    if threads == 1 and m <= max_chunk:
        kernel(0, m)
        return
    n_chunks = max(threads, -(-m // max_chunk))
    bounds = [m * c // n_chunks for c in range(n_chunks + 1)]

    def run(worker: int) -> None:
        for c in range(worker, n_chunks, threads):
            kernel(bounds[c], bounds[c + 1])

    if threads == 1:
        run(0)
        return
    futures = [_pool().submit(run, w) for w in range(threads)]
    for future in futures:
        future.result()
