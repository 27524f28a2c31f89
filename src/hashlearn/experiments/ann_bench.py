"""The ann-benchmarks recall-QPS sweep, run locally: ``hashlearn bench ann FILE.hdf5``.

:class:`HashlearnANN` has the ann-benchmarks harness's ``fit`` / ``set_query_arguments`` /
``query`` / ``batch_query`` / ``get_batch_results`` methods and runs the same algorithms as
the plug-in in ``contrib/ann_benchmarks/`` (``hashlearn-lsh-mih`` / ``-flat``, ``hashlearn-mih``
/ ``-flat``; the plug-in is self-contained so that it can be copied into an ann-benchmarks
checkout, and re-ranks through :class:`hashlearn.Searcher`):

* **Hamming datasets** (ann-benchmarks stores them as unpacked booleans, metric
  ``"hamming"``): the rows are packed into binary codes and searched *exactly* with
  :class:`~hashlearn.index.mih.MultiIndexHashing` (or FlatIndex); one query setting.
* **Euclidean / angular datasets**: a :class:`hashlearn.Searcher` -- random-hyperplane LSH
  codes in the index, the ``n_candidates`` nearest codes re-ranked by the exact distance on
  the original vectors (unit vectors for angular); the sweep runs over ``n_candidates``.

:func:`sweep` times every setting (queries one at a time, as ann-benchmarks does, and in a
batch), computes recall@k against the file's ground truth (ann-benchmarks' convention: a
returned item counts when its true distance is within the k-th true distance + 1e-3), and
writes a table, a JSON file and a recall-QPS plot.
"""

from __future__ import annotations

import json
import time
from pathlib import Path

import numpy as np

from hashlearn.codes import pack_bits
from hashlearn.experiments.pipeline import RunOptions, claim, reproduction, write_claims
from hashlearn.hashers.lsh import RandomHyperplaneLSH
from hashlearn.index.flat import FlatIndex
from hashlearn.index.mih import MultiIndexHashing
from hashlearn.search import Searcher

__all__ = ["HashlearnANN", "check_k", "sweep", "run_file", "query_argument_groups"]

_INDEXES = {"mih": MultiIndexHashing, "flat": FlatIndex}


class HashlearnANN:
    """A hashlearn index in the shape ann-benchmarks expects (see the module docstring).

    Parameters
    ----------
    metric : {"hamming", "euclidean", "angular"}
    index : {"mih", "flat"}
        Binary index holding the codes.
    n_bits : int
        Code length for vector datasets (Hamming datasets use their own dimension).
    """

    def __init__(self, metric: str, index: str = "mih", n_bits: int = 64):
        if metric not in ("hamming", "euclidean", "angular"):
            raise ValueError(f"metric must be 'hamming', 'euclidean' or 'angular'. Got {metric!r}.")
        if index not in _INDEXES:
            raise ValueError(f"index must be one of {sorted(_INDEXES)}. Got {index!r}.")
        self.metric, self.index_name, self.n_bits = metric, index, int(n_bits)
        self.n_candidates = 100
        self._results: np.ndarray | None = None
        self.name = f"hashlearn-{index}({metric}, {n_bits})"

    def fit(self, X: np.ndarray) -> None:
        index = _INDEXES[self.index_name]
        if self.metric == "hamming":
            self.n_bits = X.shape[1]
            self._searcher = None
            self._index = index(self.n_bits)
            self._index.add(pack_bits(np.asarray(X).astype(np.uint8) != 0))
        else:
            X = self._vectors(X)
            hasher = RandomHyperplaneLSH(self.n_bits, random_state=0)
            self._searcher = Searcher(hasher, index(self.n_bits), rerank="sqeuclidean")
            self._searcher.fit(X[np.random.default_rng(0).permutation(len(X))[:20_000]])
            self._searcher.add(X)
            self._index = self._searcher.index
        if hasattr(self._index, "build"):
            self._index.build()

    def set_query_arguments(self, n_candidates: int = 100) -> None:
        self.n_candidates = int(n_candidates)
        if self.metric == "hamming":  # exact search: nothing to tune
            self.name = f"hashlearn-{self.index_name}(hamming, {self.n_bits}, exact)"
        else:
            self.name = (
                f"hashlearn-{self.index_name}({self.metric}, {self.n_bits}, "
                f"n_candidates={self.n_candidates})"
            )

    def _vectors(self, X: np.ndarray) -> np.ndarray:
        """float32 rows; unit length for the angular metric (its ranking is then the
        squared-Euclidean one the Searcher re-ranks by)."""
        X = np.ascontiguousarray(X, np.float32)
        if self.metric == "angular":
            X = X / np.maximum(np.linalg.norm(X, axis=1, keepdims=True), 1e-30)
        return X

    def _search(self, Q: np.ndarray, n: int, n_threads: int | None) -> np.ndarray:
        if self._searcher is None:  # Hamming data: the index's exact search
            codes = pack_bits(np.asarray(Q).astype(np.uint8) != 0)
            return self._index.search(codes, n, n_threads=n_threads)[1]
        self._searcher.n_candidates = max(n, self.n_candidates)
        return self._searcher.search(self._vectors(Q), n, n_threads=n_threads)[1]

    def query(self, v: np.ndarray, n: int) -> np.ndarray:
        ids = self._search(np.asarray(v)[None, :], n, 1)[0]
        return ids[ids >= 0]

    def batch_query(self, X: np.ndarray, n: int) -> None:
        self._results = self._search(X, n, None)

    def get_batch_results(self) -> list[np.ndarray]:
        if self._results is None:
            raise RuntimeError("get_batch_results() needs a batch_query() first.")
        return [row[row >= 0] for row in self._results]

    def __str__(self) -> str:
        return self.name


