"""Reproduce Li et al., *Learning to Search Efficiently in High Dimensions*, NIPS 2011 (Fig. 2) on Fashion-MNIST.

The paper's figure: recall of the true 100 nearest neighbours against the size of the
candidate set, as trees are added. For one configuration (a method and a tree depth) the
candidates after ``t`` trees are the database items sharing a leaf with the query in at
least one of the first ``t`` trees (an inverted :class:`~hashlearn.index.table.TableIndex`);
each curve is one configuration, its points ``t = 1, 2, 4, ...``, so recall never falls as
the candidate set grows. Methods: the boosted search forest (BSF), k-means trees and LSH
tables with as many trees / tables, and spectral hashing ranking the whole database by
Hamming distance (recall of the first M items, random tie order) at several code lengths.

Protocol: the 60k training images are the database, queries come from the 10k test images;
PCA (fitted on a training sample) to ``n_dims`` dimensions is the representation and the
ground truth is the exact Euclidean 100-NN in it. Every bucketer is fitted on a random
sample of ``n_train`` database items; the forest's similar pairs are the
``100 * n_train / n_db`` nearest neighbours within that sample (the same neighbourhood
radius as the 100-NN in the database). Means over seeds of the bucketers and training
samples. The fit -> keys -> candidates loop is :func:`hashlearn.experiments.pipeline.run_specs`.
The paper's Table 1 timing (inverted index vs exhaustive Hamming scan) is
``bench/table_index.py``.
"""

from __future__ import annotations

from pathlib import Path
from typing import Any

import numpy as np
from sklearn.decomposition import PCA

from hashlearn.experiments._common import available_real, load_real, markdown_table, write_json
from hashlearn.experiments._stats import paired_t_interval
from hashlearn.experiments.pipeline import (
    BucketerSpec,
    MethodSpec,
    RunOptions,
    Split,
    candidate_recall_curve,
    claim,
    recall_at_m_curve,
    reproduction,
    rows_as_run,
    run_specs,
    write_claims,
)
from hashlearn.forest import BoostedSearchForest, KMeansTree, LSHTables
from hashlearn.index.table import TableIndex

__all__ = ["run", "settings", "specs", "recall_at_budget"]

PAPER = "Li et al. 2011 (boosted search forest)"
BUDGETS = (100, 200, 500, 1000, 2000, 5000)


FULL: dict[str, Any] = dict(n_db=60000, n_queries=1000, n_train=10000, n_dims=64, n_trees=32)
FULL.update(depths=(10, 8, 6), n_pairs=100000, seeds=5, lam=0.1, sh_bits=(32, 64, 128, 256))


def settings(quick: bool) -> dict:
    """Protocol sizes: the paper's scale in full mode (``FULL``), seconds-long ones in quick."""
    if not quick:
        return dict(FULL)
    small = dict(FULL, n_db=10000, n_queries=100, n_train=1000, n_dims=16, n_trees=8)
    return dict(small, depths=(6,), n_pairs=5000, seeds=2, sh_bits=(32,))


def specs(cfg: dict, k_similar: int) -> list[BucketerSpec]:
    """The three tree / table methods with ``n_trees`` trees each; depth set per run."""
    T, n = cfg["n_trees"], cfg["n_train"]
    bsf = {"n_trees": T, "lam": cfg["lam"], "n_pairs": cfg["n_pairs"], "k_similar": k_similar}
    return [
        BucketerSpec("BSF", BoostedSearchForest, bsf, n_train=n),
        BucketerSpec("k-means trees", KMeansTree, {"n_trees": T}, n_train=n),
        BucketerSpec("LSH tables", LSHTables, {"n_tables": T}, "bits_per_table", n_train=n),
    ]


