"""Exhaustive Hamming k-NN: hashlearn's FlatIndex vs faiss.IndexBinaryFlat vs numpy.

For n database codes (default 1M), b = 32/64/128/256/512/1024 bits, k = 1/10/100 and 1 and
2 threads (faiss: ``omp_set_num_threads``), on random codes and on LSH codes of
Fashion-MNIST (the 60k training images tiled with small Gaussian noise to n rows, test
images as queries). Two ways of calling: one batch of 200 queries, and the same 200 queries
one ``search`` call each (a web service's way). FlatIndex runs on the kernel path this CPU
gets (``hashlearn info``; ``wide``: 512-bit XOR + VPOPCNTQ, with AVX-512 VPOPCNTDQ) and on
the forced ``portable`` path, interleaved with faiss in every repetition. Reports queries per second
(median), the faiss/hashlearn ratios of wall and of process CPU time (median of the
per-repetition ratios; > 1: hashlearn faster), the cost of a query called alone over its
cost in a batch, and whether FlatIndex's distances equal faiss's on every query. The
per-call overhead (one ``search`` on a 1-code index) is measured for both libraries. The
numpy baseline (``np.bitwise_count`` + ``argpartition``) runs single threaded on a subset
of the queries.

    python bench/hamming_search.py                   # full run, writes docs/results.md
    python bench/hamming_search.py --n 100000 --no-write   # quick look
    python bench/hamming_search.py --n 200000 --bits 64 --k 10 --threads 1 \
        --data random --repeats 3 --no-write               # one row
"""

from __future__ import annotations

import argparse
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import (  # noqa: E402
    interleaved_times,
    interleaved_wall_and_cpu,
    load_average,
    machine,
    markdown_table,
    write_section,
)
from hashlearn import FlatIndex, RandomHyperplaneLSH  # noqa: E402
from hashlearn._utils.popcount import (  # noqa: E402
    kernel_path_description,
    set_kernel_path,
)
from hashlearn.codes import as_words, hamming_distance  # noqa: E402
from hashlearn.datasets import fashion_mnist_available, load_fashion_mnist  # noqa: E402


def random_codes(n: int, n_queries: int, n_bits: int, seed: int = 0):
    rng = np.random.default_rng(seed)
    width = n_bits // 8
    return (
        rng.integers(0, 256, (n, width), dtype=np.uint8),
        rng.integers(0, 256, (n_queries, width), dtype=np.uint8),
    )


