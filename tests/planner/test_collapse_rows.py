"""``--collapse`` is a pass over a finished frontier (issue 22's levers): no search reads the tolerance, so a
frontier listed again at another tolerance (:func:`planner.launchable.collapse_rows`) is, to the bit, the frontier a
search at that tolerance returns (rows, pick, notes, message, headroom, baseline), across nodes, with a limit no row
fits, and where pipelines of a smaller mesh join the rows (``_with_smaller_mesh``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.cluster import make_cluster
from planner.core.errors import InputError
from planner.launchable import collapse_rows, plan_launchable_file
from planner.plan import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "tests" / "data"
SMALL = {"batch": 16, "seq": 64}


def _table(frontier) -> dict:
    """Everything the table and its JSON say, floats as ``repr`` (every bit)."""
    def row(r):
        return repr(r.time_s), repr(r.memory_bytes), r.summary, r.layout, r.differs, r.targets, r.priced_as

    def priced(p):
        return None if p is None else (repr(p.time_s), repr(p.memory_bytes))

    return {"rows": [row(r) for r in frontier.rows], "chosen": frontier.chosen, "fastest": frontier.fastest,
            "collapse": frontier.collapse, "collapsed": frontier.collapsed, "notes": frontier.notes,
            "message": frontier.message, "headroom": priced(frontier.headroom), "baseline": priced(frontier.baseline)}


def _plan(path: Path, dims: dict, devices: int, per_node: int, collapse: float, limit: float | None = None,
          launchers: tuple[str, ...] | None = None):
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=per_node),
                          memory_limit_bytes=limit, time_limit_s=1e6)  # uncut: two searches are compared
    return plan_launchable_file(path, dims, [request], collapse=collapse, launchers=launchers)[1][0]


@pytest.mark.parametrize("path, dims, devices, per_node, limit, launchers", [
    (DATA / "llama_tiny.onnx", SMALL, 8, 4, None, ("torchtitan",)),  # two nodes
    (DATA / "gpt2_tiny.onnx", SMALL, 4, 4, 30 * 2**20, ("deepspeed",)),  # no row fits: offload searched too
    # 16 devices on 2 a node: the pipelines of 2 devices join the rows (a note says so)
    (ROOT / "examples" / "bert.onnx", {"batch": 16, "seq": 128}, 16, 2, None, ("megatron", "deepspeed")),
])
def test_a_frontier_listed_again_is_the_search_at_that_tolerance(path, dims, devices, per_node, limit, launchers):
    every = _plan(path, dims, devices, per_node, 0.0, limit, launchers)
    merged = _plan(path, dims, devices, per_node, 0.05, limit, launchers)
    assert _table(collapse_rows(every, 0.05)) == _table(merged)
    assert _table(collapse_rows(merged, 0.0)) == _table(every)  # the collapsed frontier kept every Pareto row
    assert len(merged.rows) + merged.collapsed == len(every.rows) and every.collapsed == 0
    if devices == 16:
        assert any("pipelines on 2 of the 16 devices" in note for note in every.notes)


def test_a_tolerance_out_of_range_is_an_input_error():
    with pytest.raises(InputError, match="--collapse"):
        collapse_rows(None, 1.0)  # said before the frontier is read
