"""EmbeddingIndex (codes + over-fetch + exact rescoring), the sign hasher and the data-set
loader, each checked against brute force in float64."""

from __future__ import annotations

import json
import warnings
from pathlib import Path

import numpy as np
import pytest

from hashlearn import io as hio
from hashlearn.embeddings import EmbeddingIndex, load_embeddings, rescore
from hashlearn.hashers import SignHashing, make_hasher
from hashlearn.index import FlatIndex

D = 24


def _data(n=600, m=20, d=D, seed=0):
    rng = np.random.default_rng(seed)
    centers = rng.standard_normal((8, d))
    X = centers[rng.integers(0, 8, n)] + 0.6 * rng.standard_normal((n, d))
    Q = centers[rng.integers(0, 8, m)] + 0.6 * rng.standard_normal((m, d))
    return X.astype(np.float32), Q.astype(np.float32)


def _unit(A):
    A = np.asarray(A, np.float64)
    return A / np.linalg.norm(A, axis=1, keepdims=True)


def _check_topk(S, scores, ids, k):
    """``ids`` are a true top-k of the similarity matrix ``S`` (robust to ties), and
    ``scores`` are their similarities, best first."""
    true_top = -np.sort(-S, axis=1)[:, :k]
    got = np.take_along_axis(S, ids, axis=1)
    np.testing.assert_allclose(got, true_top, atol=1e-5)
    np.testing.assert_allclose(scores, got, atol=1e-5)
    assert np.all(np.diff(scores, axis=1) <= 1e-6)
    assert all(len(set(row)) == k for row in ids.tolist())


# ------------------------------------------------------------------------------ sign bits


def test_sign_bits_match_brute_force():
    X, _ = _data()
    bits = np.unpackbits(SignHashing(n_bits=D).fit(X).encode(X), axis=1, bitorder="little")
    np.testing.assert_array_equal(bits[:, :D], (X > 0).astype(np.uint8))
    h = SignHashing(n_bits=D, center=True).fit(X)
    bits = np.unpackbits(h.encode(X), axis=1, bitorder="little")[:, :D]
    mean = X.astype(np.float64).mean(axis=0)
    np.testing.assert_allclose(h.mean_, mean, rtol=1e-9)
    far = np.abs(X - mean) > 1e-4  # away from the threshold, float32 vs float64 agree
    np.testing.assert_array_equal(bits[far], (X - mean > 0)[far])
    assert isinstance(make_hasher("sign", n_bits=4), SignHashing)


def test_sign_bits_of_non_negative_data_with_zeros_are_informative():
    """Pixels: with ``>= 0`` every code of digits was all ones (recall = chance)."""
    from hashlearn import load_digits

    X, _ = load_digits()
    codes = SignHashing(n_bits=64).fit(X).encode(X)
    assert len(np.unique(codes, axis=0)) > 1000
    np.testing.assert_array_equal(
        np.unpackbits(codes, axis=1, bitorder="little"), (X > 0).astype(np.uint8)
    )


def test_sign_bit_selection_and_clipping():
    rng = np.random.default_rng(1)
    scale = np.array([1.0, 5.0, 0.1, 3.0, 2.0, 0.5])
    X = rng.standard_normal((300, 6)) * scale
    assert SignHashing(n_bits=3).fit(X).dims_.tolist() == [1, 3, 4]
    assert SignHashing(n_bits=3, select="first").fit(X).dims_.tolist() == [0, 1, 2]
    h = SignHashing(n_bits=3).fit(X)
    bits = np.unpackbits(h.encode(X), axis=1, bitorder="little")[:, :3]
    np.testing.assert_array_equal(bits, (X[:, [1, 3, 4]] > 0).astype(np.uint8))
    with pytest.warns(UserWarning, match="n_bits_=6"):
        h = SignHashing(n_bits=10).fit(X)
    assert h.n_bits_ == 6 and h.encode(X).shape == (300, 1)
    with pytest.raises(ValueError, match="'select'"):
        SignHashing(n_bits=3, select="random").fit(X)
    with pytest.raises(ValueError, match="'center'"):
        SignHashing(n_bits=3, center="yes").fit(X)


