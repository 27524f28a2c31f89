"""Tests for hashlearn.datasets: loaders, file formats and synthetic generators."""

from __future__ import annotations

import gzip
import sys

import numpy as np
import pytest

from hashlearn import datasets
from hashlearn.datasets import (
    ANNDataset,
    fashion_mnist_available,
    load_ann_benchmarks,
    load_digits,
    load_fashion_mnist,
    load_letter,
    load_satellite,
    make_blobs,
    make_uniform,
    read_bvecs,
    read_fvecs,
    read_idx,
    read_ivecs,
    tile_with_noise,
    write_bvecs,
    write_fvecs,
    write_ivecs,
)

IDX_CODES = {
    "uint8": 0x08,
    "int8": 0x09,
    "int16": 0x0B,
    "int32": 0x0C,
    "float32": 0x0D,
    "float64": 0x0E,
}


def write_idx(path, arr, compress=False):
    """Write ``arr`` as an IDX file (big-endian), optionally gzipped."""
    header = bytes([0, 0, IDX_CODES[arr.dtype.name], arr.ndim])
    header += np.asarray(arr.shape, dtype=">i4").tobytes()
    data = header + arr.astype(arr.dtype.newbyteorder(">")).tobytes()
    path.write_bytes(gzip.compress(data, compresslevel=1) if compress else data)
    return path


# ---------------------------------------------------------------------------- digits


def test_load_digits():
    X, y = load_digits()
    assert X.shape == (1797, 64) and X.dtype == np.float32
    assert y.shape == (1797,) and y.dtype == np.int64
    assert X.min() == 0 and X.max() == 16
    assert set(np.unique(y)) == set(range(10))


@pytest.mark.parametrize(
    "load, shape, n_classes, low, high",
    [(load_letter, (20000, 16), 26, 0, 15), (load_satellite, (6435, 36), 6, 27, 157)],
)
def test_load_bundled_uci_sets(load, shape, n_classes, low, high):
    X, y = load()
    assert X.shape == shape and X.dtype == np.float32 and X.flags.c_contiguous
    assert y.shape == shape[:1] and y.dtype == np.int64
    assert (X.min(), X.max()) == (low, high)
    assert np.array_equal(np.unique(y), np.arange(n_classes))


@pytest.mark.parametrize(
    "change, message",
    [
        (lambda z: {**z, "extra": np.zeros(1)}, "expected arrays"),
        (lambda z: {**z, "X": z["X"][:-1]}, "expected X"),
        (lambda z: {**z, "X": z["X"].astype(np.float64)}, "uint8"),
        (lambda z: {**z, "y": np.full_like(z["y"], 200)}, "below 26"),
    ],
)
def test_bundled_uci_set_checked_on_load(tmp_path, change, message):
    with np.load(datasets._BUNDLED_DIR / "letter.npz") as z:
        arrays = {k: z[k] for k in z.files}
    np.savez(tmp_path / "letter.npz", **change(arrays))
    with pytest.raises(ValueError, match=message):
        datasets._load_bundled("letter", tmp_path)
    np.savez(tmp_path / "letter.npz", X=np.array([object()], dtype=object))
    with pytest.raises(ValueError):
        datasets._load_bundled("letter", tmp_path)


def test_all_is_public():
    for name in datasets.__all__:
        assert hasattr(datasets, name)


# ---------------------------------------------------------------------------- IDX


@pytest.mark.parametrize("dtype", list(IDX_CODES))
@pytest.mark.parametrize("compress", [False, True])
def test_idx_round_trip(tmp_path, dtype, compress):
    rng = np.random.default_rng(0)
    arr = (rng.standard_normal((3, 4, 5)) * 100).astype(dtype)
    out = read_idx(write_idx(tmp_path / "a.idx", arr, compress))
    assert out.dtype == np.dtype(dtype) and out.dtype.isnative
    np.testing.assert_array_equal(out, arr)
    out[0, 0, 0] = 1  # writeable


def test_idx_gzip_detected_by_magic_not_name(tmp_path):
    arr = np.arange(12, dtype=np.uint8).reshape(3, 4)
    gz_no_suffix = write_idx(tmp_path / "images", arr, compress=True)
    plain_with_suffix = write_idx(tmp_path / "labels.gz", arr, compress=False)
    np.testing.assert_array_equal(read_idx(gz_no_suffix), arr)
    np.testing.assert_array_equal(read_idx(str(plain_with_suffix)), arr)


