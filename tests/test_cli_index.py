"""``hashlearn index build / search / info``: results equal the library's, errors are one
line with exit status 2."""

from __future__ import annotations

import numpy as np
import pytest
from click.testing import CliRunner

from hashlearn.cli import main
from hashlearn.datasets import write_fvecs
from hashlearn.embeddings import EmbeddingIndex

D = 16


@pytest.fixture()
def files(tmp_path):
    rng = np.random.default_rng(0)
    X = rng.standard_normal((900, D)).astype(np.float32)
    Q = rng.standard_normal((7, D)).astype(np.float32)
    np.save(tmp_path / "emb.npy", X)
    np.save(tmp_path / "q.npy", Q)
    return tmp_path, X, Q


def _run(*args):
    result = CliRunner().invoke(main, ["index", *map(str, args)])
    return result


def _assert_one_line_error(result, *fragments):
    assert result.exit_code == 2, result.output
    lines = [line for line in result.stderr.splitlines() if line.startswith("Error")]
    assert len(lines) == 1 and all(f in lines[0] for f in fragments), result.stderr


def test_build_search_info_match_the_library(files):
    tmp, X, Q = files
    out = tmp / "idx"
    r = _run("build", tmp / "emb.npy", "--hasher", "itq", "--bits", 16, "--out", out,
             "--chunk-size", 250, "--fit-size", 900)  # fmt: skip
    assert r.exit_code == 0, r.output
    loaded = EmbeddingIndex.load(out)
    assert len(loaded) == 900 and loaded.n_bits == 16
    direct = EmbeddingIndex("itq", n_bits=16).fit(X).add(X)
    np.testing.assert_array_equal(loaded.codes_.codes, direct.codes_.codes)
    r = _run("search", out, tmp / "q.npy", "-k", 5, "--overfetch", 4, "--out", tmp / "res.npy")
    assert r.exit_code == 0, r.output
    scores, ids = direct.search(Q, 5, overfetch=4)
    np.testing.assert_array_equal(np.load(tmp / "res.npy"), ids)
    np.testing.assert_array_equal(np.load(tmp / "res.scores.npy"), scores)
    r = _run("search", out, tmp / "q.npy", "-k", 2)
    rows = [line.split("\t") for line in r.stdout.splitlines()]
    assert len(rows) == 14 and [int(x) for x in rows[1][:3]] == [0, 1, ids[0, 1]]
    r = _run("info", out)
    assert r.exit_code == 0 and "vectors                900" in r.stdout.replace("\t", " ")


def test_fvecs_input_equals_npy(files):
    tmp, X, _ = files
    write_fvecs(tmp / "emb.fvecs", X)
    assert _run("build", tmp / "emb.fvecs", "--hasher", "sign", "--bits", D, "--out",
                tmp / "a").exit_code == 0  # fmt: skip
    assert _run("build", tmp / "emb.npy", "--hasher", "sign", "--bits", D, "--out",
                tmp / "b", "--chunk-size", 100).exit_code == 0  # fmt: skip
    a, b = EmbeddingIndex.load(tmp / "a"), EmbeddingIndex.load(tmp / "b")
    np.testing.assert_array_equal(a.codes_.codes, b.codes_.codes)
    np.testing.assert_array_equal(a.vectors, b.vectors)


def test_hdf5_input_reads_train_and_test(files):
    h5py = pytest.importorskip("h5py")
    tmp, X, Q = files
    with h5py.File(tmp / "ann.hdf5", "w") as f:
        f["train"], f["test"] = X, Q
    assert _run("build", tmp / "ann.hdf5", "--bits", 8, "--out", tmp / "h").exit_code == 0
    r = _run("search", tmp / "h", tmp / "ann.hdf5", "-k", 3, "--out", tmp / "r.npy")
    assert r.exit_code == 0, r.output
    assert np.load(tmp / "r.npy").shape == (len(Q), 3)


