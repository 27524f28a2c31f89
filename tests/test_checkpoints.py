"""Checkpoints of a reproduction: a run that stops resumes where it stopped, with the same
records and models as a run that never stopped; nothing is reused without --resume."""

from __future__ import annotations

import json

import numpy as np
import pytest
from click.testing import CliRunner
from threadpoolctl import threadpool_limits

import hashlearn.experiments.pipeline as pipeline
from hashlearn import load_digits
from hashlearn.cli import main
from hashlearn.experiments.checkpoints import Checkpoints, current
from hashlearn.experiments.pipeline import (
    MethodSpec,
    Split,
    precision_at_radius,
    recall_at_m_curve,
    reproduction,
    run_specs,
)
from hashlearn.hashers import RandomHyperplaneLSH


@pytest.fixture(scope="module")
def split():
    X, y = load_digits()
    return (
        Split.holdout(X[:400] / 16.0, y[:400], n_queries=50, random_state=0)
        .with_label_relevance()
        .with_euclidean_truth(10)
    )


SPECS = [MethodSpec("LSH", "lsh"), MethodSpec("PCAH", "pca", deterministic=True)]
KW = dict(
    bits=[8, 16],
    seeds=[0, 1],
    measures=[precision_at_radius(2, "label"), recall_at_m_curve([5, 10], "euclidean")],
)


def _values(records):
    return [{k: v for k, v in r.items() if not k.endswith("cpu_s")} for r in records]


def _same(a, b):
    assert len(a) == len(b)
    for ra, rb in zip(a, b, strict=True):
        assert ra.keys() == rb.keys()
        for k in ra:
            if isinstance(ra[k], np.ndarray):
                np.testing.assert_array_equal(ra[k], rb[k])
                assert ra[k].dtype == rb[k].dtype
            else:
                assert ra[k] == rb[k] and type(ra[k]) is type(rb[k]), k


_RUN_TASK = pipeline._run_task


class _Stop(Exception):
    pass


def _stopping_after(monkeypatch, n_tasks):
    """Make run_specs stop (as on Ctrl-C) when it starts task ``n_tasks + 1``; returns the
    list of tasks actually run."""
    run_task, ran = _RUN_TASK, []

    def run(task, *args, **kw):
        if n_tasks is not None and len(ran) >= n_tasks:
            raise _Stop
        ran.append(task)
        return run_task(task, *args, **kw)

    monkeypatch.setattr(pipeline, "_run_task", run)
    return ran


def test_records_and_models_round_trip(tmp_path, split):
    ck = Checkpoints(tmp_path / "ck", resume=False)
    model = RandomHyperplaneLSH(8, random_state=0).fit(split.X_db)
    records = [
        {
            "method": "LSH",
            "bits": 8,
            "seed": 0,
            "a": np.nan,
            "b": 1.5,
            "n": 3,
            "ok": True,
            "none": None,
        },
        {
            "curve": np.arange(4, dtype=np.float32),
            "ids": np.array([[1, 2]], np.int64),
            "x": np.float64(0.1),
        },
    ]
    ck.save("k", records, [model, model])
    found = ck.load("k", with_models=True)
    assert found is not None
    got, models = found
    assert np.isnan(got[0].pop("a")) and np.isnan(records[0]["a"])
    _same(got, [{k: v for k, v in records[0].items() if k != "a"}, records[1]])
    np.testing.assert_array_equal(models[1].encode(split.X_q), model.encode(split.X_q))
    assert ck.load("missing", with_models=False) is None
    # records holding something JSON cannot keep exactly are not checkpointed
    ck.save("odd", [{"method": "LSH", "obj": object()}], [None])
    assert ck.load("odd", with_models=False) is None
    # a model that cannot be saved: kept for runs that do not want models, not for others
    ck.save("nomodel", [{"method": "LSH"}], [object()])
    assert ck.load("nomodel", with_models=False) is not None
    assert ck.load("nomodel", with_models=True) is None
    # a damaged manifest: the task runs again
    (tmp_path / "ck" / "k.json").write_text("{not json")
    assert ck.load("k", with_models=True) is None


