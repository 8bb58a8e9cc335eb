"""The shape of the code (issue 8, DESIGN.md): small functions and classes, a thin app.py,
doctest examples that run, imports that run one way (import-linter, in scripts/check)."""

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
MAX_APP_LINES = 155


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


def test_app_is_assembly_only():
    assert len((PACKAGE / "app.py").read_text().splitlines()) <= MAX_APP_LINES


def _modules() -> list[str]:
    return sorted(m.name for m in pkgutil.walk_packages(gateway.__path__, "gateway."))


@pytest.mark.parametrize("name", _modules())
def test_doctest_examples_run(name: str):
    module = importlib.import_module(name)
    result = doctest.testmod(module, optionflags=doctest.ELLIPSIS, verbose=False)
    assert result.failed == 0, f"{name}: {result.failed} of {result.attempted} examples failed"
