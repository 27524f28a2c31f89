"""Binary codes + exact rescoring vs faiss on real sentence embeddings (issue 17).

Data: the MiniLM-L6 data set of ``scripts/make_embeddings.py`` (384-d, unit norm, cosine;
exact top-100 ground truth), read by :func:`hashlearn.embeddings.load_embeddings`.

For every hash family and code length, an :class:`hashlearn.embeddings.EmbeddingIndex` is
fitted on a sample of the base, filled with the whole base, and searched for every query with
over-fetch 1..32 (``k * overfetch`` Hamming candidates rescored exactly with the float
vectors). Contenders, all on ONE thread, on the same data, in the same run:

* sign bits (binary quantization of vector databases), plain and centred: one bit per
  dimension, or below the input's width the dimensions of largest training variance
  (:class:`hashlearn.hashers.SignHashing`'s ``select="variance"``);
* random-hyperplane LSH, PCA hashing, ITQ and spectral hashing at 128/256/384/512 bits
  (PCA-based codes, ITQ, and sign bits have at most one bit per dimension: <= 384);
* faiss ``IndexFlatIP`` (exact float search, BLAS over the whole query batch);
* faiss ``IndexHNSWFlat`` (M=32, efConstruction=40, efSearch swept);
* faiss RaBitQ (``IndexRaBitQFastScan`` and ``IndexIVFRaBitQ``, nprobe swept) with an exact
  float refine (``IndexRefineFlat``, k_factor swept).

Reported: recall@10 against the exact cosine top-10, queries/s (wall, whole query batch in
one call), CPU seconds beside wall seconds, and memory per vector: the code bytes, what the
Hamming scan keeps in RAM, and the float32 vector the rescoring reads (memory-mapped in a
saved index); for faiss the serialized index size per vector. Timing is interleaved: before
each contender's sweep ``IndexFlatIP`` is timed again, and each speed-up is the median of the
per-repetition ratios, so a drifting machine load hits both sides alike.

Run (about 5-10 minutes on 2 cores)::

    python bench/embeddings.py [--data DIR] [--out bench/out/embeddings] [--quick]
    python bench/embeddings.py --synthetic 1000000 ...  # a mixture of probabilistic PCA fitted to the data
    python bench/embeddings.py --synthetic 10000000 --scratch DIR --isolate --resume \
        --no-flat --no-rabitq-flat --methods default --bits auto --build-threads 2  # 24 GB RAM

At 10M rows the 15 GB of floats fit once, not twice: ``--scratch`` keeps the drawn base on
disk (memory-mapped), ``--isolate`` builds and searches each contender in a process of its
own (``OUT/parts``, ``--resume`` keeps them), ``--no-flat`` skips ``IndexFlatIP``'s copy.

Writes ``results.json``, ``results.md`` (a table for docs/results.md) and
``recall_qps.png`` (ann-benchmarks style: recall@10 vs log queries/s) to ``--out``.
"""

from __future__ import annotations

import os
import sys


def _build_threads(argv: list[str]) -> int:
    """``--build-threads N`` read before numba loads (its pool is sized at import)."""
    for i, arg in enumerate(argv):
        if arg == "--build-threads" and i + 1 < len(argv):
            return max(1, int(argv[i + 1]))
        if arg.startswith("--build-threads="):
            return max(1, int(arg.split("=", 1)[1]))
    return 1


for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ[_var] = "1"  # one thread everywhere, before numpy / faiss / numba load
os.environ["NUMBA_NUM_THREADS"] = str(_build_threads(sys.argv))  # searches still use one
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import argparse  # noqa: E402
import contextlib  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import platform  # noqa: E402
import subprocess  # noqa: E402
import tempfile  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

import numpy as np  # noqa: E402

import hashlearn  # noqa: E402
from hashlearn.embeddings import EmbeddingIndex, load_embeddings  # noqa: E402
from hashlearn.index import IVFIndex  # noqa: E402

K = 10
OVERFETCH = (1, 2, 3, 4, 5, 6, 8, 10, 12, 16, 24, 32, 48, 64)
#: faiss IVF-RaBitQ's sweep, as fine as ours near the targets (its best settings at 1M drawn
#: rows are a few lists and a few times k rescored), and as far as 128 lists x 16 (at 3M rows
#: nprobe 32 x8 stopped at recall 0.954)
RABITQ_NPROBE = (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 96, 128)
RABITQ_K_FACTOR = (2, 3, 4, 6, 8, 12, 16)
BITS = (128, 256, 384, 512)
EF_SEARCH = (8, 10, 12, 16, 24, 32, 48, 64, 96, 128, 256)
#: HNSW adds the base this many rows at a time, each block copied into RAM (:func:`add_hnsw`)
HNSW_ADD_ROWS = 500_000
#: neighbour slots reserved per row for HNSW's graph (M = 32: 64 at level 0, about 65 on
#: average with the upper levels)
HNSW_SLOTS_PER_ROW = 70
#: ``--faiss-train-per-list``: faiss IVF's k-means sample per list (None: faiss's own 256)
FAISS_TRAIN_PER_LIST: int | None = None
#: threads for every build (``--build-threads``); searches always run on one
BUILD_THREADS = _build_threads(sys.argv)
_FLAT = {"coarse": None}
_ASYM = {"ranking": "asymmetric", "coarse": None}
_IVF = {"coarse": "lists", "coarse_quantizer": "k-majority"}  # 4 sqrt(n) lists (run_codes)
_ASYM_IVF = {"ranking": "asymmetric", **_IVF}
#: (label, registry name, hasher parameters, learned?, EmbeddingIndex parameters); "default"
#: is ``EmbeddingIndex()`` as a user gets it (ITQ-256, coarse="auto": residual lists from 100k
#: rows); "-ivf" rows use k-majority lists, "-residual" rows residual codes
METHODS = (
    ("sign", "sign", {"center": False}, False, _FLAT),
    ("sign-centred", "sign", {"center": True}, False, _FLAT),
    ("lsh", "lsh", {}, False, _FLAT),
    ("pca", "pca", {}, True, _FLAT),
    ("itq", "itq", {}, True, _FLAT),
    ("spectral", "spectral", {}, True, _FLAT),
    ("sign-centred-asym", "sign", {"center": True}, False, _ASYM),
    ("itq-asym", "itq", {}, True, _ASYM),
    ("itq-asym-ivf", "itq", {}, True, _ASYM_IVF),
    ("itq-ivf", "itq", {}, True, _IVF),
    ("itq-ivf-kmeans", "itq", {}, True, {**_IVF, "coarse_quantizer": "k-means"}),
    ("itq-residual", "itq", {}, True, {**_IVF, "coarse_quantizer": "residual"}),
    ("itq-residual-kmaj", "itq", {}, True, {**_IVF, "coarse_quantizer": "residual-k-majority"}),
    ("sign-residual", "sign", {"center": True}, False, {**_IVF, "coarse_quantizer": "residual"}),
    ("default", "itq", {}, True, {}),
)
AT_MOST_DIM = {"sign", "pca", "itq"}


