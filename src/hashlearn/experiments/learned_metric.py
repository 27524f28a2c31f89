"""``hashlearn reproduce learned-metric``: Jain, Kulis & Grauman's Fig. 1 / Fig. 2 protocol.

Dense case (Fig. 1) on digits (64-d) and Fashion-MNIST (PCA to 32-d): per random partition,
30 queries per class are held out, the rest is the database; ITML learns a metric from
constraints among 20 labelled database examples per class (``gamma`` and the thresholds
chosen by cross-validation on those examples only). k = 4 nearest-neighbour accuracy for
(Euclidean, linear scan), (Euclidean, LSH), (learned, linear scan), (learned, LSH) against
the number of bits b, with hashing by eq. 6 and Charikar's sorted-permutation search
(epsilon = 1.5, candidates re-ranked by the metric); the percentage of the database searched
per query; the speed-up of hashed search (encoding + permutation search + re-ranking) over
an exhaustive scan under the learned metric, both in batches of queries.

Sparse case (Fig. 2): Fashion-MNIST images as bags of quantised patches (4x4 patches at
stride 2 binarised at mid-grey: 2^16 patch words, ~100 non-zeros per image), learned by
kernelized ITML and hashed by the implicit form (eq. 8).
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA
from sklearn.utils import check_random_state

from hashlearn.codes import pack_bits
from hashlearn.experiments._common import (
    available_real,
    load_real,
    markdown_table,
    split_queries,
    write_json,
)
from hashlearn.hashers.metric_lsh import KernelMetricLSH, MetricLSH, hashed_projection
from hashlearn.index.permutation import PermutationIndex
from hashlearn.metric.itml import ITML
from hashlearn.plots import atomic_path

K_NN = 4
EPSILON = 1.5


def vote(neighbor_labels: np.ndarray) -> np.ndarray:
    """Majority vote per row (neighbours nearest first; -1 = missing); ties go to the class
    of the nearest voter among the tied ones."""
    out = np.full(len(neighbor_labels), -1, np.int64)
    for row, labels in enumerate(neighbor_labels):
        labels = labels[labels >= 0]
        if not len(labels):
            continue
        values, first, counts = np.unique(labels, return_index=True, return_counts=True)
        best = counts == counts.max()
        out[row] = values[best][np.argmin(first[best])]
    return out


def exhaustive_knn(Z_db: np.ndarray, Z_q: np.ndarray, k: int) -> np.ndarray:
    """Exact k nearest rows of Z_db (Euclidean in the transformed space; ties by index)."""
    out = np.empty((len(Z_q), k), np.int64)
    db_sq = np.einsum("ij,ij->i", Z_db, Z_db)
    for start in range(0, len(Z_q), 256):
        q = Z_q[start : start + 256]
        d = db_sq[None, :] - 2 * q @ Z_db.T
        part = (
            np.argpartition(d, k, axis=1)[:, : k + 1]
            if d.shape[1] > k + 1
            else np.tile(np.arange(d.shape[1]), (len(q), 1))
        )
        rows = np.arange(len(q))[:, None]
        order = np.lexsort((part, d[rows, part]), axis=1)[:, :k]
        out[start : start + 256] = part[rows, order]
    return out


def hashed_knn(Z_db, Z_q, codes_db, codes_q, n_bits, k, seed, window):
    """Permutation-index candidates re-ranked by distance in Z; returns (ids, n_candidates)."""
    index = PermutationIndex(n_bits, epsilon=EPSILON, window=window, random_state=seed)
    index.add(codes_db)
    cands, n_examined = index.candidates(codes_q, return_counts=True)
    out = np.full((len(Z_q), k), -1, np.int64)
    for row, c in enumerate(cands):
        d = np.einsum("ij,ij->i", Z_db[c] - Z_q[row], Z_db[c] - Z_q[row])
        order = np.lexsort((c, d))[:k]
        out[row, : len(order)] = c[order]
    return out, n_examined


def _dense_case(name, X, y, bits, n_runs, seed, window, progress):
    rows = []
    timing = None
    for run in range(n_runs):
        rng = check_random_state(seed + run)
        db, q = split_queries(len(X), 30, rng, y=y, per_class=True)
        Xdb, Xq, ydb, yq = X[db], X[q], y[db], y[q]
        if X.shape[1] > 50:
            pca = PCA(32, random_state=seed + run).fit(
                Xdb[rng.choice(len(Xdb), min(10000, len(Xdb)), replace=False)]
            )
            Xdb, Xq = pca.transform(Xdb), pca.transform(Xq)
        lab = np.concatenate(
            [rng.permutation(np.flatnonzero(ydb == c))[:20] for c in np.unique(ydb)]
        )
        itml = ITML(random_state=seed + run).fit(Xdb[lab], ydb[lab])
        metrics = {"euclidean": np.eye(Xdb.shape[1]), "learned": itml.A_}
        mean = Xdb.mean(axis=0)
        for metric, A in metrics.items():
            hasher0 = MetricLSH.from_metric(A, n_bits=8)
            Zdb, Zq = (Xdb - mean) @ hasher0.G_.T, (Xq - mean) @ hasher0.G_.T
            acc_scan = float(np.mean(vote(ydb[exhaustive_knn(Zdb, Zq, K_NN)]) == yq))
            rows.append(
                {
                    "dataset": name,
                    "run": run,
                    "metric": metric,
                    "search": "linear scan",
                    "bits": 0,
                    "accuracy": acc_scan,
                    "searched": 1.0,
                    "gamma": itml.gamma_,
                    "learned": itml.learned_,
                    "itml_iter": itml.n_iter_,
                    "violated": itml.violated_fraction_,
                }
            )
            for b in bits:
                h = MetricLSH.from_metric(A, n_bits=b, mean=mean, random_state=seed + run)
                ids, n_c = hashed_knn(
                    Zdb, Zq, h.encode(Xdb), h.encode(Xq), b, K_NN, seed + run, window
                )
                labels = np.where(ids >= 0, ydb[np.maximum(ids, 0)], -1)
                rows.append(
                    {
                        "dataset": name,
                        "run": run,
                        "metric": metric,
                        "search": "LSH",
                        "bits": b,
                        "accuracy": float(np.mean(vote(labels) == yq)),
                        "searched": float(n_c.mean() / len(Xdb)),
                    }
                )
        if run == 0:
            timing = _timing(Xdb, Xq, itml, max(bits), seed, window)
        if progress is not None:
            progress(1)
    return rows, timing


def _timing(Xdb, Xq, itml, b, seed, window, repeats=5):
    """Median batch time: exhaustive learned-metric scan vs hashing + permutation search +
    re-ranking (database encoded and indexed beforehand in both)."""
    G = itml.G_
    Zdb = Xdb @ G.T
    h = MetricLSH.from_metric(itml.A_, n_bits=b, mean=Xdb.mean(axis=0), random_state=seed)
    index = PermutationIndex(b, epsilon=EPSILON, window=window, random_state=seed)
    index.add(h.encode(Xdb))
    index.candidates(h.encode(Xq[:2]))  # build the sorted orders and compile
    _, n_examined = index.candidates(h.encode(Xq), return_counts=True)

    def scan():
        return exhaustive_knn(Zdb, Xq @ G.T, K_NN)

    def hashed():
        Zq = Xq @ G.T
        cands = index.candidates(h.encode(Xq))
        for row, c in enumerate(cands):
            d = np.einsum("ij,ij->i", Zdb[c] - Zq[row], Zdb[c] - Zq[row])
            np.lexsort((c, d))[:K_NN]

    times = {"scan": [], "hashed": []}
    for _ in range(repeats):  # interleaved repetitions
        for key, fn in (("scan", scan), ("hashed", hashed)):
            t = time.perf_counter()
            fn()
            times[key].append(time.perf_counter() - t)
    med = {k: float(np.median(v)) for k, v in times.items()}
    return {
        "n_db": len(Xdb),
        "n_queries": len(Xq),
        "bits": b,
        "n_orders": index.n_orders,
        "scan_s": med["scan"],
        "hashed_s": med["hashed"],
        "speedup": med["scan"] / med["hashed"],
        "searched": float(n_examined.mean() / len(Xdb)),
    }


def bag_of_patches(images: np.ndarray) -> sp.csr_matrix:
    """28x28 images -> L2-normalised histograms over 2^16 binarised 4x4 patch words."""
    imgs = images.reshape(-1, 28, 28) >= 128
    weights = (1 << np.arange(16)).reshape(4, 4)
    words = []
    for r in range(0, 25, 2):
        for c in range(0, 25, 2):
            words.append((imgs[:, r : r + 4, c : c + 4] * weights).sum(axis=(1, 2)))
    words = np.stack(words, axis=1)
    n = len(images)
    rows = np.repeat(np.arange(n), words.shape[1])
    X = sp.csr_matrix((np.ones(rows.size), (rows, words.ravel())), shape=(n, 1 << 16))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ X)


def _sparse_case(X, y, bits, n_runs, seed, n_db, window, progress):
    rows = []
    for run in range(n_runs):
        rng = check_random_state(1000 + seed + run)
        keep = rng.choice(len(X), n_db, replace=False)
        Xs, ys = bag_of_patches(X[keep]), y[keep]
        db, q = split_queries(len(ys), 30, rng, y=ys, per_class=True)
        Xdb, Xq, ydb, yq = Xs[db], Xs[q], ys[db], ys[q]
        lab = np.concatenate(
            [rng.permutation(np.flatnonzero(ydb == c))[:20] for c in np.unique(ydb)]
        )
        for b in bits:
            kml = KernelMetricLSH(b, random_state=seed + run).fit(Xdb[lab], ydb[lab])
            Phi = kml._phi()
            M = kml.S_ + kml.S_.T + kml.S_.T @ kml.K0_ @ kml.S_
            Tdb, Tq = np.asarray((Xdb @ Phi.T).todense()), np.asarray((Xq @ Phi.T).todense())
            sq_db = np.asarray(Xdb.multiply(Xdb).sum(axis=1)).ravel()
            sq_q = np.asarray(Xq.multiply(Xq).sum(axis=1)).ravel()
            dots = np.asarray((Xq @ Xdb.T).todense())
            eucl = sq_q[:, None] + sq_db[None, :] - 2 * dots
            for metric in ("euclidean", "learned"):
                if metric == "learned":
                    codes_db, codes_q = kml.encode(Xdb), kml.encode(Xq)
                    TqM, TdbM = Tq @ M, Tdb @ M
                    dist = (
                        eucl
                        + np.einsum("ij,ij->i", TqM, Tq)[:, None]
                        + np.einsum("ij,ij->i", TdbM, Tdb)[None, :]
                        - 2 * TqM @ Tdb.T
                    )
                else:
                    codes_db = pack_bits(hashed_projection(Xdb, b, kml.seed_) >= 0)
                    codes_q = pack_bits(hashed_projection(Xq, b, kml.seed_) >= 0)
                    dist = eucl
                order = np.lexsort(
                    (np.broadcast_to(np.arange(dist.shape[1]), dist.shape), dist), axis=1
                )[:, :K_NN]
                acc_scan = float(np.mean(vote(ydb[order]) == yq))
                index = PermutationIndex(b, epsilon=EPSILON, window=window, random_state=seed + run)
                index.add(codes_db)
                ids = np.full((len(yq), K_NN), -1, np.int64)
                cands, n_examined = index.candidates(codes_q, return_counts=True)
                for row, c in enumerate(cands):
                    o = np.lexsort((c, dist[row, c]))[:K_NN]
                    ids[row, : len(o)] = c[o]
                labels = np.where(ids >= 0, ydb[np.maximum(ids, 0)], -1)
                rows.append(
                    {
                        "dataset": "fashion-mnist bag of patches",
                        "run": run,
                        "metric": metric,
                        "bits": b,
                        "accuracy_scan": acc_scan,
                        "accuracy_lsh": float(np.mean(vote(labels) == yq)),
                        "searched": float(n_examined.mean() / len(ydb)),
                        "dims": Xs.shape[1],
                        "nnz_per_item": Xs.nnz / Xs.shape[0],
                    }
                )
        if progress is not None:
            progress(1)
    return rows


def _summary(rows, keys, values):
    groups: dict = {}
    for r in rows:
        groups.setdefault(tuple(r[k] for k in keys), []).append(r)
    out = []
    for key, rs in groups.items():
        out.append(
            list(key)
            + [float(np.mean([r[v] for r in rs])) for v in values]
            + [float(np.std([r[values[0]] for r in rs]))]
        )
    return out


def _plot(summary, path: Path, name: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, (ax1, ax2) = plt.subplots(1, 2, figsize=(10, 4))
    for metric in ("euclidean", "learned"):
        scan = [r for r in summary if r[0] == name and r[1] == metric and r[2] == "linear scan"]
        lsh = sorted(
            [r for r in summary if r[0] == name and r[1] == metric and r[2] == "LSH"],
            key=lambda r: r[3],
        )
        b = [r[3] for r in lsh]
        ax1.plot(b, [r[4] for r in lsh], marker="o", label=f"{metric}, LSH")
        if scan:
            ax1.axhline(
                scan[0][4],
                ls="--",
                color="C0" if metric == "euclidean" else "C1",
                label=f"{metric}, linear scan",
            )
        ax2.plot(b, [100 * r[5] for r in lsh], marker="o", label=metric)
    ax1.set(xlabel="bits b", ylabel=f"{K_NN}-NN accuracy", title=name)
    ax2.set(xlabel="bits b", ylabel="% of database searched", title=name)
    ax1.legend()
    ax2.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=100)
    plt.close(fig)


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    data_dir=None,
    progress=None,
    window: int | None = None,
    n_runs: int | None = None,
    bits: list[int] | None = None,
) -> str:
    """Run the protocol and return the markdown report (tables, plots and JSON in out_dir)."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    n_runs = n_runs or (2 if quick else 10)
    bits = bits or ([8, 16, 32] if quick else [8, 12, 16, 24, 32, 48, 64])
    window = window if window is not None else 8
    rows, timings = [], {}
    for name in available_real(data_dir):
        X, y = load_real(name, data_dir)
        X = X.astype(np.float64)
        if quick and name == "fashion-mnist":
            keep = check_random_state(seed).choice(len(X), 10000, replace=False)
            X, y = X[keep], y[keep]
        elif name == "fashion-mnist":
            X, y = X[: 60000 + 300], y[: 60000 + 300]  # database ~60k after holding out queries
        r, timing = _dense_case(name, X, y, bits, n_runs, seed, window, progress)
        rows += r
        timings[name] = timing
    sparse_rows = []
    if "fashion-mnist" in available_real(data_dir):
        X, y = load_real("fashion-mnist", data_dir)
        sparse_rows = _sparse_case(
            X,
            y,
            [16, 32] if quick else [16, 32, 64],
            1 if quick else min(3, n_runs),
            seed,
            2000 if quick else 5000,
            window,
            progress,
        )
    summary = _summary(rows, ("dataset", "metric", "search", "bits"), ("accuracy", "searched"))
    summary.sort(key=lambda r: (r[0], r[1], r[2] != "linear scan", r[3]))
    for name in timings:
        _plot(summary, out_dir / f"learned_metric_{name}.png", name)
    write_json(
        out_dir / "learned_metric.json",
        {
            "rows": rows,
            "timing": timings,
            "sparse": sparse_rows,
            "window": window,
            "n_runs": n_runs,
            "quick": quick,
        },
    )
    md = [
        f"## learned-metric (Jain, Kulis & Grauman, Fig. 1-2){' [quick]' if quick else ''}",
        "",
        f"{n_runs} random partitions (30 queries/class held out; ITML constraints among 20 "
        f"labelled database items/class, gamma and thresholds chosen by 3-fold CV on those "
        f"items); {K_NN}-NN accuracy; LSH = eq. 6 codes + sorted permutations "
        f"(eps={EPSILON}, Charikar's scan examining 2 x {window} x M entries per query), "
        "candidates re-ranked "
        "by the metric. Fashion-MNIST: PCA to 32-d; digits: raw 64-d.",
        "",
        markdown_table(
            ["dataset", "metric", "search", "bits", "accuracy", "searched", "acc std"],
            [[*r[:3], r[3] or "-", *r[4:]] for r in summary],
        ),
        "",
    ]
    if timings:
        md += [
            "Speed (batch of all queries, median of 5 interleaved runs; shared machine):",
            "",
            markdown_table(
                [
                    "dataset",
                    "n_db",
                    "queries",
                    "bits",
                    "orders M",
                    "scan s",
                    "hashed s",
                    "speedup",
                    "searched",
                ],
                [
                    [
                        k,
                        t["n_db"],
                        t["n_queries"],
                        t["bits"],
                        t["n_orders"],
                        t["scan_s"],
                        t["hashed_s"],
                        t["speedup"],
                        t["searched"],
                    ]
                    for k, t in timings.items()
                ],
            ),
            "",
        ]
    if sparse_rows:
        ss = _summary(
            sparse_rows, ("metric", "bits"), ("accuracy_scan", "accuracy_lsh", "searched")
        )
        md += [
            f"Sparse case (Fig. 2): Fashion-MNIST as bags of binarised 4x4 patches "
            f"({sparse_rows[0]['dims']} dims, {sparse_rows[0]['nnz_per_item']:.0f} "
            "non-zeros/item), kernelized ITML + implicit hashing (eq. 8):",
            "",
            markdown_table(["metric", "bits", "acc scan", "acc LSH", "searched", "std"], ss),
            "",
        ]
    md += [f"Plots: learned_metric_<dataset>.png in {out_dir}."]
    report = "\n".join(md)
    (out_dir / "learned_metric.md").write_text(report)
    return report
