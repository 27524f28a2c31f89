"""One persistence path: ``hashlearn.load`` loads every saved object, composites included.

Each kind is saved with its own ``save`` and loaded back with :func:`hashlearn.load`; the loaded
object must give exactly the original's results. A ``meta.json`` naming a class hashlearn does
not know, or carrying a parameter the class does not take, is a one-line error.
"""

from __future__ import annotations

import contextlib
import json
from pathlib import Path

import numpy as np
import pytest

import hashlearn
from hashlearn import io, load_digits
from hashlearn.embeddings import EmbeddingIndex
from hashlearn.forest import BoostedSearchForest, KMeansTree, LSHTables
from hashlearn.hashers import MinHash, available_hashers, make_hasher
from hashlearn.index import Cascade, MinHashLSHIndex, TableIndex, available_indexes, make_index
from hashlearn.metric import ITML, KernelITML
from hashlearn.search import Searcher

# small settings, so that every fit takes well under a second
FAST_PARAMS = {
    "boosted-ssc": {"n_pairs": 400, "n_thresholds": 8},
    "bre": {"n_landmarks": 16, "n_iter": 1},
    "itq": {"n_iter": 5},
    "kernel-metric-lsh": {"num_constraints": 100, "max_iter": 30},
    "klsh": {"p": 40, "t": 8},
    "metric-lsh": {"slack": 1.0, "num_constraints": 100},
    "mlh": {"n_epochs": 1, "pairs_per_epoch": 500, "monitor_pairs": 200, "batch_size": 50},
    "rank": {"n_epochs": 1, "queries_per_step": 10, "docs_per_query": 10, "n_neighbors": 5},
    "rbm": {"hidden_layers": (16,), "pretrain_epochs": 1, "finetune_epochs": 1},
}


@pytest.fixture(scope="module")
def digits():
    X, y = load_digits()
    return X[:150].astype(np.float64) / 16.0, y[:150]


def _codes(seed: int, n: int, n_bytes: int) -> np.ndarray:
    return np.random.default_rng(seed).integers(0, 256, (n, n_bytes), dtype=np.uint8)


def _same(a, b) -> None:
    if isinstance(a, tuple):
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    elif isinstance(a, list):
        assert len(a) == len(b)
        for x, y in zip(a, b, strict=True):
            _same(x, y)
    else:
        np.testing.assert_array_equal(a, b)


def _round_trip(obj, path: Path, results, **load_kwargs):
    obj.save(path) if hasattr(obj, "save") else io.save(obj, path)
    loaded = hashlearn.load(path, **load_kwargs)
    assert type(loaded) is type(obj)
    _same(results(obj), results(loaded))
    return loaded


@pytest.mark.parametrize("name", sorted(available_hashers()))
def test_every_hasher(name, digits, tmp_path):
    X, y = digits
    hasher = make_hasher(name, n_bits=16, random_state=0, **FAST_PARAMS.get(name, {})).fit(X, y)
    _round_trip(hasher, tmp_path / name, lambda h: h.encode(X))


@pytest.mark.parametrize("name", sorted(available_indexes()))
@pytest.mark.parametrize("mmap", [False, True])
def test_every_binary_index(name, mmap, tmp_path):
    index = make_index(name, n_bits=64)
    index.add(_codes(0, 300, 8))
    index.remove([3, 7])
    queries = _codes(1, 20, 8)
    _round_trip(index, tmp_path / name, lambda ix: ix.search(queries, 5), mmap=mmap)


def test_the_other_indexes(tmp_path):
    cascade = Cascade((8, 32), n_bins=2)
    short, long = _codes(0, 100, 1), _codes(1, 100, 4)
    cascade.add([short, long])
    _round_trip(cascade, tmp_path / "cascade", lambda c: c.search([short[:5], long[:5]], k=3))

    keys = np.random.default_rng(2).integers(0, 20, (200, 3))
    table = TableIndex(3)
    table.add(keys)
    _round_trip(table, tmp_path / "table", lambda t: t.candidates_csr(keys[:10]))

    sets = [set(range(i, i + 6)) for i in range(40)]
    signatures = MinHash(n_hashes=16, random_state=0).fit(sets).transform(sets)
    bands = MinHashLSHIndex(bands=8, rows=2)
    bands.add(signatures)
    _round_trip(bands, tmp_path / "bands", lambda b: b.candidates(signatures[:5]))


