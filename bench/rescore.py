"""Rescoring candidates: hashlearn's refine kernels vs faiss and numpy on the same candidates.

The refine stage of every searcher scores each query's candidate rows exactly and keeps the
best k. Here the candidates are given (random rows of the database, the same for every
contender) and three implementations score them, one thread each, interleaved:

* hashlearn -- ``hashlearn.rerank.Refiner(metric, screen=False)`` (the batched numba kernel
  over float32 rows; the wide SIMD path is whatever LLVM emits for this CPU), and
  ``screen=True`` (Euclidean: the 8-bit screen first); beside them the unscreened float64
  kernel (``rerank._kernels.distance_kernel``) that ``rescore_runner`` passes over for
  float32 rows with at least 2k candidates (the same top k; which is faster is the CPU's);
* faiss -- ``faiss.knn_inner_products_by_idx`` / ``faiss.knn_L2sqr_by_idx`` (IndexFlatIP /
  IndexFlatL2's kernels restricted to a subset of rows per query), ``omp_set_num_threads(1)``;
* numpy -- the candidate rows gathered, one batched BLAS product, ``argpartition``.

Float32 rows of ``d`` = 96 (Deep1B) and 384 (MiniLM), 1000 queries, k = 10, 100 and 1000
candidates. Reports CPU ms per query (median of interleaved repetitions), the ratio
faiss / hashlearn (> 1: hashlearn faster; median of per-repetition ratios) and whether the
top-k ids agree with faiss's and numpy's (share of queries: float32 sums may swap
near-ties, hashlearn ranks in float64).

    python bench/rescore.py [--n 200000] [--queries 1000] [--repeats 5]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread everywhere, before numpy / numba / faiss load

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import faiss  # noqa: E402
import numpy as np  # noqa: E402

import hashlearn  # noqa: E402
from _common import interleaved_wall_and_cpu, load_average, machine, markdown_table  # noqa: E402
from hashlearn.rerank import Refiner  # noqa: E402
from hashlearn.rerank._kernels import EUCLIDEAN, NEG_INNER, distance_kernel  # noqa: E402

K = 10


def faiss_by_idx(metric: str, X, Q, cand, k):
    """faiss's flat kernels over each query's candidate rows (ids are the rows)."""
    m, c = cand.shape
    D = np.empty((m, k), np.float32)
    I = np.empty((m, k), np.int64)
    fn = faiss.knn_inner_products_by_idx if metric == "inner_product" else faiss.knn_L2sqr_by_idx
    ptr = faiss.swig_ptr
    fn(ptr(Q), ptr(X), ptr(cand), X.shape[1], m, X.shape[0], c, k, ptr(D), ptr(I), c)
    return D, I


def numpy_gather(metric: str, X, Q, cand, k):
    """Gather, one batched product, argpartition, then sort the k."""
    V = X[cand]  # (m, c, d)
    S = np.matmul(V, Q[:, :, None])[:, :, 0]
    if metric == "inner_product":
        key = -S
    else:
        key = np.einsum("mcd,mcd->mc", V, V) - 2 * S
    part = np.argpartition(key, k - 1, axis=1)[:, :k]
    order = np.take_along_axis(key, part, 1).argsort(axis=1)
    return np.take_along_axis(cand, np.take_along_axis(part, order, 1), 1)


def float64_kernel(metric: str, X, Q, cand, k):
    """The unscreened float64 kernel over the candidate rows (ids = rows here)."""
    kind = NEG_INNER if metric == "inner_product" else EUCLIDEAN
    out_d, out_i = np.full((len(Q), k), np.inf), np.full((len(Q), k), -1, np.int64)
    distance_kernel(Q, X, cand, kind, k, out_d, out_i, 0, len(Q))
    return out_d, out_i


def rows(n: int, d: int, m: int, repeats: int) -> list[dict]:
    rng = np.random.default_rng(d)
    X = rng.standard_normal((n, d), dtype=np.float32)
    Q = rng.standard_normal((m, d), dtype=np.float32)
    out = []
    for metric in ("inner_product", "euclidean"):
        plain = Refiner(metric, screen=False)
        plain.add(X, np.arange(n))
        screened = Refiner(metric, screen=True)
        screened.add(X, np.arange(n))
        for c in (100, 1000):
            cand = np.stack([rng.choice(n, c, replace=False) for _ in range(m)]).astype(np.int64)
            calls = [
                lambda r=plain, c=cand: r.refine(Q, c, K, n_threads=1),
                lambda r=screened, c=cand: r.refine(Q, c, K, n_threads=1),
                lambda c=cand, mt=metric: faiss_by_idx(mt, X, Q, c, K),
                lambda c=cand, mt=metric: numpy_gather(mt, X, Q, c, K),
                lambda c=cand, mt=metric: float64_kernel(mt, X, Q, c, K),
            ]
            ours = calls[0]()[1]  # rows whose top k equals faiss's / numpy's (float32 sums
            # may swap near-ties: hashlearn ranks in float64)
            same = float(np.mean((ours == calls[2]()[1]).all(axis=1)))
            same_np = float(np.mean((ours == calls[3]()).all(axis=1)))
            assert np.array_equal(ours, calls[4]()[1]), "the float64 kernel's top k differs"
            _, cpu = interleaved_wall_and_cpu(calls, repeats)
            ms = np.median(cpu, axis=0) / m * 1e3
            out.append(
                dict(
                    d=d,
                    metric=metric,
                    candidates=c,
                    hashlearn_ms=ms[0],
                    screened_ms=ms[1],
                    faiss_ms=ms[2],
                    numpy_ms=ms[3],
                    float64_ms=ms[4],
                    faiss_over_hashlearn=float(np.median(cpu[:, 2] / cpu[:, 0])),
                    numpy_over_hashlearn=float(np.median(cpu[:, 3] / cpu[:, 0])),
                    same_faiss=same,
                    same_numpy=same_np,
                )
            )
            print(out[-1], flush=True)
    return out


def one_thread_cpu_over_wall(repeats: int) -> tuple[float, float]:
    """``EmbeddingIndex.search(Q, 10, n_threads=1)`` over 39,000 x 384 float32 rows (the
    issue's case), 1000 queries, numpy's BLAS left on every core before: process CPU time
    over wall time of the search (1.0: one CPU), and its CPU ms per query."""
    import threadpoolctl

    rng = np.random.default_rng(0)
    X = rng.standard_normal((39_000, 384), dtype=np.float32)
    Q = rng.standard_normal((1000, 384), dtype=np.float32)
    index = hashlearn.EmbeddingIndex().fit(X[:20_000]).add(X)
    index.search(Q, K, n_threads=1)
    with threadpoolctl.threadpool_limits(os.cpu_count()):  # BLAS on every core, then idle
        X[:1000] @ X[:1000].T
    ratios, cpu = [], []
    for _ in range(repeats):
        wall0, cpu0 = time.perf_counter(), time.process_time()
        index.search(Q, K, n_threads=1)
        wall, used = time.perf_counter() - wall0, time.process_time() - cpu0
        ratios.append(used / wall)
        cpu.append(used)
    return float(np.median(ratios)), float(np.median(cpu)) / len(Q) * 1e3


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--n", type=int, default=200_000)
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args()
    hashlearn.set_num_threads(1)
    faiss.omp_set_num_threads(1)
    start = load_average()
    results = rows(args.n, 96, args.queries, args.repeats)
    results += rows(args.n, 384, args.queries, args.repeats)
    header = ["d", "metric", "candidates", "hashlearn CPU ms/query", "screened", "float64"]
    header += ["faiss"]
    header += ["numpy", "faiss / hashlearn", "numpy / hashlearn", "same top k: faiss / numpy"]
    table = markdown_table(
        header,
        [
            [
                r["d"],
                r["metric"],
                r["candidates"],
                f"{r['hashlearn_ms']:.4f}",
                f"{r['screened_ms']:.4f}",
                f"{r['float64_ms']:.4f}",
                f"{r['faiss_ms']:.4f}",
                f"{r['numpy_ms']:.4f}",
                f"**{r['faiss_over_hashlearn']:.2f}**",
                f"{r['numpy_over_hashlearn']:.2f}",
                f"{r['same_faiss']:.3f} / {r['same_numpy']:.3f}",
            ]
            for r in results
        ],
    )
    print(
        f"\n{machine()}; faiss {faiss.__version__}; n = {args.n}, {args.queries} queries, k = {K};"
    )
    ratio, ms = one_thread_cpu_over_wall(args.repeats)
    print(f"load average {start} before, {load_average()} after\n\n{table}\n")
    print(
        f"One-thread search, CPU / wall: EmbeddingIndex().search(Q, 10, n_threads=1), 39,000 x "
        f"384 float32, 1000 queries: {ratio:.3f} ({ms:.4f} CPU ms/query; median of {args.repeats})"
    )


if __name__ == "__main__":
    main()
