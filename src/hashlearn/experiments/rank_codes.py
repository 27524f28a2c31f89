"""Reproduction of the LambdaRank bit-vector paper (WWW), Tables 4-5 and Sec. 5.5-6, on this machine.

Protocol. Classification (Table 4): k-NN error with the relative threshold k = 3 (the
query's 3 nearest non-empty Hamming bins vote, ties kept) against code length, for random
hyperplane LSH, spectral hashing (SH), RankNet codes and LambdaRank codes
(:class:`~hashlearn.hashers.rank.RankHashing`), with exact Euclidean 3-NN as the reference;
means over ``n_runs`` models (different seeds; SH is deterministic). Data: digits (raw 64
pixels), Fashion-MNIST (a random training subset and held-out test rows; 784 pixels reduced
to a 100-D PCA fitted on the training subset, for every method alike -- the budget of a
shared 2-core machine) and, where the machine has it, the stdlib-docstrings bag of words
(:func:`hashlearn.datasets.load_stdlib_docstrings`, sparse; SH is skipped there).
Retrieval (Table 5): a 50-NN task (relevant = the query's 50 Euclidean nearest database
items), precision of the items at Hamming distance < 2 (``<= 1``), per query averaged, a
query retrieving nothing scoring 0 (Weiss et al.'s convention), at 32 bits; RankNet /
LambdaRank trained with ``task="retrieval"``. Bit compression: the code length LSH needs to
match LambdaRank's best error, linearly interpolated between measured lengths (Sec. 5.3).
Cascade (Sec. 6): an 8-bit LambdaRank stage keeps each query's ``f`` nearest non-empty bins;
the longest LambdaRank code classifies among them (relative threshold 3). Hamming-ball
lookup: 32-bit LambdaRank codes of Fashion-MNIST rows tiled with noise to 1M items,
microseconds per query of :class:`~hashlearn.index.hamming_ball.HammingBallIndex` beside
:class:`~hashlearn.index.flat.FlatIndex`, single thread, interleaved repetitions, medians.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import scipy.sparse as sp
from sklearn.decomposition import PCA

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import (
    exact_knn,
    knn_classification_error,
    knn_classify_exact,
    precision_recall_at_radius,
    relevance_from_neighbors,
)
from hashlearn.experiments._common import available_real, load_real, markdown_table, write_json
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.rank import RankHashing
from hashlearn.index.cascade import Cascade
from hashlearn.index.flat import FlatIndex
from hashlearn.index.hamming_ball import HammingBallIndex
from hashlearn.plots import atomic_path

__all__ = ["run"]

METHODS = ("LSH", "SH", "RankNet", "LambdaRank")


def _config(quick: bool) -> dict:
    if quick:
        return {
            "bits": (8, 16, 32),
            "runs": 1,
            "digits": (1000, 400),
            "fashion": (2000, 500),
            "bow_epochs": 3,
            "epochs": 5,
            "multi_run_bits": (32,),
            "ball_n": 100_000,
            "ball_queries": 500,
            "repeats": 3,
        }
    return {
        "bits": (8, 16, 32, 64, 128),
        "runs": 3,
        "digits": (1000, 797),
        "fashion": (2000, 1000),
        "bow_epochs": 5,
        "epochs": 5,
        "multi_run_bits": (32, 64),
        "ball_n": 1_000_000,
        "ball_queries": 2000,
        "repeats": 5,
        "bits_by_dataset": {"digits": (8, 16, 32, 64), "stdlib-docstrings": (8, 16, 32, 64)},
    }


def _make(method: str, n_bits: int, seed: int, epochs: int, task: str = "classification"):
    if method == "LSH":
        return RandomHyperplaneLSH(n_bits, random_state=seed)
    if method == "SH":
        from hashlearn.hashers.spectral import SpectralHashing  # written in parallel

        return SpectralHashing(n_bits)
    objective = "ranknet" if method == "RankNet" else "lambdarank"
    return RankHashing(
        n_bits,
        objective=objective,
        task=task,
        n_epochs=epochs,
        radius=1 if task == "retrieval" else None,
        random_state=seed,
    )


def _load(name: str, cfg: dict, seed: int, data_dir):
    rng = np.random.RandomState(seed)
    if name == "stdlib-docstrings":
        from hashlearn.datasets import load_stdlib_docstrings

        X, y = load_stdlib_docstrings()
        order = rng.permutation(X.shape[0])
        n_test = X.shape[0] // 4
        te, tr = order[:n_test], order[n_test:]
        return X[tr], y[tr], X[te], y[te]
    X, y = load_real(name, data_dir)
    n_train, n_test = cfg["digits" if name == "digits" else "fashion"]
    if name == "digits":
        order = rng.permutation(len(X))
        tr, te = order[:n_train], order[n_train : n_train + n_test]
        return X[tr], y[tr], X[te], y[te]
    tr = np.sort(rng.choice(60000, n_train, replace=False))
    te = 60000 + np.sort(rng.choice(10000, n_test, replace=False))
    pca = PCA(100, random_state=seed).fit(X[tr])
    return (
        pca.transform(X[tr]).astype(np.float32),
        y[tr],
        pca.transform(X[te]).astype(np.float32),
        y[te],
    )


def _classification(name, data, cfg, seed, progress, models_out):
    Xtr, ytr, Xte, yte = data
    exact = float(np.mean(knn_classify_exact(Xtr, ytr, Xte, 3) != yte))
    errors: dict[str, dict[int, list[float]]] = {m: {} for m in METHODS}
    epochs = cfg["bow_epochs"] if sp.issparse(Xtr) else cfg["epochs"]
    for b in cfg.get("bits_by_dataset", {}).get(name, cfg["bits"]):
        runs = cfg["runs"] if b in cfg["multi_run_bits"] else 1
        for method in METHODS:
            if method == "SH" and sp.issparse(Xtr):
                continue
            for r in range(1 if method == "SH" else runs):
                model = _make(method, b, seed + r, epochs).fit(Xtr, ytr)
                dist = hamming_cdist(model.encode(Xte), model.encode(Xtr), b)
                errors[method].setdefault(b, []).append(
                    knn_classification_error(dist, ytr, yte, k=3)
                )
                if r == 0 and method == "LambdaRank":
                    models_out[b] = model
                if progress is not None:
                    progress(f"{name} {method} {b} bits run {r}")
    return exact, errors


def _interpolated_bits(bits, errs, target) -> float | None:
    """Smallest code length where the (piecewise linear in bits) error reaches ``target``."""
    if errs[0] <= target:
        return float(bits[0])
    for (b0, e0), (b1, e1) in zip(
        zip(bits, errs, strict=False), zip(bits[1:], errs[1:], strict=False), strict=False
    ):
        if e1 <= target < e0:
            return b0 + (e0 - target) / (e0 - e1) * (b1 - b0)
    return None


def _retrieval(data, cfg, seed, progress):
    Xtr, _, Xte, _ = data
    _, true_ids = exact_knn(Xtr, Xte, 50)
    relevant = relevance_from_neighbors(true_ids, Xtr.shape[0])
    out = {}
    for method in METHODS:
        model = _make(method, 32, seed, cfg["epochs"], task="retrieval").fit(Xtr)
        dist = hamming_cdist(model.encode(Xte), model.encode(Xtr), 32)
        prec, _ = precision_recall_at_radius(dist, relevant, 1, aggregate="per_query", empty="zero")
        out[method] = {"precision": prec, "mean_retrieved": float((dist <= 1).sum(1).mean())}
        if progress is not None:
            progress(f"retrieval {method}")
    return out


def _vote(lims, ids, db_labels, dist):
    """Majority label of each query's neighbours; ties to the class of the nearest voter."""
    pred = np.full(len(lims) - 1, -1, np.int64)
    for i in range(len(pred)):
        lab = db_labels[ids[lims[i] : lims[i + 1]]]
        if lab.size:
            counts = np.bincount(lab)
            best = np.flatnonzero(counts == counts.max())
            d = dist[lims[i] : lims[i + 1]]
            pred[i] = min(best, key=lambda c: (d[lab == c].min(), c))
    return pred


