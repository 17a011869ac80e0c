"""The floors of the design card hold: data flows importers -> objectives -> search -> exporters, and
no lower floor calls up into the roof (issue 17).

Every ``import`` of a first-party module, at the top of a file or inside a function, is read from
the syntax tree (docstring examples are not code and are not read).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

#: folder -> the first-party packages its modules may import (besides themselves)
FLOORS = {
    "planner/core": ("planner.core",),
    "importers": ("planner.core", "importers"),
    "objectives": ("planner.core", "objectives"),
    "exporters": ("planner.core", "exporters", "importers.transformer", "importers.moe"),
    "planner/search": ("planner.core", "planner.search"),
}
FIRST_PARTY = ("planner", "importers", "objectives", "exporters")


def _imports(path: Path) -> list[tuple[int, str]]:
    tree = ast.parse(path.read_text(), filename=str(path))
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            found.append((node.lineno, node.module))
            # `from planner import plan` names a module too
            found += [(node.lineno, f"{node.module}.{alias.name}") for alias in node.names if node.module in FIRST_PARTY]
    return found


def _allowed(module: str, allowed: tuple[str, ...]) -> bool:
    if module.split(".")[0] not in FIRST_PARTY:
        return True
    return any(module == a or module.startswith(a + ".") for a in allowed) or module in FIRST_PARTY


@pytest.mark.parametrize("floor", sorted(FLOORS))
def test_no_floor_imports_above_itself(floor):
    bad = []
    for path in sorted((ROOT / floor).rglob("*.py")):
        for line, module in _imports(path):
            if not _allowed(module, FLOORS[floor]):
                bad.append(f"{path.relative_to(ROOT)}:{line} imports {module}")
    assert not bad, "\n".join(bad)


def test_the_checker_sees_function_level_imports(tmp_path):
    sample = tmp_path / "m.py"
    sample.write_text("def f():\n    from planner.plan import plan\n    import planner.cli\n")
    modules = {m for _, m in _imports(sample)}
    assert {"planner.plan", "planner.cli"} <= modules
    assert not _allowed("planner.plan", FLOORS["objectives"])


#: roof module -> the roof modules it may import (calls inside the roof go one way: no loops)
ROOF = {
    "planner.plan": (),
    "planner.pipeline": ("planner.plan",),
    "planner.estimate": ("planner.pipeline", "planner.plan"),
    "planner.export": ("planner.pipeline", "planner.plan"),
    "planner.calibrate": ("planner.estimate", "planner.pipeline", "planner.plan"),
    "planner.profiling": ("planner.plan",),
    "planner.render": (),
}


@pytest.mark.parametrize("module", sorted(ROOF))
def test_the_roof_calls_one_way(module):
    path = ROOT / (module.replace(".", "/") + ".py")
    roof = {m for m in (*ROOF, "planner.cli", "planner.run")} - {module}
    bad = [
        f"{path.relative_to(ROOT)}:{line} imports {imported}"
        for line, imported in _imports(path)
        if any(imported == m or imported.startswith(m + ".") for m in roof) and not any(
            imported == m or imported.startswith(m + ".") for m in ROOF[module]
        )
    ]
    assert not bad, "\n".join(bad)
