"""``hashlearn reproduce learned-metric``: Jain, Kulis & Grauman, *Fast Image Search for Learned Metrics*, CVPR 2008, Figs. 1-2.

Dense case (Fig. 1) on digits (64-d) and Fashion-MNIST (PCA to 32-d): per random partition,
30 queries per class are held out and the rest is the database; ITML learns a metric from
constraints among 20 labelled database examples per class (the slack weight chosen by
cross-validation on those examples only). k = 4 nearest-neighbour accuracy for (Euclidean,
linear scan), (Euclidean, LSH), (learned, linear scan), (learned, LSH) against the number of
bits b: hashing by eq. 6, ``sign(r^T G x)`` with ``r ~ N(0, I)``, run as
:class:`~hashlearn.hashers.RandomHyperplaneLSH` (``directions="gaussian", center=False``)
on ``G x`` (on ``x`` for the Euclidean rows; not the :class:`~hashlearn.hashers.MetricLSH`
class, which computes the same function), Charikar's search over
``M = n^(1/(1+eps))`` sorted permutations with eps = 1.5 examining ``2M`` entries as in the
paper (:class:`~hashlearn.index.permutation.PermutationIndex` defaults), candidates
re-ranked by the Euclidean distance in that space (the learned metric); the fraction
of the database searched per query; and the CPU-time ratio of an exhaustive re-ranking scan
to the hashed search (query hashing included), both through the same re-ranker.

Sparse case (Fig. 2): images as bags of quantised patches (4x4 patches at stride 2 binarised
at mid-grey: 2^16 patch words), learned by kernelized ITML and hashed by the implicit form
(eq. 8, :class:`~hashlearn.hashers.KernelMetricLSH`); the baseline hashes the raw
histograms with the same Gaussian hyperplanes through the origin and re-ranks by Euclidean
distance.
The fit -> search -> measure loop is :func:`hashlearn.experiments.pipeline.run_specs`.
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA

from hashlearn.experiments._common import PAPER_LSH, available_real, load_real, write_json
from hashlearn.experiments._stats import paired_differences
from hashlearn.experiments.pipeline import (
    RunOptions,
    SearchSpec,
    Split,
    claim,
    knn_error_of_neighbors,
    mean_table,
    reproduction,
    rows_as_run,
    run_specs,
    searched_fraction,
    summarize,
    write_claims,
)
from hashlearn.index.permutation import PermutationIndex
from hashlearn.metric import ITML

__all__ = ["run", "settings", "specs", "bag_of_patches"]

PAPER = "Jain, Kulis & Grauman 2008 (learned-metric hashing)"
K_NN = 4
EPSILON = 1.5


FULL: dict[str, Any] = dict(
    runs=10, queries_per_class=30, bits=(8, 12, 16, 24, 32, 48, 64), slack="auto"
)
FULL.update(fashion_rows=60300, sparse_rows=5000, sparse_runs=5, sparse_bits=(16, 32, 64))


def settings(quick: bool) -> dict:
    """Protocol sizes: the paper's in full mode (``FULL``: 10 partitions), seconds-long ones
    in quick mode."""
    if not quick:
        return dict(FULL)
    small = dict(FULL, runs=2, queries_per_class=10, bits=(8, 16, 32), slack=1.0)
    return dict(small, fashion_rows=10000, sparse_rows=1000, sparse_runs=2, sparse_bits=(32,))


def _permutation_index(n_bits: int, seed: int) -> PermutationIndex:
    """Charikar's search as in the paper: eps = 1.5, 2M entries examined per query."""
    return PermutationIndex(n_bits, epsilon=EPSILON, random_state=seed)


