"""Why a learned rotation beats sign bits below the input's width and not at it (issue 32,
point 4).

Centred sign bits (:class:`hashlearn.hashers.SignHashing`, ``center=True``) keep one
coordinate per bit; with fewer bits than dimensions they keep the coordinates of largest
variance. Iterative quantization (Gong & Lazebnik, "Iterative quantization: a Procrustean
approach to learning binary codes", CVPR 2011, eq. 2) keeps the leading principal directions
and rotates them to lower the quantization loss ``|B - V R|_F^2``. Two properties of a linear
code's directions ``W`` (orthonormal rows, one per bit) decide how well its bits can rank
neighbours, and this script measures both on the base rows of a data set:

* **variance kept**: ``trace(W C W^T) / trace(C)`` for the training covariance ``C``: the share
  of the rows' spread the bits can see at all (the rest is invisible to the codes);
* **quantization cosine**: the mean cosine between a row's centred projection ``v = W (x - mu)``
  and its code ``sign(v)``, ``|v|_1 / (sqrt(b) |v|_2)``: 1 when every projection has the same
  magnitude, ``sqrt(2 / pi) = 0.798`` for isotropic Gaussian projections. ITQ raises it: with
  ``B = sign(V R)`` its loss is ``|B - V R|_F^2 = n b + |V|_F^2 - 2 sum_i |R^T v_i|_1``, so it
  maximises the sum of the rows' ``|v|_1`` at fixed ``|v|_2``.

It prints, for each code length: centred sign bits, orthogonal LSH
(:class:`hashlearn.hashers.RandomHyperplaneLSH`'s default), PCA hashing and ITQ, fitted as
``bench/embeddings.py`` fits them (20,000 sampled rows, seed 0), and the spectrum of the
training covariance. Recall at equal bits comes from ``bench/embeddings.py`` (its table
"Learned codes against centred sign bits"); this script measures no time and may run beside
other work.

Run::

    python bench/code_geometry.py [--data DIR] [--bits 128,256,384]
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np

from hashlearn.embeddings import load_embeddings
from hashlearn.hashers import SignHashing, make_hasher
from hashlearn.search import orthonormal_form

CODES = (
    ("centred sign bits", "sign", {"center": True}),
    ("orthogonal LSH", "lsh", {}),
    ("PCA hashing", "pca", {}),
    ("ITQ", "itq", {}),
)


def quantization_cosine(V: np.ndarray) -> float:
    """Mean cosine between each row of ``V`` and its sign vector."""
    norms = np.linalg.norm(V, axis=1)
    keep = norms > 0
    return float(np.mean(np.abs(V[keep]).sum(1) / (np.sqrt(V.shape[1]) * norms[keep])))


def code_directions(hasher) -> tuple[np.ndarray, np.ndarray]:
    """``(W, mean)`` of a fitted hasher with orthonormal directions: bits are
    ``W (x - mean) >= 0``."""
    if isinstance(hasher, SignHashing):  # no linear form: one coordinate per bit
        W = np.eye(hasher.n_features_in_)[hasher.dims_]
        return W, np.asarray(hasher.mean_, np.float64)
    form = orthonormal_form(hasher)
    if form is None:
        raise ValueError(f"{type(hasher).__name__}: no orthonormal linear form")
    return form


def main(argv=None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="data set directory")
    parser.add_argument("--bits", default="128,256,384")
    parser.add_argument("--fit-size", type=int, default=20000)
    parser.add_argument("--out", type=Path, default=None, help="write the figures as JSON")
    args = parser.parse_args(argv)

    ds = load_embeddings(args.data)
    base = np.asarray(ds.base, np.float32)
    rng = np.random.default_rng(0)  # bench/embeddings.py's fitting sample
    fit = base[np.sort(rng.choice(len(base), min(args.fit_size, len(base)), replace=False))]
    fit64 = fit.astype(np.float64)
    mu = fit64.mean(0)
    cov = np.cov((fit64 - mu).T)
    eig = np.linalg.eigvalsh(cov)[::-1]
    coord = np.sort(np.diag(cov))[::-1]
    total = float(eig.sum())
    dim = base.shape[1]
    spectrum = {
        "participation_ratio": float(total**2 / (eig**2).sum()),
        "pcs_share": {b: float(eig[:b].sum() / total) for b in (64, 128, 256)},
        "coordinates_share": {b: float(coord[:b].sum() / total) for b in (64, 128, 256)},
        "smallest_coordinate_variance_over_median": float(coord[-1] / np.median(coord)),
    }
    print(f"data: {ds.path} ({len(base):,} x {dim}); fitted on {len(fit):,} sampled rows")
    print(
        f"training covariance: participation ratio {spectrum['participation_ratio']:.0f} of "
        f"{dim}; variance in the top 64 / 128 / 256 principal directions "
        + " / ".join(f"{v:.3f}" for v in spectrum["pcs_share"].values())
        + ", in the 64 / 128 / 256 coordinates of largest variance "
        + " / ".join(f"{v:.3f}" for v in spectrum["coordinates_share"].values())
    )
    rows = []
    print("\n| code | bits | variance kept | quantization cosine |\n|---|---|---|---|")
    for bits in (int(b) for b in args.bits.split(",")):
        if bits > dim:
            continue
        for label, name, params in CODES:
            hasher = make_hasher(name, n_bits=bits, random_state=0, **params).fit(fit)
            W, mean = code_directions(hasher)
            kept = float(np.trace(W @ cov @ W.T) / total)
            qcos = quantization_cosine((base - mean) @ W.T)
            rows.append({"code": label, "bits": bits, "variance_kept": kept, "qcos": qcos})
            print(f"| {label} | {bits} | {kept:.3f} | {qcos:.3f} |")
    if args.out:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps({"spectrum": spectrum, "codes": rows}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
