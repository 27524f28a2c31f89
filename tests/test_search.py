"""Searcher: hasher + index + re-ranking, against brute-force pipelines."""

from __future__ import annotations

import numpy as np
import pytest
import scipy.sparse as sp
from sklearn.exceptions import NotFittedError
from sklearn.neighbors import NearestNeighbors

from conftest import brute_knn, unpack_le
from hashlearn.hashers import RandomHyperplaneLSH
from hashlearn.index import FlatIndex
from hashlearn.rerank.store import VectorStore
from hashlearn.search import Searcher, available_rerankers

N_BITS = 32


def state_of(s):
    """The snapshot of the vectors the searcher's refine stage holds."""
    return s.refiner.store.state


def vectors_of(s):
    return VectorStore.vectors_of(state_of(s))


def screen_of(s):
    """``(vectors screened, screen or False once dropped)``, or None before any screen."""
    return state_of(s).cached("screen")


def as_distance(D, name):
    """The distance the kernels rank by, from a reported similarity (the result convention:
    inner product and cosine similarity, largest first)."""
    return {"inner_product": -D, "cosine": 1.0 - D}.get(name, D)


def table_of(s):
    from hashlearn.rerank.store import _id_table

    return state_of(s).derived("id_table", _id_table)


@pytest.fixture(scope="module")
def split():
    """Digits split into a database with shuffled, sparse ids and held-out queries."""
    from sklearn.datasets import load_digits

    X = load_digits().data.astype(np.float64)  # small integers: exact distances
    rng = np.random.default_rng(0)
    perm = rng.permutation(len(X))
    db, queries = X[perm[:1500]], X[perm[1500:1580]]
    ids = rng.permutation(1500).astype(np.int64) * 7 + 3
    return db, ids, queries


def make_searcher(db, ids, rerank=None, n_candidates=None, n_bits=N_BITS, index="flat"):
    hasher = RandomHyperplaneLSH(n_bits=n_bits, random_state=0)
    s = Searcher(hasher, index=index, rerank=rerank, n_candidates=n_candidates)
    return s.fit(db).add(db, ids=ids)


def hamming_candidates(hasher, db, ids, queries, n_cand):
    """Hamming top-n_cand by brute force on unpacked bits (ties by smaller id)."""
    b = hasher.n_bits
    return brute_knn(
        unpack_le(hasher.encode(queries), b), unpack_le(hasher.encode(db), b), ids, n_cand
    )[1]


def rerank_oracle(db, ids, queries, cand, k, dist_fn):
    """Order each query's candidates by (exact distance, id); pad with -1 / inf."""
    row_of = {int(i): r for r, i in enumerate(ids)}
    D = np.full((len(queries), k), np.inf)
    I_out = np.full((len(queries), k), -1, np.int64)
    for q in range(len(queries)):
        c = cand[q][cand[q] >= 0]
        d = np.array([dist_fn(queries[q], db[row_of[int(i)]]) for i in c])
        order = np.lexsort((c, d))[:k]
        D[q, : len(order)] = d[order]
        I_out[q, : len(order)] = c[order]
    return D, I_out


def sq_dist(a, b):
    diff = a.astype(np.int64) - b.astype(np.int64)  # exact on integer-valued digits
    return float(diff @ diff)


# ---------------------------------------------------------------------------- no rerank


def test_without_rerank_equals_encode_plus_flat_index(split):
    db, ids, queries = split
    s = make_searcher(db, ids)
    D, I = s.search(queries, 15)
    hasher = RandomHyperplaneLSH(n_bits=N_BITS, random_state=0).fit(db)
    index = FlatIndex(N_BITS)
    index.add(hasher.encode(db), ids=ids)
    eD, eI = index.search(hasher.encode(queries), 15)
    assert D.dtype == np.int32 and I.dtype == np.int64
    np.testing.assert_array_equal(D, eD)
    np.testing.assert_array_equal(I, eI)
    # and that is the brute-force Hamming k-NN
    np.testing.assert_array_equal(I, hamming_candidates(hasher, db, ids, queries, 15))


# -------------------------------------------------------------------------------- rerank


@pytest.mark.parametrize("n_candidates,k", [(None, 5), (50, 10), (13, 13), (200, 1)])
def test_euclidean_rerank_equals_brute_force_rerank_of_hamming_candidates(split, n_candidates, k):
    db, ids, queries = split
    s = make_searcher(db, ids, rerank="euclidean", n_candidates=n_candidates)
    D, I = s.search(queries, k)
    n_cand = max(k, n_candidates or max(10 * k, 100))
    cand = hamming_candidates(s.hasher, db, ids, queries, n_cand)
    eD, eI = rerank_oracle(db, ids, queries, cand, k, sq_dist)
    np.testing.assert_array_equal(I, eI)
    np.testing.assert_allclose(D, np.sqrt(eD), rtol=1e-6)


def test_rerank_with_all_candidates_is_exact_euclidean_knn(split):
    db, ids, queries = split
    k = 10
    s = make_searcher(db, ids, rerank="euclidean", n_candidates=len(db) + 25)
    D, I = s.search(queries, k)
    nn = NearestNeighbors(n_neighbors=k, algorithm="brute", metric="euclidean").fit(db)
    sk_D, sk_rows = nn.kneighbors(queries)
    np.testing.assert_allclose(D, sk_D, rtol=1e-6, atol=1e-6)
    # sklearn orders exact ties arbitrarily; the searcher breaks them by smaller id
    all_cand = np.tile(ids, (len(queries), 1))
    eD, eI = rerank_oracle(db, ids, queries, all_cand, k, sq_dist)
    np.testing.assert_array_equal(I, eI)
    np.testing.assert_allclose(np.sort(sk_D, axis=1), np.sqrt(eD), rtol=1e-6, atol=1e-6)


@pytest.mark.parametrize(
    "name,fn",
    [
        ("sqeuclidean", sq_dist),
        ("inner_product", lambda q, x: -float(q.astype(np.int64) @ x.astype(np.int64))),
    ],
)
def test_other_named_rerankers(split, name, fn):
    db, ids, queries = split
    assert name in available_rerankers()
    s = make_searcher(db, ids, rerank=name, n_candidates=60)
    D, I = s.search(queries, 7)
    D = as_distance(D, name)
    cand = hamming_candidates(s.hasher, db, ids, queries, 60)
    eD, eI = rerank_oracle(db, ids, queries, cand, 7, fn)
    np.testing.assert_array_equal(I, eI)
    np.testing.assert_allclose(D, eD, rtol=1e-6)


def test_cosine_reranker(split):
    db, ids, queries = split
    s = make_searcher(db, ids, rerank="cosine", n_candidates=60)
    D, I = s.search(queries, 7)
    D = as_distance(D, "cosine")
    cand = hamming_candidates(s.hasher, db, ids, queries, 60)

    def cos_dist(q, x):
        return 1.0 - float(q @ x) / (np.linalg.norm(q) * np.linalg.norm(x))

    eD, _ = rerank_oracle(db, ids, queries, cand, 7, cos_dist)
    np.testing.assert_allclose(D, eD, rtol=1e-5, atol=1e-6)  # float ties may swap ids
    row_of = {int(i): r for r, i in enumerate(ids)}
    for q in range(len(queries)):
        assert set(I[q].tolist()) <= set(cand[q].tolist())
        got = [cos_dist(queries[q], db[row_of[int(i)]]) for i in I[q]]
        np.testing.assert_allclose(got, D[q], rtol=1e-5, atol=1e-6)