@pytest.mark.filterwarnings("ignore::UserWarning")  # tiny fits: empty trees, ITML's prior
def test_bucketers_and_metrics(digits, tmp_path):
    X, y = digits
    for bucketer in (
        BoostedSearchForest(n_trees=2, max_depth=3, n_pairs=400, random_state=0),
        KMeansTree(n_trees=2, random_state=0),
        LSHTables(n_tables=2, random_state=0),
    ):
        bucketer.fit(X, y)
        _round_trip(bucketer, tmp_path / type(bucketer).__name__, lambda b: b.keys(X))
    itml = ITML(slack_grid=(0.1,), grid_extensions=0, max_iter=20, random_state=0).fit(X, y)
    _round_trip(itml, tmp_path / "itml", lambda m: m.transform(X[:10]))
    kitml = KernelITML(max_iter=5, random_state=0).fit(X[:60], y[:60])
    _round_trip(kitml, tmp_path / "kitml", lambda m: m.pair_distances(X[:5], X[5:10]))


@pytest.mark.parametrize("rerank", [None, "euclidean"])
@pytest.mark.parametrize("mmap", [False, True])
def test_searcher_with_and_without_rerank(rerank, mmap, digits, tmp_path):
    X, _ = digits
    searcher = Searcher(make_hasher("lsh", n_bits=32, random_state=0), "mih", rerank=rerank)
    searcher.fit(X).add(X[:120], ids=np.arange(1000, 1120))
    loaded = _round_trip(
        searcher, tmp_path / "s", lambda s: s.search(X[120:], k=5), mmap=mmap, verify=True
    )
    assert loaded.rerank == rerank
    # the composite's own loader agrees
    _same(Searcher.load(tmp_path / "s").search(X[120:], 5), searcher.search(X[120:], 5))


def test_embedding_index(digits, tmp_path):
    X, _ = digits
    emb = EmbeddingIndex("lsh", n_bits=64, random_state=0).fit(X).add(X[:120])
    _round_trip(emb, tmp_path / "e", lambda e: e.search(X[120:], k=5), mmap=False)


def test_a_component_class_refuses_a_composite_without_loading_it(digits, tmp_path):
    X, _ = digits
    Searcher(make_hasher("lsh", n_bits=16, random_state=0)).fit(X).add(X).save(tmp_path / "s")
    with pytest.raises(TypeError, match="holds a Searcher, not a FlatIndex"):
        hashlearn.FlatIndex.load(tmp_path / "s")


def _meta(path: Path, edit) -> None:
    meta = json.loads((path / "meta.json").read_text())
    edit(meta)
    (path / "meta.json").write_text(json.dumps(meta))


def test_unknown_class_is_one_line_naming_the_known_ones(tmp_path):
    index = make_index("flat", n_bits=64)
    index.add(_codes(0, 10, 8))
    index.save(tmp_path / "x")
    _meta(tmp_path / "x", lambda m: m.__setitem__("class", "os.system"))
    with pytest.raises(ValueError, match=r"unknown class 'os.system'.*'Searcher'") as info:
        hashlearn.load(tmp_path / "x")
    assert "\n" not in str(info.value)


def test_a_sharded_index_without_a_client_is_one_line_naming_it(tmp_path):
    """``ShardedIndex.load`` takes ``client=`` (default: Dask's current client); with none
    anywhere, ``hashlearn.load`` says so in one line."""
    distributed = pytest.importorskip("distributed")
    with contextlib.suppress(ValueError):
        distributed.default_client()
        pytest.skip("a Dask client of another test is still open")
    io.write_dir(tmp_path / "sh", "ShardedIndex", {"n_bits": 64, "index": "flat"}, {}, {})
    with pytest.raises((TypeError, ValueError), match="client") as info:
        hashlearn.load(tmp_path / "sh")
    assert "\n" not in str(info.value)


