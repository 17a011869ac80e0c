"""A launcher's priced settings built in one place (``Target.priced_settings``): ``planner estimate --target`` and
``pipeline_search(target=...)`` price torchtitan's one-stage rows replayed as a CUDA graph, as the launchable search
does (issue 23 item 1).

Oracles: the launchable table's own row (torchtitan, dp=4, mb=2, ZeRO-0 on llama_tiny, 4 A100s), its seconds equal to
the estimate of the same configuration, with graphs (torchtitan's default at pp = 1) and with ``--fix cuda_graphs=off``
against ``--no-cuda-graphs``; the search's best against an unrestricted search on a cache built with graphs by hand.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.launcher_options import launcher_execution
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader, pipeline_search
from planner.plan import PlanRequest

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"


@pytest.fixture(scope="module")
def setup():
    loader = graph_loader(LLAMA, {"seq": 32})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4))
    execution = launcher_execution("torchtitan", loader(8), None, None, request.cluster.device)
    return loader, request, TrainingSettings(engine=execution.engine, attention=execution.attention)


def test_priced_settings_replay_torchtitans_one_stage_plans():
    fused = TrainingSettings(engine="fused", attention="flex")
    titan, megatron = TARGETS["torchtitan"], TARGETS["megatron"]
    assert titan.priced_settings(fused).cuda_graphs is True  # pp = 1: torchtitan's default
    assert titan.priced_settings(fused, pp=2).cuda_graphs is False  # _validate_cuda_graphs: no pipeline
    assert titan.priced_settings(fused, cuda_graphs=False).cuda_graphs is False  # --fix cuda_graphs=off
    assert titan.priced_settings(TrainingSettings()).cuda_graphs is False  # the plain roofline prices no launch
    assert titan.priced_settings(TrainingSettings(engine="fused", expert_parallel=2)).cuda_graphs is False
    assert megatron.priced_settings(fused) is fused  # no rule of its own changes anything
    pinned = megatron.priced_settings(fused, pp=4, cuda_graphs=True)  # --fix cuda_graphs=on: its per-layer graphs
    assert (pinned.cuda_graphs, pinned.cuda_graph_scope) == (True, "layers")


@pytest.mark.parametrize("pinned", [None, "off"])
def test_an_estimate_is_the_table_row(setup, pinned):
    from planner.launchable import launch_frontier

    loader, request, settings = setup
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=8), launchers=("torchtitan",),
                               pins=Pins(dp=4, zero=0, mb=2, recompute="none", cuda_graphs=pinned), headroom=False,
                               collapse=0.0)
    row = next(r for r in frontier.rows if r.point.pp == 1 and r.degrees.dp == 4 and r.point.zero_stage == 0)
    assert row.cache.settings.cuda_graphs is (pinned is None)
    found = estimate(loader, cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, settings=settings,
                     target="torchtitan", cuda_graphs=None if pinned is None else False)
    assert found.valid and found.point.time_s == pytest.approx(row.time_s, rel=1e-12)


def test_a_pinned_graph_is_refused_under_a_pipeline(setup):
    loader, request, settings = setup
    found = estimate(loader, cluster=request.cluster, tp=1, pp=2, micro_batch=1, global_batch=8, settings=settings,
                     target="torchtitan", cuda_graphs=True)
    assert not found.valid and found.reason == "torchtitan replays no pipeline as a CUDA graph (pp=2); use --pp 1 or --no-cuda-graphs"


def test_pipeline_search_replays_torchtitans_one_stage_plans(setup):
    loader, request, settings = setup
    one = PipelineOptions(global_batch=8, pipeline_sizes=(1,), recompute=("none",))
    result = pipeline_search(loader, cluster=request.cluster, options=one, settings=settings, target="torchtitan")
    assert result.cache.settings.cuda_graphs
    by_hand = PipelineCostCache(loader, cluster=request.cluster, settings=TrainingSettings(
        engine=settings.engine, attention=settings.attention, cuda_graphs=True))
    oracle = pipeline_search(by_hand, cluster=request.cluster, options=one, target="torchtitan")
    assert result.best.time_s == pytest.approx(oracle.best.time_s, rel=1e-12)
    deeper = pipeline_search(loader, cluster=request.cluster, settings=settings, target="torchtitan",
                             options=PipelineOptions(global_batch=8, pipeline_sizes=(2,), recompute=("none",)))
    assert not deeper.cache.settings.cuda_graphs
    with pytest.raises(InputError, match="search them apart"):
        pipeline_search(loader, cluster=request.cluster, options=PipelineOptions(global_batch=8), settings=settings,
                        target="torchtitan")


def test_megatrons_per_layer_graphs_estimate_as_the_row(setup):
    """``--fix cuda_graphs=on --target megatron`` (per-layer graphs) against ``planner estimate --target megatron
    --cuda-graphs``: the same seconds (gpt2's launcher, Megatron-LM's kernels); recomputation refused as Megatron does."""
    from planner.launchable import launch_frontier

    loader, request, _ = setup
    execution = launcher_execution("megatron", loader(8), None, None, request.cluster.device)
    plain = TrainingSettings(engine=execution.engine, attention=execution.attention)
    layers = PlanRequest(cluster=request.cluster, settings=TrainingSettings(cuda_graphs=True, cuda_graph_scope="layers"))
    frontier = launch_frontier(loader, layers, options=PipelineOptions(global_batch=8), launchers=("megatron",),
                               pins=Pins(dp=4, zero=1, mb=2, recompute="none", cuda_graphs="on"), headroom=False,
                               collapse=0.0)
    row = next(r for r in frontier.rows if r.point.pp == 1 and r.degrees.dp == 4 and r.point.zero_stage == 1)
    assert row.cache.settings.cuda_graph_scope == "layers"
    found = estimate(loader, cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, zero=1, settings=plain,
                     target="megatron", cuda_graphs=True)
    assert found.point.time_s == pytest.approx(row.time_s, rel=1e-12)
    refused = estimate(loader, cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, settings=plain,
                       target="megatron", cuda_graphs=True, recompute="full")
    assert refused.reason == "megatron refuses recompute full with per-layer CUDA graphs; use --recompute none or --no-cuda-graphs"


@pytest.mark.parametrize("launcher", ["deepspeed", "meshtf", "dtensor"])
def test_a_pinned_graph_is_refused_for_a_launcher_that_captures_none(setup, launcher):
    """``planner plan --fix cuda_graphs=on`` takes torchtitan and Megatron-LM only; the estimate of another launcher's
    row with ``--cuda-graphs`` is refused alike, not priced as a replay its launcher never runs."""
    loader, request, settings = setup
    found = estimate(loader, cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, settings=settings,
                     target=launcher, cuda_graphs=True)
    assert not found.valid
    assert found.reason == f"{launcher} captures no CUDA graph; use --target torchtitan or megatron, or --no-cuda-graphs"


def test_megatrons_per_layer_graphs_refuse_an_moe_model():
    """``planner plan --fix cuda_graphs=on --target megatron`` exports no row of an MoE model (its graphs need
    drop-and-pad experts): the estimate refuses it alike (Mixtral-tiny, 4 experts per layer), and prices it without."""
    mixtral = graph_loader(LLAMA.parent / "mixtral_tiny.onnx", {"seq": 32})
    cluster = make_cluster("a100-80gb", devices=4)
    kwargs = dict(cluster=cluster, tp=1, pp=1, micro_batch=2, global_batch=8, target="megatron")
    refused = estimate(mixtral, cuda_graphs=True, **kwargs)
    assert refused.reason == ("megatron captures an MoE layer as a CUDA graph only with drop-and-pad experts; "
                              "use --no-cuda-graphs")
    assert estimate(mixtral, cuda_graphs=False, **kwargs).valid
