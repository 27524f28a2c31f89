"""Reproductions of the papers' experiments: ``hashlearn reproduce NAME``.

One module per paper. Each defines::

    run(out_dir: Path, *, quick: bool = False, seed: int = 0,
        data_dir: Path | None = None, progress=None) -> str

which writes its tables (``.md`` / ``.json``) and PNG plots into ``out_dir`` and returns a
markdown report. ``quick=True`` is a small setting for tests and smoke runs; the default is
the full protocol. Datasets absent from the machine (Fashion-MNIST) are skipped with a note
in the report, never downloaded.
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