def query_argument_groups(metric: str) -> list[int]:
    """The ``n_candidates`` settings swept (one setting for exact Hamming search)."""
    return [0] if metric == "hamming" else [10, 20, 50, 100, 200, 500, 1000]


def _true_distances(metric, train, test, ids):
    safe = np.maximum(ids, 0)
    if metric == "hamming":
        a, b = train[safe].astype(bool), test[:, None, :].astype(bool)
        d = (a != b).sum(axis=2).astype(np.float64)
    else:
        tr, te = train.astype(np.float32), test.astype(np.float32)
        if metric == "angular":
            tr = tr / np.maximum(np.linalg.norm(tr, axis=1, keepdims=True), 1e-30)
            te = te / np.maximum(np.linalg.norm(te, axis=1, keepdims=True), 1e-30)
            d = 1.0 - np.einsum("bcd,bd->bc", tr[safe], te)
        else:
            d = np.sqrt(((tr[safe] - te[:, None, :]) ** 2).sum(axis=2))
    d[ids < 0] = np.inf
    return d


def recall_at_k(metric, train, test, found, true_distances, k, epsilon=1e-3):
    """ann-benchmarks' recall: found items within the k-th true distance (+ epsilon)."""
    d = _true_distances(metric, train, test, found[:, :k])
    threshold = true_distances[:, k - 1][:, None] + epsilon
    return float(np.mean((d <= threshold).sum(axis=1) / k))


def check_k(dataset, k: int, name: str = "the file") -> None:
    """Refuse ``k`` beyond the file's ground truth: recall@k needs each query's k-th true
    distance, and the file lists only ``neighbors.shape[1]`` (clipping would measure
    another k than the one asked for, so it is an error, not a warning)."""
    width = dataset.neighbors.shape[1]
    if k > width:
        raise ValueError(
            f"k={k} exceeds the {width} ground-truth neighbours per query in {name} "
            f"(recall@k needs the k-th true distance); use k <= {width}."
        )


