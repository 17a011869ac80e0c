"""CPU offload rows (issue 24 item 4, objectives.offload) accepted by the launchers' own config code:
every row of GPT-2's frontier with ``--fix offload=optimizer`` / ``offload=activations`` that lists
Megatron-LM builds megatron-core's ``TransformerConfig`` (activation offload: ``cpu_offloading`` with
``cpu_offloading_num_layers``, as Megatron-LM's ``validate_args`` sets it) and ``OptimizerConfig`` (the
CPU optimizer), and every DeepSpeed row builds ``DeepSpeedConfig`` with ``offload_optimizer.device cpu``."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs
from tests.integration.test_launchable_export import deepspeed_config

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module", params=["optimizer", "activations"])
def frontier(request):
    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "gpt2.onnx", {"batch": 32, "seq": 128}, [plan_request],
                                       pins=Pins(offload=request.param))
    assert found.rows and all(row.offload == request.param for row in found.rows)
    return found


def test_megatron_offload_rows_build_megatron_core_configs(frontier, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import megatron.core.optimizer.optimizer_config as optimizer_config
    from megatron.core.optimizer import OptimizerConfig

    # the precision-aware optimizer asks Transformer Engine's version, which this CPU environment lacks;
    # a Megatron-LM container has TE >= 2.1 (the CPU-offload path returns before TE's Adam is checked)
    monkeypatch.setattr(optimizer_config, "is_te_min_version", lambda *a, **k: True)
    from megatron.core.transformer.transformer_config import TransformerConfig

    rows = [row for row in frontier.rows if "megatron" in row.targets]
    assert rows
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        if row.offload == "activations":
            assert config.cpu_offloading and config.cpu_offloading_num_layers == args["num-layers"] - 1
            continue
        optimizer = OptimizerConfig(
            optimizer="adam", lr=1e-4, bf16=True, use_distributed_optimizer=bool(args.get("use-distributed-optimizer")),
            optimizer_cpu_offload=True, optimizer_offload_fraction=float(args["optimizer-offload-fraction"]),
            use_precision_aware_optimizer=bool(args.get("use-precision-aware-optimizer")),
            overlap_cpu_optimizer_d2h_h2d=bool(args.get("overlap-cpu-optimizer-d2h-h2d")),
        )
        assert optimizer.optimizer_cpu_offload and optimizer.optimizer_offload_fraction == 1.0


@pytest.mark.parametrize("offload", ["optimizer", "activations"])
def test_deepspeed_offload_rows_build_deepspeed_configs(offload, monkeypatch):
    """DeepSpeed's own search (its rows need not be on the every-launcher frontier, where Megatron-LM's
    may dominate them)."""
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")

    plan_request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "gpt2.onnx", {"batch": 32, "seq": 128}, [plan_request],
                                       pins=Pins(offload=offload), launchers=("deepspeed",))
    rows = [row for row in found.rows if "deepspeed" in row.targets]
    if offload == "activations":
        assert not rows  # DeepSpeed offloads no activations outside its checkpointing
        return
    assert rows and all(row.offload == "optimizer" for row in rows)
    for row in rows:
        config = deepspeed_config(export("deepspeed", row_plan_input(row)), monkeypatch)
        assert config.zero_config.offload_optimizer.device == "cpu"
        assert config.zero_optimization_stage >= 1