def test_callable_reranker(split):
    db, ids, queries = split
    calls = []

    def manhattan(q, c):
        assert q.ndim == 2 and c.ndim == 3 and c.shape[0] == q.shape[0]
        calls.append(c.shape)
        return np.abs(c - q[:, None, :]).sum(axis=2)

    s = make_searcher(db, ids, rerank=manhattan, n_candidates=40)
    D, I = s.search(queries, 6)
    assert calls
    cand = hamming_candidates(s.hasher, db, ids, queries, 40)
    eD, eI = rerank_oracle(db, ids, queries, cand, 6, lambda q, x: float(np.abs(q - x).sum()))
    np.testing.assert_array_equal(I, eI)
    np.testing.assert_allclose(D, eD, rtol=1e-6)


def test_reranker_returning_a_wrong_shape_is_an_error(split):
    db, ids, queries = split
    s = make_searcher(db[:100], ids[:100], rerank=lambda q, c: np.zeros(len(q)))
    with pytest.raises(ValueError, match="shape"):
        s.search(queries[:3], 4)


def test_adding_in_batches_keeps_vectors_matched_to_ids(split):
    db, ids, queries = split
    once = make_searcher(db, ids, rerank="euclidean", n_candidates=80)
    order = np.argsort(-ids)  # later batches have smaller ids
    s = Searcher(
        RandomHyperplaneLSH(n_bits=N_BITS, random_state=0), rerank="euclidean", n_candidates=80
    ).fit(db)
    for part in np.array_split(order, 4):
        s.add(db[part], ids=ids[part])
    for a, b in zip(s.search(queries, 9), once.search(queries, 9), strict=True):
        np.testing.assert_array_equal(a, b)


def test_sparse_input(split):
    db, ids, queries = split
    dense = make_searcher(db, ids, rerank="euclidean", n_candidates=50)
    hasher = RandomHyperplaneLSH(n_bits=N_BITS, random_state=0)
    sparse = Searcher(hasher, rerank="euclidean", n_candidates=50).fit(sp.csr_matrix(db))
    sparse.add(sp.csr_matrix(db), ids=ids)
    for a, b in zip(
        sparse.search(sp.csr_matrix(queries), 5), dense.search(queries, 5), strict=True
    ):
        np.testing.assert_allclose(a, b)


# ------------------------------------------------------------------------- remove / pad


@pytest.mark.parametrize("rerank", [None, "euclidean"])
def test_remove_removes_from_index_and_vectors(split, rerank):
    db, ids, queries = split
    s = make_searcher(db, ids, rerank=rerank, n_candidates=100)
    rng = np.random.default_rng(4)
    drop = rng.choice(len(db), size=600, replace=False)
    keep = np.setdiff1d(np.arange(len(db)), drop)
    assert s.remove(ids[drop]) == 600
    assert len(s.index) == len(keep)
    D, I = s.search(queries, 8)
    assert not np.isin(I, ids[drop]).any()
    fresh = Searcher(
        RandomHyperplaneLSH(n_bits=N_BITS, random_state=0), rerank=rerank, n_candidates=100
    ).fit(db)  # same hash functions
    fresh.add(db[keep], ids=ids[keep])
    fD, fI = fresh.search(queries, 8)
    np.testing.assert_array_equal(I, fI)
    np.testing.assert_array_equal(D, fD)
    with pytest.raises(ValueError):
        s.remove(ids[drop[:3]])  # already gone
    assert len(s.index) == len(keep)
    np.testing.assert_array_equal(s.search(queries, 8)[1], fI)


def test_k_larger_than_database_pads(split):
    db, ids, queries = split
    s = make_searcher(db[:5], ids[:5], rerank="euclidean")
    D, I = s.search(queries[:3], 8)
    assert D.shape == I.shape == (3, 8)
    assert np.all(I[:, 5:] == -1) and np.all(np.isinf(D[:, 5:]))
    assert sorted(I[0, :5].tolist()) == sorted(ids[:5].tolist())
    assert np.all(np.isfinite(D[:, :5]))
    s = make_searcher(db[:5], ids[:5])
    D, I = s.search(queries[:3], 8)
    assert np.all(I[:, 5:] == -1) and np.all(D[:, 5:] == -1)


@pytest.mark.parametrize("rerank", [None, "euclidean"])
def test_empty_database_pads_instead_of_raising(split, rerank):
    """'Fewer than k results pad with -1, never raise' also holds for an empty database."""
    db, ids, queries = split
    s = Searcher(RandomHyperplaneLSH(n_bits=N_BITS, random_state=0), rerank=rerank).fit(db)
    D, I = s.search(queries[:2], 3)
    assert I.tolist() == [[-1] * 3] * 2
    s.add(db[:4], ids=ids[:4])
    s.remove(ids[:4])
    D, I = s.search(queries[:2], 3)
    assert I.tolist() == [[-1] * 3] * 2


def test_rerank_over_an_index_with_codes_it_has_no_vectors_for_is_refused(split):
    """Ids the searcher holds no vectors for must not be re-ranked with other ids' vectors."""
    db, ids, queries = split
    hasher = RandomHyperplaneLSH(n_bits=N_BITS, random_state=0).fit(db)
    prefilled = FlatIndex(N_BITS)
    prefilled.add(hasher.encode(db[:500]), ids=ids[:500])
    with pytest.raises(ValueError):
        s = Searcher(hasher, index=prefilled, rerank="euclidean")
        s.add(db[500:600], ids=ids[500:600])
        s.search(queries[:3], 3)


# ---------------------------------------------------------------------------- arguments


def test_bad_arguments_raise(split):
    db, ids, queries = split
    hasher = RandomHyperplaneLSH(n_bits=N_BITS, random_state=0)
    with pytest.raises(ValueError, match="16-bit"):
        Searcher(hasher, index=FlatIndex(16))
    with pytest.raises(ValueError, match="euclidean"):  # lists what is available
        Searcher(hasher, rerank="manhattan")
    with pytest.raises(TypeError, match="rerank"):
        Searcher(hasher, rerank=3)
    with pytest.raises(TypeError, match="hasher"):
        Searcher(object())
    with pytest.raises(TypeError, match="index"):
        Searcher(hasher, index=42)
    with pytest.raises(ValueError, match="flat"):
        Searcher(hasher, index="no-such-index")
    with pytest.raises(ValueError, match="n_candidates"):
        Searcher(hasher, n_candidates=0)
    s = Searcher(hasher)
    with pytest.raises(NotFittedError):
        s.add(db)
    s.fit(db).add(db[:50])
    with pytest.raises(ValueError, match="'k'"):
        s.search(queries, 0)
    with pytest.raises(ValueError, match="features"):
        s.search(queries[:, :10], 3)
    explicit = Searcher(hasher, index=FlatIndex(N_BITS))
    assert explicit.index.n_bits == N_BITS


# ------------------------------------------------------- candidate indexes, learned metric


class _EuclideanMetricLSH(RandomHyperplaneLSH):
    """LSH whose 'learned metric' is the Euclidean distance (wiring test for rerank='metric')."""

    def metric_distances(self, queries, candidates):
        return np.sqrt(((candidates - queries[:, None, :]) ** 2).sum(-1))


class _ListIndex:
    """A candidate index: every query gets the same fixed id list, with counts."""

    def __init__(self, order):
        self.order = np.asarray(order, np.int64)
        self.added = None

    def add(self, keys, ids=None):
        self.added = len(keys)
        return np.arange(len(keys)) if ids is None else np.asarray(ids)

    def candidates(self, keys):
        return [(self.order, np.ones(len(self.order), np.int64)) for _ in range(len(keys))]


