"""Encoding float32 rows to 64-bit codes: hashlearn vs faiss, CPU time and peak memory.

Contenders, on the same n x 784 float32 rows in the same process (Fashion-MNIST's 60k
training images, raw pixels 0..255, tiled to n rows; a seeded Gaussian when Fashion-MNIST is
not installed), fitted on the first 20k rows (10k with --quick):

* ``RandomHyperplaneLSH(64).encode(X)`` vs faiss ``IndexLSH(784, 64).sa_encode(X)`` (a random
  rotation, then the sign of each coordinate, packed: the same encoder);
* ``IterativeQuantization(64).encode(X)`` vs faiss's ITQ,
  ``IndexPreTransform(ITQTransform(784, 64, do_pca=True), IndexLSH(64, 64, False, False))``,
  ``.sa_encode(X)`` (centre, PCA, ITQ rotation, sign, packed).

Each is timed on one thread (``faiss.omp_set_num_threads(1)``, BLAS limited to one thread
with threadpoolctl) and on every core. Timing is interleaved (each repetition times every
contender once, in turn), with CPU time (``time.process_time``, summed over threads) beside
wall time; the speed-up is the median of the per-repetition ratios faiss CPU s / hashlearn
CPU s (above 1: hashlearn is faster), with its range.

Peak extra memory: each contender encodes the n rows once in a fresh subprocess that builds
the same data and model, encodes 1000 rows to warm up, resets the kernel's peak-RSS counter
(``/proc/self/clear_refs``), encodes, and reports ``VmHWM - VmRSS before`` from
``/proc/self/status``: every allocation counts, numpy's, BLAS's and faiss's alike (the codes,
n x 8 bytes, included; ``malloc_trim`` first, so that free heap pages cannot hide new
allocations). A second encode under ``tracemalloc`` gives the peak of numpy's allocations
alone (for faiss: only the returned codes; its C++ buffers are invisible to tracemalloc).

Also reported: the fraction of bits where hashlearn's float32 codes equal its float64 codes
(the codes of ``encode`` before it worked in the input's precision), on the first 20k rows.

    python bench/encode.py --quick        # 100k rows, < 1 minute
    python bench/encode.py                # 1M rows (3.1 GB of float32), < 5 minutes

Writes ``bench/out/encode.json`` (``encode-quick.json`` with --quick); records the load
average before and after.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")  # idle faiss threads sleep, not spin

import argparse  # noqa: E402
import datetime  # noqa: E402
import json  # noqa: E402
import re  # noqa: E402
import subprocess  # noqa: E402
import sys  # noqa: E402
import time  # noqa: E402
from pathlib import Path  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import machine  # noqa: E402
from hashlearn import IterativeQuantization, RandomHyperplaneLSH  # noqa: E402
from hashlearn.datasets import fashion_mnist_available, load_fashion_mnist  # noqa: E402

D = 784
N_BITS = 64
CONTENDERS = ("hashlearn-lsh", "faiss-lsh", "hashlearn-itq", "faiss-itq")
PAIRS = (("lsh", "hashlearn-lsh", "faiss-lsh"), ("itq", "hashlearn-itq", "faiss-itq"))
OUT = Path(__file__).resolve().parent / "out"


def make_rows(n: int, seed: int = 0) -> tuple[np.ndarray, str]:
    """``(n, 784)`` float32 rows, filled in place (no temporary as large as the result)."""
    X = np.empty((n, D), np.float32)
    if fashion_mnist_available():
        images, _ = load_fashion_mnist(subset="train")
        for start in range(0, n, len(images)):
            stop = min(n, start + len(images))
            X[start:stop] = images[: stop - start]
        return X, f"Fashion-MNIST training images (raw pixels 0..255) tiled to {n} rows"
    rng = np.random.default_rng(seed)
    for start in range(0, n, 50_000):
        stop = min(n, start + 50_000)
        rng.standard_normal((stop - start, D), dtype=np.float32, out=X[start:stop])
    return X, f"seeded Gaussian N(0, I), {n} rows"


def fit(name: str, train: np.ndarray):
    """Contender ``name`` fitted on ``train``: a hashlearn hasher or a faiss index."""
    if name.startswith("hashlearn"):
        cls = RandomHyperplaneLSH if name.endswith("lsh") else IterativeQuantization
        return cls(n_bits=N_BITS, random_state=0).fit(train)
    import faiss

    if name == "faiss-lsh":
        index = faiss.IndexLSH(D, N_BITS)  # random rotation, thresholds at 0
    else:
        itq = faiss.ITQTransform(D, N_BITS, True)
        index = faiss.IndexPreTransform(itq, faiss.IndexLSH(N_BITS, N_BITS, False, False))
    index.train(train)
    return index


def encoder(model):
    """``X -> uint8 codes`` of a fitted contender."""
    return model.encode if hasattr(model, "encode") else model.sa_encode


def _status_kb(field: str) -> int:
    with open("/proc/self/status") as f:
        return int(re.search(rf"^{field}:\s+(\d+) kB", f.read(), re.M).group(1))


def child_memory(name: str, n: int, n_train: int) -> None:
    """Subprocess body: print the peak extra memory of one full encode, in bytes: resident
    (every allocation) and traced by tracemalloc (numpy's allocations only)."""
    import ctypes
    import tracemalloc

    X, _ = make_rows(n)
    encode = encoder(fit(name, X[:n_train]))
    encode(X[:1000])
    ctypes.CDLL("libc.so.6").malloc_trim(0)  # free heap pages would hide new allocations
    with open("/proc/self/clear_refs", "w") as f:
        f.write("5")  # reset the peak RSS (VmHWM) to the current RSS
    before = _status_kb("VmRSS")
    codes = encode(X)
    peak = _status_kb("VmHWM")
    del codes
    tracemalloc.start()
    codes = encode(X)
    traced = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    print(
        json.dumps(
            {
                "extra_bytes": (peak - before) * 1024,
                "numpy_traced_bytes": traced,
                "codes_bytes": codes.nbytes,
            }
        )
    )


def peak_memory(name: str, n: int, n_train: int) -> dict:
    cmd = [sys.executable, __file__, "--child", name, "--n", str(n), "--n-train", str(n_train)]
    out = subprocess.run(cmd, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def time_all(encoders: dict, X: np.ndarray, repeats: int, threads: int) -> dict:
    """Interleaved wall and CPU seconds per call, ``{name: {"wall": [...], "cpu": [...]}}``."""
    import faiss
    from threadpoolctl import threadpool_limits

    faiss.omp_set_num_threads(threads)
    times = {name: {"wall": [], "cpu": []} for name in encoders}
    with threadpool_limits(threads):
        for encode in encoders.values():
            encode(X[:2000])  # warm up
        for _ in range(repeats):
            for name, encode in encoders.items():
                w0, c0 = time.perf_counter(), time.process_time()
                encode(X)
                times[name]["cpu"].append(time.process_time() - c0)
                times[name]["wall"].append(time.perf_counter() - w0)
    return times


def float64_agreement(models: dict, X: np.ndarray) -> dict:
    """Fraction of bits where float32 codes equal the float64 codes, on the first 20k rows."""
    rows = X[:20_000]
    out = {}
    for name in ("hashlearn-lsh", "hashlearn-itq"):
        a = np.unpackbits(models[name].encode(rows), axis=1)
        b = np.unpackbits(models[name].encode(rows.astype(np.float64)), axis=1)
        out[type(models[name]).__name__] = float(np.mean(a == b))
    return out


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--n", type=int, default=None, help="rows to encode (default 1M)")
    parser.add_argument("--quick", action="store_true", help="100k rows, 3 repetitions")
    parser.add_argument("--repeats", type=int, default=None)
    parser.add_argument("--n-train", type=int, default=None, help=argparse.SUPPRESS)
    parser.add_argument("--child", choices=CONTENDERS, help=argparse.SUPPRESS)
    parser.add_argument("--out", type=Path, default=None)
    args = parser.parse_args()
    n = args.n or (100_000 if args.quick else 1_000_000)
    n_train = args.n_train or (10_000 if args.quick else 20_000)
    if args.child:
        child_memory(args.child, n, n_train)
        return
    repeats = args.repeats or (3 if args.quick else 5)
    cores = len(os.sched_getaffinity(0))
    load_before = os.getloadavg()
    started = datetime.datetime.now(datetime.timezone.utc)

    X, data = make_rows(n)
    print(f"{data}; {machine()}; load average {load_before}", flush=True)
    models = {name: fit(name, X[:n_train]) for name in CONTENDERS}
    encoders = {name: encoder(model) for name, model in models.items()}
    agreement = float64_agreement(models, X)
    print(f"bits equal to the float64 codes: {agreement}", flush=True)

    result = {
        "data": data,
        "n": n,
        "d": D,
        "n_bits": N_BITS,
        "n_train": n_train,
        "repeats": repeats,
        "machine": machine(),
        "started_utc": started.isoformat(timespec="seconds"),
        "load_average_before": load_before,
        "agreement_with_float64_codes": agreement,
        "timing": {},
        "memory": {},
    }
    for threads in sorted({1, cores}):
        times = time_all(encoders, X, repeats, threads)
        for family, ours, theirs in PAIRS:
            cpu = np.array(times[theirs]["cpu"]) / np.array(times[ours]["cpu"])
            wall = np.array(times[theirs]["wall"]) / np.array(times[ours]["wall"])
            row = {
                "threads": threads,
                "hashlearn_cpu_ns_per_row": 1e9 * float(np.median(times[ours]["cpu"])) / n,
                "faiss_cpu_ns_per_row": 1e9 * float(np.median(times[theirs]["cpu"])) / n,
                "faiss_over_hashlearn_cpu": float(np.median(cpu)),
                "faiss_over_hashlearn_cpu_range": [float(cpu.min()), float(cpu.max())],
                "faiss_over_hashlearn_wall": float(np.median(wall)),
                "seconds": {name: times[name] for name in (ours, theirs)},
            }
            result["timing"][f"{family}-{threads}-threads"] = row
            print(
                f"{family} {threads} thread(s): hashlearn {row['hashlearn_cpu_ns_per_row']:.0f} "
                f"CPU ns/row, faiss {row['faiss_cpu_ns_per_row']:.0f}; faiss/hashlearn CPU "
                f"{row['faiss_over_hashlearn_cpu']:.2f}x (range {cpu.min():.2f}-{cpu.max():.2f})",
                flush=True,
            )
    del encoders, models
    for name in CONTENDERS:
        mem = peak_memory(name, n, n_train)
        mem["fraction_of_input"] = mem["extra_bytes"] / X.nbytes
        result["memory"][name] = mem
        print(
            f"{name}: peak extra memory {mem['extra_bytes'] / 2**20:.1f} MiB resident "
            f"({100 * mem['fraction_of_input']:.1f} % of the {X.nbytes / 2**30:.2f} GiB input), "
            f"{mem['numpy_traced_bytes'] / 2**20:.1f} MiB of numpy arrays",
            flush=True,
        )
    result["load_average_after"] = os.getloadavg()
    result["seconds_total"] = (datetime.datetime.now(datetime.timezone.utc) - started).seconds
    print(f"load average after {result['load_average_after']}", flush=True)
    out = args.out or OUT / ("encode-quick.json" if args.quick else "encode.json")
    out.parent.mkdir(parents=True, exist_ok=True)
    out.write_text(json.dumps(result, indent=1) + "\n")
    print(f"wrote {out}")


if __name__ == "__main__":
    main()
