"""The demo: train every hash family at several code lengths and evaluate it on real data.

:func:`run_demo` is what ``hashlearn demo`` runs. Protocol:

1. **Data.** ``"digits"``: scikit-learn's bundled 8x8 digits (1797 x 64, embedded, no
   download). ``"fashion-mnist"``: Fashion-MNIST from the Debian package
   ``dataset-fashion-mnist`` (``apt-get install -y dataset-fashion-mnist``), 784 pixels.
   Features are scaled to [0, 1] by dividing by their maximum over the whole dataset.
2. **Split** (seeded by ``random_state``). digits: a random permutation gives 300 queries;
   the rest is the database. fashion-mnist: 1000 random queries from the test set; the
   database is the 60,000-image training set. ``n_queries`` overrides the number of queries.
3. **Training.** Each hasher is fitted on a random sample of the database: all of it for
   digits, 10,000 items for fashion-mnist (``n_train`` overrides). Supervised families
   (``cls.supervised``) get the labels of that sample. Every family registered in
   :func:`hashlearn.hashers.available_hashers` is trained at every code length in ``bits``,
   with ``random_state`` where the family takes one.
4. **Search.** Database and queries are encoded; the database codes go into a
   :class:`~hashlearn.index.FlatIndex` and its exact k=10 search over all queries is timed
   (best of several repeats after a warm-up) and reported as queries per second (QPS).
5. **Measures** on the full Hamming distance matrix (:func:`~hashlearn.codes.hamming_cdist`):

   * against the true Euclidean 50 nearest neighbours (:func:`~hashlearn.evaluate.exact_knn`,
     ties by smaller index): recall@M for M in (1, 10, 50, 100, 500, 1000) clipped to the
     database size (Hamming ranking, ties broken at random with the seed); pooled precision
     and recall within Hamming radius <= 2; the pooled precision--recall curve over radii
     R = 0..b and its area (:func:`~hashlearn.evaluate.pr_auc`);
   * against the class labels: mean average precision over the whole Hamming ranking (ties
     at random, seeded) and the k-NN classification error with the relative threshold k=3
     (the 3 nearest non-empty Hamming bins vote).

   A reference row ``"exact euclidean"`` gives the error of exact Euclidean 3-NN
   classification, and as its QPS the speed of the brute-force float64 scan that computed
   the ground truth.
6. **Outputs** in ``out_dir``: ``results.json`` (protocol, dataset sizes, every row with its
   curves), ``results.md`` (a markdown table and a key to its columns), ``pr_curves.png`` and
   ``recall_at_m.png`` (one panel per code length, one colour per hasher in every panel,
   the legend beside the panels).
"""

from __future__ import annotations

import inspect
import json
import os
import platform
import sys
import time
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

from hashlearn import evaluate as ev
from hashlearn._utils.parallel import available_cores
from hashlearn._utils.validation import check_int
from hashlearn.codes import hamming_cdist
from hashlearn.datasets import load_digits, load_fashion_mnist
from hashlearn.hashers import available_hashers, make_hasher
from hashlearn.hashers.base import BaseHasher
from hashlearn.index import FlatIndex
from hashlearn.plots import atomic_path, method_styles, plot_pr_panels, plot_recall_at_m_panels

__all__ = [
    "DATASETS",
    "OUTPUT_FILES",
    "DemoParameterError",
    "column_notes",
    "format_table",
    "run_demo",
]

DATASETS = ("digits", "fashion-mnist")

#: left out of the default run (each takes tens of seconds to minutes to fit on digits at its
#: default settings); ask for them with ``hashers=[...]`` / ``--hashers``.
SLOW_HASHERS = ("kernel-metric-lsh", "metric-lsh", "rbm")
OUTPUT_FILES = ("results.json", "results.md", "pr_curves.png", "recall_at_m.png")
EXACT_ROW = "exact euclidean"

TRUE_K = 50  # relevance = the true Euclidean 50-NN
M_VALUES = (1, 10, 50, 100, 500, 1000)
RADIUS = 2
KNN_K = 3
SEARCH_K = 10
_PLOT_M_MAX = 10_000  # the recall@M plot's grid goes up to this M (or the database size)
_DEFAULTS = {  # dataset -> (n_queries, n_train; None = the whole database)
    "digits": (300, None),
    "fashion-mnist": (1000, 10_000),
}

