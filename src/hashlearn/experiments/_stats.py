"""The statistic behind every verdict of the reproductions: a paired t interval.

A claim compares a method with a baseline on the same splits and seeds, so the evidence is
the vector of paired differences ``d_s = method_s - baseline_s`` (signed so that a positive
value is the paper's direction). Its mean is the margin; the 95 % confidence interval is
Student's paired t interval ``mean +- t_{0.975, n-1} * sd / sqrt(n)`` (``sd`` with ``n - 1``
degrees of freedom; Student 1908, as in ``scipy.stats.ttest_1samp``). The verdict is
"holds" when the interval lies above 0, "fails" when it lies below 0 and "tie" otherwise
(fewer than two differences give no interval, hence "tie").
"""

from __future__ import annotations

import math
from collections.abc import Iterable, Mapping
from typing import Any, NamedTuple

import numpy as np

__all__ = ["PairedInterval", "paired_t_interval", "verdict", "paired_differences"]

CONFIDENCE = 0.95
VERDICTS = ("holds", "fails", "tie")


class PairedInterval(NamedTuple):
    """Mean of the paired differences, its confidence interval and their number."""

    mean: float
    low: float
    high: float
    n: int


def paired_t_interval(diffs, confidence: float = CONFIDENCE) -> PairedInterval:
    """Student's t interval of the mean of paired differences ``diffs`` (1-D, finite).

    ``low`` and ``high`` are NaN for fewer than two differences; for identical differences
    the interval is the single point ``mean``.
    """
    from scipy.stats import t

    d = np.asarray(diffs, np.float64)
    if d.ndim != 1 or d.size == 0:
        raise ValueError(f"diffs must be a non-empty 1-D sequence. Got shape {d.shape}.")
    if not np.all(np.isfinite(d)):
        raise ValueError("diffs must be finite.")
    if not 0.0 < confidence < 1.0:
        raise ValueError(f"confidence must be in (0, 1). Got {confidence!r}.")
    n, mean = d.size, float(d.mean())
    if n < 2:
        return PairedInterval(mean, math.nan, math.nan, n)
    half = float(t.ppf(0.5 + confidence / 2, n - 1)) * float(d.std(ddof=1)) / math.sqrt(n)
    return PairedInterval(mean, mean - half, mean + half, n)


def verdict(low: float, high: float) -> str:
    """``"holds"`` when ``low > 0``, ``"fails"`` when ``high < 0``, else ``"tie"`` (also for a
    missing interval)."""
    if low > 0:
        return "holds"
    if high < 0:
        return "fails"
    return "tie"


def paired_differences(
    records: Iterable[Mapping[str, Any]],
    method: str,
    baseline: str,
    value: str,
    *,
    bits: int | None = None,
    sign: float = 1.0,
) -> np.ndarray:
    """``sign * (method - baseline)`` of column ``value`` per seed, over the seeds both ran
    (at code length ``bits`` when given). A baseline that ran for one seed only (a
    deterministic method such as spectral hashing) is compared with every seed of
    ``method``. ``sign=-1`` for a measure where lower is better (an error)."""
    records = [r for r in records if bits is None or r["bits"] == bits]
    of = {
        name: {r["seed"]: float(r[value]) for r in records if r["method"] == name}
        for name in (method, baseline)
    }
    if not of[method] or not of[baseline]:
        raise ValueError(f"no records of {method!r} and {baseline!r} for {value!r}.")
    base = of[baseline]
    if len(base) == 1:
        base = dict.fromkeys(of[method], next(iter(base.values())))
    seeds = sorted(of[method].keys() & base.keys())
    return sign * np.array([of[method][s] - base[s] for s in seeds])
