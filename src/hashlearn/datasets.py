"""Datasets: bundled, on-disk and synthetic data for experiments and benchmarks.

Nothing here downloads anything. The sources are

* :func:`load_digits`: scikit-learn's bundled 8x8 digits, the library's embedded default;
* :func:`load_letter` / :func:`load_satellite`: the UCI *Letter Recognition* and *Statlog
  (Landsat Satellite)* sets, bundled with the package (``scripts/import_mlbench.py`` made
  them from Debian's ``r-cran-mlbench``);
* :func:`load_fashion_mnist`: Fashion-MNIST from local IDX files, by default those of the
  Debian package ``dataset-fashion-mnist`` (``apt-get install -y dataset-fashion-mnist``);
  :func:`read_idx` is the IDX parser behind it;
* :func:`read_fvecs` / :func:`read_bvecs` / :func:`read_ivecs` and their writers: the TEXMEX
  formats of SIFT1M / GIST1M (each vector is a little-endian ``int32`` dimension ``d``
  followed by ``d`` values);
* :func:`load_ann_benchmarks`: the HDF5 files of ann-benchmarks (needs the optional h5py);
* :func:`make_uniform`, :func:`make_blobs`, :func:`tile_with_noise`: synthetic data.

Feature matrices come back as C-contiguous ``float32`` (``uint8`` / ``int32`` for the
``bvecs`` / ``ivecs`` readers), labels as ``int64``.
"""

from __future__ import annotations

import gzip
import os
import zlib
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import scipy.sparse as sp
from sklearn import datasets as sk_datasets
from sklearn.utils import check_random_state

from hashlearn._utils.validation import check_int, check_real

__all__ = [
    "ANNDataset",
    "check_ann_benchmarks",
    "fashion_mnist_available",
    "load_ann_benchmarks",
    "load_digits",
    "load_fashion_mnist",
    "load_letter",
    "load_satellite",
    "load_stdlib_docstrings",
    "make_blobs",
    "make_gaussian_classes",
    "make_uniform",
    "read_bvecs",
    "read_fvecs",
    "read_idx",
    "read_ivecs",
    "tile_with_noise",
    "write_bvecs",
    "write_fvecs",
    "write_ivecs",
]

PathLike = str | os.PathLike

FASHION_MNIST_DIR = Path("/usr/share/datasets/fashion-mnist")
FASHION_MNIST_INSTALL = "apt-get install -y dataset-fashion-mnist"
_FASHION_FILES = {
    "train": ("train-images-idx3-ubyte", "train-labels-idx1-ubyte"),
    "test": ("t10k-images-idx3-ubyte", "t10k-labels-idx1-ubyte"),
}
_FASHION_SUBSETS = ("train", "test", "all")

# IDX type codes (third byte of the magic number); values are stored big-endian.
_IDX_DTYPES: dict[int, np.dtype] = {
    0x08: np.dtype(">u1"),
    0x09: np.dtype(">i1"),
    0x0B: np.dtype(">i2"),
    0x0C: np.dtype(">i4"),
    0x0D: np.dtype(">f4"),
    0x0E: np.dtype(">f8"),
}
_GZIP_MAGIC = b"\x1f\x8b"

_ANN_KEYS = ("train", "test", "neighbors", "distances")


def _check_path(path: Any, name: str, owner: str) -> Path:
    if not isinstance(path, str | os.PathLike):
        raise TypeError(
            f"The {name!r} parameter of {owner} must be a str or os.PathLike. "
            f"Got {type(path).__name__} instead."
        )
    return Path(path)


# --------------------------------------------------------------------------------------
# Bundled data
# --------------------------------------------------------------------------------------


def load_digits() -> tuple[np.ndarray, np.ndarray]:
    """scikit-learn's bundled digits: ``X`` float32 (1797, 64) with values 0..16, ``y`` int64."""
    X, y = sk_datasets.load_digits(return_X_y=True)
    return X.astype(np.float32), y.astype(np.int64)


# name -> (rows, features, classes) of the bundled UCI sets
_BUNDLED = {"letter": (20000, 16, 26), "satellite": (6435, 36, 6)}
_BUNDLED_DIR = Path(__file__).parent / "data"


