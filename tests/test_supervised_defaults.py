"""Issue 31, point 4: supervised hashers trained from labels with their defaults, under the
k-NN protocol of the demo and of the LambdaRank bit-vector paper (Table 4): the 3 nearest
non-empty Hamming bins vote. Orderings held at 16, 32 and 64 bits: LambdaRank <= RankNet <
LSH, and both below ITQ where ITQ has that many bits, on digits, the bundled UCI letter and
Landsat satellite sets and Gaussian mixtures of their shapes (5 draws of each, the queries
pooled); RankNet, LambdaRank and MLH from the labels of the Fashion-MNIST demo below LSH's
and ITQ's k-NN error without collapsing; MLH below them on digits, letter and satellite
(``scripts/defaults_check.py knn`` prints the whole table; ``docs/reproductions.md`` has
it)."""

from __future__ import annotations

import functools
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
from hashlearn.evaluate import knn_classification_error, knn_classify
from hashlearn.hashers import (
    IterativeQuantization,
    MinimalLossHashing,
    RandomHyperplaneLSH,
    RankHashing,
)

BITS = (16, 32, 64)


def _error(h, X_q, y_q, X_db, y_db, n_bits):
    d = hamming_cdist(h.encode(X_q), h.encode(X_db), n_bits)
    return knn_classification_error(d, y_db, y_q, k=3)


def _baselines(X_tr, X_q, y_q, X_db, y_db, n_bits):
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # ITQ clips n_bits to the input dimension
        lsh = RandomHyperplaneLSH(n_bits, random_state=0).fit(X_tr)
        itq = IterativeQuantization(n_bits, random_state=0).fit(X_tr)
    return (
        _error(lsh, X_q, y_q, X_db, y_db, n_bits),
        _error(itq, X_q, y_q, X_db, y_db, n_bits) if n_bits <= X_tr.shape[1] else np.inf,
    )


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits()
    perm = np.random.RandomState(0).permutation(len(X))
    X, y = X[perm] / 16.0, y[perm]  # the demo's scaling to [0, 1]
    return X[300:], y[300:], X[:300], y[:300]  # database = training rows; 300 queries


def _wrong(h, X_q, y_q, X_db, y_db, n_bits):
    """Per query: 1 where the 3 nearest non-empty bins vote the wrong (or no) label."""
    d = hamming_cdist(h.encode(X_q), h.encode(X_db), n_bits)
    return (knn_classify(d, y_db, k=3) != y_q).astype(np.float64)


def _z(a, b):
    """Paired z of the mean of ``a - b`` over the queries (0 where they never differ)."""
    diff = a - b
    se = diff.std(ddof=1) / np.sqrt(len(diff))
    return float(diff.mean() / se) if se > 0 else 0.0


def _draw(name, seed):
    """Draw ``seed`` of a rank-codes data set: digits split at random (300 queries, the rest
    the database and the training rows), 6000 random rows of UCI letter or satellite, or a
    new sample of a Gaussian mixture of their shapes (16-d / 26 overlapping classes, 36-d /
    6); 1000 of the 6000 are the queries, 5000 the database and the training rows."""
    if name == "digits":
        X, y = load_digits()
        perm = np.random.RandomState(seed).permutation(len(X))
        X, y = X[perm] / 16.0, y[perm]  # the demo's scaling to [0, 1]
        return X[300:], y[300:], X[:300], y[:300]
    if name in ("letter", "satellite"):
        X, y = {"letter": load_letter, "satellite": load_satellite}[name]()
        X = np.asarray(X, np.float64)
    else:
        shape = {"gauss16": (16, 26, 0.6), "gauss36": (36, 6, 0.15)}[name]
        X, y = make_gaussian_classes(6000, *shape, random_state=1000 + seed)
    perm = np.random.RandomState(seed).permutation(len(X))[:6000]
    return X[perm[1000:]], y[perm[1000:]], X[perm[:1000]], y[perm[:1000]]


RANK_DRAWS = 5