class _KeysBucketer:
    def fit(self, X, y=None):
        return self

    def keys(self, X):
        return np.zeros((len(X), 2), np.int64)


def test_rerank_metric_uses_the_hashers_metric(split):
    db, ids, queries = split
    plain = make_searcher(db, ids, rerank="euclidean")
    hasher = _EuclideanMetricLSH(n_bits=N_BITS, random_state=0)
    learned = Searcher(hasher, rerank="metric").fit(db).add(db, ids=ids)
    for a, b in zip(plain.search(queries, 5), learned.search(queries, 5), strict=True):
        np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="learned metric"):
        Searcher(RandomHyperplaneLSH(N_BITS), rerank="metric")


def test_candidate_index_with_bucketer_reranks_its_lists(split):
    db, ids, queries = split
    subset = ids[::3]
    s = Searcher(_KeysBucketer(), _ListIndex(subset), rerank="euclidean").fit(db)
    s.add(db, ids=ids)
    D, I = s.search(queries, 4)
    pos = np.searchsorted(np.sort(ids), subset)
    order = np.argsort(ids)
    cand_vecs = db[order][pos]
    d = np.sqrt(((queries[:, None, :] - cand_vecs[None]) ** 2).sum(-1))
    best = np.lexsort((np.broadcast_to(subset, d.shape), d), axis=-1)[:, :4]
    np.testing.assert_array_equal(I, subset[best])
    # n_candidates keeps the first entries of each list only
    s2 = Searcher(_KeysBucketer(), _ListIndex(subset), rerank="euclidean", n_candidates=2)
    _, I2 = s2.fit(db).add(db, ids=ids).search(queries, 4)
    assert set(I2[I2 >= 0].tolist()) <= set(subset[:2].tolist())
    assert (I2[:, 2:] == -1).all()
    with pytest.raises(ValueError, match="pass rerank"):
        Searcher(_KeysBucketer(), _ListIndex(subset))
    with pytest.raises(TypeError, match="registry name"):
        Searcher(_KeysBucketer(), "flat", rerank="euclidean")


# ------------------------------------------------------------- sparse end to end (CSR)


@pytest.mark.parametrize("rerank", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
def test_sparse_rerank_keeps_csr_and_equals_dense(split, rerank):
    db, ids, queries = split
    dense = make_searcher(db, ids, rerank=rerank, n_candidates=70)
    s = Searcher(RandomHyperplaneLSH(n_bits=N_BITS, random_state=0), rerank=rerank)
    s.n_candidates = 70
    s.fit(db)
    for part in np.array_split(np.arange(len(db)), 3):  # batches, CSR concatenated
        s.add(sp.csr_matrix(db[part]), ids=ids[part])
    assert sp.issparse(vectors_of(s)) and vectors_of(s).format == "csr"  # no dense copy
    sD, sI = s.search(sp.csr_matrix(queries), 6)
    dD, dI = dense.search(queries, 6)
    np.testing.assert_allclose(sD, dD, rtol=1e-6, atol=1e-6)
    if rerank != "cosine":  # integer data: exact sums, so ids agree; cosine may tie-swap
        np.testing.assert_array_equal(sI, dI)


def test_sparse_rerank_with_unsorted_duplicate_entries(split):
    db, ids, queries = split
    X = sp.random(300, 40, density=0.2, random_state=0, format="coo") * 10
    X = sp.csr_matrix(np.round(X.toarray()))
    # the same matrix with duplicated, unsorted entries per row (summing to the same values)
    data, indices, indptr = [], [], [0]
    for r in range(X.shape[0]):
        row = X.getrow(r)
        half = np.floor(row.data / 2)
        data += list((row.data - half)[::-1]) + list(half)
        indices += list(row.indices[::-1]) + list(row.indices)
        indptr.append(len(data))
    dup = sp.csr_matrix((np.array(data), np.array(indices), np.array(indptr)), shape=X.shape)
    assert not dup.has_canonical_format
    a = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="sqeuclidean").fit(X.toarray())
    a.add(dup)
    b = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="sqeuclidean").fit(X.toarray())
    b.add(X.toarray())
    for got, want in zip(a.search(X[:20], 5), b.search(X[:20].toarray(), 5), strict=True):
        np.testing.assert_array_equal(got, want)


def test_sparse_metric_rerank_equals_dense(split):
    db, ids, queries = split
    hasher = _EuclideanMetricLSH(n_bits=N_BITS, random_state=0)
    s = Searcher(hasher, rerank="metric").fit(db).add(sp.csr_matrix(db), ids=ids)
    assert sp.issparse(vectors_of(s))
    plain = make_searcher(db, ids, rerank="euclidean")
    for a, b in zip(s.search(sp.csr_matrix(queries), 5), plain.search(queries, 5), strict=True):
        np.testing.assert_array_equal(a, b)


def test_batched_kernel_equals_brute_force_on_random_floats():
    """All pairs, exact metrics, float data: distances agree to rounding, every id is a
    true candidate whose recomputed distance matches."""
    rng = np.random.default_rng(3)
    db = rng.standard_normal((400, 12))
    q = rng.standard_normal((30, 12))
    for name in ("sqeuclidean", "inner_product", "cosine"):
        s = Searcher(RandomHyperplaneLSH(16, random_state=0), rerank=name, n_candidates=400)
        s.fit(db).add(db)
        D, I = s.search(q, 5)
        D = as_distance(D, name)
        full = {
            "sqeuclidean": ((q[:, None] - db[None]) ** 2).sum(-1),
            "inner_product": -(q @ db.T),
            "cosine": 1
            - (q @ db.T) / (np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(db, axis=1)[None]),
        }[name]
        np.testing.assert_allclose(D, np.sort(full, axis=1)[:, :5], rtol=1e-5, atol=1e-5)
        np.testing.assert_allclose(np.take_along_axis(full, I, 1), D, rtol=1e-5, atol=1e-5)


# ------------------------------------------------------------------------- save / load


def _assert_same_results(a, b, queries):
    for x, y in zip(a.search(queries, 7), b.search(queries, 7), strict=True):
        np.testing.assert_array_equal(x, y)


@pytest.mark.parametrize("rerank", [None, "euclidean", "cosine"])
@pytest.mark.parametrize("mmap", [False, True])
def test_save_load_round_trip(split, tmp_path, rerank, mmap):
    db, ids, queries = split
    s = make_searcher(db, ids, rerank=rerank, n_candidates=60)
    s.save(tmp_path / "s")
    loaded = Searcher.load(tmp_path / "s", mmap=mmap)
    assert loaded.rerank == rerank and loaded.n_candidates == 60
    assert type(loaded.hasher) is RandomHyperplaneLSH
    _assert_same_results(s, loaded, queries)
    if rerank is not None:
        np.testing.assert_array_equal(state_of(loaded).ids, state_of(s).ids)
        assert isinstance(vectors_of(loaded), np.memmap) == mmap
    # no pickle anywhere: only JSON and .npy files, each .npy loads with allow_pickle=False
    for f in (tmp_path / "s").rglob("*"):
        if f.is_file():
            assert f.suffix in (".json", ".npy"), f
            if f.suffix == ".npy":
                np.load(f, allow_pickle=False)
    # the loaded searcher keeps working: add and remove
    loaded.add(queries[:5], ids=np.arange(5) + 10**6)
    assert loaded.search(queries[:5], 1)[1][:, 0].tolist() == list(range(10**6, 10**6 + 5))
    loaded.remove(np.arange(5) + 10**6)
    _assert_same_results(s, loaded, queries)


