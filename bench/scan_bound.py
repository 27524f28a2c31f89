"""When the Hamming k-NN scan should start its bound from a sample (``sample_plan``).

:func:`hashlearn.index._knn_scan.knn_scan` starts each query's bound from a 1/8 sample of
mini-blocks for k >= 32 at up to ``_SAMPLE_MAX_CODES_PER_K`` codes per neighbour kept. This
bench times the scan with the sample and without it (``sampled=False``), in-process,
interleaved, one thread, CPU time (``time.process_time``), on random codes, for a grid of
``n``, bits and ``k`` chosen around that limit (the sample forced on where the limit turns it
off), and prints the ratio without / with (> 1: the sample pays).

    python bench/scan_bound.py [--repeats 3]
"""

from __future__ import annotations

import os

os.environ.setdefault("NUMBA_NUM_THREADS", "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402

from hashlearn.index import _knn_scan  # noqa: E402

#: (n, bits, k, queries)
GRID = (
    (40_000, 256, 40, 1000),
    (40_000, 256, 120, 1000),
    (40_000, 256, 400, 1000),
    (200_000, 256, 300, 300),
    (1_000_000, 256, 1000, 100),
    (200_000, 256, 100, 300),
    (200_000, 512, 100, 200),
    (400_000, 256, 100, 200),
    (1_000_000, 256, 100, 100),
)


def _time(db, n, Q, m, k, n_bits, sampled: bool) -> float:
    n_words = n_bits // 64
    out_d = np.empty((m, k), np.int32)
    out_p = np.empty((m, k), np.int64)
    start = time.process_time()
    _knn_scan.knn_scan(db, n, Q, 0, m, k, n_bits, n_words, out_d, out_p, sampled=sampled)
    return time.process_time() - start


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--repeats", type=int, default=3)
    args = parser.parse_args(argv)
    rng = np.random.default_rng(1)
    limit = _knn_scan._SAMPLE_MAX_CODES_PER_K
    print("n, bits, k, n/k, sampled us/query, without us/query, without / sampled")
    for n, n_bits, k, m in GRID:
        w = n_bits // 64
        db = rng.integers(0, 2**63, n * w, dtype=np.uint64)
        Q = rng.integers(0, 2**63, m * w, dtype=np.uint64)
        db.flags.writeable = Q.flags.writeable = False
        _knn_scan._SAMPLE_MAX_CODES_PER_K = 10**9  # the sample on whatever n / k
        try:
            _time(db, n, Q, 2, k, n_bits, True), _time(db, n, Q, 2, k, n_bits, False)  # compile
            on, off = [], []
            for _ in range(args.repeats):
                on.append(_time(db, n, Q, m, k, n_bits, True))
                off.append(_time(db, n, Q, m, k, n_bits, False))
        finally:
            _knn_scan._SAMPLE_MAX_CODES_PER_K = limit
        a, b = min(on) / m * 1e6, min(off) / m * 1e6
        print(f"{n}, {n_bits}, {k}, {n // k}, {a:.1f}, {b:.1f}, {b / a:.2f}", flush=True)


if __name__ == "__main__":
    main()
