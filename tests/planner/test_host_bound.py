"""The host-bound flag (issue 23, fixed costs show; :mod:`planner.host_bound`) against floors computed by hand.

A 2-layer GPT on one A100 under the fused engine: its kernels take microseconds, so the
``a100-80gb`` preset's host floor (``layer_host_s`` 0.9 ms, ``microbatch_host_s`` 1.0 ms; forward
``L h_layer + h_mb``, backward ``2 L h_layer`` without recomputation, docs/COST_MODEL.md "Fixed
costs") sets both passes: 2 x 0.9 + 1.0 = 2.8 ms forward, 2 x 2 x 0.9 = 3.6 ms backward. The same
plan on a device whose host work is 0.1 us per layer and micro-batch (floors 0.3 us and 0.4 us) is
set by its kernels (5 us of launch overhead each at least), so it is not host-bound. The table marks
the first (`` h`` after its step time, one footnote line), ``--json`` says ``host_bound``, and
``planner explain`` names the stage and its margins.
"""

from __future__ import annotations

import dataclasses
import io

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

FUSED = TrainingSettings(engine="fused", attention="flash")
LAYERS = 2


def _point(layer_host_s: float | None = None, microbatch_host_s: float | None = None):
    """The 2-layer GPT's replicated plan on one A100 (its host constants replaced where given), and its cache."""
    cluster = make_cluster("a100-80gb", devices=1)
    if layer_host_s is not None:
        device = dataclasses.replace(cluster.device, layer_host_s=layer_host_s, microbatch_host_s=microbatch_host_s)
        cluster = dataclasses.replace(cluster, device=device)
    cache = PipelineCostCache(lambda batch: gpt_graph(layers=LAYERS, batch=batch, seq=16, hidden=64, heads=4),
                              cluster=cluster, settings=FUSED)  # fmt: skip
    ops = len(cache.graph(4).ops)
    point = evaluate_pipeline(cache, pp=1, batch=4, zero_stage=0, recompute="none", choice=[0] * ops,
                              bounds=[0, LAYERS], global_batch=4)  # fmt: skip
    return point, cache


def test_the_floor_binds_a_small_model():
    point, cache = _point()
    forward, backward = stage_floors(point, cache)
    assert forward.tolist() == pytest.approx([LAYERS * 0.9e-3 + 1.0e-3])  # 2.8 ms, by hand
    assert backward.tolist() == pytest.approx([2 * LAYERS * 0.9e-3])  # 3.6 ms
    stage = point.stages[0]
    assert stage.forward_s == pytest.approx(2.8e-3) and stage.backward_s == pytest.approx(3.6e-3)  # the floors, not the kernels
    assert host_bound(point, cache)


def test_the_floor_does_not_bind_where_the_kernels_outlast_it():
    point, cache = _point(layer_host_s=1e-7, microbatch_host_s=1e-7)
    forward, backward = stage_floors(point, cache)
    assert forward.tolist() == pytest.approx([3e-7]) and backward.tolist() == pytest.approx([4e-7])
    stage = point.stages[0]
    assert stage.forward_s > 10 * forward[0] and stage.backward_s > 10 * backward[0]  # each kernel takes 5 us at least
    assert not host_bound(point, cache)


def test_the_roofline_has_no_floor():
    cache = PipelineCostCache(lambda batch: gpt_graph(layers=LAYERS, batch=batch, seq=16, hidden=64, heads=4),
                              cluster=make_cluster("a100-80gb", devices=1))  # fmt: skip
    point = evaluate_pipeline(cache, pp=1, batch=4, zero_stage=0, recompute="none",
                              choice=[0] * len(cache.graph(4).ops), bounds=[0, LAYERS], global_batch=4)  # fmt: skip
    assert stage_floors(point, cache) is None and not host_bound(point, cache)