def sweep(
    dataset,
    *,
    index: str = "mih",
    n_bits: int = 64,
    k: int = 10,
    n_queries: int | None = None,
    progress=None,
) -> list[dict]:
    """Build once, then time each query setting; one row per setting. ``progress``: the
    pipeline's tqdm-like factory ``progress(total=, desc=)``, advanced once per setting."""
    metric = dataset.distance.lower()
    if metric not in ("hamming", "euclidean", "angular"):
        raise ValueError(f"unsupported ann-benchmarks distance {dataset.distance!r}.")
    check_k(dataset, k)
    test = dataset.test if n_queries is None else dataset.test[:n_queries]
    true_d = dataset.distances[: len(test)].astype(np.float64)
    if metric == "hamming":  # ann-benchmarks stores Jaccard-style fractions for some sets
        true_d = _true_distances(metric, dataset.train, test, dataset.neighbors[: len(test)])
    algo = HashlearnANN(metric, index, n_bits)
    start = time.perf_counter()
    algo.fit(dataset.train)
    build_s = time.perf_counter() - start
    rows = []
    settings = query_argument_groups(metric)
    bar = progress(total=len(settings), desc=f"ann {metric}") if progress else None
    for n_candidates in settings:
        algo.set_query_arguments(max(n_candidates, k))
        start = time.perf_counter()
        single = np.full((len(test), k), -1, np.int64)
        for i, v in enumerate(test):
            got = algo.query(v, k)
            single[i, : len(got)] = got
        single_s = time.perf_counter() - start
        start = time.perf_counter()
        algo.batch_query(test, k)
        batch_s = time.perf_counter() - start
        batch = algo._results
        rows.append(
            {
                "algorithm": str(algo),
                "n_candidates": n_candidates if metric != "hamming" else 0,
                "recall": round(recall_at_k(metric, dataset.train, test, single, true_d, k), 4),
                "recall_batch": round(
                    recall_at_k(metric, dataset.train, test, batch, true_d, k), 4
                ),
                "QPS": round(len(test) / single_s, 1),
                "batch_QPS": round(len(test) / batch_s, 1),
                "build_s": round(build_s, 2),
            }
        )
        if bar is not None:
            bar.update(1)
    if bar is not None:
        bar.close()
    return rows


def _plot(rows, path: Path, title: str) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hashlearn.plots import atomic_path

    fig, ax = plt.subplots(figsize=(6, 4))
    for key, label in (("QPS", "one query at a time"), ("batch_QPS", "batched")):
        pts = sorted((r["recall"], r[key]) for r in rows)
        ax.plot(*zip(*pts, strict=True), marker="o", label=label)
    ax.set_yscale("log")
    ax.set_xlabel("recall@k")
    ax.set_ylabel("queries per second")
    ax.set_title(title)
    ax.legend()
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def run_file(
    path,
    out_dir,
    *,
    index: str = "mih",
    n_bits: int = 64,
    k: int = 10,
    n_queries: int | None = None,
    progress=None,
) -> str:
    """Sweep one ann-benchmarks HDF5 file; write ``ann_<name>.{md,json,png}`` to out_dir."""
    from hashlearn.datasets import load_ann_benchmarks
    from hashlearn.experiments._common import markdown_table

    path, out_dir = Path(path), Path(out_dir)
    dataset = load_ann_benchmarks(path)
    check_k(dataset, k, path.name)  # before any work
    out_dir.mkdir(parents=True, exist_ok=True)
    rows = sweep(dataset, index=index, n_bits=n_bits, k=k, n_queries=n_queries, progress=progress)
    stem = f"ann_{path.stem}"
    (out_dir / f"{stem}.json").write_text(json.dumps(rows, indent=1))
    _plot(rows, out_dir / f"{stem}.png", f"{path.name}: recall@{k} vs QPS")
    cols = list(rows[0])
    md = "\n".join(
        [
            f"ann-benchmarks sweep of `{path.name}` ({dataset.distance}, {len(dataset.train):,} "
            f"train, {len(dataset.test) if n_queries is None else n_queries} queries, k={k}).",
            "",
            markdown_table(cols, [[r[c] for c in cols] for r in rows]),
            "",
            f"![recall-QPS]({stem}.png)",
        ]
    )
    (out_dir / f"{stem}.md").write_text(md + "\n")
    return md