def _load_bundled(name: str, directory: Path = _BUNDLED_DIR) -> tuple[np.ndarray, np.ndarray]:
    """Read and check ``data/<name>.npz``: ``X`` uint8 (rows, features), ``y`` uint8 class
    codes, ``classes`` their names (no pickled objects are read)."""
    n, d, k = _BUNDLED[name]
    path = directory / f"{name}.npz"
    with np.load(path, allow_pickle=False) as z:
        if sorted(z.files) != ["X", "classes", "y"]:
            raise ValueError(f"{path}: expected arrays X, y and classes; found {z.files}")
        X, y, classes = z["X"], z["y"], z["classes"]
    if X.shape != (n, d) or y.shape != (n,) or classes.shape != (k,):
        raise ValueError(f"{path}: expected X ({n}, {d}), y ({n},) and {k} classes")
    if X.dtype != np.uint8 or y.dtype != np.uint8 or int(y.max()) >= k:
        raise ValueError(f"{path}: expected uint8 features and class codes below {k}")
    return np.ascontiguousarray(X, dtype=np.float32), y.astype(np.int64)


def load_letter() -> tuple[np.ndarray, np.ndarray]:
    """UCI *Letter Recognition* (Frey & Slate, *Letter recognition using Holland-style
    adaptive classifiers*, Machine Learning 1991): ``X`` float32 (20000, 16), integer
    features 0..15 of the letter images, ``y`` int64 in 0..25 for A..Z. Bundled (CC BY 4.0)."""
    return _load_bundled("letter")


def load_satellite() -> tuple[np.ndarray, np.ndarray]:
    """UCI *Statlog (Landsat Satellite)*: ``X`` float32 (6435, 36), the four spectral bands of
    a 3x3 pixel neighbourhood (values 27..157), ``y`` int64 in 0..5 for red soil, cotton crop,
    grey soil, damp grey soil, vegetation stubble and very damp grey soil. Bundled
    (CC BY 4.0)."""
    return _load_bundled("satellite")


STDLIB_DOCSTRING_MODULES = (
    "argparse",
    "ast",
    "asyncio.base_events",
    "calendar",
    "collections",
    "configparser",
    "csv",
    "datetime",
    "decimal",
    "difflib",
    "email.message",
    "fractions",
    "ftplib",
    "functools",
    "http.client",
    "imaplib",
    "inspect",
    "ipaddress",
    "logging",
    "mailbox",
    "multiprocessing.managers",
    "nntplib",
    "os",
    "pathlib",
    "pickle",
    "pydoc",
    "random",
    "shutil",
    "smtplib",
    "socket",
    "ssl",
    "statistics",
    "string",
    "subprocess",
    "tarfile",
    "tempfile",
    "textwrap",
    "threading",
    "turtle",
    "typing",
    "unittest.case",
    "urllib.request",
    "uuid",
    "xml.dom.minidom",
    "zipfile",
)


def load_stdlib_docstrings(
    min_docs: int = 20, min_words: int = 5
) -> tuple[sp.csr_matrix, np.ndarray]:
    """A sparse bag-of-words classification set that ships with Python: stdlib docstrings.

    Every class, function and method docstring of the modules in
    :data:`STDLIB_DOCSTRING_MODULES` with at least ``min_words`` words is a document,
    labelled by its module (label = index of the module among those kept); modules with
    fewer than ``min_docs`` such docstrings are dropped. Sources are parsed with :mod:`ast`
    (nothing is imported or executed, except the parent package of a dotted name to locate
    the file). Features: word counts (lower-cased alphabetic tokens of 3+ letters, English
    stop words removed, words in at least 2 documents), TF-IDF weighted and L2-normalised.
    Returns ``(X scipy.sparse.csr_matrix float32, y int64)``; deterministic for a given
    Python version (the docstrings are those of the running interpreter's stdlib).
    """
    import ast
    import importlib.util

    from sklearn.feature_extraction.text import TfidfVectorizer

    owner = "load_stdlib_docstrings"
    min_docs = check_int(min_docs, "min_docs", owner)
    min_words = check_int(min_words, "min_words", owner)
    texts: list[str] = []
    labels: list[int] = []
    label = 0
    for name in STDLIB_DOCSTRING_MODULES:
        spec = importlib.util.find_spec(name)
        if spec is None or not spec.origin or not spec.origin.endswith(".py"):
            continue
        tree = ast.parse(Path(spec.origin).read_text(encoding="utf-8"))
        docs = []
        for node in ast.walk(tree):
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef, ast.ClassDef)):
                doc = ast.get_docstring(node)
                if doc and len(doc.split()) >= min_words:
                    docs.append(doc)
        if len(docs) >= min_docs:
            texts.extend(docs)
            labels.extend([label] * len(docs))
            label += 1
    if label < 2:
        raise ValueError(f"{owner} found fewer than 2 modules with {min_docs} docstrings.")
    vectorizer = TfidfVectorizer(
        lowercase=True,
        token_pattern=r"(?u)\b[a-zA-Z]{3,}\b",
        stop_words="english",
        min_df=2,
        dtype=np.float32,
    )
    X = vectorizer.fit_transform(texts).tocsr()
    return X, np.asarray(labels, dtype=np.int64)