def test_save_load_sparse_vectors_as_csr(split, tmp_path):
    db, ids, queries = split
    s = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="euclidean", n_candidates=50)
    s.fit(db).add(sp.csr_matrix(db), ids=ids)
    s.save(tmp_path / "s")
    names = {f.name.split(".")[0] for f in (tmp_path / "s").glob("*.npy")}
    assert {"vectors_data", "vectors_indices", "vectors_indptr", "vector_ids"} <= names
    assert "vectors" not in names
    loaded = Searcher.load(tmp_path / "s", mmap=True)
    assert sp.issparse(vectors_of(loaded))
    assert (vectors_of(loaded) != vectors_of(s)).nnz == 0
    _assert_same_results(s, loaded, sp.csr_matrix(queries))


def test_save_over_an_existing_save_replaces_it(split, tmp_path):
    db, ids, queries = split
    path = tmp_path / "s"
    a = make_searcher(db[:300], ids[:300], rerank="euclidean")
    a.save(path)
    before = sorted(p.name for p in path.iterdir() if p.is_dir())
    b = make_searcher(db, ids, rerank="sqeuclidean", n_candidates=40)
    b.save(path)
    after = sorted(p.name for p in path.iterdir() if p.is_dir())
    assert len(after) == 2 and not set(after) & set(before)  # old components deleted
    loaded = Searcher.load(path)
    assert loaded.rerank == "sqeuclidean" and len(loaded.index) == len(db)
    _assert_same_results(b, loaded, queries)


def test_save_refusals_and_corrupt_saves(split, tmp_path):
    db, ids, queries = split
    s = make_searcher(db[:100], ids[:100], rerank=lambda q, c: np.zeros(c.shape[:2]))
    with pytest.raises(TypeError, match="callable"):
        s.save(tmp_path / "callable")
    assert not (tmp_path / "callable").exists()
    (tmp_path / "plain").mkdir()
    (tmp_path / "plain" / "x.txt").write_text("user data")
    with pytest.raises(FileExistsError):
        make_searcher(db[:100], ids[:100]).save(tmp_path / "plain")
    assert (tmp_path / "plain" / "x.txt").read_text() == "user data"
    # a FlatIndex save is not a Searcher
    index = FlatIndex(N_BITS)
    index.add(np.zeros((2, 4), np.uint8))
    index.save(tmp_path / "index")
    with pytest.raises(TypeError, match="not a Searcher"):
        Searcher.load(tmp_path / "index")
    # a component directory name that leaves the save is refused
    good = make_searcher(db[:100], ids[:100], rerank="euclidean")
    good.save(tmp_path / "s")
    meta_path = tmp_path / "s" / "meta.json"
    import json

    meta = json.loads(meta_path.read_text())
    meta["state"]["hasher_dir"] = "../index"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="inconsistent"):
        Searcher.load(tmp_path / "s")


def test_save_load_bucketer_with_table_index(split, tmp_path):
    from hashlearn import LSHTables, TableIndex

    db, ids, queries = split
    s = Searcher(LSHTables(4, 8, random_state=0), TableIndex(4), rerank="euclidean")
    s.fit(db).add(db, ids=ids)
    s.save(tmp_path / "s")
    loaded = Searcher.load(tmp_path / "s")
    assert type(loaded.hasher) is LSHTables and type(loaded.index) is TableIndex
    _assert_same_results(s, loaded, queries)


class _SparseEuclideanMetricLSH(_EuclideanMetricLSH):
    """Also scores CSR pair differences directly (the sparse learned-metric protocol)."""

    calls = 0

    def metric_distances_from_differences(self, Z):
        assert sp.issparse(Z) and Z.format == "csr"  # never densified by the searcher
        type(self).calls += 1
        return np.sqrt(np.asarray(Z.multiply(Z).sum(axis=1)).ravel())


def test_sparse_metric_rerank_scores_csr_differences(split):
    db, ids, queries = split
    hasher = _SparseEuclideanMetricLSH(n_bits=N_BITS, random_state=0)
    s = Searcher(hasher, rerank="metric").fit(db).add(sp.csr_matrix(db), ids=ids)
    plain = make_searcher(db, ids, rerank="euclidean")
    got = s.search(sp.csr_matrix(queries), 5)
    assert _SparseEuclideanMetricLSH.calls >= 1
    for a, b in zip(got, plain.search(queries, 5), strict=True):
        np.testing.assert_array_equal(a, b)


def test_clipped_hasher_gets_an_index_of_its_fitted_code_length():
    """PCA hashing clips n_bits to the number of features at fit; the Searcher follows."""
    from hashlearn import PCAHashing, load_digits

    X, _ = load_digits()
    X = X[:400].astype(np.float64)
    s = Searcher(PCAHashing(n_bits=80), "flat")
    with pytest.warns(UserWarning, match="n_bits"):
        s.fit(X)
    assert s.hasher.n_bits_ == 64 and s.index.n_bits == 64
    s.add(X)
    D, I = s.search(X[:5], k=1)
    assert (D[:, 0] == 0).all()
    fixed = Searcher(PCAHashing(n_bits=80), FlatIndex(n_bits=80))
    with pytest.warns(UserWarning), pytest.raises(ValueError, match="64-bit codes"):
        fixed.fit(X)


# ------------------------------------------- batched kernels: fused top-k, learned metric


def _brute_top_k(full: np.ndarray, allowed: np.ndarray, k: int):
    """Per row, the k smallest of ``full`` over the ``allowed`` columns by (distance, column)."""
    masked = np.where(allowed, full, np.inf)
    order = np.lexsort((np.broadcast_to(np.arange(full.shape[1]), full.shape), masked), axis=1)
    order = order[:, :k]
    D = np.take_along_axis(masked, order, 1)
    return D, np.where(np.isfinite(D), order, -1)