#: the mixture of ``--synthetic``: a mixture of probabilistic PCA (Tipping & Bishop, "Mixtures
#: of probabilistic principal component analysers", Neural Computation 1999): k-means
#: components of about ``ROWS_PER_COMPONENT`` real rows each, each a Gaussian with its rows'
#: mean, their ``LOCAL_RANK`` leading principal directions and an isotropic residual
#: (covariance W W^T + s^2 I). Chosen by reproducing the real rows' recall curve at 40k
#: (``--synthetic 40000`` against the real set; ITQ-256 recall@10 at overfetch 2/4/8/12,
#: mean top-1 / top-10 cosine; this generator's and the real rows' recall from this script,
#: the other rows from a one-off script drawing the same way):
#:
#: ==========================================  =======================  ============
#: rows                                        ITQ-256 recall           top-1 / 10
#: ==========================================  =======================  ============
#: real MiniLM 40k                             0.783 0.891 0.945 0.966  0.761 0.609
#: 4000 components, rank 4 (this generator)    0.804 0.899 0.951 0.968  0.728 0.577
#: 1024 components, rank 16                    0.795 0.902 0.954 0.971  0.701 0.590
#: 256 components, rank 16                     0.667 0.817 0.916 0.946  0.612 0.543
#: 64 full-covariance in 64 PCs + noise [old]  0.41 at overfetch 8 at 1M
#: ==========================================  =======================  ============
#:
#: HNSW (M=32, efSearch 8 / 16) finds more here than on the real rows (0.972 / 0.992 against
#: 0.909 / 0.955):
#: the real rows' hubs and uneven density are not reproduced, so the mixture favours HNSW.
ROWS_PER_COMPONENT = 10
LOCAL_RANK = 4


