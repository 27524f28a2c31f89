"""Residual 1-bit codes under float IVF centroids vs global codes (issue 32: the next step).

A design study for the coarse stage, not a library path yet. It measures how many candidates
each kind of code needs before the exact rescoring reaches a recall@10, on the MiniLM set or
the mixture of ``bench/embeddings.py --synthetic``:

* **global** (what ``EmbeddingIndex(coarse="auto")`` did when this study ran: 566 k-majority
  lists from the fit sample, now ``coarse=566``): ITQ-256 codes of the
  vectors, k-majority lists over the codes, the ``k * overfetch`` nearest codes by Hamming
  distance rescored exactly (``EmbeddingIndex.search``, timed whole);
* **residual** (the IVF-RaBitQ layout: Gao & Long, "RaBitQ: quantizing high-dimensional
  vectors with a theoretical error bound for approximate nearest neighbor search", SIGMOD
  2024): float k-means lists (``round(sqrt(n))``), each vector's residual ``r = x - c`` to its
  list's centroid coded as the signs of ``r P`` (``P``: a random orthonormal ``d x 256``), and
  per vector two floats. A query probes its ``nprobe`` nearest centroids and ranks their
  vectors by the estimate

      <q, x> ~ <q, c> + <c, r> + |r|^2 <(q - c) P, b> / |r P|_1,   b = sign(r P) in {-1, 1},

  RaBitQ's estimator of ``<q - c, r>`` (its ``<o, q> ~ <o-bar, q> / <o-bar, o>``) with the
  query projections quantized to 4 bits (four bit planes; the codes of a list in blocks of 8,
  one 8-lane vector AND + ``ctpop`` per plane and code word);
  the top ``N`` by estimate are rescored exactly by the library's rescoring kernel
  (``rescore_runner``, as ``EmbeddingIndex.search``). ``<(q - c) P, b> = <q P, b> - <c P, b>``,
  so one query table serves every list and the per-vector floats are ``|r|^2 / |r P|_1`` and
  ``<c, r> - that * <c P, b>``.

Reported per (nprobe, N): recall@10, codes scanned, and the CPU time per query of the probe
(``Q C^T`` over the batch and the selection of the nearest lists), the scan (one numba kernel,
one thread) and the rescoring; with ``--faiss``, faiss's IVF-RaBitQ + refine in the same run
(``bench/embeddings.py``'s sweep). Prints a markdown table and writes
``OUT/residual-codes.json``.

    python bench/residual_codes.py                      # the 40k MiniLM set (under a minute)
    python bench/residual_codes.py --synthetic 1000000 --faiss  # 1M (about 11 min)
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402
from llvmlite import ir  # noqa: E402
from numba import njit  # noqa: E402
from numba.core import cgutils, types  # noqa: E402
from numba.extending import intrinsic  # noqa: E402

import hashlearn  # noqa: E402
from embeddings import K, machine_line, mixture_sample, recall_at_k  # noqa: E402
from hashlearn.embeddings import EmbeddingIndex, load_embeddings  # noqa: E402
from hashlearn.index._asymmetric import _offer as offer  # noqa: E402
from hashlearn.rerank._kernels import NEG_INNER, rescore_runner  # noqa: E402

N_BITS = 256
QUERY_LEVELS = 15  # 4-bit query projections
NPROBES = (2, 4, 8, 16, 32, 64)
SHORTLISTS = (40, 80, 120, 160, 240)
OVERFETCH = (8, 12, 16, 24, 48)


LANES = 8  # codes per vector step of the scan


def _block_counts(n_words: int):
    """An intrinsic ``f(blocks, o, planes, out)`` for the block of ``LANES`` codes at word
    ``o`` of ``blocks`` (word ``w`` of the 8 codes contiguous: ``(W, LANES)``): per code,
    ``sum_p 2^p popcount(code & planes[p])`` over the 4 bit planes ``planes`` (``4 W`` words,
    plane by plane) into ``out[:8]`` and ``popcount(code)`` into ``out[8:16]``. Each word is
    one 8-lane vector: an AND with each plane word broadcast, LLVM's vector ``ctpop``
    (``VPOPCNTQ`` on AVX-512 VPOPCNTDQ; what the CPU has elsewhere), a shift by the plane's
    weight and a vector add -- no horizontal sums (the layout of the wide Hamming path)."""
    i64, i32 = ir.IntType(64), ir.IntType(32)
    vec = ir.VectorType(i64, LANES)
    lane0 = ir.Constant(ir.VectorType(i32, LANES), [0] * LANES)

    @intrinsic
    def block_counts(typingctx, blocks, o, planes, out):
        sig = types.void(blocks, o, planes, out)

        def codegen(context, builder, signature, args):
            def data(k):
                return context.make_array(signature.args[k])(context, builder, args[k]).data

            words, plane_words, out_words = data(0), data(2), data(3)
            ctpop = cgutils.get_or_insert_function(
                builder.module, ir.FunctionType(vec, [vec]), f"llvm.ctpop.v{LANES}i64"
            )
            undef = ir.Constant(vec, ir.Undefined)
            weighted = ones = ir.Constant(vec, [0] * LANES)
            for w in range(n_words):
                at = builder.gep(words, [builder.add(args[1], ir.Constant(i64, w * LANES))])
                x = builder.load(builder.bitcast(at, vec.as_pointer()), align=8)
                ones = builder.add(ones, builder.call(ctpop, [x]))
                for p in range(4):
                    word = builder.load(
                        builder.gep(plane_words, [ir.Constant(i64, p * n_words + w)])
                    )
                    one = builder.insert_element(undef, word, ir.Constant(i32, 0))
                    count = builder.call(
                        ctpop, [builder.and_(x, builder.shuffle_vector(one, undef, lane0))]
                    )
                    if p:
                        count = builder.shl(count, ir.Constant(vec, [p] * LANES))
                    weighted = builder.add(weighted, count)
            builder.store(weighted, builder.bitcast(out_words, vec.as_pointer()), align=8)
            tail = builder.gep(out_words, [ir.Constant(i64, LANES)])
            builder.store(ones, builder.bitcast(tail, vec.as_pointer()), align=8)
            return context.get_dummy_value()

        return sig, codegen

    return block_counts


_BLOCK_COUNTS = _block_counts(N_BITS // 64)


@njit(nogil=True)
def _query_table(q_proj, planes):
    """Quantize ``q_proj`` to ``lo + step * level`` (level 0..15) into 4 bit ``planes``;
    returns ``(lo, step, total)``, ``total`` the sum of the quantized projections."""
    n_words = planes.shape[0] // 4
    lo, hi = q_proj.min(), q_proj.max()
    step = (hi - lo) / QUERY_LEVELS if hi > lo else 1.0
    planes[:] = 0
    total = 0.0
    for j in range(q_proj.shape[0]):
        level = int((q_proj[j] - lo) / step + 0.5)
        total += lo + step * level
        for p in range(4):
            if (level >> p) & 1:
                planes[p * n_words + (j >> 6)] |= np.uint64(1) << np.uint64(j & 63)
    return lo, step, total


@njit(nogil=True)
def residual_scan(blocks, gain, shift, block_row, block_offsets, lists, q_dot_c, q_proj,
                  n_keep, score, row):  # fmt: skip
    """The ``n_keep`` rows of the probed ``lists`` of highest estimated ``<q, x>`` into
    ``score`` / ``row`` (the heap of ``hashlearn.index._asymmetric._offer``, unsorted);
    returns how many were kept. Blocks of 8 codes (:func:`as_blocks`; padding has
    ``shift = -inf``, ``block_row = -1``)."""
    n_words = blocks.shape[1]
    flat = blocks.reshape(-1)
    planes = np.empty(4 * n_words, np.uint64)
    lo, step, total = _query_table(q_proj, planes)
    counts = np.zeros(2 * LANES, np.int64)
    est = np.empty(LANES)
    kept = 0
    for t in range(lists.shape[0]):
        base = q_dot_c[t]
        for b in range(block_offsets[lists[t]], block_offsets[lists[t] + 1]):
            _BLOCK_COUNTS(flat, b * n_words * LANES, planes, counts)
            best = -np.inf
            for j in range(LANES):  # <q P, b> with b = 2 bits - 1, q P quantized
                dot = 2.0 * (lo * counts[LANES + j] + step * counts[j]) - total
                est[j] = base + shift[b, j] + gain[b, j] * dot
                best = max(best, est[j])
            if kept == n_keep and best < score[0]:
                continue  # no code of the block can enter the top n_keep
            for j in range(LANES):
                if block_row[b, j] >= 0:
                    kept = offer(score, row, kept, n_keep, est[j], block_row[b, j])
    return kept


@njit(nogil=True)
def residual_scan_batch(blocks, gain, shift, block_row, block_offsets, near, q_dot_c, q_proj,
                        n_keep, rows, kept):  # fmt: skip
    """:func:`residual_scan` of every query (row ``i`` of ``near`` / ``q_dot_c`` / ``q_proj``):
    its kept rows into ``rows[i]``, their number into ``kept[i]``."""
    score = np.empty(n_keep)
    for i in range(near.shape[0]):
        kept[i] = residual_scan(
            blocks, gain, shift, block_row, block_offsets, near[i], q_dot_c[i], q_proj[i],
            n_keep, score, rows[i],
        )  # fmt: skip


@njit(nogil=True)
def nearest_lists(q_dot_c, c_sq, n_probe):
    """Each query's ``n_probe`` nearest centroids by ``|c|^2 - 2 <q, c>``, nearest first
    (ties to the smaller list), kept by insertion: ``(m, n_probe)`` int64."""
    m, n_lists = q_dot_c.shape
    near = np.empty((m, n_probe), np.int64)
    best = np.empty(n_probe)
    for i in range(m):
        kept = 0
        for lst in range(n_lists):
            d = c_sq[lst] - 2.0 * q_dot_c[i, lst]
            if kept == n_probe and d >= best[kept - 1]:
                continue
            pos = kept if kept < n_probe else n_probe - 1
            kept = min(kept + 1, n_probe)
            while pos > 0 and best[pos - 1] > d:
                best[pos], near[i, pos] = best[pos - 1], near[i, pos - 1]
                pos -= 1
            best[pos], near[i, pos] = d, lst
    return near


def as_blocks(codes, gain, shift, offsets):
    """Each list's codes padded to whole blocks of 8 and laid out ``(block, word, lane)``;
    returns ``(blocks, gain, shift, block_row, block_offsets)``, the per-code arrays as
    ``(block, lane)``, padding with ``shift = -inf`` and ``block_row = -1``."""
    sizes = np.diff(offsets)
    n_blocks = -(-sizes // LANES)
    block_offsets = np.zeros(len(sizes) + 1, np.int64)
    np.cumsum(n_blocks, out=block_offsets[1:])
    slot = np.repeat(block_offsets[:-1] * LANES, sizes) + (
        np.arange(len(codes)) - np.repeat(offsets[:-1], sizes)
    )  # each code's position in the padded order
    total = block_offsets[-1] * LANES
    padded = np.zeros((total, codes.shape[1]), np.uint64)
    padded[slot] = codes
    blocks = np.ascontiguousarray(padded.reshape(-1, LANES, codes.shape[1]).transpose(0, 2, 1))
    out = []
    for values, fill in ((gain, 0.0), (shift, -np.inf)):
        a = np.full(total, fill, np.float32)
        a[slot] = values
        out.append(a.reshape(-1, LANES))
    block_row = np.full(total, -1, np.int64)
    block_row[slot] = np.arange(len(codes))
    return blocks, out[0], out[1], block_row.reshape(-1, LANES), block_offsets


def residual_index(base, n_lists, seed=0):
    """Float k-means lists and the residual codes of ``base``, grouped by list."""
    from sklearn.cluster import MiniBatchKMeans

    rng = np.random.default_rng(seed)
    sample = base[np.sort(rng.choice(len(base), min(len(base), 64 * n_lists), replace=False))]
    km = MiniBatchKMeans(n_lists, random_state=seed, n_init=1, batch_size=4096, max_iter=50)
    C = km.fit(sample).cluster_centers_.astype(np.float32)
    cc = (C * C).sum(1)
    lists = np.empty(len(base), np.int64)
    for s in range(0, len(base), 65536):
        lists[s : s + 65536] = np.argmin(cc - 2 * base[s : s + 65536] @ C.T, axis=1)
    order = np.argsort(lists, kind="stable")
    offsets = np.zeros(n_lists + 1, np.int64)
    np.cumsum(np.bincount(lists, minlength=n_lists), out=offsets[1:])
    P = np.linalg.qr(rng.standard_normal((base.shape[1], base.shape[1])))[0][:, :N_BITS]
    P = P.astype(np.float32)
    codes = np.empty((len(base), N_BITS // 64), np.uint64)
    gain = np.empty(len(base), np.float32)
    shift = np.empty(len(base), np.float32)
    for s in range(0, len(base), 65536):
        rows = order[s : s + 65536]
        c = C[lists[rows]]
        r = base[rows] - c
        z = r @ P
        signs = np.where(z >= 0, 1.0, -1.0)
        norm = np.linalg.norm(r, axis=1)
        g = norm * norm / np.maximum(np.abs(z).sum(1), 1e-30)
        codes[s : s + 65536] = np.packbits(z >= 0, axis=1, bitorder="little").view(np.uint64)
        gain[s : s + 65536] = g
        shift[s : s + 65536] = (r * c).sum(1) - g * ((c @ P) * signs).sum(1)
    return C, P, codes, gain, shift, offsets, order


def run_residual(base, queries, truth, log, n_lists=0):
    n_lists = n_lists or max(1, round(np.sqrt(len(base))))
    t0 = time.process_time()
    C, P, codes, gain, shift, offsets, order = residual_index(base, n_lists)
    layout = as_blocks(codes, gain, shift, offsets)
    build = time.process_time() - t0
    sizes = np.diff(offsets)
    log(f"residual: {n_lists} lists (largest {sizes.max()}), built in {build:.0f} CPU s")
    m = len(queries)
    c_sq = (C * C).sum(1)
    t = time.process_time()
    QC = queries @ C.T  # the probe: every centroid's inner product, then the nearest lists
    product_s = time.process_time() - t
    q_proj = (queries @ P).astype(np.float64)
    rows_out = []
    one = (
        nearest_lists(QC[:1], c_sq, 1),
        QC[:1, :1].astype(np.float64),
        q_proj[:1],
        1,
        np.zeros((1, 1), np.int64),
    )
    residual_scan_batch(*layout, *one, np.zeros(1, np.int64))  # compile
    warm = np.full((1, K), np.inf), np.full((1, K), -1, np.int64)
    rescore_runner(queries[:1], base, np.zeros((1, 2 * K), np.int64), NEG_INNER, K, *warm)(0, 1)
    for nprobe in NPROBES:
        if nprobe > n_lists:
            continue
        t = time.process_time()
        probed = nearest_lists(QC, c_sq, nprobe)
        probe_s = product_s + time.process_time() - t
        q_dot_c = np.take_along_axis(QC, probed, 1).astype(np.float64)
        scanned = float(sizes[probed].sum(1).mean())
        for n_keep in SHORTLISTS:
            rows, kept = np.zeros((m, n_keep), np.int64), np.zeros(m, np.int64)
            t = time.process_time()
            residual_scan_batch(*layout, probed, q_dot_c, q_proj, n_keep,
                                rows, kept)  # fmt: skip
            scan_s = time.process_time() - t
            cand = np.where(np.arange(n_keep) < kept[:, None], order[rows], -1)
            out_s = np.full((m, K), np.inf)
            ids = np.full((m, K), -1, np.int64)
            rescore = rescore_runner(queries, base, cand, NEG_INNER, K, out_s, ids)
            t = time.process_time()
            rescore(0, m)
            rescore_s = time.process_time() - t
            total_us = 1e6 * (probe_s + scan_s + rescore_s) / m
            rows_out.append(
                {
                    "nprobe": nprobe,
                    "rescored": n_keep,
                    "recall": recall_at_k(ids, truth),
                    "codes_scanned": scanned,
                    "probe_cpu_us": 1e6 * probe_s / m,
                    "scan_cpu_us": 1e6 * scan_s / m,
                    "rescore_cpu_us": 1e6 * rescore_s / m,
                    "qps_cpu": 1e6 / total_us,
                }
            )
            log(str(rows_out[-1]))
    return {"n_lists": n_lists, "largest_list": int(sizes.max()), "build_cpu_s": build,
            "rows": rows_out}  # fmt: skip


def run_global(base, queries, truth, fit, log):
    index = EmbeddingIndex("itq", n_bits=N_BITS, random_state=0, coarse=566).fit(fit)
    index.add(base)
    index.search(queries[:8], K, overfetch=OVERFETCH[0], n_threads=1)  # compile
    rows = []
    for o in OVERFETCH:
        t = time.process_time()
        _, ids = index.search(queries, K, overfetch=o, n_threads=1)
        cpu = time.process_time() - t
        rows.append({"rescored": K * o, "recall": recall_at_k(ids, truth),
                     "qps_cpu": len(queries) / cpu})  # fmt: skip
        log(str(rows[-1]))
    return rows


def markdown(result) -> str:
    g, res = result["global"], result["residual"]
    lines = [
        f"Machine: {result['machine']}. Data: {result['data']}. One thread, CPU time.",
        "",
        "Global ITQ-256 codes, 566 k-majority lists (`EmbeddingIndex(coarse=566)`, whole search):",
        "",
        "| rescored | recall@10 | q/s (CPU) |",
        "|---|---|---|",
        *(f"| {r['rescored']} | {r['recall']:.3f} | {r['qps_cpu']:,.0f} |" for r in g),
        "",
        f"Residual 256-bit codes, {res['n_lists']} float k-means lists (largest "
        f"{res['largest_list']}), RaBitQ's estimator with 4-bit query projections; probe "
        "(all centroids, batched), scan and exact rescoring timed apart, in us per query:",
        "",
        "| nprobe | codes scanned | rescored | recall@10 | probe | scan | rescore | q/s (CPU) |",
        "|---|---|---|---|---|---|---|---|",
        *(
            f"| {r['nprobe']} | {r['codes_scanned']:.0f} | {r['rescored']} | {r['recall']:.3f} "
            f"| {r['probe_cpu_us']:.0f} | {r['scan_cpu_us']:.0f} | {r['rescore_cpu_us']:.0f} "
            f"| {r['qps_cpu']:,.0f} |"
            for r in res["rows"]
        ),
    ]
    if result.get("faiss"):
        lines += [
            "",
            "faiss in the same run:",
            "",
            "| index | setting | recall@10 | q/s (CPU) |",
            "|---|---|---|---|",
            *(
                f"| {r['label']} | {r['param']} | {r['recall']:.3f} | {r['qps_cpu']:,.0f} |"
                for r in result["faiss"]
            ),
        ]
    return "\n".join(lines)


def main(argv=None):
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--data", type=Path, default=None, help="data set directory")
    parser.add_argument("--synthetic", type=int, default=0, help="draw this many from the mixture")
    parser.add_argument("--n-queries", type=int, default=1000)
    parser.add_argument("--faiss", action="store_true", help="also faiss IVF-RaBitQ + refine")
    parser.add_argument("--lists", type=int, default=0, help="residual lists (0: sqrt(n))")
    parser.add_argument("--out", type=Path, default=Path(__file__).parent / "out" / "residual")
    args = parser.parse_args(argv)

    def log(msg):
        print(msg, file=sys.stderr, flush=True)

    hashlearn.set_num_threads(1)
    machine = machine_line()
    ds = load_embeddings(args.data)
    if args.synthetic:
        base, queries, truth, _ = mixture_sample(
            np.asarray(ds.base, np.float32), args.synthetic, args.n_queries, log
        )
        data = f"{args.synthetic:,} vectors drawn from the mixture fitted to {ds.path}"
    else:
        base = np.ascontiguousarray(ds.base, dtype=np.float32)
        queries = np.ascontiguousarray(ds.queries[: args.n_queries], dtype=np.float32)
        truth = ds.neighbors[: args.n_queries, :K]
        data = str(ds.path)
    rng = np.random.default_rng(0)
    fit = base[np.sort(rng.choice(len(base), min(20000, len(base)), replace=False))]
    result = {"machine": machine, "data": data}
    result["global"] = run_global(base, queries, truth, fit, log)
    result["residual"] = run_residual(base, queries, truth, log, args.lists)
    if args.faiss:
        import faiss

        from embeddings import FlatTimer, run_rabitq

        faiss.omp_set_num_threads(1)
        flat = FlatTimer(base, queries)
        flat.time()
        rabitq = run_rabitq(base, queries, truth, flat, 1, log)
        result["faiss"] = [r for r in rabitq if r["method"] == "faiss-ivf-rabitq"]
    load = os.getloadavg()
    result["load_after"] = f"{load[0]:.2f} {load[1]:.2f} {load[2]:.2f}"
    args.out.mkdir(parents=True, exist_ok=True)
    (args.out / "residual-codes.json").write_text(json.dumps(result, indent=1))
    text = markdown(result) + f"\n\nLoad average after: {result['load_after']}."
    print(text)
    return result


if __name__ == "__main__":
    main()
