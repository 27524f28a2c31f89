"""The ``hashlearn`` command line: ``demo``, ``info``, ``reproduce`` and ``bench``.

A thin wrapper: the work is :func:`hashlearn.demo.run_demo` and the experiments; this module
parses options, shows a progress bar on stderr and prints the results on stdout.

Errors. Every error, whether click's own (a bad option) or the library's (a ``ValueError``
or ``OSError`` naming a file or argument), is printed as **one line** ``Error: ...`` on
stderr with exit status 2, never a traceback (set ``HASHLEARN_TRACEBACK=1`` to see one).
Outputs (``--out``, ``--results``) are checked for writability before any work starts.
:class:`OneLineErrorGroup`, :class:`CLIError`, :func:`check_output_dir` and
:func:`check_output_file` are the pieces other command modules reuse: a command added with
``main.add_command(...)`` gets the same error handling.
"""

from __future__ import annotations

import functools
import importlib
import os
import platform
import sys
import tempfile
import time
from pathlib import Path

import click

from hashlearn import __version__
from hashlearn._utils.parallel import available_cores
from hashlearn._utils.popcount import kernel_path_description
from hashlearn._utils.sysinfo import cpu_description
from hashlearn.datasets import FASHION_MNIST_DIR, FASHION_MNIST_INSTALL, fashion_mnist_available
from hashlearn.demo import DATASETS, OUTPUT_FILES, DemoParameterError, format_table, run_demo
from hashlearn.experiments import EXPERIMENTS, get_experiment
from hashlearn.hashers import available_hashers
from hashlearn.index import available_indexes

__all__ = ["main", "CLIError", "OneLineErrorGroup", "check_output_dir", "check_output_file"]

# --quick defaults: code lengths, queries, training points
_QUICK_BITS, _QUICK_N_QUERIES, _QUICK_N_TRAIN = (16, 32), 100, 1000


class BitsParam(click.ParamType):
    """Comma-separated code lengths, e.g. ``16,32,64``."""

    name = "BITS"

    def convert(self, value, param, ctx) -> tuple[int, ...]:
        if isinstance(value, tuple):
            return value
        parts = [part.strip() for part in str(value).split(",")]
        try:
            bits = tuple(int(part) for part in parts)
        except ValueError:
            bits = ()
        if not bits or min(bits) < 1:
            self.fail(
                f"expected comma-separated positive integers such as 16,32,64. Got {value!r}.",
                param,
                ctx,
            )
        return tuple(dict.fromkeys(bits))


class CLIError(click.ClickException):
    """A command-line error: printed as one line ``Error: message``, exit status 2."""

    exit_code = 2

    def show(self, file=None) -> None:
        click.echo(f"Error: {_one_line(self.format_message())}", err=True)


#: exceptions of the library and of the operating system that are the user's to fix (a
#: bad file, a bad argument, a missing optional package): one line, never a traceback
USER_ERRORS = (ValueError, OSError, ImportError, MemoryError)


def _one_line(message: str) -> str:
    return " ".join(str(message).split())


def describe_error(exc: BaseException) -> str:
    """One line for an exception: ``OSError`` as ``file: reason``, others as their message."""
    if isinstance(exc, OSError) and exc.filename is not None:
        reason = exc.strerror or str(exc)
        return _one_line(f"{exc.filename}: {reason}")
    if isinstance(exc, MemoryError):
        return _one_line(f"out of memory: {exc}" if str(exc) else "out of memory")
    return _one_line(str(exc) or type(exc).__name__)


