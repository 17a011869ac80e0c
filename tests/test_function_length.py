"""No function of the planner is longer than :data:`MAX_LINES` lines (issue 17).

A function that long does several things; its steps read better as named helpers (with
docstrings, and dataclasses for results that come in several parts), as STYLE.md asks. The count
is the function's whole span in the syntax tree (``def`` line to last line, docstring, comments
and blank lines included), read from every module of the four code folders; nested functions
count on their own and inside their parent.
"""

from __future__ import annotations

import ast
from pathlib import Path


ROOT = Path(__file__).resolve().parents[1]
FOLDERS = ("planner", "importers", "objectives", "exporters")
MAX_LINES = 100
"""Issue 22: "no function over 100" lines, counted as the whole span (docstring, comments and blank lines in)."""


def function_lengths(path: Path) -> list[tuple[str, int, int]]:
    """``(qualified name, first line, lines)`` of every function and method in ``path``."""
    tree = ast.parse(path.read_text(), filename=str(path))
    found: list[tuple[str, int, int]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                name = f"{prefix}{child.name}"
                found.append((name, child.lineno, child.end_lineno - child.lineno + 1))
                visit(child, f"{name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return found


def test_the_counter_measures_whole_spans(tmp_path):
    sample = tmp_path / "m.py"
    # f: def line + docstring + 3 body lines + a blank line inside = 6; g nested: 2; C.h: 3
    sample.write_text(
        'def f():\n    """Doc."""\n    x = 1\n\n    def g():\n        return x\n'
        "class C:\n    def h(self):\n        y = 2\n        return y\n"
    )
    assert function_lengths(sample) == [("f", 1, 6), ("f.g", 5, 2), ("C.h", 8, 3)]


def test_no_function_is_longer_than_the_limit():
    long = [
        f"{path.relative_to(ROOT)}:{line} {name} is {lines} lines"
        for folder in FOLDERS
        for path in sorted((ROOT / folder).rglob("*.py"))
        for name, line, lines in function_lengths(path)
        if lines > MAX_LINES
    ]
    assert not long, f"split these into named steps (at most {MAX_LINES} lines each):\n" + "\n".join(long)
