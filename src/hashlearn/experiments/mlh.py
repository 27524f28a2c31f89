"""Reproduction of Norouzi & Fleet, *Minimal Loss Hashing for Compact Binary Codes*, ICML 2011 §6.1 (and a reduced §6.2) on this machine.

Protocol (§6.1, after Kulis & Darrell): for each dataset, 1000 random training points (the
database) and up to 3000 test queries; mean-centre, normalise each datum to unit length
(not for the 10-D uniform data) and project onto a 40-D PCA subspace fitted on the training
set (not for uniform). Ground truth: the Euclidean threshold at which each training point has
50 neighbours on average (:func:`hashlearn.supervision.neighbor_threshold`); a test item is
relevant to a query when it lies within that threshold. MLH (hinge loss), MLH with BRE's loss
(BRE2), BRE, SH, SIKH, PCAH, ITQ and LSH are trained on the training set (MLH/BRE2 on all its
pairs labelled by the threshold, BRE on its own neighbour/random pairs and distances).
Measures: pooled precision and recall at Hamming radius ``R <= 3`` against code length, and
precision-recall curves over ``R = 0..q`` at 32 and 64 bits; means ± std over ``n_runs``
independent models (SH is deterministic: one run). PCAH and ITQ exist only for ``q <= 40``
(``q <= 10`` on uniform): "n/a" elsewhere.

MLH's rho, lambda and epsilon are chosen per dataset on a held-out 10 % of the training set at
32 bits (§5; rho then grows linearly with the code length), by the held-out precision at
``R <= 3``. Epochs are far fewer than the paper's 2000 (budget of a 2-core machine).

§6.2 (``large``, full mode with Fashion-MNIST only): 20 000 training / 2000 test points,
100 neighbours, 16-128 bits, precision at R <= 3 and PR-AUC, with MLH at half the code length
(MLH.5) beside the others; BRE trained on 3000 points as in the paper.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
from sklearn.decomposition import PCA

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import pr_auc, precision_recall_at_radius, precision_recall_curve
from hashlearn.experiments._common import (
    available_real,
    load_real,
    markdown_table,
    write_json,
)
from hashlearn.hashers.bre import BinaryReconstructiveEmbedding
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.hashers.mlh import MinimalLossHashing, select_mlh_hyperparameters
from hashlearn.hashers.pca import IterativeQuantization, PCAHashing
from hashlearn.hashers.sikh import ShiftInvariantKernelHashing
from hashlearn.hashers.spectral import SpectralHashing
from hashlearn.plots import atomic_path
from hashlearn.supervision import neighbor_threshold, neighbors_within, pairs_from_neighbors

__all__ = ["run", "prepare"]

METHODS = ("MLH", "BRE2", "BRE", "SH", "SIKH", "PCAH", "ITQ", "LSH")
RADIUS = 3


def prepare(X_train, X_test, *, normalise: bool, n_pca: int | None):
    """§6.1 preprocessing: centre on the training mean, unit length, PCA to ``n_pca`` dims."""
    mean = X_train.mean(0)
    A, B = X_train - mean, X_test - mean
    if normalise:
        A = A / np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
        B = B / np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1e-12)
    if n_pca is not None and n_pca < A.shape[1]:
        pca = PCA(n_pca, svd_solver="full").fit(A)
        A, B = pca.transform(A), pca.transform(B)
    return np.ascontiguousarray(A), np.ascontiguousarray(B)


def _datasets(quick, seed, data_dir):
    rng = np.random.RandomState(seed)
    out = []
    for name in available_real(data_dir):
        X, _ = load_real(name, data_dir)
        X = np.asarray(X, np.float64)
        perm = rng.permutation(len(X))
        n_test = 300 if quick else 3000
        tr, te = perm[:1000], perm[1000 : 1000 + n_test]
        A, B = prepare(X[tr], X[te], normalise=True, n_pca=40)
        out.append((name, A, B))
    U = rng.uniform(0, 1, (1000 + (500 if quick else 3000), 10))
    A, B = prepare(U[:1000], U[1000:], normalise=False, n_pca=None)
    out.append(("uniform-10d", A, B))
    return out


def _make(method, n_bits, seed, mlh_params, epochs, d):
    if method in ("PCAH", "ITQ") and n_bits > d:
        return None
    if method == "MLH":
        return MinimalLossHashing(
            n_bits,
            n_epochs=epochs,
            random_state=seed,
            monitor_pairs=0,
            **_scaled(mlh_params, n_bits),
        )
    if method == "BRE2":
        return MinimalLossHashing(
            n_bits,
            loss="bre",
            epsilon=n_bits / 32.0,
            n_epochs=epochs,
            monitor_pairs=0,
            random_state=seed,
        )
    if method == "BRE":
        return BinaryReconstructiveEmbedding(n_bits, n_landmarks=100, n_iter=2, random_state=seed)
    if method == "SH":
        return SpectralHashing(n_bits)
    if method == "SIKH":
        return ShiftInvariantKernelHashing(n_bits, random_state=seed)
    if method == "PCAH":
        return PCAHashing(n_bits)
    if method == "ITQ":
        return IterativeQuantization(n_bits, random_state=seed)
    return RandomHyperplaneLSH(n_bits, random_state=seed)


def _scaled(params, n_bits):
    """rho grows linearly with the code length (§5); chosen at 32 bits."""
    p = {k: params[k] for k in ("rho", "lam", "epsilon")}
    p["rho"] = float(min(n_bits, max(1.0, round(p["rho"] * n_bits / 32.0))))
    return p


def _fit(h, method, A, P, s):
    if method in ("MLH", "BRE2"):
        return h.fit(A, pairs=P, similar=s)
    return h.fit(A)


def _fmt(values):
    values = np.asarray(values, float)
    if values.size == 0:
        return "n/a"
    if values.size == 1:
        return f"{values[0]:.3f}"
    return f"{values.mean():.3f} ± {values.std():.3f}"


def _run_small(out_dir, quick, seed, data_dir, progress, report):
    bits_list = (32,) if quick else (8, 16, 32, 64)
    n_runs = 2 if quick else 5
    epochs = 4 if quick else 15
    results = {}
    curves = {}
    selected = {}
    datasets = _datasets(quick, seed, data_dir)
    jobs = [
        (ds, b, m, r)
        for ds, *_ in datasets
        for b in bits_list
        for m in METHODS
        for r in range(1 if m in ("SH", "PCAH") else n_runs)
    ]
    bar = progress(total=len(jobs), desc="mlh §6.1") if progress else None
    t0 = time.perf_counter()
    for name, A, B in datasets:
        thr = neighbor_threshold(A, 50)
        iu = np.triu_indices(len(A), 1)
        P = np.stack(iu, 1).astype(np.int64)
        s = neighbors_within(A, A, thr)[iu]
        relevant = neighbors_within(B, A, thr)
        if quick:
            best = dict(rho=8.0, lam=0.5, epsilon=0.03)
        else:
            best, _ = select_mlh_hyperparameters(
                A,
                pairs=P,
                similar=s,
                n_bits=32,
                rho_values=(3, 6, 10, 14),
                lam_values=(0.2, 0.5),
                epsilon_values=(0.03, 0.1),
                n_epochs=5,
                score=RADIUS,
                random_state=seed,
            )
        selected[name] = best
        for b in bits_list:
            for method in METHODS:
                runs = 1 if method in ("SH", "PCAH") else n_runs
                for r in range(runs):
                    h = _make(method, b, seed * 1000 + r, best, epochs, A.shape[1])
                    key = (name, b, method)
                    if h is None:
                        results.setdefault(key, [])
                        if bar:
                            bar.update(1)
                        continue
                    _fit(h, method, A, P, s)
                    d = hamming_cdist(h.encode(B), h.encode(A), b)
                    prec, rec = precision_recall_at_radius(d, relevant, RADIUS)
                    prec_q, _ = precision_recall_at_radius(
                        d, relevant, RADIUS, aggregate="per_query"
                    )
                    pc, rc = precision_recall_curve(d, relevant, b)
                    results.setdefault(key, []).append((prec, rec, pr_auc(pc, rc), prec_q))
                    curves.setdefault(key, []).append((pc, rc))
                    if method == "MLH" and b == 32 and r == 0 and name == datasets[0][0]:
                        _training_curve(out_dir, name, A, P, s, best, epochs, seed)
                    if bar:
                        bar.update(1)
    if bar:
        bar.close()
    elapsed = time.perf_counter() - t0
    # ---- tables
    names = [n for n, *_ in datasets]
    json_rows = []
    for name in names:
        rows = []
        for method in METHODS:
            row = [method]
            for b in bits_list:
                vals = [v[0] for v in results[(name, b, method)]]
                row.append(_fmt(vals))
                json_rows.append(
                    dict(
                        dataset=name,
                        method=method,
                        n_bits=b,
                        precision=vals,
                        recall=[v[1] for v in results[(name, b, method)]],
                        pr_auc=[v[2] for v in results[(name, b, method)]],
                        precision_per_query=[v[3] for v in results[(name, b, method)]],
                    )
                )
            rows.append(row)
        report.append(
            f"\n**{name}** — precision at Hamming radius <= {RADIUS} "
            f"(pooled; mean ± std over runs; MLH rho/lambda/epsilon at 32 bits = "
            f"{selected[name]['rho']:g}/{selected[name]['lam']:g}/"
            f"{selected[name]['epsilon']:g})\n"
        )
        report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows))
        rows = []
        for method in METHODS:
            rows.append(
                [method] + [_fmt([v[1] for v in results[(name, b, method)]]) for b in bits_list]
            )
        report.append(f"\n{name} — recall at R <= {RADIUS} (pooled)\n")
        report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows))
        rows = []
        for method in METHODS:
            rows.append(
                [method] + [_fmt([v[3] for v in results[(name, b, method)]]) for b in bits_list]
            )
        report.append(
            f"\n{name} — precision at R <= {RADIUS} averaged per query, a query "
            "retrieving nothing scoring 0\n"
        )
        report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows))
        rows = []
        for method in METHODS:
            rows.append(
                [method] + [_fmt([v[2] for v in results[(name, b, method)]]) for b in bits_list]
            )
        report.append(f"\n{name} — area under the precision-recall curve (R = 0..q)\n")
        report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows))
    report.append(
        f"\n§6.1 took {elapsed:.0f} s ({n_runs} runs, {epochs} MLH epochs of 10^5 pairs)."
    )
    report.append(_claims(results, names, bits_list))
    write_json(
        out_dir / "mlh_small.json",
        dict(rows=json_rows, selected=selected, bits=list(bits_list), n_runs=n_runs),
    )
    _plots(out_dir, results, curves, names, bits_list)
    report.append(
        "\nPlots: `mlh_precision_r3_<dataset>.png`, `mlh_pr_<dataset>_<bits>.png`, "
        "`mlh_training_curve.png`."
    )


def _claims(results, names, bits_list):
    lines = [
        "\nClaims (means over runs), under the pooled precision H/T of §6 and under the "
        "per-query precision (empty retrieval = 0):\n"
    ]

    def mean(name, b, m, idx):
        v = [x[idx] for x in results[(name, b, m)]]
        return float(np.mean(v)) if v else float("nan")

    for idx, label in ((0, "pooled"), (3, "per-query")):
        for name in names:
            for b in (32, 64):
                if b not in bits_list:
                    continue
                m, br, sh, lsh = (mean(name, b, k, idx) for k in ("MLH", "BRE", "SH", "LSH"))
                ok = m >= br >= max(sh, lsh)
                lines.append(
                    f"- [{label}] {name} {b} bits: MLH {m:.3f} >= BRE {br:.3f} >= "
                    f"max(SH {sh:.3f}, LSH {lsh:.3f}): "
                    f"**{'holds' if ok else 'does not hold'}**"
                )
            if 32 in bits_list:
                unsup = {k: mean(name, 32, k, idx) for k in ("SH", "SIKH", "PCAH", "ITQ", "LSH")}
                top = max(unsup, key=lambda k: -np.inf if np.isnan(unsup[k]) else unsup[k])
                m = mean(name, 32, "MLH", idx)
                lines.append(
                    f"- [{label}] {name} 32 bits: MLH {m:.3f} vs best unsupervised "
                    f"{top} {unsup[top]:.3f}: MLH "
                    f"{'wins' if m > unsup[top] else 'loses'}"
                )
    return "\n".join(lines)


def _training_curve(out_dir, name, A, P, s, best, epochs, seed):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    h = MinimalLossHashing(
        32, n_epochs=max(epochs, 10), monitor_pairs=20000, random_state=seed, **_scaled(best, 32)
    ).fit(A, pairs=P, similar=s)
    fig, ax = plt.subplots(figsize=(5, 3.5))
    ax.plot(h.bound_history_, label="upper bound (eq. 11)")
    ax.plot(h.loss_history_, label="empirical loss (eq. 3)")
    ax.set_xlabel("epoch (10^5 pairs)")
    ax.set_ylabel("mean per pair")
    ax.set_title(f"MLH training, {name}, 32 bits")
    ax.legend()
    fig.tight_layout()
    with atomic_path(out_dir / "mlh_training_curve.png") as path:
        fig.savefig(path, format="png", dpi=100)
    plt.close(fig)
    write_json(
        out_dir / "mlh_training_curve.json", dict(bound=h.bound_history_, loss=h.loss_history_)
    )


def _plots(out_dir, results, curves, names, bits_list):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    for name in names:
        fig, ax = plt.subplots(figsize=(5.5, 4))
        for method in METHODS:
            xs, ms, ss = [], [], []
            for b in bits_list:
                v = [x[0] for x in results[(name, b, method)]]
                if v:
                    xs.append(b)
                    ms.append(np.mean(v))
                    ss.append(np.std(v))
            if xs:
                ax.errorbar(xs, ms, yerr=ss, marker="o", capsize=3, label=method)
        ax.set_xscale("log", base=2)
        ax.set_xlabel("code length (bits)")
        ax.set_ylabel(f"precision at R <= {RADIUS}")
        ax.set_title(name)
        ax.legend(fontsize=7)
        fig.tight_layout()
        with atomic_path(out_dir / f"mlh_precision_r3_{name}.png") as path:
            fig.savefig(path, format="png", dpi=100)
        plt.close(fig)
        for b in (32, 64):
            if b not in bits_list:
                continue
            fig, ax = plt.subplots(figsize=(5.5, 4))
            for method in METHODS:
                cs = curves.get((name, b, method))
                if not cs:
                    continue
                p = np.mean([c[0] for c in cs], 0)
                r = np.mean([c[1] for c in cs], 0)
                keep = r > 0
                ax.plot(r[keep], p[keep], marker=".", label=method)
            ax.set_xlabel("recall")
            ax.set_ylabel("precision")
            ax.set_title(f"{name}, {b} bits (mean over runs)")
            ax.legend(fontsize=7)
            fig.tight_layout()
            with atomic_path(out_dir / f"mlh_pr_{name}_{b}.png") as path:
                fig.savefig(path, format="png", dpi=100)
            plt.close(fig)


def _run_large(out_dir, seed, data_dir, progress, report):
    """Reduced §6.2 on Fashion-MNIST: 20k train / 2k test, 100 neighbours."""
    rng = np.random.RandomState(seed + 1)
    X, _ = load_real("fashion-mnist", data_dir)
    perm = rng.permutation(len(X))
    tr, te = perm[:20000], perm[20000:22000]
    A, B = prepare(
        np.asarray(X[tr], np.float64), np.asarray(X[te], np.float64), normalise=True, n_pca=40
    )
    thr = neighbor_threshold(A, 100, random_state=seed)
    relevant = neighbors_within(B, A, thr)
    P, s = pairs_from_neighbors(A, 100, 1_000_000, similar_fraction=0.1, random_state=seed)
    bits_list = (16, 32, 64, 128)
    rows_p, rows_auc, json_rows = [], [], []
    res = {}
    jobs = [(b, m) for b in bits_list for m in ("MLH", "MLH.5", "BRE", "SH", "SIKH", "ITQ", "LSH")]
    bar = progress(total=len(jobs), desc="mlh §6.2") if progress else None
    t0 = time.perf_counter()
    params = dict(rho=8.0, lam=0.5, epsilon=0.03)
    for b, method in jobs:
        q = b // 2 if method == "MLH.5" else b
        if method in ("MLH", "MLH.5"):
            h = MinimalLossHashing(
                q, n_epochs=20, monitor_pairs=0, random_state=seed, **_scaled(params, q)
            ).fit(A, pairs=P, similar=s)
        elif method == "BRE":
            sub = rng.choice(len(A), 3000, replace=False)
            h = BinaryReconstructiveEmbedding(q, n_landmarks=100, n_iter=2, random_state=seed).fit(
                A[sub]
            )
        else:
            h = _make(
                {"SH": "SH", "SIKH": "SIKH", "ITQ": "ITQ", "LSH": "LSH"}[method],
                q,
                seed,
                params,
                0,
                A.shape[1],
            )
            if h is None:
                res[(b, method)] = None
                if bar:
                    bar.update(1)
                continue
            h.fit(A)
        d = hamming_cdist(h.encode(B), h.encode(A), q)
        prec, rec = precision_recall_at_radius(d, relevant, RADIUS)
        pc, rc = precision_recall_curve(d, relevant, q)
        res[(b, method)] = (prec, rec, pr_auc(pc, rc))
        json_rows.append(
            dict(
                method=method,
                n_bits=q,
                column_bits=b,
                precision=prec,
                recall=rec,
                pr_auc=res[(b, method)][2],
            )
        )
        if bar:
            bar.update(1)
    if bar:
        bar.close()
    for method in ("MLH", "MLH.5", "BRE", "SH", "SIKH", "ITQ", "LSH"):
        rows_p.append(
            [method]
            + [
                (
                    "n/a"
                    if res[(b, method)] is None
                    else f"{res[(b, method)][0]:.3f} / {res[(b, method)][1]:.3f}"
                )
                for b in bits_list
            ]
        )
        rows_auc.append(
            [method]
            + [
                ("n/a" if res[(b, method)] is None else f"{res[(b, method)][2]:.3f}")
                for b in bits_list
            ]
        )
    report.append(
        "\n### §6.2 at larger scale: Fashion-MNIST 20k train / 2k test, 100 "
        "neighbours (one run)\n\nPrecision / recall at R <= 3 (MLH.5 = MLH at half "
        "the column's code length):\n"
    )
    report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows_p))
    report.append("\nArea under the precision-recall curve:\n")
    report.append(markdown_table(["method"] + [f"{b} bits" for b in bits_list], rows_auc))
    report.append(f"\n§6.2 took {time.perf_counter() - t0:.0f} s.")
    write_json(out_dir / "mlh_large.json", dict(rows=json_rows))


def run(
    out_dir: Path,
    *,
    quick: bool = False,
    seed: int = 0,
    data_dir=None,
    progress=None,
    large: bool | None = None,
) -> str:
    """Run the MLH reproduction; write tables (.md, .json) and PNGs into ``out_dir``; return
    the markdown report. ``large`` (default: not ``quick``) adds the §6.2 part when
    Fashion-MNIST is installed."""
    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    report = [
        "## Minimal loss hashing (Norouzi & Fleet, *Minimal Loss Hashing for Compact Binary Codes*, ICML 2011 §6)",
        "",
        f"Seed {seed}; {'quick' if quick else 'full'} mode; "
        "machine shared by several jobs (2 cores).",
        "\n### §6.1: 1000 training points, 50 neighbours, 40-D PCA",
    ]
    _run_small(out_dir, quick, seed, data_dir, progress, report)
    if large is None:
        large = not quick
    if large and "fashion-mnist" in available_real(data_dir):
        _run_large(out_dir, seed, data_dir, progress, report)
    md = "\n".join(report) + "\n"
    (out_dir / "mlh.md").write_text(md)
    return md