class OneLineErrorGroup(click.Group):
    """A click group whose every error is one line on stderr and exit status 2.

    Click's usage errors lose their usage block (``-h`` shows it), ``ValueError``,
    ``OSError``, ``ImportError`` and ``MemoryError`` raised by any command of the group (or
    of a group added to it) become ``Error: ...`` lines. ``HASHLEARN_TRACEBACK=1`` re-raises
    them instead, for debugging.
    """

    def main(self, args=None, prog_name=None, complete_var=None, standalone_mode=True, **extra):
        if not standalone_mode:
            return super().main(args, prog_name, complete_var, False, **extra)
        try:
            code = super().main(args, prog_name, complete_var, False, **extra)
        except click.Abort:
            click.echo("Aborted!", err=True)
            sys.exit(1)
        except click.ClickException as exc:
            _exit_with(exc.format_message())
        except USER_ERRORS as exc:
            if os.environ.get("HASHLEARN_TRACEBACK"):
                raise
            _exit_with(describe_error(exc))
        sys.exit(code if isinstance(code, int) else 0)


def _exit_with(message: str) -> None:
    click.echo(f"Error: {_one_line(message)}", err=True)
    sys.exit(2)


def _nearest_existing(path: Path) -> Path:
    probe = path
    while not os.path.lexists(probe) and probe.parent != probe:
        probe = probe.parent
    return probe


def _check_can_create_in(directory: Path, option: str, target: Path) -> None:
    """``target`` (not existing yet) can be created under its nearest existing ancestor."""
    ancestor = _nearest_existing(directory)
    if not ancestor.is_dir():
        raise CLIError(f"{option}: cannot create {target}: {ancestor} is not a directory.")
    _check_writable_dir(ancestor, option, target)


def _check_writable_dir(directory: Path, option: str, target: Path) -> None:
    if not os.access(directory, os.W_OK | os.X_OK):
        raise CLIError(f"{option}: cannot write to {target}: {directory} is not writable.")
    try:  # os.access misses read-only mounts and some ACLs: try it
        with tempfile.TemporaryFile(dir=directory, prefix=".hashlearn-write-test-"):
            pass
    except OSError as exc:
        raise CLIError(
            f"{option}: cannot write to {target}: {exc.strerror or exc} ({directory})."
        ) from None


def check_output_dir(path: Path, option: str = "--out") -> Path:
    """Check, before any work, that the output directory ``path`` is (or can be created as)
    a writable directory; a :class:`CLIError` naming ``option`` otherwise. Creates nothing."""
    path = Path(path)
    if path.exists():
        if not path.is_dir():
            raise CLIError(f"{option}: {path} exists and is not a directory.")
        _check_writable_dir(path, option, path)
    else:
        _check_can_create_in(path.parent, option, path)
    return path


def check_output_file(path: Path, option: str = "--results") -> Path:
    """Check, before any work, that the file ``path`` can be written (replaced atomically
    in its directory); a :class:`CLIError` naming ``option`` otherwise. Creates nothing."""
    path = Path(path)
    if path.is_dir():
        raise CLIError(f"{option}: {path} is a directory, not a file.")
    if os.path.lexists(path) and not path.is_file():
        raise CLIError(f"{option}: {path} is not a regular file.")
    if path.parent.exists():
        if not path.parent.is_dir():
            raise CLIError(f"{option}: cannot create {path}: {path.parent} is not a directory.")
        _check_writable_dir(path.parent, option, path)
    else:
        _check_can_create_in(path.parent, option, path)
    return path


# ------------------------------------------------------------- options shared by commands


def _out_option(default: Path | None, help: str):
    return click.option(
        "--out",
        "out_dir",
        type=click.Path(file_okay=False, path_type=Path),
        default=default,
        show_default=default is not None,
        help=help,
    )


def _seed_option(help: str):
    return click.option(
        "--seed", type=click.IntRange(min=0), default=0, show_default=True, help=help
    )


def _count_option(flag: str, dest: str, help: str):
    """An optional positive integer (``None`` when not given)."""
    return click.option(flag, dest, type=click.IntRange(min=1), default=None, help=help)


def _results_option(help: str):
    return click.option(
        "--results",
        "results_file",
        type=click.Path(dir_okay=False, path_type=Path),
        default=None,
        help=help,
    )