def _split(cfg, seed, data_dir, X=None) -> tuple[str, int, Split]:
    rng = np.random.default_rng(seed)
    if X is not None:
        name, n_true = "your data", 100
        X = np.asarray(X, np.float64)
        order = rng.permutation(len(X))
        X_test, X_train = X[order[: cfg["n_queries"]]], X[order[cfg["n_queries"] :]]
    elif "fashion-mnist" in available_real(data_dir):
        name, n_true = "Fashion-MNIST", 100
        X, _ = load_real("fashion-mnist", data_dir)
        X_train, X_test = X[:60000] / 255.0, X[60000:] / 255.0
    else:  # digits: a small stand-in, 20-NN
        name, n_true = "digits (Fashion-MNIST not installed)", 20
        X, _ = load_real("digits", data_dir)
        order = rng.permutation(len(X))
        n_q = min(cfg["n_queries"], len(X) // 5)
        X_test, X_train = X[order[:n_q]] / 16.0, X[order[n_q:]] / 16.0
    db_rows = np.sort(rng.permutation(len(X_train))[: cfg["n_db"]])
    q_rows = np.sort(rng.permutation(len(X_test))[: cfg["n_queries"]])
    sample = db_rows[rng.permutation(len(db_rows))[: cfg["n_train"]]]
    pca = PCA(min(cfg["n_dims"], X_train.shape[1]), random_state=seed).fit(X_train[sample])
    split = Split(pca.transform(X_train[db_rows]), pca.transform(X_test[q_rows]))
    return name, n_true, split.with_euclidean_truth(n_true)


def recall_at_budget(sizes, recalls, budget: float) -> float:
    """Recall of a curve at candidate-set size ``budget``, linear in log size between its
    points; NaN outside the sizes the curve reaches."""
    sizes, recalls = np.asarray(sizes, float), np.asarray(recalls, float)
    if not len(sizes) or budget < sizes[0] or budget > sizes[-1]:
        return float("nan")
    return float(np.interp(np.log(budget), np.log(np.maximum(sizes, 1e-9)), recalls))


def _curves(records) -> dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]]:
    """``"method, depth D" -> (trees, mean candidates, recall)``, means over seeds."""
    out = {}
    for key in dict.fromkeys((r["method"], r["bits"]) for r in records):
        runs = [r for r in records if (r["method"], r["bits"]) == key]
        out[f"{key[0]}, depth {key[1]}"] = (
            runs[0]["trees"],
            np.mean([r["mean_candidates"] for r in runs], axis=0),
            np.mean([r["candidate_recall"] for r in runs], axis=0),
        )
    return out


RANK_AT = (10, 20, 50, 100, 200)


def ranking_recall(bsf, split: Split, truth: str, m_values=RANK_AT) -> dict[str, np.ndarray]:
    """Recall of the true neighbours among the first M candidates of a fitted boosted
    search forest, the candidates (items sharing a leaf in at least one tree) ranked two
    ways: by the learned selection function ``T(q, x) = sum_m c_m t_m(q, x)`` (eq. 8,
    :meth:`~hashlearn.forest.BoostedSearchForest.candidates`) and by the number of trees
    in which they collide (:meth:`~hashlearn.index.table.TableIndex.candidates_csr`).
    Both rank the same set; ties by id. ``{"T": recalls, "count": recalls}`` per M."""
    index = TableIndex(bsf.n_tables)
    index.add(bsf.keys(split.X_db))
    relevant = split.relevant(truth)
    n_true = np.maximum(relevant.sum(axis=1), 1)
    out = {}
    for how, (lims, ids, _) in {
        "T": bsf.candidates(index, split.X_q),
        "count": index.candidates_csr(bsf.keys(split.X_q)),
    }.items():
        hits = np.zeros((len(lims) - 1, len(m_values)))
        for q in range(len(lims) - 1):
            found = relevant[q, ids[lims[q] : lims[q + 1]]]
            for j, m in enumerate(m_values):
                hits[q, j] = found[:m].sum()
        out[how] = (hits / n_true[:, None]).mean(axis=0)
    return out