def mixture_sample(
    real: np.ndarray, n: int, n_queries: int, log, seed: int = 0, scratch: Path | None = None
):
    """``(base, queries, truth, info)``: ``n`` + ``n_queries`` unit vectors drawn from a
    mixture of probabilistic PCA fitted to the real rows (at most 40,000 of them; see
    ``ROWS_PER_COMPONENT``), and the exact cosine top-``K`` of each query (float64 blocks).

    ``scratch``: the base is written to ``scratch/base.npy`` and returned memory-mapped
    (larger than memory: 10M x 384 float32 is 15 GB), with the queries, the truth and the
    draw's parameters beside it; a later call with the same parameters maps them again
    instead of drawing. The rows are the same with or without it."""
    key = {"n": n, "n_queries": n_queries, "seed": seed, "real_rows": len(real), "k": K}
    if scratch is not None and (scratch / "draw.json").is_file():
        info = json.loads((scratch / "draw.json").read_text())
        if info["key"] == key:
            log(f"the draw of {n:,} rows mapped from {scratch}")
            base = np.load(scratch / "base.npy", mmap_mode="r")
            return base, np.load(scratch / "queries.npy"), np.load(scratch / "truth.npy"), info
    from sklearn.cluster import MiniBatchKMeans

    t0 = time.perf_counter()
    rng = np.random.default_rng(seed)
    rows = real[np.sort(rng.choice(len(real), min(len(real), 40_000), replace=False))]
    rows = rows.astype(np.float64)
    n_comp = max(1, len(rows) // ROWS_PER_COMPONENT)
    labels = MiniBatchKMeans(n_comp, random_state=seed, n_init=1, batch_size=4096).fit_predict(rows)
    dim = real.shape[1]
    sizes = np.bincount(labels, minlength=n_comp)
    means = np.zeros((n_comp, dim))
    factors = np.zeros((n_comp, LOCAL_RANK, dim))
    residual_sd = np.zeros(n_comp)
    for c in np.flatnonzero(sizes > 1):
        X = rows[labels == c]
        means[c] = X.mean(axis=0)
        _, S, Vt = np.linalg.svd(X - means[c], full_matrices=False)
        var = S**2 / (len(X) - 1)
        r = min(LOCAL_RANK, len(var))
        factors[c, :r] = Vt[:r] * np.sqrt(var[:r])[:, None]
        residual_sd[c] = np.sqrt(var[r:].sum() / (dim - r))
    for c in np.flatnonzero(sizes == 1):  # a lone row: its point, with its neighbours' spread
        means[c] = rows[labels == c][0]
        residual_sd[c] = np.median(residual_sd[sizes > 1])
    total = n + n_queries
    comp = rng.choice(n_comp, total, p=sizes / sizes.sum())
    if scratch is None:
        base = np.empty((n, dim), np.float32)
    else:
        scratch.mkdir(parents=True, exist_ok=True)
        (scratch / "draw.json").unlink(missing_ok=True)  # the old draw is being replaced
        base = np.lib.format.open_memmap(scratch / "base.npy", "w+", np.float32, (n, dim))
    queries = np.empty((n_queries, dim), np.float32)
    for start in range(0, total, 16_384):
        c = comp[start : start + 16_384]
        z = rng.standard_normal((len(c), LOCAL_RANK))
        x = means[c] + np.einsum("nr,nrd->nd", z, factors[c])
        x += rng.standard_normal((len(c), dim)) * residual_sd[c, None]
        x /= np.linalg.norm(x, axis=1, keepdims=True)
        end = start + len(c)
        if start < n:
            base[start : min(end, n)] = x[: n - start]
        if end > n:
            queries[max(start, n) - n : end - n] = x[max(n - start, 0) :]
    truth = np.zeros((n_queries, K), np.int64)
    best_s = np.full((n_queries, K), -np.inf)
    for start in range(0, n, 131_072):
        block = base[start : start + 131_072].astype(np.float64)
        scores = queries.astype(np.float64) @ block.T
        top = np.argpartition(-scores, K - 1, axis=1)[:, :K]
        cand_s = np.concatenate([best_s, np.take_along_axis(scores, top, 1)], axis=1)
        cand_i = np.concatenate([truth, top + start], axis=1)
        order = np.argsort(-cand_s, axis=1, kind="stable")[:, :K]
        best_s = np.take_along_axis(cand_s, order, 1)
        truth = np.take_along_axis(cand_i, order, 1)
    seconds = time.perf_counter() - t0
    log(f"mixture of {n_comp} fitted, {n:,} + {n_queries} drawn, truth in {seconds:.0f} s")
    info = {
        "mixture_components": n_comp,
        "local_rank": LOCAL_RANK,
        "seed": seed,
        "seconds": seconds,
        "key": key,
    }
    if scratch is not None:
        base.flush()
        np.save(scratch / "queries.npy", queries)
        np.save(scratch / "truth.npy", truth)
        (scratch / "draw.json").write_text(json.dumps(info))  # last: the draw is whole
        base = np.load(scratch / "base.npy", mmap_mode="r")
    return base, queries, truth, info


def recall_at_k(ids: np.ndarray, truth: np.ndarray, k: int = K) -> float:
    """Mean fraction of the true top-k found in the returned top-k."""
    hits = sum(
        len(set(a[:k].tolist()) & set(b[:k].tolist())) for a, b in zip(ids, truth, strict=True)
    )
    return hits / (k * len(ids))


def timed(fn):
    """``(result, wall seconds, CPU seconds)`` of one call."""
    w0, c0 = time.perf_counter(), time.process_time()
    out = fn()
    return out, time.perf_counter() - w0, time.process_time() - c0


def machine_line() -> str:
    cpu = platform.processor() or "unknown CPU"
    try:
        with open("/proc/cpuinfo") as f:
            cpu = next(line.split(":", 1)[1].strip() for line in f if line.startswith("model name"))
    except (OSError, StopIteration):
        pass
    load = os.getloadavg()
    return (
        f"{cpu}, {len(os.sched_getaffinity(0))} cores, Python {platform.python_version()}, "
        f"numpy {np.__version__}, {datetime.datetime.now(datetime.timezone.utc):%Y-%m-%d %H:%M} "
        f"UTC, load average at start {load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    )


def serialized_bytes(index) -> int:
    """The size of a faiss index as ``faiss.write_index`` writes it, through a temporary file
    (``faiss.serialize_index`` would hold a second copy of a multi-GB index in memory)."""
    import faiss

    with tempfile.TemporaryDirectory() as tmp:
        path = os.path.join(tmp, "index.faiss")
        faiss.write_index(index, path)
        return os.path.getsize(path)


class FlatTimer:
    """faiss IndexFlatIP over the base (exact float search); timed again before each sweep."""

    def __init__(self, base: np.ndarray, queries: np.ndarray):
        import faiss

        self.index = faiss.IndexFlatIP(base.shape[1])
        self.index.add(np.ascontiguousarray(base, dtype=np.float32))
        self.queries = np.ascontiguousarray(queries, dtype=np.float32)
        self.bytes_per_vector = serialized_bytes(self.index) / len(base)
        self.walls: list[float] = []
        self.cpus: list[float] = []
        self.ids = None

    def time(self) -> float:
        (_, ids), wall, cpu = timed(lambda: self.index.search(self.queries, K))
        self.ids = ids
        self.walls.append(wall)
        self.cpus.append(cpu)
        return wall


class NoFlat:
    """``--no-flat``: no exact scan to time (at 10M rows faiss's copy of the floats would
    not fit beside a contender's); the speed-ups against it are NaN."""

    bytes_per_vector = None

    def __init__(self):
        self.walls: list[float] = []
        self.cpus = [float("nan")]
        self.ids = None

    def time(self) -> float:
        return float("nan")


@contextlib.contextmanager
def build_threads(n: int):
    """``n`` threads (numba, faiss's OpenMP, BLAS) inside, one thread after: builds may use
    the machine, searches are timed on one thread."""
    import faiss
    from threadpoolctl import threadpool_limits

    hashlearn.set_num_threads(n)
    faiss.omp_set_num_threads(n)
    try:
        with threadpool_limits(limits=n):
            yield
    finally:
        hashlearn.set_num_threads(1)
        faiss.omp_set_num_threads(1)


def peak_rss_gb() -> float:
    """This process's peak resident memory (``VmHWM``), GB."""
    try:
        with open("/proc/self/status") as f:
            kb = next(int(line.split()[1]) for line in f if line.startswith("VmHWM"))
        return kb / 2**20
    except (OSError, StopIteration):
        return float("nan")


def add_hnsw(index, base) -> None:
    """Add ``base`` to a faiss HNSW index in blocks copied into RAM, its vectors' and
    graph's arrays sized for all rows first.

    HNSW's insertion reads each new row from the array given to ``add`` in random order:
    from a memory-mapped 10M x 384 base (``--scratch``) every read faulted in 128 KiB of file
    read-ahead while the index's own copy of the floats filled RAM (1.3 GB/s of reads, the
    build at 45 % of a core). Added in blocks instead, faiss's arrays grow by doubling and
    the last growth held both copies (killed for memory at 24 GB): a ``resize`` up and back
    to 0 leaves their capacity for every row."""
    import faiss

    n = len(base)
    storage = faiss.downcast_index(index.storage)
    sizes = ((storage.codes, n * storage.code_size), (index.hnsw.neighbors, n * HNSW_SLOTS_PER_ROW))
    for vec, size in sizes:
        vec.resize(size)
        vec.resize(0)
    for start in range(0, n, HNSW_ADD_ROWS):
        index.add(np.array(base[start : start + HNSW_ADD_ROWS], np.float32))


def run_faiss(
    method, label, make, settings, data, flat: FlatTimer, repeats: int, log, add=None
) -> list[dict]:
    """A faiss contender: ``make()`` builds an empty index, trained and filled with the base
    (timed as the build), then searched once per setting of ``settings`` (``[(param label,
    apply(index))]``) per repetition, interleaved with the exact scan like every contender.
    Memory per vector: the serialized index (a refine stage's float copy included)."""

    base, queries, truth = data
    index = make()
    add = add or (lambda index, x: index.add(x))

    def build():
        index.train(base)
        add(index, base)

    with build_threads(BUILD_THREADS):
        _, build_wall, build_cpu = timed(build)
    log(f"{label} built in {build_wall:.1f} s")
    per_vector = serialized_bytes(index) / len(base)
    walls = {p: [] for p, _ in settings}
    cpus = {p: [] for p, _ in settings}
    ratios = {p: [] for p, _ in settings}
    cpu_ratios = {p: [] for p, _ in settings}
    found = {}
    for _, apply in settings:  # warm: the first timed search is not the one after the build
        apply(index)
        index.search(queries[:64], K)
    for _ in range(repeats):
        flat_wall = flat.time()
        for param, apply in settings:
            apply(index)
            (_, ids), wall, cpu = timed(lambda: index.search(queries, K))
            walls[param].append(wall)
            cpus[param].append(cpu)
            ratios[param].append(flat_wall / wall)
            cpu_ratios[param].append(flat.cpus[-1] / max(cpu, 1e-9))
            found[param] = ids
    rows = []
    for param, _ in settings:
        wall = float(np.median(walls[param]))
        rows.append(
            {
                "method": method,
                "label": label,
                "bits": None,
                "param": param,
                "overfetch": None,
                "ef_search": None,
                "recall": recall_at_k(found[param], truth),
                "wall_s": wall,
                "cpu_s": float(np.median(cpus[param])),
                "qps": len(queries) / wall,
                "qps_cpu": len(queries) / max(float(np.median(cpus[param])), 1e-9),
                "speedup_vs_flat": float(np.median(ratios[param])),
                "speedup_vs_flat_cpu": float(np.median(cpu_ratios[param])),
                "code_bytes": None,
                "ram_bytes_per_vector": per_vector,
                "float_bytes_per_vector": 0,
                "build_s": build_wall,
                "build_cpu_s": build_cpu,
                "build_threads": BUILD_THREADS,
                "peak_rss_gb": peak_rss_gb(),
                "learned": False,
            }
        )
    log(f"{label}: recall@10 " + " ".join(f"{r['recall']:.3f}" for r in rows))
    return rows


def run_hnsw(base, queries, truth, flat: FlatTimer, repeats: int, ef_values, log) -> list[dict]:
    """faiss ``IndexHNSWFlat`` (M = 32, efConstruction 40), efSearch swept."""
    import faiss

    def make():
        index = faiss.IndexHNSWFlat(base.shape[1], 32, faiss.METRIC_INNER_PRODUCT)
        index.hnsw.efConstruction = 40
        return index

    def ef(value):
        def apply(index):
            index.hnsw.efSearch = value

        return apply

    settings = [(f"efSearch={v}", ef(v)) for v in ef_values]
    rows = run_faiss(
        "faiss-hnsw",
        "HNSW M=32",
        make,
        settings,
        (base, queries, truth),
        flat,
        repeats,
        log,
        add_hnsw,
    )
    for r, v in zip(rows, ef_values, strict=True):
        r["ef_search"] = v
    return rows


def run_rabitq(
    base, queries, truth, flat: FlatTimer, repeats: int, log, which=("flat", "ivf")
) -> list[dict]:
    """faiss's RaBitQ (Gao & Long, SIGMOD 2024): the flat fast-scan index and the IVF one
    (``nlist`` about 4 sqrt(n), nprobe swept), each with an exact float refine stage
    (``IndexRefineFlat``, ``k_factor`` swept), inner product; ``which`` of the two."""
    import faiss

    d, data = base.shape[1], (base, queries, truth)
    ip = faiss.METRIC_INNER_PRODUCT

    def ivf_rabitq(d, nlist):
        index = faiss.IndexIVFRaBitQ(faiss.IndexFlatIP(d), d, nlist, ip)
        if FAISS_TRAIN_PER_LIST:
            index.cp.max_points_per_centroid = FAISS_TRAIN_PER_LIST
        return index

    def refine_of(inner):
        def make():
            return faiss.IndexRefineFlat(inner())

        return make

    def setting(k_factor, nprobe=None):
        def apply(index):
            index.k_factor = k_factor
            if nprobe is not None:
                faiss.downcast_index(index.base_index).nprobe = nprobe

        return apply

    rows = []
    if "flat" in which:
        rows += run_faiss(
            "faiss-rabitq-fastscan",
            "RaBitQFastScan + refine",
            refine_of(lambda: faiss.IndexRaBitQFastScan(d, ip)),
            [(f"k_factor={f}", setting(f)) for f in (1, 2, 4, 8, 16)],
            data,
            flat,
            repeats,
            log,
        )
    if "ivf" not in which:
        return rows
    nlist = max(1, int(4 * np.sqrt(len(base))))
    rows += run_faiss(
        "faiss-ivf-rabitq",
        f"IVF{nlist}-RaBitQ + refine",
        refine_of(lambda: ivf_rabitq(d, nlist)),
        [
            (f"nprobe={p}, k_factor={f}", setting(f, p))
            for p in RABITQ_NPROBE
            for f in RABITQ_K_FACTOR
        ],
        data,
        flat,
        repeats,
        log,
    )
    return rows


def run_codes(method, bits, data, fit_sample, flat, repeats, overfetches, log) -> list[dict]:
    label, name, params, learned, index_params = method
    base, queries, truth = data
    if index_params.get("coarse") == "lists":
        index_params = {**index_params, "coarse": max(1, round(4 * np.sqrt(len(base))))}
    idx = EmbeddingIndex(name, n_bits=bits, hasher_params=params, random_state=0, **index_params)
    with build_threads(BUILD_THREADS):
        _, fit_wall, fit_cpu = timed(lambda: idx.fit(fit_sample))
        _, add_wall, add_cpu = timed(lambda: idx.add(base))
    idx.search(queries[:8], K, overfetch=max(overfetches), n_threads=1)  # compile, warm
    lists = len(idx.codes_.list_sizes) if isinstance(idx.codes_, IVFIndex) else 0
    walls = {o: [] for o in overfetches}
    cpus = {o: [] for o in overfetches}
    ratios = {o: [] for o in overfetches}
    cpu_ratios = {o: [] for o in overfetches}
    found = {}
    for _ in range(repeats):
        flat_wall = flat.time()
        for o in overfetches:
            (_, ids), wall, cpu = timed(
                lambda o=o: idx.search(queries, K, overfetch=o, n_threads=1)
            )
            walls[o].append(wall)
            cpus[o].append(cpu)
            ratios[o].append(flat_wall / wall)
            cpu_ratios[o].append(flat.cpus[-1] / max(cpu, 1e-9))
            found[o] = ids
    mem = idx.memory_per_vector()
    rows = []
    for o in overfetches:
        wall = float(np.median(walls[o]))
        rows.append(
            {
                "method": label,
                "label": f"{label} {idx.n_bits_}b",
                "bits": idx.n_bits_,
                "n_bits": bits,  # the parameter: a length or "auto"
                "param": f"overfetch={o}",
                "overfetch": o,
                "ef_search": None,
                "recall": recall_at_k(found[o], truth),
                "wall_s": wall,
                "cpu_s": float(np.median(cpus[o])),
                "qps": len(queries) / wall,
                "qps_cpu": len(queries) / max(float(np.median(cpus[o])), 1e-9),
                "speedup_vs_flat": float(np.median(ratios[o])),
                "speedup_vs_flat_cpu": float(np.median(cpu_ratios[o])),
                "code_bytes": mem["code"],
                "ram_bytes_per_vector": mem["scan"] + mem["coarse"],
                "float_bytes_per_vector": mem["float"],
                "fit_s": fit_wall,
                "add_s": add_wall,
                "build_cpu_s": fit_cpu + add_cpu,
                "build_threads": BUILD_THREADS,
                "peak_rss_gb": peak_rss_gb(),
                "learned": learned,
                "ranking": idx.ranking,
                "coarse": lists or None,  # the lists built, None for a flat scan
            }
        )
    best = max(rows, key=lambda r: r["recall"])
    log(
        f"{label:>13} {idx.n_bits_:>3} bits ({bits}): fit {fit_wall:5.1f} s, add {add_wall:5.1f} s, recall@10 "
        + " ".join(f"{r['recall']:.3f}" for r in rows)
        + f" (overfetch {overfetches}); best {best['qps']:.0f} q/s"
    )
    return rows


# ----------------------------------------------------------------------------------- report


def _fastest(rows: list[dict], level: float, qk: str) -> dict | None:
    reached = [r for r in rows if r["recall"] >= level]
    return max(reached, key=lambda r: r[qk]) if reached else None


def _ram(r: dict) -> float:
    return float(r["ram_bytes_per_vector"])


def targets(rows: list[dict], flat_qps: float, dim: int, timing: str = "wall") -> dict:
    """Issue 32's targets on the measured rows; speeds by wall-clock or CPU time (``timing``).

    ``vs_faiss``: at each recall level the fastest hashlearn row against the fastest HNSW row
    (target: >= 1.5x its queries/s with <= 1/20 of its bytes per vector in RAM) and the
    fastest faiss RaBitQ row (target: ahead). ``learned_vs_sign``: at equal bits, over-fetch
    and ranking, the best learned code against centred sign bits (target: >= +0.01 with the
    asymmetric ranking)."""
    qk = "qps" if timing == "wall" else "qps_cpu"
    ours = [r for r in rows if r["bits"] is not None]
    hnsw = [r for r in rows if r["method"] == "faiss-hnsw"]
    rabitq = [r for r in rows if r["method"].startswith("faiss-") and "rabitq" in r["method"]]
    vs_faiss = []
    for level in (0.9, 0.95, 0.99):
        o, h, q = (_fastest(x, level, qk) for x in (ours, hnsw, rabitq))
        vs_faiss.append(
            {
                "recall_at_least": level,
                "ours": o and f"{o['label']} {o['param']}: {o[qk]:.0f} q/s, {_ram(o):.0f} B/vec",
                "hnsw": h and f"{h['param']}: {h[qk]:.0f} q/s, {_ram(h):.0f} B/vec",
                "rabitq": q and f"{q['label']} {q['param']}: {q[qk]:.0f} q/s, {_ram(q):.0f} B/vec",
                "qps_over_hnsw": o and h and o[qk] / h[qk],
                "ram_over_hnsw": o and h and _ram(o) / _ram(h),
                "qps_over_rabitq": o and q and o[qk] / q[qk],
                "holds": bool(
                    o and h and q and o[qk] >= 1.5 * h[qk] and _ram(o) * 20 <= _ram(h)
                    and o[qk] >= q[qk]
                ),
            }
        )  # fmt: skip
    learned_vs_sign = []
    for r in rows:
        if r["method"] not in ("sign-centred", "sign-centred-asym"):
            continue
        same = [
            x
            for x in rows
            if x["learned"]
            and x["bits"] == r["bits"]
            and x["overfetch"] == r["overfetch"]
            and x.get("ranking") == r.get("ranking")
            and x.get("coarse") is None
        ]
        if same:
            best = max(same, key=lambda x: x["recall"])
            learned_vs_sign.append(
                {
                    "ranking": r.get("ranking"),
                    "bits": r["bits"],
                    "overfetch": r["overfetch"],
                    "sign_recall": r["recall"],
                    "best_learned": best["method"],
                    "learned_recall": best["recall"],
                    "margin": best["recall"] - r["recall"],
                }
            )
    return {
        "vs_faiss": vs_faiss,
        "learned_vs_sign": learned_vs_sign,
        "flat_qps": flat_qps,
        "timing": timing,
    }


def markdown(result: dict) -> str:
    meta, rows = result["meta"], result["rows"]
    t = result["targets"][meta["timing"]]
    other = result["targets"]["cpu" if meta["timing"] == "wall" else "wall"]
    lines = [
        f"Data: {meta['data']} ({meta['n_base']} base vectors, {meta['n_queries']} held-out "
        f"queries, {meta['dim']}-d, cosine). One thread. {meta['machine']}.",
        "",
        (
            f"faiss IndexFlatIP (exact): {t['flat_qps']:.0f} queries/s by {meta['timing']} "
            f"time ({meta['flat_bytes_per_vector']:.0f} B/vector). Speeds below are by "
            f"**{meta['timing']} time** (both are in results.json); x FlatIP is the median of "
            "per-repetition ratios."
            if t["flat_qps"]
            else f"faiss IndexFlatIP not run (--no-flat / --isolate: x FlatIP is nan). Speeds "
            f"below are by **{meta['timing']} time** (both are in results.json). Builds on "
            f"{meta.get('build_threads', 1)} thread(s), each contender in "
            + ("a process of its own." if meta.get("isolated") else "one process.")
        ),
        "",
        "| method | bits | param | recall@10 | queries/s (wall) | x FlatIP (wall) "
        "| queries/s (CPU) | x FlatIP (CPU) | wall s | CPU s | code B | RAM B/vec | float B/vec |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['method']} | {r['bits'] or '-'} | {r['param']} | {r['recall']:.3f} | "
            f"{r['qps']:.0f} | {r['speedup_vs_flat']:.2f} | {r['qps_cpu']:.0f} | "
            f"{r['speedup_vs_flat_cpu']:.2f} | {r['wall_s']:.3f} | "
            f"{r['cpu_s']:.3f} | {r['code_bytes'] or '-'} | {r['ram_bytes_per_vector']:.0f} | "
            f"{r['float_bytes_per_vector']} |"
        )
    lines += [
        "",
        f"**Against faiss** (issue 32: at recall >= 0.95, >= 1.5x HNSW's queries/s with <= 1/20"
        f" of its bytes per vector in RAM, and ahead of RaBitQ; fastest row reaching each "
        f"recall, by {meta['timing']} time):",
        "",
        "| recall >= | hashlearn | HNSW M=32 | faiss RaBitQ | q/s vs HNSW | RAM vs HNSW "
        "| q/s vs RaBitQ | holds |",
        "|---|---|---|---|---|---|---|---|",
    ]

    def num(x, fmt="{:.2f}"):
        return "-" if x is None else fmt.format(x)

    for x in t["vs_faiss"]:
        lines.append(
            f"| {x['recall_at_least']} | {x['ours'] or 'not reached'} | "
            f"{x['hnsw'] or 'not reached'} | {x['rabitq'] or 'not reached'} | "
            f"{num(x['qps_over_hnsw'])} | {num(x['ram_over_hnsw'], '{:.3f}')} | "
            f"{num(x['qps_over_rabitq'])} | {'yes' if x['holds'] else 'no'} |"
        )
    by_other = ", ".join(
        f"{x['recall_at_least']}: {num(x['qps_over_hnsw'])}x HNSW, "
        f"{num(x['qps_over_rabitq'])}x RaBitQ"
        for x in other["vs_faiss"]
    )
    lines += ["", f"By {other['timing']} time instead: {by_other}."]
    lines += [
        "",
        "**Learned codes against centred sign bits** (equal bits, over-fetch and ranking; "
        "issue 32: >= +0.01 recall@10 with the asymmetric ranking):",
        "",
        "| ranking | bits | overfetch | sign recall | best learned | its recall | margin |",
        "|---|---|---|---|---|---|---|",
    ]
    for x in t["learned_vs_sign"]:
        lines.append(
            f"| {x['ranking']} | {x['bits']} | {x['overfetch']} | {x['sign_recall']:.3f} | "
            f"{x['best_learned']} | {x['learned_recall']:.3f} | {x['margin']:+.3f} |"
        )
    return "\n".join(lines) + "\n"


def plot(result: dict, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    timing = result["meta"]["timing"]
    qk = "qps" if timing == "wall" else "qps_cpu"
    rows = [r for r in result["rows"] if r["method"] != "faiss-flat-ip"]
    fig, ax = plt.subplots(figsize=(11, 6.5))
    groups: dict[str, list[dict]] = {}
    for r in rows:
        groups.setdefault(r["label"], []).append(r)
    method_colors = {m[0]: plt.get_cmap("tab10")(i) for i, m in enumerate(METHODS)}
    bit_markers = {128: "o", 256: "s", 384: "^", 512: "D"}
    for label, rs in groups.items():
        rs = sorted(rs, key=lambda r: r["recall"])
        first = rs[0]
        if first["method"].startswith("faiss-"):
            style, marker = "-", "x"
            color = {"faiss-hnsw": "black", "faiss-ivf-rabitq": "purple"}.get(
                first["method"], "brown"
            )
        else:
            style = "-" if first["learned"] else "--"
            color = method_colors.get(first["method"], "grey")
            marker = bit_markers.get(first["bits"], "o")
        ax.plot(
            [r["recall"] for r in rs],
            [r[qk] for r in rs],
            style,
            marker=marker,
            ms=4,
            color=color,
            alpha=0.5 + 0.5 * (first["bits"] or 512) / 512,
            label=label,
        )
    flat_qps = result["targets"][timing]["flat_qps"]
    if flat_qps:
        ax.axhline(flat_qps, color="grey", lw=1, ls=":")
        ax.plot([1.0], [flat_qps], "k*", ms=12, label="faiss IndexFlatIP (exact)")
    ax.axvline(0.95, color="red", lw=0.8, ls=":")
    ax.set_yscale("log")
    ax.set_xlabel("recall@10 (exact cosine)")
    ax.set_ylabel(f"queries per second, one thread, by {timing} time (log)")
    meta = result["meta"]
    ax.set_title(
        f"MiniLM-L6 embeddings, {meta['n_base']} x {meta['dim']}-d, k={K}: binary codes + "
        "exact rescoring (over-fetch 1-32x) vs faiss"
    )
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=8, frameon=False)
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


# ------------------------------------------------------------------------------------- main


def contenders(args, dim: int, parser) -> list[str]:
    """The parts of a run, in order: ``codes:<label>:<bits>``, ``hnsw``, ``rabitq-flat``,
    ``rabitq-ivf`` (each built and searched on its own: ``--isolate`` runs each in a process
    of its own)."""
    bits_list = [b if b == "auto" else int(b) for b in args.bits.split(",")]
    wanted = args.methods.split(",")
    if args.quick:
        bits_list, wanted = [256, 384], ["sign-centred", "sign-centred-asym", "itq", "itq-asym"]
    unknown = set(wanted) - {m[0] for m in METHODS}
    if unknown:
        parser.error(f"unknown methods {sorted(unknown)}")
    parts = []
    for label, name, *_ in METHODS:
        if label in wanted:
            parts += [
                f"codes:{label}:{b}"
                for b in bits_list
                if b == "auto" or not (name in AT_MOST_DIM and b > dim)
            ]
    if not args.no_hnsw:
        parts.append("hnsw")
    if not args.no_rabitq:
        parts += [] if args.no_rabitq_flat else ["rabitq-flat"]
        parts.append("rabitq-ivf")
    return parts


def run_part(part: str, data, fit_sample, flat, args, log) -> list[dict]:
    """Build and search one contender of :func:`contenders`."""
    base, queries, truth = data
    if part.startswith("codes:"):
        _, label, bits = part.split(":")
        method = next(m for m in METHODS if m[0] == label)
        bits = bits if bits == "auto" else int(bits)
        return run_codes(method, bits, data, fit_sample, flat, args.repeats, OVERFETCH, log)
    if part == "hnsw":
        return run_hnsw(base, queries, truth, flat, args.repeats, EF_SEARCH, log)
    which = ("flat",) if part == "rabitq-flat" else ("ivf",)
    return run_rabitq(base, queries, truth, flat, args.repeats, log, which)


def run_isolated(part: str, argv: list[str], out: Path, log) -> list[dict]:
    """``part`` in a fresh process of this script (its memory returned when it ends); its
    rows are kept in ``out/parts`` so that ``--resume`` skips it next time."""
    path = out / "parts" / (part.replace(":", "_") + ".json")
    if path.is_file():
        log(f"{part}: rows from {path}")
        return json.loads(path.read_text())
    path.parent.mkdir(parents=True, exist_ok=True)
    child = [a for a in argv if a not in ("--isolate", "--resume")]
    log(f"{part}: in a process of its own")
    subprocess.run(
        [sys.executable, __file__, *child, "--part", part, "--part-out", str(path)], check=True
    )
    return json.loads(path.read_text())


def main(argv: list[str] | None = None) -> dict:
    argv = sys.argv[1:] if argv is None else list(argv)
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="data set directory")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "embeddings")
    parser.add_argument("--n-queries", type=int, default=1000)
    parser.add_argument("--fit-size", type=int, default=20000)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--bits", default=",".join(map(str, BITS)))
    parser.add_argument("--methods", default=",".join(m[0] for m in METHODS))
    parser.add_argument("--no-hnsw", action="store_true")
    parser.add_argument("--no-rabitq", action="store_true")
    parser.add_argument(
        "--no-rabitq-flat", action="store_true", help="faiss IVF-RaBitQ only (no flat RaBitQ)"
    )
    parser.add_argument(
        "--synthetic",
        type=int,
        default=0,
        help="instead of the data set: this many base vectors (and --n-queries queries) drawn "
        "from a mixture of probabilistic PCA fitted to it (seeded; generated, kept only with --scratch)",
    )
    parser.add_argument(
        "--scratch",
        type=Path,
        default=None,
        help="with --synthetic: write the drawn base to DIR/base.npy and map it (larger than "
        "memory); a later run with the same draw maps it again",
    )
    parser.add_argument("--quick", action="store_true", help="128/384 bits, itq and sign only")
    parser.add_argument(
        "--timing",
        choices=("wall", "cpu"),
        default="wall",
        help="speeds in the table's targets and the plot: wall-clock (default, for a quiet "
        "machine) or CPU time (fairer under load)",
    )
    parser.add_argument(
        "--no-flat",
        action="store_true",
        help="do not build or time faiss IndexFlatIP (10M rows: its copy of the floats)",
    )
    parser.add_argument(
        "--isolate",
        action="store_true",
        help="build and search each contender in a process of its own (one index in memory "
        "at a time); its rows are kept in OUT/parts",
    )
    parser.add_argument(
        "--resume", action="store_true", help="with --isolate: keep the parts already in OUT"
    )
    parser.add_argument(
        "--build-threads",
        type=int,
        default=1,
        help="threads for every build (fit, add, faiss train/add); searches use one",
    )
    parser.add_argument(
        "--faiss-train-per-list",
        type=int,
        default=None,
        help="faiss IVF's k-means sample per list (default: faiss's 256; EmbeddingIndex's "
        "lists use 64)",
    )
    parser.add_argument("--part", default=None, help=argparse.SUPPRESS)
    parser.add_argument("--part-out", type=Path, default=None, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    global FAISS_TRAIN_PER_LIST
    FAISS_TRAIN_PER_LIST = args.faiss_train_per_list
    if max(1, args.build_threads) != BUILD_THREADS:
        parser.error("--build-threads must be given on the command line (numba reads it first)")
    if args.isolate and not args.resume:
        for old in (args.out / "parts").glob("*.json"):
            old.unlink()

    def log(msg: str) -> None:
        print(msg, file=sys.stderr, flush=True)

    hashlearn.set_num_threads(1)
    import faiss

    faiss.omp_set_num_threads(1)
    ds = load_embeddings(args.data)
    data_name, data_info = str(ds.path), ds.info
    if args.synthetic:
        with build_threads(BUILD_THREADS):
            base, queries, truth, data_info = mixture_sample(
                np.asarray(ds.base, np.float32),
                args.synthetic,
                args.n_queries,
                log,
                scratch=args.scratch,
            )
        data_name = (
            f"{args.synthetic:,} vectors from a mixture of probabilistic PCA fitted to {ds.path}"
        )
    else:
        base = np.ascontiguousarray(ds.base, dtype=np.float32)
        queries = np.ascontiguousarray(ds.queries[: args.n_queries], dtype=np.float32)
        truth = ds.neighbors[: args.n_queries, :K]
    dim = base.shape[1]
    parts = contenders(args, dim, parser)
    rng = np.random.default_rng(0)
    take = np.sort(rng.choice(len(base), min(args.fit_size, len(base)), replace=False))
    fit_sample = np.ascontiguousarray(base[take])
    machine = machine_line()
    flat = NoFlat() if args.no_flat or args.isolate else FlatTimer(base, queries)
    if args.part is not None:  # one contender, for --isolate
        rows = run_part(args.part, (base, queries, truth), fit_sample, flat, args, log)
        args.part_out.write_text(json.dumps(rows, indent=1) + "\n")
        return {"rows": rows}
    log(f"{machine}\nbase {base.shape}, queries {queries.shape}")
    t_start = time.perf_counter()
    if not isinstance(flat, NoFlat):
        flat.time()
        log(f"IndexFlatIP recall@10 {recall_at_k(flat.ids, truth):.4f}, {flat.walls[-1]:.2f} s")
    rows: list[dict] = []
    for part in parts:
        if args.isolate:
            rows += run_isolated(part, argv, args.out, log)
        else:
            rows += run_part(part, (base, queries, truth), fit_sample, flat, args, log)
    flat_rows = []
    if flat.walls:
        flat_wall = float(np.median(flat.walls))
        flat_rows.append(
            {
                "method": "faiss-flat-ip",
                "label": "IndexFlatIP",
                "bits": None,
                "param": "exact",
                "overfetch": None,
                "ef_search": None,
                "recall": recall_at_k(flat.ids, truth),
                "wall_s": flat_wall,
                "cpu_s": float(np.median(flat.cpus)),
                "qps": len(queries) / flat_wall,
                "qps_cpu": len(queries) / float(np.median(flat.cpus)),
                "speedup_vs_flat": 1.0,
                "speedup_vs_flat_cpu": 1.0,
                "code_bytes": None,
                "ram_bytes_per_vector": flat.bytes_per_vector,
                "float_bytes_per_vector": 0,
                "learned": False,
            }
        )
    flat_qps = flat_rows[0]["qps"] if flat_rows else None
    flat_qps_cpu = flat_rows[0]["qps_cpu"] if flat_rows else None
    result = {
        "meta": {
            "machine": machine,
            "data": data_name,
            "dataset_info": data_info,
            "n_base": int(len(base)),
            "n_queries": int(len(queries)),
            "dim": int(dim),
            "k": K,
            "fit_size": int(len(fit_sample)),
            "repeats": args.repeats,
            "build_threads": BUILD_THREADS,
            "isolated": args.isolate,
            "flat_bytes_per_vector": flat.bytes_per_vector,
            "load_average_end": os.getloadavg(),
            "timing": args.timing,
            "seconds": time.perf_counter() - t_start,
        },
        "rows": [*flat_rows, *rows],
    }
    result["targets"] = {
        "wall": targets(result["rows"], flat_qps, dim, "wall"),
        "cpu": targets(result["rows"], flat_qps_cpu, dim, "cpu"),
    }
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "results.json").write_text(json.dumps(result, indent=1) + "\n")
    md = markdown(result)
    (args.out / "results.md").write_text(md)
    plot(result, args.out / "recall_qps.png")
    print(md)
    log(f"wrote {args.out} in {time.perf_counter() - t_start:.0f} s")
    return result


if __name__ == "__main__":
    main()