# --------------------------------------------------------------------------------------
# IDX and Fashion-MNIST
# --------------------------------------------------------------------------------------


def read_idx(path: PathLike) -> np.ndarray:
    """Read an IDX file (the MNIST format), gzipped or not, into a native-endian array.

    Gzip is detected from the file's magic bytes, not its name. Truncated or corrupt files
    (a damaged gzip stream, a wrong magic number, a size that disagrees with the header)
    raise ``ValueError`` naming the file. A gzipped file is decompressed only up to the size
    its header announces, so a damaged or hostile stream cannot exhaust memory.
    """
    path = _check_path(path, "path", "read_idx")
    with open(path, "rb") as raw:
        head = raw.read(2)
        raw.seek(0)
        if head == _GZIP_MAGIC:
            try:
                with gzip.GzipFile(fileobj=raw, mode="rb") as f:
                    return _parse_idx(path, f, None)
            except (OSError, EOFError, zlib.error) as exc:
                raise ValueError(f"{path} is not a valid gzip file: {exc}") from None
        return _parse_idx(path, raw, os.fstat(raw.fileno()).st_size)


def _read_exactly(f, n: int) -> bytes:
    """Up to ``n`` bytes of ``f`` in bounded chunks (fewer only at the end of the stream)."""
    chunks, left = [], n
    while left > 0:
        chunk = f.read(min(left, 1 << 24))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _parse_idx(path: Path, f, size: int | None) -> np.ndarray:
    """The array of an IDX stream ``f``; ``size`` is the file size when not compressed."""
    magic = f.read(4)
    if len(magic) < 4 or magic[:2] != b"\x00\x00" or magic[2] not in _IDX_DTYPES:
        codes = ", ".join(f"0x{c:02X}" for c in _IDX_DTYPES)
        raise ValueError(
            f"{path} is not an IDX file: expected a magic number 0x0000 followed by a type "
            f"code in ({codes}) and the number of dimensions. Got bytes {magic.hex()}."
        )
    dtype, ndim = _IDX_DTYPES[magic[2]], magic[3]
    header = 4 + 4 * ndim
    dims = f.read(4 * ndim)
    if len(dims) < 4 * ndim:
        raise ValueError(
            f"{path} is truncated: its {ndim}-D IDX header takes {header} bytes, "
            f"the file holds {4 + len(dims)}."
        )
    shape = tuple(int(v) for v in np.frombuffer(dims, dtype=">i4"))
    if any(v < 0 for v in shape):
        raise ValueError(f"{path} is corrupt: negative dimension in IDX shape {shape}.")
    # numpy refuses shapes whose non-zero dimensions multiply past its index range, even
    # for an empty array
    if int(np.prod([v for v in shape if v], dtype=object)) * dtype.itemsize > np.iinfo(np.intp).max:
        raise ValueError(f"{path} is corrupt: IDX shape {shape} is too large for an array.")
    n_bytes = int(np.prod(shape, dtype=object)) * dtype.itemsize
    expected = header + n_bytes
    if size is not None and size != expected:
        raise ValueError(
            f"{path} is corrupt or truncated: an IDX array of shape {shape} and dtype "
            f"{dtype.newbyteorder('=')} takes {expected} bytes, the file holds {size}."
        )
    data = _read_exactly(f, n_bytes)
    what = f"an IDX array of shape {shape} and dtype {dtype.newbyteorder('=')}"
    if len(data) != n_bytes:
        raise ValueError(
            f"{path} is corrupt or truncated: {what} takes {expected} bytes, the file "
            f"holds {header + len(data)}."
        )
    if f.read(1):
        raise ValueError(f"{path} is corrupt: {what} takes {expected} bytes, the file holds more.")
    arr = np.frombuffer(data, dtype=dtype).reshape(shape)
    return arr.astype(dtype.newbyteorder("="))


