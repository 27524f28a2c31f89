"""Tests of the ``hashlearn`` command line and the demo behind it (digits, small settings)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from click.testing import CliRunner

from hashlearn.cli import main
from hashlearn.demo import EXACT_ROW, OUTPUT_FILES, SLOW_HASHERS, run_demo
from hashlearn.hashers import available_hashers

TIMING_KEYS = {"fit_s", "encode_s", "qps"}


@pytest.fixture(scope="module")
def quick_demo(tmp_path_factory):
    """``hashlearn demo --quick`` on digits, run once for the module."""
    out = tmp_path_factory.mktemp("demo") / "out"
    result = CliRunner().invoke(main, ["demo", "--quick", "--out", str(out)])
    return result, out


def _lsh_rows(out) -> dict[int, dict]:
    rows = json.loads((out / "results.json").read_text())["rows"]
    return {row["n_bits"]: row for row in rows if row["hasher"] == "lsh"}


@pytest.mark.slow
def test_demo_runs_and_writes_every_file(quick_demo):
    result, out = quick_demo
    assert result.exit_code == 0, result.output
    assert "| hasher | bits |" in result.stdout
    assert "| lsh | 16 |" in result.stdout and "| lsh | 32 |" in result.stdout
    assert f"| {EXACT_ROW} |" in result.stdout
    for name in OUTPUT_FILES:
        path = out / name
        assert path.stat().st_size > 0, name
        assert str(path) in result.stdout
    for name in ("pr_curves.png", "recall_at_m.png"):
        assert (out / name).read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "| lsh | 16 |" in (out / "results.md").read_text()


@pytest.mark.slow
def test_demo_json_has_protocol_and_every_hasher(quick_demo):
    _, out = quick_demo
    results = json.loads((out / "results.json").read_text())
    assert results["dataset"]["name"] == "digits"
    assert results["dataset"]["n_queries"] == 100
    assert results["dataset"]["n_queries"] + results["dataset"]["n_database"] == 1797
    assert results["protocol"]["bits"] == [16, 32]
    runs = {(row["hasher"], row["n_bits"]) for row in results["rows"]}
    assert runs == {
        (name, b) for name in available_hashers() if name not in SLOW_HASHERS for b in (16, 32)
    } | {(EXACT_ROW, None)}
    for row in results["rows"]:
        if row["hasher"] != EXACT_ROW:
            assert row["supervised"] == available_hashers()[row["hasher"]].supervised


@pytest.mark.slow
def test_demo_recall_is_a_real_measure(quick_demo):
    """Recall@M in [0, 1], growing with M and with the code length (LSH on digits)."""
    _, out = quick_demo
    rows = _lsh_rows(out)
    m_values = json.loads((out / "results.json").read_text())["protocol"]["m_values"]
    assert m_values == [1, 10, 50, 100, 500, 1000]
    for row in rows.values():
        recall = [row[f"recall@{m}"] for m in m_values]
        assert all(0.0 <= r <= 1.0 for r in recall)
        assert all(a <= b for a, b in zip(recall, recall[1:], strict=False))
        assert recall[-1] > recall[0] + 0.5  # from a few percent to nearly all
        assert 0.0 <= row["map"] <= 1.0 and 0.0 <= row["knn3_error"] <= 1.0
    # 32 random hyperplanes estimate the angle better than 16: about 0.50 vs 0.33 here.
    assert rows[32]["recall@50"] > rows[16]["recall@50"] + 0.08
    assert rows[32]["pr_auc"] > rows[16]["pr_auc"]


@pytest.mark.slow
def test_run_demo_is_deterministic(tmp_path):
    kwargs = {"bits": (8,), "n_queries": 40, "n_train": 300, "random_state": 3}
    first = run_demo(out_dir=tmp_path / "a", **kwargs)
    second = run_demo(out_dir=tmp_path / "b", **kwargs)
    strip = [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in first]
    assert strip == [{k: v for k, v in row.items() if k not in TIMING_KEYS} for row in second]
    assert [row["hasher"] for row in first][-1] == EXACT_ROW


def test_info_runs():
    result = CliRunner().invoke(main, ["info"])
    assert result.exit_code == 0, result.output
    for word in (
        "hashlearn",
        "numpy",
        "numba",
        "scikit-learn",
        "cores available",
        "lsh",
        "flat",
        "fashion-mnist",
        "faiss",
        "dask",
    ):
        assert word in result.stdout


def test_python_dash_m_help():
    proc = subprocess.run(
        [sys.executable, "-m", "hashlearn", "--help"],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
    assert "demo" in proc.stdout and "info" in proc.stdout


@pytest.mark.parametrize("bits", ["0", "abc", "16,x", "", "16,-8", "1.5"])
def test_bad_bits_is_a_usage_error(bits, tmp_path):
    result = CliRunner().invoke(main, ["demo", "--bits", bits, "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "positive integers" in result.output
    assert not list(tmp_path.iterdir())


def test_out_of_range_n_queries_is_a_usage_error(tmp_path):
    result = CliRunner().invoke(main, ["demo", "--n-queries", "5000", "--out", str(tmp_path)])
    assert result.exit_code == 2
    assert "n_queries" in result.output and "Traceback" not in result.output


def test_missing_fashion_mnist_names_the_package(tmp_path):
    result = CliRunner().invoke(
        main,
        [
            "demo",
            "--dataset",
            "fashion-mnist",
            "--data-dir",
            str(tmp_path),
            "--out",
            str(tmp_path / "out"),
        ],
    )
    assert result.exit_code == 2
    assert "apt-get install -y dataset-fashion-mnist" in result.output
    assert "Traceback" not in result.output
    assert len(result.output.strip().splitlines()) == 1
    assert not (tmp_path / "out").exists()


def test_demo_hashers_option_restricts_and_validates(tmp_path):
    rows = run_demo(out_dir=tmp_path / "a", bits=(8,), n_queries=20, n_train=200, hashers=["lsh"])
    assert [row["hasher"] for row in rows] == ["lsh", EXACT_ROW]
    result = CliRunner().invoke(main, ["demo", "--hashers", "lsh,nope", "--out", str(tmp_path)])
    assert result.exit_code == 2 and "hashers" in result.output


def test_reproduce_lists_the_experiments():
    result = CliRunner().invoke(main, ["reproduce", "--help"])
    assert result.exit_code == 0
    for name in ("learned-metric", "mlh", "search-forest", "rank-codes", "survey"):
        assert name in result.output.replace("\n", "").replace(" ", "")
    result = CliRunner().invoke(main, ["reproduce", "nope"])
    assert result.exit_code == 2
