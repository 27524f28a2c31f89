"""Sharded build and search on 2 local Dask workers, beside the same Searcher in one process.

Data (generated from a seed, never stored): ``n`` float32 rows of ``d = 96`` dimensions (as
Deep1B's), each a centre (one of 1000, N(0, 1)) plus a point of a shared 16-dimensional
subspace (N(0, 1) coordinates, a random 16 x 96 basis scaled by 1/4) plus N(0, 0.05^2)
noise -- a low intrinsic dimension, as real descriptors have (isotropic Gaussian clusters in
96 dimensions leave nearest neighbours almost random and no hash finds them). Built block by
block (``dask.array.map_blocks``, each block from its own seed), so the whole array never
exists on the client. Queries: 1000 fresh samples of the same distribution.

Searcher: ITQ, 64 bits (Gong & Lazebnik, "Iterative quantization", CVPR 2011), fitted on the
first ``--train`` rows; shortlist ``n_candidates`` (default 1000) by Hamming distance, refine by
exact Euclidean distance, k = 10.

* sharded -- ``Searcher(hasher, ShardedIndex(client, 64, n_shards=2), rerank="euclidean")``
  on a ``LocalCluster`` of 2 worker processes (``threads`` each, no memory limit); the rows
  are added with ``index.add(None, vectors=X)``: every block is computed, encoded and kept
  by the worker of the shard it goes to.
* one process -- the same fitted hasher in ``Searcher(hasher, "flat", rerank="euclidean")``
  in a fresh process that builds the whole array in memory (so its peak memory is its own).

Reported: build time (generating the rows and adding them; the fit is shared), peak resident
memory (``VmHWM``) of the client, of each worker process and of the one process, search
throughput (QPS, the 1000 queries in one batch, best of ``--repeats``), recall@10 against
exact Euclidean search (brute force over all rows, on the cluster), and whether the two
searchers return the same ids and distances.

    python bench/sharded.py --n 200000          # a check (minutes on a busy 2-core machine)
    python bench/sharded.py --n 10000000        # the issue's case: ~4 GB of vectors
"""

from __future__ import annotations

import argparse
import json
import multiprocessing
import resource
import sys
import time
from functools import partial
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import load_average, machine, markdown_table  # noqa: E402

D_DIM, N_CENTRES, LATENT, NOISE, K = 96, 1000, 16, 0.05, 10


def _rows(seed: int, start: int, stop: int, stream: int = 1) -> np.ndarray:
    """Rows ``start:stop`` of the data set of ``seed`` (the same whoever makes them); other
    ``stream`` values draw other rows of the same distribution (the queries)."""
    shape = np.random.default_rng([seed, 0])
    centres = shape.standard_normal((N_CENTRES, D_DIM), dtype=np.float32)
    basis = shape.standard_normal((LATENT, D_DIM), dtype=np.float32) / np.sqrt(LATENT)
    rng, m = np.random.default_rng([seed, stream, start]), stop - start
    X = centres[rng.integers(0, N_CENTRES, m)]
    X += rng.standard_normal((m, LATENT), dtype=np.float32) @ basis
    X += NOISE * rng.standard_normal((m, D_DIM), dtype=np.float32)
    return X


def _block(seed: int, block_info=None) -> np.ndarray:
    (start, stop), _ = block_info[None]["array-location"]
    return _rows(seed, start, stop)


