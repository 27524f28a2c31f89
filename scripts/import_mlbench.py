"""Re-create the bundled UCI sets ``src/hashlearn/data/{letter,satellite}.npz`` from Debian's
``r-cran-mlbench`` (version 2.1-3-1), which carries them as R data files:

* ``LetterRecognition``: UCI *Letter Recognition* (Frey & Slate 1991), 20,000 letters
  A-Z, 16 integer features in 0..15;
* ``Satellite``: UCI *Statlog (Landsat Satellite)* (Srinivasan 1993), 6,435 3x3 pixel
  neighbourhoods, 36 integer features (4 spectral bands x 9 pixels) in 27..157, 6 soil and
  crop classes.

Both are CC BY 4.0 at the UCI repository. Reading the R files needs the ``rdata`` package
(a development tool only; the library reads the ``.npz`` files)::

    apt-get download r-cran-mlbench && dpkg-deb -x r-cran-mlbench_*.deb mlbench
    pip install rdata
    .venv/bin/python scripts/import_mlbench.py mlbench/usr/lib/R/site-library/mlbench/data
"""

from __future__ import annotations

import argparse
from pathlib import Path

import numpy as np

SETS = {"letter": "LetterRecognition", "satellite": "Satellite"}


def main(argv=None):
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("rdata_dir", type=Path)
    ap.add_argument("--out", type=Path, default=Path("src/hashlearn/data"))
    args = ap.parse_args(argv)
    import rdata  # development-only dependency

    for name, r_name in SETS.items():
        frame = rdata.read_rda(args.rdata_dir / f"{r_name}.rda")[r_name]
        label = next(c for c in frame.columns if str(frame[c].dtype) == "category")
        X = frame.drop(columns=[label]).to_numpy(np.float64)
        if not np.array_equal(X, np.round(X)) or X.min() < 0 or X.max() > 255:
            raise ValueError(f"{r_name}: expected integer features in 0..255")
        y = frame[label].cat.codes.to_numpy()
        classes = np.asarray([str(c) for c in frame[label].cat.categories])
        np.savez_compressed(
            args.out / f"{name}.npz", X=X.astype(np.uint8), y=y.astype(np.uint8), classes=classes
        )
        print(f"{name}: X {X.shape}, {len(classes)} classes -> {args.out / (name + '.npz')}")


if __name__ == "__main__":
    main()