def fashion_lsh_codes(
    n: int, n_queries: int, max_bits: int, noise: float = 0.05, seed: int = 0, chunk: int = 50_000
):
    """LSH codes of Fashion-MNIST tiled with noise to ``n`` rows, and of test queries.

    LSH bits are independent, so the first b bits of the ``max_bits`` code are a b-bit LSH
    code: one encoding serves every code length.
    """
    X_train, _ = load_fashion_mnist(subset="train")
    X_test, _ = load_fashion_mnist(subset="test")
    X_train /= 255.0
    X_test /= 255.0
    hasher = RandomHyperplaneLSH(max_bits, random_state=seed).fit(X_train[:10_000])
    rng = np.random.default_rng(seed)
    scale = noise * float(X_train.std())
    codes = np.empty((n, max_bits // 8), np.uint8)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk)) % len(X_train)
        block = (
            X_train[rows]
            + rng.standard_normal((len(rows), X_train.shape[1]), dtype=np.float32) * scale
        )
        codes[start : start + len(rows)] = hasher.encode(block)
    queries = hasher.encode(X_test[rng.permutation(len(X_test))[:n_queries]])
    return codes, queries


def numpy_search(db_words: np.ndarray, q_words: np.ndarray, k: int) -> np.ndarray:
    """Baseline: XOR + np.bitwise_count over uint64 words, argpartition, sort by (d, id)."""
    out = np.empty((len(q_words), k), np.int64)
    for i, q in enumerate(q_words):
        d = np.bitwise_count(db_words ^ q).sum(axis=1, dtype=np.int32)
        part = np.argpartition(d, k - 1)[:k]
        out[i] = part[np.lexsort((part, d[part]))]
    return out


def _on_path(path: str | None, fn):
    """``fn`` run with FlatIndex forced onto a kernel path (``"wide"`` / ``"portable"``), or on
    this CPU's choice (None)."""

    def call():
        set_kernel_path(path)
        return fn()

    return call


def _one_per_call(search, singles, k, **kw):
    return lambda: [search(q, k, **kw) for q in singles]


def call_overhead(repeats: int = 2000) -> tuple[float, float]:
    """Microseconds of one ``search`` call on a 1-code index (validation, dispatch, kernel
    start, result arrays): hashlearn's, faiss's (median of 5 runs of ``repeats`` calls)."""
    import faiss

    faiss.omp_set_num_threads(1)
    code = np.zeros((1, 8), np.uint8)
    ours = FlatIndex(64)
    ours.add(code)
    ref = faiss.IndexBinaryFlat(64)
    ref.add(code)
    calls = [partial(ours.search, code, 1, n_threads=1), partial(ref.search, code, 1)]
    wall = interleaved_times([lambda f=f: [f() for _ in range(repeats)] for f in calls], 5)
    us = np.median(wall, axis=0) / repeats * 1e6
    return float(us[0]), float(us[1])


def _ratio(times: np.ndarray, ref: int, ours: int) -> np.ndarray:
    return times[:, ref] / times[:, ours]


def run(args) -> list[list[object]]:
    import faiss

    rows = []
    datasets = []
    if "random" in args.data:
        datasets.append("random")
    if "fashion" in args.data:
        if fashion_mnist_available():
            datasets.append("fashion-lsh")
        else:
            print(
                "Fashion-MNIST not installed (apt-get install -y dataset-fashion-mnist): "
                "skipping LSH codes of real data",
                file=sys.stderr,
            )
    paths = [None, "portable"]  # this CPU's choice (set_kernel_path(None)), forced portable
    for data in datasets:
        t0 = time.perf_counter()
        if data == "random":
            full_db, full_q = random_codes(args.n, args.queries, max(args.bits))
        else:
            full_db, full_q = fashion_lsh_codes(args.n, args.queries, max(args.bits))
        print(f"[{data}] codes ready in {time.perf_counter() - t0:.1f} s", file=sys.stderr)
        for n_bits in args.bits:
            db = np.ascontiguousarray(full_db[:, : n_bits // 8])
            q = np.ascontiguousarray(full_q[:, : n_bits // 8])
            singles = [q[i : i + 1] for i in range(min(len(q), args.single_queries))]
            ours = FlatIndex(n_bits)
            ours.add(db)
            ref = faiss.IndexBinaryFlat(n_bits)
            ref.add(db)
            words = as_words(db).reshape(len(db), -1)
            q_words = as_words(q).reshape(len(q), -1)
            for k in args.k:
                d_ref, _ = ref.search(q, k)
                exact = True
                for path in paths:
                    set_kernel_path(path)
                    d_ours, i_ours = ours.search(q, k)
                    exact &= bool(np.array_equal(d_ours, d_ref)) and bool(
                        np.array_equal(hamming_distance(q[:, None, :], db[i_ours]), d_ours)
                    )
                n_np = min(len(q), args.numpy_queries)
                t_np = interleaved_times([partial(numpy_search, words, q_words[:n_np], k)], 1)
                qps_np = n_np / float(np.median(t_np))
                for threads in args.threads:
                    faiss.omp_set_num_threads(threads)
                    batch = [partial(ref.search, q, k)] + [
                        _on_path(p, partial(ours.search, q, k, n_threads=threads)) for p in paths
                    ]
                    single = [_one_per_call(ref.search, singles, k)] + [
                        _on_path(p, _one_per_call(ours.search, singles, k, n_threads=threads))
                        for p in paths
                    ]
                    wall, cpu = interleaved_wall_and_cpu(batch + single, args.repeats)
                    per_query = np.concatenate(
                        [wall[:, : len(batch)] / len(q), wall[:, len(batch) :] / len(singles)],
                        axis=1,
                    )
                    cpu_q = np.concatenate(
                        [cpu[:, : len(batch)] / len(q), cpu[:, len(batch) :] / len(singles)],
                        axis=1,
                    )
                    qps = 1.0 / np.median(per_query, axis=0)
                    s0 = len(batch)  # column of faiss one query per call
                    cells = []
                    for base, first in ((0, 1), (s0, s0 + 1)):
                        wide_w = _ratio(per_query, base, first)
                        cell = (
                            f"**{np.median(wide_w):.2f}** ({wide_w.min():.2f}-{wide_w.max():.2f})"
                            f" / {np.median(_ratio(cpu_q, base, first)):.2f}"
                        )
                        port = f"{np.median(_ratio(per_query, base, first + 1)):.2f} / "
                        port += f"{np.median(_ratio(cpu_q, base, first + 1)):.2f}"
                        cells += [f"{qps[base]:,.0f}", f"{qps[first]:,.0f}", cell, port]
                    alone = np.median(cpu_q[:, s0 + 1] / cpu_q[:, 1])
                    row = [data, n_bits, k, threads, *cells, f"{alone:.2f}"]
                    row += [f"{qps_np:,.0f}" if threads == 1 else "", "yes" if exact else "NO"]
                    rows.append(row)
                    print(" | ".join(str(c) for c in row), flush=True)
    set_kernel_path(None)
    return rows


HEADER = [
    "codes",
    "bits",
    "k",
    "threads",
    "faiss QPS (batch)",
    "hashlearn QPS (batch)",
    "faiss/hashlearn batch: wall (min-max) / CPU",
    "portable path: wall / CPU",
    "faiss QPS (1 per call)",
    "hashlearn QPS (1 per call)",
    "faiss/hashlearn 1 per call: wall (min-max) / CPU",
    "portable path: wall / CPU",
    "hashlearn CPU, 1 per call / batch",
    "numpy QPS",
    "distances = faiss",
]


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=200, help="queries per batch")
    parser.add_argument(
        "--single-queries", type=int, default=200, help="queries searched one call each"
    )
    parser.add_argument("--numpy-queries", type=int, default=20)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument(
        "--bits",
        type=lambda s: [int(x) for x in s.split(",")],
        default=[32, 64, 128, 256, 512, 1024],
    )
    parser.add_argument("--k", type=lambda s: [int(x) for x in s.split(",")], default=[1, 10, 100])
    parser.add_argument("--threads", type=lambda s: [int(x) for x in s.split(",")], default=[1, 2])
    parser.add_argument("--data", type=lambda s: s.split(","), default=["random", "fashion"])
    parser.add_argument("--no-write", action="store_true", help="do not update docs/results.md")
    args = parser.parse_args(argv)
    overhead_ours, overhead_faiss = call_overhead()
    overhead = (
        f"Per-call overhead (one search of 1 query on a 1-code index, 64 bits, 1 thread): "
        f"hashlearn {overhead_ours:.1f} µs, faiss {overhead_faiss:.1f} µs."
    )
    kernel = kernel_path_description()
    print(f"{machine()}\nhamming kernel: {kernel}\n{overhead}")
    print(" | ".join(HEADER))
    load_before = load_average()
    rows = run(args)
    load_after = load_average()
    print(f"load average before: {load_before}; after: {load_after}")
    if not args.no_write:
        import faiss

        text = (
            "## Exhaustive Hamming k-NN: FlatIndex vs faiss.IndexBinaryFlat "
            "(`bench/hamming_search.py`)\n\n"
            f"Machine: {machine()}; faiss {faiss.__version__}; hashlearn's Hamming kernel: "
            f"{kernel}. n = {args.n:,} codes, {args.queries} queries per batch and "
            f"{args.single_queries} searched one call each, {args.repeats} interleaved "
            "repetitions (median QPS; ratios = medians of per-repetition faiss/hashlearn "
            "time ratios, wall and process CPU, > 1 means hashlearn is faster; the portable "
            "path is hashlearn forced onto it with the same faiss times). "
            f"{overhead} numpy baseline on {args.numpy_queries} queries, 1 thread. Load "
            f"average before: {load_before}; after: {load_after}.\n\n"
            + markdown_table(HEADER, rows)
        )
        write_section("hamming_search", text)


if __name__ == "__main__":
    main()
