"""The ann-benchmarks plug-in (contrib/ann_benchmarks) under a stand-in of the harness.

``module.py`` is imported the way ann-benchmarks imports it -- as
``ann_benchmarks.algorithms.hashlearn.module``, with ``from ..base.module import BaseANN``
resolved to a minimal stand-in of the harness's ``BaseANN`` contract -- and every algorithm
is run end to end on a small dataset, with recall measured against brute force. The
configuration, Dockerfile and README are checked against each other.
"""

from __future__ import annotations

import importlib.util
import re
import sys
import types
from itertools import product
from pathlib import Path

import numpy as np
import pytest

PLUGIN = Path(__file__).resolve().parents[1] / "contrib" / "ann_benchmarks"


class StandInBaseANN:
    """The part of ann-benchmarks' ``BaseANN`` the runner relies on."""

    def done(self) -> None:
        pass

    def get_memory_usage(self):
        return None

    def fit(self, X) -> None:
        raise NotImplementedError

    def query(self, q, n):
        return []

    def batch_query(self, X, n) -> None:
        self.res = [self.query(q, n) for q in X]

    def get_batch_results(self):
        return self.res

    def get_additional(self):
        return {}

    def set_query_arguments(self, *args):
        pass

    def __str__(self) -> str:
        return self.name


@pytest.fixture(scope="module")
def plugin(tmp_path_factory):
    """module.py imported as ann_benchmarks.algorithms.hashlearn.module (harness stand-in)."""
    names = [
        "ann_benchmarks",
        "ann_benchmarks.algorithms",
        "ann_benchmarks.algorithms.base",
        "ann_benchmarks.algorithms.base.module",
        "ann_benchmarks.algorithms.hashlearn",
        "ann_benchmarks.algorithms.hashlearn.module",
    ]
    saved = {name: sys.modules.get(name) for name in names}
    for name in names[:4]:
        mod = types.ModuleType(name)
        mod.__path__ = []  # a package
        sys.modules[name] = mod
    sys.modules["ann_benchmarks.algorithms.base.module"].BaseANN = StandInBaseANN
    package = types.ModuleType("ann_benchmarks.algorithms.hashlearn")
    package.__path__ = [str(PLUGIN)]
    sys.modules[package.__name__] = package
    spec = importlib.util.spec_from_file_location(
        "ann_benchmarks.algorithms.hashlearn.module", PLUGIN / "module.py"
    )
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module
    try:
        spec.loader.exec_module(module)
        yield module
    finally:
        for name, old in saved.items():
            if old is None:
                sys.modules.pop(name, None)
            else:
                sys.modules[name] = old


def _recall(found, truth) -> float:
    return float(
        np.mean([len(set(f) & set(t)) / len(t) for f, t in zip(found, truth, strict=True)])
    )


def _run(algo, train, test, k, query_args=None):
    """What ann-benchmarks' runner does: fit, set the query arguments, query one at a time
    and in a batch; returns both result lists."""
    algo.fit(train)
    if query_args is not None:
        algo.set_query_arguments(*query_args)
    single = [np.asarray(list(algo.query(q, k))) for q in test]
    algo.batch_query(test, k)
    batch = [np.asarray(list(r)) for r in algo.get_batch_results()]
    algo.done()
    return single, batch


