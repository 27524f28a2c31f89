"""The figures a user opens first are readable (issue 18 item 1).

Checked on the drawn figure with matplotlib's renderer: the legend lies inside the figure and
overlaps no axes (nor its tick labels and titles), every method has its own colour, and a
method keeps its colour across panels and figures.
"""

from __future__ import annotations

import json

import numpy as np
import pytest
from matplotlib.colors import to_hex

from hashlearn.plots import (
    PALETTE,
    method_styles,
    plot_pr_curves,
    plot_pr_panels,
    plot_recall_at_m,
    plot_recall_at_m_panels,
)


def _curves(methods, seed=0):
    rng = np.random.default_rng(seed)
    m = np.unique(np.geomspace(1, 2000, 30).round())
    recall = {name: np.sort(rng.random(len(m))) for name in methods}
    return m, recall


def _recall_panels(methods, bits=(16, 32, 64)):
    m, recall = _curves(methods)
    return {f"{b} bits": {name: (m, recall[name]) for name in methods} for b in bits}


def _pr_panels(methods, bits=(16, 32, 64)):
    rng = np.random.default_rng(1)
    out = {}
    for b in bits:
        out[f"{b} bits"] = {
            name: (np.sort(rng.random(b + 1))[::-1], np.sort(rng.random(b + 1))) for name in methods
        }
    return out


def _assert_legend_outside_axes(fig):
    renderer = fig.canvas.get_renderer()
    fig.draw(renderer)
    assert len(fig.legends) == 1
    legend = fig.legends[0].get_window_extent(renderer)
    figure = fig.bbox
    assert legend.x0 >= figure.x0 - 0.5 and legend.x1 <= figure.x1 + 0.5, (legend, figure)
    assert legend.y0 >= figure.y0 - 0.5 and legend.y1 <= figure.y1 + 0.5, (legend, figure)
    for ax in fig.axes:
        if not ax.get_visible():
            continue
        assert not legend.overlaps(ax.get_window_extent(renderer))
        assert not legend.overlaps(ax.get_tightbbox(renderer))  # labels and titles too
    # the suptitle is inside the figure too
    if fig._suptitle is not None:
        title = fig._suptitle.get_window_extent(renderer)
        assert figure.y0 <= title.y0 and title.y1 <= figure.y1 + 0.5


def _line_colours(ax):
    """label -> colour of the labelled method lines of one axes."""
    return {
        line.get_label(): to_hex(line.get_color())
        for line in ax.get_lines()
        if not line.get_label().startswith("_")
    }


METHODS = [
    "boosted-ssc (supervised)",
    "bre",
    "itq",
    "klsh",
    "lsh",
    "mlh (supervised)",
    "pca",
    "rank (supervised)",
    "sign",
    "sikh",
    "spectral",
]


@pytest.mark.parametrize("n_methods", [3, 14, 28])
def test_recall_panels_legend_outside_and_colours(tmp_path, n_methods):
    methods = (METHODS + [f"method number {i}" for i in range(30)])[:n_methods]
    m = np.unique(np.geomspace(1, 2000, 30).round())
    reference = {f"{b} bits": {"exact ranking": (m, np.minimum(m, 50) / 50)} for b in (16, 32, 64)}
    fig = plot_recall_at_m_panels(
        _recall_panels(methods), tmp_path / "r.png", "a title", reference=reference
    )
    assert (tmp_path / "r.png").read_bytes()[:4] == b"\x89PNG"
    _assert_legend_outside_axes(fig)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 3  # one panel per code length
    per_panel = [_line_colours(ax) for ax in visible]
    for colours in per_panel:
        assert set(colours) == set(methods)  # one line per method per panel
        assert colours == per_panel[0]  # the same colour in every panel
    styles = {(c, fig_style) for c, fig_style in zip(per_panel[0].values(), methods, strict=True)}
    assert len(styles) == n_methods
    if n_methods <= len(PALETTE):
        assert len(set(per_panel[0].values())) == n_methods  # no colour repeats
    else:  # beyond the palette, no two methods share both colour and line style
        pairs = {
            (to_hex(line.get_color()), str(line.get_linestyle()))
            for line in visible[0].get_lines()
            if not line.get_label().startswith("_")
        }
        assert len(pairs) == n_methods


def test_pr_panels_and_single_panel_helpers(tmp_path):
    styles = method_styles(sorted(METHODS))
    fig = plot_pr_panels(
        _pr_panels(METHODS, bits=(8, 16, 32, 64)), tmp_path / "p.png", styles=styles
    )
    _assert_legend_outside_axes(fig)
    visible = [ax for ax in fig.axes if ax.get_visible()]
    assert len(visible) == 4 and len(fig.axes) == 4  # a 2 x 2 grid, nothing empty
    for ax in visible:
        assert _line_colours(ax) == {name: to_hex(styles[name]["color"]) for name in METHODS}
    m, recall = _curves(METHODS[:5])
    one = plot_recall_at_m(
        {name: (m, recall[name]) for name in METHODS[:5]},
        tmp_path / "one.png",
        "single",
        reference={"exact": (m, np.minimum(m, 50) / 50)},
    )
    _assert_legend_outside_axes(one)
    two = plot_pr_curves(
        {name: (np.linspace(1, 0, 9), np.linspace(0, 1, 9)) for name in METHODS[:4]},
        tmp_path / "two.png",
    )
    _assert_legend_outside_axes(two)


def test_method_styles_fixed_by_name():
    a = method_styles(["x", "y", "z"])
    b = method_styles(["x", "y", "z", "w"])
    assert all(a[k] == b[k] for k in a)  # adding a method never recolours the others
    assert len({s["color"] for s in b.values()}) == 4
    assert len(PALETTE) == len({c.lower() for c in PALETTE})  # the palette has no repeats
    with pytest.raises(TypeError, match="methods"):
        method_styles("lsh")
    with pytest.raises(ValueError, match="panels"):
        plot_pr_panels({}, "unused.png")


def test_demo_figures_are_readable(tmp_path):
    """The demo's own figures: panels per code length, legend outside, colours consistent
    between the two figures; the results table explains its columns."""
    from hashlearn.demo import column_notes, format_table, run_demo

    rows = run_demo(
        out_dir=tmp_path,
        bits=(8, 16),
        n_queries=20,
        n_train=300,
        hashers=["lsh", "pca", "itq"],
    )
    for name in ("pr_curves.png", "recall_at_m.png"):
        assert (tmp_path / name).read_bytes()[:4] == b"\x89PNG"
    table = format_table(rows)
    assert "R@1 <= 0.02" in table and "true 50 Euclidean" in table
    assert column_notes(rows) in (tmp_path / "results.md").read_text()
    results = json.loads((tmp_path / "results.json").read_text())
    assert results["protocol"]["true_k"] == 50
