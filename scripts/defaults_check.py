"""Re-check the orderings of issue 31, point 4, with every hasher at its defaults.

Protocols (one seed unless ``--seeds``):

* ``retrieval`` (Norouzi & Fleet, *Minimal Loss Hashing*, ICML 2011, §6.1): at most
  ``--n-train`` training items (= the database), ``--n-queries`` queries, centred on the
  training mean and scaled to unit length; relevance = Euclidean distance within the
  threshold giving 50 neighbours per training item on average; MLH gets every training pair
  labelled by that threshold; score = per-query precision within Hamming radius <= 3, an
  empty retrieval scoring 0.
* ``knn`` (LambdaRank bit vectors, WWW, Table 4; and the demo): supervised hashers are fitted
  on ``--n-train`` labelled items, the database is every non-query item, the 3 nearest
  non-empty Hamming bins vote; score = k-NN error. RankNet / LambdaRank get ``--rank-epochs``
  epochs (5, as the reproduction; ``0`` = their default), the rest their defaults. Also
  printed: the mean number of database items in the 3 nearest bins (collapse shows there).

Data: scikit-learn's digits, Fashion-MNIST (when installed), the bundled UCI letter (16-d,
26 classes) and Landsat satellite (36-d, 6 classes) sets, and two Gaussian mixtures of their
shapes.

    .venv/bin/python scripts/defaults_check.py retrieval --data gauss16 gauss36 --bits 16 32
    .venv/bin/python scripts/defaults_check.py knn --data digits --bits 16 32 64
"""

from __future__ import annotations

import argparse
import time
import warnings

import numpy as np

from hashlearn.codes import hamming_cdist
from hashlearn.datasets import (
    fashion_mnist_available,
    load_digits,
    load_fashion_mnist,
    load_letter,
    load_satellite,
    make_gaussian_classes,
)
from hashlearn.evaluate import bin_threshold, knn_classification_error, precision_recall_at_radius
from hashlearn.hashers import (
    BinaryReconstructiveEmbedding,
    BoostedSimilarityHashing,
    IterativeQuantization,
    MinimalLossHashing,
    RandomHyperplaneLSH,
    RankHashing,
    SpectralHashing,
)
from hashlearn.supervision import neighbor_threshold, neighbors_within


def gaussian_mixture(n_features, n_classes, separation, n_samples=6000, seed=0):
    """The issue's unseen-style sets (:func:`hashlearn.datasets.make_gaussian_classes`)."""
    return make_gaussian_classes(n_samples, n_features, n_classes, separation, 1000 + seed)


def load(name, seed=0):
    if name == "digits":
        X, y = load_digits()
        return np.asarray(X, np.float64), y
    if name == "fashion":
        if not fashion_mnist_available():
            return None
        X, y = load_fashion_mnist(subset="train")
        rows = np.random.RandomState(seed).permutation(len(X))[:12000]
        return np.asarray(X[rows], np.float64) / 255.0, y[rows]
    if name == "gauss16":
        return gaussian_mixture(16, 26, 0.6, seed=seed)  # exact 3-NN error about 0.09
    if name == "gauss36":
        return gaussian_mixture(36, 6, 0.15, seed=seed)  # exact 3-NN error about 0.07
    if name in ("letter", "satellite"):
        X, y = {"letter": load_letter, "satellite": load_satellite}[name]()
        return np.asarray(X, np.float64), y
    raise ValueError(f"unknown data set {name!r}")


def retrieval_split(X, n_train, n_queries, seed):
    """The §6.1 protocol: ``(A train = database, B queries, pairs, similar, relevant)``."""
    perm = np.random.RandomState(seed).permutation(len(X))
    n_train = min(n_train, len(X) - n_queries)
    A, B = X[perm[:n_train]], X[perm[n_train : n_train + n_queries]]
    mean = A.mean(0)
    A = A - mean
    B = B - mean
    A /= np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    B /= np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1e-12)
    thr = neighbor_threshold(A, 50)
    iu = np.triu_indices(len(A), 1)
    P = np.stack(iu, 1).astype(np.int64)
    s = neighbors_within(A, A, thr)[iu]
    return A, B, P, s, neighbors_within(B, A, thr)


def precision_r3(h, A, B, rel):
    d = hamming_cdist(h.encode(B), h.encode(A), getattr(h, "n_bits_", h.n_bits))
    return precision_recall_at_radius(d, rel, 3, aggregate="per_query")[0]


RETRIEVAL = {
    "MLH": lambda b, s: MinimalLossHashing(b, random_state=s),
    "BRE": lambda b, s: BinaryReconstructiveEmbedding(b, random_state=s),
    "SH": lambda b, s: SpectralHashing(b),
    "ITQ": lambda b, s: IterativeQuantization(b, random_state=s),
    "LSH": lambda b, s: RandomHyperplaneLSH(b, random_state=s),
}