# ------------------------------------------------------------------------------ rescoring


def test_rescore_matches_brute_force_with_padding():
    rng = np.random.default_rng(2)
    V = rng.standard_normal((300, 16)).astype(np.float32)
    Q = rng.standard_normal((40, 16)).astype(np.float32)
    cand = np.stack([rng.choice(300, 50, replace=False) for _ in range(40)])
    cand[::3, -7:] = -1  # padding
    cand[5, :] = -1  # no candidates at all
    scores, ids = rescore(Q, V, cand, 10)
    S = Q.astype(np.float64) @ V.T.astype(np.float64)
    for i in range(40):
        c = cand[i][cand[i] >= 0]
        if len(c) == 0:
            assert ids[i].tolist() == [-1] * 10 and np.all(np.isneginf(scores[i]))
            continue
        order = np.lexsort((c, -S[i, c]))[:10]
        np.testing.assert_allclose(scores[i], S[i, c[order]], atol=1e-5)
        assert set(ids[i].tolist()) == set(c[order].tolist())


def test_rescore_breaks_ties_by_smaller_id():
    V = np.ones((6, 4), np.float32)
    cand = np.array([[5, 3, 4, 0, 2, 1]])
    _, ids = rescore(np.ones((1, 4), np.float32), V, cand, 4)
    assert ids.tolist() == [[0, 1, 2, 3]]


# --------------------------------------------------------------------------- the index


@pytest.mark.parametrize("hasher,n_bits", [("itq", 16), ("sign", D), ("lsh", 48)])
def test_search_with_all_candidates_is_exact_cosine(hasher, n_bits):
    X, Q = _data()
    index = EmbeddingIndex(hasher, n_bits=n_bits).fit(X).add(X)
    scores, ids = index.search(Q, 10, overfetch=len(X))  # every vector rescored
    _check_topk(_unit(Q) @ _unit(X).T, scores, ids, 10)


def test_inner_product_metric_keeps_norms():
    X, Q = _data()
    X[::2] *= 3.0
    index = EmbeddingIndex("itq", n_bits=16, metric="ip").fit(X).add(X)
    np.testing.assert_array_equal(index.vectors, X)
    scores, ids = index.search(Q, 5, overfetch=len(X))
    _check_topk(Q.astype(np.float64) @ X.T.astype(np.float64), scores, ids, 5)


def test_recall_grows_with_overfetch_and_candidates_come_from_hamming_order():
    X, Q = _data(n=800)
    index = EmbeddingIndex("itq", n_bits=16).fit(X).add(X)
    S = _unit(Q) @ _unit(X).T
    quality = []
    for overfetch in (1, 2, 4, 16):
        scores, ids = index.search(Q, 10, overfetch=overfetch)
        # the result is the exact top-10 of the k * overfetch nearest codes
        _, cand = index.codes_.search(index.hasher_.encode(_unit(Q)), 10 * overfetch)
        sub = np.take_along_axis(S, cand, axis=1)
        np.testing.assert_allclose(scores, -np.sort(-sub, axis=1)[:, :10], atol=1e-5)
        quality.append(np.take_along_axis(S, ids, axis=1).sum())
    assert all(b >= a - 1e-9 for a, b in zip(quality[:-1], quality[1:], strict=True))
    assert quality[-1] > quality[0]


def test_chunked_add_equals_one_add_and_pads_when_k_exceeds_n():
    X, Q = _data(n=300)
    one = EmbeddingIndex("itq", n_bits=16).fit(X).add(X)
    chunked = EmbeddingIndex("itq", n_bits=16).fit(X).add(X, chunk_size=37)
    np.testing.assert_array_equal(one.codes_.codes, chunked.codes_.codes)
    np.testing.assert_array_equal(one.vectors, chunked.vectors)
    small = EmbeddingIndex("itq", n_bits=16).fit(X).add(X[:3])
    scores, ids = small.search(Q[:2], 5)
    assert (ids[:, 3:] == -1).all() and np.isneginf(scores[:, 3:]).all()
    assert sorted(ids[0, :3].tolist()) == [0, 1, 2]


