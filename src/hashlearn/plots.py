"""Small matplotlib helpers for the plots the demo and the experiments write.

Figures are drawn on matplotlib's object API (``Figure`` + the Agg canvas), never through
``pyplot``, so importing or calling these helpers does not change matplotlib's global state
(backend, open figures) and works without a display. Every file is written atomically: to a
temporary sibling first, then renamed into place with ``os.replace``, so a crash never leaves
a half-written file.
"""

from __future__ import annotations

import contextlib
import os
import uuid
from collections.abc import Iterator, Mapping, Sequence
from pathlib import Path

import numpy as np

__all__ = ["atomic_path", "plot_pr_curves", "plot_recall_at_m"]

Curves = Mapping[str, tuple[Sequence[float], Sequence[float]]]


@contextlib.contextmanager
def atomic_path(path: str | os.PathLike) -> Iterator[Path]:
    """Yield a temporary path beside ``path``; on success rename it to ``path``.

    The caller writes the whole file to the yielded path. If the block raises, the temporary
    file is removed and ``path`` is left as it was.
    """
    path = Path(path)
    # A fresh name rather than mkstemp, so the file gets the usual umask permissions.
    tmp = path.with_name(f".{path.name}.tmp-{os.getpid()}-{uuid.uuid4().hex[:12]}{path.suffix}")
    try:
        yield tmp
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _save_figure(
    draw, path: str | os.PathLike, title: str, xlabel: str, ylabel: str, *, xlog: bool = False
) -> None:
    """Make one axes, let ``draw(ax)`` plot on it, label it and write a PNG atomically."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure

    fig = Figure(figsize=(7.5, 5.5), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    ax = fig.add_subplot()
    draw(ax)
    if xlog:
        ax.set_xscale("log")
    ax.set_ylim(-0.02, 1.02)
    ax.set_xlabel(xlabel)
    ax.set_ylabel(ylabel)
    ax.set_title(title)
    ax.grid(True, which="major", alpha=0.4)
    if xlog:
        ax.grid(True, which="minor", alpha=0.15)
    ax.legend(fontsize="small", loc="best")
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def _styles(n: int) -> Iterator[dict]:
    """Distinct (colour, line style) pairs for ``n`` lines."""
    colors = [f"C{i}" for i in range(10)]
    dashes = ["-", "--", ":", "-."]
    for i in range(n):
        yield {"color": colors[i % 10], "linestyle": dashes[(i // 10) % len(dashes)]}


def plot_pr_curves(
    curves: Curves, path: str | os.PathLike, title: str = "Precision-recall"
) -> None:
    """Plot precision against recall, one line per ``label -> (precision, recall)``.

    Points with zero recall (radii that retrieve nothing relevant) are not drawn.
    """

    def draw(ax) -> None:
        for (label, (precision, recall)), style in zip(
            curves.items(), _styles(len(curves)), strict=True
        ):
            p, r = np.asarray(precision, float), np.asarray(recall, float)
            keep = r > 0
            ax.plot(r[keep], p[keep], marker=".", markersize=4, label=label, **style)
        ax.set_xlim(-0.02, 1.02)

    _save_figure(draw, path, title, "recall", "precision")


def plot_recall_at_m(
    curves: Curves,
    path: str | os.PathLike,
    title: str = "Recall@M",
    reference: Curves | None = None,
) -> None:
    """Plot recall against the number ``M`` retrieved (log scale), per ``label -> (M, recall)``.

    ``reference`` curves (e.g. the exact ranking's) are drawn as thin grey dashed lines.
    """

    def draw(ax) -> None:
        for (label, (m_values, recall)), style in zip(
            curves.items(), _styles(len(curves)), strict=True
        ):
            ax.plot(np.asarray(m_values), np.asarray(recall, float), label=label, **style)
        for label, (m_values, recall) in (reference or {}).items():
            ax.plot(
                np.asarray(m_values),
                np.asarray(recall, float),
                label=label,
                color="0.45",
                linestyle="--",
                linewidth=1,
            )

    _save_figure(draw, path, title, "M (items retrieved, Hamming ranking)", "recall", xlog=True)
