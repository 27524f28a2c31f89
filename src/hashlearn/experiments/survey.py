"""Reproduce the retrieval experiments of Grauman & Fergus's survey (Figs. 11 and 16).

K. Grauman, R. Fergus, *Learning Binary Hash Codes for Large-Scale Image Search*, 2013.

Fig. 11 protocol: for every query, its true 50 nearest neighbours; the percentage of them
among the first M items of the Hamming ranking (ties broken at random, seeded), for
M = 1..1000 at 32 bits, and at M = 500 against the code length. Methods: random-hyperplane
LSH, BoostSSC (boosting, Sec. 3.3.1, in the variant the survey uses: Torralba et al.'s
equal weights alpha_l = alpha, so the codes are compared by plain Hamming distance), RBM + NCA (Sec. 3.3.2), spectral hashing (Sec. 4.2),
KLSH with an RBF kernel (Sec. 4.3) and ITQ. Two ground truths, and each supervised method
is trained for the ground truth it is scored on:

* ``euclidean``: the 50 Euclidean nearest neighbours in the database; supervised methods
  train on pairs labelled by the Euclidean threshold that gives each point 50 neighbours
  on average;
* ``label``: the 50 Euclidean-nearest database items *of the query's own class* (labels
  stand in for the survey's object-label histograms); supervised methods train on labels.

Fig. 16 (top left): how many linear-scan neighbours (the exact ranking under the RBF kernel,
which is the Euclidean ranking) are needed to cover KLSH's first 10 / 20 / 30 Hamming
neighbours: the fraction of KLSH's top-k inside the top-N of the linear scan, per N.

LSH is the survey's (§4.1, Charikar): i.i.d. N(0, I) hyperplanes through the origin; the
library's default (orthogonal, centred) runs as an extra, named row. The claims (Fig. 11b at
32 bits, learned codes above LSH) are paired over ``claim_seeds`` model seeds on one split.

Data are scaled to [0, 1] (pixels / max); queries are held out at random; every method is
fitted on the database only. The fit -> encode -> measure loop is
:func:`hashlearn.experiments.pipeline.run_specs`. The Fig. 2 timing table is
``bench/survey_timing.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np

from hashlearn.codes import hamming_cdist
from hashlearn.evaluate import exact_knn, hamming_ranking
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
    recall_at_m_curve,
    reproduction,
    rows_as_run,
    run_specs,
    summarize,
    write_claims,
)

__all__ = ["run", "label_neighbors", "specs"]

N_TRUE = 50
M_CURVE = np.unique(np.r_[np.arange(1, 10), np.geomspace(10, 1000, 40).astype(int), 500])
TRUTHS = ("euclidean", "label")
PAPER = "Grauman & Fergus 2013 (survey)"


def label_neighbors(db, q, y_db, y_q, k: int = N_TRUE) -> np.ndarray:
    """The ``k`` Euclidean-nearest database items of each query's own class (label truth)."""
    out = np.full((len(q), k), -1, np.int64)
    for c in np.unique(y_q):
        rows = np.flatnonzero(y_db == c)
        qi = np.flatnonzero(y_q == c)
        _, ids = exact_knn(db[rows], q[qi], k)
        out[qi] = np.where(ids >= 0, rows[np.maximum(ids, 0)], -1)
    return out


CLAIM_BITS = 32
CLAIMED = ("Boosting (BoostSSC)", "RBM + NCA")


def settings(quick: bool) -> dict:
    """Code lengths of Fig. 11b (quick: 32 bits only) and the model seeds the claims are
    paired over at 32 bits (the first one is the table's)."""
    return {"bits": [32] if quick else [16, 32, 64], "claim_seeds": 2 if quick else 5}


def specs(truth: str, quick: bool) -> list[MethodSpec]:
    """The survey's methods, supervised ones trained for ``truth`` ("euclidean" or "label")."""
    supervision = "labels" if truth == "label" else "neighbors"
    pairs = 5_000 if quick else 100_000
    return [
        *lsh_specs(),
        MethodSpec(
            "Boosting (BoostSSC)",
            "boosted-ssc",
            {"n_pairs": min(pairs, 20_000)},
            supervision=supervision,
            n_neighbors=N_TRUE,
            n_pairs=pairs,
        ),
        MethodSpec(
            "RBM + NCA",
            "rbm",
            {"finetune_epochs": 5 if quick else 30},
            supervision=supervision,
            n_neighbors=N_TRUE,
            n_pairs=min(pairs, 20_000),
        ),
        MethodSpec("KLSH (RBF)", "klsh", {"kernel": "rbf"}),
        MethodSpec("Spectral hashing", "spectral"),
        MethodSpec("ITQ", "itq"),
    ]