def test_a_chunked_add_sizes_the_float_store_once():
    """Growing by doubling, the last copy held the old and the new buffer: up to twice the
    floats in memory. add sizes the store for all of X before its first chunk."""
    X, Q = _data(n=3000)
    index = EmbeddingIndex("itq", n_bits=16, coarse=None).fit(X).add(X[:1100])
    store = index.searcher_.refiner.store
    assert store._ids.capacity == 1100
    index.add(X[1100:], chunk_size=500)  # doubling: 2,200 then 4,400 rows
    assert store._ids.capacity == 3000
    whole = EmbeddingIndex("itq", n_bits=16, coarse=None).fit(X).add(X)
    np.testing.assert_array_equal(index.vectors, whole.vectors)
    np.testing.assert_array_equal(index.search(Q, 5)[1], whole.search(Q, 5)[1])


def test_reserve_before_adding_in_parts(tmp_path):
    """A database added in several calls (the CLI's chunks) is sized once by reserve."""
    X, Q = _data(n=3000)
    index = EmbeddingIndex("itq", n_bits=16, coarse=None).fit(X).reserve(3000)
    for start in range(0, 3000, 700):
        index.add(X[start : start + 700])
    assert index.searcher_.refiner.store._ids.capacity == 3000
    whole = EmbeddingIndex("itq", n_bits=16, coarse=None).fit(X).add(X)
    np.testing.assert_array_equal(index.search(Q, 5)[1], whole.search(Q, 5)[1])
    assert index.reserve(10) is index  # fewer rows than held: nothing to do
    assert index.searcher_.refiner.store._ids.capacity == 3000
    with pytest.raises(ValueError, match="n_rows"):
        index.reserve(-1)
    with pytest.raises(RuntimeError, match="not fitted"):
        EmbeddingIndex("itq", n_bits=16).reserve(10)
    index.save(tmp_path / "idx")
    opened = EmbeddingIndex.open(tmp_path / "idx")
    assert opened.reserve(10_000) is opened and len(opened) == 3000  # on disk: a no-op


def test_hasher_instance_and_memory_accounting():
    X, Q = _data()
    index = EmbeddingIndex(make_hasher("lsh", n_bits=100, random_state=3), n_bits=None)
    index.fit(X).add(X)
    assert index.hasher_name == "lsh" and index.n_bits == 100
    assert index.memory_per_vector() == {"code": 13, "scan": 2 * 8 + 8, "float": 4 * D, "coarse": 0}
    with pytest.raises(ValueError, match="n_bits"):
        EmbeddingIndex(make_hasher("lsh", n_bits=100), n_bits=64)


def test_save_load_roundtrip_is_memory_mapped(tmp_path):
    X, Q = _data()
    index = EmbeddingIndex("itq", n_bits=16, overfetch=3).fit(X).add(X)
    index.save(tmp_path / "idx")
    loaded = EmbeddingIndex.load(tmp_path / "idx")
    assert isinstance(loaded.vectors, np.memmap)
    assert (loaded.overfetch, loaded.n_bits, loaded.metric) == (3, 16, "cosine")
    for a, b in zip(index.search(Q, 7), loaded.search(Q, 7), strict=True):
        np.testing.assert_array_equal(a, b)
    index.save(tmp_path / "idx")  # over an existing save: old components go
    assert len([p for p in (tmp_path / "idx").iterdir() if p.is_dir()]) == 2
    assert len(EmbeddingIndex.load(tmp_path / "idx")) == len(X)


def test_open_appends_in_place_like_an_in_memory_build(tmp_path):
    X, Q = _data()
    EmbeddingIndex("itq", n_bits=16).fit(X[:200]).save(tmp_path / "idx")
    opened = EmbeddingIndex.open(tmp_path / "idx")
    opened.add(X[:250], chunk_size=100)
    opened.add(X[250:])
    memory = EmbeddingIndex("itq", n_bits=16).fit(X[:200]).add(X)
    loaded = EmbeddingIndex.load(tmp_path / "idx", verify=True)
    assert len(loaded) == len(X)
    for a, b in zip(memory.search(Q, 5), loaded.search(Q, 5), strict=True):
        np.testing.assert_array_equal(a, b)