def _cascade(data, short_model, long_model, long_bits):
    Xtr, ytr, Xte, yte = data
    db = [short_model.encode(Xtr), long_model.encode(Xtr)]
    q = [short_model.encode(Xte), long_model.encode(Xte)]
    direct = knn_classification_error(hamming_cdist(q[1], db[1], long_bits), ytr, yte, k=3)
    rows = []
    for f in (1, 2, 3):
        cascade = Cascade((8, long_bits), n_bins=f)
        cascade.add(db)
        lims, D, I, sizes = cascade.neighbors(q, n_bins=3, return_search_sets=True)
        err = float(np.mean(_vote(lims, I, ytr, D) != yte))
        rows.append(
            {
                "filter_bins": f,
                "search_set": float(sizes[:, 1].mean()),
                "reduction": Xtr.shape[0] / float(sizes[:, 1].mean()),
                "error": err,
                "direct_error": direct,
            }
        )
    return rows


def _ball_timing(model, X_all, cfg, seed):
    from hashlearn.datasets import tile_with_noise

    n = cfg["ball_n"]
    rng = np.random.RandomState(seed)
    codes = np.empty((n, 4), np.uint8)
    block = 200_000
    for start in range(0, n, block):
        stop = min(n, start + block)
        rows = tile_with_noise(X_all, stop - start, noise=0.05, random_state=seed + start)
        codes[start:stop] = model.encode(rows)
    queries = model.encode(X_all[rng.choice(len(X_all), cfg["ball_queries"], replace=False)])
    ball, flat = HammingBallIndex(32), FlatIndex(32)
    t0 = time.perf_counter()
    ball.add(codes)
    build = time.perf_counter() - t0
    flat.add(codes)
    n_flat = max(50, cfg["ball_queries"] // 10)  # the scan is slow: fewer queries
    contenders = {
        "ball r=1": lambda: ball.range_search(queries, 1, n_threads=1),
        "ball r=2": lambda: ball.range_search(queries, 2, n_threads=1),
        "ball k=10": lambda: ball.search(queries, 10, n_threads=1),
        "flat r=2": lambda: flat.range_search(queries[:n_flat], 2, n_threads=1),
        "flat k=10": lambda: flat.search(queries[:n_flat], 10, n_threads=1),
    }
    per_query = {
        name: (cfg["ball_queries"] if name.startswith("ball") else n_flat) for name in contenders
    }
    times = {name: [] for name in contenders}
    for fn in contenders.values():
        fn()
    for _ in range(cfg["repeats"]):
        for name, fn in contenders.items():
            t0 = time.perf_counter()
            fn()
            times[name].append((time.perf_counter() - t0) / per_query[name] * 1e6)
    lims, _, _ = ball.range_search(queries, 2)
    return {
        "n": n,
        "build_s": build,
        "distinct_codes": ball.n_keys,
        "mean_results_r2": float(np.diff(lims).mean()),
        "us_per_query": {k: float(np.median(v)) for k, v in times.items()},
    }


def _timing_md(timing: dict, name: str, cfg: dict) -> list[str]:
    return [
        f"### Hamming-ball lookup, 32-bit LambdaRank codes of {name} tiled to "
        f"{timing['n']:,} items (single thread, median of {cfg['repeats']})",
        "",
        markdown_table(
            ["search", "µs / query"], [[k, f"{v:.1f}"] for k, v in timing["us_per_query"].items()]
        ),
        "",
        f"{timing['distinct_codes']:,} distinct codes; {timing['mean_results_r2']:.1f} "
        f"results per query at r <= 2; table built in {timing['build_s']:.2f} s.",
        "",
    ]


def _plot(path: Path, name: str, bits, errors, exact) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    fig, ax = plt.subplots(figsize=(5, 3.5))
    for method, per_bits in errors.items():
        if per_bits:
            bs = sorted(per_bits)
            ax.plot(bs, [np.mean(per_bits[b]) for b in bs], marker="o", label=method)
    ax.axhline(exact, color="k", linestyle="--", label="exact Euclidean 3-NN")
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bits")
    ax.set_ylabel("k-NN error (relative threshold k = 3)")
    ax.set_title(name)
    ax.legend(fontsize=7)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png", dpi=110)
    plt.close(fig)


def run(out_dir: Path, *, quick: bool = False, seed: int = 0, data_dir=None, progress=None) -> str:
    """Run the reproduction; write tables (.md/.json) and PNGs to ``out_dir``; return markdown."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    cfg = _config(quick)
    names = sorted(available_real(data_dir), key=lambda n: n != "fashion-mnist")
    try:
        from hashlearn.datasets import load_stdlib_docstrings  # noqa: F401

        names.append("stdlib-docstrings")
    except ImportError:
        pass
    md = [
        f"Settings: {'quick' if quick else 'full'} mode, seed {seed}, bits {cfg['bits']}, "
        f"RankNet/LambdaRank {cfg['epochs']} epochs, 100 queries x 100 documents per step. "
        "Machine shared by several jobs (timings noisy).",
        "",
    ]
    results: dict = {"config": {k: v for k, v in cfg.items()}}
    bar = progress(desc="rank-codes", unit="model") if progress is not None else None

    def tick(message: str) -> None:
        if bar is not None:
            bar.set_postfix_str(message, refresh=False)
            bar.update(1)

    for name in names:
        data = _load(name, cfg, seed, data_dir)
        models: dict = {}
        exact, errors = _classification(name, data, cfg, seed, tick, models)
        bits = cfg.get("bits_by_dataset", {}).get(name, cfg["bits"])
        header = ["method"] + [f"{b} bits" for b in bits]
        rows = []
        for method in METHODS:
            if not errors[method]:
                continue
            rows.append(
                [method]
                + [
                    f"{100 * np.mean(errors[method][b]):.2f}"
                    + (
                        f" ± {100 * np.std(errors[method][b]):.2f}"
                        if len(errors[method][b]) > 1
                        else ""
                    )
                    for b in bits
                ]
            )
        rows.append(["exact Euclidean 3-NN"] + [f"{100 * exact:.2f}"] * len(bits))
        lam = [np.mean(errors["LambdaRank"][b]) for b in bits]
        best = int(np.argmin(lam))
        lsh_bits = _interpolated_bits(bits, [np.mean(errors["LSH"][b]) for b in bits], lam[best])
        factor = (
            f"{lsh_bits / bits[best]:.1f}x ({lsh_bits:.0f} LSH bits vs {bits[best]})"
            if lsh_bits is not None
            else f"more than {bits[-1]}/{bits[best]} (LSH never "
            f"reaches {100 * lam[best]:.2f} % up to {bits[-1]} bits)"
        )
        md += [
            f"### k-NN classification error (%), {name} "
            f"({data[0].shape[0]} train / {data[2].shape[0]} test)",
            "",
            markdown_table(header, rows),
            "",
            f"Bit compression (LSH bits to match LambdaRank's best error): {factor}.",
            "",
            f"![{name}](rank_codes_{name}.png)",
            "",
        ]
        _plot(out_dir / f"rank_codes_{name}.png", name, bits, errors, exact)
        results[name] = {"exact_error": exact, "errors": errors, "compression": lsh_bits}
        if name == "fashion-mnist" or (name == "digits" and "fashion-mnist" not in names):
            results[f"{name}_retrieval"] = ret = _retrieval(data, cfg, seed, tick)
            md += [
                f"### Retrieval precision at Hamming distance < 2, 50-NN task, 32 bits, {name}",
                "",
                markdown_table(
                    ["method", "precision", "mean retrieved"],
                    [
                        [m, f"{v['precision']:.3f}", f"{v['mean_retrieved']:.1f}"]
                        for m, v in ret.items()
                    ],
                ),
                "",
            ]
            long_bits = bits[-1]
            rows_c = _cascade(data, models[8], models[long_bits], long_bits)
            results[f"{name}_cascade"] = rows_c
            md += [
                f"### Cascade 8 -> {long_bits} bits (LambdaRank), {name}",
                "",
                markdown_table(
                    [
                        "filter bins",
                        "long-code search set",
                        "reduction",
                        "error %",
                        f"direct {long_bits}-bit error %",
                    ],
                    [
                        [
                            r["filter_bins"],
                            f"{r['search_set']:.0f}",
                            f"{r['reduction']:.1f}x",
                            f"{100 * r['error']:.2f}",
                            f"{100 * r['direct_error']:.2f}",
                        ]
                        for r in rows_c
                    ],
                ),
                "",
            ]
            timing = _ball_timing(models[32], np.vstack([data[0], data[2]]), cfg, seed)
            results["ball_timing"] = timing
            md += _timing_md(timing, name, cfg)
        (out_dir / "rank_codes.partial.md").write_text("\n".join(md))  # survives a crash
    if bar is not None:
        bar.close()
    write_json(out_dir / "rank_codes.json", results)
    report = "\n".join(md)
    (out_dir / "rank_codes.md").write_text(report)
    return report