def _split(name: str, quick: bool, seed: int, data_dir, data=None) -> Split:
    X, y = load_real(name, data_dir) if data is None else data
    X = np.asarray(X, np.float64) / float(np.max(X))
    rng = np.random.RandomState(seed)
    if name == "fashion-mnist":
        keep = np.sort(rng.choice(len(X), 5200 if quick else 21000, replace=False))
        X, y = X[keep], y[keep]
        n_queries = 200 if quick else 1000
    else:
        n_queries = 200 if quick else 300
    split = Split.holdout(X, y, n_queries=n_queries, random_state=seed)
    truth = label_neighbors(split.X_db, split.X_q, split.y_db, split.y_q)
    split = split.with_euclidean_truth(1000, name="euclidean-1000")
    return Split(
        X_db=split.X_db,
        X_q=split.X_q,
        y_db=split.y_db,
        y_q=split.y_q,
        truth={
            "euclidean": split.truth["euclidean-1000"][:, :N_TRUE],
            "euclidean-1000": split.truth["euclidean-1000"],
            "label": truth,
        },
    )


def _coverage(klsh_rank: np.ndarray, scan_rank: np.ndarray, ks, ns) -> np.ndarray:
    """Fraction of KLSH's first k neighbours inside the linear scan's first N, (len ks, len ns)."""
    n_db = int(max(klsh_rank.max(), scan_rank.max())) + 1
    position = np.full((len(scan_rank), n_db), np.iinfo(np.int64).max, np.int64)
    rows = np.arange(len(scan_rank))[:, None]
    position[rows, scan_rank] = np.arange(scan_rank.shape[1])[None, :]
    pos_of_klsh = position[rows, klsh_rank]
    return np.array([[np.mean(pos_of_klsh[:, :k] < n) for n in ns] for k in ks])


def _fig16(split: Split, seed: int) -> tuple[list[int], np.ndarray]:
    klsh = MethodSpec("KLSH", "klsh", {"kernel": "rbf"}).build(32, seed).fit(split.X_db)
    d = hamming_cdist(klsh.encode(split.X_q), klsh.encode(split.X_db), 32)
    ns = [10, 20, 30, 50, 100, 200, 500, 1000]
    cov = _coverage(
        hamming_ranking(d, 30, random_state=seed), split.truth["euclidean-1000"], [10, 20, 30], ns
    )
    return ns, cov


def _claims(ds: str, truth: str, records: list[dict]) -> list[dict]:
    """Fig. 11b at 32 bits: the learned codes retrieve more true neighbours than the
    paper's LSH, paired over model seeds on one split."""
    rows = []
    for method in CLAIMED:
        diffs = paired_differences(records, method, "LSH", "recall@500", bits=CLAIM_BITS)
        rows.append(
            claim(
                PAPER,
                f"{method} above LSH at M = 500, {CLAIM_BITS} bits ({truth} ground truth)",
                ds,
                diffs,
                baseline=specs(truth, False)[0].as_run(),
            )
        )
    return rows


def _more_seeds(split, truth, cfg, opts, ds) -> list[dict]:
    """The claimed methods and the paper's LSH at 32 bits for the claim seeds after the
    first (the first seed's records come from the tables' run)."""
    extra = [opts.seed + i for i in range(1, cfg["claim_seeds"])]
    if not extra:
        return []
    chosen = [s for s in specs(truth, opts.quick) if s.name in ("LSH", *CLAIMED)]
    return run_specs(
        chosen,
        split,
        bits=[CLAIM_BITS],
        seeds=extra,
        measures=[recall_at_m_curve([500], truth=truth)],
        progress=opts.progress,
        desc=f"survey {ds} {truth} claim seeds",
        n_jobs=opts.n_jobs,
    )