@pytest.mark.parametrize("kind", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_distance_kernel_keeps_the_k_nearest_by_distance_then_row(kind, dtype):
    """Integer-valued vectors (exact in any summation order) with duplicated rows (ties),
    zero rows (cosine 1), candidate lists with -1 padding and fewer than k real entries."""
    from hashlearn.rerank._kernels import distance_kernel
    from hashlearn.rerank.refiner import _BUILTIN

    rng = np.random.default_rng(5)
    V = rng.integers(-3, 4, (60, 9)).astype(dtype)
    V[10:20] = V[:10]  # ties
    V[20] = 0.0
    Q = rng.integers(-3, 4, (25, 9)).astype(np.float64)
    Q[0] = 0.0
    cand = np.stack([rng.permutation(60)[:30] for _ in range(25)])
    cand[:, ::4] = -1
    cand[3, 2:] = -1  # one real candidate only
    q, v = Q.astype(np.float64), V.astype(np.float64)
    dot = q @ v.T
    sq = (q**2).sum(1)[:, None] + (v**2).sum(1)[None] - 2 * dot
    norms = np.linalg.norm(q, axis=1)[:, None] * np.linalg.norm(v, axis=1)[None]
    with np.errstate(invalid="ignore", divide="ignore"):
        cos = np.where(norms > 0, 1 - dot / np.where(norms > 0, norms, 1), 1.0)
    full = {"sqeuclidean": sq, "euclidean": np.sqrt(sq), "inner_product": -dot, "cosine": cos}
    allowed = np.zeros((25, 60), bool)
    for i, row in enumerate(cand):
        allowed[i, row[row >= 0]] = True
    k = 7
    out_d = np.full((25, k), np.inf)
    out_i = np.full((25, k), -1, np.int64)
    distance_kernel(Q, V, cand, _BUILTIN[kind][1], k, out_d, out_i, 0, 25)
    D, I_ = _brute_top_k(full[kind], allowed, k)
    np.testing.assert_allclose(out_d, D, rtol=1e-12, atol=1e-12)
    if kind in ("sqeuclidean", "inner_product"):  # exact integers: ties broken by row
        np.testing.assert_array_equal(out_i, I_)
    else:  # every kept row's distance is the brute-force one
        valid = out_i >= 0
        np.testing.assert_array_equal(valid, I_ >= 0)
        got = np.take_along_axis(full[kind], np.maximum(out_i, 0), 1)
        np.testing.assert_allclose(got[valid], out_d[valid], rtol=1e-12)


def _screened_and_exact(Q, V, cand, kind, k):
    from hashlearn.rerank._kernels import distance_kernel, rescore_runner, screened_distance_kernel

    m = Q.shape[0]
    want = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    distance_kernel(Q, V, cand, kind, k, *want, 0, m)
    got = np.full((m, k), np.inf), np.full((m, k), -1, np.int64)
    rescore_runner(Q, V, cand, kind, k, *got)(0, m)
    return want, got, screened_distance_kernel


@pytest.mark.parametrize("kind", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
@pytest.mark.parametrize(
    "case", ["gaussian", "one-ulp neighbours", "huge", "tiny", "float64 queries", "nan row"]
)
def test_float32_screening_returns_the_float64_kernels_rows_and_distances(kind, case):
    """The screened kernel (float32 bounds, float64 for the pairs that can still win) keeps
    exactly the rows of the float64 kernel, and its distances to rounding: near-ties a float32 score cannot
    tell apart (neighbours 1 ulp apart, duplicates), float32 overflow (|x| ~ 1e25) and
    underflow (|x| ~ 1e-30), queries not exact in float32, a row of NaN."""
    from hashlearn.rerank.refiner import _BUILTIN

    rng = np.random.default_rng(11)
    n, d, m, c, k = 300, 40, 30, 60, 7
    V = rng.standard_normal((n, d)).astype(np.float32)
    if case == "one-ulp neighbours":
        V[100:200] = np.nextafter(V[:100], np.float32(np.inf))
        V[200:] = V[:100]
    elif case == "huge":
        V *= np.float32(1e25)
    elif case == "tiny":
        V *= np.float32(1e-30)
    elif case == "nan row":
        V[5] = np.nan
    Q = V[rng.integers(0, n, m)].astype(np.float64)
    if case == "float64 queries":
        Q += rng.standard_normal(Q.shape) * 1e-4
    elif case != "nan row":
        Q = Q.astype(np.float32)
    cand = np.stack([rng.permutation(n)[:c] for _ in range(m)])
    cand[:, ::5] = -1
    cand[4, 3:] = -1  # fewer than k candidates
    cand[0, :10] = 5  # a row listed for several queries... and twice for one
    cand[1, :10] = 5
    want, got, _ = _screened_and_exact(Q, V, cand, _BUILTIN[kind][1], k)
    np.testing.assert_array_equal(got[1], want[1])
    # float64 sums with reassociation: equal to rounding (two compiled loops may order them
    # differently); near-ties here are a float32 ulp apart or exact, so the rows are exact
    np.testing.assert_allclose(got[0], want[0], rtol=1e-12, atol=0)


def test_float32_screening_runs_and_prunes():
    """On Gaussian data the screen leaves about k pairs per query for float64 (called
    directly, so the test fails if the runner stops choosing it)."""
    from hashlearn.rerank._kernels import SQEUCLIDEAN

    rng = np.random.default_rng(2)
    V = rng.standard_normal((2000, 64)).astype(np.float32)
    Q = rng.standard_normal((50, 64)).astype(np.float32)
    cand = np.stack([rng.permutation(2000)[:200] for _ in range(50)])
    k = 10
    want, got, kernel = _screened_and_exact(Q, V, cand, SQEUCLIDEAN, k)
    direct = np.full((50, k), np.inf), np.full((50, k), -1, np.int64)
    scored = kernel(Q, Q, np.zeros(50), V, cand, SQEUCLIDEAN, k, *direct, 0, 50)
    assert 50 * k <= scored <= 50 * 2 * k  # of 50 * 200 pairs
    for out in (got, direct):
        np.testing.assert_array_equal(out[1], want[1])
        np.testing.assert_allclose(out[0], want[0], rtol=1e-12, atol=0)


@pytest.mark.parametrize("n_rows", [50, 5000, 3_000_000])
def test_pairs_by_row_sorts_by_row_then_query(n_rows):
    """The rescoring order: every (row, query) pair once, -1 skipped, by row then query
    (one, two and three radix passes)."""
    from hashlearn.rerank._kernels import pairs_by_row

    rng = np.random.default_rng(n_rows)
    cand = rng.integers(-1, n_rows, (40, 30))
    cand[5] = -1  # a query without candidates
    cand[6, :3] = cand[7, :3]  # rows shared by queries
    rows, queries = pairs_by_row(cand, 2, 37)
    q_all, j_all = np.nonzero(cand[2:37] >= 0)
    want_rows, want_queries = cand[2:37][q_all, j_all], q_all + 2
    order = np.lexsort((want_queries, want_rows))
    np.testing.assert_array_equal(rows, want_rows[order])
    np.testing.assert_array_equal(queries, want_queries[order])
    empty = pairs_by_row(np.full((3, 4), -1), 0, 3)
    assert empty[0].shape == (0,) and empty[1].shape == (0,)


@pytest.mark.parametrize("name", ["sqeuclidean", "inner_product", "cosine"])
def test_sparse_batched_kernel_equals_brute_force_on_random_floats(name):
    """CSR vectors (float32) and queries, every item a candidate: distances agree to
    rounding and every returned id's brute-force distance is the one reported."""
    db = sp.random(300, 40, density=0.2, format="csr", random_state=1, dtype=np.float32)
    keep = np.ones(300, np.float32)
    keep[7] = 0.0
    db = sp.csr_matrix(sp.diags(keep) @ db)  # row 7 empty (cosine 1)
    db.eliminate_zeros()
    q = sp.random(20, 40, density=0.2, format="csr", random_state=2)
    ids = np.random.default_rng(4).permutation(300) * 3
    s = Searcher(RandomHyperplaneLSH(16, random_state=0), rerank=name, n_candidates=300)
    s.fit(db).add(db, ids=ids)
    assert sp.issparse(vectors_of(s))
    D, I_ = s.search(q, 5)
    D = as_distance(D, name)
    a, b = q.toarray(), db.toarray().astype(np.float64)
    dot = a @ b.T
    norms = np.linalg.norm(a, axis=1)[:, None] * np.linalg.norm(b, axis=1)[None]
    full = {
        "sqeuclidean": ((a[:, None] - b[None]) ** 2).sum(-1),
        "inner_product": -dot,
        "cosine": np.where(norms > 0, 1 - dot / np.where(norms > 0, norms, 1), 1.0),
    }[name]
    np.testing.assert_allclose(D, np.sort(full, axis=1)[:, :5], rtol=1e-5, atol=1e-6)
    row_of_id = np.argsort(ids)[np.searchsorted(np.sort(ids), I_)]
    got = np.take_along_axis(full, row_of_id, 1)
    np.testing.assert_allclose(got, D, rtol=1e-5, atol=1e-6)


def _metric_hasher(d: int, seed: int = 0, *, sparse: bool = False):
    """A fitted MetricLSH around a random full-rank factor G (no ITML fit: quick); with
    ``sparse``, a subclass that also encodes scipy.sparse rows (uncentred)."""
    from hashlearn.hashers import MetricLSH

    class _SparseMetricLSH(MetricLSH):
        accept_sparse = True

    rng = np.random.default_rng(seed)
    G = np.eye(d) + 0.3 * rng.standard_normal((d, d))
    cls = _SparseMetricLSH if sparse else MetricLSH
    return cls.from_metric(G=G, n_bits=24, random_state=seed)


def _learned_brute_force(A, db, queries):
    """``(x - q)^T A (x - q)`` for every pair, in numpy."""
    diff = db[None, :, :] - queries[:, None, :]
    return np.einsum("qnd,de,qne->qn", diff, A, diff)


def _assert_top_k_matches(D, I_, full, row_of_id, k, rtol=1e-9):
    """Distances equal the brute-force k smallest; ids equal except among tied distances."""
    expected = np.sort(full, axis=1)[:, :k]
    np.testing.assert_allclose(D, expected, rtol=1e-5)
    got = np.take_along_axis(full, row_of_id(I_), 1)
    np.testing.assert_allclose(got, expected, rtol=rtol, atol=1e-9)


@pytest.mark.parametrize("sparse", [False, True])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_learned_metric_rerank_equals_brute_force(split, sparse, dtype):
    """MetricLSH's learned metric runs as the batched squared-Euclidean kernel on the vectors
    mapped by G (computed once): every item a candidate gives the exact learned k-NN."""
    db, ids, queries = split
    db = db[:600].astype(dtype)
    ids = ids[:600]
    hasher = _metric_hasher(db.shape[1], sparse=sparse)
    s = Searcher(hasher, rerank="metric", n_candidates=600)
    s.add(sp.csr_matrix(db) if sparse else db, ids=ids)
    D, I_ = s.search(sp.csr_matrix(queries) if sparse else queries, 6)
    assert state_of(s).cached("mapped") is not None
    full = _learned_brute_force(hasher.A_, db.astype(np.float64), queries)
    order = np.argsort(ids)
    _assert_top_k_matches(D, I_, full, lambda I: order[np.searchsorted(ids[order], I)], 6)


def test_learned_metric_fast_path_equals_the_hashers_metric_distances(split):
    """Hamming candidates re-ranked by the mapped vectors and by the hasher's own
    metric_distances (a subclass takes the general path) agree: same candidates, same
    distances to rounding, same ids wherever distances are not tied."""
    from hashlearn.hashers import MetricLSH

    class _OwnMetric(MetricLSH):
        metric_transform = None  # no kernel form: the general path

        def metric_distances(self, queries, candidates):
            return super().metric_distances(queries, candidates)

    db, ids, queries = split
    fast_hasher = _metric_hasher(db.shape[1], seed=1)
    slow_hasher = _OwnMetric.from_metric(G=fast_hasher.G_, n_bits=24, random_state=1)
    fast = Searcher(fast_hasher, rerank="metric", n_candidates=80).add(db, ids=ids)
    slow = Searcher(slow_hasher, rerank="metric", n_candidates=80).add(db, ids=ids)
    (Df, If), (Ds, Is) = fast.search(queries, 8), slow.search(queries, 8)
    assert state_of(slow).cached("mapped") is None
    assert state_of(fast).cached("mapped") is not None
    np.testing.assert_allclose(Df, Ds, rtol=1e-5)
    untied = np.ones(Df.shape, bool)
    untied[:, 1:] &= ~np.isclose(Ds[:, 1:], Ds[:, :-1], rtol=1e-5)
    untied[:, :-1] &= ~np.isclose(Ds[:, :-1], Ds[:, 1:], rtol=1e-5)
    np.testing.assert_array_equal(If[untied], Is[untied])


def test_learned_metric_vectors_follow_add_remove_and_load(split, tmp_path):
    """The mapped vectors are derived state: rebuilt after add / remove, not saved, and
    recomputed after a load (memory-mapped vectors included)."""
    db, ids, queries = split
    s = Searcher(_metric_hasher(db.shape[1], seed=2), rerank="metric", n_candidates=50)
    s.add(db[:1000], ids=ids[:1000])
    first = s.search(queries, 5)
    s.add(db[1000:], ids=ids[1000:])
    s.remove(ids[1000:])
    for a, b in zip(first, s.search(queries, 5), strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-12)
    s.save(tmp_path / "s")
    names = {f.name for f in (tmp_path / "s").iterdir()}
    assert not any("mapped" in n or "metric" in n for n in names)
    for mmap in (False, True):
        loaded = Searcher.load(tmp_path / "s", mmap=mmap)
        assert state_of(loaded).cached("mapped") is None
        for a, b in zip(first, loaded.search(queries, 5), strict=True):
            np.testing.assert_array_equal(a, b)


def test_dense_and_sparse_ids_look_up_the_same_rows(split):
    """Ids 0..n-1 (table lookup) and widely spread ids (binary search) re-rank alike, and
    both refuse ids they hold no vectors for."""
    db, _, queries = split
    spread = np.arange(len(db)) * 10**6 + 5
    dense_ids = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="sqeuclidean")
    sparse_ids = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="sqeuclidean")
    dense_ids.fit(db).add(db)
    sparse_ids.fit(db).add(db, ids=spread)
    assert table_of(dense_ids) is not False and table_of(sparse_ids) is False
    Dd, Id = dense_ids.search(queries, 5)
    Ds, Is = sparse_ids.search(queries, 5)
    np.testing.assert_array_equal(Dd, Ds)
    np.testing.assert_array_equal(spread[Id], Is)
    for s, bad in ((dense_ids, len(db) + 3), (sparse_ids, 7)):
        with pytest.raises(ValueError, match="without vectors"):
            VectorStore.positions(state_of(s), np.array([[0 if s is dense_ids else 5, bad, -1]]))


