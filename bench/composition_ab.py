"""In-process A/B of the composition layer: this tree's Searcher / EmbeddingIndex against the
same classes at an earlier git revision (issue 29: the one-searcher rewrite must cost nothing).

The earlier revision's ``src/hashlearn`` is extracted with ``git archive`` into a temporary
directory and imported as the package ``hashlearn_ref`` (every ``hashlearn`` module name in
it rewritten), so both versions run in one process on the same inputs, interleaved: each
repetition times every contender once, in turn. One thread everywhere; CPU time. Rows:

* ``bench/searcher.py``'s end-to-end rows: Fashion-MNIST (60k training images, 784 float32
  pixels; the test images as queries), random-hyperplane LSH at 64 bits, ``FlatIndex``,
  Euclidean re-ranking of 100 and of 1000 candidates, k = 10; and the same over the bags of
  patches (CSR) with Gaussian hyperplanes;
* ``bench/embeddings.py``'s search: ``EmbeddingIndex()`` defaults (ITQ-256, cosine) over
  Fashion-MNIST as 784-d "embeddings", overfetch 8 and 16, k = 10.

Each row reports both versions' CPU ms per query, new / old time as a ratio (median of the
per-repetition ratios; the target: old / new >= 0.97) and whether the ids are identical.

    python bench/composition_ab.py --ref 0b57805            # the composition before issue 29
    python bench/composition_ab.py --ref 0b57805 --queries 200 --repeats 2   # a check
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS", "NUMBA_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread everywhere, before numpy / numba load

import argparse  # noqa: E402
import importlib  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import tempfile  # noqa: E402
from pathlib import Path  # noqa: E402

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))

import numpy as np  # noqa: E402

import hashlearn  # noqa: E402
from _common import interleaved_wall_and_cpu, load_average, machine, markdown_table  # noqa: E402
from hashlearn.datasets import load_fashion_mnist  # noqa: E402

K = 10


def reference_package(ref: str, into: Path):
    """``src/hashlearn`` at git revision ``ref``, importable as ``hashlearn_ref``."""
    archive = subprocess.run(
        ["git", "-C", str(HERE.parent), "archive", ref, "src/hashlearn"],
        check=True,
        capture_output=True,
    ).stdout
    subprocess.run(["tar", "-x", "-C", str(into)], input=archive, check=True)
    package = into / "hashlearn_ref"
    (into / "src" / "hashlearn").rename(package)
    for file in package.rglob("*.py"):
        file.write_text(
            re.sub(r"\bhashlearn\b(?=[.:\s,)'\"]|$)", "hashlearn_ref", file.read_text())
        )
    sys.path.insert(0, str(into))
    ref_pkg = importlib.import_module("hashlearn_ref")
    ref_pkg.set_num_threads(1)
    return ref_pkg


def searcher_rows(new, old, X_db, X_q, label, sparse, repeats):
    rows = []
    for n_cand in (100, 1000):
        built = []
        for lib in (new, old):
            hasher = (
                lib.RandomHyperplaneLSH(64, directions="gaussian", random_state=0)
                if sparse
                else lib.RandomHyperplaneLSH(64, random_state=0)
            )
            searcher = lib.Searcher(
                hasher, lib.FlatIndex(64), rerank="euclidean", n_candidates=n_cand
            )
            built.append(searcher.fit(X_db[:10000]).add(X_db))
        results = [s.search(X_q, K, n_threads=1) for s in built]
        same = bool(np.array_equal(results[0][1], results[1][1]))
        rows.append(_timed(label, f"Searcher, {n_cand} candidates", built, X_q, repeats, same))
    return rows


def embedding_rows(new, old, X_db, X_q, repeats):
    """``EmbeddingIndex()`` and, where the old revision has it, the IVF coarse stage."""
    rows = []
    # coarse=566: the lists coarse="auto" learned from a 20,000-row fit sample until
    # 2026-11-28 (it now sizes them by the database, from 100,000 rows up)
    for params, name in (({}, "EmbeddingIndex()"), ({"coarse": 566}, "coarse=566")):
        try:
            built = [lib.EmbeddingIndex(**params).fit(X_db[:20000]).add(X_db) for lib in (new, old)]
        except TypeError:  # an older revision without this parameter
            continue
        for overfetch in (8, 16):
            calls = [
                lambda e=e, o=overfetch: e.search(X_q, K, overfetch=o, n_threads=1) for e in built
            ]
            same = bool(np.array_equal(calls[0]()[1], calls[1]()[1]))
            label = f"{name}, overfetch {overfetch}"
            rows.append(_timed("dense (784 float32)", label, calls, X_q, repeats, same, bound=True))
    return rows


def _timed(data, what, contenders, X_q, repeats, same, bound=False):
    calls = contenders if bound else [lambda s=s: s.search(X_q, K, n_threads=1) for s in contenders]
    wall, cpu = interleaved_wall_and_cpu(calls, repeats)
    m = X_q.shape[0]
    row = dict(
        data=data,
        what=what,
        new_ms=float(np.median(cpu[:, 0])) / m * 1e3,
        old_ms=float(np.median(cpu[:, 1])) / m * 1e3,
        old_over_new_cpu=float(np.median(cpu[:, 1] / cpu[:, 0])),
        old_over_new_wall=float(np.median(wall[:, 1] / wall[:, 0])),
        same_ids=same,
    )
    print(row, flush=True)
    return row


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--ref", required=True, help="git revision of the old composition")
    parser.add_argument("--queries", type=int, default=2000)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--no-sparse", action="store_true")
    args = parser.parse_args()
    hashlearn.set_num_threads(1)
    from searcher import bag_of_patches  # bench/searcher.py's CSR bags of patches

    start = load_average()
    with tempfile.TemporaryDirectory() as tmp:
        old = reference_package(args.ref, Path(tmp))
        X_db, _ = load_fashion_mnist(subset="train")
        X_q, _ = load_fashion_mnist(subset="test")
        X_q = X_q[: args.queries]
        rows = searcher_rows(hashlearn, old, X_db, X_q, "dense (784 float32)", False, args.repeats)
        if not args.no_sparse:
            bags = bag_of_patches(X_db), bag_of_patches(X_q)
            rows += searcher_rows(hashlearn, old, *bags, "sparse (CSR bags)", True, args.repeats)
        rows += embedding_rows(hashlearn, old, X_db, X_q, args.repeats)
    header = ["data", "search", "new CPU ms/query", f"{args.ref} CPU ms/query"]
    header += ["old / new (CPU)", "(wall)", "same ids"]
    table = markdown_table(
        header,
        [
            [
                r["data"],
                r["what"],
                f"{r['new_ms']:.3f}",
                f"{r['old_ms']:.3f}",
                f"**{r['old_over_new_cpu']:.2f}**",
                f"{r['old_over_new_wall']:.2f}",
                "yes" if r["same_ids"] else "no",
            ]
            for r in rows
        ],
    )
    print(f"\n{machine()}; load average {start} before, {load_average()} after\n\n{table}")


if __name__ == "__main__":
    main()
