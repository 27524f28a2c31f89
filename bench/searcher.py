"""Searcher end to end (issue 14, item 6): the whole pipeline against its index alone, and
learned-metric hashed search against the exhaustive learned-metric scan.

Data: Fashion-MNIST, the 60k training images as the database, test images as queries.
Everything runs on ONE thread (BLAS, numba, hashlearn's pool), timing interleaved (each
repetition times every contender once, in turn); CPU time beside wall time; ratios are
medians of the per-repetition ratios.

Table 1 -- end to end vs the index alone. ``Searcher.search(X, k=10)`` (encode the queries,
the index's ``n_candidates`` Hamming neighbours, exact re-ranking of those by the metric on
the original vectors, top 10) against ``index.search(codes, n_candidates)`` on pre-encoded
codes (the same index, the same candidates). Dense: the 784 float32 pixels, random-
hyperplane LSH at 64 bits, ``FlatIndex``, Euclidean re-ranking. Sparse: the images as bags of
binarised 4x4 patches (65536-d L2-normalised CSR histograms, as in Jain, Kulis & Grauman's
Fig. 2), Gaussian random hyperplanes at 64 bits, Euclidean re-ranking over CSR. The target
is ``index / end-to-end >= 0.67`` (end to end within 1.5x of the index alone). The searcher
screens its candidates by default (an 8-bit copy of dense vectors; for CSR vectors a
bucket-norm sketch, ``hashlearn.rerank._sketch``); the last two columns time the same searcher with
the screen switched off.

Table 2 -- the learned metric (Jain, Kulis & Grauman, "Fast Image Search for Learned
Metrics", CVPR 2008, Sec. 3-4, Fig. 1's protocol scaled to the 60k database): the images
reduced to 32-d by PCA (fitted on 10k training images), ITML learned from 20 labelled
database images per class, hashed by eq. 6 (``MetricLSH`` at 64 bits), candidates re-ranked
by the learned metric (``Searcher(rerank="metric")``), k = 4 nearest-neighbour vote. Two
hashed searches: Charikar's sorted-permutation search with eps = 1.5 as in the paper
(``PermutationIndex`` defaults: ``M = n^(1/(1+eps))`` orders, ``2M`` entries examined), and
the Hamming scan's nearest 100 (``FlatIndex``). The exhaustive scan is what a user would
write: the database mapped by ``G`` once (``x -> G x``, float32, faster here than float64),
then per batch of 32 queries (the fastest of 1-512 here) one BLAS product ``|Gx|^2 -
2 (Gq)^T (Gx)`` and an ``argpartition``; also timed one query at a time. Its accuracy is
that of the same scan in float64. Targets: hashed >= 5x faster than the scan, accuracy
within 1 point.

Run (about 2-4 minutes on 2 cores)::

    python bench/searcher.py [--queries 2000] [--repeats 5] [--out bench/out/searcher]

Writes ``searcher.md`` (both tables, machine, load averages) and ``searcher.json``.
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread everywhere, before numpy / numba load

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402
from sklearn.decomposition import PCA  # noqa: E402

import hashlearn  # noqa: E402
from _common import (  # noqa: E402
    interleaved_wall_and_cpu,
    load_average,
    machine,
    markdown_table,
    write_section,
)
from hashlearn._utils.vote import majority_vote  # noqa: E402
from hashlearn.datasets import load_fashion_mnist  # noqa: E402
from hashlearn.experiments.learned_metric import bag_of_patches  # noqa: E402
from hashlearn.hashers import MetricLSH, RandomHyperplaneLSH  # noqa: E402
from hashlearn.index import FlatIndex  # noqa: E402
from hashlearn.index.permutation import PermutationIndex  # noqa: E402
from hashlearn.metric import ITML  # noqa: E402
from hashlearn.search import Searcher  # noqa: E402

K = 10
K_NN = 4
BITS = 64
CANDIDATES = (100, 1000)


def _ms(seconds: np.ndarray, m: int) -> float:
    return float(np.median(seconds)) / m * 1e3


# ------------------------------------------------------------------- table 1: end to end


def tiled(X: np.ndarray, n: int, seed: int = 0) -> np.ndarray:
    """``n`` rows: the rows of ``X`` repeated, each copy with Gaussian noise of 2 % of the
    pixels' standard deviation (float32, made in chunks), for a database of realistic size."""
    if n <= len(X):
        return X[:n]
    rng = np.random.default_rng(seed)
    scale = np.float32(0.02 * float(X.std()))
    out = np.empty((n, X.shape[1]), np.float32)
    for start in range(0, n, 100_000):
        stop = min(n, start + 100_000)
        noise = rng.standard_normal((stop - start, X.shape[1]), dtype=np.float32)
        out[start:stop] = X[np.arange(start, stop) % len(X)] + noise * scale
    return out