@functools.cache
def _rank_wrong(name, n_bits):
    """Per query, over the 5 draws pooled: 1 where the 3 nearest non-empty bins of LSH's,
    ITQ's (where ``n_bits`` <= the input dimension), RankNet's and LambdaRank's codes vote
    the wrong label, every hasher with its defaults."""
    wrong = {}
    for seed in range(RANK_DRAWS):
        X, y, Xq, yq = _draw(name, seed)
        hashers = {"lsh": RandomHyperplaneLSH(n_bits, random_state=seed)}
        if n_bits <= X.shape[1]:
            hashers["itq"] = IterativeQuantization(n_bits, random_state=seed)
        for obj in ("ranknet", "lambdarank"):
            hashers[obj] = RankHashing(n_bits, objective=obj, random_state=seed)
        for key, h in hashers.items():
            with warnings.catch_warnings():
                warnings.simplefilter("ignore")
                h.fit(X, y) if key in ("ranknet", "lambdarank") else h.fit(X)
            wrong.setdefault(key, []).append(_wrong(h, Xq, yq, X, y, n_bits))
    return {k: np.concatenate(v) for k, v in wrong.items()}


# measured 2026-12-06 (means over the 5 draws, k-NN error; LSH / RankNet / LambdaRank at
# 16 / 32 / 64 bits): letter 0.493 / 0.328 / 0.321, 0.310 / 0.194 / 0.182, 0.198 / 0.124 /
# 0.119; satellite 0.240 / 0.160 / 0.147, 0.163 / 0.128 / 0.124, 0.140 / 0.123 / 0.121 (ITQ
# 0.498 on letter at 16 bits, 0.267 / 0.194 on satellite at 16 / 32). At 64 bits LSH / RankNet /
# LambdaRank 0.032 / 0.025 / 0.029 (digits), 0.181 / 0.170 / 0.161 (16-d mixture), 0.104 /
# 0.082 / 0.076 (36-d); with the paper's 100 documents at 64 bits RankNet was 0.221 / 0.163
# on draw 0 of the mixtures, above LSH's 0.148 / 0.098 (RankHashing's Notes)
@pytest.mark.slow
@pytest.mark.parametrize("name", ["digits", "letter", "satellite", "gauss16", "gauss36"])
@pytest.mark.parametrize("n_bits", BITS)
def test_rank_codes_order(name, n_bits):
    """LambdaRank <= RankNet < LSH with the defaults, over 5 draws of the data (and of the
    hashers' seeds), the queries of every draw pooled: LambdaRank not significantly above
    RankNet (paired over the queries, z <= 2), both below LSH's mean k-NN error (one draw of
    300 queries cannot tell codes within a few queries of each other apart)."""
    wrong = _rank_wrong(name, n_bits)
    errors = {k: round(float(v.mean()), 4) for k, v in wrong.items()}
    assert _z(wrong["lambdarank"], wrong["ranknet"]) <= 2.0, errors
    assert errors["ranknet"] < errors["lsh"] and errors["lambdarank"] < errors["lsh"], errors


# ITQ at 16 bits on the 16-d mixture (a rotation of all 16 sign bits of the centred input)
# is as good as the rank codes: 0.372 against RankNet 0.381 and LambdaRank 0.363 (5 draws;
# 20 epochs, 40 neighbour documents or 60 documents a query: RankNet 0.369-0.374)
_RANKNET_ABOVE_ITQ = {("gauss16", 16)}


@pytest.mark.slow
@pytest.mark.parametrize(
    "name,n_bits",
    [
        pytest.param(
            name,
            bits,
            marks=[pytest.mark.xfail(strict=True, reason="RankNet ties ITQ")]
            if (name, bits) in _RANKNET_ABOVE_ITQ
            else [],
        )
        for name, d in (
            ("digits", 64),
            ("letter", 16),
            ("satellite", 36),
            ("gauss16", 16),
            ("gauss36", 36),
        )
        for bits in BITS
        if bits <= d
    ],
)
def test_rank_codes_below_itq(name, n_bits):
    """Both rank codes below ITQ's mean k-NN error (where ITQ has that many bits: at most
    the input dimension), over the same 5 draws."""
    wrong = _rank_wrong(name, n_bits)
    errors = {k: round(float(v.mean()), 4) for k, v in wrong.items()}
    assert errors["ranknet"] < errors["itq"] and errors["lambdarank"] < errors["itq"], errors