def test_pad_candidates_keeps_each_lists_order_and_limit():
    from hashlearn.index._neighbors import pad_candidates as _pad_candidates

    lists = [np.array([5, 3, 9]), (np.array([7]), np.array([2])), np.array([], np.int64)]
    np.testing.assert_array_equal(
        _pad_candidates(lists, None), [[5, 3, 9], [7, -1, -1], [-1, -1, -1]]
    )
    np.testing.assert_array_equal(_pad_candidates(lists, 2), [[5, 3], [7, -1], [-1, -1]])
    np.testing.assert_array_equal(_pad_candidates([np.array([], np.int64)], None), [[-1]])
    assert _pad_candidates([], None).shape == (0, 1)


def _kernel_metric_split():
    """Sparse non-negative data with class structure, a fitted KernelMetricLSH (quick)."""
    from hashlearn.hashers import KernelMetricLSH

    rng = np.random.default_rng(6)
    y = rng.integers(0, 3, 400)
    X = sp.random(400, 30, density=0.15, format="csr", random_state=3)
    X = sp.csr_matrix(X + sp.csr_matrix((np.ones(400), (np.arange(400), y * 5)), shape=X.shape))
    hasher = KernelMetricLSH(n_bits=16, num_constraints=60, random_state=0).fit(X[:300], y[:300])
    return hasher, X[:300], X[300:]


