"""Scale: exact Hamming k-NN with FlatIndex and MultiIndexHashing vs faiss, 1M to 100M codes.

Contenders: hashlearn FlatIndex (exact linear scan), hashlearn MultiIndexHashing (exact,
Norouzi et al. 2012), faiss.IndexBinaryFlat (exact) and faiss.IndexBinaryMultiHash
(approximate: ``nhash`` tables of ``b / nhash`` bits, probing ``nflip`` flipped bits; its
settings are swept and the fastest setting at its best recall is reported).

Data: LSH codes (RandomHyperplaneLSH) of Fashion-MNIST training images tiled with Gaussian
noise (``hashlearn.datasets.tile_with_noise``-style, 5% of the pixel std) to n rows, queries
from the test images; and uniformly random codes. For each (data, n, b, k): build time,
memory (bytes of the index's arrays; faiss: resident-set growth during its build), queries
per second with every core (median over interleaved repetitions), and recall (fraction of
the k returned distances equal to the exact k-NN distances, so ties do not matter).

The on-disk part writes a 100M x 64-bit FlatIndex by appending 10M-code blocks in place
(``FlatIndex.open(...).add``), then times ``FlatIndex.open`` and measures the anonymous
memory a search adds on top of the mapped file; the files are deleted afterwards.

    python bench/scale.py --quick --no-write             # 100k codes, a minute
    python bench/scale.py                                 # 1M and 10M, all b and k (long)
    python bench/scale.py --n 10000000 --bits 64 --k 10   # the headline comparison
    python bench/scale.py --ondisk /path/with/2GB/free    # the 100M memory-mapped index
"""

from __future__ import annotations

import argparse
import gc
import json
import shutil
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import interleaved_times, machine, markdown_table, write_section  # noqa: E402
from hashlearn.datasets import fashion_mnist_available, load_fashion_mnist  # noqa: E402
from hashlearn.hashers.lsh import RandomHyperplaneLSH  # noqa: E402
from hashlearn.index.flat import FlatIndex  # noqa: E402
from hashlearn.index.mih import MultiIndexHashing  # noqa: E402

try:
    import faiss
except ImportError:  # faiss is optional
    faiss = None