Progress = Callable[..., Iterable]


class DemoParameterError(ValueError):
    """A parameter of :func:`run_demo` is out of range (raised before any work is done)."""


@dataclass
class _Split:
    X_db: np.ndarray
    y_db: np.ndarray
    X_q: np.ndarray
    y_q: np.ndarray
    train: np.ndarray  # database rows the hashers are fitted on
    feature_max: float


def _check(value: Any, name: str, *, low: int = 1, high: int | None = None) -> int:
    try:
        return check_int(value, name, "run_demo", low=low, high=high)
    except ValueError as exc:
        raise DemoParameterError(str(exc)) from None


def _log(verbose: bool, message: str) -> None:
    if verbose:
        from tqdm import tqdm

        tqdm.write(f"[hashlearn demo] {message}", file=sys.stderr)


# ---------------------------------------------------------------------------------- data


def _load(
    dataset: str, data_dir: str | os.PathLike | None
) -> tuple[np.ndarray, np.ndarray, np.ndarray | None]:
    """Features, labels, and the rows queries are drawn from (None: any row)."""
    if dataset == "digits":
        X, y = load_digits()
        return X, y, None
    X_train, y_train = load_fashion_mnist(data_dir, subset="train")
    X_test, y_test = load_fashion_mnist(data_dir, subset="test")
    pool = np.arange(len(X_train), len(X_train) + len(X_test))
    return np.concatenate([X_train, X_test]), np.concatenate([y_train, y_test]), pool


def _split(
    dataset: str,
    n_queries: int | None,
    n_train: int | None,
    data_dir: str | os.PathLike | None,
    rng: np.random.RandomState,
) -> _Split:
    """Scale to [0, 1], draw the queries, the database and the training sample (seeded)."""
    X, y, pool = _load(dataset, data_dir)
    default_q, default_train = _DEFAULTS[dataset]
    if pool is None:  # digits: queries and database from one permutation
        n_q = _check(default_q if n_queries is None else n_queries, "n_queries", high=len(X) - 1)
        perm = rng.permutation(len(X))
        q_rows, db_rows = np.sort(perm[:n_q]), np.sort(perm[n_q:])
    else:  # fashion-mnist: queries from the test set, database = the training set
        n_q = _check(default_q if n_queries is None else n_queries, "n_queries", high=len(pool))
        q_rows = np.sort(rng.choice(pool, n_q, replace=False))
        db_rows = np.arange(pool[0])
    n_db = len(db_rows)
    if n_train is None:
        n_train = n_db if default_train is None else min(default_train, n_db)
    n_fit = _check(n_train, "n_train", high=n_db)
    train = np.arange(n_db) if n_fit == n_db else np.sort(rng.choice(n_db, n_fit, replace=False))
    feature_max = float(X.max()) or 1.0
    X = X / np.float32(feature_max)
    return _Split(X[db_rows], y[db_rows], X[q_rows], y[q_rows], train, feature_max)


# ---------------------------------------------------------------------------- one run


def _make(name: str, n_bits: int, random_state: int, verbose: bool):
    """``make_hasher`` with ``random_state`` / ``verbose`` where the family takes them."""
    params = inspect.signature(available_hashers()[name]).parameters
    extra: dict[str, Any] = {"random_state": random_state} if "random_state" in params else {}
    if "verbose" in params:  # passed as the family's own type (bool, or an int level)
        default = params["verbose"].default
        extra["verbose"] = int(verbose) if type(default) is int else bool(verbose)
    return make_hasher(name, n_bits=n_bits, **extra)


def _queries_per_second(
    index: FlatIndex, queries: np.ndarray, k: int, min_time: float = 0.2, max_repeats: int = 20
) -> float:
    """Best-of-repeats throughput of ``index.search`` over all ``queries`` (after a warm-up)."""
    index.search(queries[:1], k)  # compile / load the kernels outside the timing
    best, spent, repeats = np.inf, 0.0, 0
    while repeats < 3 or (spent < min_time and repeats < max_repeats):
        start = time.perf_counter()
        index.search(queries, k)
        elapsed = time.perf_counter() - start
        best, spent, repeats = min(best, elapsed), spent + elapsed, repeats + 1
    return len(queries) / max(best, 1e-9)