def _ranking_table(models, split, n_true, depths, seeds) -> tuple[str, dict]:
    """Recall among the first M candidates, T(q, x) against collision counts, paired over
    the seeds, for the BSF at every depth; with the share of its trees whose eq. 15 weight
    is <= 0 (clipped to 1e-3, so T ranks as the count where all are)."""
    rows, out = [], {}
    for depth in depths:
        fitted = [models[("BSF", depth, s)] for s in seeds]
        per_seed = [ranking_recall(bsf, split, "euclidean") for bsf in fitted]
        raw = np.concatenate([bsf.raw_tree_weights_ for bsf in fitted])
        share = f"{int(np.sum(raw <= 0))} / {raw.size}"
        for j, m in enumerate(RANK_AT):
            t = np.array([r["T"][j] for r in per_seed])
            c = np.array([r["count"][j] for r in per_seed])
            stat = paired_t_interval(t - c)
            ci = "none (n = 1)" if stat.n < 2 else f"[{stat.low:+.3f}, {stat.high:+.3f}]"
            rows.append(
                [depth, share, m, f"{t.mean():.3f}", f"{c.mean():.3f}", f"{stat.mean:+.3f}", ci]
            )
            out[f"{depth}/{m}"] = {"T": t.tolist(), "count": c.tolist()}
        out[f"{depth}/raw_tree_weights"] = raw.tolist()
    md = "\n".join(
        [
            f"Ranking the candidates (BSF): recall of the true {n_true}-NN among the first M "
            "candidates ranked by the learned selection function T(q, x) (eq. 8, tree "
            "weights c_m) or by the number of trees in which they collide, means over "
            f"{len(seeds)} seeds; difference T - count with its 95% paired t interval. "
            "'c <= 0': the trees whose eq. 15 weight is not positive (kept at weight 1e-3, a "
            "deviation: see `BoostedSearchForest`'s docstring); where all are, T ranks as "
            "the count.",
            "",
            markdown_table(
                [
                    "depth",
                    "trees with c <= 0",
                    "M",
                    "T(q, x)",
                    "collision count",
                    "T - count",
                    "95% CI",
                ],
                rows,
            ),  # fmt: skip
        ]
    )
    return md, out


def _claims(records, m_values, n_true, name, baseline: str) -> list[dict]:
    """BSF against the best depth of k-means trees and of LSH tables, at each budget M that
    every seed's curve of every method reaches at some depth, or else at the middle
    (geometric) of the sizes they all reach. Each method's depth is the one with the best
    mean recall at M over the seeds (among the depths every seed reaches M at); the claim
    is paired over the seeds (each seed: BSF's recall minus the better of the two others'
    at that seed)."""
    methods = ("BSF", "k-means trees", "LSH tables")
    seeds = sorted({r["seed"] for r in records})
    curves = {
        (r["method"], r["bits"], r["seed"]): (r["mean_candidates"], r["candidate_recall"])
        for r in records
    }
    depths = {m: sorted({k[1] for k in curves if k[0] == m}) for m in methods}

    def reach(method, depth):  # the sizes every seed's curve spans at this depth
        spans = [curves[(method, depth, s)][0] for s in seeds]
        return max(c[0] for c in spans), min(c[-1] for c in spans)

    lo = max(min(reach(m, d)[0] for d in depths[m]) for m in methods)
    hi = min(max(reach(m, d)[1] for d in depths[m]) for m in methods)
    budgets = [m for m in m_values if lo <= m <= hi]
    if not budgets and lo <= hi:
        budgets = [float(np.sqrt(lo * hi))]
    rows = []
    for m in budgets:
        at = {}
        for method in methods:
            per_depth = {
                d: np.array([recall_at_budget(*curves[(method, d, s)], m) for s in seeds])
                for d in depths[method]
            }
            usable = {d: v for d, v in per_depth.items() if not np.any(np.isnan(v))}
            at[method] = max(usable.values(), key=np.mean)
        diffs = at["BSF"] - np.maximum(at["k-means trees"], at["LSH tables"])
        rows.append(
            claim(
                PAPER,
                f"BSF recall of the true {n_true}-NN above k-means trees and LSH tables at "
                f"{m:.0f} candidates (best depth of each)",
                name,
                diffs,
                baseline=baseline,
            )
        )
    return rows