def specs(metric: str, sparse: bool = False) -> list[SearchSpec]:
    """The linear scan (re-ranking every database item) and the hashed search of Figs. 1-2
    under ``metric`` ("euclidean" or "learned"). Dense data reach the learned metric through
    the space ``x -> G x`` of ITML's ``A = G^T G``, where eq. 6's hash ``sign(r^T G x)`` is a
    random hyperplane and the learned distance is Euclidean; sparse data use the implicit
    hash of eq. 8 and kernelized ITML's distance."""
    kw: dict[str, Any]
    if sparse and metric == "learned":
        kw = dict(hasher="kernel-metric-lsh", rerank="metric", supervision="labels")
    elif sparse:  # Charikar's Gaussian hyperplanes, as eq. 8 with the identity kernel
        kw = dict(hasher="lsh", params=PAPER_LSH, rerank="euclidean")
    else:  # sign(r^T x) with r ~ N(0, I) on x or on G x: eq. 6
        kw = dict(hasher="lsh", params=PAPER_LSH, rerank="sqeuclidean")
    return [
        SearchSpec(f"{metric}, linear scan", k=K_NN, n_candidates="all", **kw),
        SearchSpec(f"{metric}, LSH", k=K_NN, index=_permutation_index, **kw),
    ]


def learned_space(split: Split, slack, seed: int) -> Split:
    """``split`` mapped by ``x -> G x`` of the metric ITML learns from the split's training
    rows (the 20 labelled items per class); ``slack="auto"``: its slack weight (Davis et
    al.'s gamma) chosen by cross-validation on those rows only."""
    rows = split.train_rows
    if split.y_db is None:
        raise ValueError("learned_space needs a labelled split (y_db).")
    itml = ITML(slack=slack, random_state=seed).fit(split.X_db[rows], split.y_db[rows])
    return replace(split, X_db=itml.transform(split.X_db), X_q=itml.transform(split.X_q))


def bag_of_patches(images: np.ndarray, side: int = 28, level: float = 128) -> sp.csr_matrix:
    """Square ``side x side`` images -> L2-normalised histograms over 2^16 binarised 4x4
    patch words (patches at stride 2, pixels ``>= level`` set)."""
    imgs = np.asarray(images).reshape(-1, side, side) >= level
    weights = (1 << np.arange(16)).reshape(4, 4)
    words = np.stack(
        [
            (imgs[:, r : r + 4, c : c + 4] * weights).sum(axis=(1, 2))
            for r in range(0, side - 3, 2)
            for c in range(0, side - 3, 2)
        ],
        axis=1,
    )
    n = len(imgs)
    rows = np.repeat(np.arange(n), words.shape[1])
    X = sp.csr_matrix((np.ones(rows.size), (rows, words.ravel())), shape=(n, 1 << 16))
    X.sum_duplicates()
    norms = np.sqrt(np.asarray(X.multiply(X).sum(axis=1)).ravel())
    return sp.csr_matrix(sp.diags(1.0 / np.maximum(norms, 1e-12)) @ X)


def _partition(X, y, run_seed: int, n_pca: int | None, n_queries: int) -> Split:
    """``n_queries`` (30) queries per class held out; 20 labelled database items per class
    for ITML."""
    split = Split.per_class(X, y, n_per_class=n_queries, random_state=run_seed)
    if n_pca is not None:
        rng = np.random.RandomState(run_seed)
        sample = rng.choice(split.X_db.shape[0], min(10000, split.X_db.shape[0]), replace=False)
        pca = PCA(n_pca, random_state=run_seed).fit(split.X_db[sample])
        split = Split(pca.transform(split.X_db), pca.transform(split.X_q), split.y_db, split.y_q)
    return split.with_train_per_class(20, random_state=run_seed)


def _run_case(data, cfg, bits, runs, seed, progress, desc, *, sparse=False, n_pca=None):
    """Every partition: both metrics, linear scan and hashed search; tidy records."""
    X, y = data
    records = []
    measures = [knn_error_of_neighbors(), searched_fraction()]
    for run in range(runs):
        split = _partition(X, y, seed + run, n_pca, cfg["queries_per_class"])
        spaces = {"euclidean": split}
        spaces["learned"] = split if sparse else learned_space(split, cfg["slack"], seed + run)
        for metric, space in spaces.items():
            scan, hashed = specs(metric, sparse)
            kw = dict(
                seeds=[seed + run],
                measures=measures,
                progress=progress,
                desc=f"{desc} {metric} partition {run + 1}/{runs}",
                fits={},  # the scan and the hashed search share the max-bits model
            )
            records += run_specs([scan], space, bits=[max(bits)], **kw)
            records += run_specs([hashed], space, bits=bits, **kw)
    return records, split


