"""The floors of the design card hold: data flows importers -> objectives -> search -> exporters, and
no lower floor calls up into the roof (issue 17); no import cycle, no module over 1,200 lines (issue 22).

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
    # the model analyses the exporters read a launcher's flags from: transformer, MoE, Mamba/hybrid
    # stacks, rotary frequencies, norms' epsilon and folded scales, sliding windows, MoE routers' scaling and bias
    "exporters": ("planner.core", "exporters", "importers.transformer", "importers.moe", "importers.hybrid",
                  "importers.rotary", "importers.norm_eps", "importers.zero_centred", "importers.sliding_window",
                  "importers.moe_router", "importers.quick_geglu"),
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
    "planner.plan_types": (),
    "planner.pricing": ("planner.plan_types",),
    "planner.plan_targets": ("planner.plan_types",),
    "planner.public_form": ("planner.plan_types", "planner.pricing"),
    "planner.saved_plan": ("planner.plan_types", "planner.pricing"),
    "planner.plan": (
        "planner.plan_targets", "planner.plan_types", "planner.pricing", "planner.public_form", "planner.saved_plan",
    ),
    "planner.pipeline": ("planner.plan",),
    "planner.estimate": ("planner.pipeline", "planner.plan"),
    "planner.export": ("planner.pipeline", "planner.plan"),
    "planner.calibrate": ("planner.estimate", "planner.pipeline", "planner.plan"),
    "planner.profiling": ("planner.plan",),
    "planner.render": (),
    "planner.launcher_options": ("planner.pipeline", "planner.plan"),
    "planner.baseline_rows": ("planner.estimate", "planner.pipeline"),
    "planner.launchable": (
        "planner.baseline_rows", "planner.estimate", "planner.launcher_options", "planner.pipeline", "planner.plan",
        "planner.pricing",
    ),
    "planner.research": ("planner.launchable", "planner.pipeline", "planner.plan"),
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


# --------------------------------------------------------------------------------------------------
# Size and cycles (issue 22: "no import cycle, no file over 1,200 lines").

MAX_MODULE_LINES = 1200
"""A module longer than this holds more than one concept; split it by what its parts hold."""


def _code_modules(root: Path = ROOT) -> dict[str, Path]:
    """Dotted module name -> file, for every module of the four code folders under ``root``."""
    modules = {}
    for folder in FIRST_PARTY:
        for path in sorted((root / folder).rglob("*.py")):
            parts = list(path.relative_to(root).with_suffix("").parts)
            if parts[-1] == "__init__":
                parts.pop()
            modules[".".join(parts)] = path
    return modules


def test_no_module_is_over_the_line_limit():
    too_long = []
    for path in _code_modules().values():
        relative = path.relative_to(ROOT).as_posix()
        lines = len(path.read_text().splitlines())
        if lines > MAX_MODULE_LINES:
            too_long.append(f"{relative}: {lines} lines (split it into modules that each hold one concept)")
    assert not too_long, "\n".join(too_long)


def _imported_modules(path: Path, module: str, modules: dict[str, Path]) -> set[str]:
    """The first-party modules ``module`` (the file ``path``) imports, at the top or in a function.

    ``from pkg import name`` imports ``pkg.name`` when that is a module, else ``pkg``; an import of a
    name that is not a module counts as its nearest enclosing module.
    """
    tree = ast.parse(path.read_text(), filename=str(path))
    package = module.split(".") if path.name == "__init__.py" else module.split(".")[:-1]
    found = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from the package, up level - 1 packages
                base = ".".join([*package[: len(package) - node.level + 1], *filter(None, [node.module])])
            names = [f"{base}.{alias.name}" if f"{base}.{alias.name}" in modules else base for alias in node.names]
        else:
            continue
        for name in names:
            while name and name not in modules:
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def _import_graph(root: Path = ROOT):
    import networkx as nx

    modules = _code_modules(root)
    graph = nx.DiGraph()
    graph.add_nodes_from(modules)
    for module, path in modules.items():
        graph.add_edges_from((module, imported) for imported in _imported_modules(path, module, modules))
    return graph


def test_the_first_party_import_graph_has_no_cycle():
    import networkx as nx

    cycles = sorted(" -> ".join([*cycle, cycle[0]]) for cycle in nx.simple_cycles(_import_graph()))
    assert not cycles, "import cycles (move the shared piece to a module both can import):\n" + "\n".join(cycles)


def test_the_cycle_checker_sees_function_level_and_from_package_imports(tmp_path):
    import networkx as nx

    package = tmp_path / "planner"
    package.mkdir()
    (package / "__init__.py").write_text("")
    (package / "a.py").write_text("def f():\n    from planner import b\n")
    (package / "b.py").write_text("from planner.a import f\n")
    (package / "c.py").write_text("import planner.b\n")
    graph = _import_graph(tmp_path)
    assert set(graph.edges) == {("planner.a", "planner.b"), ("planner.b", "planner.a"), ("planner.c", "planner.b")}
    assert [sorted(c) for c in nx.simple_cycles(graph)] == [["planner.a", "planner.b"]]
