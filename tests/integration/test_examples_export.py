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
