"""``planner compare`` says which plan's step is the host's, as ``planner plan`` does (issue 22; :mod:`planner.host_bound`):
`` h`` after a host-bound plan's step time, ``planner plan``'s footnote once, and ``--json``'s ``host_bound`` per plan.

A 2-layer GPT under the fused engine on A100s: its kernels take microseconds, so the preset's host floor
(``layer_host_s`` 0.9 ms, ``microbatch_host_s`` 1.0 ms) sets both passes, forward 2 x 0.9 + 1.0 = 2.8 ms and backward
2 x 2 x 0.9 = 3.6 ms without recomputation (docs/COST_MODEL.md, "Fixed costs"); at 0.1 us of host work per layer and
micro-batch its kernels (5 us of launch each at least) set them instead."""

from __future__ import annotations

import dataclasses
import io
import json
from pathlib import Path

import pytest

import planner.render as render
from objectives.cluster import make_cluster
from objectives.pipeline_price import evaluate_pipeline
from objectives.stage_ops import stage_ops
from planner.core.settings import TrainingSettings
from planner.host_bound import host_bound, stage_floors
from planner.pipeline import PipelineCostCache
from planner.repriced import Repriced
from tests.exporters.graphs import gpt_graph
from tests.planner.cli_helpers import run_cli

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
LAYERS = 2
FOOTNOTE = "h: the step is bound by the host, not the GPUs"


def _repriced(host_s: float | None) -> Repriced:
    """The 2-layer GPT's replicated plan on one A100, its host work per layer and micro-batch ``host_s`` (``None``:
    the preset's), as ``planner compare`` reads a saved plan priced again."""
    cluster = make_cluster("a100-80gb", devices=1)
    if host_s is not None:
        cluster = dataclasses.replace(cluster, device=dataclasses.replace(cluster.device, layer_host_s=host_s,
                                                                          microbatch_host_s=host_s))
    cache = PipelineCostCache(lambda batch: gpt_graph(layers=LAYERS, batch=batch, seq=16, hidden=64, heads=4),
                              cluster=cluster, settings=TrainingSettings(engine="fused", attention="flash"))
    point = evaluate_pipeline(cache, pp=1, batch=4, zero_stage=0, recompute="none", choice=[0] * len(cache.graph(4).ops),
                              bounds=[0, LAYERS], global_batch=4)
    floors = stage_floors(point, cache)
    return Repriced(saved_time_s=point.time_s, saved_memory_bytes=point.memory_bytes, point=point, priced_as="fused+flash",
                    host_floors=((float(floors[0][0]), float(floors[1][0])),), host_bound=host_bound(point, cache),
                    stage_ops=stage_ops(cache, point), device=cluster.device)


def _printed(monkeypatch, first: Repriced, second: Repriced) -> str:
    out = io.StringIO()
    monkeypatch.setattr(render, "stdout", render._StdoutConsole(file=out, width=200, highlight=False, markup=False))
    render.compare(first, second, json_out=False, top=5)
    return out.getvalue()


@pytest.mark.parametrize("a_bound", [True, False])
def test_the_host_bound_plan_is_marked_and_footnoted_once(a_bound: bool, monkeypatch):
    bound, unbound = _repriced(None), _repriced(1e-7)
    assert bound.point.stages[0].forward_s == pytest.approx(2.8e-3)  # the floor, by hand
    assert bound.point.stages[0].backward_s == pytest.approx(3.6e-3)
    assert unbound.point.stages[0].forward_s > 10 * 3e-7  # its kernels, not its 0.3 us floor
    first, second = (bound, unbound) if a_bound else (unbound, bound)
    text = _printed(monkeypatch, first, second)
    line_a, line_b = (next(line for line in text.splitlines() if line.startswith(p)) for p in ("A = ", "B = "))
    marked = f"{render.format_seconds(bound.point.time_s)} h, "
    assert (marked in line_a) is a_bound and (marked in line_b) is not a_bound
    assert " h, " not in (line_b if a_bound else line_a)
    assert text.count(FOOTNOTE) == 1 and "a100-80gb: 0.90 ms per layer forward" in text
    data = render.compare_repriced_json(first, second)
    assert data["host_bound"] == {"a": a_bound, "b": not a_bound}


def test_no_footnote_when_neither_is_host_bound(monkeypatch):
    text = _printed(monkeypatch, _repriced(1e-7), _repriced(2e-7))
    assert FOOTNOTE not in text and " h, " not in text


def test_saved_rows_compare_as_the_table_marks_them(tmp_path):
    """Two rows of ``planner plan``'s table (GPT-2 tiny on 2 A100s: every row on its host floor, tests/planner/
    test_host_bound.py), saved and compared: the marks and ``host_bound`` are the table's."""
    base = ["plan", TINY, "-n", "2", "--dim", "batch=8", "--dim", "seq=32", "--target", "megatron", "-q", "--collapse", "0"]
    first, last = tmp_path / "first.json", tmp_path / "last.json"
    table = json.loads(run_cli([*base, "--json", "--pick", 1, "--export", "generic", "-o", first]).stdout)
    rows = table["rows"]
    assert len(rows) >= 2
    run_cli([*base, "--pick", len(rows), "--export", "generic", "-o", last])
    compared = json.loads(run_cli(["compare", first, last, "--json"]).stdout)
    assert compared["host_bound"] == {"a": rows[0]["host_bound"], "b": rows[-1]["host_bound"]} == {"a": True, "b": True}
    text = run_cli(["compare", first, last]).stdout
    for line in text.splitlines()[:2]:
        assert line.startswith(("A = ", "B = ")) and " h, " in line
    assert text.count(FOOTNOTE) == 1