def _fashion_dir(path: Any, owner: str) -> Path:
    return FASHION_MNIST_DIR if path is None else _check_path(path, "path", owner)


def _find_idx(directory: Path, stem: str) -> Path | None:
    """The file ``stem.gz`` or ``stem`` in ``directory``, or None."""
    for name in (stem + ".gz", stem):
        candidate = directory / name
        if candidate.is_file():
            return candidate
    return None


def fashion_mnist_available(path: PathLike | None = None) -> bool:
    """Whether the four Fashion-MNIST IDX files are in ``path`` (default: the Debian path)."""
    directory = _fashion_dir(path, "fashion_mnist_available")
    stems = [stem for pair in _FASHION_FILES.values() for stem in pair]
    return all(_find_idx(directory, stem) is not None for stem in stems)


def _read_fashion_part(directory: Path, part: str) -> tuple[np.ndarray, np.ndarray]:
    """The uint8 images (n, 784) and labels (n,) of ``part`` ("train" or "test")."""
    stems = _FASHION_FILES[part]
    paths = [_find_idx(directory, stem) for stem in stems]
    missing = [stem for stem, p in zip(stems, paths, strict=True) if p is None]
    if missing:
        raise FileNotFoundError(
            f"Fashion-MNIST files not found in {directory}: missing {', '.join(missing)} "
            f"(.gz or uncompressed). Install them with `{FASHION_MNIST_INSTALL}` (Debian/Ubuntu), "
            "or pass path= a directory holding the four IDX files."
        )
    images, labels = (read_idx(p) for p in paths if p is not None)  # none is, see above
    if images.dtype != np.uint8 or images.ndim != 3 or images.shape[1:] != (28, 28):
        raise ValueError(
            f"{paths[0]} does not hold Fashion-MNIST images: expected uint8 images of shape "
            f"(n, 28, 28). Got {images.dtype} {images.shape}."
        )
    if labels.dtype != np.uint8 or labels.ndim != 1:
        raise ValueError(
            f"{paths[1]} does not hold Fashion-MNIST labels: expected n uint8 labels. "
            f"Got {labels.dtype} {labels.shape}."
        )
    if len(labels) != len(images):
        raise ValueError(
            f"{paths[0]} and {paths[1]} do not hold Fashion-MNIST: {len(images)} images but "
            f"{len(labels)} labels (expected one label per image)."
        )
    if labels.size and labels.max() > 9:
        raise ValueError(
            f"{paths[1]} does not hold Fashion-MNIST labels: expected classes 0..9, found "
            f"{int(labels.max())}."
        )
    return images.reshape(len(images), -1), labels


def load_fashion_mnist(
    path: PathLike | None = None, subset: str = "all"
) -> tuple[np.ndarray, np.ndarray]:
    """Fashion-MNIST from local IDX files: ``X`` float32 (n, 784), ``y`` int64 in 0..9.

    ``X`` holds the raw pixel values 0..255 (not rescaled). ``subset`` is ``"train"``
    (60000 rows), ``"test"`` (10000) or ``"all"`` (70000, train rows first). ``path`` is a
    directory holding ``train-images-idx3-ubyte``, ``train-labels-idx1-ubyte``,
    ``t10k-images-idx3-ubyte`` and ``t10k-labels-idx1-ubyte``, each gzipped (``.gz``) or
    not; by default the directory of the Debian package ``dataset-fashion-mnist``.
    Missing files raise ``FileNotFoundError``.
    """
    directory = _fashion_dir(path, "load_fashion_mnist")
    if not isinstance(subset, str) or subset not in _FASHION_SUBSETS:
        raise ValueError(
            f"The 'subset' parameter of load_fashion_mnist must be one of "
            f"{_FASHION_SUBSETS}. Got {subset!r} instead."
        )
    parts = ("train", "test") if subset == "all" else (subset,)
    loaded = [_read_fashion_part(directory, part) for part in parts]
    X = np.concatenate([images for images, _ in loaded]).astype(np.float32)
    y = np.concatenate([labels for _, labels in loaded]).astype(np.int64)
    return X, y