def test_idx_1d_and_empty(tmp_path):
    np.testing.assert_array_equal(
        read_idx(write_idx(tmp_path / "a", np.arange(5, dtype=np.int32))), np.arange(5)
    )
    assert read_idx(write_idx(tmp_path / "b", np.zeros((0, 7), np.uint8))).shape == (0, 7)


@pytest.mark.parametrize("compress", [False, True])
def test_idx_truncated(tmp_path, compress):
    path = write_idx(tmp_path / "a.idx", np.zeros((10, 28, 28), np.uint8))
    path.write_bytes(path.read_bytes()[:-100])
    if compress:
        path.write_bytes(gzip.compress(path.read_bytes()))
    with pytest.raises(ValueError, match=r"a\.idx.*takes 7856 bytes, the file holds 7756"):
        read_idx(path)


def test_idx_truncated_gzip_stream(tmp_path):
    path = write_idx(tmp_path / "a.idx", np.arange(1000, dtype=np.int32), compress=True)
    path.write_bytes(path.read_bytes()[:-20])
    with pytest.raises(ValueError, match=r"a\.idx is not a valid gzip file"):
        read_idx(path)


def test_idx_truncated_header(tmp_path):
    path = tmp_path / "a.idx"
    path.write_bytes(bytes([0, 0, 0x08, 3, 0, 0]))
    with pytest.raises(ValueError, match="header takes 16 bytes, the file holds 6"):
        read_idx(path)


@pytest.mark.parametrize("head", [b"\x01\x00\x08\x01", b"\x00\x00\x07\x01", b"PK", b""])
def test_idx_wrong_magic(tmp_path, head):
    path = tmp_path / "bad.idx"
    path.write_bytes(head + bytes(8))
    with pytest.raises(ValueError, match=r"bad\.idx is not an IDX file"):
        read_idx(path)


def test_idx_path_type():
    with pytest.raises(TypeError, match="'path' parameter of read_idx"):
        read_idx(3)


# ---------------------------------------------------------------------------- Fashion-MNIST


def write_fake_fashion(directory, n_train=6, n_test=4):
    """Tiny Fashion-MNIST look-alike: train gzipped, test uncompressed; labels = row index."""
    directory.mkdir(exist_ok=True)
    for part, n, compress in (("train", n_train, True), ("t10k", n_test, False)):
        images = np.full((n, 28, 28), 0, np.uint8) + np.arange(n, dtype=np.uint8)[:, None, None]
        suffix = ".gz" if compress else ""
        write_idx(directory / f"{part}-images-idx3-ubyte{suffix}", images, compress)
        write_idx(
            directory / f"{part}-labels-idx1-ubyte{suffix}", np.arange(n, dtype=np.uint8), compress
        )
    return directory


def test_fashion_from_any_directory(tmp_path):
    directory = write_fake_fashion(tmp_path / "fm")
    assert fashion_mnist_available(directory)
    X, y = load_fashion_mnist(str(directory))
    assert X.shape == (10, 784) and X.dtype == np.float32 and y.dtype == np.int64
    np.testing.assert_array_equal(y, [0, 1, 2, 3, 4, 5, 0, 1, 2, 3])  # train first
    np.testing.assert_array_equal(X[:, 0], y)
    assert load_fashion_mnist(directory, subset="train")[0].shape == (6, 784)
    assert load_fashion_mnist(directory, subset="test")[1].shape == (4,)


def test_fashion_missing_directory(tmp_path):
    missing = tmp_path / "nowhere"
    assert not fashion_mnist_available(missing)
    with pytest.raises(FileNotFoundError) as info:
        load_fashion_mnist(missing)
    message = str(info.value)
    assert "apt-get install -y dataset-fashion-mnist" in message
    assert str(missing) in message


def test_fashion_partially_missing(tmp_path):
    directory = write_fake_fashion(tmp_path / "fm")
    (directory / "t10k-labels-idx1-ubyte").unlink()
    assert not fashion_mnist_available(directory)
    assert load_fashion_mnist(directory, subset="train")[0].shape == (6, 784)
    with pytest.raises(FileNotFoundError, match="t10k-labels-idx1-ubyte"):
        load_fashion_mnist(directory, subset="test")


