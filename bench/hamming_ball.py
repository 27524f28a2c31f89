"""Hamming-ball lookup (semantic hashing, survey §2.2) vs the exhaustive scan, at 32 bits.

HammingBallIndex enumerates each query's Hamming ball (1 + 32 + 496 = 529 probes at radius
2) in a hash table of the database codes; FlatIndex compares the query with every code. For
n database codes (default 1M) of two kinds -- uniform random codes, and clustered codes (a
few thousand centres with a few bits flipped, like learned codes: many items per ball) --
both indexes answer ``range_search`` at radius 0, 1, 2 and ``search(k=10)`` single threaded.
Reports microseconds per query (median over interleaved repetitions; the flat index runs on
a subset of the queries, it is slower), the speed-up over the scan in the same repetition,
the mean number of results, and whether the two indexes return identical results.

    python bench/hamming_ball.py                    # full run, writes docs/results.md
    python bench/hamming_ball.py --n 100000 --no-write
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import interleaved_times, machine, markdown_table, write_section  # noqa: E402
from hashlearn.codes import pack_bits  # noqa: E402
from hashlearn.index.flat import FlatIndex  # noqa: E402
from hashlearn.index.hamming_ball import HammingBallIndex  # noqa: E402


def make_codes(kind: str, n: int, n_queries: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    if kind == "random":
        return (
            rng.integers(0, 256, (n, 4), dtype=np.uint8),
            rng.integers(0, 256, (n_queries, 4), dtype=np.uint8),
        )
    centres = rng.random((max(2, n // 300), 32)) < 0.5
    db = np.empty((n, 4), np.uint8)
    for start in range(0, n, 100_000):
        stop = min(n, start + 100_000)
        bits = centres[rng.integers(0, len(centres), stop - start)]
        db[start:stop] = pack_bits(bits ^ (rng.random((stop - start, 32)) < 0.05))
    q_bits = centres[rng.integers(0, len(centres), n_queries)]
    return db, pack_bits(q_bits ^ (rng.random((n_queries, 32)) < 0.05))


def same(a, b) -> bool:
    return all(np.array_equal(x, y) for x, y in zip(a, b, strict=False))


def run(args) -> list[list[object]]:
    rows = []
    for kind in args.data:
        db, queries = make_codes(kind, args.n, args.queries)
        ball, flat = HammingBallIndex(32), FlatIndex(32)
        t0 = time.perf_counter()
        ball.add(db)
        build = time.perf_counter() - t0
        flat.add(db)
        sub = queries[: args.flat_queries]
        cases = [
            (f"range r={r}", lambda idx, q, r=r: idx.range_search(q, r, n_threads=1))
            for r in (0, 1, 2)
        ]
        cases.append(("search k=10", lambda idx, q: idx.search(q, 10, n_threads=1)))
        for name, call in cases:
            times = interleaved_times(
                [lambda c=call, i=ball, q=queries: c(i, q), lambda c=call, i=flat, q=sub: c(i, q)],
                args.repeats,
            )
            ball_us = times[:, 0] / len(queries) * 1e6
            flat_us = times[:, 1] / len(sub) * 1e6
            res = call(ball, sub)
            n_res = (
                float(np.diff(res[0]).mean())
                if name.startswith("range")
                else float((res[1] >= 0).sum(1).mean())
            )
            rows.append(
                [
                    kind,
                    f"{args.n:,}",
                    name,
                    f"{np.median(ball_us):.1f}",
                    f"{np.median(flat_us):.1f}",
                    f"{np.median(flat_us / ball_us):.1f}x",
                    f"{n_res:.1f}",
                    "yes" if same(res, call(flat, sub)) else "NO",
                ]
            )
            print(rows[-1], flush=True)
        print(f"{kind}: built in {build:.2f} s, {ball.n_keys:,} distinct codes", flush=True)
    return rows


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--flat-queries", type=int, default=100)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--data", nargs="+", default=["random", "clustered"], choices=["random", "clustered"]
    )
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args()
    rows = run(args)
    header = [
        "codes",
        "n",
        "query",
        "ball µs/query",
        "flat µs/query",
        "speed-up",
        "results/query",
        "identical",
    ]
    md = "\n".join(
        [
            f"32-bit codes, single thread, median of {args.repeats} interleaved repetitions "
            f"({args.queries} ball queries, {args.flat_queries} flat queries). {machine()}",
            "",
            markdown_table(header, rows),
        ]
    )
    print(md)
    if not args.no_write:
        write_section("bench-hamming-ball", md)


if __name__ == "__main__":
    main()
