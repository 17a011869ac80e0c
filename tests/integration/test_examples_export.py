"""Issue 6's acceptance check on the bundled examples: at 8, 16 and 64 devices, every frontier point
of ``--target megatron`` and ``--target deepspeed`` exports, passes our validator (run inside every
export) and is accepted by the real library (megatron-core's TransformerConfig and micro-batch
calculator; DeepSpeed's DeepSpeedConfig at the plan's world size)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.export import plan_input, target_filter
from planner.plan import PlanRequest, load_graph, plan
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
DIMS = {"batch": 64, "seq": 128}


@pytest.fixture(scope="module")
def graphs():
    return {name: load_graph(ROOT / "examples" / f"{name}.onnx", DIMS) for name in ("gpt2", "llama")}


def _frontier(graph, devices: int, target: str):
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), method="frontier", epsilon=0.05)
    return plan(graph, request, target_filter=target_filter(target), with_targets=False)


@pytest.mark.parametrize("devices", [8, 16, 64])
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_every_megatron_frontier_point_is_accepted_by_megatron_core(graphs, model, devices):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    result = _frontier(graphs[model], devices, "megatron")
    assert result.points
    for index in range(len(result.points)):
        out = export("megatron", plan_input(result, index))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.tensor_model_parallel_size == out["degrees"]["tp"]
        calculator = ConstantNumMicroBatchesCalculator(
            args["global-batch-size"], args["micro-batch-size"], out["degrees"]["dp"], False, 0
        )
        assert calculator.get() == out["batch"]["num_microbatches"]


@pytest.mark.parametrize("devices", [8, 16, 64])
@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_every_deepspeed_frontier_point_is_accepted_by_deepspeed(graphs, model, devices, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_runtime_config

    result = _frontier(graphs[model], devices, "deepspeed")
    assert result.points
    for index in range(len(result.points)):
        out = export("deepspeed", plan_input(result, index))
        world = out["world_size"]
        # No process group on CPU: stub dist so DeepSpeedConfig checks the batch at the plan's world size.
        monkeypatch.setattr(
            ds_runtime_config, "dist",
            SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, w=world, **k: w),
        )
        config = ds_runtime_config.DeepSpeedConfig(out["ds_config"])
        assert config.gradient_accumulation_steps == out["batch"]["gradient_accumulation_steps"]


# ---------------------------------------------------------------------------------------------
# Issue 8: pipeline plans of the same examples, exported and checked by the libraries. The frontier
# rows a target runs (gpt2 on 4 devices has pure pipelines among them), and Megatron-style
# configurations priced by planner.estimate on 8 devices: even, uneven first/last, layout,
# interleaved, ZeRO-1 with full recomputation.

ESTIMATES = [
    dict(tp=2, pp=2),
    dict(tp=1, pp=4),
    dict(tp=1, pp=4, stage_layers="first-last"),
    dict(tp=1, pp=4, stage_layers="layout"),
    dict(tp=2, pp=2, schedule="interleaved", chunks=2),
    dict(tp=2, pp=2, schedule="interleaved", chunks=2, stage_layers="first-last"),
    dict(tp=1, pp=2, zero=1, recompute="full"),
]
SPLITS = {  # per layer count: (uneven first/last, uneven middle)
    12: {"first-last": (2, 4, 4, 2), "layout": (4, 2, 3, 3), "first-last-2": (4, 8)},
    8: {"first-last": (1, 3, 3, 1), "layout": (3, 1, 2, 2), "first-last-2": (2, 6)},
}


@pytest.fixture(scope="module")
def caches():
    from planner.pipeline import PipelineCostCache, graph_loader

    found = {}

    def get(model: str, devices: int):
        if (model, devices) not in found:
            loader = graph_loader(ROOT / "examples" / f"{model}.onnx", {"seq": DIMS["seq"]})
            found[model, devices] = PipelineCostCache(loader, cluster=make_cluster("a100-80gb", devices=devices))
        return found[model, devices]

    return get


def _pipeline_inputs(caches, model: str, target: str):
    """(point, plan input) of every frontier row (4 devices) and estimated configuration (8) ``target`` runs."""
    from exporters import runnable_targets
    from planner.estimate import estimate
    from planner.pipeline import point_plan_input
    from planner.pipeline import PipelineCostCache, PipelineOptions, pipeline_search

    from exporters.targets import TARGETS

    # DeepSpeed runs a plan priced with its BF16_Optimizer accumulator (exporters.deepspeed.bf16_optimizer):
    # its rows come from its own search and its estimates carry the rule
    rules = {"grad_accumulator": TARGETS["deepspeed"].grad_accumulator} if target == "deepspeed" else {}
    cache = caches(model, 4)
    result = pipeline_search(cache, cluster=cache.cluster, options=PipelineOptions(global_batch=16),
                             target="deepspeed" if target == "deepspeed" else None)
    inputs = [(p, point_plan_input(p, cache)) for p in result.points]
    cache = caches(model, 8)
    layers = cache.structure(64).num_layers
    for kwargs in ESTIMATES:
        kwargs = dict(kwargs)
        if "stage_layers" in kwargs:
            key = kwargs["stage_layers"] + ("-2" if kwargs["pp"] == 2 else "")
            kwargs["stage_layers"] = SPLITS[layers][key]
        # Megatron-LM's estimates as its search prices them: interleaved transfers overlapped (Target.priced_p2p_overlap)
        priced = TARGETS["megatron"].priced_settings(cache.settings, pp=kwargs["pp"], chunks=kwargs.get("chunks", 1))
        here = cache if target != "megatron" or priced is cache.settings else PipelineCostCache(
            cache.graph_at_batch, cluster=cache.cluster, settings=priced)
        found = estimate(here, cluster=cache.cluster, micro_batch=1, global_batch=64, **kwargs, **rules)
        assert found.valid, (kwargs, found.reason)
        inputs.append((found.point, point_plan_input(found.point, here)))
    return [(p, i) for p, i in inputs if target in runnable_targets(i)]


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_pipeline_exports_build_their_stages_in_megatron_core(caches, model):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    from tests.exporters.test_megatron import _megatron_layers_per_rank

    inputs = _pipeline_inputs(caches, model, "megatron")
    flags = set()
    for point, plan_input in inputs:
        out = export("megatron", plan_input)
        args = parse_megatron_args(out["args"])
        flags |= {a for a in out["args"] if "pipeline" in a}
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.pipeline_model_parallel_size == point.pp
        assert (config.virtual_pipeline_model_parallel_size or 1) == (point.chunks if point.pp > 1 else 1)
        assert config.overlap_p2p_comm == bool(plan_input.settings.p2p_overlap and point.pp > 1 and point.chunks > 1)
        assert _megatron_layers_per_rank(config) == list(point.layers_per_stage)
        calculator = ConstantNumMicroBatchesCalculator(
            args["global-batch-size"], args["micro-batch-size"], out["degrees"]["dp"], False, 0
        )
        assert calculator.get() == point.micro_batches
    # every way of writing a stage split was exercised
    assert {"--decoder-first-pipeline-num-layers", "--pipeline-model-parallel-layout", "--num-layers-per-virtual-pipeline-stage",
            "--num-virtual-stages-per-pipeline-rank"} <= flags


@pytest.mark.parametrize("model", ["gpt2", "llama"])
def test_pipeline_exports_pass_deepspeed_config(caches, model, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_runtime_config
    from deepspeed.runtime.utils import partition_balanced

    inputs = _pipeline_inputs(caches, model, "deepspeed")
    assert sum(point.pp > 1 for point, _ in inputs) >= 3
    for point, plan_input in inputs:
        out = export("deepspeed", plan_input)
        dp = out["degrees"]["dp"]
        # PipelineEngine checks the batch against the pipe topology's data-parallel size.
        monkeypatch.setattr(
            ds_runtime_config, "dist", SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, w=dp, **k: w)
        )
        config = ds_runtime_config.DeepSpeedConfig(out["ds_config"])
        assert config.gradient_accumulation_steps == point.micro_batches
        assert config.train_batch_size == config.train_micro_batch_size_per_gpu * point.micro_batches * dp
        pipe = out["pipeline"]
        if pipe is not None and pipe["partition_method"].startswith("type:"):
            # PipelineModule(partition_method="type:BlockPipe") balances the block indicator
            weights = [0] + [1] * sum(point.layers_per_stage) + [0]
            assert partition_balanced(weights, point.pp) == pipe["parts"]