def unscreened_search(searcher: Searcher, X: np.ndarray):
    """``searcher.search`` with its refine stage's screen switched off for the call (same
    index, same vectors: the screen is the refiner's, read at each refine)."""
    searcher.refiner.screen = False
    try:
        return searcher.search(X, K, n_threads=1)
    finally:
        searcher.refiner.screen = True


def end_to_end_rows(X_db, X_q, sparse: bool, repeats: int) -> list[dict]:
    """Index alone vs Searcher.search, per number of candidates."""
    hasher = (
        RandomHyperplaneLSH(BITS, directions="gaussian", random_state=0)
        if sparse
        else RandomHyperplaneLSH(BITS, random_state=0)
    )
    rows = []
    for n_cand in CANDIDATES:
        searcher = Searcher(hasher, FlatIndex(BITS), rerank="euclidean", n_candidates=n_cand)
        searcher.fit(X_db[:10000]).add(X_db)
        codes = searcher.hasher.encode(X_q)
        m = X_q.shape[0]
        wall, cpu = interleaved_wall_and_cpu(
            [
                lambda s=searcher, c=codes, n=n_cand: s.index.search(c, n, n_threads=1),
                lambda s=searcher: s.search(X_q, K, n_threads=1),
                lambda s=searcher: s.hasher.encode(X_q),
                lambda s=searcher: unscreened_search(s, X_q),
            ],
            repeats,
        )
        rows.append(
            dict(
                data="sparse (CSR bag of patches)" if sparse else "dense (784 float32)",
                n_db=X_db.shape[0],
                n_candidates=n_cand,
                index_ms=_ms(cpu[:, 0], m),
                end_to_end_ms=_ms(cpu[:, 1], m),
                encode_ms=_ms(cpu[:, 2], m),
                unscreened_ms=_ms(cpu[:, 3], m),
                ratio_cpu_unscreened=float(np.median(cpu[:, 0] / cpu[:, 3])),
                ratio_cpu=float(np.median(cpu[:, 0] / cpu[:, 1])),
                ratio_wall=float(np.median(wall[:, 0] / wall[:, 1])),
                qps_end_to_end=float(m / np.median(wall[:, 1])),
            )
        )
        print(rows[-1], flush=True)
    return rows


# ---------------------------------------------------------------- table 2: learned metric


def _labelled_rows(y, per_class: int, rng) -> np.ndarray:
    return np.concatenate(
        [rng.choice(np.flatnonzero(y == c), per_class, replace=False) for c in np.unique(y)]
    )


