"""Exhaustive Hamming k-NN: hashlearn's FlatIndex vs faiss.IndexBinaryFlat vs numpy.

For n database codes (default 1M), b = 32/64/128/256 bits, k = 1/10/100 and 1 and 2
threads, on random codes and on LSH codes of Fashion-MNIST (the 60k training images tiled
with small Gaussian noise to n rows, 1000 test images as queries). Reports queries per
second (median over interleaved repetitions), the FlatIndex/faiss speed ratio (median of the
per-repetition ratios, with its range), and whether FlatIndex's distances equal faiss's on
every query. The numpy baseline (``np.bitwise_count`` + ``argpartition``) runs single
threaded on a subset of the queries.

    python bench/hamming_search.py                   # full run, writes docs/results.md
    python bench/hamming_search.py --n 100000 --no-write   # quick look
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
            ours = FlatIndex(n_bits)
            ours.add(db)
            ref = faiss.IndexBinaryFlat(n_bits)
            ref.add(db)
            words = as_words(db).reshape(len(db), -1)
            q_words = as_words(q).reshape(len(q), -1)
            for k in args.k:
                d_ours, i_ours = ours.search(q, k)
                d_ref, _ = ref.search(q, k)
                exact = bool(np.array_equal(d_ours, d_ref)) and bool(
                    np.array_equal(hamming_distance(q[:, None, :], db[i_ours]), d_ours)
                )
                n_np = min(len(q), args.numpy_queries)
                t_np = interleaved_times([partial(numpy_search, words, q_words[:n_np], k)], 1)
                qps_np = n_np / float(np.median(t_np))
                for threads in args.threads:
                    faiss.omp_set_num_threads(threads)
                    times, cpu = interleaved_wall_and_cpu(
                        [partial(ref.search, q, k), partial(ours.search, q, k, n_threads=threads)],
                        args.repeats,
                    )
                    qps = len(q) / np.median(times, axis=0)
                    ratio = times[:, 0] / times[:, 1]
                    cpu_ratio = cpu[:, 0] / cpu[:, 1]
                    row = [
                        data,
                        n_bits,
                        k,
                        threads,
                        f"{qps[0]:,.0f}",
                        f"{qps[1]:,.0f}",
                        f"{qps_np:,.0f}" if threads == 1 else "",
                        f"**{np.median(ratio):.2f}** ({ratio.min():.2f}-{ratio.max():.2f})",
                        f"{np.median(cpu_ratio):.2f}",
                        "yes" if exact else "NO",
                    ]
                    rows.append(row)
                    print(" | ".join(str(c) for c in row), flush=True)
    return rows


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--n", type=int, default=1_000_000)
    parser.add_argument("--queries", type=int, default=1000)
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
    header = [
        "codes",
        "bits",
        "k",
        "threads",
        "faiss QPS",
        "hashlearn QPS",
        "numpy QPS",
        "ratio hashlearn/faiss (min-max)",
        "CPU-time ratio",
        "distances = faiss",
    ]
    print(" | ".join(header))
    load_before = load_average()
    rows = run(args)
    load_after = load_average()
    print(f"load average before: {load_before}; after: {load_after}")
    if not args.no_write:
        import faiss

        text = (
            "## Exhaustive Hamming k-NN: FlatIndex vs faiss.IndexBinaryFlat "
            "(`bench/hamming_search.py`)\n\n"
            f"Machine: {machine()}; faiss {faiss.__version__}. n = {args.n:,} codes, "
            f"{args.queries} queries per batch, {args.repeats} interleaved repetitions "
            "(median QPS; ratio = median of per-repetition wall-time ratios faiss/hashlearn, >1 "
            "means hashlearn is faster; CPU-time ratio the same over process CPU seconds). "
            f"numpy baseline on {args.numpy_queries} queries, 1 thread. Load average "
            f"before: {load_before}; after: {load_after}.\n\n" + markdown_table(header, rows)
        )
        write_section("hamming_search", text)


if __name__ == "__main__":
    main()