@reproduction(settings, needs_labels=True)
def run(out_dir: Path, cfg: dict, opts: RunOptions) -> str:
    """Run Figs. 11 and 16 on digits and Fashion-MNIST (when present), or on your own
    labelled data ``X``, ``y``; write ``survey.json``, ``claims.json`` and the plots into
    ``out_dir``; return markdown."""
    from hashlearn.plots import plot_recall_at_m_panels

    bits_list = cfg["bits"]
    lines = [
        f"## Survey (Grauman & Fergus, Figs. 11, 16){' [quick]' if opts.quick else ''}\n",
        f"Seed {opts.seed}. "
        f"Recall = % of the true {N_TRUE} neighbours among the first M of the Hamming ranking "
        "(random tie order, seeded), averaged over queries. Supervised methods are trained "
        "for the ground truth they are scored on.",
        "",
    ]
    results: dict = {}
    claims = []
    for ds in available_real(opts.data_dir) if opts.X is None else ["your data"]:
        split = _split(
            ds, opts.quick, opts.seed, opts.data_dir, None if opts.X is None else (opts.X, opts.y)
        )
        lines.append(
            f"### {ds}: {len(split.X_db)} database items, {len(split.X_q)} queries, "
            f"d={split.X_db.shape[1]}"
        )
        res = results.setdefault(ds, {})
        panels = {}
        for truth in TRUTHS:
            records = run_specs(
                specs(truth, opts.quick),
                split,
                bits=bits_list,
                seeds=[opts.seed],
                measures=[recall_at_m_curve(M_CURVE, truth=truth)],
                progress=opts.progress,
                desc=f"survey {ds} {truth}",
                n_jobs=opts.n_jobs,
            )
            if CLAIM_BITS in bits_list:
                more = _more_seeds(split, truth, cfg, opts, ds)
                claims += _claims(ds, truth, records + more)
            at500 = summarize(records, "recall@500")
            fit_s = summarize(records, "fit_cpu_s")
            names = list(dict.fromkeys(r["method"] for r in records))
            res[truth] = {
                "at500": {n: {b: at500[(n, b)][0] for b in bits_list} for n in names},
                "fit_cpu_s": {n: {b: fit_s[(n, b)][0] for b in bits_list} for n in names},
                "curves_32": {
                    r["method"]: r["recall_curve"].tolist() for r in records if r["bits"] == 32
                },
            }
            rows = [
                [n]
                + [f"{100 * at500[(n, b)][0]:.1f}" for b in bits_list]
                + [f"{fit_s[(n, 32)][0]:.1f}"]
                for n in names
            ]
            lines += [
                "",
                f"% of true {N_TRUE} NN ({truth} ground truth) retrieved at M = 500, by code "
                "length (Fig. 11b):",
                "",
                markdown_table(
                    ["method"] + [f"{b} bits" for b in bits_list] + ["fit CPU s (32 bits)"], rows
                ),
            ]
            panels[f"{truth} ground truth"] = {
                n: (M_CURVE, np.asarray(c)) for n, c in res[truth]["curves_32"].items()
            }
        png = out_dir / f"survey_fig11_{ds}_32bits.png"
        plot_recall_at_m_panels(panels, png, title=f"Survey Fig. 11a: {ds}, 32 bits")
        lines += ["", f"Fig. 11a curves:\n\n![survey Fig. 11a, {ds}]({png.name})"]
        ns, cov = _fig16(split, opts.seed)
        res["fig16"] = {"N": ns, "coverage": cov.tolist()}
        lines += [
            "",
            "Fig. 16: fraction of KLSH's (RBF, 32 bits) first k Hamming neighbours found "
            "among the first N of the exact linear scan:",
            "",
            markdown_table(
                ["KLSH first k"] + [f"N={n}" for n in ns],
                [[f"k={k}"] + [f"{v:.2f}" for v in cov[i]] for i, k in enumerate([10, 20, 30])],
            ),
            "",
        ]
    write_json(out_dir / "survey.json", results)
    lines[2:2] = [
        "",
        "### Claims",
        "",
        f"Each claim is paired over {cfg['claim_seeds']} model seeds on the same split "
        f"(seeds {opts.seed}..{opts.seed + cfg['claim_seeds'] - 1}); the tables show seed "
        f"{opts.seed}. LSH is the survey's (Sec. 4.1, Charikar): i.i.d. N(0, I) hyperplanes "
        "through the origin; the library's default runs as an extra row.",
        "",
        write_claims(out_dir, claims),
        "",
        "Rows as run for the Euclidean ground truth (library defaults elsewhere; `n_bits` "
        "and `random_state` per column and seed; for the label ground truth the supervised "
        "rows train on the labels instead of pairs):",
        "",
        rows_as_run(specs("euclidean", opts.quick)),
    ]
    return "\n".join(lines) + "\n"
