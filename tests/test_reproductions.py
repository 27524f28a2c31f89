"""Reproductions run end to end on a small slice of digits: every table and plot is produced.

Each runs the paper module's own ``run`` with its quick settings on 500 digits, so the whole
pipeline (specs -> records -> tables -> plots -> JSON) is exercised without the full data.
"""

from __future__ import annotations

import json

import pytest

from hashlearn import load_digits


def _small_digits(monkeypatch, module, n=500):
    def load_real(name, data_dir=None):
        X, y = load_digits()
        return X[:n], y[:n]

    monkeypatch.setattr(module, "load_real", load_real)
    monkeypatch.setattr(module, "available_real", lambda data_dir=None: ["digits"])


@pytest.mark.slow
def test_survey_produces_every_table_and_plot(tmp_path, monkeypatch):
    from hashlearn.experiments import survey

    _small_digits(monkeypatch, survey)
    report = survey.run(tmp_path, quick=True, seed=0)
    assert report.count("retrieved at M = 500") == 2  # one table per ground truth
    assert "Fig. 16" in report
    assert (tmp_path / "survey_fig11_digits_32bits.png").stat().st_size > 10_000
    results = json.loads((tmp_path / "survey.json").read_text())["digits"]
    names = {s.name for s in survey.specs("label", quick=True)}
    for truth in survey.TRUTHS:
        assert set(results[truth]["at500"]) == names
        for by_bits in results[truth]["at500"].values():
            assert all(0.0 <= v <= 1.0 for v in by_bits.values())
    coverage = results["fig16"]["coverage"]
    # coverage grows with N and shrinks with k
    assert all(row == sorted(row) for row in coverage)
    assert coverage[0][0] >= coverage[2][0]
