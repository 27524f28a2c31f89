"""Small matplotlib helpers for the plots the demo and the experiments write.

Figures are drawn on matplotlib's object API (``Figure`` + the Agg canvas), never through
``pyplot``, so importing or calling these helpers does not change matplotlib's global state
(backend, open figures) and works without a display. Every file is written atomically: to a
temporary sibling first, then renamed into place with ``os.replace``, so a crash never leaves
a half-written file.

Readability rules every figure follows: at most one line per method in an axes (several code
lengths or families go to separate panels); each method keeps one colour and marker in every
panel (:func:`method_styles`, a fixed palette without repeats); the legend sits outside the
axes, to the right of all panels, so it never covers a curve; constrained layout leaves no
empty canvas.
"""

from __future__ import annotations

import math
import os
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
from numpy.typing import ArrayLike

from hashlearn.io import atomic_path

__all__ = [
    "PALETTE",
    "atomic_path",
    "method_styles",
    "plot_pr_curves",
    "plot_lines",
    "plot_pr_panels",
    "plot_recall_at_m",
    "plot_recall_at_m_panels",
]

Curves = Mapping[str, tuple[ArrayLike, ArrayLike]]  # method -> (x, y)
Panels = Mapping[str, Curves]

#: Distinct colours, most distinct first (Tableau 10 without its grey, which is kept for
#: reference lines, then darker and brighter hues). A method never shares a colour with
#: another method of the same figure.
PALETTE = (
    "#1f77b4",  # blue
    "#ff7f0e",  # orange
    "#2ca02c",  # green
    "#d62728",  # red
    "#9467bd",  # purple
    "#8c564b",  # brown
    "#e377c2",  # pink
    "#bcbd22",  # olive
    "#17becf",  # cyan
    "#000000",  # black
    "#1b1b7a",  # navy
    "#ff00ff",  # magenta
    "#7fd600",  # lime
    "#ffbf00",  # amber
    "#00665e",  # dark teal
    "#a6cee3",  # light blue
    "#fb9a99",  # rose
    "#cab2d6",  # lavender
    "#b15928",  # rust
    "#ffff99",  # pale yellow
)
_MARKERS = ("o", "s", "^", "v", "D", "P", "X", "*", "<", ">", "h", "p", "d", "8")
_LINESTYLES = ("-", "--", "-.", ":")
REFERENCE_STYLE: dict[str, Any] = {"color": "0.45", "linestyle": (0, (4, 3)), "linewidth": 1.2}


def method_styles(methods: Sequence[str]) -> dict[str, dict]:
    """A fixed line style per method name: ``{name: {"color", "marker", "linestyle"}}``.

    Styles are assigned in the order given (duplicates ignored), so passing the same full list
    (e.g. every registered hasher, sorted) gives every method the same colour in every figure,
    whichever subset a figure shows. The first ``len(PALETTE)`` methods get distinct palette
    colours with solid lines; beyond that the palette restarts with another line style, so no
    two methods share both colour and line style.

    Examples
    --------
    >>> styles = method_styles(["lsh", "itq", "lsh"])
    >>> sorted(styles), styles["lsh"]["color"] != styles["itq"]["color"]
    (['itq', 'lsh'], True)
    """
    if isinstance(methods, str):
        raise TypeError("methods must be a sequence of names, not a string.")
    styles = {}
    for i, name in enumerate(dict.fromkeys(methods)):
        cycle, slot = divmod(i, len(PALETTE))
        styles[name] = {
            "color": PALETTE[slot],
            "marker": _MARKERS[i % len(_MARKERS)],
            "linestyle": _LINESTYLES[cycle % len(_LINESTYLES)],
        }
    return styles


def _grid(n_panels: int) -> tuple[int, int]:
    """(rows, cols): one row up to 3 panels, else the squarest grid (fewest empty slots)."""
    cols = n_panels if n_panels <= 3 else math.ceil(math.sqrt(n_panels))
    return math.ceil(n_panels / cols), cols