def run_retrieval(names, bits, seed, n_train, n_queries, methods):
    print("| data | bits | " + " | ".join(methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    for name in names:
        data = load(name, seed)
        if data is None:
            print(f"| {name} | (not installed) |")
            continue
        A, B, P, s, rel = retrieval_split(data[0], n_train, n_queries, seed)
        for b in bits:
            row = []
            for m in methods:
                if m == "ITQ" and b > A.shape[1]:
                    row.append("-")
                    continue
                t0 = time.time()
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    h = RETRIEVAL[m](b, seed)
                    h = h.fit(A, pairs=P, similar=s) if m == "MLH" else h.fit(A)
                row.append(f"{precision_r3(h, A, B, rel):.3f}")
                print(f"  [{name} {b} {m}: {row[-1]} in {time.time() - t0:.0f} s]", flush=True)
            print(f"| {name} | {b} | " + " | ".join(row) + " |", flush=True)


KNN = {
    "LSH": lambda b, s, e: RandomHyperplaneLSH(b, random_state=s),
    "ITQ": lambda b, s, e: IterativeQuantization(b, random_state=s),
    "RankNet": lambda b, s, e: RankHashing(b, objective="ranknet", random_state=s, **e),
    "LambdaRank": lambda b, s, e: RankHashing(b, objective="lambdarank", random_state=s, **e),
    "MLH": lambda b, s, e: MinimalLossHashing(b, random_state=s),
    "BoostSSC": lambda b, s, e: BoostedSimilarityHashing(b, random_state=s),
}
SUPERVISED = ("RankNet", "LambdaRank", "MLH", "BoostSSC")


def knn_split(X, y, n_train, n_queries, seed):
    """Queries at random; the rest is the database; ``n_train`` database rows train."""
    perm = np.random.RandomState(seed).permutation(len(X))
    q, db = perm[:n_queries], perm[n_queries:]
    train = db[: min(n_train, len(db))]
    return X[db], y[db], X[q], y[q], X[train], y[train]


def run_knn(names, bits, seed, n_train, n_queries, methods, rank_epochs):
    extra = {"n_epochs": rank_epochs} if rank_epochs else {}
    print("k-NN error (3 nearest non-empty bins vote) [mean items in those bins]")
    print("| data | bits | " + " | ".join(methods) + " |")
    print("|---|---|" + "---|" * len(methods))
    for name in names:
        data = load(name, seed)
        if data is None:
            print(f"| {name} | (not installed) |")
            continue
        X_db, y_db, X_q, y_q, X_tr, y_tr = knn_split(*data, n_train, n_queries, seed)
        for b in bits:
            row = []
            for m in methods:
                if m == "ITQ" and b > X_db.shape[1]:
                    row.append("-")
                    continue
                with warnings.catch_warnings():
                    warnings.simplefilter("ignore")
                    h = KNN[m](b, seed, extra)
                    h = h.fit(X_tr, y_tr) if m in SUPERVISED else h.fit(X_tr)
                d = hamming_cdist(h.encode(X_q), h.encode(X_db), b)
                err = knn_classification_error(d, y_db, y_q, k=3)
                size = float(np.mean((d <= bin_threshold(d, 3)[:, None]).sum(1)))
                row.append(f"{err:.3f} [{size:.0f}]")
                print(f"  [{name} {b} {m}: {row[-1]}]", flush=True)
            print(f"| {name} | {b} | " + " | ".join(row) + " |", flush=True)


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("protocol", choices=["retrieval", "knn"])
    ap.add_argument(
        "--data",
        nargs="+",
        default=["digits", "fashion", "letter", "satellite", "gauss16", "gauss36"],
    )
    ap.add_argument("--bits", nargs="+", type=int, default=[16, 32, 64])
    ap.add_argument("--methods", nargs="+", default=None)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n-train", type=int, default=None)
    ap.add_argument("--n-queries", type=int, default=None)
    ap.add_argument("--rank-epochs", type=int, default=5)
    a = ap.parse_args(argv)
    if a.protocol == "retrieval":
        methods = a.methods or list(RETRIEVAL)
        run_retrieval(a.data, a.bits, a.seed, a.n_train or 5000, a.n_queries or 500, methods)
    else:
        methods = a.methods or list(KNN)
        run_knn(
            a.data,
            a.bits,
            a.seed,
            a.n_train or 10000,
            a.n_queries or 1000,
            methods,
            a.rank_epochs,
        )


if __name__ == "__main__":
    main()
