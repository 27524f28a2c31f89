"""Asymmetric ranking (float query projections against packed codes) vs the Hamming scan.

For n random codes of b bits and Gaussian query projections, one thread, process CPU time:

* ``hamming``: ``FlatIndex.search`` of the queries' own codes (XOR + popcount, top k);
* ``asym scan``: :func:`hashlearn.index._asymmetric.asymmetric_scan` (byte tables, top k);
* ``numpy``: the oracle's way, ``P @ (2 bits - 1).T`` in float32 (the +-1 matrix made
  beforehand, BLAS bounded to one thread) and ``argpartition``: what a float scan of
  b-dimensional vectors costs;
* ``asym rerank``: :func:`~hashlearn.index._asymmetric.asymmetric_rerank` of each query's
  Hamming shortlist of ``--candidates`` positions (per query, excluding the shortlist).

``asym scan`` is the bounded scan (scores exactly only the codes whose bit-plane bound reaches
the k-th score kept); ``--structured`` instead times it against the full scan it replaces on
ITQ codes of a Gaussian mixture in 384-d (queries from the same mixture, projections from the
same hasher's ``project``), for each ``--sizes`` x ``--bits`` x ``--ks``:

* ``hamming``: ``FlatIndex.search`` of the queries' codes;
* ``full``: the byte-table scan of every code (``scan_words(..., bounded=False)``);
* ``bounded``: ``FlatIndex.search_asymmetric``; ``scored``: the fraction of codes it scored
  exactly; ``same``: its ids and scores equal the full scan's, bit for bit.

Timing is interleaved per repetition (``bench/_common.py``); the ratios are medians of the
per-repetition ratios of CPU time. Prints a table; writes nothing.

    python bench/asymmetric.py                             # n = 200k, b = 64..512
    python bench/asymmetric.py --n 20000 --bits 256 --queries 20 --repeats 2   # smoke run
    python bench/asymmetric.py --structured                # 40k, 200k x 128, 256 x k 40..160
    python bench/asymmetric.py --structured --sizes 20000 --bits 128 --ks 40 --repeats 2
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import interleaved_wall_and_cpu, load_average, machine, markdown_table  # noqa: E402
from hashlearn import FlatIndex  # noqa: E402
from hashlearn._utils.parallel import bounded_threads  # noqa: E402
from hashlearn.hashers import IterativeQuantization  # noqa: E402
from hashlearn.index._asymmetric import (  # noqa: E402
    asymmetric_rerank,
    asymmetric_scan,
    check_projections,
    scan_words,
)


def numpy_top_k(P: np.ndarray, signs: np.ndarray, k: int) -> np.ndarray:
    """Top k by ``P @ signs.T`` (float32 matmul, then argpartition and a sort of the k)."""
    scores = P @ signs.T
    part = np.argpartition(-scores, k - 1, axis=1)[:, :k]
    order = np.argsort(-np.take_along_axis(scores, part, 1), axis=1, kind="stable")
    return np.take_along_axis(part, order, 1)


def run(n: int, n_bits: int, n_queries: int, k: int, n_candidates: int, repeats: int, seed=0):
    rng = np.random.default_rng(seed)
    P = rng.standard_normal((n_queries, n_bits)).astype(np.float32)
    bits = rng.integers(0, 2, (n, n_bits), dtype=np.uint8)
    codes = np.packbits(bits, axis=1, bitorder="little")
    q_codes = np.packbits(P >= 0, axis=1, bitorder="little")
    signs = (2.0 * bits - 1.0).astype(np.float32)
    del bits
    index = FlatIndex(n_bits)
    index.add(codes)
    _, shortlist = index.search(q_codes, n_candidates, n_threads=1)
    contenders = [
        lambda: index.search(q_codes, k, n_threads=1),
        lambda: asymmetric_scan(P, codes, k, n_threads=1),
        lambda: numpy_top_k(P, signs, k),
        lambda: asymmetric_rerank(P, codes, shortlist, k, n_threads=1),
    ]
    with bounded_threads(1):
        _, cpu = interleaved_wall_and_cpu(contenders, repeats)
    per_query_us = np.median(cpu, axis=0) / n_queries * 1e6
    ratio = np.median(cpu / cpu[:, :1], axis=0)  # CPU time over the Hamming scan's
    S, I = asymmetric_scan(P, codes, k, n_threads=1)
    same = bool((numpy_top_k(P, signs, k) == I).mean() > 0.99)  # float32 ties may differ
    return per_query_us, ratio, same


def gaussian_mixture(n: int, dim: int, centres: np.ndarray, seed: int) -> np.ndarray:
    """``n`` points around random picks of ``centres`` (unit Gaussian centres, noise 0.7)."""
    rng = np.random.default_rng(seed)
    picks = rng.integers(0, len(centres), n)
    return centres[picks] + 0.7 * rng.standard_normal((n, dim), dtype=np.float32)


def run_structured(n: int, n_bits: int, ks, n_queries: int, repeats: int, seed=0):
    """Rows ``[n, bits, k, hamming, full, bounded (x hamming, x faster than full), scored,
    same]`` for ITQ codes of a 384-d Gaussian mixture of 100 centres."""
    dim = 384
    centres = np.random.default_rng(seed).standard_normal((100, dim), dtype=np.float32)
    X = gaussian_mixture(n, dim, centres, seed + 1)
    Q = gaussian_mixture(n_queries, dim, centres, seed + 2)
    hasher = IterativeQuantization(n_bits=n_bits, n_iter=20, random_state=seed)
    hasher.fit(X[: min(n, 20_000)])
    codes, q_codes = hasher.encode(X), hasher.encode(Q)
    P = hasher.project(Q)
    del X
    index = FlatIndex(n_bits)
    index.add(codes)
    words = index._store.snapshot.rows["words"]
    P32 = check_projections(P, n_bits, "bench")
    rows = []
    for k in ks:
        contenders = [
            lambda k=k: index.search(q_codes, k, n_threads=1),
            lambda k=k: scan_words(P32, words, k, n_bits, 1, bounded=False),
            lambda k=k: index.search_asymmetric(P, k, n_threads=1),
        ]
        with bounded_threads(1):
            _, cpu = interleaved_wall_and_cpu(contenders, repeats)
        ms = np.median(cpu, axis=0) / n_queries * 1e3
        over_hamming = np.median(cpu[:, 2] / cpu[:, 0])
        faster = np.median(cpu[:, 1] / cpu[:, 2])
        counts = np.zeros(n_queries, np.int64)
        full = scan_words(P32, words, k, n_bits, 1, bounded=False)
        bounded = scan_words(P32, words, k, n_bits, 1, counts=counts)
        same = np.array_equal(full[1], bounded[1]) and np.array_equal(
            full[0].view(np.int32), bounded[0].view(np.int32)
        )
        rows.append(
            [
                n,
                n_bits,
                k,
                f"{ms[0]:.3f}",
                f"{ms[1]:.3f}",
                f"{ms[2]:.3f} ({over_hamming:.1f}x, {faster:.1f}x faster)",
                f"{counts.mean() / n:.2%}",
                "yes" if same else "NO",
            ]
        )
    return rows


def main_structured(args) -> None:
    print(f"{machine()}; load average {load_average()}")
    print(f"ITQ codes of a 384-d Gaussian mixture, {args.queries} queries, one thread, CPU time\n")
    rows = []
    for n in args.sizes:
        for n_bits in args.bits:
            rows += run_structured(n, n_bits, args.ks, args.queries, args.repeats)
    header = [
        "n",
        "bits",
        "k",
        "hamming ms/q",
        "full asym ms/q",
        "bounded asym ms/q (x hamming, x faster than full)",
        "scored exactly",
        "same as full",
    ]
    print(markdown_table(header, rows))


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--bits", type=int, nargs="+", default=[64, 128, 256, 384, 512])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--structured", action="store_true", help="bounded vs full scan")
    parser.add_argument("--sizes", type=int, nargs="+", default=[40_000, 200_000])
    parser.add_argument("--ks", type=int, nargs="+", default=[40, 160])
    args = parser.parse_args(argv)
    if args.structured:
        if args.bits == parser.get_default("bits"):
            args.bits = [128, 256]
        main_structured(args)
        return
    print(f"{machine()}; load average {load_average()}")
    print(f"n = {args.n}, {args.queries} queries, k = {args.k}, one thread, CPU time\n")
    rows = []
    for n_bits in args.bits:
        us, ratio, same = run(args.n, n_bits, args.queries, args.k, args.candidates, args.repeats)
        rows.append(
            [
                n_bits,
                f"{us[0]:.0f}",
                f"{us[1]:.0f} ({ratio[1]:.1f}x)",
                f"{us[2]:.0f} ({ratio[2]:.1f}x)",
                f"{us[3]:.1f}",
                "yes" if same else "NO",
            ]
        )
    header = [
        "bits",
        "hamming us/q",
        "asym scan us/q (x hamming)",
        "numpy matmul us/q (x hamming)",
        f"asym rerank of {args.candidates} us/q",
        "top k = numpy's",
    ]
    print(markdown_table(header, rows))


if __name__ == "__main__":
    main()