def _panel_figure(
    panels: Panels,
    draw_line,
    title: str,
    xlabel: str,
    ylabel: str,
    *,
    styles: Mapping[str, dict] | None,
    reference: Panels | None = None,
    xlog: bool = False,
    xlim: tuple[float, float] | None = None,
    ylim: tuple[float, float] | None = (-0.02, 1.02),
):
    """One axes per panel, shared y, a single legend right of every panel; returns the Figure."""
    from matplotlib.backends.backend_agg import FigureCanvasAgg
    from matplotlib.figure import Figure
    from matplotlib.lines import Line2D

    if not panels:
        raise ValueError("panels must hold at least one panel of curves.")
    methods = list(dict.fromkeys(name for curves in panels.values() for name in curves))
    styles = dict(styles or {})
    missing = [name for name in methods if name not in styles]
    if missing:
        extra = method_styles([*styles, *missing])
        styles.update({name: extra[name] for name in missing})
    rows, cols = _grid(len(panels))
    height = 3.3 * rows + (0.6 if title else 0.2)
    n_entries = len(methods) + len({k for r in (reference or {}).values() for k in r})
    per_column = max(1, int((height - 0.5) / 0.24))  # legend rows that fit the height
    legend_cols = max(1, math.ceil(n_entries / per_column))
    longest = max((len(name) for name in methods), default=10)
    legend_w = legend_cols * min(4.2, 1.0 + 0.075 * longest)
    fig = Figure(figsize=(3.9 * cols + legend_w, height), dpi=110, layout="constrained")
    FigureCanvasAgg(fig)
    axes = fig.subplots(rows, cols, sharey=True, squeeze=False)
    ref_labels: dict[str, None] = {}
    for ax, (panel_title, curves) in zip(axes.flat, panels.items(), strict=False):
        for name, (x, y) in curves.items():
            draw_line(ax, name, np.asarray(x, float), np.asarray(y, float), styles[name])
        for name, (x, y) in ((reference or {}).get(panel_title, {}) or {}).items():
            ax.plot(np.asarray(x, float), np.asarray(y, float), **REFERENCE_STYLE)
            ref_labels[name] = None
        if xlog:
            ax.set_xscale("log")
            ax.grid(True, which="minor", alpha=0.12)
            _plain_log_ticks(ax, [np.asarray(x, float) for x, _ in curves.values()])
        if xlim is not None:
            ax.set_xlim(*xlim)
        if ylim is not None:
            ax.set_ylim(*ylim)
        ax.grid(True, which="major", alpha=0.35)
        if panel_title:
            ax.set_title(panel_title, fontsize="medium")
        ax.set_xlabel(xlabel, fontsize="small")
        ax.tick_params(labelsize="small")
    for ax in axes[:, 0]:
        ax.set_ylabel(ylabel)
    for ax in list(axes.flat)[len(panels) :]:
        ax.set_visible(False)  # an incomplete last row of the grid
    handles = [Line2D([], [], markersize=5, linewidth=1.6, **styles[name]) for name in methods] + [
        Line2D([], [], **REFERENCE_STYLE) for _ in ref_labels
    ]
    fig.legend(
        handles,
        methods + list(ref_labels),
        loc="outside right upper",
        ncols=legend_cols,
        fontsize="small",
        frameon=False,
        title="method",
        title_fontsize="small",
    )
    if title:
        fig.suptitle(title, fontsize="medium")
    return fig


def _write(fig, path: str | os.PathLike) -> None:
    with atomic_path(path) as tmp:
        fig.savefig(tmp, format="png")


