"""Every script in examples/ runs and prints its result (slow: 5-30 s each)."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLES = Path(__file__).resolve().parents[1] / "examples"
SCRIPTS = sorted(EXAMPLES.glob("*.py"))
EXPECTED = {  # a word each script's output must contain
    "learned_metric_lsh.py": "accuracy",
    "boosted_search_forest.py": "recall",
    "minimal_loss_hashing.py": "precision",
    "lambdarank_bit_vectors.py": "error",
    "survey_baselines.py": "R@",
}


def test_one_script_per_paper():
    assert {p.name for p in SCRIPTS} == set(EXPECTED)


@pytest.mark.slow
@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_runs(script, tmp_path):
    proc = subprocess.run(
        [sys.executable, str(script)], capture_output=True, text=True, timeout=300, cwd=tmp_path
    )
    assert proc.returncode == 0, proc.stderr[-2000:]
    assert EXPECTED[script.name] in proc.stdout
    assert "nan" not in proc.stdout.lower()


@pytest.mark.parametrize("script", SCRIPTS, ids=[p.stem for p in SCRIPTS])
def test_example_uses_the_public_api_only(script):
    text = script.read_text()
    assert "hashlearn._" not in text and "import _" not in text
    assert '__name__ == "__main__"' in text