# --------------------------------------------------------------------------------------
# TEXMEX fvecs / bvecs / ivecs
# --------------------------------------------------------------------------------------


def _record_dtype(dtype: np.dtype, d: int) -> np.dtype:
    """One on-disk vector: little-endian int32 dimension, then ``d`` little-endian values."""
    return np.dtype([("d", "<i4"), ("v", dtype.newbyteorder("<"), (d,))])


def _read_vecs(path: Any, dtype: np.dtype, count: Any, offset: Any, fmt: str) -> np.ndarray:
    owner = f"read_{fmt}"
    path = _check_path(path, "path", owner)
    offset = check_int(offset, "offset", owner, low=0)
    if count is not None:
        count = check_int(count, "count", owner, low=0)
    size = path.stat().st_size
    d = 0
    if size:
        if size < 4:
            raise ValueError(f"{path} is truncated: {size} bytes, less than one dimension field.")
        d = int(np.fromfile(path, dtype="<i4", count=1)[0])
        if d < 1:
            raise ValueError(
                f"{path}: the first vector has dimension {d}; expected a positive int32. "
                f"Is this a {fmt} file?"
            )
    record = 4 + d * dtype.itemsize
    if size % record:
        raise ValueError(
            f"{path} is truncated or not a {fmt} file: its size {size} bytes is not a "
            f"multiple of the record size {record} bytes (4-byte dimension + {d} values of "
            f"{dtype.itemsize} bytes, d taken from the first vector)."
        )
    n = size // record
    if count is None:
        count = max(n - offset, 0)
    if offset + count > n:
        raise ValueError(
            f"{owner} got offset={offset} and count={count}, but {path} holds {n} vectors."
        )
    if count == 0:
        return np.empty((0, d), dtype=dtype)
    rec = np.fromfile(path, dtype=_record_dtype(dtype, d), count=count, offset=offset * record)
    bad = np.flatnonzero(rec["d"] != d)
    if bad.size:
        raise ValueError(
            f"{path}: vector {offset + int(bad[0])} has dimension {int(rec['d'][bad[0]])}, "
            f"but the first vector has {d}; all vectors must have the same dimension."
        )
    return np.ascontiguousarray(rec["v"], dtype=dtype)


def _write_vecs(path: Any, X: Any, dtype: np.dtype, owner: str) -> None:
    path = _check_path(path, "path", owner)
    if not isinstance(X, np.ndarray):
        raise TypeError(f"X must be a numpy.ndarray. Got {type(X).__name__} instead.")
    if X.ndim != 2 or X.shape[1] == 0:
        raise ValueError(
            f"X must be a 2-D array (n_vectors, d) with d >= 1. Got shape {X.shape} instead."
        )
    if not np.can_cast(X.dtype, dtype, casting="safe"):
        raise TypeError(
            f"{owner} stores {dtype} values and X has dtype {X.dtype}, which does not convert "
            f"without loss. Convert it explicitly, e.g. X.astype(np.{dtype.name})."
        )
    rec = np.empty(len(X), dtype=_record_dtype(dtype, X.shape[1]))
    rec["d"] = X.shape[1]
    rec["v"] = X
    rec.tofile(path)


def read_fvecs(path: PathLike, count: int | None = None, offset: int = 0) -> np.ndarray:
    """Read ``count`` vectors (default: all) from vector ``offset`` of a ``.fvecs`` file.

    Returns a float32 array (n, d). Only the selected range is read from disk.
    """
    return _read_vecs(path, np.dtype(np.float32), count, offset, "fvecs")