def _evaluate_run(
    name: str,
    supervised: bool,
    n_bits: int,
    data: _Split,
    truth: dict,
    random_state: int,
    verbose: bool,
    stage: Callable[[str], None] = lambda _: None,
) -> dict[str, Any]:
    """Fit, encode, index, time and measure one (hasher, n_bits); ``stage(text)`` is told
    each step as it starts (the progress bar shows it)."""
    hasher = _make(name, n_bits, random_state, verbose)
    stage("fit")
    start = time.perf_counter()
    hasher.fit(data.X_db[data.train], data.y_db[data.train] if supervised else None)
    fit_s = time.perf_counter() - start
    stage("encode")
    start = time.perf_counter()
    db_codes, q_codes = hasher.encode(data.X_db), hasher.encode(data.X_q)
    encode_s = time.perf_counter() - start
    stage("search")
    index = FlatIndex(n_bits)
    index.add(db_codes)
    qps = _queries_per_second(index, q_codes, min(SEARCH_K, len(index)))

    stage("measure")
    dist = hamming_cdist(q_codes, db_codes, n_bits)
    m_grid = truth["m_grid"]
    recall_curve = ev.recall_at_m(dist, truth["neighbors"], m_grid, random_state=random_state)
    recall_of = dict(zip(m_grid.tolist(), recall_curve.tolist(), strict=True))
    p_r, r_r = ev.precision_recall_at_radius(dist, truth["knn_relevant"], RADIUS)
    precision, recall = ev.precision_recall_curve(dist, truth["knn_relevant"], n_bits)
    row: dict[str, Any] = {
        "hasher": name,
        "n_bits": n_bits,
        "supervised": supervised,
        "true_k": int(truth["neighbors"].shape[1]),
        "fit_s": fit_s,
        "encode_s": encode_s,
        "qps": qps,
        **{f"recall@{m}": recall_of[m] for m in truth["m_values"]},
        f"precision@r<={RADIUS}": p_r,
        f"recall@r<={RADIUS}": r_r,
        "pr_auc": ev.pr_auc(precision, recall),
        "map": ev.mean_average_precision(
            dist, truth["label_relevant"], ties="random", random_state=random_state
        ),
        f"knn{KNN_K}_error": ev.knn_classification_error(dist, data.y_db, data.y_q, k=KNN_K),
        "curves": {
            "pr": {
                "radius": list(range(n_bits + 1)),
                "precision": precision.tolist(),
                "recall": recall.tolist(),
            },
            "recall_at_m": {"m": m_grid.tolist(), "recall": recall_curve.tolist()},
        },
    }
    _log(
        verbose,
        f"{name} {n_bits} bits: recall@{TRUE_K}={recall_of.get(TRUE_K, np.nan):.3f} "
        f"mAP={row['map']:.3f} fit {fit_s:.2f}s",
    )
    return row


def _ground_truth(data: _Split, verbose: bool) -> tuple[dict, dict[str, Any]]:
    """True Euclidean neighbours, relevance matrices, and the exact reference row."""
    n_db = len(data.X_db)
    k_true = min(TRUE_K, n_db)
    _log(verbose, f"exact Euclidean {k_true}-NN of {len(data.X_q)} queries in {n_db} items")
    start = time.perf_counter()
    _, neighbors = ev.exact_knn(data.X_db, data.X_q, k_true)
    exact_s = time.perf_counter() - start
    m_values = sorted({min(m, n_db) for m in M_VALUES})
    grid = np.geomspace(1, min(n_db, _PLOT_M_MAX), 40).round().astype(np.int64)
    truth = {
        "neighbors": neighbors,
        "knn_relevant": ev.relevance_from_neighbors(neighbors, n_db),
        "label_relevant": ev.relevance_from_labels(data.y_q, data.y_db),
        "m_values": m_values,
        "m_grid": np.union1d(grid, m_values),
    }
    predicted = ev.knn_classify_exact(data.X_db, data.y_db, data.X_q, k=KNN_K)
    exact_row = {
        "hasher": EXACT_ROW,
        "n_bits": None,
        "supervised": False,
        "qps": len(data.X_q) / max(exact_s, 1e-9),
        f"knn{KNN_K}_error": float(np.mean(predicted != data.y_q)),
    }
    return truth, exact_row


