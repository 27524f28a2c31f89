"""Reproduce the retrieval experiments of binary-codes-survey.txt (Figs. 11 and 16).

Fig. 11 protocol: for every query, the true 50 nearest neighbours; the percentage of them
among the first M items of the Hamming ranking (ties broken at random, seeded), for
M = 1..1000 at 32 bits, and at M = 500 against the code length. Methods: random-hyperplane
LSH, BoostSSC (boosting, §3.3.1), RBM + NCA (§3.3.2), spectral hashing (§4.2), KLSH with an
RBF kernel (§4.3) and ITQ where present. Two ground truths:

* ``euclidean``: the 50 Euclidean nearest neighbours in the database;
* ``label``: the 50 Euclidean-nearest database items *of the query's own class* (labels
  stand in for the survey's object-label histograms; supervised methods train on labels).

Fig. 16 (top left): how many linear-scan neighbours (exact ranking under the RBF kernel,
which is the Euclidean ranking) are needed to cover KLSH's first 10 / 20 / 30 Hamming
neighbours: the fraction of KLSH's top-k that lies in the top-N of the linear scan, per N.

Data are scaled to [0, 1] (pixels / max); queries are held out at random; every method is
fitted on the database only. The Fig. 2 timing table is ``bench/survey_timing.py``.
"""

from __future__ import annotations

import importlib
import time
from pathlib import Path

import numpy as np

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import exact_knn, hamming_ranking, recall_at_m
from hashlearn.experiments._common import (
    available_real,
    load_real,
    markdown_table,
    split_queries,
    write_json,
)

__all__ = ["run", "label_neighbors"]

N_TRUE = 50
M_CURVE = np.unique(np.r_[np.arange(1, 10), np.geomspace(10, 1000, 40).astype(int)])


def label_neighbors(db, q, y_db, y_q, k: int = N_TRUE) -> np.ndarray:
    """The ``k`` Euclidean-nearest database items of each query's own class (label truth)."""
    out = np.full((len(q), k), -1, np.int64)
    for c in np.unique(y_q):
        rows = np.flatnonzero(y_db == c)
        qi = np.flatnonzero(y_q == c)
        _, ids = exact_knn(db[rows], q[qi], k)
        out[qi] = np.where(ids >= 0, rows[np.maximum(ids, 0)], -1)
    return out


def _optional(module: str, name: str):
    try:
        return getattr(importlib.import_module(module), name)
    except (ImportError, AttributeError):
        return None


def _methods(quick: bool, seed: int):
    """name -> (factory(n_bits), supervised)."""
    from hashlearn.hashers.boosted import BoostedSimilarityHashing
    from hashlearn.hashers.klsh import KernelizedLSH
    from hashlearn.hashers.lsh import RandomHyperplaneLSH
    from hashlearn.hashers.rbm import RBMHashing

    methods = {
        "LSH": (lambda b: RandomHyperplaneLSH(b, random_state=seed), False),
        "Boosting (BoostSSC)": (
            lambda b: BoostedSimilarityHashing(b, weighted=True, random_state=seed),
            True,
        ),
        "RBM + NCA": (
            lambda b: RBMHashing(b, finetune_epochs=15 if quick else 30, random_state=seed),
            True,
        ),
        "KLSH (RBF)": (lambda b: KernelizedLSH(b, kernel="rbf", random_state=seed), False),
    }
    spectral = _optional("hashlearn.hashers.spectral", "SpectralHashing")
    if spectral is not None:
        methods["Spectral hashing"] = (lambda b: spectral(b, random_state=seed), False)
    itq = _optional("hashlearn.hashers.pca", "IterativeQuantization")
    if itq is not None:
        methods["ITQ"] = (lambda b: itq(b, random_state=seed), False)
    return methods


def _dataset(name: str, quick: bool, seed: int, data_dir):
    X, y = load_real(name, data_dir)
    X = X.astype(np.float64) / float(X.max())
    rng = np.random.RandomState(seed)
    if name == "fashion-mnist":
        n_keep = 5200 if quick else 21000
        keep = np.sort(rng.choice(len(X), n_keep, replace=False))
        X, y = X[keep], y[keep]
        n_queries = 200 if quick else 1000
    else:
        n_queries = 200 if quick else 300
    db_rows, q_rows = split_queries(len(X), n_queries, random_state=seed)
    return X[db_rows], y[db_rows], X[q_rows], y[q_rows]


def _coverage(klsh_rank: np.ndarray, scan_rank: np.ndarray, ks, ns) -> np.ndarray:
    """Fraction of KLSH's first k neighbours inside the linear scan's first N, (len ks, len ns)."""
    n_db = int(max(klsh_rank.max(), scan_rank.max())) + 1
    position = np.full((len(scan_rank), n_db), np.iinfo(np.int64).max, np.int64)
    rows = np.arange(len(scan_rank))[:, None]
    position[rows, scan_rank] = np.arange(scan_rank.shape[1])[None, :]
    pos_of_klsh = position[rows, klsh_rank]
    return np.array([[np.mean(pos_of_klsh[:, :k] < n) for n in ns] for k in ks])