def exhaustive_scan(T_db, sq_db, T_q, k: int, batch: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact learned-metric k-NN over mapped vectors: per batch of queries one BLAS product
    ``|t|^2 - 2 t_q . t`` (the ``|t_q|^2`` term does not change the order) and an
    argpartition, then the k sorted by (distance, id)."""
    m = T_q.shape[0]
    D = np.empty((m, k))
    I_ = np.empty((m, k), np.int64)
    for start in range(0, m, batch):
        stop = min(m, start + batch)
        dist = sq_db[None, :] - 2.0 * (T_q[start:stop] @ T_db.T)
        part = np.argpartition(dist, k, axis=1)[:, :k]
        d = np.take_along_axis(dist, part, 1)
        order = np.lexsort((part, d), axis=1)
        I_[start:stop] = np.take_along_axis(part, order, 1)
        D[start:stop] = np.take_along_axis(d, order, 1) + (T_q[start:stop] ** 2).sum(1)[:, None]
    return D, I_


def knn_accuracy(I_, D, y_db, y_q) -> float:
    voters = np.where(I_ >= 0, y_db[np.maximum(I_, 0)], -1)
    pred = majority_vote(voters, D, int(y_db.max()) + 1)
    return float(np.mean(pred == y_q))


def learned_metric_rows(X_db, y_db, X_q, y_q, repeats: int, seed: int = 0) -> list[dict]:
    """Hashed searches (Charikar's permutations as in the paper; the Hamming scan's top 100)
    and the exhaustive scans, interleaved; CPU ms/query, speed-ups, 4-NN accuracy."""
    rng = np.random.RandomState(seed)
    sample = rng.choice(len(X_db), 10000, replace=False)
    pca = PCA(32, random_state=seed).fit(X_db[sample])
    P_db, P_q = pca.transform(X_db), pca.transform(X_q)
    labelled = _labelled_rows(y_db, 20, rng)
    itml = ITML(slack="auto", random_state=seed).fit(P_db[labelled], y_db[labelled])
    hasher = MetricLSH.from_metric(itml, n_bits=BITS, random_state=seed)
    permutations = PermutationIndex(BITS, epsilon=1.5, random_state=seed)
    hashed = {
        "hashed: Charikar's permutations (eps = 1.5, 2M examined)": Searcher(
            hasher, permutations, rerank="metric"
        ).add(P_db),
        "hashed: Hamming scan, top 100 re-ranked": Searcher(
            hasher, FlatIndex(BITS), rerank="metric", n_candidates=100
        ).add(P_db),
    }
    # the scan as a user would write it: the database mapped once, float32 (the faster of
    # float32 / float64 here), batches of 32 queries (the fastest of 1-512 here)
    T_db = itml.transform(P_db).astype(np.float32)
    sq_db = (T_db**2).sum(1)
    m = len(P_q)
    for searcher in hashed.values():
        searcher.search(P_q[:10], K_NN)  # sorted orders / mapped vectors built untimed

    def scan_batched():
        return exhaustive_scan(T_db, sq_db, itml.transform(P_q).astype(np.float32), K_NN, 32)

    def scan_per_query():
        T_q = itml.transform(P_q).astype(np.float32)
        for i in range(m):
            exhaustive_scan(T_db, sq_db, T_q[i : i + 1], K_NN, batch=1)

    contenders = [scan_batched, scan_per_query]
    contenders += [lambda s=s: s.search(P_q, K_NN, n_threads=1) for s in hashed.values()]
    wall, cpu = interleaved_wall_and_cpu(contenders, repeats)
    # accuracy of the exact scan in float64 (the float32 one times the same work)
    T64 = itml.transform(P_db)
    exact = exhaustive_scan(T64, (T64**2).sum(1), itml.transform(P_q), K_NN, 32)
    acc_scan = knn_accuracy(exact[1], exact[0], y_db, y_q)
    _, counts = permutations.candidates(hasher.encode(P_q), return_counts=True)
    searched = [float(np.mean(counts) / len(P_db) * 100), 100 * 100 / len(P_db)]
    names = ["exhaustive scan, batches of 32", "exhaustive scan, one query at a time"]
    rows = []
    for col, name in enumerate(names + list(hashed)):
        if col < 2:
            acc, pct = acc_scan, 100.0
        else:
            D, I_ = hashed[name].search(P_q, K_NN, n_threads=1)
            acc, pct = knn_accuracy(I_, D, y_db, y_q), searched[col - 2]
        rows.append(
            dict(
                method=name,
                ms=_ms(cpu[:, col], m),
                speedup_cpu=float(np.median(cpu[:, 0] / cpu[:, col])),
                speedup_wall=float(np.median(wall[:, 0] / wall[:, col])),
                speedup_per_query_cpu=float(np.median(cpu[:, 1] / cpu[:, col])),
                searched_pct=pct,
                accuracy=acc,
                n_db=len(P_db),
                n_queries=m,
                permutations=permutations.n_orders,
                slack=float(itml.slack_),
            )
        )
        print(rows[-1], flush=True)
    return rows


# ----------------------------------------------------------------------------------- main


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--data", type=Path, default=None, help="Fashion-MNIST directory")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "searcher")
    parser.add_argument(
        "--dense-sizes",
        type=int,
        nargs="+",
        default=[60_000, 1_000_000],
        help="database sizes of the dense end-to-end rows (beyond 60k: noisy copies)",
    )
    parser.add_argument("--no-write", action="store_true", help="leave docs/results.md alone")
    args = parser.parse_args()
    hashlearn.set_num_threads(1)
    X_db, y_db = load_fashion_mnist(args.data, subset="train")
    X_q, y_q = load_fashion_mnist(args.data, subset="test")
    X_q, y_q = X_q[: args.queries], y_q[: args.queries]
    loads = {"start": load_average()}

    rows1 = []
    for size in args.dense_sizes:
        rows1 += end_to_end_rows(tiled(X_db, size), X_q, False, args.repeats)
    bag_db, bag_q = bag_of_patches(X_db), bag_of_patches(X_q)
    rows1 += end_to_end_rows(bag_db, bag_q, True, args.repeats)
    loads["after table 1"] = load_average()
    rows2 = learned_metric_rows(X_db, y_db, X_q, y_q, args.repeats)
    loads["after table 2"] = load_average()

    table1 = markdown_table(
        [
            "data",
            "database",
            "candidates",
            "index alone, CPU ms/query",
            "end to end, CPU ms/query",
            "of which encode",
            "index / end to end (CPU)",
            "(wall)",
            "without the screen: end to end, CPU ms/query",
            "index / end to end (CPU)",
        ],
        [
            [
                r["data"],
                f"{r['n_db']:,}",
                r["n_candidates"],
                r["index_ms"],
                r["end_to_end_ms"],
                r["encode_ms"],
                r["ratio_cpu"],
                r["ratio_wall"],
                r["unscreened_ms"],
                r["ratio_cpu_unscreened"],
            ]
            for r in rows1
        ],
    )
    table2 = markdown_table(
        [
            "method",
            "CPU ms/query",
            "speed-up vs batched scan (CPU)",
            "(wall)",
            "vs per-query scan (CPU)",
            "searched %",
            "4-NN accuracy",
        ],
        [
            [
                r["method"],
                r["ms"],
                r["speedup_cpu"],
                r["speedup_wall"],
                r["speedup_per_query_cpu"],
                r["searched_pct"],
                r["accuracy"],
            ]
            for r in rows2
        ],
    )
    r2 = rows2[0]
    md = "\n\n".join(
        [
            f"Machine: {machine()}; one thread; {len(X_q)} queries, k = {K} (table 1), "
            f"{args.repeats} interleaved repetitions; load average "
            + "; ".join(f"{k}: {v}" for k, v in loads.items())
            + ".",
            "**End to end vs the index alone** (Fashion-MNIST 60k train as the database; "
            "larger databases are noisy copies of it; "
            f"{BITS}-bit LSH codes, FlatIndex, Euclidean re-ranking; target index / end to "
            "end >= 0.67):",
            table1,
            f"**Learned metric** (PCA-32, ITML from 20 labelled images per class, MetricLSH "
            f"{BITS} bits; Charikar's search over {r2['permutations']} permutations; "
            f"{r2['n_db']} database images, {r2['n_queries']} test queries; targets: speed-up "
            ">= 5, accuracy within 1 point):",
            table2,
        ]
    )
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "searcher.md").write_text(md + "\n")
    if not args.no_write:
        title = (
            "## Searcher end to end and learned-metric hashed search (`bench/searcher.py`, "
            "issue 14 item 6)"
        )
        write_section("bench-searcher", f"{title}\n\n`python bench/searcher.py`. {md}")
    (args.out / "searcher.json").write_text(
        json.dumps({"end_to_end": rows1, "learned_metric": rows2, "load": loads}, indent=1)
    )
    print(md)


if __name__ == "__main__":
    main()
