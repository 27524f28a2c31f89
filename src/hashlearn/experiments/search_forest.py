"""Reproduce Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 (Fig. 1-2) on Fashion-MNIST: recall of the true
100-NN against the number of returned candidates, for the boosted search forest, k-means
trees and LSH tables with as many trees / tables, and spectral hashing with a linear Hamming
scan at matched bits (tree bits = depth x trees, the paper's accounting).

Protocol: the 60k training images are the database, queries come from the 10k test images;
PCA (fitted on a training sample) to ``n_dims`` dimensions is the representation and the
ground truth is the exact Euclidean 100-NN in it. Every bucketer is fitted on a random
sample of ``n_train`` database items; the forest's similar pairs are the
``100 * n_train / n_db`` nearest neighbours within that sample (the same neighbourhood
radius as the 100-NN in the database). Candidates of the tree / table methods come from
the inverted :class:`~hashlearn.index.table.TableIndex`, ordered by collision count (then
id), and are truncated at M; spectral hashing ranks the whole database by Hamming distance
(random tie order). Means over ``n_seeds`` seeds of the bucketers and training samples.

The timing table of the paper's Table 1 (inverted index vs exhaustive Hamming scan at
1M / 10M items) is ``bench/table_index.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from sklearn.decomposition import PCA

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import exact_knn, recall_at_m, recall_at_m_from_ids
from hashlearn.experiments._common import markdown_table, write_json
from hashlearn.forest.boosted import BoostedSearchForest
from hashlearn.forest.kmeans_tree import KMeansTree
from hashlearn.forest.lsh_tables import LSHTables
from hashlearn.index.table import TableIndex

__all__ = ["run"]

M_VALUES = (100, 200, 500, 1000, 2000, 5000)


def _settings(quick: bool) -> dict:
    if quick:
        return dict(
            n_db=10000,
            n_queries=200,
            n_train=3000,
            n_dims=32,
            n_trees=12,
            depths=(8, 6),
            n_pairs=20000,
            n_seeds=1,
            lam=0.1,
            sh_bits=(32, 56),
        )
    return dict(
        n_db=60000,
        n_queries=1000,
        n_train=10000,
        n_dims=64,
        n_trees=32,
        depths=(10, 8, 6),
        n_pairs=100000,
        n_seeds=3,
        lam=0.1,
        sh_bits=(32, 64, 128, 256),
    )


def _ranked_candidates(bucketer, db, queries, width):
    """Candidate lists (collision-count order, -1 padded to ``width``), their mean length,
    and the seconds to build the index and to probe all queries."""
    db_keys, q_keys = bucketer.keys(db), bucketer.keys(queries)
    index = TableIndex(bucketer.n_tables, bucketer=bucketer)
    t0 = time.perf_counter()
    index.add(db_keys)
    build = time.perf_counter() - t0
    t0 = time.perf_counter()
    lims, ids, _ = index.candidates_csr(q_keys)
    query = time.perf_counter() - t0
    ranked = np.full((len(queries), width), -1, np.int64)
    for q in range(len(queries)):
        c = ids[lims[q] : lims[q + 1]][:width]
        ranked[q, : len(c)] = c
    return ranked, float(np.diff(lims).mean()), build, query


def _recall_by_budget(per_depth, true_nn, m_values):
    """Recall@M from the deepest tree configuration whose mean candidate count reaches M
    (the shallowest if none does) -- a rule that looks at candidate counts, never at
    recall. ``per_depth`` lists ``(ranked, mean_count)`` from deepest to shallowest."""
    recall, used = [], []
    for m in m_values:
        j = next((j for j, (_, c) in enumerate(per_depth) if c >= m), len(per_depth) - 1)
        recall.append(recall_at_m_from_ids(per_depth[j][0], true_nn, [m])[0])
        used.append(j)
    return np.asarray(recall), used


def run(out_dir: Path, *, quick: bool = False, seed: int = 0, data_dir=None, progress=None) -> str:
    """Run the reproduction; returns the markdown report (tables + PNG in ``out_dir``)."""
    from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist
    from hashlearn.hashers.spectral import SpectralHashing  # written in parallel: lazy
    from hashlearn.plots import plot_recall_at_m

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = _settings(quick)
    rng = np.random.default_rng(seed)
    if fashion_mnist_available(data_dir):
        dataset, n_true = "Fashion-MNIST", 100
        X_train, _ = load_fashion_mnist(data_dir, subset="train")
        X_test, _ = load_fashion_mnist(data_dir, subset="test")
        scale = 255.0
    else:  # the embedded digits: a small stand-in, 20-NN, a tenth of the sizes
        dataset, n_true, scale = "digits (Fashion-MNIST not installed)", 20, 16.0
        X_all, _ = load_digits()
        split = np.random.default_rng(seed).permutation(len(X_all))
        X_train, X_test = X_all[split[300:]], X_all[split[:300]]
        cfg.update(
            n_db=len(X_train),
            n_queries=300,
            n_train=len(X_train),
            n_dims=min(cfg["n_dims"], 32),
            n_pairs=20000,
            depths=(6, 4),
        )
    db_rows = np.sort(rng.permutation(len(X_train))[: cfg["n_db"]])
    q_rows = np.sort(rng.permutation(len(X_test))[: cfg["n_queries"]])
    fit_rows = rng.permutation(len(db_rows))[: cfg["n_train"]]
    pca = PCA(cfg["n_dims"], random_state=seed).fit(X_train[db_rows[fit_rows]] / scale)
    db = pca.transform(X_train[db_rows] / scale).astype(np.float64)
    queries = pca.transform(X_test[q_rows] / scale).astype(np.float64)
    _, true_nn = exact_knn(db, queries, n_true)
    m_values = [m for m in M_VALUES if m <= len(db)] if n_true == 100 else [20, 50, 100, 200, 500]
    width = max(m_values)
    k_similar = max(1, round(n_true * cfg["n_train"] / len(db)))
    T, depths = cfg["n_trees"], cfg["depths"]

    methods = ("BSF", "k-means trees", "LSH tables")
    recalls = {name: [] for name in methods}
    per_depth_recall = {(name, D): [] for name in methods for D in depths}
    n_cands = {(name, D): [] for name in methods for D in depths}
    timings = {(name, D): [] for name in methods for D in depths}
    used_depth = {}
    sh_recalls = {b: [] for b in cfg["sh_bits"]}
    steps = cfg["n_seeds"] * (len(methods) * len(depths) + 1)
    bar = progress(total=steps, desc="search-forest") if progress else None
    for s in range(cfg["n_seeds"]):
        rs = seed * 1000 + s
        train = db[np.random.default_rng(rs).permutation(len(db))[: cfg["n_train"]]]
        for name in methods:
            lists = []
            for D in depths:
                bucketer = {
                    "BSF": lambda D=D, rs=rs: BoostedSearchForest(
                        n_trees=T,
                        max_depth=D,
                        lam=cfg["lam"],
                        n_pairs=cfg["n_pairs"],
                        k_similar=k_similar,
                        random_state=rs,
                    ),
                    "k-means trees": lambda D=D, rs=rs: KMeansTree(
                        n_trees=T, max_depth=D, random_state=rs
                    ),
                    "LSH tables": lambda D=D, rs=rs: LSHTables(T, D, random_state=rs),
                }[name]()
                t0 = time.perf_counter()
                bucketer.fit(train)
                fit_s = time.perf_counter() - t0
                ranked, mean_c, build_s, query_s = _ranked_candidates(bucketer, db, queries, width)
                lists.append((ranked, mean_c))
                per_depth_recall[name, D].append(recall_at_m_from_ids(ranked, true_nn, m_values))
                n_cands[name, D].append(mean_c)
                timings[name, D].append((fit_s, build_s, query_s))
                if bar:
                    bar.update(1)
            rec, used = _recall_by_budget(lists, true_nn, m_values)
            recalls[name].append(rec)
            used_depth[name] = [depths[j] for j in used]
        for bits in cfg["sh_bits"]:
            sh = SpectralHashing(bits).fit(train)
            dist = hamming_cdist(sh.encode(queries), sh.encode(db), bits)
            sh_recalls[bits].append(recall_at_m(dist, true_nn, m_values, random_state=rs))
        if bar:
            bar.update(1)
    if bar:
        bar.close()

    mean = {k: np.mean(v, axis=0) for k, v in recalls.items()}
    std = {k: np.std(v, axis=0) for k, v in recalls.items()}
    sh_mean = {b: np.mean(v, axis=0) for b, v in sh_recalls.items()}
    header = ["method", *[f"R@{m}" for m in m_values]]
    rows = [
        [name, *[f"{mu:.3f} ± {sd:.3f}" for mu, sd in zip(mean[name], std[name], strict=True)]]
        for name in methods
    ]
    rows.append(
        [
            "(tree depth used)",
            *[" / ".join(str(used_depth[n][j]) for n in methods) for j in range(len(m_values))],
        ]
    )
    rows += [
        [f"SH {b} bits (linear scan)", *[f"{v:.3f}" for v in sh_mean[b]]] for b in cfg["sh_bits"]
    ]
    d_rows = []
    for name in methods:
        for D in depths:
            r = np.mean(per_depth_recall[name, D], axis=0)
            t = np.median(np.asarray(timings[name, D]), axis=0)
            d_rows.append(
                [
                    name,
                    D,
                    T * D,
                    f"{np.mean(n_cands[name, D]):.0f}",
                    *[f"{v:.3f}" for v in r],
                    f"{t[0]:.1f}",
                    f"{t[1]:.2f}",
                    f"{t[2]:.3f}",
                ]
            )
    ms = np.array(m_values)
    check = {}
    for m in (500, 1000, 5000):
        if m in m_values:
            j = m_values.index(m)
            check[m] = bool(
                mean["BSF"][j] > mean["k-means trees"][j] and mean["BSF"][j] > mean["LSH tables"][j]
            )
    curves = {name: (ms, mean[name]) for name in methods}
    curves.update({f"SH {b} bits": (ms, sh_mean[b]) for b in cfg["sh_bits"]})
    plot_recall_at_m(
        curves,
        out_dir / "search_forest_recall.png",
        title=f"{dataset.split()[0]}: recall of {n_true}-NN ({T} trees / tables)",
    )
    write_json(
        out_dir / "search_forest.json",
        {
            "settings": cfg,
            "seed": seed,
            "k_similar": k_similar,
            "m_values": m_values,
            "recall": {k: np.asarray(v) for k, v in recalls.items()},
            "recall_per_depth": {
                f"{k[0]} depth {k[1]}": np.asarray(v) for k, v in per_depth_recall.items()
            },
            "mean_candidates": {f"{k[0]} depth {k[1]}": v for k, v in n_cands.items()},
            "timings_fit_build_query_s": {f"{k[0]} depth {k[1]}": v for k, v in timings.items()},
            "sh_recall": {str(b): np.asarray(v) for b, v in sh_recalls.items()},
            "bsf_beats_both": {str(k): v for k, v in check.items()},
        },
    )
    held = ", ".join(f"M={m}: {'yes' if ok else 'NO'}" for m, ok in check.items())
    report = [
        "## search-forest: learning to search (Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011)",
        "",
        f"{dataset}, database {len(db)} images, {len(queries)} held-out queries, "
        f"PCA to {cfg['n_dims']} dims; ground truth: exact Euclidean {n_true}-NN. "
        f"{T} trees / tables for every method, of depth (= bits per table) {depths}; "
        f"bucketers fitted on {cfg['n_train']} database items; BSF lam={cfg['lam']}, "
        f"{cfg['n_pairs']} pairs per tree, similar = {k_similar}-NN within the sample, "
        "projection splits. Candidates come from the inverted TableIndex ordered by "
        "collision count, truncated at M. For each M every method uses its deepest "
        "configuration whose mean candidate count reaches M (the shallowest if none does: "
        "a rule on candidate counts, never on recall). Spectral hashing ranks the whole "
        f"database by Hamming distance (random ties). Mean ± std over {cfg['n_seeds']} "
        f"seed(s){' (quick mode)' if quick else ''}.",
        "",
        markdown_table(header, rows),
        "",
        f"BSF recall above both k-means trees and LSH tables: {held}.",
        "",
        "Every configuration (mean over seeds; seconds are medians: fit on the sample, "
        "build the index over the database, probe all queries):",
        "",
        markdown_table(
            [
                "method",
                "depth",
                "bits",
                "mean candidates",
                *[f"R@{m}" for m in m_values],
                "fit s",
                "build s",
                "query s",
            ],
            d_rows,
        ),
        "",
        "![recall](search_forest_recall.png)",
    ]
    md = "\n".join(report) + "\n"
    (out_dir / "results.md").write_text(md)
    return md
