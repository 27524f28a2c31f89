"""Fig. 2 of binary-codes-survey.txt: query time of linear scan vs semantic hashing.

Brute-force exhaustive search (FlatIndex, popcount scan) over 30- and 256-bit codes with 1
and 2 threads, and a Hamming-ball lookup (semantic hashing, HammingBallIndex: enumerate the
codes within radius r of the query and look each one up) over 30-bit codes, at 20k and 1M
items. Codes are random-hyperplane LSH codes of the digits tiled with small Gaussian noise to
n rows (Fashion-MNIST when ``--fashion DIR`` is given). Per-query time is the median over
interleaved repetitions; the ball radius and the k of the scan are printed with the table.

    python bench/survey_timing.py                  # writes the 'survey-timing' section
    python bench/survey_timing.py --sizes 20000 --no-write
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import (  # noqa: E402
    interleaved_times,
    load_average,
    machine,
    markdown_table,
    write_section,
)
from hashlearn.datasets import load_digits, load_fashion_mnist, tile_with_noise  # noqa: E402
from hashlearn.hashers.lsh import RandomHyperplaneLSH  # noqa: E402
from hashlearn.index.flat import FlatIndex  # noqa: E402


def codes_for(X: np.ndarray, Q: np.ndarray, n: int, n_bits: int, seed: int = 0):
    """LSH codes of ``n`` noisy tiled rows of X and of the queries Q."""
    lsh = RandomHyperplaneLSH(n_bits, random_state=seed).fit(X)
    chunks = []
    for start in range(0, n, 100_000):
        rows = tile_with_noise(X, min(100_000, n - start) + start, noise=0.05, random_state=seed)[
            start:
        ]
        chunks.append(lsh.encode(rows))
    return np.concatenate(chunks), lsh.encode(Q)


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--sizes", type=int, nargs="+", default=[20_000, 1_000_000])
    parser.add_argument("--queries", type=int, default=200)
    parser.add_argument("--k", type=int, default=10)
    parser.add_argument("--radius", type=int, default=2)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--fashion", default=None, help="directory of Fashion-MNIST IDX files")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load_before = load_average()
    if args.fashion:
        X, _ = load_fashion_mnist(args.fashion, subset="all")
        X = X.astype(np.float32)
        source = "Fashion-MNIST"
    else:
        X, _ = load_digits()
        source = "digits"
    Q, X = X[: args.queries], X[args.queries :]
    try:
        from hashlearn.index.hamming_ball import HammingBallIndex
    except ImportError:  # pragma: no cover - written by another issue
        HammingBallIndex = None
    rows = []
    for n in args.sizes:
        contenders, labels = [], []
        for n_bits in (30, 256):
            db, q = codes_for(X, Q, n, n_bits)
            flat = FlatIndex(n_bits)
            flat.add(db)
            for threads in (1, 2):
                contenders.append(lambda f=flat, q=q, t=threads: f.search(q, args.k, n_threads=t))
                labels.append(f"linear scan {n_bits} bits, {threads} thread(s), k={args.k}")
            if n_bits == 30 and HammingBallIndex is not None:
                ball = HammingBallIndex(n_bits)
                ball.add(db)
                contenders.append(lambda b=ball, q=q: b.range_search(q, args.radius))
                labels.append(f"Hamming-ball lookup 30 bits, radius {args.radius}")
        times = interleaved_times(contenders, args.repeats)
        per_query = np.median(times, axis=0) / args.queries
        for label, t in zip(labels, per_query, strict=True):
            rows.append([f"{n:,}", label, f"{t * 1e6:.2f}"])
        print(markdown_table(["items", "method", "us / query"], rows[-len(labels) :]), flush=True)
    md = (
        "## Survey Fig. 2: linear scan vs Hamming-ball lookup (`bench/survey_timing.py`)\n\n"
        f"Fig. 2 of binary-codes-survey.txt: per-query time (median of {args.repeats} "
        f"interleaved repetitions, {args.queries} queries), LSH codes of {source} tiled with "
        f"noise. Machine: {machine()}. Load average before: {load_before}; after: "
        f"{load_average()}.\n\n" + markdown_table(["items", "method", "us / query"], rows)
    )
    if HammingBallIndex is None:
        md += "\n\nHammingBallIndex was not available: the semantic-hashing row is missing.\n"
    print(md)
    if not args.no_write:
        write_section("survey-timing", md)


if __name__ == "__main__":
    main()