def _claims(name, records, bits, sparse=False):
    """The paper's three claims at the longest code, paired over the partitions."""
    b = max(bits)

    def diffs(a, c):
        return paired_differences(records, a, c, "knn_accuracy", bits=b)

    as_run = {s.name: s.as_run() for m in ("euclidean", "learned") for s in specs(m, sparse)}
    return [
        claim(
            PAPER,
            "learned metric k-NN accuracy above Euclidean (linear scan)",
            name,
            diffs("learned, linear scan", "euclidean, linear scan"),
            baseline="exhaustive scan, Euclidean distance",
        ),
        claim(
            PAPER,
            f"learned-metric hashing ({b} bits) above Euclidean hashing",
            name,
            diffs("learned, LSH", "euclidean, LSH"),
            baseline=f"{as_run['euclidean, LSH']} + PermutationIndex(epsilon={EPSILON})",
        ),
        claim(
            PAPER,
            f"learned-metric hashing ({b} bits) within 0.02 of the learned linear scan",
            name,
            diffs("learned, LSH", "learned, linear scan") + 0.02,
            baseline="exhaustive scan, learned metric",
        ),
    ]


def _speed(records, bits) -> str:
    cpu = summarize(records, "search_cpu_s")
    b = max(bits)
    scan, hashed = cpu[("learned, linear scan", b)][0], cpu[("learned, LSH", b)][0]
    return (
        f"CPU-time ratio, exhaustive learned-metric scan / hashed search at {b} bits "
        f"(query hashing, Charikar's search and re-ranking; same process, both through "
        f"the same Searcher re-ranker): {scan / max(hashed, 1e-9):.1f}x."
    )


def _plot(panels_acc, panels_searched, out_dir):
    from hashlearn.plots import plot_lines

    plot_lines(
        panels_acc,
        out_dir / "learned_metric_accuracy.png",
        f"Jain et al. Figs. 1-2: {K_NN}-NN accuracy against bits (linear scans as flat lines)",
        xlabel="bits b",
        ylabel=f"{K_NN}-NN accuracy",
        xlog=True,
    )
    plot_lines(
        panels_searched,
        out_dir / "learned_metric_searched.png",
        "Jain et al. Fig. 1 (right): fraction of the database searched per query",
        xlabel="bits b",
        ylabel="fraction searched",
        xlog=True,
        ylim=None,
    )


def _curves(records, bits, value):
    stats = summarize(records, value)
    methods = dict.fromkeys(r["method"] for r in records)
    return {
        m: (list(bits), [stats.get((m, b), stats.get((m, max(bits))))[0] for b in bits])
        for m in methods
    }


