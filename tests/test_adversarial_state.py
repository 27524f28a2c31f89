"""Saved estimators with their own loaders refuse state that ``fit`` could not have produced.

ITML, KernelITML, RBMHashing and MinHash do not go through the generic hasher loader; a
``meta.json`` edited to add an attribute that shadows a method, to change a parameter's type,
or an array rewritten out of range must raise ``ValueError`` at load, never load silently.
"""

from __future__ import annotations

import hashlib
import json

import numpy as np
import pytest

from conftest import rewrite_array
from hashlearn import io, load_digits
from hashlearn.hashers import MinHash, RBMHashing
from hashlearn.metric import ITML, KernelITML


@pytest.fixture(scope="module")
def small():
    X, y = load_digits()
    return X[:120].astype(np.float64) / 16.0, y[:120]


def _fitted(name, small):
    if name == "minhash":
        return MinHash(n_hashes=16, random_state=0).fit([{1, 2}, {3, 4, 5}])
    X, y = small
    if name == "itml":
        return ITML(slack_grid=(0.1,), grid_extensions=0, max_iter=20, random_state=0).fit(X, y)
    if name == "kernel-itml":
        return KernelITML(max_iter=5, random_state=0).fit(X[:60], y[:60])
    if name == "rbm":
        return RBMHashing(
            n_bits=8, hidden_layers=(16,), pretrain_epochs=1, finetune_epochs=1, random_state=0
        ).fit(X, y)
    raise AssertionError(name)


def _edit_meta(path, edit):
    meta_path = path / "meta.json"
    meta = json.loads(meta_path.read_text())
    edit(meta)
    meta_path.write_text(json.dumps(meta))


NAMES = ["itml", "kernel-itml", "rbm", "minhash"]


@pytest.mark.parametrize("name", NAMES)
def test_round_trip_still_loads(name, small, tmp_path):
    obj = _fitted(name, small)
    io.save(obj, tmp_path / name)
    assert type(io.load(tmp_path / name)) is type(obj)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("key", ["transform", "encode", "__class__", "n_bits"])
def test_state_key_that_fit_never_makes_is_refused(name, key, small, tmp_path):
    io.save(_fitted(name, small), tmp_path / name)
    _edit_meta(tmp_path / name, lambda meta: meta["state"].__setitem__(key, 1))
    with pytest.raises(ValueError):
        io.load(tmp_path / name)


def test_rbm_hidden_layers_must_be_positive_ints(small, tmp_path):
    io.save(_fitted("rbm", small), tmp_path / "rbm")
    _edit_meta(tmp_path / "rbm", lambda meta: meta["params"].__setitem__("hidden_layers", [0]))
    with pytest.raises(ValueError, match="hidden_layers"):
        io.load(tmp_path / "rbm")


def test_itml_matrix_of_the_wrong_shape_is_refused(small, tmp_path):
    io.save(_fitted("itml", small), tmp_path / "itml")
    _edit_meta(tmp_path / "itml", lambda meta: meta["state"].__setitem__("n_features_in_", 10))
    with pytest.raises(ValueError, match="A_"):
        io.load(tmp_path / "itml")


def test_minhash_coefficients_out_of_range_are_refused(tmp_path):
    """coef_a_ = 0 would make every ordering constant; it is rewritten with a valid sha256."""
    path = tmp_path / "mh"
    io.save(_fitted("minhash", None), path)
    meta = json.loads((path / "meta.json").read_text())
    entry = meta["arrays"]["coef_a_"]
    arr = np.zeros(16, np.int64)
    np.save(path / entry["file"], arr)
    entry["sha256"] = hashlib.sha256((path / entry["file"]).read_bytes()).hexdigest()
    (path / "meta.json").write_text(json.dumps(meta))
    with pytest.raises(ValueError, match="coef_a_"):
        io.load(path)


def _save_forest(kind, small, path):
    from hashlearn.forest import BoostedSearchForest, KMeansTree, LSHTables

    X, _ = small
    make = {
        "bsf": lambda: BoostedSearchForest(n_trees=2, max_depth=4, n_pairs=500, random_state=0),
        "kmeans": lambda: KMeansTree(n_trees=2, max_depth=3, random_state=0),
        "lsh": lambda: LSHTables(n_tables=2, bits_per_table=4, random_state=0),
    }[kind]
    io.save(make().fit(X), path)
    return path


@pytest.mark.parametrize("kind", ["bsf", "kmeans", "lsh"])
def test_forest_round_trip_loads_with_the_same_keys(kind, small, tmp_path):
    path = _save_forest(kind, small, tmp_path / kind)
    X, _ = small
    loaded = io.load(path)
    assert loaded.keys(X[:20]).shape[0] == 20


def _cycle(left):
    left = left.copy()
    inner = np.flatnonzero(left >= 0)
    left[inner[-1]] = 0  # the last split points back at the first root: an endless walk
    return left


TREE_DAMAGE = {
    "cycle": ("left_", _cycle),
    "child out of range": ("right_", lambda a: np.where(a >= 0, a + 10**6, a)),
    "feature out of range": ("feature_", lambda a: np.where(a >= 0, a + 10**6, a - 10**6)),
    "root out of range": ("roots_", lambda a: a + 10**6),
    "short threshold": ("threshold_", lambda a: a[:-1]),
}


@pytest.mark.parametrize("kind", ["bsf", "kmeans"])
@pytest.mark.parametrize("damage", sorted(TREE_DAMAGE))
def test_damaged_tree_arrays_are_refused_at_load(kind, damage, small, tmp_path):
    """Before: these loaded, and keys() walked out of the arrays or forever."""
    path = _save_forest(kind, small, tmp_path / kind)
    name, change = TREE_DAMAGE[damage]
    rewrite_array(path, name, change)
    with pytest.raises(ValueError):
        io.load(path)


def test_lsh_tables_directions_of_the_wrong_shape_are_refused(small, tmp_path):
    path = _save_forest("lsh", small, tmp_path / "lsh")
    rewrite_array(path, "directions_", lambda a: a[:-1])
    with pytest.raises(ValueError):
        io.load(path)