def test_docs_per_query_auto_falls_with_the_code_length():
    """``docs_per_query="auto"``: the paper's 100 random documents without neighbour
    documents (and for retrieval), 100 / 50 / 30 at 16 / 32 / 64 bits with them."""
    X, y, _, _ = _draw("digits", 0)
    fitted = {
        (b, nd): RankHashing(b, n_epochs=0, neighbor_docs=nd, random_state=0)
        .fit(X, y)
        .docs_per_query_
        for b in (8, 16, 32, 64, 128)
        for nd in (0, 20)
    }
    assert [fitted[b, 20] for b in (8, 16, 32, 64, 128)] == [100, 100, 50, 30, 30]
    assert {fitted[b, 0] for b in (8, 16, 32, 64, 128)} == {100}
    h = RankHashing(64, task="retrieval", n_epochs=0, random_state=0).fit(X)
    assert h.docs_per_query_ == 100
    assert RankHashing(64, n_epochs=0, docs_per_query=7).fit(X, y).docs_per_query_ == 7
    with pytest.raises(ValueError, match="docs_per_query"):
        RankHashing(16, docs_per_query="many").fit(X, y)


# measured (seed 0, label_neighbors=20, 2026-11-28): 16 / 32 / 64 bits MLH 0.047 / 0.040 /
# 0.027 against ITQ 0.110 / 0.047 / 0.040 and LSH 0.267 / 0.093 / 0.040. Seeds 1 and 2 give
# 0.077 / 0.053 / 0.033 and 0.060 / 0.030 / 0.033: at 32 bits one seed of three is above
# ITQ (300 queries, 1 query = 0.0033). Before the neighbourhood pairs: 0.050 and 0.047 at 32
# and 64 bits, both above ITQ.
@pytest.mark.slow
@pytest.mark.parametrize("n_bits", BITS)
def test_mlh_from_labels_below_lsh_and_itq_on_digits(digits, n_bits):
    X, y, Xq, yq = digits
    lsh, itq = _baselines(X, Xq, yq, X, y, n_bits)
    mlh = _error(MinimalLossHashing(n_bits, random_state=0).fit(X, y), Xq, yq, X, y, n_bits)
    assert mlh < min(lsh, itq), (mlh, lsh, itq)


# measured 2026-12-06 (draw 0; MLH / LSH / ITQ k-NN error at 16 / 32 / 64 bits): letter
# 0.338 / 0.498 / 0.505, 0.233 / 0.308, 0.178 / 0.202; satellite 0.152 / 0.247 / 0.232,
# 0.139 / 0.167 / 0.226, 0.111 / 0.153
@pytest.mark.slow
@pytest.mark.parametrize("name", ["letter", "satellite"])
@pytest.mark.parametrize("n_bits", BITS)
def test_mlh_from_labels_below_lsh_and_itq_on_uci_sets(name, n_bits):
    """MLH from the labels of 5000 rows of UCI letter or satellite, with its defaults, below
    LSH's and ITQ's k-NN error on 1000 other rows (draw 0 of the rank-codes tests)."""
    X, y, Xq, yq = _draw(name, 0)
    lsh, itq = _baselines(X, Xq, yq, X, y, n_bits)
    mlh = _error(MinimalLossHashing(n_bits, random_state=0).fit(X, y), Xq, yq, X, y, n_bits)
    assert mlh < min(lsh, itq), (mlh, lsh, itq)