def test_damaged_or_interrupted_saves_are_clear_errors(tmp_path):
    X, _ = _data(n=100)
    with pytest.raises(FileNotFoundError, match="No embedding index"):
        EmbeddingIndex.load(tmp_path / "nothing")
    index = EmbeddingIndex("itq", n_bits=16).fit(X).add(X)
    index.save(tmp_path / "a")
    next((tmp_path / "a").glob("vectors.*.npy")).write_bytes(b"garbage")
    for verify in (True, False):
        with pytest.raises(ValueError, match="damaged index.*vectors"):
            EmbeddingIndex.load(tmp_path / "a", verify=verify)
    index.save(tmp_path / "b")
    # a build killed between appending the vectors and the codes
    hio.append_rows(tmp_path / "b", {"vectors": X[:5]})
    with pytest.raises(ValueError, match="105 vectors"):
        EmbeddingIndex.load(tmp_path / "b")
    index.save(tmp_path / "c")
    meta = json.loads((tmp_path / "c" / "meta.json").read_text())
    meta["state"]["codes_dir"] = "../../etc"
    (tmp_path / "c" / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="damaged"):
        EmbeddingIndex.load(tmp_path / "c", verify=False)


def test_bad_input_names_the_argument():
    X, Q = _data(n=100)
    with pytest.raises(ValueError, match="'metric'"):
        EmbeddingIndex(metric="l2")
    with pytest.raises(ValueError, match="'hasher'"):
        EmbeddingIndex("nope")
    with pytest.raises(ValueError, match="'overfetch'"):
        EmbeddingIndex(overfetch=0)
    with pytest.raises(ValueError, match="n_bits <= min"):
        EmbeddingIndex("itq", n_bits=D + 1).fit(X)
    with pytest.raises(RuntimeError, match="not fitted"):
        EmbeddingIndex().search(Q, 3)
    index = EmbeddingIndex("itq", n_bits=8).fit(X)
    with pytest.raises(ValueError, match="dimension 5"):
        index.add(X[:, :5])
    with pytest.raises(TypeError, match="float array"):
        index.add(X.astype(np.int64))
    bad = Q.copy()
    bad[3, 2] = np.nan
    with pytest.raises(ValueError, match="row 3"):
        index.search(bad, 3)
    with pytest.raises(ValueError, match="2-D"):
        index.search(Q[0], 3)
    with pytest.raises(ValueError, match="'k'"):
        index.add(X).search(Q, 0)


def test_codes_are_a_flat_index_with_ids_in_add_order():
    X, _ = _data(n=50)
    index = EmbeddingIndex("sign", n_bits=D).fit(X).add(X)
    assert isinstance(index.codes_, FlatIndex)
    np.testing.assert_array_equal(index.codes_.ids, np.arange(50))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        np.testing.assert_array_equal(index.codes_.codes, index.hasher_.encode(_unit(X)))


# ------------------------------------------------------------------------------ data set


def test_load_embeddings_missing_and_inconsistent(tmp_path):
    with pytest.raises(FileNotFoundError, match="make_embeddings.py"):
        load_embeddings(tmp_path / "none")
    rng = np.random.default_rng(0)
    base = _unit(rng.standard_normal((50, 8))).astype(np.float32)
    queries = _unit(rng.standard_normal((4, 8))).astype(np.float32)
    S = queries @ base.T
    nn = np.argsort(-S, axis=1)[:, :10]
    for name, arr in {
        "base": base,
        "queries": queries,
        "neighbors": nn,
        "scores": np.take_along_axis(S, nn, 1),
    }.items():
        np.save(tmp_path / f"{name}.npy", arr)
    (tmp_path / "info.json").write_text('{"n_base": 50}')
    ds = load_embeddings(tmp_path)
    assert ds.base.shape == (50, 8) and ds.neighbors.dtype == np.int64
    assert ds.info["n_base"] == 50
    np.save(tmp_path / "neighbors.npy", nn + 100)
    with pytest.raises(ValueError, match="inconsistent"):
        load_embeddings(tmp_path)


