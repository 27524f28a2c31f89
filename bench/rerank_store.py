"""Bytes a cold-cache refine reads from a vector store on disk (issue 29, item 3).

A :class:`hashlearn.rerank.VectorStore` loaded with ``mmap=True`` keeps the float vectors on
disk and pages in the rows a search rescores. With the kernel's default read-around a page
fault reads up to 128 KiB of the file around the faulting page, so scattered rows cost far
more than their bytes; the store advises its maps ``MADV_RANDOM``
(:func:`hashlearn.rerank.store.advise_random`), so a fault reads the pages a row spans: still
4 KiB for a 384-byte row, and the pages stay in the page cache. Loaded with
``mmap="direct"`` the store reads only its candidates' rows with ``O_DIRECT``
(:class:`hashlearn.rerank.rowfile.RowFile`): the 512-byte blocks a row spans.

For each way (``normal``: a map with the kernel's default; ``random``: the map as
``mmap=True`` advises it; ``direct``: ``RowFile``) the vectors file is dropped from the page
cache (``posix_fadvise(POSIX_FADV_DONTNEED)``), restored into a store and refined: ``-q``
queries with ``-c`` random candidate ids each, ``k`` = 10, no screen (the screen's compact
copy is built from every row: a store larger than memory wants ``screen=False``). Then a
whole ``Searcher`` over the same vectors is saved, loaded with ``mmap="direct"`` and searched
cold. Reported: bytes read from storage (``/proc/self/io`` ``read_bytes``), major page
faults (``getrusage``), the file's pages left in the page cache (``mincore``), resident
growth and milliseconds per query, against the bytes of the rows rescored. Figures:
``docs/results.md`` (``--write``).

Linux only (``/proc/self/io``, ``posix_fadvise``, ``madvise``). Usage::

    python bench/rerank_store.py [--write]  # 2M x 96 float32 (768 MB file in --dir)
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

from _common import load_average, machine, write_section
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


def measure_searcher(tmp: Path, vectors_path: Path, queries: np.ndarray, c: int) -> dict:
    """End to end: a ``Searcher`` (64-bit LSH codes, ``FlatIndex``, Euclidean refine, no
    screen) over the same vectors, saved, loaded with ``mmap="direct"``, its vectors file
    dropped from the page cache, then searched (``n_candidates=c``, k = 10)."""
    from hashlearn import RandomHyperplaneLSH, Searcher

    X = np.load(vectors_path, mmap_mode="r")
    s = Searcher(RandomHyperplaneLSH(64, random_state=0), rerank="euclidean", screen=False)
    s.fit(np.asarray(X[:20000]))
    for start in range(0, len(X), 262144):
        s.add(np.asarray(X[start : start + 262144]))
    s.save(tmp / "searcher")
    del s
    loaded = Searcher.load(tmp / "searcher", mmap="direct", verify=False)
    [saved] = (tmp / "searcher").glob("vectors*.npy")
    loaded.search(queries[:1], 10, n_candidates=c)  # compile, codes paged in
    _drop_cache(saved)
    before = (_read_bytes(), _rss_kib())
    start = time.perf_counter()
    _, I = loaded.search(queries, 10, n_candidates=c, n_threads=1)
    wall = time.perf_counter() - start
    after = (_read_bytes(), _rss_kib())
    _, cand = loaded.index.search(loaded.hasher.encode(queries), c)
    rows = len(np.unique(cand))
    row_bytes = rows * X.shape[1] * 4
    return {
        "advice": "Searcher.load(mmap='direct')",
        "rows": rows,
        "row MB": row_bytes / 1e6,
        "read MB": (after[0] - before[0]) / 1e6,
        "read / row bytes": (after[0] - before[0]) / row_bytes,
        "major faults": 0,
        "RSS growth MB": (after[1] - before[1]) / 1024,
        "cached MB": _cached_bytes(saved) / 1e6,
        "ms / query": wall * 1e3 / len(queries),
    }


_LABELS = {
    "normal": "memory map, kernel default (read-around)",
    "random": "memory map, `MADV_RANDOM` (`mmap=True`)",
    "direct": '`RowFile`, `O_DIRECT` (`mmap="direct"`)',
}


def _section(args, results, started, load_before) -> str:
    rows = "\n".join(
        f"| {_LABELS.get(r['advice'], '`' + r['advice'] + '` search, end to end')} | "
        f"{r['rows']:,} | {r['row MB']:.2f} | {r['read MB']:.2f} | **{r['read / row bytes']:.2f}** "
        f"| {r['cached MB']:.2f} | {r['RSS growth MB']:.1f} | {r['ms / query']:.2f} |"
        for r in results
    )
    return (
        "## Cold-cache reads of a vector store on disk (`bench/rerank_store.py`, issue 29 "
        "item 3)\n\n"
        f"Quiet machine, {started}-{time.strftime('%H:%M:%S', time.gmtime())} UTC, `python "
        f"bench/rerank_store.py -n {args.n} -d {args.d} -q {args.q} -c {args.c} --write`; "
        f"load average before {load_before}, after {load_average()}. {machine()}. A "
        f"{args.n:,} x {args.d} float32 store ({args.n * args.d * 4 / 1e6:.0f} MB file), "
        "its pages dropped from the page cache (`posix_fadvise(DONTNEED)`) before each "
        f"search; {args.q} queries x {args.c} random candidate ids refined (k = 10, no screen, "
        "one thread); bytes read from storage (`/proc/self/io` `read_bytes`), the file's "
        "pages left in the page cache afterwards (`mincore`), resident growth (`VmRSS`). "
        "The last row is a whole `Searcher` (64-bit LSH, `FlatIndex`, Euclidean refine) "
        'saved and loaded with `mmap="direct"`, its Hamming shortlist as the candidates.\n\n'
        "| vectors read through | rows refined | their bytes, MB | read from disk, MB | "
        "read / rows' bytes | left in page cache, MB | RSS growth, MB | ms / query (cold) |\n"
        "|---|---|---|---|---|---|---|---|\n"
        f"{rows}\n\n"
        "Through a map a row costs at least its 4 KiB page (10.7x a 384-byte row) and the "
        "pages stay cached; `O_DIRECT` reads cost the 512-byte blocks a row spans (one or two), "
        "and nothing is cached.\n"
    )


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("-n", type=int, default=2_000_000, help="vectors in the store")
    parser.add_argument("-d", type=int, default=96, help="dimension (Deep1B: 96)")
    parser.add_argument("-q", type=int, default=10, help="queries")
    parser.add_argument("-c", type=int, default=160, help="candidates per query")
    parser.add_argument("--dir", type=Path, default=None, help="where the file is written")
    parser.add_argument("--write", action="store_true", help="update docs/results.md")
    args = parser.parse_args(argv)
    if not Path("/proc/self/io").exists() or not hasattr(os, "posix_fadvise"):
        sys.exit("needs Linux (/proc/self/io, posix_fadvise)")
    started, load_before = time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime()), load_average()
    with tempfile.TemporaryDirectory(dir=args.dir) as tmp:
        path = Path(tmp) / "vectors.npy"
        _write_vectors(path, args.n, args.d)
        rng = np.random.default_rng(1)
        queries = rng.standard_normal((args.q, args.d)).astype(np.float32)
        cand = rng.integers(0, args.n, (args.q, args.c)).astype(np.int64)
        print(f"{args.n} x {args.d} float32 ({path.stat().st_size / 1e6:.0f} MB file), "
              f"{args.q} queries x {args.c} candidates, cold page cache")  # fmt: skip
        results = [
            measure(path, advice, queries, cand) for advice in ("normal", "random", "direct")
        ]
        results.append(measure_searcher(Path(tmp), path, queries, args.c))
        for r in results:
            print("  ".join(f"{k} {v:.2f}" if isinstance(v, float) else f"{k} {v}"
                            for k, v in r.items()))  # fmt: skip
    if args.write:
        write_section("bench-rerank-store", _section(args, results, started, load_before))


if __name__ == "__main__":
    main()
