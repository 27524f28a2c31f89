"""When the wide 64-bit Hamming scan should test a mini-block's mask before storing distances.

:func:`hashlearn.index._knn_scan.knn_scan_wide` can compute a mini-block's pass mask alone and
recompute its distances only when a code passes (``mask_first``), or note the mini-blocks
with a passing code and compute those codes' distances after the block ("deferred"). The
first wins when few codes pass a settled top k, i.e. when the database holds many codes per
neighbour kept; ``knn_scan`` picks it when ``n >= MASK_FIRST_MIN_CODES_PER_K * k``. This bench times both variants in-process, interleaved, one thread, on random 64-bit
codes, CPU time (``time.process_time``), for a grid of ``n`` and ``k``, and prints the ratio
deferred / mask-first (> 1: mask-first is faster). Needs a CPU with AVX-512 VPOPCNTDQ
(the wide path); elsewhere it says so and exits.

    python bench/mask_first.py [--queries 500] [--repeats 5]
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from hashlearn._utils.popcount import kernel_path  # noqa: E402
from hashlearn.index import _knn_scan  # noqa: E402


def _time(db, n, Q, k, mask_first: bool) -> float:
    m = len(Q)
    out_d = np.empty((m, k), np.int32)
    out_p = np.empty((m, k), np.int64)
    block = _knn_scan._MINI_BLOCK * 32
    tau0 = np.full(m, 65, np.int64)  # no starting bound
    start = time.process_time()
    args = (out_d, out_p, block, (0,), mask_first, tau0)
    _knn_scan.knn_scan_wide(db, n, Q, 0, m, k, 64, *args)
    return time.process_time() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--queries", type=int, default=500)
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    if kernel_path(1) != "wide":
        sys.exit("this CPU takes the portable path: the variants do not apply")
    rng = np.random.default_rng(0)
    print("n, k, n/k, mask-first ms/query, deferred ms/query, deferred / mask-first")
    for n in (60_000, 200_000, 1_000_000):
        db = rng.integers(0, 2**63, n, dtype=np.uint64)
        db.flags.writeable = False
        Q = rng.integers(0, 2**63, args.queries, dtype=np.uint64)
        Q.flags.writeable = False
        for k in (10, 30, 100, 300, 1000):
            _time(db, n, Q[:2], k, True), _time(db, n, Q[:2], k, False)  # compile
            ratios, t_mask, t_store = [], [], []
            for _ in range(args.repeats):
                a = _time(db, n, Q, k, True)
                b = _time(db, n, Q, k, False)
                t_mask.append(a)
                t_store.append(b)
                ratios.append(b / a)
            per = 1e3 / args.queries
            print(f"{n}, {k}, {n // k}, {np.median(t_mask) * per:.4f}, "
                  f"{np.median(t_store) * per:.4f}, {np.median(ratios):.3f}")  # fmt: skip


if __name__ == "__main__":
    main()