def test_a_stopped_run_resumes_with_the_same_records(tmp_path, split, monkeypatch):
    with threadpool_limits(1):
        whole_models: dict = {}
        whole = run_specs(SPECS, split, models=whole_models, **KW)
        ran = _stopping_after(monkeypatch, 2)
        with Checkpoints(tmp_path / "ck", resume=False).active():
            with pytest.raises(_Stop):
                run_specs(SPECS, split, models={}, **KW)
        assert len(ran) == 2
        ran = _stopping_after(monkeypatch, None)
        ck = Checkpoints(tmp_path / "ck", resume=True)
        models: dict = {}
        with ck.active():
            resumed = run_specs(SPECS, split, models=models, **KW)
    assert ck.restored == 2 and len(ran) == 2  # 4 tasks: 2 restored, 2 run
    _same(_values(resumed), _values(whole))
    assert models.keys() == whole_models.keys()
    for key, model in whole_models.items():
        np.testing.assert_array_equal(models[key].encode(split.X_q), model.encode(split.X_q))
    # a restored task keeps its records exactly, CPU columns included
    with ck.active():
        again = run_specs(SPECS, split, **KW)
    _same(again, resumed)
    assert current() is None


def test_nothing_is_reused_without_resume_or_for_another_task(tmp_path, split, monkeypatch):
    with Checkpoints(tmp_path / "ck", resume=False).active():
        run_specs(SPECS, split, **KW)
    ran = _stopping_after(monkeypatch, None)
    with Checkpoints(tmp_path / "ck", resume=False).active():  # cleared
        run_specs(SPECS, split, **KW)
    assert len(ran) == 4
    ran.clear()
    with Checkpoints(tmp_path / "ck", resume=True).active():
        run_specs(SPECS, split, **dict(KW, measures=[precision_at_radius(3, "label")]))
        run_specs([MethodSpec("LSH", "lsh", {"center": False})], split, **KW)
        other = Split(split.X_db[:-1], split.X_q, split.y_db[:-1], split.y_q)
        other = other.with_label_relevance().with_euclidean_truth(10)
        run_specs(SPECS, other, **KW)
    assert len(ran) == 12  # another measure setting, spec or split: nothing reused


def test_the_reproduction_removes_its_checkpoints_when_whole(tmp_path, split):
    seen = {}

    @reproduction(lambda quick: {})
    def body(out_dir, cfg, opts):
        """A one-loop reproduction."""
        seen["active"] = current() is not None
        run_specs(SPECS, split, **KW)
        seen["files"] = sorted(p.suffix for p in (out_dir / "checkpoints").iterdir())
        return "report"

    assert body(tmp_path / "out") == "report"
    assert seen["active"] and ".json" in seen["files"] and ".npz" in seen["files"]
    assert not (tmp_path / "out" / "checkpoints").exists()
    link = tmp_path / "elsewhere"
    link.mkdir()
    (tmp_path / "out2").mkdir()
    (tmp_path / "out2" / "checkpoints").symlink_to(link)
    with pytest.raises(ValueError, match="symbolic link"):
        body(tmp_path / "out2", resume=True)


def test_cli_resume_finishes_a_stopped_reproduction(tmp_path, monkeypatch):
    out = tmp_path / "out"
    ran = _stopping_after(monkeypatch, 1)
    result = CliRunner().invoke(main, ["reproduce", "mlh", "--quick", "--out", str(out)])
    assert result.exit_code != 0 and len(ran) == 1
    files = list((out / "checkpoints").glob("*.json"))
    assert len(files) == 1 and json.loads(files[0].read_text())["records"]
    ran = _stopping_after(monkeypatch, None)
    result = CliRunner().invoke(
        main, ["reproduce", "mlh", "--quick", "--out", str(out), "--resume"]
    )
    assert result.exit_code == 0, result.output
    assert not (out / "checkpoints").exists()
    assert "hashlearn reproduce mlh --seed 0 --quick --resume`" in (out / "results.md").read_text()


def test_worker_processes_checkpoint_every_task(tmp_path, split, monkeypatch):
    """With --jobs the parent keeps each task as it finishes; a resumed run restores all."""
    with Checkpoints(tmp_path / "ck", resume=False).active():
        forked = run_specs(SPECS, split, n_jobs=2, **KW)
    ran = _stopping_after(monkeypatch, None)
    ck = Checkpoints(tmp_path / "ck", resume=True)
    with ck.active():
        again = run_specs(SPECS, split, **KW)
    assert ck.restored == 4 and not ran
    _same(again, forked)
