"""Reproduction of the LambdaRank bit-vector paper (WWW), Tables 4-5 and Secs. 5.3 and 6.

Classification (Table 4): k-NN error with the relative threshold k = 3 (the query's 3
nearest non-empty Hamming bins vote, ties kept) against code length, for random-hyperplane
LSH, spectral hashing (SH), RankNet codes and LambdaRank codes
(:class:`~hashlearn.hashers.RankHashing` with its defaults: the classification score is
eq. 7 as written, the count of selected same-label documents), beside exact Euclidean 3-NN;
means over seeds (SH is deterministic). LSH is the paper's (projections on random
directions, thresholded: Charikar's i.i.d. N(0, I) hyperplanes through the origin); the
library's default runs as an extra row; the claims at 32 bits are paired over the seeds.
Data: digits (raw 64 pixels), Fashion-MNIST (its
60k training / 10k test rows in full mode, the paper's MNIST sizes; 784 pixels reduced to a
100-D PCA fitted on the training rows, for every method alike) and, where the machine has
it, the stdlib-docstrings bag of words (sparse; SH is skipped there; full mode only). Retrieval (Table 5):
a 50-NN task (relevant = the query's 50 Euclidean nearest training items), precision of the
items at Hamming distance < 2 (``<= 1``) per query, a query retrieving nothing scoring 0, at
32 bits; RankNet / LambdaRank trained with ``task="retrieval"``. Bit compression (Sec. 5.3):
the code length LSH needs to match LambdaRank's best error, linear between measured lengths.
Cascade (Sec. 6): an 8-bit LambdaRank stage keeps each query's ``f`` nearest non-empty bins;
the longest LambdaRank code classifies among them. Hamming-ball lookup: 32-bit LambdaRank
codes tiled with noise, microseconds per query of
:class:`~hashlearn.index.hamming_ball.HammingBallIndex` beside
:class:`~hashlearn.index.flat.FlatIndex`, single thread, interleaved repetitions, medians.
The fit -> encode -> measure loop is :func:`hashlearn.experiments.pipeline.run_specs`.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA

from hashlearn.evaluate import knn_classify_exact
from hashlearn.experiments._common import (
    available_real,
    load_real,
    lsh_specs,
    markdown_table,
    write_json,
)
from hashlearn.experiments._stats import paired_differences
from hashlearn.experiments.pipeline import (
    MethodSpec,
    RunOptions,
    Split,
    claim,
    knn_error,
    mean_table,
    neighbor_vote_error,
    precision_at_radius,
    reproduction,
    rows_as_run,
    run_specs,
    summarize,
    write_claims,
)
from hashlearn.index.cascade import Cascade
from hashlearn.index.flat import FlatIndex
from hashlearn.index.hamming_ball import HammingBallIndex

__all__ = ["run", "settings", "specs"]

PAPER = "LambdaRank bit vectors (WWW)"
ERROR = "knn_error@3bins"


FULL: dict[str, Any] = dict(
    bits=(8, 16, 32, 64, 128), seeds=1, extra_seeds_at=32, extra_seeds=4, epochs=5
)
FULL.update(digits=(1000, 797), fashion=(60000, 10000), ball_n=1_000_000, ball_queries=2000)
FULL.update(repeats=5)


def settings(quick: bool) -> dict:
    """Protocol sizes: the paper's (60k / 10k) in full mode (``FULL``), seconds-long ones in
    quick mode."""
    if not quick:
        return dict(FULL)
    small = dict(FULL, bits=(8, 16, 32), extra_seeds=1, epochs=2, repeats=2)
    return dict(small, digits=(300, 150), fashion=(1000, 300), ball_n=20_000, ball_queries=100)


def specs(epochs: int, *, sparse: bool = False, task: str = "classification") -> list[MethodSpec]:
    """LSH, SH (dense data only), RankNet and LambdaRank codes."""
    supervision = "labels" if task == "classification" else "none"
    # the paper's documents: all drawn at random (the library draws half among the neighbours)
    rank = {"n_epochs": epochs, "task": task, "neighbor_docs": 0}
    if task == "retrieval":
        rank["radius"] = 1
    out = lsh_specs()
    if not sparse:
        out.append(MethodSpec("SH", "spectral", deterministic=True))
    out += [
        MethodSpec("RankNet", "rank", {**rank, "objective": "ranknet"}, supervision),
        MethodSpec("LambdaRank", "rank", {**rank, "objective": "lambdarank"}, supervision),
    ]
    return out


def _split(name: str, cfg: dict, seed: int, data_dir, X=None, y=None) -> Split:
    rng = np.random.RandomState(seed)
    if X is not None:
        return Split.holdout(X, y, n_queries=max(1, len(y) // 5), random_state=seed)
    if name == "stdlib-docstrings":
        from hashlearn.datasets import load_stdlib_docstrings

        Xs, ys = load_stdlib_docstrings()
        return Split.holdout(Xs, ys, n_queries=Xs.shape[0] // 4, random_state=seed)
    Xr, yr = load_real(name, data_dir)
    n_train, n_test = cfg["digits" if name == "digits" else "fashion"]
    if name == "digits":
        order = rng.permutation(len(Xr))
        tr, te = order[:n_train], order[n_train : n_train + n_test]
        return Split(Xr[tr], Xr[te], yr[tr], yr[te])
    tr = np.sort(rng.choice(60000, min(n_train, 60000), replace=False))
    te = 60000 + np.sort(rng.choice(10000, min(n_test, 10000), replace=False))
    pca = PCA(100, random_state=seed).fit(Xr[tr[:20000]])
    return Split(
        pca.transform(Xr[tr]).astype(np.float32),
        pca.transform(Xr[te]).astype(np.float32),
        yr[tr],
        yr[te],
    )


def _interpolated_bits(bits, errs, target) -> float | None:
    """Smallest code length where the (piecewise linear in bits) error reaches ``target``."""
    if errs[0] <= target:
        return float(bits[0])
    for b0, e0, b1, e1 in zip(bits, errs, bits[1:], errs[1:], strict=False):
        if e1 <= target < e0:
            return b0 + (e0 - target) / (e0 - e1) * (b1 - b0)
    return None


def _classification(name, split, cfg, seed, progress, models):
    sparse = sp.issparse(split.X_db)
    kw = dict(measures=[knn_error(n_bins=3)], progress=progress, models=models)
    methods = specs(cfg["epochs"], sparse=sparse)
    records = run_specs(
        methods, split, bits=cfg["bits"], seeds=[seed], desc=f"rank-codes {name}", **kw
    )
    if cfg["extra_seeds"]:
        extra = [seed + 1 + i for i in range(cfg["extra_seeds"])]
        records += run_specs(
            [m for m in methods if not m.deterministic],
            split,
            bits=[cfg["extra_seeds_at"]],
            seeds=extra,
            desc=f"rank-codes {name} more seeds",
            **kw,
        )
    return records


def _cascade(split, short_model, long_model, long_bits):
    """Sec. 6: an 8-bit stage keeps each query's f nearest non-empty bins; the long code's
    3 nearest bins among them vote."""
    db = [short_model.encode(split.X_db), long_model.encode(split.X_db)]
    q = [short_model.encode(split.X_q), long_model.encode(split.X_q)]
    rows = []
    for f in (1, 2, 3):
        cascade = Cascade((8, long_bits), n_bins=f)
        cascade.add(db)
        lims, D, I, sizes = cascade.neighbors(q, n_bins=3, return_search_sets=True)
        width = max(1, int(np.diff(lims).max(initial=0)))
        ids = np.full((len(lims) - 1, width), -1, np.int64)
        dist = np.zeros(ids.shape, np.int64)
        for i in range(len(lims) - 1):
            n = lims[i + 1] - lims[i]
            ids[i, :n], dist[i, :n] = I[lims[i] : lims[i + 1]], D[lims[i] : lims[i + 1]]
        rows.append(
            {
                "filter_bins": f,
                "search_set": float(sizes[:, 1].mean()),
                "reduction": split.X_db.shape[0] / float(sizes[:, 1].mean()),
                "error": neighbor_vote_error(ids, dist, split.y_db, split.y_q),
            }
        )
    return rows


def _ball_timing(model, X_all, cfg, seed):
    from hashlearn.datasets import tile_with_noise

    n = cfg["ball_n"]
    rng = np.random.RandomState(seed)
    codes = np.empty((n, 4), np.uint8)
    for start in range(0, n, 200_000):
        stop = min(n, start + 200_000)
        rows = tile_with_noise(X_all, stop - start, noise=0.05, random_state=seed + start)
        codes[start:stop] = model.encode(rows)
    queries = model.encode(X_all[rng.choice(X_all.shape[0], cfg["ball_queries"], replace=False)])
    ball, flat = HammingBallIndex(32), FlatIndex(32)
    ball.add(codes)
    flat.add(codes)
    n_flat = max(50, cfg["ball_queries"] // 10)  # the scan is slow: fewer queries
    contenders = {
        "ball r=1": (lambda: ball.range_search(queries, 1, n_threads=1), cfg["ball_queries"]),
        "ball r=2": (lambda: ball.range_search(queries, 2, n_threads=1), cfg["ball_queries"]),
        "ball k=10": (lambda: ball.search(queries, 10, n_threads=1), cfg["ball_queries"]),
        "flat r=2": (lambda: flat.range_search(queries[:n_flat], 2, n_threads=1), n_flat),
        "flat k=10": (lambda: flat.search(queries[:n_flat], 10, n_threads=1), n_flat),
    }
    times = {name: [] for name in contenders}
    for fn, _ in contenders.values():
        fn()
    for _ in range(cfg["repeats"]):
        for name, (fn, count) in contenders.items():
            t0 = time.process_time()
            fn()
            times[name].append((time.process_time() - t0) / count * 1e6)
    return {"n": n, "cpu_us_per_query": {k: float(np.median(v)) for k, v in times.items()}}


def _datasets(data_dir, X, quick):
    if X is not None:
        return ["your data"]
    names = sorted(available_real(data_dir), key=lambda n: n != "fashion-mnist")
    if quick:
        return names
    try:
        from hashlearn.datasets import load_stdlib_docstrings  # noqa: F401

        names.append("stdlib-docstrings")
    except ImportError:
        pass
    return names


@reproduction(settings, needs_labels=True)
def run(out_dir: Path, cfg: dict, opts: RunOptions) -> str:
    """Run the reproduction (``X``, ``y``: your own labelled data); write ``rank_codes.md``,
    ``rank_codes.json``, ``claims.json`` and the plots into ``out_dir``; return markdown."""
    from hashlearn.plots import plot_lines

    md, claims, panels, references = [], [], {}, {}
    results: dict[str, Any] = {"settings": cfg}
    names = _datasets(opts.data_dir, opts.X, opts.quick)
    for name in names:
        split = _split(name, cfg, opts.seed, opts.data_dir, opts.X, opts.y)
        models: dict = {}
        records = _classification(name, split, cfg, opts.seed, opts.progress, models)
        assert split.y_db is not None  # every data set of this reproduction is labelled
        exact = float(
            np.mean(knn_classify_exact(split.X_db, split.y_db, split.X_q, 3) != split.y_q)
        )
        bits = list(cfg["bits"])
        err = summarize(records, ERROR)
        lam = [err[("LambdaRank", b)][0] for b in bits]
        best = int(np.argmin(lam))
        lsh_bits = _interpolated_bits(bits, [err[("LSH", b)][0] for b in bits], lam[best])
        top = cfg["extra_seeds_at"]
        as_run = {m.name: m.as_run() for m in specs(cfg["epochs"], sparse=sp.issparse(split.X_db))}
        claims += [
            claim(
                PAPER,
                f"LambdaRank k-NN error below {other} at {top} bits",
                name,
                paired_differences(records, "LambdaRank", other, ERROR, bits=top, sign=-1),
                baseline=as_run[other],
            )
            for other in ("LSH", "RankNet")
        ]
        factor = (
            f"{lsh_bits / bits[best]:.1f}x ({lsh_bits:.0f} LSH bits vs {bits[best]})"
            if lsh_bits is not None
            else f"more than {bits[-1]}/{bits[best]} (LSH never reaches "
            f"{100 * lam[best]:.2f} % up to {bits[-1]} bits)"
        )
        panels[name] = {
            m: (bits, [err[(m, b)][0] for b in bits if (m, b) in err])
            for m in dict.fromkeys(r["method"] for r in records)
        }
        references[name] = {"exact Euclidean 3-NN": (bits, [exact] * len(bits))}
        results[name] = {"records": records, "exact_error": exact, "compression_bits": lsh_bits}
        md += [
            f"### k-NN classification error (%), {name} ({split.X_db.shape[0]} train / "
            f"{split.X_q.shape[0]} test); exact Euclidean 3-NN: {100 * exact:.2f} %",
            "",
            mean_table(records, ERROR, scale=100.0),
            "",
            f"Bit compression (LSH bits to match LambdaRank's best error): {factor}.",
            "",
        ]
        if name != names[0]:
            continue
        split50 = split.with_euclidean_truth(50)
        retrieval = run_specs(
            specs(cfg["epochs"], sparse=sp.issparse(split.X_db), task="retrieval"),
            split50,
            bits=[32],
            seeds=[opts.seed],
            measures=[precision_at_radius(1, "euclidean")],
            progress=opts.progress,
            desc="rank-codes retrieval",
        )
        cascade = _cascade(
            split,
            models[("LambdaRank", 8, opts.seed)],
            models[("LambdaRank", bits[-1], opts.seed)],
            bits[-1],
        )
        timing = _ball_timing(models[("LambdaRank", 32, opts.seed)], split.X_db, cfg, opts.seed)
        results[f"{name}_retrieval"], results[f"{name}_cascade"] = retrieval, cascade
        results["ball_timing"] = timing
        direct = err[("LambdaRank", bits[-1])][0]
        md += [
            f"### Retrieval precision at Hamming distance < 2, 50-NN task, 32 bits, {name}",
            "",
            mean_table(retrieval, "precision@r1"),
            "",
            f"### Cascade 8 -> {bits[-1]} bits (LambdaRank), {name}; direct {bits[-1]}-bit "
            f"error {100 * direct:.2f} %",
            "",
            markdown_table(
                ["filter bins", "long-code search set", "reduction", "error %"],
                [
                    [
                        r["filter_bins"],
                        f"{r['search_set']:.0f}",
                        f"{r['reduction']:.1f}x",
                        f"{100 * r['error']:.2f}",
                    ]
                    for r in cascade
                ],
            ),
            "",
            f"### Hamming-ball lookup, 32-bit LambdaRank codes tiled to {timing['n']:,} items "
            f"(single thread, CPU µs per query, median of {cfg['repeats']})",
            "",
            markdown_table(
                ["search", "CPU µs / query"],
                [[k, f"{v:.1f}"] for k, v in timing["cpu_us_per_query"].items()],
            ),
            "",
        ]
    plot_lines(
        panels,
        out_dir / "rank_codes_error.png",
        "LambdaRank bit vectors, Table 4: k-NN error (3 nearest non-empty bins) against bits",
        xlabel="bits",
        ylabel="k-NN error",
        xlog=True,
        reference=references,
    )
    write_json(out_dir / "rank_codes.json", results)
    header = [
        f"## Rank codes (LambdaRank bit vectors, WWW){' [quick]' if opts.quick else ''}",
        "",
        f"Seed {opts.seed}; bits {list(cfg['bits'])}; {1 + cfg['extra_seeds']} seed(s) at "
        f"{cfg['extra_seeds_at']} bits, one elsewhere; RankNet / LambdaRank {cfg['epochs']} "
        "epochs, 100 queries x 100 documents per step, eq. 7 classification score. "
        "Deviations: Fashion-MNIST stands in for MNIST (same sizes in full mode); Covertype, "
        "MCAT, RCV, SIFT1M and Tiny Images are not reproduced.",
        "",
        "### Claims",
        "",
        f"Paired over the {1 + cfg['extra_seeds']} seeds at {cfg['extra_seeds_at']} bits (one "
        "split per dataset). LSH is the paper's (Sec. 2: projections on random directions "
        "thresholded; Charikar's i.i.d. N(0, I) hyperplanes through the origin); the "
        "library's default runs as an extra row.",
        "",
        write_claims(out_dir, claims),
        "",
        "Rows as run (dense data; sparse data drop SH):",
        "",
        rows_as_run(specs(cfg["epochs"])),
        "",
        "![rank codes: k-NN error against bits](rank_codes_error.png)",
        "",
    ]
    report = "\n".join(header + md)
    (out_dir / "rank_codes.md").write_text(report)
    return report