#: hidden: where a non-Debian machine (or a test) keeps the Fashion-MNIST IDX files
_data_dir_option = click.option(
    "--data-dir",
    type=click.Path(path_type=Path),
    default=None,
    hidden=True,
    help="Directory of the Fashion-MNIST IDX files (default: the Debian path).",
)


def _check_outputs(out_dir: Path, results_file: Path | None) -> Path:
    """Check ``--out`` and ``--results`` (when given) before any work starts."""
    check_output_dir(out_dir, "--out")
    if results_file is not None:
        check_output_file(results_file, "--results")
    return Path(out_dir)


def _print_report(report: str, out_dir: Path, results_file: Path | None, section: str) -> None:
    """Print ``report`` and, with ``--results``, write it as ``section`` of that file."""
    from hashlearn.experiments._common import write_section

    if results_file is not None:
        write_section(results_file, section, report)
    click.echo(report)
    click.echo(f"\nwrote {out_dir}")


@click.group(cls=OneLineErrorGroup, context_settings={"help_option_names": ["-h", "--help"]})
@click.version_option(__version__, prog_name="hashlearn")
def main() -> None:
    """hashlearn: learned hashing and fast similarity search."""


@main.command()
@click.option(
    "--dataset",
    type=click.Choice(DATASETS),
    default="digits",
    show_default=True,
    help="digits is embedded; fashion-mnist needs the Debian package dataset-fashion-mnist.",
)
@click.option(
    "--bits",
    type=BitsParam(),
    default=None,
    help="Code lengths to train, comma-separated.  [default: 16,32,64; 16,32 with --quick]",
)
@_out_option(Path("demo-out"), "Directory for the results.")
@_count_option(
    "--n-queries", "n_queries", "Number of queries.  [default: 300 digits, 1000 fashion-mnist]"
)
@_count_option(
    "--n-train",
    "n_train",
    "Training sample size.  [default: the database for digits, 10000 for fashion-mnist]",
)
@_seed_option("Seed of the split, the hashers and the tie-breaking.")
@click.option(
    "--quick",
    is_flag=True,
    help="Small settings for a fast check: bits 16,32, 100 queries, 1000 training items.",
)
@click.option(
    "--hashers",
    "hasher_names",
    default=None,
    metavar="NAMES",
    help="Comma-separated hasher names (see `hashlearn info`).  [default: all]",
)
@click.option("-v", "--verbose", is_flag=True, help="Report each stage on stderr.")
@_data_dir_option
def demo(
    dataset: str,
    bits: tuple[int, ...] | None,
    out_dir: Path,
    n_queries: int | None,
    n_train: int | None,
    seed: int,
    quick: bool,
    hasher_names: str | None,
    verbose: bool,
    data_dir: Path | None,
) -> None:
    """Train every hasher at each code length and evaluate it against exact search.

    Writes results.json, results.md, pr_curves.png and recall_at_m.png to --out and
    prints the results table.
    """
    from tqdm import tqdm

    if dataset == "fashion-mnist" and not fashion_mnist_available(data_dir):
        raise CLIError(
            f"--dataset fashion-mnist: Fashion-MNIST is not installed (no IDX files in "
            f"{data_dir or FASHION_MNIST_DIR}). Install it with: {FASHION_MNIST_INSTALL}"
        )
    check_output_dir(out_dir, "--out")
    if quick:
        bits = bits or _QUICK_BITS
        n_queries = _QUICK_N_QUERIES if n_queries is None else n_queries
        n_train = _QUICK_N_TRAIN if n_train is None else n_train
    progress = functools.partial(tqdm, file=sys.stderr, unit="run", leave=False)
    try:
        rows = run_demo(
            dataset,
            bits or (16, 32, 64),
            out_dir,
            n_queries=n_queries,
            n_train=n_train,
            random_state=seed,
            hashers=None
            if hasher_names is None
            else [name.strip() for name in hasher_names.split(",")],
            verbose=verbose,
            progress=progress,
            data_dir=data_dir,
        )
    except DemoParameterError as exc:
        raise CLIError(str(exc)) from None
    click.echo(format_table(rows))
    click.echo()
    for name in OUTPUT_FILES:
        click.echo(f"wrote {out_dir / name}")


