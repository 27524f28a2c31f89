"""Can RaBitQ's error bound stop the rescoring early? (issue 32, point 1)

The residual coarse stage (:class:`hashlearn.index.ResidualIVFIndex`, ``EmbeddingIndex()``'s
default from 100,000 rows) ranks a query's candidates by RaBitQ's estimate ``s(q, x)`` of
``<p_q, p> - |p|^2 / 2`` in the hasher's projection space (Gao & Long, "RaBitQ", SIGMOD 2024).
The refine stage then scores all ``k * overfetch`` candidates exactly. RaBitQ stops early
instead: it rescores candidates in the order of an upper bound on their score and stops once
the next bound falls below the k-th exact score found, which keeps the top k of the candidates
exact wherever the bound holds.

For unit vectors through a centred orthonormal projection (ITQ: principal directions, then a
rotation) the exact cosine is bounded above, deterministically, by the projection's score:
``cos(q, x) = 1 - |q - x|^2 / 2 <= 1 - |p_q|^2 / 2 + (<p_q, p> - |p|^2 / 2)``, because
``|q - x|^2 >= |p_q - p|^2`` (the discarded directions only add). The estimate's own error has
two parts: the query's 4-bit rounding (at most ``g |p_q - p_bar|_1``, deterministic) and the
1-bit code's, bounded by RaBitQ's Theorem 3.2 with probability growing with ``eps0`` (1.9 in the
paper): ``eps0 |p_q - c| |r| sqrt(1 - a^2) / (a sqrt(D - 1))``, ``a = |r|_1 / (sqrt(D) |r|)``
for the residual ``r`` of a row to its list's centroid ``c``. So

    cos(q, x) <= 1 - |p_q|^2 / 2 + s(q, x) + g |p_q - p_bar|_1 + eps0 |p_q - c| e(r).

The bound is about the index's own row term ``-|p|^2 / 2``: ``EmbeddingIndex()``'s default
row terms (:func:`hashlearn.search.row_terms`) add an estimate of the dropped cross term and
bound nothing. So this script builds ``EmbeddingIndex()`` (or ``--bits``) with the index's own
term, takes each query's ``k * overfetch`` candidates, and counts the rows an early-stopping
rescore by that bound needs -- with the scan's estimate (4-bit query, so with the rounding
term) and with the same estimator over the unrounded query (what a float rescoring pass over
the candidates' codes would compute; no rounding term) -- against all of them and against the
oracle (the estimate-ordered position of the last of the exact top k among the candidates: no
bound can stop earlier). It also checks that the deterministic part holds on every candidate
and counts the queries whose top k would change. It measures rows rescored, not time: it may
run beside other work.

Run::

    python bench/rescore_bound.py --synthetic 1000000 [--bits 256] [--overfetch 10]
    python bench/rescore_bound.py --data DIR      # a MiniLM data set (scripts/make_embeddings.py)
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import json  # noqa: E402
import sys  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

from hashlearn.embeddings import EmbeddingIndex, load_embeddings  # noqa: E402
from hashlearn.index import ResidualIVFIndex  # noqa: E402

sys.path.insert(0, str(Path(__file__).parent))
from embeddings import K, mixture_sample  # noqa: E402

EPS0 = (1.0, 1.9, 3.0)  # RaBitQ's confidence parameter (1.9 in the paper)


def _levels(p: np.ndarray) -> np.ndarray:
    """The query's projections rounded to 16 levels (the kernel's ``query_planes``)."""
    lo, hi = p.min(), p.max()
    step = (hi - lo) / 15 if hi > lo else 1.0
    return lo + step * np.clip(np.floor((p - lo) / step + 0.5), 0, 15)


def _early_stop(upper, exact, ids):
    """Rows rescored in descending ``upper`` until the next bound falls below the k-th exact
    score, and the top ``K`` ids they give."""
    order = np.argsort(-upper, kind="stable")
    kth, best, n = -np.inf, [], 0
    for j in order:
        if len(best) == K and upper[j] < kth:
            break
        best = sorted([*best, exact[j]], reverse=True)[:K]
        kth = best[-1] if len(best) == K else -np.inf
        n += 1
    kept = order[:n]
    return n, set(ids[kept[np.argsort(-exact[kept], kind="stable")[:K]]].tolist())


def bound_study(index: EmbeddingIndex, base, queries, overfetch: int, n_queries: int) -> dict:
    """Rows an early-stopping rescore needs per query (mean, median, 90th percentile) for each
    ``eps0``, the oracle's, and the queries whose top ``K`` differs from the full rescore."""
    searcher = index.searcher_
    codes, hasher = searcher.index, searcher.hasher
    if not isinstance(codes, ResidualIVFIndex) or codes.quantizer != "k-means":
        raise SystemExit("rescore_bound: the index has no residual k-means coarse stage")
    snap = codes._store.snapshot
    layout = codes._layout(snap)
    C = np.asarray(layout.vectors, np.float64)
    list_of_id = np.empty(int(snap.ids.max()) + 1, np.int64)
    list_of_id[snap.ids] = np.repeat(np.arange(layout.n_lists), np.diff(layout.offsets))
    Qn = index._prepare(queries[:n_queries], "Q", "rescore_bound")
    P = hasher.project(Qn).astype(np.float64)
    S, cand = codes.search_asymmetric(P, K * overfetch, n_threads=1)
    D = P.shape[1]
    variants = [(name, e) for name in ("4-bit query", "float query") for e in EPS0]
    needed: dict = {v: [] for v in variants}
    changed = dict.fromkeys(variants, 0)
    oracle, violations = [], 0
    for q in range(len(P)):
        ids = cand[q][cand[q] >= 0]
        exact = np.asarray(base[ids], np.float64) @ Qn[q].astype(np.float64)
        top = set(ids[np.argsort(-exact, kind="stable")[:K]].tolist())
        oracle.append(1 + max(j for j, i in enumerate(ids) if i in top))
        p = hasher.project(np.asarray(base[ids], np.float32)).astype(np.float64)
        c = C[list_of_id[ids]]
        r = p - c
        r_norm = np.linalg.norm(r, axis=1)
        r_l1 = np.abs(r).sum(1)
        a = r_l1 / (np.sqrt(D) * np.maximum(r_norm, 1e-300))
        err = r_norm * np.sqrt(np.maximum(1 - a**2, 0)) / np.maximum(a, 1e-300) / np.sqrt(D - 1)
        g = r_norm**2 / np.maximum(r_l1, 1e-300)
        const = 1.0 - P[q] @ P[q] / 2
        score_true = p @ P[q] - (p * p).sum(1) / 2  # the projection's own score, exactly
        violations += int(np.sum(exact > const + score_true + 1e-5))
        rounding = g * np.abs(P[q] - _levels(P[q])).sum()
        to_centroid = np.linalg.norm(P[q] - c, axis=1)
        # the same estimator with the query unrounded (what a float-query rescoring pass
        # would compute for each candidate): no rounding term in its bound
        signs = np.where(r >= 0, 1.0, -1.0)
        shift = (c * r).sum(1) - g * (c * signs).sum(1) - (p * p).sum(1) / 2
        float_query = c @ P[q] + g * (signs @ P[q]) + shift
        scan = S[q][: len(ids)].astype(np.float64)
        for e in EPS0:
            for name, upper in (
                ("4-bit query", const + scan + rounding + e * to_centroid * err),
                ("float query", const + float_query + e * to_centroid * err),
            ):
                n, got = _early_stop(upper, exact, ids)
                needed[name, e].append(n)
                changed[name, e] += got != top

    def summary(x):
        x = np.asarray(x)
        return {
            "mean": float(x.mean()),
            "p50": float(np.median(x)),
            "p90": float(np.percentile(x, 90)),
        }

    return {
        "candidates": K * overfetch,
        "queries": len(P),
        "oracle": summary(oracle),
        "bound": {
            f"{name}, eps0 {e}": {**summary(needed[name, e]), "top_k_changed": changed[name, e]}
            for name, e in variants
        },
        "deterministic_part_violations": violations,
    }


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None)
    parser.add_argument("--synthetic", type=int, default=0)
    parser.add_argument("--bits", type=int, default=256)
    parser.add_argument("--overfetch", type=int, default=10)
    parser.add_argument("--n-queries", type=int, default=300)
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "rescore-bound")
    args = parser.parse_args(argv)
    ds = load_embeddings(args.data)
    if args.synthetic:
        base, queries, _, _ = mixture_sample(
            np.asarray(ds.base, np.float32), args.synthetic, args.n_queries, print
        )
    else:
        base, queries = np.asarray(ds.base, np.float32), np.asarray(ds.queries, np.float32)
    rng = np.random.default_rng(0)
    sample = base[np.sort(rng.choice(len(base), min(20000, len(base)), replace=False))]
    index = EmbeddingIndex(n_bits=args.bits, coarse=max(1, round(4 * np.sqrt(len(base)))))
    index.fit(sample)
    # the projection's own -|p|^2 / 2 as each row's term: the one the bound above is about
    # (the default's row terms estimate the dropped cross term, so bound nothing)
    index.searcher_._row_terms = None
    index.add(base)
    result = bound_study(index, base, queries, args.overfetch, args.n_queries)
    result.update(n_base=len(base), bits=args.bits, data=str(args.data or ds.path))
    args.out.mkdir(parents=True, exist_ok=True)
    name = f"bound-{len(base)}-{args.bits}b-x{args.overfetch}.json"
    (args.out / name).write_text(json.dumps(result, indent=1))
    print(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()