def test_errors_are_one_line_with_exit_status_2(files):
    tmp, X, Q = files
    assert _run("build", tmp / "emb.npy", "--bits", 8, "--out", tmp / "idx").exit_code == 0
    np.save(tmp / "q_wrong_dim.npy", Q[:, :5])
    _assert_one_line_error(_run("search", tmp / "idx", tmp / "q_wrong_dim.npy"), "dimension 5")
    np.save(tmp / "q_int.npy", np.ones((3, D), np.int64))
    _assert_one_line_error(_run("search", tmp / "idx", tmp / "q_int.npy"), "dtype int64")
    bad = X.copy()
    bad[500, 3] = np.nan
    np.save(tmp / "nan.npy", bad)
    r = _run("build", tmp / "nan.npy", "--bits", 8, "--out", tmp / "n", "--chunk-size", 300)
    _assert_one_line_error(r, "NaN", "row")
    assert not (tmp / "n").exists() and not list(tmp.glob(".n.building*"))
    _assert_one_line_error(_run("search", tmp / "nothing", tmp / "q.npy"), "No embedding index")
    _assert_one_line_error(_run("build", tmp / "emb.npy", "--out", tmp / "idx"), "--force")
    next((tmp / "idx").glob("vectors.*.npy")).write_bytes(b"\x93NUMPY garbage")
    _assert_one_line_error(_run("search", tmp / "idx", tmp / "q.npy"), "damaged index")
    _assert_one_line_error(_run("info", tmp / "idx"), "damaged index")
    (tmp / "x.txt").write_text("1 2 3")
    _assert_one_line_error(_run("build", tmp / "x.txt", "--out", tmp / "t"), "unknown")
    for bits in ("many", "0", "-3"):
        r = _run("build", tmp / "emb.npy", "--bits", bits, "--out", tmp / "b")
        _assert_one_line_error(r, "--bits", "'auto'")


def test_default_bits_are_auto_and_info_names_the_length(files):
    """``--bits auto`` (the default): a 16-d input gets 16-bit codes (at most d), as
    ``EmbeddingIndex()`` does; ``info`` prints the fitted length."""
    tmp, X, _ = files
    assert _run("build", tmp / "emb.npy", "--out", tmp / "a", "--fit-size", 900).exit_code == 0
    loaded = EmbeddingIndex.load(tmp / "a")
    assert loaded.n_bits == "auto" and loaded.n_bits_ == D
    direct = EmbeddingIndex().fit(X).add(X)
    np.testing.assert_array_equal(loaded.codes_.codes, direct.codes_.codes)
    info = _run("info", tmp / "a").stdout.replace("\t", " ")
    assert any(line.split() == ["bits", str(D)] for line in info.splitlines()), info


def test_euclidean_build_and_search_match_the_library(files):
    """``--metric euclidean``: the searcher refines by Euclidean distance (smallest first),
    with the hasher by name (here 'lsh') -- the same numbers as the library."""
    tmp, X, Q = files
    out = tmp / "idx"
    r = _run("build", tmp / "emb.npy", "--hasher", "lsh", "--bits", 32, "--metric",
             "euclidean", "--out", out, "--fit-size", 900)  # fmt: skip
    assert r.exit_code == 0, r.output
    direct = EmbeddingIndex("lsh", n_bits=32, metric="euclidean").fit(X).add(X)
    r = _run("search", out, tmp / "q.npy", "-k", 4, "--overfetch", 900, "--out", tmp / "r.npy")
    assert r.exit_code == 0, r.output
    scores, ids = direct.search(Q, 4, overfetch=900)
    np.testing.assert_array_equal(np.load(tmp / "r.npy"), ids)
    np.testing.assert_array_equal(np.load(tmp / "r.scores.npy"), scores)
    exact = np.sqrt(((Q[:, None].astype(np.float64) - X[None]) ** 2).sum(-1))
    np.testing.assert_allclose(scores, np.sort(exact, axis=1)[:, :4], rtol=1e-5)
    assert "distances, smallest first" in _run("info", out).stdout


