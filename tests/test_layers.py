"""The floors of the engine import only downwards (DESIGN.md, docs/architecture.md).

Every module under ``backend/shoal`` and ``adapters/`` is parsed with :mod:`ast`; every
``import`` and ``from ... import`` in it counts, at module level and inside functions (an
import placed in a function to dodge a cycle is still a dependency). A test fails naming
the module, the line and the module it imports.

Floors, from the bottom: ``errors``; the IR (``shoal.ir``); lowering of IR to Polars
(``shoal.lowering``: expressions and whole plan nodes); building and checking plans
(``shoal.plan``, which lowers nodes itself and never imports the kernel); the planner (``shoal.planner``, whose ``physical`` module holds the
physical plan's types); the kernel (``shoal.execution``); runners; the facade. Adapters sit
on top and only the facade (``shoal/__init__.py``) may import them.
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SOURCE_ROOTS = (ROOT / "backend", ROOT / "adapters")
ADAPTERS = ("shoal_polars", "shoal_duckdb")


def _module_name(path: Path, source_root: Path) -> str:
    parts = list(path.relative_to(source_root).with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def _is_module(name: str) -> bool:
    rel = Path(*name.split("."))
    return any(
        (r / rel).with_suffix(".py").is_file() or (r / rel / "__init__.py").is_file()
        for r in SOURCE_ROOTS
    )


def _modules() -> dict[str, Path]:
    found: dict[str, Path] = {}
    for source_root in SOURCE_ROOTS:
        for path in sorted(source_root.rglob("*.py")):
            if path.parent.name == "tests" or "egg-info" in str(path):
                continue
            found[_module_name(path, source_root)] = path
    return found


MODULES = _modules()


def imports_of(module: str, path: Path) -> Iterator[tuple[int, str]]:
    """``(line, imported module)`` for every import in the file, at any depth. ``from a
    import b`` counts as ``a.b`` when ``a.b`` is a module, else as ``a``; relative imports
    are resolved against ``module``."""
    is_package = path.name == "__init__.py"
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base = module.split(".")
                drop = node.level - 1 if is_package else node.level
                base = base[: len(base) - drop] if drop else base
                target = ".".join(base + ([node.module] if node.module else []))
            else:
                target = node.module or ""
            for alias in node.names:
                sub = f"{target}.{alias.name}"
                yield node.lineno, sub if _is_module(sub) else target


def _inside(name: str, package: str) -> bool:
    return name == package or name.startswith(package + ".")


def _ours(name: str) -> bool:
    return _inside(name, "shoal") or any(_inside(name, a) for a in ADAPTERS)


def _allowed(importer: str, imported: str) -> bool:
    """Whether ``importer`` may import ``imported`` (both shoal or adapter modules)."""
    if _inside(importer, "shoal.ir"):
        return _inside(imported, "shoal.ir") or imported == "shoal.errors"
    if _inside(importer, "shoal.lowering"):
        return any(_inside(imported, p) for p in ("shoal.ir", "shoal.lowering", "shoal.errors"))
    if _inside(importer, "shoal.planner"):
        upward = ("shoal.execution", "shoal.runners", "shoal.api", "shoal.plan", *ADAPTERS)
        return imported != "shoal" and not any(_inside(imported, p) for p in upward)
    if _inside(importer, "shoal.plan"):
        # the builder and validator lower nodes themselves (shoal.lowering.plan); a Frame
        # runs through the public api (Frame.execute), never the kernel or runners directly
        upward = ("shoal.execution", "shoal.runners", *ADAPTERS)
        return imported != "shoal" and not any(_inside(imported, p) for p in upward)
    if _inside(importer, "shoal.execution"):
        if _inside(imported, "shoal.planner"):
            return imported == "shoal.planner.physical"  # the plan's types, not its logic
        upward = ("shoal.runners", "shoal.api", "shoal.plan", *ADAPTERS)
        return imported != "shoal" and not any(_inside(imported, p) for p in upward)
    if _inside(importer, "shoal") and importer != "shoal":
        return not any(_inside(imported, a) for a in ADAPTERS)
    return True


FLOORS = ("shoal.ir", "shoal.lowering", "shoal.plan", "shoal.planner", "shoal.execution")


def _violations(floor: str) -> list[str]:
    """Upward imports of the modules of ``floor``; ``"shoal"``: of every other module of
    the engine."""
    out: list[str] = []
    for module, path in MODULES.items():
        if floor == "shoal":
            if not _inside(module, "shoal") or any(_inside(module, f) for f in FLOORS):
                continue
        elif not _inside(module, floor):
            continue
        for line, imported in imports_of(module, path):
            found = f"{module} (line {line}) imports {imported}"
            if _ours(imported) and not _allowed(module, imported) and found not in out:
                out.append(found)
    return out


@pytest.mark.parametrize("floor", [*FLOORS, "shoal"])
def test_no_upward_imports(floor: str) -> None:
    """No module of ``floor`` imports a floor above it (the facade ``shoal/__init__.py``
    alone may import the adapters)."""
    found = _violations(floor)
    assert not found, "upward imports:\n" + "\n".join(found)


def test_the_checker_sees_imports_inside_functions(tmp_path: Path) -> None:
    """The parser counts an import inside a function, and resolves relative imports."""
    src = tmp_path / "m.py"
    src.write_text(
        "from . import nodes\n"
        "def f():\n"
        "    from shoal.execution.kernel import build\n"
        "    import shoal.runners.dispatch\n"
    )
    found = [name for _, name in imports_of("shoal.ir.m", src)]
    assert found == ["shoal.ir.nodes", "shoal.execution.kernel", "shoal.runners.dispatch"]
    assert not _allowed("shoal.ir.m", "shoal.execution.kernel")
    assert not _allowed("shoal.planner.x", "shoal.execution.task")
    assert _allowed("shoal.execution.kernel", "shoal.planner.physical")
    assert not _allowed("shoal.execution.kernel", "shoal.planner.planner")
    assert not _allowed("shoal.runners.dispatch", "shoal_polars")
    assert not _allowed("shoal.plan.validate", "shoal.execution.kernel")
    assert _allowed("shoal.plan.validate", "shoal.lowering.plan")
    assert _allowed("shoal", "shoal_polars")


def test_planner_strategies_use_the_public_planning_context() -> None:
    """No module of the planner imports another planner module's private names (the
    strategies receive a :class:`shoal.planner.context.PlanningContext`), and none but
    ``physical.plan_physical`` (the entry point) imports the planner itself."""
    found: list[str] = []
    for module, path in MODULES.items():
        if not _inside(module, "shoal.planner"):
            continue
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if not isinstance(node, ast.ImportFrom) or not (node.module or "").startswith(
                "shoal.planner"
            ):
                continue
            names = [a.name for a in node.names]
            private = [n for n in names if n.startswith("_")]
            if private:
                found.append(f"{module} (line {node.lineno}) imports {private} of {node.module}")
            if node.module == "shoal.planner.planner" and module != "shoal.planner.physical":
                found.append(f"{module} (line {node.lineno}) imports the planner {names}")
    assert not found, "\n".join(found)


@pytest.mark.parametrize("first", ["shoal_polars", "shoal_duckdb", "shoal.errors", "shoal"])
def test_each_package_imports_first_in_a_fresh_interpreter(first: str) -> None:
    """``shoal`` imports the Polars adapter, so an adapter module that imports ``shoal`` at
    its top breaks ``import shoal_polars`` done before ``import shoal`` (a warnings filter
    naming ``shoal_polars.ShoalFallbackWarning`` does that: the Polars suite's fallback run
    failed so)."""
    import subprocess
    import sys

    done = subprocess.run(
        [sys.executable, "-c", f"import {first}; import shoal; print(shoal.DistEngine)"],
        capture_output=True,
        text=True,
    )
    assert done.returncode == 0, done.stderr[-2000:]