@reproduction(settings)
def run(out_dir: Path, cfg: dict, opts: RunOptions) -> str:
    """Run the reproduction (``X``: your own data instead of Fashion-MNIST); write
    ``search_forest.json``, ``claims.json``, ``search_forest_recall.png`` and
    ``search_forest.md`` into ``out_dir``; return the markdown report."""
    from hashlearn.plots import plot_lines

    name, n_true, split = _split(cfg, opts.seed, opts.data_dir, opts.X)
    n_db = split.X_db.shape[0]
    cfg["n_train"] = min(cfg["n_train"], n_db)
    k_similar = max(1, round(n_true * cfg["n_train"] / n_db))
    T = cfg["n_trees"]
    tree_counts = sorted({*(2**i for i in range(T.bit_length()) if 2**i <= T), T})
    seeds = [opts.seed * 1000 + s for s in range(cfg["seeds"])]
    models: dict = {}
    records = run_specs(
        specs(cfg, k_similar),
        split,
        bits=cfg["depths"],
        seeds=seeds,
        measures=[candidate_recall_curve("euclidean", tree_counts)],
        progress=opts.progress,
        desc="search-forest",
        models=models,
    )
    ranking_md, ranking = _ranking_table(models, split, n_true, cfg["depths"], seeds)
    models.clear()
    m_values = [m for m in BUDGETS if m <= n_db] if n_true == 100 else [20, 50, 100, 200, 500]
    m_curve = np.unique(np.r_[np.geomspace(1, n_db, 60).astype(int), m_values])
    sh = run_specs(
        [MethodSpec("SH", "spectral", n_train=cfg["n_train"], deterministic=True)],
        split,
        bits=cfg["sh_bits"],
        seeds=seeds[:1],
        measures=[recall_at_m_curve(m_curve)],
        progress=opts.progress,
        desc="search-forest SH",
    )
    curves = _curves(records)
    lines = []
    for label, (trees, sizes, recall) in curves.items():
        lines.append(
            [
                label,
                *[f"{t}: {c:.0f} / {r:.3f}" for t, c, r in zip(trees, sizes, recall, strict=True)],
            ]
        )
    at_budget = {
        label: [recall_at_budget(c[1], c[2], m) for m in m_values] for label, c in curves.items()
    }
    at_budget.update(
        {f"SH {r['bits']} bits (Hamming ranking)": [r[f"recall@{m}"] for m in m_values] for r in sh}
    )
    baseline = "; ".join(f"`{b.as_run()}`" for b in specs(cfg, k_similar)[1:])
    claims = _claims(records, m_values, n_true, name, baseline)
    plot_lines(
        {
            "": {
                **{label: (c[1], c[2]) for label, c in curves.items()},
                **{f"SH {r['bits']} bits": (m_curve, r["recall_curve"]) for r in sh},
            }
        },
        out_dir / "search_forest_recall.png",
        f"{name.split()[0]}: recall of the true {n_true}-NN as trees are added ({T} trees / tables)",
        xlabel="candidate-set size (mean items per query)",
        ylabel=f"recall of the true {n_true}-NN",
        xlog=True,
    )
    write_json(
        out_dir / "search_forest.json",
        {
            "settings": cfg,
            "seed": opts.seed,
            "k_similar": k_similar,
            "records": records,
            "sh": sh,
            "m_values": m_values,
            "recall_at_budget": at_budget,
            "ranking": ranking,
        },
    )
    report = [
        f"## search-forest: learning to search (Li et al., NIPS 2011){' [quick]' if opts.quick else ''}",
        "",
        f"{name}, database {n_db} items, {split.X_q.shape[0]} held-out queries, PCA to "
        f"{split.X_db.shape[1]} dims; ground truth: exact Euclidean {n_true}-NN. {T} trees / "
        f"tables per method, depth (= bits per table) {list(cfg['depths'])}; bucketers "
        f"fitted on {cfg['n_train']} database items; BSF lam={cfg['lam']}, {cfg['n_pairs']} "
        f"pairs per tree, similar = {k_similar}-NN within the sample, projection splits. "
        f"Means over {len(seeds)} seed(s). Deviations: PCA to {split.X_db.shape[1]} dims "
        f"and a {cfg['n_train']}-item training sample (the paper trains on the full set).",
        "",
        "### Claims",
        "",
        f"Paired over the {len(seeds)} seeds (one split). LSH tables: Gaussian hyperplanes "
        "through the data mean, `bits_per_table` = the depth (the paper cites Gionis et "
        "al. [6] and Datar et al.'s p-stable scheme [2] without stating its hash; see "
        "'Deviations' in docs/reproductions.md).",
        "",
        write_claims(out_dir, claims),
        "",
        "Rows as run (depth set per configuration):",
        "",
        rows_as_run(specs(cfg, k_similar)),
        "",
        "Recall at a candidate budget M (each configuration's curve, linear in log size "
        "between its points; '-' where the curve does not reach M):",
        "",
        markdown_table(
            ["configuration", *[f"M={m}" for m in m_values]],
            [
                [k, *["-" if np.isnan(v) else f"{v:.3f}" for v in vals]]
                for k, vals in at_budget.items()
            ],
        ),
        "",
        "Each configuration as trees are added (trees: mean candidates / recall):",
        "",
        markdown_table(
            ["configuration", *[f"point {i + 1}" for i in range(len(tree_counts))]], lines
        ),
        "",
        ranking_md,
        "",
        "![recall](search_forest_recall.png)",
    ]
    md = "\n".join(report) + "\n"
    (out_dir / "search_forest.md").write_text(md)
    return md
