"""Asymmetric ranking (float query projections against packed codes) vs the Hamming scan.

For n random codes of b bits and Gaussian query projections, one thread, process CPU time:

* ``hamming``: ``FlatIndex.search`` of the queries' own codes (XOR + popcount, top k);
* ``asym scan``: :func:`hashlearn.index._asymmetric.asymmetric_scan` (byte tables, top k);
* ``numpy``: the oracle's way, ``P @ (2 bits - 1).T`` in float32 (the +-1 matrix made
  beforehand, BLAS bounded to one thread) and ``argpartition``: what a float scan of
  b-dimensional vectors costs;
* ``asym rerank``: :func:`~hashlearn.index._asymmetric.asymmetric_rerank` of each query's
  Hamming shortlist of ``--candidates`` positions (per query, excluding the shortlist).

Timing is interleaved per repetition (``bench/_common.py``); the ratios are medians of the
per-repetition ratios of CPU time. Prints a table; writes nothing.

    python bench/asymmetric.py                             # n = 200k, b = 64..512
    python bench/asymmetric.py --n 20000 --bits 256 --queries 20 --repeats 2   # smoke run
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
from hashlearn.index._asymmetric import asymmetric_rerank, asymmetric_scan  # noqa: E402


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


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--bits", type=int, nargs="+", default=[64, 128, 256, 384, 512])
    parser.add_argument("--queries", type=int, default=100)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--candidates", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
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
