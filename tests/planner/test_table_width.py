"""The launchable table printed to a pipe or a file keeps every column and its right border (sweep H4,
finding 10): a Mesh-TF layout such as ``b:2;m:2 batch:b;heads:m;d_ff:m;vocab:m`` is wider than the
other cells, and kept on one line it pushed the table past the 140 columns a pipe gets, where the
console cut off the "vs row above" column and the border.

Oracles: the layout strings' lengths counted by hand (``batch:b;heads:m;d_ff:m;vocab:m`` is 30
characters, so its column is 30 + 2 padding wide), and the box characters rich draws at the right
edge of each line of a table."""

from __future__ import annotations

import dataclasses
import io

import pytest

import planner.render as render
from objectives.cluster import make_cluster
from planner.plan import PlanRequest, plan
from planner.research import research_frontier
from tests.objectives.graphs import gpt2_like

RIGHT_EDGE = set("┓┃┩│┘")
"""The characters that end a line of a rich table drawn with the default (heavy head) box."""

MESH_TF_LAYOUTS = (
    "m:8 d_ff:m;vocab:m",
    "b:2;m:4 batch:b;d_ff:m;vocab:m",
    "b:2;m:2 batch:b;heads:m;d_ff:m;vocab:m",
    "b:4;m:2 batch:b;heads:m;d_ff:m;vocab:m",
)


@pytest.fixture(scope="module")
def frontier():
    """A real frontier (the per-op research search on a 1-layer GPT-2) with at least two rows."""
    graph = gpt2_like(layers=1, hidden=16, heads=2, vocab=64, positions=8, batch=8, seq=8)
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    result = research_frontier(plan(graph, request, with_targets=False))
    assert len(result.rows) >= 2
    return result


def _with_layouts(frontier, layouts: tuple[str, ...]):
    """``frontier`` with its rows' layouts (cycled through ``layouts``) and "vs row above" cells as
    the Mesh-TF launcher words them."""
    rows = [
        dataclasses.replace(row, layout=layouts[index % len(layouts)],
                            differs="" if index == 0 else f"{layouts[index % len(layouts)]}, ZeRO-0, fused+explicit")
        for index, row in enumerate(frontier.rows)
    ]  # fmt: skip
    return dataclasses.replace(frontier, rows=tuple(rows))


def _table_lines(frontier, monkeypatch) -> list[str]:
    """The table's lines as ``planner plan`` prints them into a file (stdout not a terminal)."""
    out = io.StringIO()
    console = render._StdoutConsole(file=out, highlight=False, markup=False, soft_wrap=False, width=render.TABLE_WIDTH)
    assert not console.is_terminal
    monkeypatch.setattr(render, "stdout", console)
    render.launch_table(frontier, model="m", top=None)
    lines = out.getvalue().splitlines()
    first = next(i for i, line in enumerate(lines) if line.startswith("┏"))
    last = next(i for i, line in enumerate(lines) if line.startswith("└"))
    return lines[first : last + 1]


def test_long_mesh_tf_layouts_wrap_and_keep_every_column(frontier, monkeypatch):
    """Every line ends in the right border, within 140 columns; the layout column narrows below its
    longest cell (38 characters) but not below its longest rule list (30), so the mesh and its rules
    go on two lines and no rule is cut."""
    lines = _table_lines(_with_layouts(frontier, MESH_TF_LAYOUTS), monkeypatch)
    assert {line[-1] for line in lines} <= RIGHT_EDGE
    assert len({len(line) for line in lines}) == 1
    assert len(lines[0]) <= render.TABLE_WIDTH
    header = lines[1].split("┃")
    assert header[-2].strip() == "vs row above"
    layout = next(cell for cell in header if cell.strip() == "layout")
    assert len("batch:b;heads:m;d_ff:m;vocab:m") + 2 == 32 <= len(layout) < 40 == len(MESH_TF_LAYOUTS[2]) + 2
    body = "\n".join(lines)
    assert "│ b:2;m:2 " in body and "│ batch:b;heads:m;d_ff:m;vocab:m " in body


def test_a_rule_list_wider_than_the_page_widens_the_file_not_crops_it(frontier, monkeypatch):
    """A layout whose space-free rule list alone (41 rules, 7 + 40 x 11 = 447 characters) is wider than
    140 columns cannot wrap without cutting it: the file gets lines as wide as the table, each ending in
    its border, and the rule list is whole."""
    rules = ";".join(["batch:b"] + [f"dim_{index:02d}_x:m" for index in range(40)])
    assert len(rules) == 7 + 40 * 11 == 447
    lines = _table_lines(_with_layouts(frontier, (f"b:2;m:4 {rules}",)), monkeypatch)
    assert {line[-1] for line in lines} <= RIGHT_EDGE
    assert len({len(line) for line in lines}) == 1
    assert len(lines[0]) > len(rules)
    assert any(f"│ {rules} " in line for line in lines)


def test_layouts_that_fit_stay_on_one_line(frontier, monkeypatch):
    """Megatron-style layouts fit: the layout column is as wide as its longest cell
    (``dp=2 x tp=2 x ep=2 sp``, 21 characters) plus padding, and each layout is on one line."""
    layouts = ("dp=8", "dp=4 x tp=2 sp", "dp=2 x tp=2 x ep=2 sp")
    lines = _table_lines(_with_layouts(frontier, layouts), monkeypatch)
    assert {line[-1] for line in lines} <= RIGHT_EDGE
    layout = next(cell for cell in lines[1].split("┃") if cell.strip() == "layout")
    assert len(layout) == 21 + 2
    assert sum("│ dp=2 x tp=2 x ep=2 sp │" in line for line in lines) == len(frontier.rows) // 3  # rows 3, 6, 9, ...