# ------------------------------------------------------------------------------ output

_COLUMNS = (  # (row key or key prefix, header, format)
    ("hasher", "hasher", "{}"),
    ("n_bits", "bits", "{}"),
    ("fit_s", "fit s", "{:.2f}"),
    ("qps", "QPS (k=10)", "{:,.0f}"),
    ("recall@", "R@{}", "{:.3f}"),
    (f"precision@r<={RADIUS}", f"P(r<={RADIUS})", "{:.3f}"),
    (f"recall@r<={RADIUS}", f"R(r<={RADIUS})", "{:.3f}"),
    ("pr_auc", "PR AUC", "{:.3f}"),
    ("map", "mAP", "{:.3f}"),
    (f"knn{KNN_K}_error", f"{KNN_K}-NN err", "{:.3f}"),
)


def column_notes(rows: Sequence[dict[str, Any]] = ()) -> str:
    """A key to :func:`format_table`'s columns, with the bounds that follow from the protocol.

    The number of true neighbours is read from the rows (``"true_k"``; default 50).
    """
    true_k = next((int(r["true_k"]) for r in rows if r.get("true_k")), TRUE_K)
    m_values = sorted(
        {int(k[7:]) for row in rows for k in row if k.startswith("recall@") and k[7:].isdigit()}
    ) or list(M_VALUES)
    bounds = ", ".join(f"R@{m} <= {min(m, true_k) / true_k:.3g}" for m in m_values if m < true_k)
    lines = [
        "Columns:",
        "  bits        code length; fit s = training time of the hasher (seconds, this machine).",
        f"  QPS (k={SEARCH_K})  queries per second of an exact FlatIndex k={SEARCH_K} Hamming "
        "search; for the",
        "              exact row, the brute-force float64 scan that computed the ground truth.",
        f"  R@M         share of each query's true {true_k} Euclidean nearest neighbours found "
        "among the",
        "              first M items of the Hamming ranking (ties in random order), averaged.",
        f"              M items hold at most M of the {true_k} neighbours, so a perfect ranking "
        f"scores R@M = M/{true_k}",
        f"              below M = {true_k} ({bounds}); only R@M with M >= {true_k} can reach 1.",
        f"  P(r<={RADIUS}), R(r<={RADIUS})  precision and recall of those neighbours among the "
        f"items within Hamming",
        f"              radius {RADIUS} of the query, pooled over all queries.",
        "  PR AUC      area under that precision-recall curve traced over radii 0..bits.",
        "  mAP         mean average precision of the Hamming ranking with 'same class label' as "
        "relevant.",
        f"  {KNN_K}-NN err   classification error when the {KNN_K} nearest non-empty Hamming "
        "distance bins vote;",
        f"              the exact row gives exact Euclidean {KNN_K}-NN for comparison.",
        "Higher is better everywhere except fit s and the error.",
    ]
    return "\n".join(lines)


def format_table(rows: Sequence[dict[str, Any]], *, notes: bool = True) -> str:
    """The rows as a markdown table (recall@M columns for every M the rows carry), followed
    by a key to the columns (:func:`column_notes`) unless ``notes=False``."""
    recall_keys = sorted(
        {key for row in rows for key in row if key.startswith("recall@") and key[7:].isdigit()},
        key=lambda key: int(key[7:]),
    )
    columns = []
    for key, header, fmt in _COLUMNS:
        if key == "recall@":
            columns += [(k, header.format(k[7:]), fmt) for k in recall_keys]
        else:
            columns.append((key, header, fmt))
    lines = [
        "| " + " | ".join(header for _, header, _ in columns) + " |",
        "|:---|" + "---:|" * (len(columns) - 1),
    ]
    for row in rows:
        cells = ["–" if row.get(key) is None else fmt.format(row[key]) for key, _, fmt in columns]
        lines.append("| " + " | ".join(cells) + " |")
    if notes:
        lines += ["", column_notes(rows)]
    return "\n".join(lines)