# ------------------------------------------------------------- the preset over Searcher

DATA = Path(__file__).parent / "data"


def test_a_save_of_the_previous_code_loads_and_searches_the_same():
    """``tests/data/embedding_index_v1`` was saved by the EmbeddingIndex before it became a
    preset over Searcher (commit 0b57805), with its search results beside it."""
    expected = np.load(DATA / "embedding_index_v1_expected.npz")
    for mmap in (True, False):
        index = EmbeddingIndex.load(DATA / "embedding_index_v1", mmap=mmap)
        assert (len(index), index.metric, index.overfetch) == (48, "cosine", 3)
        np.testing.assert_array_equal(index.vectors, _unit(expected["X"]).astype(np.float32))
        scores, ids = index.search(expected["Q"], 4)
        np.testing.assert_array_equal(ids, expected["ids"])
        np.testing.assert_array_equal(scores, expected["scores"])
        # and the scores are the cosine similarities of those ids
        S = _unit(expected["Q"]) @ _unit(expected["X"]).T
        np.testing.assert_allclose(np.take_along_axis(S, ids, 1), scores, atol=1e-6)


@pytest.mark.parametrize("metric", ["ip", "cosine", "euclidean"])
def test_the_same_search_gives_the_same_numbers_through_searcher(metric):
    """One result convention: an EmbeddingIndex and a Searcher over the same hasher, codes
    and candidates report the same ids and scores (cosine: to float32 rounding, as the
    Searcher normalises inside the kernel)."""
    from hashlearn.search import Searcher

    X, Q = _data()
    index = EmbeddingIndex("lsh", n_bits=32, metric=metric, overfetch=5).fit(X).add(X)
    prepared = _unit(X).astype(np.float32) if metric == "cosine" else X
    rerank = {"ip": "inner_product", "cosine": "cosine", "euclidean": "euclidean"}[metric]
    searcher = Searcher(index.hasher_, FlatIndex(32), rerank=rerank, n_candidates=50)
    searcher.add(prepared)
    queries = _unit(Q).astype(np.float32) if metric == "cosine" else Q
    (s1, i1), (s2, i2) = index.search(Q, 10), searcher.search(queries, 10)
    np.testing.assert_array_equal(i1, i2)
    if metric == "cosine":
        np.testing.assert_allclose(s1, s2, rtol=1e-6)
    else:
        np.testing.assert_array_equal(s1, s2)
    full = {
        "ip": Q.astype(np.float64) @ X.T.astype(np.float64),
        "cosine": _unit(Q) @ _unit(X).T,
        "euclidean": -np.sqrt(((Q[:, None].astype(np.float64) - X[None]) ** 2).sum(-1)),
    }[metric]
    scores, ids = index.search(Q, 10, overfetch=len(X))  # every vector rescored
    sign = -1.0 if metric == "euclidean" else 1.0  # distances, smallest first
    _check_topk(full, sign * scores, ids, 10)


def test_the_hasher_is_fitted_in_place_and_a_wrong_class_is_a_type_error(tmp_path):
    from hashlearn.search import Searcher

    X, _ = _data(n=100)
    hasher = make_hasher("lsh", n_bits=16, random_state=0)
    index = EmbeddingIndex(hasher, n_bits=None).fit(X).add(X)
    assert index.hasher_ is hasher and hasattr(hasher, "components_")
    index.save(tmp_path / "e")
    Searcher(make_hasher("lsh", n_bits=16), rerank="cosine").fit(X).add(X).save(tmp_path / "s")
    with pytest.raises(TypeError, match="not a Searcher"):
        Searcher.load(tmp_path / "e")
    with pytest.raises(TypeError, match="not an EmbeddingIndex"):
        EmbeddingIndex.load(tmp_path / "s")