def dask_rows(seed: int, n: int, chunk: int):
    import dask.array as da

    chunks = ((chunk,) * (n // chunk) + ((n % chunk,) if n % chunk else ()), (D_DIM,))
    return da.map_blocks(partial(_block, seed), chunks=chunks, dtype=np.float32)


def queries(seed: int, m: int) -> np.ndarray:
    return _rows(seed, 0, m, stream=2)


def _block_topk(block: np.ndarray, Q: np.ndarray, start: int):
    """Exact k nearest rows of one block (squared Euclidean in float64, ties by id)."""
    V = block.astype(np.float64)
    d2 = (Q**2).sum(1)[:, None] - 2 * Q @ V.T + (V**2).sum(1)[None, :]
    top = np.argpartition(d2, min(K, d2.shape[1] - 1), axis=1)[:, :K]
    return np.take_along_axis(d2, top, 1), top + start


def exact_knn(X, Q: np.ndarray) -> np.ndarray:
    """Exact k-NN ids of ``Q`` over the dask array ``X``, block by block on the cluster."""
    import dask

    Q64 = Q.astype(np.float64)
    starts = np.concatenate([[0], np.cumsum(X.chunks[0])])
    parts = [
        dask.delayed(_block_topk)(b, Q64, int(s))
        for b, s in zip(X.to_delayed().ravel(), starts, strict=False)
    ]
    results = dask.compute(*parts)
    D = np.concatenate([r[0] for r in results], 1)
    I = np.concatenate([r[1] for r in results], 1)
    return np.take_along_axis(I, np.lexsort((I, D), axis=1)[:, :K], 1)


def recall(I: np.ndarray, truth: np.ndarray) -> float:
    return float(np.mean([len(np.intersect1d(a, b)) / K for a, b in zip(I, truth, strict=True)]))


def best_qps(fn, m: int, repeats: int) -> tuple[float, object]:
    times, out = [], None
    for _ in range(repeats):
        t0 = time.perf_counter()
        out = fn()
        times.append(time.perf_counter() - t0)
    return m / min(times), out


def peak_rss_mib() -> float:
    """This process's peak resident memory: ``VmHWM`` (Linux; unlike ``ru_maxrss`` it is
    not inherited across the exec of a spawned process), else ``ru_maxrss``."""
    try:
        for line in Path("/proc/self/status").read_text().splitlines():
            if line.startswith("VmHWM:"):
                return int(line.split()[1]) / 1024  # kB
    except OSError:
        pass
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024  # Linux: KiB


def one_process(args, hasher, Q, conn) -> None:
    """The same Searcher in one process: the whole array in memory (run in a fresh process)."""
    from hashlearn import Searcher

    t0 = time.perf_counter()  # the build generates the rows, as the workers do
    X = np.empty((args.n, D_DIM), np.float32)
    for start in range(0, args.n, args.chunk):
        X[start : start + args.chunk] = _rows(args.seed, start, min(start + args.chunk, args.n))
    searcher = Searcher(hasher, "flat", rerank="euclidean", n_candidates=args.candidates)
    searcher.add(X)
    build = time.perf_counter() - t0
    qps, (D, I) = best_qps(lambda: searcher.search(Q, K), len(Q), args.repeats)
    conn.send({"build_s": build, "qps": qps, "D": D, "I": I, "peak_mib": peak_rss_mib()})


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawTextHelpFormatter)
    p.add_argument("--n", type=int, default=10_000_000, help="database rows (default 10M)")
    p.add_argument("--chunk", type=int, default=100_000, help="rows per dask block")
    p.add_argument("--queries", type=int, default=1000)
    p.add_argument("--candidates", type=int, default=1000, help="n_candidates refined")
    p.add_argument("--train", type=int, default=50_000, help="rows the hasher is fitted on")
    p.add_argument("--threads", type=int, default=1, help="threads per worker")
    p.add_argument("--repeats", type=int, default=3)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--json", type=Path, help="also write the numbers to this file")
    args = p.parse_args()

    import distributed

    from hashlearn import Searcher
    from hashlearn.distributed import ShardedIndex
    from hashlearn.hashers.pca import IterativeQuantization

    X = dask_rows(args.seed, args.n, args.chunk)
    Q = queries(args.seed, args.queries)
    hasher = IterativeQuantization(n_bits=64, random_state=0)

    cluster = distributed.LocalCluster(
        n_workers=2,
        threads_per_worker=args.threads,
        processes=True,
        memory_limit=0,
        dashboard_address=None,
    )
    client = distributed.Client(cluster)
    try:
        index = ShardedIndex(client, n_bits=64, n_shards=2)
        searcher = Searcher(hasher, index, rerank="euclidean", n_candidates=args.candidates)
        t0 = time.perf_counter()
        searcher.fit(_rows(args.seed, 0, min(args.train, args.n)))  # + attaches the refiner
        fit_s = time.perf_counter() - t0
        t0 = time.perf_counter()
        index.add(None, vectors=X)
        build_s = time.perf_counter() - t0
        qps, (D_sh, I_sh) = best_qps(lambda: searcher.search(Q, K), len(Q), args.repeats)
        workers_mib = sorted(client.run(peak_rss_mib).values())
        client_mib = peak_rss_mib()
        truth = exact_knn(X, Q)
    finally:
        client.close()
        cluster.close()

    ctx = multiprocessing.get_context("spawn")
    recv, send = ctx.Pipe(duplex=False)
    proc = ctx.Process(target=one_process, args=(args, hasher, Q, send))
    proc.start()
    local = recv.recv()
    proc.join()

    same = bool(np.array_equal(I_sh, local["I"]) and np.array_equal(D_sh, local["D"]))
    rows = [
        [
            "sharded, 2 workers",
            f"{build_s:.1f}",
            f"client {client_mib:.0f}; workers {workers_mib[0]:.0f}, {workers_mib[1]:.0f}",
            f"{qps:.0f}",
            f"{recall(I_sh, truth):.3f}",
        ],
        [
            "one process",
            f"{local['build_s']:.1f}",
            f"{local['peak_mib']:.0f}",
            f"{local['qps']:.0f}",
            f"{recall(local['I'], truth):.3f}",
        ],
    ]
    header = ["searcher", "build s", "peak RSS MiB", "QPS", "recall@10"]
    print(
        f"n={args.n} d={D_DIM} float32, ITQ 64 bits (fit {fit_s:.1f} s on {args.train} rows), "
        f"{args.candidates} candidates, k={K}, {args.queries} queries, "
        f"{args.threads} thread(s) per worker; same ids and distances: {same}"
    )
    print(f"{machine()}; load {load_average()}")
    print(markdown_table(header, rows))
    if args.json:
        numbers = {
            "n": args.n,
            "sharded": {"build_s": build_s, "qps": qps, "client_mib": client_mib},
            "workers_mib": workers_mib,
            "one_process": {k: local[k] for k in ("build_s", "qps", "peak_mib")},
            "recall_sharded": recall(I_sh, truth),
            "recall_one_process": recall(local["I"], truth),
            "same_results": same,
        }
        args.json.write_text(json.dumps(numbers, indent=2))


if __name__ == "__main__":
    main()
