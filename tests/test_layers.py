"""The layers of ``docs/design.md`` hold: every module imports only from its own layer and
the layers above it (module-level and function-level imports alike), every module belongs to
a layer of that list, and the package root stays small.

The layer list is read from the design record itself, so the document and the code cannot
drift apart: a new module must be placed in ``docs/design.md``'s "Layers" section.
"""

from __future__ import annotations

import ast
import re
from pathlib import Path

import pytest

import hashlearn

PACKAGE = Path(hashlearn.__file__).parent
DESIGN = Path(__file__).parents[1] / "docs" / "design.md"
MAX_ROOT_MODULES = 14


def read_layers(text: str) -> dict[str, int]:
    """``{path or folder/: layer}`` from the numbered list of the "Layers" section: every
    backticked ``*.py`` file or ``folder/`` of item N is in layer N."""
    section = text.split("## Layers", 1)[1].split("\n## ", 1)[0]
    layers: dict[str, int] = {}
    layer = None
    for line in section.splitlines():
        item = re.match(r"(\d+)\. ", line)
        if item:
            layer = int(item[1])
        elif not line.startswith("   "):
            layer = None  # the list ended
        if layer is None:
            continue
        for token in re.findall(r"`([^`]+)`", line):
            if re.fullmatch(r"[A-Za-z_][\w/]*(\.py|/)", token):
                layers.setdefault(token, layer)
    return layers


LAYERS = read_layers(DESIGN.read_text(encoding="utf-8"))


def layer_of(relative: str) -> int | None:
    """The layer of a module file (``index/flat.py``): its own entry, else the longest
    folder holding it."""
    if relative in LAYERS:
        return LAYERS[relative]
    parts = relative.split("/")
    for n in range(len(parts) - 1, 0, -1):
        folder = "/".join(parts[:n]) + "/"
        if folder in LAYERS:
            return LAYERS[folder]
    return None


def module_file(name: str) -> str | None:
    """``hashlearn.a.b`` -> ``a/b.py`` (or ``a/b/__init__.py``), relative to the package;
    ``None`` if it is not a module of the package."""
    parts = name.split(".")[1:]
    if not parts:
        return "__init__.py"
    for candidate in ("/".join(parts) + ".py", "/".join(parts) + "/__init__.py"):
        if (PACKAGE / candidate).is_file():
            return candidate
    return None


def imported_modules(path: Path, source: str | None = None) -> list[tuple[int, str]]:
    """``(line, hashlearn module)`` for every import statement of a module file."""
    package = ["hashlearn", *path.relative_to(PACKAGE).parent.parts]
    if source is None:
        source = path.read_text(encoding="utf-8")
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package[: len(package) - node.level + 1]
                base = ".".join([*anchor, base] if base else anchor)
            for alias in node.names:  # `from pkg import module` imports the module
                sub = f"{base}.{alias.name}"
                found.append((node.lineno, sub if module_file(sub) else base))
    return sorted({(line, name) for line, name in found if name.split(".")[0] == "hashlearn"})


MODULES = sorted(p.relative_to(PACKAGE).as_posix() for p in PACKAGE.rglob("*.py"))


def test_the_design_record_lists_layers():
    assert sorted(set(LAYERS.values())) == list(range(1, max(LAYERS.values()) + 1))
    assert LAYERS["codes.py"] == 1 and LAYERS["index/"] > LAYERS["hashers/"]


@pytest.mark.parametrize("module", [m for m in MODULES if m != "__init__.py"])
def test_imports_follow_the_layers(module):
    own = layer_of(module)
    assert own is not None, f"{module} is in no layer of docs/design.md's 'Layers' section"
    wrong = []
    for line, name in imported_modules(PACKAGE / module):
        target = module_file(name)
        if target is None:
            continue  # a name the package does not have: the import itself fails elsewhere
        # the package root re-exports the public API: it counts as the last layer
        theirs = max(LAYERS.values()) if target == "__init__.py" else layer_of(target)
        if theirs is None or theirs > own:
            wrong.append(f"line {line}: {name} (layer {theirs}) from layer {own}")
    assert not wrong, f"{module} imports against the layers of docs/design.md: {wrong}"


def test_the_checker_sees_imports_against_the_layers():
    """The walk finds function-level, relative and ``from package import module`` imports."""
    source = (
        "def f():\n"
        "    from hashlearn.evaluate import exact_knn\n"
        "from .. import search\n"
        "from hashlearn import codes, load\n"
    )
    found = imported_modules(PACKAGE / "hashers" / "probe.py", source)
    assert sorted(found) == [
        (2, "hashlearn.evaluate"),
        (3, "hashlearn.search"),
        (4, "hashlearn"),
        (4, "hashlearn.codes"),
    ]
    assert layer_of("evaluate/ground_truth.py") > layer_of("hashers/rank.py")


def test_the_package_root_stays_small():
    root = sorted(p.name for p in PACKAGE.glob("*.py"))
    assert len(root) <= MAX_ROOT_MODULES, root
