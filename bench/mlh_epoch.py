"""Time of one MLH training epoch (10^5 pairs) on 40-D input, by code length and loss.

The issue's target: one epoch of 10^5 pairs at 64 bits on 40-D input in <= 2 s. An epoch is
sampling 10^5 supervision pairs plus the numba kernel that projects both points of every
pair, runs exact loss-adjusted inference (a sort of q gains per pair, §4.1) and applies the
mini-batch update with momentum and row renormalisation (eq. 14, §5). Measured as
``(fit with E epochs - fit with 0 epochs) / E`` over interleaved repetitions (median), so
setup and the LSH initialisation are excluded. Data: 1000 unit-length 40-D points from a
Gaussian, pairs labelled by the 50-neighbour Euclidean threshold (the §6.1 protocol).

    python bench/mlh_epoch.py             # writes the "bench-mlh-epoch" section of docs/results.md
    python bench/mlh_epoch.py --no-write  # print only
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import (  # noqa: E402
    interleaved_times,
    load_average,
    machine,
    markdown_table,
    write_section,
)
from hashlearn.hashers.mlh import MinimalLossHashing  # noqa: E402
from hashlearn.supervision import neighbor_threshold, neighbors_within  # noqa: E402


def main(argv=None) -> str:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--pairs", type=int, default=100_000)
    parser.add_argument("--dim", type=int, default=40, help="input dimension (the paper: 40)")
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    load_before = load_average()
    rng = np.random.default_rng(0)
    X = rng.standard_normal((1000, args.dim))
    X /= np.linalg.norm(X, axis=1, keepdims=True)
    thr = neighbor_threshold(X, 50)
    iu = np.triu_indices(len(X), 1)
    P = np.stack(iu, 1).astype(np.int64)
    s = neighbors_within(X, X, thr)[iu]
    rows = []
    for loss in ("hinge", "bre"):
        for n_bits in (32, 64, 128):
            eps = 0.1 if loss == "hinge" else 2.0

            def fit(epochs, n_bits=n_bits, loss=loss, eps=eps):
                return MinimalLossHashing(
                    n_bits,
                    rho=n_bits / 4,
                    lam=0.5,  # every hyper-parameter explicit: no "auto" selection timed
                    epsilon=eps,
                    loss=loss,
                    n_epochs=epochs,
                    pairs_per_epoch=args.pairs,
                    monitor_pairs=0,
                    random_state=0,
                ).fit(X, pairs=P, similar=s)

            t = interleaved_times([lambda: fit(0), lambda: fit(args.epochs)], args.repeats)
            per_epoch = (t[:, 1] - t[:, 0]) / args.epochs
            med = float(np.median(per_epoch))
            # CPU seconds of this (single-threaded) process: insensitive to other jobs
            cpu = []
            for _ in range(args.repeats):
                c0 = time.process_time()
                fit(0)
                c1 = time.process_time()
                fit(args.epochs)
                c2 = time.process_time()
                cpu.append(((c2 - c1) - (c1 - c0)) / args.epochs)
            cpu_med = float(np.median(cpu))
            rows.append(
                [
                    loss,
                    n_bits,
                    f"{med:.3f}",
                    f"{per_epoch.min():.3f}-{per_epoch.max():.3f}",
                    f"{cpu_med:.3f}",
                    f"{args.pairs / cpu_med / 1e3:.0f}k",
                    "yes" if (n_bits != 64 or cpu_med <= 2.0) else "NO",
                ]
            )
            print(rows[-1], flush=True)
    md = "\n".join(
        [
            "## MLH training epoch (bench/mlh_epoch.py)",
            "",
            f"Machine: {machine()}; medians of {args.repeats} interleaved repetitions. "
            f"One epoch = {args.pairs} pairs on 1000 x {args.dim}-D points, batch 100, single thread. "
            f"Load average before: {load_before}; after: {load_average()}.",
            "",
            markdown_table(
                [
                    "loss",
                    "bits",
                    "wall s / epoch (median)",
                    "wall range",
                    "CPU s / epoch (median)",
                    "pairs / CPU s",
                    "64-bit target <= 2 s met (CPU)",
                ],
                rows,
            ),
            "",
        ]
    )
    print(md)
    if not args.no_write:
        write_section("bench-mlh-epoch", md)
    return md


if __name__ == "__main__":
    main()