def _module_version(name: str) -> str:
    """Version of an importable module, or 'not installed'."""
    try:
        module = importlib.import_module(name)
    except ImportError:
        return "not installed"
    return getattr(module, "__version__", "installed")


@main.command()
def info() -> None:
    """Versions, cores, CPU and Hamming kernel path, registered hashers and indexes, optional
    data and libraries."""
    fashion = (
        f"installed ({FASHION_MNIST_DIR})"
        if fashion_mnist_available()
        else f"not installed; install with: {FASHION_MNIST_INSTALL}"
    )
    lines = [
        ("hashlearn", __version__),
        ("python", f"{platform.python_version()} ({sys.executable})"),
        ("numpy", _module_version("numpy")),
        ("scipy", _module_version("scipy")),
        ("numba", _module_version("numba")),
        ("scikit-learn", _module_version("sklearn")),
        ("cores available", str(available_cores())),
        ("cpu", cpu_description()),
        ("hamming kernel", kernel_path_description()),
        ("hashers", ", ".join(available_hashers())),
        ("indexes", ", ".join(available_indexes())),
        ("fashion-mnist", fashion),
        ("faiss (optional)", _module_version("faiss")),
        ("dask (optional)", _module_version("dask")),
    ]
    width = max(len(key) for key, _ in lines)
    for key, value in lines:
        click.echo(f"{key:<{width}}  {value}")


def _with_provenance(
    report: str, command: str, started: float, load_before: float, cpu_s: float
) -> str:
    """``report`` with a line under its first heading saying how and when it was made: the
    command, the UTC start and end, wall and CPU minutes, and the 1-minute load average
    before and after (a run beside other work shows a load above its own threads')."""
    ended = time.time()

    def utc(t: float) -> str:
        return time.strftime("%Y-%m-%d %H:%M:%S", time.gmtime(t))

    line = (
        f"Run: `{command}`, {utc(started)} to {utc(ended)[11:]} UTC "
        f"({(ended - started) / 60:.1f} min wall, {cpu_s / 60:.1f} min CPU), load average "
        f"{load_before:.2f} before, {os.getloadavg()[0]:.2f} after; {cpu_description()}, "
        f"Python {platform.python_version()}, hashlearn {__version__}."
    )
    lines = report.split("\n")
    at = next((i + 1 for i, text in enumerate(lines) if text.startswith("## ")), 0)
    return "\n".join(lines[:at] + ["", line] + lines[at:])


def _cpu_seconds() -> float:
    """CPU seconds of this process and of its finished worker processes."""
    children = os.times()
    return time.process_time() + children.children_user + children.children_system