def test_fashion_wrong_content(tmp_path):
    directory = write_fake_fashion(tmp_path / "fm")
    write_idx(directory / "t10k-labels-idx1-ubyte", np.arange(3, dtype=np.uint8))
    with pytest.raises(ValueError, match="do not hold Fashion-MNIST"):
        load_fashion_mnist(directory, subset="test")


@pytest.mark.parametrize("subset", ["val", None, "ALL"])
def test_fashion_bad_subset(tmp_path, subset):
    with pytest.raises(ValueError, match="'subset' parameter of load_fashion_mnist"):
        load_fashion_mnist(tmp_path, subset=subset)


def test_fashion_bad_path_type():
    with pytest.raises(TypeError, match="'path' parameter of load_fashion_mnist"):
        load_fashion_mnist(42)


needs_fashion = pytest.mark.skipif(
    not fashion_mnist_available(),
    reason="Fashion-MNIST not installed (apt-get install -y dataset-fashion-mnist)",
)


@pytest.fixture(scope="module")
def fashion_all():
    return load_fashion_mnist(subset="all")


@needs_fashion
def test_fashion_real(fashion_all):
    X, y = fashion_all
    assert X.shape == (70000, 784) and X.dtype == np.float32
    assert y.shape == (70000,) and y.dtype == np.int64
    assert y.min() == 0 and y.max() == 9
    assert np.bincount(y).tolist() == [7000] * 10
    assert X.min() == 0 and X.max() == 255
    np.testing.assert_array_equal(X[::97], np.round(X[::97]))  # raw integer pixels
    X_test, y_test = load_fashion_mnist(subset="test")
    assert X_test.shape == (10000, 784)
    np.testing.assert_array_equal(X_test, X[60000:])
    np.testing.assert_array_equal(y_test, y[60000:])


@needs_fashion
def test_fashion_real_train_labels():
    # Labels only (the images are already covered by test_fashion_real); keeps the file fast.
    labels = read_idx(datasets.FASHION_MNIST_DIR / "train-labels-idx1-ubyte.gz")
    assert labels.shape == (60000,) and np.bincount(labels).tolist() == [6000] * 10


# ---------------------------------------------------------------------------- TEXMEX vecs

VECS = [
    (read_fvecs, write_fvecs, np.float32),
    (read_bvecs, write_bvecs, np.uint8),
    (read_ivecs, write_ivecs, np.int32),
]


def sample(dtype, n=10, d=7):
    rng = np.random.default_rng(1)
    if dtype == np.float32:
        return rng.standard_normal((n, d)).astype(np.float32)
    return rng.integers(0, 256 if dtype == np.uint8 else 2**31 - 1, (n, d)).astype(dtype)


@pytest.mark.parametrize(("read", "write", "dtype"), VECS)
def test_vecs_round_trip(tmp_path, read, write, dtype):
    X = sample(dtype)
    path = tmp_path / "x.vecs"
    write(path, X)
    assert path.stat().st_size == 10 * (4 + 7 * np.dtype(dtype).itemsize)
    out = read(str(path))
    assert out.dtype == dtype and out.flags.c_contiguous
    np.testing.assert_array_equal(out, X)
    np.testing.assert_array_equal(read(path, count=3, offset=2), X[2:5])
    np.testing.assert_array_equal(read(path, offset=8), X[8:])
    np.testing.assert_array_equal(read(path, count=4), X[:4])
    assert read(path, count=0, offset=10).shape == (0, 7)


def test_fvecs_layout(tmp_path):
    path = tmp_path / "x.fvecs"
    write_fvecs(path, np.array([[1.5, -2.0]], dtype=np.float32))
    expected = np.array([2], "<i4").tobytes() + np.array([1.5, -2.0], "<f4").tobytes()
    assert path.read_bytes() == expected


def test_vecs_empty_file(tmp_path):
    path = tmp_path / "empty.fvecs"
    path.write_bytes(b"")
    assert read_fvecs(path).shape == (0, 0)


@pytest.mark.parametrize(("read", "write", "dtype"), VECS)
def test_vecs_bad_size(tmp_path, read, write, dtype):
    path = tmp_path / "x.vecs"
    write(path, sample(dtype))
    path.write_bytes(path.read_bytes()[:-1])
    with pytest.raises(ValueError, match=r"x\.vecs is truncated.*not a multiple of the record"):
        read(path)