def run(out_dir: Path, *, quick: bool = False, seed: int = 0, data_dir=None, progress=None) -> str:
    """Run Figs. 11 and 16 on digits and Fashion-MNIST (when present); return markdown."""
    from hashlearn.hashers.klsh import KernelizedLSH
    from hashlearn.plots import plot_recall_at_m

    out_dir = Path(out_dir)
    out_dir.mkdir(parents=True, exist_ok=True)
    bits_list = [16, 32] if quick else [16, 32, 64]
    methods = _methods(quick, seed)
    datasets = available_real(data_dir)
    lines = [
        f"Survey reproduction (binary-codes-survey.txt Figs. 11, 16); quick={quick}, "
        f"seed={seed}. Recall = % of the true {N_TRUE} neighbours among the first M of "
        "the Hamming ranking (random tie order, seeded), averaged over queries.",
        "",
    ]
    results: dict = {}
    steps = len(datasets) * len(bits_list) * len(methods)
    bar = progress(total=steps, desc="survey") if progress is not None else None
    for ds in datasets:
        db, ydb, q, yq = _dataset(ds, quick, seed, data_dir)
        _, euclid_truth = exact_knn(db, q, max(N_TRUE, 1000))
        truths = {"euclidean": euclid_truth[:, :N_TRUE], "label": label_neighbors(db, q, ydb, yq)}
        lines.append(f"### {ds}: {len(db)} database items, {len(q)} queries, d={db.shape[1]}")
        res = results.setdefault(ds, {"at500": {}, "curves": {}, "fit_s": {}})
        for b in bits_list:
            for name, (factory, supervised) in methods.items():
                hasher = factory(b)
                start = time.perf_counter()
                hasher.fit(db, ydb) if supervised else hasher.fit(db)
                fit_s = time.perf_counter() - start
                d = hamming_cdist(hasher.encode(q), hasher.encode(db), b)
                for truth_name, truth in truths.items():
                    curve = recall_at_m(d, truth, M_CURVE.tolist(), random_state=seed)
                    at500 = float(recall_at_m(d, truth, [500], random_state=seed)[0])
                    res["at500"].setdefault(truth_name, {}).setdefault(name, {})[b] = at500
                    if b == 32:
                        res["curves"].setdefault(truth_name, {})[name] = curve.tolist()
                res["fit_s"].setdefault(name, {})[b] = fit_s
                if bar is not None:
                    bar.update(1)
        for truth_name in truths:
            rows = [
                [name]
                + [f"{100 * res['at500'][truth_name][name][b]:.1f}" for b in bits_list]
                + [f"{res['fit_s'][name][32]:.1f}"]
                for name in methods
            ]
            lines += [
                "",
                f"% of true {N_TRUE} NN ({truth_name} ground truth) retrieved at "
                "M = 500, by code length (Fig. 11b):",
                "",
                markdown_table(
                    ["method"] + [f"{b} bits" for b in bits_list] + ["fit s (32 bits)"], rows
                ),
            ]
            curves = {
                name: (M_CURVE, np.asarray(c)) for name, c in res["curves"][truth_name].items()
            }
            png = out_dir / f"survey_fig11_{ds}_{truth_name}_32bits.png"
            plot_recall_at_m(curves, png, title=f"{ds}, 32 bits, {truth_name} ground truth")
            lines += ["", f"Fig. 11a curve: `{png.name}`"]
        # Fig. 16: linear-scan neighbours needed to cover KLSH's first 10/20/30
        klsh = KernelizedLSH(32, kernel="rbf", random_state=seed).fit(db)
        d = hamming_cdist(klsh.encode(q), klsh.encode(db), 32)
        klsh_rank = hamming_ranking(d, 30, random_state=seed)
        ns = [10, 20, 30, 50, 100, 200, 500, 1000]
        cov = _coverage(klsh_rank, euclid_truth[:, :1000], [10, 20, 30], ns)
        res["fig16"] = {"N": ns, "coverage": cov.tolist()}
        lines += [
            "",
            "Fig. 16: fraction of KLSH's (RBF, 32 bits) first k Hamming neighbours "
            "found among the first N of the exact linear scan:",
            "",
            markdown_table(
                ["KLSH first k"] + [f"N={n}" for n in ns],
                [[f"k={k}"] + [f"{v:.2f}" for v in cov[i]] for i, k in enumerate([10, 20, 30])],
            ),
            "",
        ]
    if bar is not None:
        bar.close()
    write_json(out_dir / "survey.json", results)
    return "\n".join(lines) + "\n"