@main.command()
@click.argument("name", type=click.Choice(sorted(EXPERIMENTS)))
@_out_option(None, "Directory for tables and plots.  [default: reproduce-out/NAME]")
@click.option("--quick", is_flag=True, help="Small settings for a fast check.")
@_seed_option("Seed of the splits and of the stochastic methods.")
@_results_option("Also write the report as a section of this markdown file (e.g. docs/results.md).")
@click.option(
    "--data-dir",
    type=click.Path(exists=True, file_okay=False, path_type=Path),
    default=None,
    help="Directory of the Fashion-MNIST IDX files (default: the Debian path).",
)
@click.option(
    "--data",
    "data_file",
    type=click.Path(exists=True, dir_okay=False, path_type=Path),
    default=None,
    help="Run the protocol on your own data: .npy rows, or .npz / HDF5 arrays X and y.",
)
@click.option(
    "--jobs",
    "n_jobs",
    type=click.IntRange(1, 64),
    default=1,
    show_default=True,
    help="Worker processes fitting models side by side (mlh, the MLH ablations); the tables are the same.",
)
@click.option(
    "--resume",
    is_flag=True,
    help="Reuse the tasks a stopped run of the same command finished (kept in OUT/checkpoints).",
)
def reproduce(
    name: str,
    out_dir: Path | None,
    quick: bool,
    seed: int,
    results_file: Path | None,
    data_dir: Path | None,
    data_file: Path | None,
    n_jobs: int,
    resume: bool,
) -> None:
    """Reproduce a paper's experiments on real data: tables, PNG plots, a markdown report.

    NAME is one of the experiments; the report is printed and written to OUT/results.md,
    the claims it checks to OUT/claims.json.
    """
    from tqdm import tqdm

    from hashlearn.experiments._common import load_user_data

    out_dir = _check_outputs(out_dir or Path("reproduce-out") / name, results_file)
    X, y = load_user_data(data_file) if data_file is not None else (None, None)
    out_dir.mkdir(parents=True, exist_ok=True)
    progress = functools.partial(tqdm, file=sys.stderr, leave=False)
    started, load_before, cpu_before = time.time(), os.getloadavg()[0], _cpu_seconds()
    report = get_experiment(name).run(
        out_dir,
        quick=quick,
        seed=seed,
        data_dir=data_dir,
        progress=progress,
        X=X,
        y=y,
        n_jobs=n_jobs,
        resume=resume,
    )
    command = f"hashlearn reproduce {name} --seed {seed}" + (" --quick" if quick else "")
    command += f" --data {data_file.name}" if data_file is not None else ""
    command += f" --jobs {n_jobs}" if n_jobs > 1 else ""
    # resumed: the Run line's times are this invocation's, the earlier run's tasks not counted
    command += " --resume" if resume else ""
    report = _with_provenance(report, command, started, load_before, _cpu_seconds() - cpu_before)
    (out_dir / "results.md").write_text(report.rstrip() + "\n")
    _print_report(report, out_dir, results_file, f"reproduce-{name}")


@main.group()
def bench() -> None:
    """Benchmarks run locally (recall-QPS sweeps)."""


@bench.command("ann")
@click.argument("file", type=click.Path(exists=True, dir_okay=False, path_type=Path))
@_out_option(Path("bench-out"), "Directory for the outputs.")
@click.option("--index", type=click.Choice(["mih", "flat"]), default="mih", show_default=True)
@click.option(
    "--bits",
    "n_bits",
    type=click.IntRange(min=1),
    default=64,
    show_default=True,
    help="Code length for vector datasets (Hamming datasets use their own).",
)
@click.option("-k", "k", type=click.IntRange(min=1), default=10, show_default=True)
@_count_option("--queries", "n_queries", "Use only the first N test queries.")
@_results_option("Also write the report as a section of this markdown file.")
def bench_ann(
    file: Path,
    out_dir: Path,
    index: str,
    n_bits: int,
    k: int,
    n_queries: int | None,
    results_file: Path | None,
) -> None:
    """The ann-benchmarks recall-QPS sweep of FILE.hdf5, run locally; writes a plot."""
    from tqdm import tqdm

    from hashlearn.datasets import check_ann_benchmarks
    from hashlearn.experiments import ann_bench

    _check_outputs(out_dir, results_file)
    check_ann_benchmarks(file)  # FILE is an ann-benchmarks file, before any work
    progress = functools.partial(tqdm, file=sys.stderr, leave=False)
    report = ann_bench.run_file(
        file, out_dir, index=index, n_bits=n_bits, k=k, n_queries=n_queries, progress=progress
    )
    _print_report(report, out_dir, results_file, f"bench-ann-{file.stem}")


main.add_command(importlib.import_module("hashlearn.cli_index").index)  # hashlearn index ...