def _write_demo_file(
    path: Path, *, metric: str, n: int = 20_000, n_test: int = 200, d: int = 64, seed: int = 0
) -> Path:
    """A small ann-benchmarks-format HDF5 file (clustered data) with exact ground truth."""
    rng = np.random.default_rng(seed)
    centres = rng.normal(size=(50, d))
    X = centres[rng.integers(0, 50, n + n_test)] + 0.3 * rng.normal(size=(n + n_test, d))
    return write_ann_file(path, X > 0 if metric == "hamming" else X, n_test, metric)


def write_ann_file(path: Path, X: np.ndarray, n_test: int, metric: str) -> Path:
    """The last ``n_test`` rows of ``X`` as the queries of an ann-benchmarks HDF5 file at
    ``path`` with exact 100-NN ground truth (``metric``: "hamming" for boolean rows, or
    "euclidean")."""
    import h5py

    from hashlearn.evaluate import exact_knn

    train, test = X[:-n_test], X[-n_test:]
    k = min(100, len(train))
    if metric == "hamming":
        dist = (test[:, None, :] != train[None, :, :]).sum(axis=2)
        nbrs = np.argsort(dist, axis=1, kind="stable")[:, :k]
        dists = np.take_along_axis(dist, nbrs, 1).astype(np.float32)
    else:
        train, test = train.astype(np.float32), test.astype(np.float32)
        dists, nbrs = exact_knn(train, test, k, "euclidean")
    with h5py.File(path, "w") as f:
        f.attrs["distance"] = metric
        f.attrs["type"] = "dense"
        f.create_dataset("train", data=train)
        f.create_dataset("test", data=test)
        f.create_dataset("neighbors", data=np.asarray(nbrs, np.int32))
        f.create_dataset("distances", data=np.asarray(dists, np.float32))
    return path


def settings(quick: bool) -> dict:
    """Sizes of the synthetic files and queries (quick: 5000 items, 100 queries)."""
    return {"n": 5_000, "n_queries": 100} if quick else {"n": 100_000, "n_queries": None}


@reproduction(settings)
def run(out_dir: Path, cfg: dict, opts: RunOptions) -> str:
    """Experiment entry point: the sweep on synthetic ann-benchmarks files (Hamming and
    Euclidean) written into ``out_dir``, or on your vectors ``X`` (Euclidean, the last 10 %
    of the rows as queries; a file of yours: ``hashlearn bench ann FILE.hdf5``); writes
    ``claims.json`` beside the tables."""
    parts, claims = [], []
    for metric in ("hamming", "euclidean") if opts.X is None else ("euclidean",):
        path = out_dir / f"synthetic-{metric}.hdf5"
        if opts.X is None:
            _write_demo_file(path, metric=metric, n=cfg["n"], seed=opts.seed)
        else:
            path = write_ann_file(
                out_dir / "your-data.hdf5", opts.X, max(1, len(opts.X) // 10), metric
            )
        parts.append(run_file(path, out_dir, n_queries=cfg["n_queries"], progress=opts.progress))
        rows = json.loads((out_dir / f"ann_{path.stem}.json").read_text())
        recalls = [r["recall"] for r in rows]
        claims.append(
            claim(
                "ann-benchmarks protocol",
                "recall@10 never falls as more candidates are re-ranked",
                path.name,
                min(np.diff(recalls), default=0.0),
                1,
                holds=bool(np.all(np.diff(recalls) >= 0)),
            )
        )
        if metric == "hamming":
            claims.append(
                claim(
                    "ann-benchmarks protocol",
                    "exact Hamming search (MIH) finds the true 10-NN",
                    path.name,
                    max(recalls) - 1.0,
                    1,
                    holds=max(recalls) == 1.0,
                )
            )
        path.unlink()
    table = write_claims(out_dir, claims)
    title = f"## ann-bench: the ann-benchmarks protocol on synthetic sets{' [quick]' if opts.quick else ''}"
    return title + "\n\n### Claims\n\n" + table + "\n\n" + "\n\n".join(parts)
