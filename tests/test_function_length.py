"""No function in omnipack/ is longer than 60 lines, so that each one reads on a screen.

The modules are read with ``ast`` (nothing is imported). A function's length runs from its ``def`` line to its
last line, docstring included (decorators are not counted); a nested function counts in its parent's length and
on its own, under its qualified name (``Outer.method.inner``).
"""

from __future__ import annotations

import ast
from collections.abc import Iterator
from pathlib import Path

ROOT = Path(__file__).parents[1]
PACKAGE = ROOT / "omnipack"
MAX_LINES = 60

# Over-long functions in modules that are being restructured elsewhere right now (issue 22: stages, pipeline,
# measure, plan, rows, text, profiles/hf, executors/ray, tools/verify). Each entry is (module path relative
# to the repository root, qualified function name). The set only shrinks: an entry whose function is gone or
# back within the limit fails the test, so remove it when its module is shortened.
PENDING: frozenset[tuple[str, str]] = frozenset(
    {
    }
)


def function_lengths(tree: ast.AST, prefix: str = "") -> Iterator[tuple[str, int, int]]:
    """(qualified name, first line, length in lines) of every function and method under ``tree``."""
    for node in ast.iter_child_nodes(tree):
        if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef)):
            name = prefix + node.name
            yield name, node.lineno, node.end_lineno - node.lineno + 1
            yield from function_lengths(node, name + ".")
        elif isinstance(node, ast.ClassDef):
            yield from function_lengths(node, prefix + node.name + ".")
        else:  # functions under if/try/with blocks keep the enclosing name
            yield from function_lengths(node, prefix)


def over_long_functions() -> dict[tuple[str, str], str]:
    """(module, qualified name) -> "module:line name (N lines)" for each function over MAX_LINES."""
    found = {}
    for path in sorted(PACKAGE.rglob("*.py")):
        module = path.relative_to(ROOT).as_posix()
        tree = ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
        for name, line, length in function_lengths(tree):
            if length > MAX_LINES:
                found[(module, name)] = f"{module}:{line} {name} ({length} lines)"
    return found


def test_function_lengths_are_measured_with_nesting() -> None:
    """The walker counts docstrings and nested functions, and names methods and nested functions fully."""
    source = 'class A:\n    def f(self):\n        """Doc."""\n        def g():\n            return 1\n        return g\n'
    assert list(function_lengths(ast.parse(source))) == [("A.f", 2, 5), ("A.f.g", 4, 2)]


def test_no_function_over_limit() -> None:
    over = over_long_functions()
    new = [where for key, where in sorted(over.items()) if key not in PENDING]
    assert not new, f"functions over {MAX_LINES} lines (extract helpers):\n" + "\n".join(new)


def test_pending_entries_are_still_over_limit() -> None:
    """PENDING only shrinks: an entry whose function is gone or now short must be removed."""
    stale = sorted(PENDING - over_long_functions().keys())
    assert not stale, f"stale PENDING entries (remove them): {stale}"