class Composite:
    """A composite registered by a test: ``load`` gets the path and the keywords."""

    def __init__(self, size=1):
        self.size = size

    @classmethod
    def load(cls, path, *, client, mmap=False):
        obj = cls()
        obj.args = (Path(path), client, mmap)
        return obj


def test_register_composite_passes_the_keywords_through(tmp_path):
    io.register_composite("Composite", f"{__name__}:Composite")
    try:
        io.write_dir(tmp_path / "c", "Composite", {"size": 2}, {}, {})
        got = hashlearn.load(tmp_path / "c", client="the client", mmap=True)
        assert got.args == (tmp_path / "c", "the client", True)
        with pytest.raises(TypeError, match="client="):
            hashlearn.load(tmp_path / "c")
        _meta(tmp_path / "c", lambda m: m["params"].__setitem__("colour", "red"))
        with pytest.raises(ValueError, match=r"unknown parameters \['colour'\]"):
            hashlearn.load(tmp_path / "c", client=None)
    finally:
        del io._COMPOSITES["Composite"]
    with pytest.raises(ValueError, match="module:Class"):
        io.register_composite("X", "no_colon")


def test_keywords_for_a_plain_save_are_refused(tmp_path):
    index = make_index("flat", n_bits=64)
    index.save(tmp_path / "f")
    with pytest.raises(TypeError, match="client"):
        hashlearn.load(tmp_path / "f", client=object())


# ---------------------------------------------------------------- unknown parameters


def _every_persistable(digits):
    X, y = digits
    yield "hasher", make_hasher("lsh", n_bits=16, random_state=0).fit(X)
    yield "rbm", make_hasher("rbm", n_bits=8, random_state=0, **FAST_PARAMS["rbm"]).fit(X, y)
    yield "minhash", MinHash(n_hashes=8, random_state=0).fit([{1, 2}, {3}])
    for name in sorted(available_indexes()):
        index = make_index(name, n_bits=64)
        index.add(_codes(0, 50, 8))
        yield name, index
    cascade = Cascade((8, 32), n_bins=2)
    cascade.add([_codes(0, 20, 1), _codes(1, 20, 4)])
    yield "cascade", cascade
    table = TableIndex(2)
    table.add(np.arange(20).reshape(10, 2))
    yield "table", table
    yield "bands", MinHashLSHIndex(bands=4, rows=2)
    yield "lsh-tables", LSHTables(n_tables=2, random_state=0).fit(X)
    yield "itml", ITML(slack_grid=(0.1,), grid_extensions=0, max_iter=20, random_state=0).fit(X, y)
    searcher = Searcher(make_hasher("lsh", n_bits=16, random_state=0), rerank="euclidean")
    yield "searcher", searcher.fit(X).add(X)
    yield "embeddings", EmbeddingIndex("lsh", n_bits=16).fit(X).add(X)


@pytest.mark.filterwarnings("ignore::UserWarning")
def test_an_unknown_parameter_is_refused_by_every_class(digits, tmp_path):
    for name, obj in _every_persistable(digits):
        path = tmp_path / name
        obj.save(path)
        hashlearn.load(path)  # as saved: loads
        _meta(path, lambda m: m["params"].__setitem__("n_bitz", 64))
        with pytest.raises(ValueError, match=r"unknown parameters \['n_bitz'\]") as info:
            hashlearn.load(path)
        assert "\n" not in str(info.value), name


def test_a_renamed_parameter_still_loads_under_its_old_name(digits, tmp_path):
    """``io.renamed_params``: a file saved before a rename (``gamma`` -> ``slack`` in
    MetricLSH) loads; only names that were never parameters are refused."""
    X, y = digits
    hasher = make_hasher("metric-lsh", n_bits=8, random_state=0, **FAST_PARAMS["metric-lsh"])
    assert "gamma" in type(hasher)._renamed_params
    hasher.fit(X, y).save(tmp_path / "m")

    def old_name(meta):
        meta["params"]["gamma"] = meta["params"].pop("slack")

    _meta(tmp_path / "m", old_name)
    np.testing.assert_array_equal(hashlearn.load(tmp_path / "m").encode(X), hasher.encode(X))
