"""Run a GIL-free kernel over chunks of queries on several threads.

Kernels in :mod:`hashlearn._kernels` are serial ``nogil`` functions over a query range; this
module splits the queries into chunks and runs them on a shared thread pool. Threads rather
than numba's ``prange`` keep every call thread-safe and fork-safe, let each call choose its
own thread count, and keep the hot loops out of parfor bodies (which compile them worse).
"""

from __future__ import annotations

import os
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor

from hashlearn._validation import check_int

__all__ = ["available_cores", "parallel_chunks"]

_POOL: ThreadPoolExecutor | None = None
_POOL_LOCK = threading.Lock()
_MAX_CHUNK = 256


def available_cores() -> int:
    """Cores this process may run on."""
    try:
        return len(os.sched_getaffinity(0))
    except AttributeError:  # not on Linux
        return os.cpu_count() or 1


def _pool() -> ThreadPoolExecutor:
    global _POOL
    with _POOL_LOCK:
        if _POOL is None:
            _POOL = ThreadPoolExecutor(
                max_workers=max(32, available_cores()), thread_name_prefix="hashlearn"
            )
        return _POOL


def parallel_chunks(
    kernel: Callable[[int, int], None], m: int, n_threads: int | None, *, min_chunk: int = 4
) -> None:
    """Call ``kernel(start, stop)`` over ``[0, m)`` in chunks, on ``n_threads`` threads.

    ``n_threads=None`` uses every available core. Each thread takes consecutive chunks of at
    most 256 queries (bounding per-chunk buffers), so the work is split evenly.
    """
    threads = (
        available_cores()
        if n_threads is None
        else check_int(n_threads, "n_threads", "search", low=1, high=1024)
    )
    threads = max(1, min(threads, m // min_chunk))
    if m == 0:
        return
    if threads == 1 and m <= _MAX_CHUNK:
        kernel(0, m)
        return
    n_chunks = max(threads, -(-m // _MAX_CHUNK))
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