@pytest.mark.parametrize("bound", [True, False])
def test_explain_names_the_stage_and_its_margins(bound: bool, monkeypatch):
    point, cache = _point() if bound else _point(layer_host_s=1e-7, microbatch_host_s=1e-7)
    floors = stage_floors(point, cache)
    repriced = Repriced(saved_time_s=point.time_s, saved_memory_bytes=point.memory_bytes, point=point,
                        priced_as="fused+flash", host_floors=((float(floors[0][0]), float(floors[1][0])),),
                        host_bound=host_bound(point, cache), stage_ops=stage_ops(cache, point))  # fmt: skip
    data = render.repriced_json(repriced)
    assert data["host_bound"] is bound and data["stages"][0]["host_bound"] is bound
    stage = data["stages"][0]
    assert stage["host_floor_forward_s"] == pytest.approx(2.8e-3 if bound else 3e-7)
    # the margin: the floor less the kernels' work (the ops' forward seconds summed, objectives.stage_ops)
    kernels = sum(row["forward_s"] for row in stage["op_rows"]) + stage["other_terms_s"]["redistribution"] / 2
    wait = stage["other_terms_s"]["host_wait_forward"]
    assert wait == pytest.approx(max(stage["host_floor_forward_s"] - kernels, 0.0)) and bool(wait > 0) is bound
    out = io.StringIO()
    monkeypatch.setattr(render, "stdout", render._StdoutConsole(file=out, width=200, highlight=False, markup=False))
    for line in render._host_lines(data):
        render.stdout.print(line)
    text = out.getvalue()
    assert ("stage 0 host-bound" in text) is bound and ("the step is host-bound" in text) is bound
    if bound:
        assert f"forward host 2.80 ms vs kernels {render.format_seconds(kernels)} (host by {render.format_seconds(wait)})" in text
    else:
        assert "stage 0 not host-bound" in text and "(kernels by" in text


@pytest.mark.parametrize("bound", [True, False])
def test_the_table_and_json_mark_exactly_the_rows_on_the_floor(bound: bool, monkeypatch):
    """A real launchable table (GPT-2 tiny, 2 layers, on 2 A100s; review h28r): with the A100's host constants every
    row's one stage is priced at its hand floors, forward 2 x 0.9 + 1.0 = 2.8 ms and backward (2 + r) x 2 x 0.9 ms
    (r = 0, 3/13 or 1 for no, MLP or full recomputation), so every row is marked ``h``, says ``host_bound`` in
    JSON, and the footnote is printed once; at 0.1 us of host work per layer and micro-batch no row is bound,
    marked or footnoted."""
    from pathlib import Path

    from planner.launchable import launch_frontier
    from planner.pipeline import PipelineOptions, graph_loader
    from planner.plan import PlanRequest

    cluster = make_cluster("a100-80gb", devices=2, devices_per_node=2)
    if not bound:
        device = dataclasses.replace(cluster.device, layer_host_s=1e-7, microbatch_host_s=1e-7)
        cluster = dataclasses.replace(cluster, device=device)
    loader = graph_loader(Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx", {"seq": 32})
    frontier = launch_frontier(loader, PlanRequest(cluster=cluster), options=PipelineOptions(global_batch=8), collapse=0.0)
    assert frontier.rows
    share = {"none": 0.0, "mlp": 3 / 13, "selective": 3 / 13, "full": 1.0}  # docs/COST_MODEL.md, "Fixed costs"
    layer_s, micro_batch_s = cluster.device.layer_host_s, cluster.device.microbatch_host_s
    for row in frontier.rows:
        for stage in row.point.stages:  # each stage's floors by hand: L h_layer + h_mb forward, (2 + r) L h_layer back
            layers = stage.layers[1] - stage.layers[0]
            floors = (layers * layer_s + micro_batch_s, (2 + share[row.point.recompute]) * layers * layer_s)
            on_floor = (stage.forward_s == pytest.approx(floors[0], rel=1e-12)
                        and stage.backward_s == pytest.approx(floors[1], rel=1e-12))
            assert on_floor is bound, (row.summary, stage.forward_s, stage.backward_s, floors)
        assert row.host_bound is bound
    data = render.launch_json(frontier, model="gpt2_tiny.onnx")
    assert [r["host_bound"] for r in data["rows"]] == [bound] * len(frontier.rows)
    out = io.StringIO()
    monkeypatch.setattr(render, "stdout", render._StdoutConsole(file=out, width=200, highlight=False, markup=False))
    render.launch_table(frontier, model="gpt2_tiny.onnx", top=None)
    lines = [line for line in out.getvalue().splitlines() if line.startswith("│") and line[1:6].strip()[:1].isdigit()]
    assert len(lines) == len(frontier.rows)
    assert all((" h │" in line.split("│")[2] + "│") is bound for line in lines)
    assert out.getvalue().count("h: the step is bound by the host") == int(bound)