def _fashion_demo():
    """The demo's protocol on Fashion-MNIST: 10,000 labelled training items, 1,000 test-set
    queries, with a 20,000-item database (the training items among them) to keep the
    tests' memory small."""
    X_tr, y_tr = load_fashion_mnist(subset="train")
    X_te, y_te = load_fashion_mnist(subset="test")
    top = float(max(X_tr.max(), X_te.max()))
    rng = np.random.RandomState(0)
    q = rng.choice(len(X_te), 1000, replace=False)
    db = rng.choice(len(X_tr), 20000, replace=False)
    X_q, y_q = X_te[q] / top, y_te[q]
    X_db, y_db = X_tr[db] / top, y_tr[db]
    return X_db[:10000], y_db[:10000], X_q, y_q, X_db, y_db


# measured (seed 0, label_neighbors=20, 2026-11-28): 16 / 32 / 64 bits MLH 0.231 / 0.194 /
# 0.185 against ITQ 0.347 / 0.252 / 0.195 and LSH 0.421 / 0.325 / 0.258; seeds 1 and 2 (a
# development run of the same pairs) 0.225-0.237 / 0.184-0.192 / 0.179-0.183. Before the
# neighbourhood pairs (pairs across the whole set, precision at radius 3 selecting):
# 0.338 / 0.256 / 0.237, the codes collapsing at 16 bits in the demo.
@pytest.mark.slow
@pytest.mark.parametrize("n_bits", BITS)
def test_mlh_from_labels_below_lsh_and_itq_in_the_fashion_demo(n_bits):
    """The demo's protocol (:func:`_fashion_demo`)."""
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST is not installed")
    X_fit, y_fit, X_q, y_q, X_db, y_db = _fashion_demo()
    lsh, itq = _baselines(X_fit, X_q, y_q, X_db, y_db, n_bits)
    h = MinimalLossHashing(n_bits, random_state=0).fit(X_fit, y_fit)
    mlh = _error(h, X_q, y_q, X_db, y_db, n_bits)
    assert mlh < min(lsh, itq), (mlh, lsh, itq)
    # the codes do not collapse: a query's radius-2 ball holds less than one class's share
    # of the database (measured 0.063 at 16 bits; before the neighbourhood pairs the radius-2
    # ball of the demo's 16-bit codes held nearly every same-class item: recall 0.94)
    d = hamming_cdist(h.encode(X_q), h.encode(X_db), n_bits)
    within = float((d <= 2).mean())
    assert within < 0.1, within


@pytest.mark.slow
@pytest.mark.parametrize("n_bits", BITS)
def test_rank_codes_from_labels_below_lsh_and_itq_in_the_fashion_demo(n_bits):
    """RankNet and LambdaRank trained from the demo's labels (:func:`_fashion_demo`), with
    their defaults: below LSH's and ITQ's k-NN error, LambdaRank not significantly above
    RankNet (paired over the queries), and the codes do not collapse (a query's radius-2
    ball holds less than a fifth of the database, two classes' share; measured at 16 bits
    0.136 for RankNet and 0.093 for LambdaRank, where the collapsed MLH codes of the issue
    held nearly all of it)."""
    if not fashion_mnist_available():
        pytest.skip("Fashion-MNIST is not installed")
    X_fit, y_fit, X_q, y_q, X_db, y_db = _fashion_demo()
    lsh, itq = _baselines(X_fit, X_q, y_q, X_db, y_db, n_bits)
    wrong, within = {}, {}
    for obj in ("ranknet", "lambdarank"):
        h = RankHashing(n_bits, objective=obj, random_state=0).fit(X_fit, y_fit)
        wrong[obj] = _wrong(h, X_q, y_q, X_db, y_db, n_bits)
        d = hamming_cdist(h.encode(X_q), h.encode(X_db), n_bits)
        within[obj] = float((d <= 2).mean())
    errors = {k: float(v.mean()) for k, v in wrong.items()} | {"lsh": lsh, "itq": itq}
    assert max(errors["ranknet"], errors["lambdarank"]) < min(lsh, itq), errors
    assert _z(wrong["lambdarank"], wrong["ranknet"]) <= 2.0, errors
    assert max(within.values()) < 0.2, within