@pytest.mark.parametrize("metric", ["euclidean", "angular"])
@pytest.mark.parametrize("index", ["mih", "flat"])
def test_float_dataset_end_to_end(plugin, metric, index):
    rng = np.random.default_rng(0)
    centres = rng.standard_normal((20, 24)) * 3
    train = (centres[rng.integers(0, 20, 1500)] + rng.standard_normal((1500, 24))).astype(
        np.float32
    )
    test = (centres[rng.integers(0, 20, 40)] + rng.standard_normal((40, 24))).astype(np.float32)
    if metric == "euclidean":
        d = ((test[:, None].astype(np.float64) - train[None]) ** 2).sum(-1)
    else:
        a = train / np.linalg.norm(train, axis=1, keepdims=True)
        b = test / np.linalg.norm(test, axis=1, keepdims=True)
        d = 1 - b.astype(np.float64) @ a.T.astype(np.float64)
    truth = np.argsort(d, axis=1, kind="stable")[:, :10]
    algo = plugin.Hashlearn(metric, index, 64)
    assert isinstance(algo, StandInBaseANN)
    single, batch = _run(algo, train, test, 10, (300,))
    assert "n_candidates=300" in str(algo) and index in str(algo)
    for a, b in zip(single, batch, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _recall(batch, truth) >= 0.9  # 300 of 1500 candidates re-ranked exactly
    # every candidate re-ranked: exact
    algo.set_query_arguments(len(train))
    algo.batch_query(test, 10)
    got = algo.get_batch_results()
    assert _recall(got, truth) >= 0.99


@pytest.mark.parametrize("index", ["mih", "flat"])
def test_hamming_dataset_is_exact(plugin, index):
    rng = np.random.default_rng(1)
    train = rng.random((800, 128)) < 0.5
    test = rng.random((30, 128)) < 0.5
    d = (test[:, None, :] != train[None]).sum(-1)
    algo = plugin.HashlearnHamming("hamming", index)
    single, batch = _run(algo, train, test, 10)
    for q, (a, b) in enumerate(zip(single, batch, strict=True)):
        np.testing.assert_array_equal(a, b)
        # exact: the k-th distance matches, every returned item within it
        kth = np.sort(d[q])[9]
        assert len(a) == 10 and d[q, a].max() == kth


def test_sparse_jaccard_dataset(plugin):
    rng = np.random.default_rng(2)
    # 30 prototypes; each set is a noisy copy of one (sparse sets of item ids, as in kosarak)
    protos = [rng.choice(2000, size=40, replace=False) for _ in range(30)]

    def noisy(p):
        keep = p[rng.random(len(p)) < 0.8]
        return np.unique(np.concatenate([keep, rng.choice(2000, size=5)]))

    train = [noisy(protos[i % 30]) for i in range(900)]
    test = [noisy(protos[i % 30]) for i in range(30)]
    test.append(np.array([5000, 5001]))  # tokens the database never saw

    def jd(a, b):
        return 1 - len(np.intersect1d(a, b)) / len(np.union1d(a, b))

    truth = [np.argsort([jd(q, x) for x in train], kind="stable")[:10] for q in test[:30]]
    algo = plugin.HashlearnMinHash("jaccard", 32, 2)
    single, batch = _run(algo, train, test, 10, (200,))
    for a, b in zip(single, batch, strict=True):
        np.testing.assert_array_equal(a, b)
    assert _recall(batch[:30], truth) >= 0.9
    for q in range(30):  # re-ranked by the exact Jaccard distance
        dist = [jd(test[q], train[i]) for i in batch[q]]
        assert dist == sorted(dist)
    assert len(batch[30]) == 0  # shares no token, no band: nothing is a candidate
    # a boolean (dense) jaccard dataset is accepted too
    dense = np.zeros((len(train), 2000), bool)
    for i, s in enumerate(train):
        dense[i, s] = True
    algo2 = plugin.HashlearnMinHash("jaccard", 32, 2)
    algo2.fit(dense)
    algo2.set_query_arguments(200)
    np.testing.assert_array_equal(algo2.query(dense[0], 10), algo.query(train[0], 10))


def test_unsupported_metrics_are_refused(plugin):
    with pytest.raises(NotImplementedError):
        plugin.Hashlearn("hamming", "mih", 64)
    with pytest.raises(NotImplementedError):
        plugin.HashlearnMinHash("euclidean")
    with pytest.raises(ValueError, match="index"):
        plugin.HashlearnHamming("hamming", "ivf")


def test_config_names_constructors_and_readme_agree(plugin):
    yaml = pytest.importorskip("yaml")
    config = yaml.safe_load((PLUGIN / "config.yml").read_text())
    names = {}
    for metrics in config.values():
        for metric, entries in metrics.items():
            for entry in entries:
                assert entry["module"] == "ann_benchmarks.algorithms.hashlearn"
                assert entry["docker_tag"] == "ann-benchmarks-hashlearn"
                cls = getattr(plugin, entry["constructor"])
                # one algorithm name per (constructor, index): MIH and flat never share a name
                key = (entry["constructor"], str(entry["run_groups"]))
                assert names.setdefault((metric, entry["name"]), key) == key
                for group in entry["run_groups"].values():
                    for args in product(*group["args"]):
                        algo = cls(metric, *args)  # every configured run constructs
                        if "query_args" in group:
                            for qargs in product(*group["query_args"]):
                                algo.set_query_arguments(*qargs)
                        assert str(algo).startswith(entry["name"] + "(")
    algorithm_names = {name for _, name in names}
    assert {"hashlearn-lsh-mih", "hashlearn-lsh-flat", "hashlearn-mih", "hashlearn-flat"} <= (
        algorithm_names
    )
    assert "jaccard" in config["bit"]
    readme = (PLUGIN / "README.md").read_text()
    run_names = set(re.findall(r"run\.py --algorithm (\S+)", readme))
    assert run_names and run_names <= algorithm_names  # the README's commands find their runs
    # the copy step ships the plug-in and a wheel, never a virtual environment
    assert ".venv" not in readme
    assert "pip wheel --no-deps" in readme


def test_dockerfile_matches_the_build_context():
    text = (PLUGIN / "Dockerfile").read_text()
    lines = [line for line in text.splitlines() if line and not line.startswith("#")]
    assert lines[0] == "FROM ann-benchmarks"
    for line in lines:
        if line.startswith("COPY "):
            src = line.split()[1]
            # built from the ann-benchmarks root with -f ann_benchmarks/algorithms/hashlearn/...
            assert src.startswith("ann_benchmarks/algorithms/hashlearn/"), line
            assert (PLUGIN / src.removeprefix("ann_benchmarks/algorithms/hashlearn/")).exists()
    assert "pip3 install" in text and "hashlearn_warm_up.py" in text


@pytest.mark.slow
def test_module_runs_as_the_images_warm_up_script(tmp_path):
    """Without the harness (as in the image build) module.py runs as a script and warms the
    compile cache through every code path."""
    import shutil
    import subprocess

    script = tmp_path / "hashlearn_warm_up.py"
    shutil.copy(PLUGIN / "module.py", script)
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=600, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr
    assert "compile cache warmed" in proc.stdout