def test_vecs_inconsistent_dimension(tmp_path):
    path = tmp_path / "x.ivecs"
    write_ivecs(path, np.zeros((3, 2), np.int32))
    data = bytearray(path.read_bytes())
    data[12:16] = np.array([5], "<i4").tobytes()  # dimension field of vector 1
    path.write_bytes(bytes(data))
    with pytest.raises(ValueError, match="vector 1 has dimension 5"):
        read_ivecs(path)
    np.testing.assert_array_equal(read_ivecs(path, count=1), [[0, 0]])


def test_vecs_bad_first_dimension(tmp_path):
    path = tmp_path / "x.fvecs"
    path.write_bytes(np.array([-1, 0], "<i4").tobytes())
    with pytest.raises(ValueError, match="first vector has dimension -1"):
        read_fvecs(path)


def test_vecs_range_errors(tmp_path):
    path = tmp_path / "x.fvecs"
    write_fvecs(path, sample(np.float32))
    with pytest.raises(ValueError, match="offset=11 and count=0, but .* holds 10 vectors"):
        read_fvecs(path, offset=11)
    with pytest.raises(ValueError, match="offset=5 and count=6"):
        read_fvecs(path, count=6, offset=5)
    with pytest.raises(ValueError, match="'count' parameter of read_fvecs"):
        read_fvecs(path, count=-1)
    with pytest.raises(ValueError, match="'offset' parameter of read_fvecs"):
        read_fvecs(path, offset=1.0)


def test_vecs_writer_validation(tmp_path):
    path = tmp_path / "x.fvecs"
    with pytest.raises(TypeError, match="X.astype"):
        write_fvecs(path, np.zeros((2, 3)))  # float64 would lose precision
    with pytest.raises(TypeError, match="X.astype"):
        write_bvecs(path, np.zeros((2, 3), np.int32))
    with pytest.raises(TypeError, match="numpy.ndarray"):
        write_ivecs(path, [[1, 2]])
    with pytest.raises(ValueError, match="2-D"):
        write_fvecs(path, np.zeros(3, np.float32))
    write_fvecs(path, np.arange(6, dtype=np.uint8).reshape(2, 3))  # lossless: accepted
    np.testing.assert_array_equal(read_fvecs(path), np.arange(6).reshape(2, 3))


# ---------------------------------------------------------------------------- ann-benchmarks


def write_ann(path, distance="euclidean", drop=None):
    h5py = pytest.importorskip("h5py")
    rng = np.random.default_rng(2)
    arrays = {
        "train": rng.standard_normal((20, 4)).astype(np.float32),
        "test": rng.standard_normal((3, 4)).astype(np.float32),
        "neighbors": rng.integers(0, 20, (3, 5)).astype(np.int32),
        "distances": rng.random((3, 5)).astype(np.float32),
    }
    with h5py.File(path, "w") as f:
        if distance is not None:
            f.attrs["distance"] = distance
        for key, value in arrays.items():
            if key != drop:
                f.create_dataset(key, data=value)
    return arrays


@pytest.mark.parametrize("distance", ["angular", np.bytes_(b"hamming")])
def test_ann_benchmarks_round_trip(tmp_path, distance):
    path = tmp_path / "small.hdf5"
    arrays = write_ann(path, distance)
    ds = load_ann_benchmarks(path)
    assert isinstance(ds, ANNDataset)
    assert ds.distance == ("angular" if distance == "angular" else "hamming")
    for key, value in arrays.items():
        got = getattr(ds, key)
        assert got.dtype == value.dtype
        np.testing.assert_array_equal(got, value)
    with pytest.raises(AttributeError):
        ds.distance = "euclidean"


def test_ann_benchmarks_missing_dataset(tmp_path):
    path = tmp_path / "small.hdf5"
    write_ann(path, drop="neighbors")
    with pytest.raises(ValueError, match="missing neighbors"):
        load_ann_benchmarks(path)
    write_ann(path, distance=None)
    with pytest.raises(ValueError, match="missing attribute 'distance'"):
        load_ann_benchmarks(path)


def test_ann_benchmarks_missing_file(tmp_path):
    pytest.importorskip("h5py")
    with pytest.raises(FileNotFoundError):
        load_ann_benchmarks(tmp_path / "nope.hdf5")


def test_ann_benchmarks_without_h5py(tmp_path, monkeypatch):
    monkeypatch.setitem(sys.modules, "h5py", None)  # makes `import h5py` raise ImportError
    with pytest.raises(ImportError, match=r"pip install h5py"):
        load_ann_benchmarks(tmp_path / "x.hdf5")