def proc_status(field: str) -> int:
    """A ``/proc/self/status`` memory field in bytes (0 where unavailable)."""
    try:
        with open("/proc/self/status") as f:
            for line in f:
                if line.startswith(field + ":"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return 0


def random_codes(n, n_queries, n_bits, seed=0):
    rng = np.random.default_rng(seed)
    return (
        rng.integers(0, 256, (n, n_bits // 8), dtype=np.uint8),
        rng.integers(0, 256, (n_queries, n_bits // 8), dtype=np.uint8),
    )


def lsh_codes(n, n_queries, max_bits, fashion_dir=None, noise=0.05, seed=0, chunk=100_000):
    """LSH codes of Fashion-MNIST tiled with noise; the first b bits are a b-bit LSH code."""
    X_train, _ = load_fashion_mnist(fashion_dir, subset="train")
    X_test, _ = load_fashion_mnist(fashion_dir, subset="test")
    X_train /= 255.0
    X_test /= 255.0
    hasher = RandomHyperplaneLSH(max_bits, random_state=seed).fit(X_train[:10_000])
    rng = np.random.default_rng(seed)
    scale = noise * float(X_train.std())
    codes = np.empty((n, max_bits // 8), np.uint8)
    for start in range(0, n, chunk):
        rows = np.arange(start, min(n, start + chunk)) % len(X_train)
        block = (
            X_train[rows]
            + rng.standard_normal((len(rows), X_train.shape[1]), dtype=np.float32) * scale
        )
        codes[start : start + len(rows)] = hasher.encode(block)
    queries = hasher.encode(X_test[rng.permutation(len(X_test))[:n_queries]])
    return codes, queries


def distance_recall(D, D_true):
    """Fraction of the k returned distances equal to the exact k-NN distances (sorted)."""
    return float(np.mean(D == D_true))


def build(kind, db, n_bits, **params):
    gc.collect()
    rss = proc_status("VmRSS")
    start = time.perf_counter()
    if kind == "FlatIndex":
        index = FlatIndex(n_bits)
        index.add(db)
        memory = index._words.nbytes + index._ids.nbytes
    elif kind == "MultiIndexHashing":
        index = MultiIndexHashing(n_bits)
        index.add(db)
        index.build()
        memory = (
            index._flat._words.nbytes
            + index._flat._ids.nbytes
            + sum(a.nbytes for a in index._tables.values())
        )
    elif kind == "faiss.IndexBinaryFlat":
        index = faiss.IndexBinaryFlat(n_bits)
        index.add(db)
        memory = db.nbytes
    else:
        index = faiss.IndexBinaryMultiHash(n_bits, params["nhash"], n_bits // params["nhash"])
        index.add(db)
        memory = None
    seconds = time.perf_counter() - start
    if memory is None:
        memory = max(proc_status("VmRSS") - rss, db.nbytes)
    return index, seconds, memory


def run_config(data, n, n_bits, ks, db, queries, repeats, progress=None):
    progress = progress or (lambda msg: print(msg, flush=True))
    rows = []
    contenders = {}
    for kind in ("FlatIndex", "MultiIndexHashing") + (("faiss.IndexBinaryFlat",) if faiss else ()):
        index, seconds, memory = build(kind, db, n_bits)
        contenders[kind] = (index, seconds, memory)
        progress(f"  built {kind} in {seconds:.1f}s")
    flat = contenders["FlatIndex"][0]
    for k in ks:
        t = time.perf_counter()
        D_true, _ = flat.search(queries, k)
        flat_per_query = (time.perf_counter() - t) / len(queries)
        calls = {
            kind: (lambda ix=ix, k=k: ix.search(queries, k))
            for kind, (ix, _, _) in contenders.items()
        }
        # faiss multi-hash: sweep its settings, keep the fastest at its best recall
        best = None
        if faiss:
            sweep_q = queries[:100]
            sweep_true = D_true[:100]
            for nhash in (2, 4, 8):
                # substrings of 16..32 bits: shorter ones make buckets of n / 2**len codes
                if n_bits % nhash or not 16 <= n_bits // nhash <= 32:
                    continue
                mh, seconds, memory = build("faiss.IndexBinaryMultiHash", db, n_bits, nhash=nhash)
                for nflip in (0, 1, 2):
                    mh.nflip = nflip
                    t = time.perf_counter()
                    mh.search(sweep_q[:5], k)
                    if (time.perf_counter() - t) / 5 > 20 * flat_per_query:
                        progress(
                            f"  multihash nhash={nhash} nflip={nflip}: >20x slower than "
                            "FlatIndex, skipped"
                        )
                        break  # more flips only cost more
                    t = time.perf_counter()
                    D, _ = mh.search(sweep_q, k)
                    t = time.perf_counter() - t
                    rec = distance_recall(D, sweep_true)
                    key = (round(rec, 3), -t)
                    if best is None or key > best[0]:
                        best = (key, nhash, nflip, seconds, memory, rec)
                del mh
                gc.collect()
        if best is not None:
            _, nhash, nflip, mh_build, mh_mem, mh_rec = best
            mh, _, _ = build("faiss.IndexBinaryMultiHash", db, n_bits, nhash=nhash)
            mh.nflip = nflip
            mh_rec = distance_recall(mh.search(queries, k)[0], D_true)
            calls[f"faiss.IndexBinaryMultiHash(nhash={nhash}, nflip={nflip})"] = lambda mh=mh, k=k: (
                mh.search(queries, k)
            )
        names = list(calls)
        times = interleaved_times([calls[c] for c in names], repeats)
        med = np.median(times, axis=0)
        flat_per_rep = times[:, names.index("FlatIndex")]
        for c, name in enumerate(names):
            if name.startswith("faiss.IndexBinaryMultiHash"):
                build_s, memory, rec = mh_build, mh_mem, mh_rec
            else:
                _, build_s, memory = contenders[name]
                rec = distance_recall(calls[name]()[0], D_true)
            rows.append(
                {
                    "data": data,
                    "n": n,
                    "bits": n_bits,
                    "k": k,
                    "index": name,
                    "build_s": round(build_s, 2),
                    "memory_MB": round(memory / 2**20, 1),
                    "QPS": round(len(queries) / med[c]),
                    "ms_per_query": 1e3 * med[c] / len(queries),
                    "recall": round(rec, 4),
                    "speedup_vs_flat": round(float(np.median(flat_per_rep / times[:, c])), 2),
                }
            )
        progress(
            "  "
            + ", ".join(
                f"{r['index']}: {r['QPS']} q/s x{r['speedup_vs_flat']}" for r in rows[-len(names) :]
            )
        )
        if best is not None:
            del mh
    return rows


def ondisk(directory: Path, n: int, progress=print) -> dict:
    """Write an n x 64-bit FlatIndex by in-place appends, then time open + search memory."""
    path = directory / "hashlearn_scale_100M"
    if path.exists():
        shutil.rmtree(path)
    rng = np.random.default_rng(0)
    block = 10_000_000
    FlatIndex(64).save(path)
    start = time.perf_counter()
    opened = FlatIndex.open(path)
    for s in range(0, n, block):
        opened.add(rng.integers(0, 256, (min(block, n - s), 8), dtype=np.uint8))
        progress(f"  appended {min(n, s + block):,} codes")
    write_s = time.perf_counter() - start
    del opened
    gc.collect()
    queries = rng.integers(0, 256, (16, 8), dtype=np.uint8)
    anon0 = proc_status("RssAnon")
    start = time.perf_counter()
    index = FlatIndex.open(path)  # == FlatIndex.load(path, mmap=True, verify=False)
    open_s = time.perf_counter() - start
    start = time.perf_counter()
    D, I = index.search(queries, 10)
    search_s = time.perf_counter() - start
    anon = proc_status("RssAnon") - anon0
    file_mb = sum(f.stat().st_size for f in path.iterdir()) / 2**20
    shutil.rmtree(path)
    return {
        "n": n,
        "bits": 64,
        "files_MB": round(file_mb),
        "append_write_s": round(write_s, 1),
        "open_s": round(open_s, 4),
        "search_16_queries_k10_s": round(search_s, 2),
        "anon_memory_growth_MB": round(anon / 2**20, 1),
    }


def plot(rows, path):
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from hashlearn.plots import atomic_path

    sel = [r for r in rows if r["bits"] == 64 and r["k"] == 10]
    fig, axes = plt.subplots(1, 2, figsize=(10, 4), sharey=True)
    for ax, data in zip(axes, ("lsh", "random"), strict=True):
        for name in sorted({r["index"].split("(")[0] for r in sel}):
            pts = sorted(
                (r["n"], r["ms_per_query"])
                for r in sel
                if r["data"] == data and r["index"].split("(")[0] == name
            )
            if pts:
                ax.plot(*zip(*pts, strict=True), marker="o", label=name)
        ax.set_xscale("log")
        ax.set_yscale("log")
        ax.set_xlabel("database size n")
        ax.set_title(f"{data} codes, 64 bits, k=10")
    axes[0].set_ylabel("ms per query (batched, all cores)")
    axes[0].legend(fontsize=8)
    fig.tight_layout()
    with atomic_path(path) as tmp:
        fig.savefig(tmp, dpi=110, format="png")
    plt.close(fig)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="100k codes, 64 bits, k=10")
    parser.add_argument("--n", type=int, nargs="+", default=[1_000_000, 10_000_000])
    parser.add_argument("--bits", type=int, nargs="+", default=[32, 64, 128])
    parser.add_argument("--k", type=int, nargs="+", default=[1, 10, 100])
    parser.add_argument("--data", nargs="+", default=["lsh", "random"])
    parser.add_argument("--queries", type=int, default=1000)
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--fashion-dir", default=None, help="directory of the IDX files")
    parser.add_argument("--ondisk", default=None, help="directory for the 100M on-disk test")
    parser.add_argument("--ondisk-n", type=int, default=100_000_000)
    parser.add_argument("--out", default=str(Path(__file__).resolve().parent.parent / "docs"))
    parser.add_argument("--no-write", action="store_true")
    args = parser.parse_args(argv)
    if args.quick:
        args.n, args.bits, args.k, args.queries = [100_000], [64], [10], 300
    rows, disk = [], None
    for data in args.data:
        if data == "lsh" and not fashion_mnist_available(args.fashion_dir):
            print("Fashion-MNIST not found: skipping LSH codes (pass --fashion-dir)")
            continue
        for n in args.n:
            max_bits = max(args.bits)
            if data == "lsh":
                db_all, q_all = lsh_codes(n, args.queries, max_bits, args.fashion_dir)
            else:
                db_all, q_all = random_codes(n, args.queries, max_bits)
            for n_bits in args.bits:
                print(f"{data} n={n:,} b={n_bits}", flush=True)
                db = np.ascontiguousarray(db_all[:, : n_bits // 8])
                q = np.ascontiguousarray(q_all[:, : n_bits // 8])
                rows += run_config(data, n, n_bits, args.k, db, q, args.repeats)
                del db
                gc.collect()
            del db_all
            gc.collect()
    if args.ondisk:
        disk = ondisk(Path(args.ondisk), args.ondisk_n)
        print(disk)
    cols = [
        "data",
        "n",
        "bits",
        "k",
        "index",
        "build_s",
        "memory_MB",
        "QPS",
        "recall",
        "speedup_vs_flat",
    ]
    table = markdown_table(cols, [[r[c] for c in cols] for r in rows]) if rows else ""
    print(table)
    if args.no_write:
        return
    out = Path(args.out)
    suffix = "_quick" if args.quick else ""
    (out / f"scale{suffix}.json").write_text(json.dumps({"rows": rows, "ondisk": disk}, indent=1))
    if rows:
        plot(rows, out / f"scale_query_time{suffix}.png")
    md = [
        f"Machine: {machine()} (shared with other jobs: timings are provisional).",
        f"Command: `python bench/scale.py {' '.join(argv or sys.argv[1:])}`.",
        "",
        "Recall = fraction of returned distances equal to the exact k-NN distances; "
        "speedup = median per-repetition ratio of FlatIndex's time to the contender's. "
        "faiss.IndexBinaryMultiHash is approximate: the row shows its fastest setting "
        "among those reaching its best recall.",
        "",
        table,
    ]
    if rows:
        md += ["", f"![query time vs n](scale_query_time{suffix}.png)"]
    if disk:
        md += ["", "On-disk: " + ", ".join(f"{k}={v}" for k, v in disk.items())]
    write_section("bench/scale.py" + (" --quick" if args.quick else ""), "\n".join(md))


if __name__ == "__main__":
    main()
