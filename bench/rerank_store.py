"""Bytes a cold-cache refine reads from a memory-mapped vector store (issue 29, item 3).

A :class:`hashlearn.rerank.VectorStore` loaded with ``mmap=True`` keeps the float vectors on
disk and pages in the rows a search rescores. With the kernel's default read-around a page
fault reads up to 128 KiB of the file around the faulting page, so scattered rows cost far
more than their bytes; the store advises its maps ``MADV_RANDOM``
(:func:`hashlearn.rerank.store.advise_random`), so a fault reads the pages a row spans.

For each advice (``normal``: the kernel's default, what the store did before; ``random``:
the store's now) the vectors file is dropped from the page cache
(``posix_fadvise(POSIX_FADV_DONTNEED)``), mapped, restored into a store and refined: ``-q``
queries with ``-c`` random candidate ids each, ``k`` = 10, no screen (the screen's compact
copy is built from every row: a store larger than memory wants ``screen=False``). Reported:
bytes read from storage (``/proc/self/io`` ``read_bytes``), major page faults
(``getrusage``), and resident growth, against the bytes of the rows rescored.

Measured (2026-11-27, this repository's 2-core VM, virtio disk, other jobs running;
10 queries x 160 candidates = 1,599 rows, 0.61 MB of vectors):

=====================  ===========  ==========  ============  ============
store                  advice       read MB     read / rows   major faults
=====================  ===========  ==========  ============  ============
2M x 96 (768 MB)       normal       768.0       1251x         161
2M x 96 (768 MB)       random       6.9         11.3x         1,687
500k x 96 (192 MB)     normal       192.0       313x          36
500k x 96 (192 MB)     random       6.8         11.1x         1,660
=====================  ===========  ==========  ============  ============

With the advice a row costs one 4 KiB page (a 384-byte row; two when it straddles a page):
the floor of reading through the page cache, 4096 / (4 d) times the row's bytes, so about
1-2x for rows of 1 KiB and more (d >= 256 float32).

Linux only (``/proc/self/io``, ``posix_fadvise``, ``madvise``). Usage::

    python bench/rerank_store.py            # 2M x 96 float32 (768 MB file in --dir)
    python bench/rerank_store.py -n 200000  # a quick run
"""

from __future__ import annotations

import argparse
import mmap
import os
import resource
import sys
import tempfile
import time
from pathlib import Path

import numpy as np

from hashlearn.rerank import Refiner
from hashlearn.rerank.store import advise_random


def _read_bytes() -> int:
    for line in Path("/proc/self/io").read_text().splitlines():
        if line.startswith("read_bytes:"):
            return int(line.split()[1])
    raise RuntimeError("/proc/self/io has no read_bytes")


def _rss_kib() -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1])
    return 0


def _write_vectors(path: Path, n: int, d: int, seed: int = 0) -> None:
    rng = np.random.default_rng(seed)
    out = np.lib.format.open_memmap(path, mode="w+", dtype=np.float32, shape=(n, d))
    for start in range(0, n, 65536):
        stop = min(n, start + 65536)
        out[start:stop] = rng.standard_normal((stop - start, d), dtype=np.float32)
    out.flush()
    del out


def _cached_bytes(path: Path) -> int:
    """Bytes of ``path`` in the page cache (``mincore`` over a fresh map of the file)."""
    import ctypes

    whole = np.memmap(path, dtype=np.uint8, mode="r")
    pages = -(-len(whole) // mmap.PAGESIZE)
    vec = (ctypes.c_ubyte * pages)()
    libc = ctypes.CDLL(None, use_errno=True)
    libc.mincore.argtypes = (ctypes.c_void_p, ctypes.c_size_t, ctypes.c_void_p)
    if libc.mincore(ctypes.c_void_p(whole.ctypes.data), ctypes.c_size_t(len(whole)), vec):
        raise OSError(ctypes.get_errno(), "mincore failed")
    return int(np.count_nonzero(np.frombuffer(vec, np.uint8) & 1)) * mmap.PAGESIZE


def _drop_cache(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
        os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
    finally:
        os.close(fd)


def measure(path: Path, advice: str, queries: np.ndarray, cand: np.ndarray) -> dict:
    """Cold-cache refine of ``queries`` over ``cand`` with the map advised ``advice``."""
    _drop_cache(path)
    vectors = np.load(path, mmap_mode="r")
    refiner = Refiner("sqeuclidean", screen=False)
    n = len(vectors)
    arrays = {"vector_ids": np.arange(n), "vectors": vectors}
    refiner.store.restore({"vectors": "dense"}, arrays, direct=advice == "direct")
    if advice == "normal":  # undo the store's advice: the kernel's read-around
        vectors._mmap.madvise(mmap.MADV_NORMAL)
    else:
        advise_random(vectors)
    before = (_read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt, _rss_kib())
    start = time.perf_counter()
    refiner.refine(queries, cand, 10, n_threads=1)
    wall = time.perf_counter() - start
    after = (_read_bytes(), resource.getrusage(resource.RUSAGE_SELF).ru_majflt, _rss_kib())
    rows = len(np.unique(cand))
    row_bytes = rows * vectors.shape[1] * 4
    read = after[0] - before[0]
    return {
        "advice": advice,
        "rows": rows,
        "row MB": row_bytes / 1e6,
        "read MB": read / 1e6,
        "read / row bytes": read / row_bytes,
        "major faults": after[1] - before[1],
        "RSS growth MB": (after[2] - before[2]) / 1024,
        "cached MB": _cached_bytes(path) / 1e6,
        "ms / query": wall * 1e3 / len(queries),
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2_000_000, help="vectors in the store")
    parser.add_argument("-d", type=int, default=96, help="dimension (Deep1B: 96)")
    parser.add_argument("-q", type=int, default=10, help="queries")
    parser.add_argument("-c", type=int, default=160, help="candidates per query")
    parser.add_argument("--dir", type=Path, default=None, help="where the file is written")
    args = parser.parse_args(argv)
    if not Path("/proc/self/io").exists() or not hasattr(os, "posix_fadvise"):
        sys.exit("needs Linux (/proc/self/io, posix_fadvise)")
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "vectors.npy"
        _write_vectors(path, args.n, args.d)
        rng = np.random.default_rng(1)
        queries = rng.standard_normal((args.q, args.d)).astype(np.float32)
        cand = rng.integers(0, args.n, (args.q, args.c)).astype(np.int64)
        print(f"{args.n} x {args.d} float32 ({path.stat().st_size / 1e6:.0f} MB file), "
              f"{args.q} queries x {args.c} candidates, cold page cache")  # fmt: skip
        for advice in ("normal", "random", "direct"):
            r = measure(path, advice, queries, cand)
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in r.items()))  # fmt: skip


if __name__ == "__main__":
    main()
