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


def test_readme_deploy_example_runs(tmp_path, monkeypatch):
    """The 'Deploying a searcher' block: thread setting, Searcher save and memory-mapped load."""
    import hashlearn

    monkeypatch.chdir(tmp_path)
    text = README.read_text()
    blocks = re.findall(r"```python\n(.*?)```", text, re.S)
    block = next(b for b in blocks if "Searcher.load" in b)
    try:
        namespace: dict = {}
        exec(compile(block, str(README), "exec"), namespace)
        assert namespace["I"].shape == (5, 3)
        assert namespace["I"][:, 0].tolist() == [0, 1, 2, 3, 4]  # each row finds itself
        assert (tmp_path / "searcher-dir" / "meta.json").is_file()
        assert hashlearn.get_num_threads() == 2
    finally:
        hashlearn.set_num_threads(None)


def test_readme_documents_threads_and_the_plugin_copy_step():
    text = README.read_text()
    assert "set_num_threads" in text and "HASHLEARN_NUM_THREADS" in text
    copy = re.search(r"```sh\n(cp -r contrib/ann_benchmarks.*?)```", text, re.S).group(1)
    assert ".venv" not in copy and "pip wheel --no-deps" in copy
    assert 'cp -r contrib/ann_benchmarks "$ANN/ann_benchmarks/algorithms/hashlearn"' in copy
