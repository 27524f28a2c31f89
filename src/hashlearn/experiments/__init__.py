"""Reproductions of the papers' experiments: ``hashlearn reproduce NAME``.

One module per paper, each holding only its data, protocol settings, claims and plots; the
fit -> encode/search -> measure loop is :mod:`hashlearn.experiments.pipeline`. Each defines
(through :func:`hashlearn.experiments.pipeline.reproduction`)::

    run(out_dir, *, quick=False, seed=0, data_dir=None, progress=None, X=None, y=None) -> str

which writes its tables (``.md`` / ``.json``), ``claims.json`` and PNG plots into
``out_dir`` and returns a markdown report. ``quick=True`` is a seconds-long setting for the
test suite; the default is the full protocol. ``X`` / ``y`` run the protocol on your own data.
Datasets absent from the machine (Fashion-MNIST) are skipped with a note in the report,
never downloaded; ``data_dir`` points at Fashion-MNIST's files elsewhere.
"""

from __future__ import annotations

import importlib
from types import ModuleType

__all__ = ["EXPERIMENTS", "get_experiment"]

#: name on the command line -> module implementing ``run``
EXPERIMENTS: dict[str, str] = {
    "learned-metric": "hashlearn.experiments.learned_metric",
    "mlh": "hashlearn.experiments.mlh",
    "search-forest": "hashlearn.experiments.search_forest",
    "rank-codes": "hashlearn.experiments.rank_codes",
    "survey": "hashlearn.experiments.survey",
    "ann-bench": "hashlearn.experiments.ann_bench",
    "ablations": "hashlearn.experiments.ablations",
}


def get_experiment(name: str) -> ModuleType:
    """The module of experiment ``name`` (imported on demand)."""
    try:
        module = EXPERIMENTS[name]
    except KeyError:
        raise ValueError(
            f"Unknown experiment {name!r}; available: {sorted(EXPERIMENTS)}."
        ) from None
    return importlib.import_module(module)
