"""Megatron-LM's per-layer CUDA graphs (``--fix cuda_graphs=on --target megatron``, issue 23 item 1) checked by
megatron-core 0.16.1 itself: every row of the graph-priced frontier exports ``--cuda-graph-impl transformer_engine
--te-rng-tracker`` and its TransformerConfig builds with Transformer Engine's graphs over the whole layer (the default
scope); and the combinations the planner refuses (recomputation full, selective or mlp; activation offload) are exactly
those TransformerConfig.__post_init__ refuses with graphs and accepts without."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.launchable import export_row, launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

GPT2 = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
LAYERS = TrainingSettings(cuda_graphs=True, cuda_graph_scope="layers")


def _config(args: dict, **extra):
    from megatron.core.transformer.transformer_config import TransformerConfig

    kwargs = _transformer_config_kwargs(args)
    if "cuda-graph-impl" in args:  # core_transformer_config_from_args: the field of the same name
        kwargs.update(cuda_graph_impl=args["cuda-graph-impl"], use_te_rng_tracker=bool(args.get("te-rng-tracker")))
    return TransformerConfig(**{**kwargs, **extra})


def _frontier(pp: int | None):
    loader = graph_loader(GPT2, {"seq": 32})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=LAYERS)
    return launch_frontier(loader, request, options=PipelineOptions(global_batch=8), launchers=("megatron",),
                           pins=Pins(cuda_graphs="on", recompute="none", pp=pp), headroom=False)


@pytest.fixture(scope="module")
def frontier():
    return _frontier(None)


def test_every_graph_priced_row_is_accepted_by_megatron_core(frontier):
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.enums import CudaGraphScope  # noqa: F401  (the scope's type, whole layer: [])

    pipelined = _frontier(2)  # Transformer Engine's graphs run under a pipeline too (one per layer and micro-batch)
    assert frontier.rows and pipelined.rows and {row.point.pp for row in pipelined.rows} == {2}
    for found in (frontier, pipelined):
        for index, row in enumerate(found.rows):
            assert row.cache.settings.cuda_graphs and row.cache.settings.cuda_graph_scope == "layers"
            args = parse_megatron_args(export_row(found, index, "megatron")["args"])
            assert (args["cuda-graph-impl"], args["te-rng-tracker"]) == ("transformer_engine", True)
            config = _config(args)
            assert config.cuda_graph_impl == "transformer_engine" and config.cuda_graph_scope == []  # the whole layer
            assert config.pipeline_model_parallel_size == row.point.pp


@pytest.mark.parametrize("recompute, extra", [
    ("full", dict(recompute_granularity="full", recompute_method="uniform", recompute_num_layers=1)),
    ("selective", dict(recompute_granularity="selective")),  # core_attn, with the default attention dropout 0.1
    ("mlp", dict(recompute_granularity="selective", recompute_modules=["mlp"])),  # hidden dropout 0.1
    ("activations", dict(cpu_offloading=True, cpu_offloading_num_layers=1)),
])
def test_what_the_planner_refuses_megatron_core_refuses(frontier, recompute, extra):
    pytest.importorskip("megatron.core")
    from exporters.megatron.export import megatron_cuda_graph_args

    args = parse_megatron_args(export_row(frontier, 0, "megatron")["args"])
    _config({k: v for k, v in args.items() if k not in ("cuda-graph-impl", "te-rng-tracker")}, **extra)  # fine without
    with pytest.raises((AssertionError, ValueError)):
        _config(args, **extra)
    settings = TrainingSettings(cuda_graphs=True, cuda_graph_scope="layers", **(
        {"offload": "activations"} if recompute == "activations" else {"recompute": recompute}))
    with pytest.raises(UnsupportedExport, match="plan with --fix cuda_graphs=off"):
        megatron_cuda_graph_args(settings, experts=False)
