"""Each micro-batch replayed as one captured CUDA graph (``TrainingSettings.cuda_graphs``; torchtitan 0.3.0's default
at pp = 1, issue 23 item 1): kernels without host dispatch, no per-layer host floor, no collective setup.

Oracles: the pass formula by hand, ``w + n kappa`` inside a graph against ``max(w + n kappa, n h)`` without, with
the device's 5 us per kernel and 30 us of host dispatch and the bare work ``w`` priced on a device with neither
(an eager LayerNorm: 1 kernel forward, 4 backward: input and parameter gradients and the two parameters' bf16
gradient casts); each collective call's 20 us setup (``Device.collective_overhead_s``) present without a graph
and absent inside one; the host floor of one graph launch (2.5 us) per micro-batch against the preset's
``layer_host_s`` per layer; torchtitan's rule (pp = 1 with graphs, pp > 1 without) and its export's flag.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters.torchtitan.export import torchtitan_cuda_graph_args
from objectives.cluster import make_cluster
from objectives.compute import op_compute_time_s
from objectives.execution import execution_of
from objectives.fixed_costs import GRAPH_LAUNCH_S, host_floor_s
from objectives.graph_facts import _graph_facts, _roles
from objectives.parameters import ParameterView
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.degrees import Pins, parse_fix
from planner.core.errors import InputError, UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.launcher_options import launcher_cuda_graphs
from planner.pipeline import PipelineOptions
from planner.plan import load_graph

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
DEVICES = 4


@pytest.fixture(scope="module")
def models():
    """gpt2_tiny on 4 A100s under the eager engine, launched kernel by kernel and replayed as a graph."""
    graph = load_graph(TINY, {"batch": 4, "seq": 128})
    cluster = make_cluster("a100-80gb", devices=DEVICES)
    return {graphs: build_cost_model(graph, cluster=cluster, price_edges=False,
                                     settings=TrainingSettings(engine="eager", attention="explicit", cuda_graphs=graphs),
                                     config_options=ConfigOptions(devices=DEVICES, devices_per_node=DEVICES))
            for graphs in (False, True)}  # fmt: skip


def test_a_layernorms_passes_by_hand(models):
    eager, graphed = models[False], models[True]
    device = eager.cluster.device
    assert (device.kernel_overhead_s, device.host_dispatch_s) == (5e-6, 3e-5)
    index = next(i for i, op in enumerate(eager.graph.ops) if op.kind == "norm")
    op, space = eager.graph.ops[index], eager.tables.configs[index].subset(np.array([0]))
    tensors, facts = ParameterView(eager.graph), _graph_facts(eager.graph)
    bare = op_compute_time_s(op, space, tensors=tensors, settings=eager.settings, execution=execution_of(eager.settings),
                             role=_roles(eager.graph, facts)[index],
                             device=dataclasses.replace(device, kernel_overhead_s=0.0, host_dispatch_s=0.0))
    work_f, work_b = float(bare.forward_s[0]), float(bare.backward_s[0])
    assert work_f < 25e-6 and work_b < 100e-6  # a short op: host-bound without a graph
    assert float(eager.op_details[index].forward_s[0]) == pytest.approx(max(work_f + 5e-6, 30e-6), rel=1e-12)
    assert float(graphed.op_details[index].forward_s[0]) == pytest.approx(work_f + 5e-6, rel=1e-12)
    # backward: compute = forward + backward (+ the optimizer step, outside the graph and the same in both)
    optimizer = float(eager.op_details[index].optimizer_s[0])
    assert float(graphed.op_details[index].optimizer_s[0]) == optimizer
    backward_off = float(eager.op_details[index].compute_s[0]) - max(work_f + 5e-6, 30e-6) - optimizer
    backward_on = float(graphed.op_details[index].compute_s[0]) - (work_f + 5e-6) - optimizer
    assert backward_off == pytest.approx(max(work_b + 4 * 5e-6, 4 * 30e-6), rel=1e-9)
    assert backward_on == pytest.approx(work_b + 4 * 5e-6, rel=1e-9)


def test_collectives_keep_their_latency_and_lose_their_setup(models):
    eager, graphed = models[False], models[True]
    assert eager.cluster.device.collective_overhead_s == 2e-5
    compared = 0
    for off, on in zip(eager.op_details, graphed.op_details):
        assert off.comm_s.keys() == on.comm_s.keys()
        for key, seconds in off.comm_s.items():
            paid = seconds > 0.0
            np.testing.assert_allclose(seconds[paid] - on.comm_s[key][paid], 2e-5, rtol=1e-9)
            assert np.all(on.comm_s[key][paid] > 0.0)  # the NCCL latency and transfer stay
            compared += int(paid.sum())
    assert compared > 0  # the tensor-parallel splits all-reduce partial sums


def test_host_floor_is_one_graph_launch():
    device = make_cluster("a100-80gb", devices=8).device
    assert device.layer_host_s == pytest.approx(0.9e-3)  # the preset's floor per layer and forward
    forward, backward = host_floor_s([12.0], device=device, recompute="full")
    assert float(forward[0]) == pytest.approx(12 * 0.9e-3 + device.microbatch_host_s)
    assert float(backward[0]) == pytest.approx(3 * 12 * 0.9e-3)
    forward, backward = host_floor_s([12.0], device=device, recompute="full", cuda_graphs=True)
    assert (float(forward[0]), float(backward[0])) == (GRAPH_LAUNCH_S, 0.0) == (2.5e-6, 0.0)


def test_torchtitan_replays_at_pp_1_only():
    options = PipelineOptions(global_batch=16)
    split = launcher_cuda_graphs(options, "torchtitan", ep=1, execution="fused", pinned=None, devices=8)
    assert [(graphs, o.pipeline_sizes) for graphs, o in split] == [(True, (1,)), (False, (2, 4, 8))]
    # expert parallelism (the all-to-all dispatcher syncs with the host), a pin, the plain roofline, other launchers
    for launcher, ep, execution, pinned in (("torchtitan", 2, "fused", None), ("torchtitan", 1, "fused", "off"),
                                            ("torchtitan", 1, None, None), ("megatron", 1, "fused", None)):
        assert launcher_cuda_graphs(options, launcher, ep=ep, execution=execution, pinned=pinned, devices=8) == [(None, options)]


def test_the_export_disables_graphs_exactly_where_priced_without():
    on, off = TrainingSettings(cuda_graphs=True), TrainingSettings()
    assert torchtitan_cuda_graph_args(on, pipelined=False, experts_split=False) == []
    assert torchtitan_cuda_graph_args(off, pipelined=False, experts_split=False) == ["--training.disable_cuda_graphs"]
    with pytest.raises(UnsupportedExport, match="pipeline parallelism"):
        torchtitan_cuda_graph_args(on, pipelined=True, experts_split=False)
    with pytest.raises(UnsupportedExport, match="dispatcher"):
        torchtitan_cuda_graph_args(on, pipelined=False, experts_split=True)


def test_the_pin():
    assert parse_fix("cuda_graphs=off").cuda_graphs == "off"
    with pytest.raises(InputError, match="cuda_graphs must be on or off"):
        parse_fix("cuda_graphs=yes")
    from planner.cli import _cuda_graphs_pin

    with pytest.raises(InputError, match="pipeline parallelism: drop pp=2"):  # torchtitan's; Megatron-LM's layers at any pp
        _cuda_graphs_pin(Pins(cuda_graphs="on", pp=2), "torchtitan", {})
    training: dict = {}
    assert _cuda_graphs_pin(Pins(cuda_graphs="on", pp=2), "megatron", training) == Pins(cuda_graphs="on", pp=2, recompute="none")
    assert training == {"cuda_graphs": True, "cuda_graph_scope": "layers"}
    for refused in (dict(recompute="full"), dict(recompute="selective"), dict(offload="activations")):
        with pytest.raises(InputError, match="Megatron-LM refuses"):
            _cuda_graphs_pin(Pins(cuda_graphs="on", **refused), "megatron", {})
    with pytest.raises(InputError, match="add --target torchtitan or megatron"):
        _cuda_graphs_pin(Pins(cuda_graphs="on"), "deepspeed", {})
    with pytest.raises(InputError, match="cuda_graphs must be true or false"):
        TrainingSettings(cuda_graphs="on")  # type: ignore[arg-type]


def test_the_plan_file_says_so():
    from exporters.generic import _training_section

    assert _training_section(TrainingSettings(cuda_graphs=True))["cuda_graphs"] is True
    assert "cuda_graphs" not in _training_section(TrainingSettings())  # absent: launched kernel by kernel


def test_a_sequence_parallel_boundary_pays_no_setup_inside_a_graph():
    """A row-parallel layer's partial sum into a sequence-split add (``objectives.sequence_split``): the edge carries
    ``RS + AG - AR`` of NCCL's model, each call with its 20 us setup without a graph (one setup more than the
    all-reduce), none inside one, where the boundary keeps only NCCL's extra kernel latency (by hand from
    ``nccl_collective_time_s``)."""
    from objectives.fixed_costs import nccl_collective_time_s
    from tests.objectives.graphs import gpt2_like

    graph = gpt2_like(layers=1, hidden=256, heads=4, vocab=512, positions=128, batch=2, seq=128)
    cluster = make_cluster("a100-80gb", devices=DEVICES)
    built = {graphs: build_cost_model(graph, cluster=cluster, config_options=ConfigOptions(devices=DEVICES, devices_per_node=DEVICES),
                                      settings=TrainingSettings(engine="fused", attention="flash", cuda_graphs=graphs))
             for graphs in (False, True)}  # fmt: skip
    u, v = (next(i for i, op in enumerate(graph.ops) if op.name == name) for name in ("h.0.attn.c_proj", "h.0.add_1"))

    def config(index: int, dim: str) -> int:
        space = built[False].tables.configs[index]
        want = np.array([DEVICES if name == dim else 1 for name in space.dim_names])
        return int(np.flatnonzero(np.all(space.factors == want, axis=1) & (space.replica_counts == 1))[0])

    cu, cv = config(u, "k"), config(v, "s")
    tensor = graph.tensors["h.0.attn.c_proj.out"]
    num_bytes = float(np.prod(tensor.shape)) * 2  # bf16 activations
    rs, ag, ar = (float(nccl_collective_time_s(c, num_bytes, DEVICES, cluster.intra_link))
                  for c in ("reduce_scatter", "all_gather", "all_reduce"))
    setup = cluster.device.collective_overhead_s
    edge = {g: next(e for e in m.tables.edges if (e.u, e.v) == (u, v)).time_s[cu, cv] for g, m in built.items()}
    assert edge[False] == pytest.approx(rs + ag - ar + setup, rel=1e-12)
    assert edge[True] == pytest.approx(rs + ag - ar, rel=1e-12)
    assert 0.0 < edge[True] < edge[False] - 0.99 * setup  # the second call's NCCL latency stays, its setup goes


def test_the_generic_plan_lists_its_graph_priced_rows():
    """``--target generic --fix cuda_graphs=on`` (the headroom line's reproduction of a graph-replayed row): the generic
    plan runs any knob, so its rows are the graph-priced search's own, the fastest exactly the unrestricted search's
    on a cache built with graphs at pp = 1 (before, only its pure data-parallel rows were listed)."""
    from planner.launchable import launch_frontier
    from planner.pipeline import PipelineCostCache, graph_loader
    from planner.plan import PlanRequest
    from planner.search.pipeline import search_pipeline

    loader = graph_loader(TINY, {"seq": 32})
    settings = TrainingSettings(cuda_graphs=True)
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=2), settings=settings)
    options = PipelineOptions(global_batch=4)
    frontier = launch_frontier(loader, request, options=options, launchers=("generic",), pins=Pins(cuda_graphs="on", pp=1),
                               headroom=False, collapse=0.0)
    assert frontier.rows and all(row.cache.settings.cuda_graphs and row.targets == ("generic",) for row in frontier.rows)
    fused = dataclasses.replace(settings, engine=frontier.rows[0].cache.settings.engine,
                                attention=frontier.rows[0].cache.settings.attention)
    oracle = search_pipeline(PipelineCostCache(loader, cluster=request.cluster, settings=fused),
                             options=dataclasses.replace(options, pipeline_sizes=(1,), fill_pipeline=False)).best
    assert frontier.fastest_row.time_s == pytest.approx(oracle.time_s, rel=1e-12)


def test_per_layer_graphs_price_the_layers_as_captured_and_the_rest_launched(models):
    """Megatron-LM's per-layer graphs (``cuda_graph_scope="layers"``): each op of a repeated block is priced as inside
    the whole-step graph (``models[True]``), every other op (embeddings, final norm, head) as launched kernel by kernel
    (``models[False]``), compute and collectives alike; the host floor is one replay per layer and pass plus the
    micro-batch's own 1 ms (the A100 preset's ``microbatch_host_s``)."""
    graph = models[False].graph
    layers = build_cost_model(graph, cluster=models[False].cluster, price_edges=False,
                              settings=TrainingSettings(engine="eager", attention="explicit", cuda_graphs=True,
                                                        cuda_graph_scope="layers"),
                              config_options=ConfigOptions(devices=DEVICES, devices_per_node=DEVICES))
    inside = {i for group in graph.blocks for instance in group.instances for i in instance}
    assert 0 < len(inside) < len(graph.ops)
    for index, detail in enumerate(layers.op_details):
        like = models[index in inside].op_details[index]
        np.testing.assert_array_equal(detail.compute_s, like.compute_s)
        assert detail.comm_s.keys() == like.comm_s.keys()
        for key, seconds in detail.comm_s.items():
            np.testing.assert_array_equal(seconds, like.comm_s[key])
    device = models[False].cluster.device
    forward, backward = host_floor_s([12.0], device=device, cuda_graphs=True, scope="layers")
    assert (float(forward[0]), float(backward[0])) == pytest.approx((12 * 2.5e-6 + 1e-3, 12 * 2.5e-6), rel=1e-12)
    assert device.microbatch_host_s == 1e-3