# ---------------------------------------------------------------------------- synthetic


def test_make_uniform():
    X = make_uniform(1000, random_state=0)
    assert X.shape == (1000, 10) and X.dtype == np.float32
    assert X.min() >= 0 and X.max() < 1
    np.testing.assert_array_equal(X, make_uniform(1000, random_state=0))
    assert not np.array_equal(X, make_uniform(1000, random_state=1))
    assert make_uniform(5, 3, random_state=np.random.RandomState(0)).shape == (5, 3)


def test_make_blobs():
    X, y = make_blobs(200, 5, 3, random_state=0)
    assert X.shape == (200, 5) and X.dtype == np.float32
    assert y.dtype == np.int64 and set(y) == {0, 1, 2}
    X2, y2 = make_blobs(200, 5, 3, random_state=0)
    np.testing.assert_array_equal(X, X2)
    np.testing.assert_array_equal(y, y2)
    centers = np.array([[0.0, 0.0], [100.0, 100.0]])
    X, y = make_blobs(50, 2, centers, cluster_std=0.5, random_state=0)
    np.testing.assert_allclose(X[y == 1].mean(axis=0), [100, 100], atol=1)


@pytest.mark.parametrize(
    ("call", "match"),
    [
        (lambda: make_uniform(0), "'n_samples' parameter of make_uniform"),
        (lambda: make_uniform(10, 2.5), "'n_features' parameter of make_uniform"),
        (lambda: make_uniform(True), "'n_samples'"),
        (lambda: make_blobs(10, 2, 0), "'centers' parameter of make_blobs"),
        (lambda: make_blobs(10, 2, np.zeros((3, 4))), r"shape \(n_centers, 2\)"),
        (lambda: make_blobs(10, 2, 3, cluster_std=-1.0), "'cluster_std'"),
        (lambda: tile_with_noise(np.zeros((2, 2)), 0), "'n_samples' parameter of tile_with"),
        (lambda: tile_with_noise(np.zeros((2, 2)), 5, noise=-0.1), "'noise'"),
        (lambda: tile_with_noise(np.zeros((0, 2)), 5), "non-empty 2-D"),
        (lambda: tile_with_noise(np.array([[np.nan]]), 5), "finite"),
    ],
)
def test_synthetic_validation(call, match):
    with pytest.raises(ValueError, match=match):
        call()


def test_tile_with_noise_types():
    with pytest.raises(TypeError, match="numpy.ndarray"):
        tile_with_noise([[1.0]], 3)
    with pytest.raises(TypeError, match="dtype bool"):
        tile_with_noise(np.ones((2, 2), bool), 3)


def test_tile_with_noise():
    X = np.arange(12, dtype=np.uint8).reshape(4, 3)
    exact = tile_with_noise(X, 10, noise=0.0)
    assert exact.shape == (10, 3) and exact.dtype == np.float32
    np.testing.assert_array_equal(exact, X[np.arange(10) % 4])
    np.testing.assert_array_equal(tile_with_noise(X, 2, noise=0.0), X[:2])
    noisy = tile_with_noise(X, 10, random_state=0)
    np.testing.assert_array_equal(noisy, tile_with_noise(X, 10, random_state=0))
    assert not np.array_equal(noisy, exact)
    assert np.abs(noisy - exact).max() < 0.01 * X.std() * 6


def test_tile_with_noise_std():
    X = make_uniform(10, 1000, random_state=0)
    big = tile_with_noise(X, 4500, noise=0.1, random_state=0)  # noise drawn in two blocks
    assert big.shape == (4500, 1000)
    residual = big - X[np.arange(4500) % 10]
    np.testing.assert_allclose(residual.std(), 0.1 * X.std(), rtol=0.01)


def test_idx_shape_past_numpy_index_range_is_refused_with_the_path(tmp_path):
    """Found by the IDX fuzz test: an empty 3-D int32 array whose other dimensions multiply
    past numpy's index range (numpy refuses the shape even for zero elements)."""
    path = tmp_path / "x-idx1-ubyte"
    path.write_bytes(b"\x00\x00\x0c\x03\x00\x00\x00\x00[\x00\x00\x00[\x00\x00\x00")
    with pytest.raises(ValueError, match="too large for an array") as info:
        read_idx(path)
    assert str(path) in str(info.value) and "\n" not in str(info.value)