def _hasher_styles(names) -> dict[str, dict]:
    """One colour per hasher of the run, by sorted name: the same in every panel and in both
    figures, and the most distinct palette colours for the hashers actually shown."""
    return method_styles(sorted(set(names)))


def _write_outputs(out: Path, rows: list[dict[str, Any]], meta: dict[str, Any]) -> None:
    out.mkdir(parents=True, exist_ok=True)
    with atomic_path(out / "results.json") as tmp:
        tmp.write_text(json.dumps({**meta, "rows": rows}, indent=2) + "\n")
    p = meta["protocol"]
    sizes = meta["dataset"]
    md = [
        f"# hashlearn demo: {sizes['name']}",
        "",
        f"{sizes['n_queries']} queries, {sizes['n_database']} database items, "
        f"{sizes['n_features']} features scaled to [0, 1]; hashers fitted on "
        f"{sizes['n_train']} database items; seed {p['random_state']}.",
        "",
        format_table(rows, notes=False),
        "",
        "```",
        column_notes(rows),
        "```",
        "",
        "Figures: `pr_curves.png` (precision-recall over Hamming radius) and "
        "`recall_at_m.png` (R@M for every M), one panel per code length.",
        "",
    ]
    with atomic_path(out / "results.md") as tmp:
        tmp.write_text("\n".join(md))
    runs = [row for row in rows if row["hasher"] != EXACT_ROW]
    by_hasher = _hasher_styles(row["hasher"] for row in runs)

    def name_of(row):
        return f"{row['hasher']} (supervised)" if row["supervised"] else row["hasher"]

    styles = {
        name_of(row): by_hasher.get(row["hasher"], {}) for row in runs if row["hasher"] in by_hasher
    } or None
    where = f"{sizes['name']}: {sizes['n_queries']} queries, {sizes['n_database']} items"
    panel = "{} bits".format
    pr_panels: dict[str, dict] = {}
    recall_panels: dict[str, dict] = {}
    reference: dict[str, dict] = {}
    for row in runs:
        key = panel(row["n_bits"])
        pr = row["curves"]["pr"]
        pr_panels.setdefault(key, {})[name_of(row)] = (pr["precision"], pr["recall"])
        rm = row["curves"]["recall_at_m"]
        recall_panels.setdefault(key, {})[name_of(row)] = (rm["m"], rm["recall"])
        m_grid = np.asarray(rm["m"])
        reference[key] = {
            "exact Euclidean ranking": (m_grid, np.minimum(m_grid, p["true_k"]) / p["true_k"])
        }
    if not runs:
        return
    plot_pr_panels(
        pr_panels,
        out / "pr_curves.png",
        f"Precision-recall over Hamming radius 0..bits, relevant = true Euclidean "
        f"{p['true_k']}-NN ({where})",
        styles=styles,
    )
    plot_recall_at_m_panels(
        recall_panels,
        out / "recall_at_m.png",
        f"Recall of the true Euclidean {p['true_k']}-NN among the first M of the Hamming "
        f"ranking ({where})",
        reference=reference,
        styles=styles,
    )


# --------------------------------------------------------------------------------- main


def _selected_hashers(hashers: Sequence[str] | None) -> dict[str, type[BaseHasher]]:
    """``name -> class`` of the hashers to run: the named ones (checked), or every registered
    hasher but :data:`SLOW_HASHERS`."""
    registered = available_hashers()
    if hashers is None:
        hashers = [name for name in registered if name not in SLOW_HASHERS]
    elif isinstance(hashers, str) or not hashers or any(h not in registered for h in hashers):
        raise DemoParameterError(
            f"The 'hashers' parameter of run_demo must be a non-empty "
            f"list of names from {sorted(registered)}. Got {hashers!r} "
            "instead."
        )
    return {name: registered[name] for name in dict.fromkeys(hashers)}


