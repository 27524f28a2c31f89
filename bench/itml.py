"""ITML fit time: hashlearn's numba kernel vs metric-learn's ITML on identical constraints.

metric-learn 0.7 cannot run beside the scikit-learn >= 1.6 that hashlearn requires (it
passes ``force_all_finite``, which scikit-learn 1.6 removed), so it is not in any hashlearn
extra: this script builds its own isolated virtualenv for it (once, with pip; needs network
access the first time) and runs metric-learn there, in a subprocess, on constraints saved to
.npy files. One command:

    python bench/itml.py                      # writes the "bench-itml" section of docs/results.md
    python bench/itml.py --no-write --repeats 1
    python bench/itml.py --setup-only         # only build the metric-learn venv

The venv lives in ``--venv`` (default ``~/.cache/hashlearn/metric-learn-0.7``) and holds
``metric-learn==0.7.0``, ``scikit-learn<1.6`` and ``numpy<2``; ``--python`` points at another
interpreter that already has metric-learn instead.

Both run the same algorithm (Davis et al. 2007) from A0 = I with gamma = 1 and the same
bounds (u, l); the pairs are ordered similar-first, which is metric-learn's cyclic order, so
the iterates are the same and the learned matrices are compared entry-wise. The stopping
rules differ slightly (metric-learn divides the L1 change of the duals by the sum of L2
norms, hashlearn by the L1 norms), so the number of passes is reported for both.
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import numpy as np  # noqa: E402

from _common import load_average, machine, markdown_table, write_section  # noqa: E402
from hashlearn.datasets import fashion_mnist_available, load_digits, load_fashion_mnist  # noqa: E402
from hashlearn.metric.itml import ITML  # noqa: E402
from hashlearn.supervision import pairs_from_labels  # noqa: E402

RUNNER = r"""
import json, sys, time
import numpy as np
from metric_learn import ITML
d = sys.argv[1]
X = np.load(d + "/X.npy"); P = np.load(d + "/pairs.npy"); s = np.load(d + "/similar.npy")
bounds = np.load(d + "/bounds.npy"); repeats = int(sys.argv[2])
times = []
for _ in range(repeats):
    m = ITML(gamma=1.0, max_iter=1000, tol=1e-3, prior="identity", preprocessor=X)
    t = time.perf_counter()
    m.fit(P, np.where(s, 1, -1), bounds=bounds)
    times.append(time.perf_counter() - t)
np.save(d + "/A_ml.npy", m.get_mahalanobis_matrix())
print(json.dumps({"times": times, "n_iter": int(getattr(m, "n_iter_", -1))}))
"""


ML_REQUIREMENTS = ("metric-learn==0.7.0", "scikit-learn>=1.3,<1.6", "numpy<2", "scipy")
DEFAULT_VENV = Path.home() / ".cache" / "hashlearn" / "metric-learn-0.7"


def ensure_metric_learn_venv(venv: Path) -> Path:
    """The python of an isolated venv with metric-learn 0.7, created with pip if missing."""
    python = venv / "bin" / "python"
    check = [str(python), "-c", "import metric_learn, sklearn; print(sklearn.__version__)"]
    if python.exists() and subprocess.run(check, capture_output=True).returncode == 0:
        return python
    print(f"building the metric-learn venv in {venv} (one time) ...", file=sys.stderr)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run(
        [str(python), "-m", "pip", "install", "-q", "--upgrade", "pip", *ML_REQUIREMENTS],
        check=True,
    )
    subprocess.run(check, check=True)
    return python


def datasets(data_dir=None):
    X, y = load_digits()
    yield "digits (64-d, 10 classes)", X.astype(np.float64), y
    if fashion_mnist_available(data_dir):
        from sklearn.decomposition import PCA

        X, y = load_fashion_mnist(data_dir, subset="train")
        X, y = X[:5000].astype(np.float64), y[:5000]
        yield "fashion-mnist PCA-32 (10 classes)", PCA(32, random_state=0).fit_transform(X), y
    rng = np.random.RandomState(0)
    y = rng.randint(0, 26, 5000)
    X = rng.randn(26, 16)[y] * 2 + rng.randn(5000, 16)
    yield "synthetic 16-d, 26 classes", X, y


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument(
        "--python", default=None, help="interpreter with metric-learn (default: build --venv)"
    )
    parser.add_argument("--venv", type=Path, default=DEFAULT_VENV)
    parser.add_argument("--setup-only", action="store_true")
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--no-write", action="store_true")
    parser.add_argument("--data-dir", default=None, help="Fashion-MNIST IDX directory")
    args = parser.parse_args()
    load_before = load_average()
    if args.python is None:
        args.python = str(ensure_metric_learn_venv(args.venv))
    if args.setup_only:
        print(args.python)
        return
    rows = []
    for name, X, y in datasets(args.data_dir):
        pairs, similar = pairs_from_labels(y, 20 * len(np.unique(y)) ** 2, random_state=0)
        order = np.argsort(~similar, kind="stable")  # similar first: metric-learn's order
        pairs, similar = pairs[order], similar[order]
        ours = []
        for _ in range(args.repeats + 1):  # first call compiles / warms up
            t = time.perf_counter()
            itml = ITML(slack=1.0).fit(X, pairs=pairs, similar=similar)
            ours.append(time.perf_counter() - t)
        ours = ours[1:]
        with tempfile.TemporaryDirectory() as d:
            for key, arr in (
                ("X", X),
                ("pairs", pairs),
                ("similar", similar),
                ("bounds", itml.bounds_),
            ):
                np.save(f"{d}/{key}.npy", arr)
            try:
                out = subprocess.run(
                    [args.python, "-c", RUNNER, d, str(args.repeats)],
                    capture_output=True,
                    text=True,
                    timeout=1800,
                    check=True,
                )
                ml = json.loads(out.stdout.strip().splitlines()[-1])
                A_ml = np.load(f"{d}/A_ml.npy")
                diff = float(np.abs(A_ml - itml.A_).max() / np.abs(itml.A_).max())
            except (OSError, subprocess.SubprocessError, ValueError) as err:
                print(f"metric-learn failed on {name}: {err}", file=sys.stderr)
                ml, diff = {"times": [float("nan")], "n_iter": -1}, float("nan")
        t_ours, t_ml = float(np.median(ours)), float(np.median(ml["times"]))
        rows.append(
            [
                name,
                len(pairs),
                t_ours,
                itml.n_iter_,
                itml.converged_,
                t_ml,
                ml["n_iter"],
                t_ml / t_ours,
                diff,
                itml.violated_fraction_,
            ]
        )
        print(rows[-1], flush=True)
    md = "\n".join(
        [
            "## bench-itml: ITML fit, hashlearn vs metric-learn 0.7 (identical constraints)",
            "",
            f"Machine: {machine()}; medians of {args.repeats} runs. Load average before: "
            f"{load_before}; after: {load_average()}. gamma=1, A0=I, tol=1e-3, "
            "max_iter=1000, 20c^2 constraints.",
            "",
            markdown_table(
                [
                    "data",
                    "constraints",
                    "hashlearn s",
                    "passes",
                    "converged",
                    "metric-learn s",
                    "ml passes",
                    "speed-up",
                    "max rel A diff",
                    "violated",
                ],
                rows,
            ),
        ]
    )
    print(md)
    if not args.no_write:
        write_section("bench-itml", md)


if __name__ == "__main__":
    main()