# --------------------------------------------------------------------- sharded (Dask)


@pytest.fixture(scope="module")
def cluster_address():
    """A 2-worker in-process LocalCluster (threads): its address goes to --scheduler."""
    distributed = pytest.importorskip("distributed")
    cluster = distributed.LocalCluster(
        n_workers=2, threads_per_worker=1, processes=False, dashboard_address=None
    )
    yield cluster.scheduler_address
    cluster.close()


@pytest.fixture(scope="module")
def dense(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("dense")
    rng = np.random.default_rng(1)
    np.save(tmp / "emb.npy", rng.standard_normal((2000, 32)).astype(np.float32))
    np.save(tmp / "q.npy", rng.standard_normal((25, 32)).astype(np.float32))
    return tmp


def _build_both(tmp, metric, *cluster):
    """Build the local index and the sharded one (--chunk-size 300: 7 blocks over the
    shards) on the same file; returns their directories."""
    common = ["--hasher", "lsh", "--bits", 32, "--metric", metric, "--chunk-size", 300, "--force"]
    local, sharded = tmp / f"local-{metric}", tmp / f"sharded-{metric}"
    r = _run("build", tmp / "emb.npy", "--out", local, *common)
    assert r.exit_code == 0, r.output
    r = _run("build", tmp / "emb.npy", "--out", sharded, "--shards", 3, *common, *cluster)
    assert r.exit_code == 0, r.output
    return local, sharded


@pytest.mark.parametrize("metric", ["cosine", "ip", "euclidean"])
def test_sharded_build_and_search_equal_the_local_ones(dense, cluster_address, metric):
    """The sharded searcher returns exactly the local one's ids and scores (binary files and
    the printed lines), for every metric; the local ones equal the library (tests above)."""
    tmp = dense
    local, sharded = _build_both(tmp, metric, "--scheduler", cluster_address)
    for overfetch in (2, 40):
        args = ["-k", 10, "--overfetch", overfetch]
        r = _run("search", local, tmp / "q.npy", *args, "--out", tmp / "l.npy")
        assert r.exit_code == 0, r.output
        r = _run("search", sharded, tmp / "q.npy", *args, "--out", tmp / "s.npy",
                 "--scheduler", cluster_address)  # fmt: skip
        assert r.exit_code == 0, r.output
        np.testing.assert_array_equal(np.load(tmp / "s.npy"), np.load(tmp / "l.npy"))
        np.testing.assert_array_equal(np.load(tmp / "s.scores.npy"), np.load(tmp / "l.scores.npy"))
    assert (np.load(tmp / "l.npy") >= 0).all()
    printed = [
        _run("search", d, tmp / "q.npy", "-k", 3, *extra).stdout
        for d, extra in [(local, []), (sharded, ["--scheduler", cluster_address])]
    ]
    assert printed[0] == printed[1] and len(printed[0].splitlines()) == 75


def test_sharded_info_from_the_manifest_without_a_scheduler(dense, cluster_address):
    tmp = dense
    _, sharded = _build_both(tmp, "cosine", "--scheduler", cluster_address)
    r = _run("info", sharded)
    assert r.exit_code == 0, r.output
    fields = dict(
        line.split(None, 1)
        for line in r.stdout.replace("rows per shard", "rows_per_shard").splitlines()
        if line
    )
    per_shard = [int(n) for n in fields["rows_per_shard"].split()]
    assert len(per_shard) == 3 and sum(per_shard) == 2000 and min(per_shard) > 0
    assert fields["vectors"].strip() == "2000" and fields["sharded"].startswith("3 shards")
    # the saved searcher is an ordinary hashlearn save of a Searcher over a ShardedIndex
    assert (sharded / "searcher" / "meta.json").is_file()


def test_local_cluster_option(dense):
    """--local-cluster 2 --local-threads starts a cluster for each command."""
    tmp = dense
    local, sharded = tmp / "lc-local", tmp / "lc-sharded"
    common = ["--hasher", "lsh", "--bits", 32, "--chunk-size", 500]
    assert _run("build", tmp / "emb.npy", "--out", local, *common).exit_code == 0
    cluster = ["--local-cluster", 2, "--local-threads"]
    r = _run("build", tmp / "emb.npy", "--out", sharded, *common, *cluster)
    assert r.exit_code == 0, r.output
    assert "2 shards" in r.stdout  # default: one shard per worker
    r = _run("search", sharded, tmp / "q.npy", "-k", 5, "--out", tmp / "s.npy", *cluster)
    assert r.exit_code == 0, r.output
    assert _run("search", local, tmp / "q.npy", "-k", 5, "--out", tmp / "l.npy").exit_code == 0
    np.testing.assert_array_equal(np.load(tmp / "s.npy"), np.load(tmp / "l.npy"))
    np.testing.assert_array_equal(np.load(tmp / "s.scores.npy"), np.load(tmp / "l.scores.npy"))


def test_sharded_errors_are_one_line_with_exit_status_2(dense, cluster_address):
    tmp = dense
    out = tmp / "err"
    _assert_one_line_error(
        _run("build", tmp / "emb.npy", "--out", out, "--shards", 2), "--shards needs"
    )
    _assert_one_line_error(
        _run(
            "build",
            tmp / "emb.npy",
            "--out",
            out,
            "--scheduler",
            "tcp://127.0.0.1:9",
            "--timeout",
            0.5,
        ),  # fmt: skip
        "could not reach the Dask scheduler",
    )
    _assert_one_line_error(
        _run(
            "build",
            tmp / "emb.npy",
            "--out",
            out,
            "--scheduler",
            cluster_address,
            "--local-cluster",
            2,
        ),  # fmt: skip
        "not both",
    )
    assert not out.exists()
    local, sharded = _build_both(tmp, "ip", "--scheduler", cluster_address)
    _assert_one_line_error(_run("search", sharded, tmp / "q.npy"), "sharded index")
    _assert_one_line_error(
        _run("search", local, tmp / "q.npy", "--scheduler", cluster_address), "local index"
    )
    np.save(tmp / "q5.npy", np.ones((2, 5), np.float32))
    _assert_one_line_error(
        _run("search", sharded, tmp / "q5.npy", "--scheduler", cluster_address), "dimension 5"
    )
    (sharded / "sharded.json").write_text('{"hasher": "lsh"}')
    _assert_one_line_error(_run("info", sharded), "not a valid manifest")
    # a NaN row, found by the worker that reads its block: nothing left at --out
    bad = np.load(tmp / "emb.npy")
    bad[1234, 7] = np.nan
    np.save(tmp / "nan.npy", bad)
    r = _run("build", tmp / "nan.npy", "--out", out, "--bits", 16, "--hasher", "lsh",
             "--chunk-size", 300, "--fit-size", 100, "--scheduler", cluster_address)  # fmt: skip
    _assert_one_line_error(r, "NaN", "row 34", "rows 1200..1499")
    assert not out.exists() and not list(tmp.glob(".err.building*"))


@pytest.mark.slow
def test_local_cluster_of_processes(dense):
    """Workers in other processes read the file themselves and write the shards; the search
    they serve equals the local one."""
    tmp = dense
    local, sharded = _build_both(tmp, "cosine", "--local-cluster", 2)
    cluster = ["--local-cluster", 2]
    r = _run("search", sharded, tmp / "q.npy", "-k", 7, "--out", tmp / "p.npy", *cluster)
    assert r.exit_code == 0, r.output
    assert _run("search", local, tmp / "q.npy", "-k", 7, "--out", tmp / "l.npy").exit_code == 0
    np.testing.assert_array_equal(np.load(tmp / "p.npy"), np.load(tmp / "l.npy"))
    np.testing.assert_array_equal(np.load(tmp / "p.scores.npy"), np.load(tmp / "l.scores.npy"))