def test_implicit_learned_metric_on_csr_equals_brute_force(tmp_path):
    """KernelMetricLSH over CSR vectors: CSR squared distances plus side features in the
    batched kernel (computed once; recomputed after a load), equal to (x - q)^T A (x - q)
    with A = G^T G."""
    hasher, db, queries = _kernel_metric_split()
    s = Searcher(hasher, rerank="metric", n_candidates=300).add(db)
    D, I_ = s.search(queries, 6)
    assert state_of(s).cached("side") is not None
    G = hasher.metric_factor()
    full = _learned_brute_force(G.T @ G, db.toarray(), queries.toarray())
    _assert_top_k_matches(D, I_, full, lambda I: I, 6)
    s.save(tmp_path / "s")
    loaded = Searcher.load(tmp_path / "s", mmap=True)
    for a, b in zip((D, I_), loaded.search(queries, 6), strict=True):
        np.testing.assert_array_equal(a, b)


def test_implicit_learned_metric_fast_path_equals_the_general_path():
    """Hamming candidates re-ranked by the kernel path and by the hasher's own
    metric_distances_from_differences (a subclass takes the general path) agree."""
    from hashlearn.hashers import KernelMetricLSH

    class _OwnMetric(KernelMetricLSH):
        metric_kernel_form = None  # no kernel form: the general path

        def metric_distances_from_differences(self, Z):
            return super().metric_distances_from_differences(Z)

    hasher, db, queries = _kernel_metric_split()
    slow_hasher = _OwnMetric(**hasher.get_params())
    slow_hasher.__dict__.update({k: v for k, v in vars(hasher).items() if k.endswith("_")})
    fast = Searcher(hasher, rerank="metric", n_candidates=40).add(db)
    slow = Searcher(slow_hasher, rerank="metric", n_candidates=40).add(db)
    (Df, If), (Ds, Is) = fast.search(queries, 8), slow.search(queries, 8)
    assert state_of(slow).cached("side") is None
    assert state_of(fast).cached("side") is not None
    np.testing.assert_allclose(Df, Ds, rtol=1e-5, atol=1e-6)
    untied = np.ones(Df.shape, bool)
    untied[:, 1:] &= ~np.isclose(Ds[:, 1:], Ds[:, :-1], rtol=1e-5)
    untied[:, :-1] &= ~np.isclose(Ds[:, :-1], Ds[:, 1:], rtol=1e-5)
    np.testing.assert_array_equal(If[untied], Is[untied])


@pytest.mark.parametrize("rerank", ["euclidean", "cosine", "metric"])
@pytest.mark.parametrize("sparse", [False, True])
def test_batched_rerank_does_not_depend_on_the_thread_count(split, rerank, sparse):
    db, ids, queries = split
    hasher = (
        _metric_hasher(db.shape[1], seed=3, sparse=sparse)
        if rerank == "metric"
        else RandomHyperplaneLSH(N_BITS, random_state=0).fit(db)
    )
    s = Searcher(hasher, rerank=rerank, n_candidates=40)
    s.add(sp.csr_matrix(db) if sparse else db, ids=ids)
    q = sp.csr_matrix(queries) if sparse else queries
    one = s.search(q, 5, n_threads=1)
    for a, b in zip(one, s.search(q, 5, n_threads=3), strict=True):
        np.testing.assert_array_equal(a, b)


@pytest.mark.parametrize("rerank", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
def test_the_8bit_screen_changes_no_result(split, rerank):
    """``screen=True`` (the default: an 8-bit copy screens the candidates) and
    ``screen=False`` return the same ids and distances; the copy follows add and remove."""
    db, ids, queries = split
    noisy = queries + np.random.default_rng(0).standard_normal(queries.shape) * 0.37
    on = make_searcher(db, ids, rerank=rerank, n_candidates=120)
    off = Searcher(on.hasher, FlatIndex(N_BITS), rerank=rerank, n_candidates=120, screen=False)
    off.add(db, ids=ids)
    assert on.screen and not off.screen

    def same(Q):  # integer data sum exactly; otherwise float64 sums agree to rounding
        (d_on, i_on), (d_off, i_off) = on.search(Q, 7), off.search(Q, 7)
        np.testing.assert_array_equal(i_on, i_off)
        np.testing.assert_allclose(d_on, d_off, rtol=1e-6)

    _assert_same_results(on, off, queries)
    for Q in (noisy, noisy.astype(np.float32)):
        same(Q)
    assert screen_of(on) is not None and screen_of(off) is None
    for s in (on, off):
        s.add(noisy[:20], ids=np.arange(20) + 10**6)
        s.remove(ids[:50])
    same(noisy)


def test_screen_setting_is_saved_and_checked(split, tmp_path):
    import json

    db, ids, _ = split
    with pytest.raises(TypeError, match="screen"):
        Searcher(RandomHyperplaneLSH(N_BITS), screen="yes")
    s = Searcher(RandomHyperplaneLSH(N_BITS, random_state=0), rerank="euclidean", screen=False)
    s.fit(db).add(db[:100])
    s.save(tmp_path / "s")
    assert Searcher.load(tmp_path / "s").screen is False
    meta_path = tmp_path / "s" / "meta.json"
    meta = json.loads(meta_path.read_text())
    del meta["params"]["screen"]  # a save from before the setting existed
    meta_path.write_text(json.dumps(meta))
    assert Searcher.load(tmp_path / "s", verify=False).screen is True
    meta["params"]["screen"] = "no"
    meta_path.write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="screen"):
        Searcher.load(tmp_path / "s", verify=False)


def test_an_8bit_screen_that_does_not_prune_is_dropped(split):
    """One outlier value sets the single step far above the data's spread: the screen
    leaves most pairs for full precision, so the searcher drops it after one search (same
    results) and builds it anew when its vectors change; on the digits it stays."""
    db, ids, queries = split
    rng = np.random.default_rng(1)
    wide = rng.standard_normal(db.shape)
    wide[0, 0] = 1e4
    s = make_searcher(wide, ids, rerank="euclidean", n_candidates=100)
    ref = Searcher(s.hasher, FlatIndex(N_BITS), rerank="euclidean", n_candidates=100, screen=False)
    ref.add(wide, ids=ids)
    q = wide[1:41] + rng.standard_normal((40, db.shape[1])) * 0.1
    first = s.search(q, 7)
    assert screen_of(s)[1] is False  # dropped
    for x, y in zip(first, ref.search(q, 7), strict=True):
        np.testing.assert_array_equal(x, y)
    _assert_same_results(s, ref, q)
    s.add(q[:3], ids=np.arange(3) + 10**6)
    s.search(q[:5], 7)
    assert screen_of(s)[0] is vectors_of(s)  # a new set of vectors is screened anew
    digits = make_searcher(db, ids, rerank="euclidean", n_candidates=100)
    digits.search(queries, 7)
    assert screen_of(digits)[1] is not False


def _bag_of_digits(X):
    """The digits (upsampled to 16 x 16) as sparse L2-normalised histograms over binarised
    4x4 patches: the sparse protocol of the learned-metric paper in miniature."""
    from hashlearn.experiments.learned_metric import bag_of_patches

    imgs = np.kron(X.reshape(-1, 8, 8), np.ones((1, 2, 2)))  # 16 x 16
    return bag_of_patches(imgs.reshape(len(X), -1) * 16, side=16, level=100)