def _run_meta(dataset, data, truth, bits, hashers, random_state) -> dict[str, Any]:
    """The data set, protocol and machine of a run, for ``results.json``."""
    from hashlearn import __version__

    meta = {
        "hashlearn_version": __version__,
        "dataset": {
            "name": dataset,
            "n_features": int(data.X_db.shape[1]),
            "n_database": len(data.X_db),
            "n_queries": len(data.X_q),
            "n_train": len(data.train),
            "n_classes": int(len(np.unique(data.y_db))),
            "feature_max": data.feature_max,
        },
        "protocol": {
            "bits": bits,
            "hashers": list(hashers),
            "random_state": random_state,
            "true_k": min(TRUE_K, len(data.X_db)),
            "m_values": truth["m_values"],
            "radius": RADIUS,
            "knn_k": KNN_K,
            "search_k": SEARCH_K,
            "index": "flat",
            "scaling": "divide by the maximum feature value",
            "ties": "random, seeded with random_state",
        },
        "machine": {"cores": available_cores(), "python": platform.python_version()},
    }
    return meta


def run_demo(
    dataset: str = "digits",
    bits: Sequence[int] = (16, 32, 64),
    out_dir: str | os.PathLike = "demo-out",
    n_queries: int | None = None,
    n_train: int | None = None,
    random_state: int = 0,
    verbose: bool = False,
    progress: Progress | None = None,
    data_dir: str | os.PathLike | None = None,
    hashers: Sequence[str] | None = None,
) -> list[dict[str, Any]]:
    """Train every registered hasher at every code length in ``bits`` and evaluate it.

    See the module docstring for the protocol. Returns one row (a dict of measures, with the
    curves under ``"curves"``) per (hasher, n_bits), then the ``"exact euclidean"`` reference
    row, and writes :data:`OUTPUT_FILES` to ``out_dir``.

    ``progress`` wraps the iterable of runs, called as ``progress(runs, total=n, desc=...)``
    (``tqdm.tqdm`` fits; ``verbose=True`` without it uses tqdm). ``data_dir`` is the
    Fashion-MNIST directory (default: the Debian package's). ``hashers`` restricts the run to
    those registry names (default: every registered hasher but :data:`SLOW_HASHERS`). A missing dataset raises
    ``FileNotFoundError`` naming ``apt-get install -y dataset-fashion-mnist``. Parameters out
    of range raise :class:`DemoParameterError` (a ``ValueError``) before any training.
    """
    if dataset not in DATASETS:
        raise DemoParameterError(
            f"The 'dataset' parameter of run_demo must be one of "
            f"{list(DATASETS)}. Got {dataset!r} instead."
        )
    if isinstance(bits, int | str) or len(bits) == 0:
        raise DemoParameterError(
            f"The 'bits' parameter of run_demo must be a non-empty "
            f"sequence of ints >= 1. Got {bits!r} instead."
        )
    bits = list(dict.fromkeys(_check(b, "bits") for b in bits))
    random_state = _check(random_state, "random_state", low=0)
    rng = np.random.RandomState(random_state)

    started = time.perf_counter()
    _log(verbose, f"loading {dataset}")
    data = _split(dataset, n_queries, n_train, data_dir, rng)
    truth, exact_row = _ground_truth(data, verbose)
    selected = _selected_hashers(hashers)
    runs = [(name, b) for name in selected for b in bits]
    if progress is None and verbose:
        from tqdm import tqdm

        progress = tqdm
    iterator = runs if progress is None else progress(runs, total=len(runs), desc="demo")
    rows = []
    for name, n_bits in iterator:

        def stage(step: str, name=name, n_bits=n_bits) -> None:
            if hasattr(iterator, "set_postfix_str"):  # a tqdm bar: show the step, redrawn now
                iterator.set_postfix_str(f"{name} {n_bits} bits: {step}", refresh=True)

        rows.append(
            _evaluate_run(
                name,
                bool(selected[name].supervised),
                n_bits,
                data,
                truth,
                random_state,
                verbose,
                stage,
            )
        )
    rows.append(exact_row)

    meta = _run_meta(dataset, data, truth, bits, list(selected), random_state)
    meta["elapsed_s"] = time.perf_counter() - started
    _write_outputs(Path(out_dir), rows, meta)
    _log(verbose, f"wrote {', '.join(OUTPUT_FILES)} to {out_dir}")
    return rows
