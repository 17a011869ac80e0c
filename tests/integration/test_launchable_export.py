"""Issue 22's oracle with the real launchers: every row of the default launchable table that lists
Megatron-LM or DeepSpeed exports, and megatron-core's TransformerConfig and micro-batch calculator
(stage layers included) or DeepSpeed's DeepSpeedConfig accept the export at the plan's world size."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _megatron_layers_per_rank, _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=[("gpt2", 8), ("llama", 16)])
def frontier(request):
    model, devices = request.param
    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / f"{model}.onnx", {"batch": 32, "seq": 128}, [plan_request])
    assert found.rows
    return found


def test_every_megatron_row_is_accepted_by_megatron_core(frontier):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
    from megatron.core.transformer.transformer_config import TransformerConfig

    rows = [row for row in frontier.rows if "megatron" in row.targets]
    assert rows
    for row in rows:
        out = export("megatron", row_plan_input(row))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.tensor_model_parallel_size == row.degrees.tp
        assert config.pipeline_model_parallel_size == row.point.pp
        if row.point.pp > 1:
            assert _megatron_layers_per_rank(config) == list(row.point.layers_per_stage)
        calculator = ConstantNumMicroBatchesCalculator(
            args["global-batch-size"], args["micro-batch-size"], out["degrees"]["dp"], False, 0
        )
        assert calculator.get() == row.point.micro_batches


def deepspeed_config(out: dict, monkeypatch):
    """DeepSpeed's own ``DeepSpeedConfig`` of an export. No process group on CPU: ``dist`` is stubbed so
    it checks the batch against the data-parallel size (the pipe topology's or AutoTP's, as the engines
    check it)."""
    import deepspeed.runtime.config as ds_runtime_config

    dp = out["degrees"]["dp"]
    monkeypatch.setattr(
        ds_runtime_config, "dist", SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, w=dp, **k: w),
    )
    return ds_runtime_config.DeepSpeedConfig(out["ds_config"])


def test_every_deepspeed_row_is_accepted_by_deepspeed(frontier, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")

    rows = [row for row in frontier.rows if "deepspeed" in row.targets]
    for row in rows:
        out = export("deepspeed", row_plan_input(row))
        dp = out["degrees"]["dp"]
        config = deepspeed_config(out, monkeypatch)
        assert config.gradient_accumulation_steps == row.point.micro_batches
        assert config.train_batch_size == config.train_micro_batch_size_per_gpu * row.point.micro_batches * dp
        assert dp == row.degrees.dp