@pytest.mark.parametrize("rerank", ["sqeuclidean", "euclidean", "inner_product", "cosine"])
def test_the_csr_sketch_screen_changes_no_result(split, rerank):
    """``screen=True`` (the default: a bucket-norm sketch screens CSR candidates) and
    ``screen=False`` return the same ids and the same distances (both score a pair with one
    loop), before and after add and remove."""
    db, ids, queries = split
    X, Q = _bag_of_digits(db), _bag_of_digits(queries)
    hasher = RandomHyperplaneLSH(N_BITS, directions="gaussian", random_state=0)
    on = Searcher(hasher, FlatIndex(N_BITS), rerank=rerank, n_candidates=150).fit(X)
    off = Searcher(on.hasher, FlatIndex(N_BITS), rerank=rerank, n_candidates=150, screen=False)
    for s in (on, off):
        s.add(X, ids=ids)
    _assert_same_results(on, off, Q)
    sketch = screen_of(on)[1][0]
    assert screen_of(on)[0] is vectors_of(on) and screen_of(off) is None
    assert sketch.codes.shape == (X.shape[0], 64)
    for s in (on, off):
        s.add(Q[:20], ids=np.arange(20) + 10**6)
        s.remove(ids[:50])
    _assert_same_results(on, off, Q)
    assert screen_of(on)[0] is vectors_of(on)  # rebuilt for the new set of vectors


def test_a_csr_sketch_that_does_not_prune_is_dropped(split):
    """Random signed unit rows with no structure (half the columns used): every candidate
    is about as far as the next, the sketch (which sees only magnitudes) spares few exact
    pairs, and the searcher drops it (same results)."""
    db, ids, _ = split
    rng = np.random.default_rng(3)

    def unit_rows(n, seed):
        M = sp.random(n, 200, density=0.5, random_state=seed, format="csr")
        M.data = rng.standard_normal(M.nnz)
        return sp.csr_matrix(sp.diags(1 / np.sqrt(M.multiply(M).sum(1).A.ravel())) @ M)

    X, Q = unit_rows(len(db), 4), unit_rows(40, 5)
    hasher = RandomHyperplaneLSH(N_BITS, directions="gaussian", random_state=0)
    s = Searcher(hasher, FlatIndex(N_BITS), rerank="euclidean", n_candidates=100).fit(X)
    ref = Searcher(s.hasher, FlatIndex(N_BITS), rerank="euclidean", n_candidates=100, screen=False)
    for searcher in (s, ref):
        searcher.add(X, ids=ids)
    first = s.search(Q, 7)
    assert screen_of(s)[1] is False  # dropped
    for x, y in zip(first, ref.search(Q, 7), strict=True):
        np.testing.assert_array_equal(x, y)


# ------------------------------------------------- composition: budget, convention, shards


def test_the_candidate_budget_can_be_given_per_search(split):
    """``n_candidates`` (absolute) or ``k_factor`` (a multiple of k) per call: the same
    results as a searcher built with that budget; both at once, or a bad value, refused."""
    db, ids, queries = split
    s = make_searcher(db, ids, rerank="euclidean", n_candidates=100)
    for kwargs, n in (({"n_candidates": 30}, 30), ({"k_factor": 6}, 42)):
        fixed = Searcher(s.hasher, FlatIndex(N_BITS), rerank="euclidean", n_candidates=n)
        fixed.add(db, ids=ids)
        for a, b in zip(s.search(queries, 7, **kwargs), fixed.search(queries, 7), strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="not both"):
        s.search(queries, 7, n_candidates=30, k_factor=3)
    for bad in ({"k_factor": 0}, {"n_candidates": -1}, {"k_factor": 1.5}):
        with pytest.raises((ValueError, TypeError), match=next(iter(bad))):
            s.search(queries, 7, **bad)


@pytest.mark.parametrize("rerank", ["inner_product", "cosine", "euclidean"])
def test_similarities_largest_first_distances_smallest_first(rerank):
    """The result convention: inner product and cosine similarity reported as themselves,
    largest first, padded with -inf; distances smallest first, padded with inf."""
    rng = np.random.default_rng(0)
    X = rng.integers(-3, 4, (5, 6)).astype(np.float64)
    q = rng.integers(-3, 4, (2, 6)).astype(np.float64)
    s = Searcher(RandomHyperplaneLSH(16, random_state=0), rerank=rerank).fit(X).add(X)
    D, I_ = s.search(q, 7)
    assert (I_[:, 5:] == -1).all() and sorted(I_[0, :5].tolist()) == list(range(5))
    full = {
        "inner_product": q @ X.T,
        "cosine": (q @ X.T) / np.outer(np.linalg.norm(q, axis=1), np.linalg.norm(X, axis=1)),
        "euclidean": np.sqrt(((q[:, None] - X[None]) ** 2).sum(-1)),
    }[rerank]
    np.testing.assert_allclose(D[:, :5], np.take_along_axis(full, I_[:, :5], 1), rtol=1e-6)
    similarity = rerank != "euclidean"
    step = np.diff(D[:, :5], axis=1)
    assert (step <= 1e-6).all() if similarity else (step >= -1e-6).all()
    assert (D[:, 5:] == (-np.inf if similarity else np.inf)).all()


class _FakeShardedIndex:
    """The calls a Searcher makes on a sharded index (``ShardedIndex``'s interface), served
    in process by one FlatIndex and one Refiner: no Dask."""

    def __init__(self, n_bits):
        from hashlearn.rerank import Refiner

        self.n_bits, self.flat, self.refiner, self.calls = n_bits, FlatIndex(n_bits), None, []
        self._make = Refiner

    def attach_refiner(self, metric, hasher, screen):
        self.calls.append("attach_refiner")
        self.refiner = self._make(metric, hasher=hasher, screen=screen)

    def add(self, codes, ids=None, vectors=None):
        self.calls.append("add")
        new_ids = self.flat.add(codes, ids)
        self.refiner.add(vectors, new_ids)
        return new_ids

    def remove(self, ids):
        self.calls.append("remove")
        self.refiner.remove(ids)
        return self.flat.remove(ids)

    def search(self, codes, k, n_threads=None):
        return self.flat.search(codes, k, n_threads=n_threads)

    def refine_search(self, X, codes, k, n_candidates):
        self.calls.append(("refine_search", n_candidates))
        _, cand = self.flat.search(codes, n_candidates)
        return self.refiner.refine(X, cand, k)

    def __len__(self):
        return len(self.flat)


def test_a_sharded_index_keeps_and_refines_the_vectors_itself(split):
    """Over an index with ``refine_search`` the Searcher keeps no vectors: it attaches the
    refine stage once before the first add, adds codes with their vectors, and asks the
    index to refine -- the same results as the local composition."""
    db, ids, queries = split
    hasher = RandomHyperplaneLSH(N_BITS, random_state=0).fit(db)
    local = Searcher(hasher, FlatIndex(N_BITS), rerank="euclidean", n_candidates=50)
    fake = _FakeShardedIndex(N_BITS)
    sharded = Searcher(hasher, fake, rerank="euclidean", n_candidates=50)
    assert sharded.refiner is None
    for s in (local, sharded):
        s.add(db[:900], ids=ids[:900]).add(db[900:], ids=ids[900:])
    assert fake.calls == ["attach_refiner", "add", "add"]
    _assert_same_results(local, sharded, queries)
    assert fake.calls[-1] == ("refine_search", 50)
    want, got = local.search(queries, 5, k_factor=3), sharded.search(queries, 5, k_factor=3)
    for a, b in zip(want, got, strict=True):
        np.testing.assert_array_equal(a, b)
    assert fake.calls[-1] == ("refine_search", 15)
    assert local.remove(ids[:40]) == sharded.remove(ids[:40]) == 40
    _assert_same_results(local, sharded, queries)