def read_bvecs(path: PathLike, count: int | None = None, offset: int = 0) -> np.ndarray:
    """Read ``count`` vectors (default: all) from vector ``offset`` of a ``.bvecs`` file.

    Returns a uint8 array (n, d). Only the selected range is read from disk.
    """
    return _read_vecs(path, np.dtype(np.uint8), count, offset, "bvecs")


def read_ivecs(path: PathLike, count: int | None = None, offset: int = 0) -> np.ndarray:
    """Read ``count`` vectors (default: all) from vector ``offset`` of an ``.ivecs`` file.

    Returns an int32 array (n, d), e.g. ground-truth neighbour ids. Only the selected
    range is read from disk.
    """
    return _read_vecs(path, np.dtype(np.int32), count, offset, "ivecs")


def write_fvecs(path: PathLike, X: np.ndarray) -> None:
    """Write ``X`` (n, d) as a ``.fvecs`` file; its dtype must convert to float32 losslessly."""
    _write_vecs(path, X, np.dtype(np.float32), "write_fvecs")


def write_bvecs(path: PathLike, X: np.ndarray) -> None:
    """Write ``X`` (n, d) as a ``.bvecs`` file; its dtype must convert to uint8 losslessly."""
    _write_vecs(path, X, np.dtype(np.uint8), "write_bvecs")


def write_ivecs(path: PathLike, X: np.ndarray) -> None:
    """Write ``X`` (n, d) as an ``.ivecs`` file; its dtype must convert to int32 losslessly."""
    _write_vecs(path, X, np.dtype(np.int32), "write_ivecs")


# --------------------------------------------------------------------------------------
# ann-benchmarks HDF5
# --------------------------------------------------------------------------------------


@dataclass(frozen=True, eq=False)
class ANNDataset:
    """An ann-benchmarks dataset; arrays keep the dtypes stored in the file.

    ``neighbors[i]`` / ``distances[i]`` are the true nearest neighbours of ``test[i]`` in
    ``train`` and their distances under the metric named by ``distance``.
    """

    train: np.ndarray
    test: np.ndarray
    neighbors: np.ndarray
    distances: np.ndarray
    distance: str


def _import_h5py(owner: str):
    try:
        import h5py
    except ImportError as exc:
        raise ImportError(
            f"{owner} needs h5py: pip install h5py (or pip install hashlearn[hdf5])."
        ) from exc
    return h5py


def _ann_layout(path: Path, f, h5py) -> tuple[str, dict[str, Any]]:
    """Check the structure of an open ann-benchmarks file: ``(distance, datasets)``."""
    kind = f.attrs.get("type", "dense")
    if isinstance(kind, bytes | np.bytes_):
        kind = kind.decode("utf-8", "replace")
    if isinstance(kind, str) and kind == "sparse":
        raise ValueError(f"{path} is a sparse (set) dataset; only dense ones are supported.")
    missing = [key for key in _ANN_KEYS if key not in f]
    if "distance" not in f.attrs:
        missing.append("attribute 'distance'")
    if missing:
        raise ValueError(
            f"{path} is not an ann-benchmarks file: missing {', '.join(missing)}. "
            f"Expected datasets {', '.join(_ANN_KEYS)} and attribute 'distance'; "
            f"found datasets {sorted(f.keys())}."
        )
    distance = f.attrs["distance"]
    if isinstance(distance, bytes | np.bytes_):
        distance = distance.decode("utf-8", "replace")
    if not isinstance(distance, str):
        raise ValueError(
            f"{path} is not an ann-benchmarks file: attribute 'distance' must be a string, "
            f"got {distance!r}."
        )
    datasets = {}
    for key in _ANN_KEYS:
        node = f[key]
        if not isinstance(node, h5py.Dataset):
            raise ValueError(f"{path} is not an ann-benchmarks file: {key!r} is not a dataset.")
        kinds = "iu" if key == "neighbors" else "biuf"
        if node.dtype.kind not in kinds:
            raise ValueError(
                f"{path} is not an ann-benchmarks file: dataset {key!r} has dtype "
                f"{node.dtype}, expected {'integers' if key == 'neighbors' else 'numbers'}."
            )
        datasets[key] = node
    train, test, neighbors, distances = (datasets[key].shape for key in _ANN_KEYS)
    if (
        len(train) != 2
        or len(test) != 2
        or train[1] != test[1]
        or len(neighbors) != 2
        or neighbors != distances
        or neighbors[0] != test[0]
    ):
        raise ValueError(
            f"{path} has inconsistent shapes: expected train (n, d), test (m, d), neighbors "
            f"and distances (m, k). Got train {train}, test {test}, neighbors "
            f"{neighbors}, distances {distances}."
        )
    try:
        ids = datasets["neighbors"][()]
    except (OSError, ValueError, TypeError, KeyError) as exc:
        raise ValueError(f"{path} is damaged: reading 'neighbors' failed: {exc}") from None
    if ids.size and (ids.min() < -1 or ids.max() >= train[0]):
        raise ValueError(
            f"{path} is not a consistent ann-benchmarks file: neighbour ids must lie in "
            f"[0, {train[0]}) (or be -1); found [{ids.min()}, {ids.max()}]."
        )
    return distance, datasets


