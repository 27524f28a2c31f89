"""The README's quick-start example runs as written."""

import re
from pathlib import Path

README = Path(__file__).resolve().parent.parent / "README.md"


def test_readme_quick_start_runs(capsys):
    text = README.read_text()
    assert "make demo" in text and "make test" in text
    block = re.search(r"```python\n(.*?)```", text, re.S).group(1)
    code_lines = [line for line in block.splitlines() if line.strip()]
    assert len(code_lines) == 10
    exec(compile(block, str(README), "exec"), {})
    recalls = [float(v) for v in re.findall(r"[0-9.]+", capsys.readouterr().out)]
    assert len(recalls) == 2 and 0.0 < recalls[0] < recalls[1] <= 1.0
