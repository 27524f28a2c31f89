"""Issue 31, point 4: BinaryReconstructiveEmbedding's defaults against spectral hashing and
LSH under the MLH §6.1 measure on every data set the project has (digits, Fashion-MNIST, the
bundled UCI letter (16-d, 26 classes) and Landsat satellite (36-d, 6 classes) sets, and
Gaussian mixtures of their shapes).

Protocol (``scripts/defaults_check.py retrieval``, seed 0): at most 5000 training rows = the
database, 500 queries, centred on the training mean and unit length, relevant = within the
Euclidean threshold giving 50 neighbours per training row; per-query precision within Hamming
radius 3, an empty retrieval scoring 0. A verdict is paired over the queries: BRE holds where
its mean gain over the better of SH and LSH exceeds two standard errors, fails where it is
below minus two. Where it is a tie, an ``xfail`` records the measured values after checking
that it is still a tie (``BinaryReconstructiveEmbedding``'s docstring has the whole table)."""

from __future__ import annotations

import warnings

import numpy as np
import pytest

from hashlearn.codes import hamming_cdist
from hashlearn.datasets import (
    fashion_mnist_available,
    load_digits,
    load_fashion_mnist,
    load_letter,
    load_satellite,
    make_gaussian_classes,
)
from hashlearn.hashers import BinaryReconstructiveEmbedding, RandomHyperplaneLSH, SpectralHashing
from hashlearn.supervision import neighbor_threshold, neighbors_within


def _data(name):
    if name == "digits":
        return np.asarray(load_digits()[0], np.float64)
    if name == "fashion":
        if not fashion_mnist_available():
            pytest.skip("Fashion-MNIST is not installed")
        X = load_fashion_mnist(subset="train")[0]
        return np.asarray(X[np.random.RandomState(0).permutation(len(X))[:12000]]) / 255.0
    if name in ("letter", "satellite"):
        return np.asarray({"letter": load_letter, "satellite": load_satellite}[name]()[0], float)
    shape = {"gauss16": (16, 26, 0.6), "gauss36": (36, 6, 0.15)}[name]
    return make_gaussian_classes(6000, *shape, random_state=1000)[0]


def _split(X, n_train=5000, n_queries=500):
    perm = np.random.RandomState(0).permutation(len(X))
    n_train = min(n_train, len(X) - n_queries)
    A, B = X[perm[:n_train]], X[perm[n_train : n_train + n_queries]]
    mean = A.mean(0)
    A, B = A - mean, B - mean
    A /= np.maximum(np.linalg.norm(A, axis=1, keepdims=True), 1e-12)
    B /= np.maximum(np.linalg.norm(B, axis=1, keepdims=True), 1e-12)
    return A, B, neighbors_within(B, A, neighbor_threshold(A, 50))


def _per_query_precision(h, A, B, relevant, n_bits):
    inside = hamming_cdist(h.encode(B), h.encode(A), n_bits) <= 3
    got = inside.sum(1)
    return np.where(got > 0, (inside & relevant).sum(1) / np.maximum(got, 1), 0.0)


# measured 2026-12-06 (BRE / SH / LSH): ties, where BRE's defaults are within two standard
# errors of the better of SH and LSH; no power (0.25-4), kernel, number of landmarks (256),
# passes (5) or pairs (50 + 50 a point) lifted them (BinaryReconstructiveEmbedding's Notes)
_TIES = {
    ("fashion", 16): "0.148 / 0.151 / 0.090",
    ("fashion", 32): "0.443 / 0.438 / 0.304",
    ("letter", 32): "0.720 / 0.668 / 0.688: above both by 1.9 standard errors",
    ("gauss16", 16): "0.254 / 0.247 / 0.252",
    ("gauss16", 32): "0.604 / 0.616 / 0.427: 0.5 standard errors below",
    ("gauss36", 64): "0.000 / 0.000 / 0.000: nothing within radius 3 of 64 bits",
}


@pytest.mark.slow
@pytest.mark.parametrize("name", ["digits", "fashion", "letter", "satellite", "gauss16", "gauss36"])
@pytest.mark.parametrize("n_bits", [16, 32, 64])
def test_bre_defaults_beat_sh_and_lsh(name, n_bits):
    """BRE's defaults are never significantly below the better of SH and LSH, and are
    significantly above it everywhere but the ties listed (each checked not to hold clearly,
    by three standard errors, so that one which does must leave the list)."""
    A, B, relevant = _split(_data(name))
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        bre = BinaryReconstructiveEmbedding(n_bits, random_state=0).fit(A)
        sh = SpectralHashing(n_bits).fit(A)
        lsh = RandomHyperplaneLSH(n_bits, random_state=0).fit(A)
    p = {
        k: _per_query_precision(h, A, B, relevant, n_bits)
        for k, h in (("BRE", bre), ("SH", sh), ("LSH", lsh))
    }
    best = "SH" if p["SH"].mean() >= p["LSH"].mean() else "LSH"
    gain = p["BRE"] - p[best]
    se = gain.std(ddof=1) / np.sqrt(len(gain))
    means = {k: round(float(v.mean()), 3) for k, v in p.items()}
    assert gain.mean() >= -2.0 * se, ("significantly below", means, float(se))
    if (name, n_bits) in _TIES:
        # a margin above the 2 of a verdict, so that a change in floating-point order
        # cannot flip it; a cell that clearly holds must leave the list
        assert gain.mean() <= 3.0 * se, ("clearly holds: remove it from _TIES", means)
        pytest.xfail(f"a tie with {best}: {_TIES[(name, n_bits)]}")
    assert gain.mean() > 2.0 * se, (means, float(se))
