"""Shared benchmark plumbing: fair timing, machine description, writing docs/results.md.

Timing is interleaved: each repetition times every contender once, in turn, so slow drifts
of a shared machine hit all of them alike; ratios are computed per repetition and their
median is reported.
"""

from __future__ import annotations

import datetime
import os
import platform
import re
import time
from collections.abc import Callable, Sequence
from pathlib import Path

# GNU OpenMP threads (faiss) spin after a parallel region and would steal the cores from the
# contender timed next; make them sleep instead. Must be set before faiss is imported.
os.environ.setdefault("OMP_WAIT_POLICY", "PASSIVE")

import numpy as np  # noqa: E402

from hashlearn._utils.sysinfo import cpu_description  # noqa: E402
from hashlearn.experiments._common import markdown_table  # noqa: E402, F401
from hashlearn.experiments._common import write_section as _write_section  # noqa: E402

RESULTS = Path(__file__).resolve().parent.parent / "docs" / "results.md"


def interleaved_wall_and_cpu(
    contenders: Sequence[Callable[[], object]], repeats: int
) -> tuple[np.ndarray, np.ndarray]:
    """Wall and CPU (``process_time``: all threads of this process) seconds per call, each
    of shape ``(repeats, len(contenders))``, after one warm-up call each."""
    for fn in contenders:
        fn()
    wall = np.empty((repeats, len(contenders)))
    cpu = np.empty((repeats, len(contenders)))
    for r in range(repeats):
        for c, fn in enumerate(contenders):
            start, start_cpu = time.perf_counter(), time.process_time()
            fn()
            wall[r, c] = time.perf_counter() - start
            cpu[r, c] = time.process_time() - start_cpu
    return wall, cpu


def block_interleaved_wall_and_cpu(
    contenders: Sequence[Callable[[int, int], object]], n_items: int, block: int, repeats: int
) -> tuple[np.ndarray, np.ndarray]:
    """:func:`interleaved_wall_and_cpu` with each repetition cut into blocks of items: every
    contender runs items ``start:stop`` (``fn(start, stop)``) before any runs the next
    block, so a burst of outside load (this VM's timings swing by 10-30 % for seconds at a
    time) falls on all contenders alike instead of on whichever ran during it. The
    per-call times of a repetition are summed."""
    for fn in contenders:
        fn(0, min(block, n_items))
    wall = np.zeros((repeats, len(contenders)))
    cpu = np.zeros((repeats, len(contenders)))
    for r in range(repeats):
        for start in range(0, n_items, block):
            stop = min(n_items, start + block)
            for c, fn in enumerate(contenders):
                t0, c0 = time.perf_counter(), time.process_time()
                fn(start, stop)
                wall[r, c] += time.perf_counter() - t0
                cpu[r, c] += time.process_time() - c0
    return wall, cpu


def interleaved_times(contenders: Sequence[Callable[[], object]], repeats: int) -> np.ndarray:
    """Wall seconds per call, shape ``(repeats, len(contenders))`` (see above)."""
    return interleaved_wall_and_cpu(contenders, repeats)[0]


def load_average() -> str:
    """The 1/5/15-minute load averages, as ``uptime`` prints them."""
    return ", ".join(f"{x:.2f}" for x in os.getloadavg())


def machine() -> str:
    """One line: CPU (model, family, SIMD level, cores), Python and numpy versions, date."""
    return (
        f"{cpu_description()}, Python {platform.python_version()}, numpy {np.__version__}, "
        f"{datetime.date.today().isoformat()}"
    )


def cpu_tag() -> str:
    """This CPU as a section key: family, model and SIMD level (``"family 25 model 17,
    AVX-512 with VPOPCNTDQ"``); timings on another CPU go to a section of their own."""
    match = re.search(r"\((family [^)]*)\)", cpu_description())
    return match.group(1) if match else "CPU unknown"


def write_section(name: str, markdown: str) -> None:
    """Replace (or append) this CPU's section ``name`` of docs/results.md between markers.

    The CPU is part of the section: a run on another CPU adds its own section (its heading
    names the CPU) instead of overwriting the figures measured on the one before."""
    tag = cpu_tag()
    head, sep, rest = markdown.partition("\n")
    if head.startswith("## "):
        markdown = f"{head} [{tag}]{sep}{rest}"
    _write_section(RESULTS, f"{name} [{tag}]", markdown)
