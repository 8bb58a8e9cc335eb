"""The shape of the code: functions, classes and modules a person can hold, class names defined
once, a thin app.py, doctest examples that run, imports that run one way (import-linter, in
scripts/check)."""

from __future__ import annotations

import ast
import doctest
import importlib
import pkgutil
from pathlib import Path

import pytest

import gateway

PACKAGE = Path(gateway.__file__).parent
MAX_FUNCTION_LINES = 60
MAX_CLASS_LINES = 250
MAX_APP_LINES = 150
MAX_MODULE_LINES = 600


def _nodes() -> list[tuple[Path, ast.AST]]:
    out = []
    for path in sorted(PACKAGE.rglob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            out.append((path, node))
    return out


def _length(node: ast.AST) -> int:
    assert isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef | ast.ClassDef)
    assert node.end_lineno is not None
    return node.end_lineno - node.lineno + 1


def test_no_function_over_60_lines():
    long = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, node in _nodes()
        if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef)
        and _length(node) > MAX_FUNCTION_LINES
    ]
    assert not long, "\n".join(long)


def test_no_class_over_250_lines():
    big = [
        f"{path.relative_to(PACKAGE.parent)}:{node.lineno} {node.name} ({_length(node)} lines)"
        for path, node in _nodes()
        if isinstance(node, ast.ClassDef) and _length(node) > MAX_CLASS_LINES
    ]
    assert not big, "\n".join(big)


def test_no_class_name_is_defined_twice():
    """A class name means one thing in the package: two classes of one name (a relay of
    realtime messages and one of MCP answers, say) make every reader, traceback and import ask
    which one. Private classes too: a traceback names them the same."""
    where: dict[str, list[str]] = {}
    for path, node in _nodes():
        if isinstance(node, ast.ClassDef):
            place = f"{path.relative_to(PACKAGE.parent)}:{node.lineno}"
            where.setdefault(node.name, []).append(place)
    twice = [f"{name}: {', '.join(places)}" for name, places in where.items() if len(places) > 1]
    assert not twice, "give each a name that says its role:\n" + "\n".join(sorted(twice))


def test_app_is_assembly_only():
    assert len((PACKAGE / "app.py").read_text().splitlines()) <= MAX_APP_LINES


def _module_lines() -> dict[str, int]:
    return {
        path.relative_to(PACKAGE.parent).as_posix(): len(path.read_text().splitlines())
        for path in sorted(PACKAGE.rglob("*.py"))
    }


def test_no_module_over_600_lines():
    over = [
        f"{name} ({lines} lines)"
        for name, lines in _module_lines().items()
        if lines > MAX_MODULE_LINES
    ]
    assert not over, "split along its sections (cap: 600 lines):\n" + "\n".join(over)


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(gateway.__path__, "gateway."))


@pytest.mark.parametrize("name", _modules())
def test_doctest_examples_run(name: str):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
