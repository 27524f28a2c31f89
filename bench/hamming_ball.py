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

from _common import (  # noqa: E402
    block_interleaved_wall_and_cpu,
    interleaved_wall_and_cpu,
    load_average,
    machine,
    markdown_table,
    write_section,
)
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


def faiss_hash(db):
    """faiss's IndexBinaryHash keyed by the whole 32-bit code (b = 32), or None."""
    try:
        import faiss
    except ImportError:
        return None
    faiss.omp_set_num_threads(1)
    index = faiss.IndexBinaryHash(32, 32)
    index.add(db)
    return index


def faiss_range(index, queries, radius):
    """faiss's range search at our ``radius`` (its radius is exclusive), ball of ``radius``."""
    index.nflip = radius
    return index.range_search(queries, radius + 1)


def same_range(ours, lims, D, I) -> bool:  # noqa: E741 - faiss's names
    """Whether faiss's range result holds the same (distance, id) pairs per query."""
    lims_o, D_o, I_o = ours
    if not np.array_equal(lims_o, lims):
        return False
    for q in range(len(lims) - 1):
        a, b = lims[q], lims[q + 1]
        got = sorted(zip(D[a:b].tolist(), I[a:b].tolist(), strict=True))
        if got != list(zip(D_o[a:b].tolist(), I_o[a:b].tolist(), strict=True)):
            return False
    return True


def run(args) -> list[list[object]]:
    rows = []
    for kind in args.data:
        db, queries = make_codes(kind, args.n, args.queries)
        ball, flat = HammingBallIndex(32), FlatIndex(32)
        t0 = time.perf_counter()
        ball.add(db)
        build = time.perf_counter() - t0
        flat.add(db)
        fhash = faiss_hash(db)
        sub = queries[: args.flat_queries]
        cases = [
            (f"range r={r}", r, lambda idx, q, r=r: idx.range_search(q, r, n_threads=1))
            for r in (0, 1, 2)
        ]
        cases.append(("search k=10", None, lambda idx, q: idx.search(q, 10, n_threads=1)))
        for name, radius, call in cases:
            # a k-NN scan costs what the ball's fallback costs: the same batch for both
            flat_q = queries if radius is None else sub
            contenders = [
                lambda c=call, i=ball, q=queries: c(i, q),
                lambda c=call, i=flat, q=flat_q: c(i, q),
            ]
            if fhash is not None and radius is not None:
                contenders.append(lambda r=radius, f=fhash, q=queries: faiss_range(f, q, r))
            if radius is None:  # one batch each: interleaved by blocks of 100 queries
                wall, cpu = block_interleaved_wall_and_cpu(
                    [
                        lambda s, e, c=call, i=ball, q=queries: c(i, q[s:e]),
                        lambda s, e, c=call, i=flat, q=queries: c(i, q[s:e]),
                    ],
                    len(queries),
                    100,
                    args.repeats,
                )
            else:
                wall, cpu = interleaved_wall_and_cpu(contenders, args.repeats)
            per_query = np.array([len(queries), len(flat_q), len(queries)])[: wall.shape[1]]
            wall_us, cpu_us = wall / per_query * 1e6, cpu / per_query * 1e6
            res = call(ball, queries)
            n_res = (
                float(np.diff(res[0]).mean())
                if radius is not None
                else float((res[1] >= 0).sum(1).mean())
            )
            identical = same(call(ball, sub), call(flat, sub))
            row = [
                kind,
                f"{args.n:,}",
                name,
                f"{np.median(wall_us[:, 0]):.1f} / {np.median(cpu_us[:, 0]):.1f}",
                f"{np.median(wall_us[:, 1]):.1f}",
                f"{np.median(wall_us[:, 1] / wall_us[:, 0]):.2f}x / "
                f"{np.median(cpu_us[:, 1] / cpu_us[:, 0]):.2f}x",
            ]
            if wall.shape[1] == 3:
                identical &= same_range(res, *faiss_range(fhash, queries, radius))
                row += [
                    f"{np.median(wall_us[:, 2]):.1f} / {np.median(cpu_us[:, 2]):.1f}",
                    f"{np.median(wall_us[:, 2] / wall_us[:, 0]):.2f}x / "
                    f"{np.median(cpu_us[:, 2] / cpu_us[:, 0]):.2f}x",
                ]
            else:
                row += ["", ""]
            row += [f"{n_res:.1f}", "yes" if identical else "NO"]
            rows.append(row)
            print(rows[-1], flush=True)
        print(f"{kind}: built in {build:.2f} s, {ball.n_keys:,} distinct codes", flush=True)
    return rows