def test_a_coarse_stage_with_one_list_is_the_flat_scan_and_round_trips(tmp_path):
    """coarse=1: one list holds every code, so the search is exactly the flat one; coarse
    indexes save, load (hashlearn.load too) and refuse open()'s in-place appends."""
    import hashlearn
    from hashlearn.index import IVFIndex

    rng = np.random.default_rng(3)
    X = rng.standard_normal((3000, 40)).astype(np.float32)
    flat = EmbeddingIndex("itq", n_bits=32).fit(X[:1000]).add(X)
    one = EmbeddingIndex("itq", n_bits=32, coarse=1, coarse_quantizer="k-majority")
    one.fit(X[:1000]).add(X)
    assert isinstance(one.codes_, IVFIndex)
    for overfetch in (1, 4, 16):
        for a, b in zip(flat.search(X[:40], 10, overfetch=overfetch),
                        one.search(X[:40], 10, overfetch=overfetch), strict=True):  # fmt: skip
            np.testing.assert_array_equal(a, b)
    auto = EmbeddingIndex("itq", n_bits=32, coarse="auto", ranking="asymmetric").fit(X[:1000])
    auto.add(X)  # 3000 rows: below AUTO_COARSE_MIN_ROWS, the flat scan
    assert not isinstance(auto.codes_, IVFIndex)
    lists = EmbeddingIndex("itq", n_bits=32, coarse=40, ranking="asymmetric").fit(X[:1000])
    lists.add(X)
    assert lists.codes_.centroids.shape[0] == 40
    want = lists.search(X[:40], 10)
    lists.save(tmp_path / "e")
    for loaded in (EmbeddingIndex.load(tmp_path / "e"), hashlearn.load(tmp_path / "e")):
        assert loaded.coarse == 40 and isinstance(loaded.codes_, IVFIndex)
        for a, b in zip(loaded.search(X[:40], 10), want, strict=True):
            np.testing.assert_array_equal(a, b)
    with pytest.raises(ValueError, match="coarse stage"):
        EmbeddingIndex.open(tmp_path / "e")
    for bad in (0, "many", 2.5):
        with pytest.raises((ValueError, TypeError)):
            EmbeddingIndex("itq", n_bits=32, coarse=bad)


def test_auto_coarse_stage_follows_the_database_size(tmp_path, monkeypatch):
    """coarse="auto" (the default): k-means lists for a database of at least
    AUTO_COARSE_MIN_ROWS rows, decided by the first add; the flat scan below, which open()
    can append to."""
    import hashlearn.embeddings as emb
    from hashlearn.index import FlatIndex, IVFIndex

    rng = np.random.default_rng(4)
    X = rng.standard_normal((2500, 24)).astype(np.float32)
    monkeypatch.setattr(emb, "AUTO_COARSE_MIN_ROWS", 2000)
    small = EmbeddingIndex(n_bits=16).fit(X).add(X[:1999])
    assert isinstance(small.codes_, FlatIndex) and small.coarse == "auto"
    small.save(tmp_path / "small")
    EmbeddingIndex.open(tmp_path / "small").add(X[1999:])
    assert len(EmbeddingIndex.load(tmp_path / "small")) == 2500
    big = EmbeddingIndex(n_bits=16).fit(X).add(X)
    assert isinstance(big.codes_, IVFIndex)
    assert len(big.codes_.list_sizes) == round(4 * np.sqrt(2500))
    parts = EmbeddingIndex(n_bits=16).fit(X).train_coarse(X[:500], n_total=2500)
    parts.add(X[:1000]).add(X[1000:])
    assert len(parts.codes_.list_sizes) == 200 and len(parts) == 2500
    assert isinstance(
        EmbeddingIndex(n_bits=16).fit(X).train_coarse(X, n_total=10).codes_, FlatIndex
    )