@reproduction(settings, needs_labels=True)
def run(out_dir: Path, cfg: dict, opts: RunOptions) -> str:
    """Run Figs. 1-2 (``X``, ``y``: your own labelled data for the dense case instead of
    digits / Fashion-MNIST); write ``learned_metric.md``, ``learned_metric.json``,
    ``claims.json`` and the plots into ``out_dir``; return the markdown report."""
    if opts.X is not None:
        cases = {"your data": (np.asarray(opts.X, np.float64), np.asarray(opts.y))}
    else:
        cases = {}
        for name in available_real(opts.data_dir):
            Xr, yr = load_real(name, opts.data_dir)
            if name == "fashion-mnist":
                keep = np.random.RandomState(opts.seed).permutation(len(Xr))[: cfg["fashion_rows"]]
                Xr, yr = Xr[np.sort(keep)], yr[np.sort(keep)]
            cases[name] = (Xr.astype(np.float64), yr)
    lines, claims, results, acc_panels, searched_panels = [], [], {}, {}, {}
    for name, data in cases.items():
        n_pca = 32 if data[0].shape[1] > 100 else None
        records, split = _run_case(
            data, cfg, cfg["bits"], cfg["runs"], opts.seed, opts.progress, name, n_pca=n_pca
        )
        results[name] = records
        claims += _claims(name, records, cfg["bits"])
        acc_panels[name] = _curves(records, cfg["bits"], "knn_accuracy")
        searched_panels[name] = {
            m: c for m, c in _curves(records, cfg["bits"], "searched").items() if "LSH" in m
        }
        lines += [
            f"\n### Dense case (Fig. 1): {name}, database {split.X_db.shape[0]}, "
            f"{split.X_q.shape[0]} queries, d = {split.X_db.shape[1]}",
            f"\n{K_NN}-NN accuracy (mean ± std over partitions; linear scans at the last column):\n",
            mean_table(records, "knn_accuracy"),
            "\nFraction of the database searched per query:\n",
            mean_table([r for r in records if "LSH" in r["method"]], "searched"),
            "",
            _speed(records, cfg["bits"]),
        ]
    sparse_name = "fashion-mnist" if opts.X is None and "fashion-mnist" in cases else None
    if opts.X is None:
        sparse_name = sparse_name or "digits"
        Xr, yr = load_real(sparse_name, opts.data_dir)
        keep = np.sort(np.random.RandomState(opts.seed).permutation(len(Xr))[: cfg["sparse_rows"]])
        side, level = (28, 128) if sparse_name == "fashion-mnist" else (8, 8)
        bag = bag_of_patches(Xr[keep], side, level)
        runs = cfg["sparse_runs"]
        records, split = _run_case(
            (bag, yr[keep]),
            cfg,
            cfg["sparse_bits"],
            runs,
            opts.seed + 1000,
            opts.progress,
            f"{sparse_name} patches",
            sparse=True,
        )
        label = f"{sparse_name} bags of patches"
        results[label] = records
        claims += _claims(label, records, cfg["sparse_bits"], sparse=True)
        acc_panels[label] = _curves(records, cfg["sparse_bits"], "knn_accuracy")
        lines += [
            f"\n### Sparse case (Fig. 2): {label} ({bag.shape[1]} dims, "
            f"{bag.nnz / bag.shape[0]:.0f} non-zeros per item), kernelized ITML + implicit "
            f"hashing (eq. 8); database {split.X_db.shape[0]}, {split.X_q.shape[0]} queries, "
            f"{runs} partitions",
            f"\n{K_NN}-NN accuracy:\n",
            mean_table(records, "knn_accuracy"),
            "\nFraction of the database searched per query:\n",
            mean_table([r for r in records if "LSH" in r["method"]], "searched"),
        ]
    _plot(acc_panels, searched_panels, out_dir)
    write_json(out_dir / "learned_metric.json", {"settings": cfg, "records": results})
    header = [
        f"## learned-metric (Jain, Kulis & Grauman, CVPR 2008, Figs. 1-2){' [quick]' if opts.quick else ''}",
        "",
        f"{cfg['runs']} random partitions ({cfg['queries_per_class']} queries per class held out; ITML constraints among "
        f"20 labelled database items per class, slack weight {cfg['slack']}"
        f"{' (chosen by 3-fold CV on those items)' if cfg['slack'] == 'auto' else ' (fixed in quick mode)'}); "
        f"{K_NN}-NN accuracy; dense rows' LSH = `RandomHyperplaneLSH(directions='gaussian', "
        "center=False)` (i.i.d. N(0, I) hyperplanes through the origin) on x for the "
        "Euclidean rows and on G x for the learned ones, the same function as eq. 6's "
        "sign(r^T G x) (not the `MetricLSH` class); sparse rows: the same LSH on x "
        "(Euclidean) and `KernelMetricLSH` (eq. 8, learned); then "
        f"Charikar's search over M = n^(1/(1+eps)) sorted permutations, eps = {EPSILON}, 2M "
        "entries examined per query (as in the paper), candidates re-ranked by the metric. "
        "Deviations: the paper's Latex/CLARIFY and Caltech-101 data are replaced by digits "
        "(raw 64-d), Fashion-MNIST (PCA to 32-d) and bags of binarised image patches for the "
        "sparse case (the paper: pyramid-match embeddings).",
        "",
        "### Claims",
        "",
        "Paired over the partitions (each partition: its own queries, labelled items and "
        "learned metric).",
        "",
        write_claims(out_dir, claims),
        "",
        "Rows as run (dense; then sparse), searched with "
        f"`PermutationIndex(epsilon={EPSILON})` or exhaustively (linear scan):",
        "",
        rows_as_run(specs("euclidean") + specs("learned")),
        "",
        rows_as_run(specs("euclidean", True) + specs("learned", True)),
        "",
        "Plots: `learned_metric_accuracy.png`, `learned_metric_searched.png`.",
    ]
    md = "\n".join(header + lines) + "\n"
    (out_dir / "learned_metric.md").write_text(md)
    return md