def _open_ann(path: Path, owner: str):
    h5py = _import_h5py(owner)
    if not path.is_file():
        raise FileNotFoundError(f"No ann-benchmarks file at {path}.")
    try:
        return h5py, h5py.File(path, "r")
    except OSError as exc:  # h5py's "file signature not found", truncated files
        raise ValueError(f"{path} is not an HDF5 file (or is damaged): {exc}") from None


def check_ann_benchmarks(path: PathLike) -> None:
    """Check that ``path`` is a dense ann-benchmarks HDF5 file, reading only its layout and
    its (small) neighbour ids: ``ValueError`` naming the file and what is wrong otherwise
    (needs h5py)."""
    path = _check_path(path, "path", "check_ann_benchmarks")
    h5py, f = _open_ann(path, "check_ann_benchmarks")
    with f:
        _ann_layout(path, f, h5py)


def load_ann_benchmarks(path: PathLike) -> ANNDataset:
    """Read an ann-benchmarks HDF5 file (dense datasets; needs the optional h5py).

    A file that is not HDF5, is damaged, or lacks the ann-benchmarks layout (datasets
    ``train``, ``test``, ``neighbors``, ``distances`` of consistent shapes and numeric
    dtypes, neighbour ids within ``train``, a string attribute ``distance``) raises a
    ``ValueError`` naming the file.
    """
    path = _check_path(path, "path", "load_ann_benchmarks")
    h5py, f = _open_ann(path, "load_ann_benchmarks")
    with f:
        distance, nodes = _ann_layout(path, f, h5py)
        try:
            arrays = {key: node[()] for key, node in nodes.items()}
        except (OSError, ValueError, TypeError, KeyError) as exc:
            raise ValueError(f"{path} is damaged: reading its datasets failed: {exc}") from None
    train, test, neighbors, distances = (arrays[key] for key in _ANN_KEYS)
    return ANNDataset(train, test, neighbors, distances, distance)


# --------------------------------------------------------------------------------------
# Synthetic data
# --------------------------------------------------------------------------------------


def make_uniform(n_samples: int, n_features: int = 10, random_state: Any = None) -> np.ndarray:
    """Points uniform on ``[0, 1)^n_features`` as float32 (the MLH paper's 10-D uniform set)."""
    n_samples = check_int(n_samples, "n_samples", "make_uniform")
    n_features = check_int(n_features, "n_features", "make_uniform")
    rng = check_random_state(random_state)
    # 24-bit integers scaled by 2**-24 are exact in float32, so 1.0 can never appear
    # (rounding float64 samples to float32 could produce it).
    ints = rng.randint(0, 1 << 24, size=(n_samples, n_features))
    return ints.astype(np.float32) * np.float32(2.0**-24)