def per_result_rows(args) -> list[list[object]]:
    """The cost of one more result, the probes held fixed: clustered codes each stored
    ``t`` times (``t = 1, 4``), so the same buckets are hit and each holds ``t`` times the
    items; the slope of CPU time against results per query, range search at radius 2."""
    base, queries = make_codes("clustered", args.n // 4, args.queries)
    indexes = {}
    for t in (1, 4):
        db = np.repeat(base, t, axis=0)
        ball = HammingBallIndex(32)
        ball.add(db)
        indexes[t] = (ball, faiss_hash(db))
    contenders = [lambda b=indexes[t][0]: b.range_search(queries, 2, n_threads=1) for t in (1, 4)]
    has_faiss = indexes[1][1] is not None
    if has_faiss:
        contenders += [lambda f=indexes[t][1]: faiss_range(f, queries, 2) for t in (1, 4)]
    _, cpu = interleaved_wall_and_cpu(contenders, 3 * args.repeats)
    cpu_us = cpu / len(queries) * 1e6  # (repetitions, contenders)
    results = [float(np.diff(indexes[t][0].range_search(queries, 2)[0]).mean()) for t in (1, 4)]
    extra = (results[1] - results[0]) or 1.0
    rows = []
    names = ["HammingBallIndex"] + (["faiss IndexBinaryHash"] if has_faiss else [])
    for j, name in enumerate(names):
        one, four = cpu_us[:, 2 * j], cpu_us[:, 2 * j + 1]
        per_result = (four - one) / extra * 1e3  # ns, per repetition
        rows.append(
            [
                name,
                f"{np.median(one):.1f}",
                f"{np.median(four):.1f}",
                f"{results[0]:.1f} / {results[1]:.1f}",
                f"{np.median(per_result):.1f} ({np.min(per_result):.1f}-{np.max(per_result):.1f})",
            ]
        )
        print(rows[-1], flush=True)
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
    load_before = load_average()
    rows = run(args)
    header = [
        "codes",
        "n",
        "query",
        "ball µs/query (wall / CPU)",
        "flat µs/query",
        "ball vs flat (wall / CPU)",
        "faiss IndexBinaryHash µs/query (wall / CPU)",
        "ball vs faiss (wall / CPU)",
        "results/query",
        "identical",
    ]
    per_result = per_result_rows(args)
    md = "\n".join(
        [
            f"32-bit codes, single thread, median of {args.repeats} interleaved repetitions "
            f"({args.queries} ball and faiss queries; {args.flat_queries} flat queries for "
            f"range search, {args.queries} for k-NN, the batch the ball scans when it falls "
            "back; k-NN interleaved by blocks of 100 queries, each block run by both indexes "
            "in turn, as the two costs differ by about 1 %: the probes of levels 0-1). "
            "faiss: `IndexBinaryHash(32, b=32)` with `nflip = r` (its ball of radius r, exact "
            "here). 'identical': the ball's results equal FlatIndex's (and faiss's, as sets of "
            f"(distance, id) per query). Load average before {load_before}, after "
            f"{load_average()}. {machine()}",
            "",
            markdown_table(header, rows),
            "",
            "**Cost of one more result** (range search, radius 2, CPU): the clustered codes "
            f"of {args.n // 4:,} items, then each stored 4 times ({args.n:,} items): the same "
            "buckets are probed and hit, each holding 4 times the items, so the difference "
            "per extra result is what a result costs (reading, checking, sorting and returning "
            f"it); {3 * args.repeats} interleaved repetitions, median of the per-repetition "
            "slopes.",
            "",
            markdown_table(
                [
                    "index",
                    "µs/query, each code once",
                    "µs/query, each code 4 times",
                    "results/query",
                    "ns per extra result (median, min-max)",
                ],
                per_result,
            ),
        ]
    )
    print(md)
    if not args.no_write:
        title = (
            "## Hamming-ball lookup vs FlatIndex and faiss IndexBinaryHash "
            "(`bench/hamming_ball.py`, issue 14 item 3)"
        )
        write_section("bench-hamming-ball", f"{title}\n\n{md}")


if __name__ == "__main__":
    main()