def test_auto_bits_take_the_input_width_for_large_residual_lists(tmp_path, monkeypatch):
    """n_bits="auto" (the default): AUTO_BITS bits (at most d) for a flat scan, other lists or
    a smaller database; residual lists over at least LONG_CODES_MIN_ROWS rows take d bits,
    decided by the first add (or train_coarse); each the index built with that length."""
    import hashlearn.embeddings as emb
    from hashlearn.index import FlatIndex, IVFIndex, ResidualIVFIndex

    rng = np.random.default_rng(8)
    X = rng.standard_normal((2500, D)).astype(np.float32)
    monkeypatch.setattr(emb, "AUTO_COARSE_MIN_ROWS", 1000)
    monkeypatch.setattr(emb, "LONG_CODES_MIN_ROWS", 2000)
    monkeypatch.setattr(emb, "AUTO_BITS", 16)
    assert EmbeddingIndex().n_bits == "auto" and EmbeddingIndex().n_bits_ is None
    with pytest.raises(RuntimeError, match="fit"):
        _ = EmbeddingIndex().code_bytes
    for rows, bits in ((X[:1500], 16), (X, D)):
        auto = EmbeddingIndex().fit(X).add(rows)
        assert isinstance(auto.codes_, ResidualIVFIndex) and auto.codes_.n_bits == bits
        assert auto.n_bits_ == bits and auto.code_bytes == (bits + 7) // 8
        want = EmbeddingIndex(n_bits=bits).fit(X).add(rows)
        for a, b in zip(auto.search(X[:9], 5), want.search(X[:9], 5), strict=True):
            np.testing.assert_array_equal(a, b)
    auto.save(tmp_path / "auto")
    loaded = EmbeddingIndex.load(tmp_path / "auto")
    assert loaded.n_bits == "auto" and loaded.n_bits_ == D
    for a, b in zip(auto.search(X[:9], 5), loaded.search(X[:9], 5), strict=True):
        np.testing.assert_array_equal(a, b)
    small = EmbeddingIndex().fit(X).add(X[:900])
    assert isinstance(small.codes_, FlatIndex) and small.n_bits_ == 16
    assert EmbeddingIndex(coarse=None).fit(X).add(X).n_bits_ == 16
    majority = EmbeddingIndex(coarse_quantizer="k-majority").fit(X).add(X)
    assert type(majority.codes_) is IVFIndex and majority.n_bits_ == 16
    assert EmbeddingIndex("lsh").fit(X).add(X).n_bits_ == 16  # any length: no width rule
    assert EmbeddingIndex().fit(X[:, :10]).n_bits_ == 10  # at most d
    parts = EmbeddingIndex().fit(X).train_coarse(X[:600], n_total=2500)
    assert parts.n_bits_ == D
    parts.add(X[:1000]).add(X[1000:])
    assert len(parts) == 2500 and parts.codes_.n_bits == D
    instance = EmbeddingIndex(make_hasher("itq", n_bits=8), n_bits="auto").fit(X).add(X)
    assert instance.n_bits_ == 8
    for bad in ("long", 0):
        with pytest.raises((ValueError, TypeError), match="n_bits"):
            EmbeddingIndex(n_bits=bad)


def test_a_coarse_stage_saved_before_its_first_add_is_learned_after_load(tmp_path, monkeypatch):
    import hashlearn.embeddings as emb
    from hashlearn.index import FlatIndex, IVFIndex

    rng = np.random.default_rng(6)
    X = rng.standard_normal((2500, 24)).astype(np.float32)
    monkeypatch.setattr(emb, "AUTO_COARSE_MIN_ROWS", 2000)
    for coarse in ("auto", 30):
        EmbeddingIndex(n_bits=16, coarse=coarse).fit(X).save(tmp_path / str(coarse))
        loaded = EmbeddingIndex.load(tmp_path / str(coarse)).add(X)
        assert isinstance(loaded.codes_, IVFIndex) and loaded.codes_.is_trained
        want = EmbeddingIndex(n_bits=16, coarse=coarse).fit(X).add(X).search(X[:9], 4)
        for a, b in zip(loaded.search(X[:9], 4), want, strict=True):
            np.testing.assert_array_equal(a, b)
    # open() appends in place to a flat scan: an "auto" index saved empty becomes one
    opened = EmbeddingIndex.open(tmp_path / "auto")
    opened.add(X)
    assert isinstance(EmbeddingIndex.load(tmp_path / "auto").codes_, FlatIndex)
    with pytest.raises(ValueError, match="coarse stage"):
        EmbeddingIndex.open(tmp_path / "30")