def make_blobs(
    n_samples: int,
    n_features: int,
    centers: int | np.ndarray,
    cluster_std: float = 1.0,
    random_state: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Isotropic Gaussian blobs (scikit-learn's): ``X`` float32 (n, d), ``y`` int64 cluster ids.

    ``centers`` is the number of clusters (centres drawn in ``[-10, 10]^d``) or their
    coordinates as an array (k, n_features).
    """
    owner = "make_blobs"
    n_samples = check_int(n_samples, "n_samples", owner)
    n_features = check_int(n_features, "n_features", owner)
    if isinstance(centers, np.ndarray):
        if centers.ndim != 2 or centers.shape[0] == 0 or centers.shape[1] != n_features:
            raise ValueError(
                f"The 'centers' parameter of {owner} must be an int or an array of shape "
                f"(n_centers, {n_features}). Got an array of shape {centers.shape} instead."
            )
    else:
        centers = check_int(centers, "centers", owner)
    cluster_std = check_real(cluster_std, "cluster_std", owner, low=0.0)
    X, y = sk_datasets.make_blobs(
        n_samples=n_samples,
        n_features=n_features,
        centers=centers,
        cluster_std=cluster_std,
        random_state=check_random_state(random_state),
    )
    return X.astype(np.float32), y.astype(np.int64)


def make_gaussian_classes(
    n_samples: int,
    n_features: int,
    n_classes: int,
    separation: float = 1.0,
    random_state: Any = None,
) -> tuple[np.ndarray, np.ndarray]:
    """Overlapping anisotropic Gaussian classes: ``X`` float64 (n, d), ``y`` int64 labels.

    Class means are ``separation`` times standard normal vectors; each class has its own
    random linear map ``A`` (columns scaled by factors uniform in [0.3, 1.5]), so its
    covariance is ``A A^T``. With ``(16, 26, 0.6)`` and ``(36, 6, 0.15)`` these are the
    stand-ins, shaped like UCI's letter and satellite sets, on which issue 31 checks the
    hashers' defaults (exact 3-NN error about 0.09 and 0.07).
    """
    owner = "make_gaussian_classes"
    n_samples = check_int(n_samples, "n_samples", owner)
    n_features = check_int(n_features, "n_features", owner)
    n_classes = check_int(n_classes, "n_classes", owner)
    separation = check_real(separation, "separation", owner, low=0.0)
    rng = check_random_state(random_state)
    means = rng.standard_normal((n_classes, n_features)) * separation
    y = rng.randint(n_classes, size=n_samples).astype(np.int64)
    X = np.empty((n_samples, n_features))
    for c in range(n_classes):
        A = rng.standard_normal((n_features, n_features)) / np.sqrt(n_features)
        A *= rng.uniform(0.3, 1.5, n_features)[None, :]
        rows = np.flatnonzero(y == c)
        X[rows] = means[c] + rng.standard_normal((len(rows), n_features)) @ A.T
    return X, y


def tile_with_noise(
    X: np.ndarray, n_samples: int, noise: float = 0.01, random_state: Any = None
) -> np.ndarray:
    """Rows of ``X`` repeated cyclically to ``n_samples`` rows, plus Gaussian noise; float32.

    Row ``i`` is ``X[i % len(X)]`` plus noise of standard deviation ``noise * X.std()``.
    The noise is drawn in blocks, so memory stays close to the float32 output.
    """
    owner = "tile_with_noise"
    if not isinstance(X, np.ndarray):
        raise TypeError(f"X must be a numpy.ndarray. Got {type(X).__name__} instead.")
    if X.dtype.kind not in "iuf":
        raise TypeError(f"X must have an integer or float dtype. Got dtype {X.dtype} instead.")
    if X.ndim != 2 or X.size == 0:
        raise ValueError(f"X must be a non-empty 2-D array. Got shape {X.shape} instead.")
    n_samples = check_int(n_samples, "n_samples", owner)
    noise = check_real(noise, "noise", owner, low=0.0)
    scale = noise * float(X.std(dtype=np.float64))
    if not np.isfinite(scale):
        raise ValueError("X must contain only finite values.")
    out = X[np.arange(n_samples) % len(X)].astype(np.float32)
    if scale > 0:
        rng = check_random_state(random_state)
        block = max(1, (1 << 22) // X.shape[1])
        for start in range(0, n_samples, block):
            rows = out[start : start + block]
            rows += (scale * rng.standard_normal(rows.shape)).astype(np.float32)
    return out