def _draw_pr(ax, name, precision, recall, style) -> None:
    keep = recall > 0  # radii that retrieve nothing relevant are not drawn
    every = max(1, int(keep.sum()) // 12)
    ax.plot(
        recall[keep],
        precision[keep],
        markersize=3.5,
        markevery=every,
        linewidth=1.4,
        label=name,
        **style,
    )


def _draw_recall(ax, name, m_values, recall, style) -> None:
    every = max(1, len(m_values) // 8)
    ax.plot(m_values, recall, markersize=3.5, markevery=every, linewidth=1.4, label=name, **style)


def plot_pr_panels(
    panels: Panels,
    path: str | os.PathLike,
    title: str = "Precision-recall",
    *,
    styles: Mapping[str, dict] | None = None,
):
    """Precision against recall, one panel per ``panel title -> {method: (precision, recall)}``.

    ``styles`` (from :func:`method_styles`) fixes each method's colour; methods it does not
    name get the next free styles. Writes a PNG to ``path`` and returns the Figure.
    """
    fig = _panel_figure(
        panels, _draw_pr, title, "recall", "precision", styles=styles, xlim=(-0.02, 1.02)
    )
    _write(fig, path)
    return fig


def plot_recall_at_m_panels(
    panels: Panels,
    path: str | os.PathLike,
    title: str = "Recall@M",
    *,
    reference: Panels | None = None,
    styles: Mapping[str, dict] | None = None,
):
    """Recall against the number ``M`` retrieved (log scale), one panel per
    ``panel title -> {method: (M, recall)}``; ``reference[panel title]`` curves (e.g. the
    exact ranking's) are drawn as grey dashed lines. Writes a PNG and returns the Figure."""
    xlabel = "M (items retrieved, Hamming ranking)"
    return plot_lines(
        panels,
        path,
        title,
        xlabel=xlabel,
        ylabel="recall",
        xlog=True,
        reference=reference,
        styles=styles,
    )


def plot_pr_curves(
    curves: Curves,
    path: str | os.PathLike,
    title: str = "Precision-recall",
    *,
    styles: Mapping[str, dict] | None = None,
):
    """One panel of :func:`plot_pr_panels`: ``label -> (precision, recall)``.

    Points with zero recall (radii that retrieve nothing relevant) are not drawn.
    """
    return plot_pr_panels({"": curves}, path, title, styles=styles)


def plot_recall_at_m(
    curves: Curves,
    path: str | os.PathLike,
    title: str = "Recall@M",
    reference: Curves | None = None,
    *,
    styles: Mapping[str, dict] | None = None,
):
    """One panel of :func:`plot_recall_at_m_panels`: ``label -> (M, recall)``; ``reference``
    curves are drawn as grey dashed lines."""
    return plot_recall_at_m_panels(
        {"": curves},
        path,
        title,
        reference=None if reference is None else {"": reference},
        styles=styles,
    )


def _plain_log_ticks(ax, xs) -> None:
    """On a log x axis, plain numbers: ticks at the data's x values when there are few of
    them (code lengths, 8..128), no minor labels (which overlap as "3x10^1 4x10^1")."""
    from matplotlib.ticker import FixedLocator, FuncFormatter, NullFormatter

    values = np.unique(np.concatenate(xs)) if xs else np.zeros(0)
    values = values[np.isfinite(values) & (values > 0)]
    if 0 < len(values) <= 10:
        ax.xaxis.set_major_locator(FixedLocator(values.tolist()))
    ax.xaxis.set_major_formatter(FuncFormatter(lambda v, _: f"{v:g}"))
    ax.xaxis.set_minor_formatter(NullFormatter())


def plot_lines(
    panels: Panels,
    path: str | os.PathLike,
    title: str,
    *,
    xlabel: str,
    ylabel: str,
    xlog: bool = False,
    ylim: tuple[float, float] | None = (-0.02, 1.02),
    reference: Panels | None = None,
    styles: Mapping[str, dict] | None = None,
):
    """A measure (in [0, 1] unless ``ylim=None``) against any x, one panel per
    ``panel title -> {label: (x, y)}`` with one line per label (one configuration per
    curve); ``reference`` curves in grey dashes. The experiments' figures (precision against code length, error against bits,
    recall against candidate-set size). Writes a PNG and returns the Figure."""
    fig = _panel_figure(
        panels,
        _draw_recall,
        title,
        xlabel,
        ylabel,
        styles=styles,
        reference=reference,
        xlog=xlog,
        ylim=ylim,
    )
    _write(fig, path)
    return fig
