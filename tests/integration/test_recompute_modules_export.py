"""Megatron-LM's selective recomputation of the MLP (``--fix recompute=mlp``, issue 24 item 5) accepted by
megatron-core's own config code: every Megatron-LM row of GPT-2's frontier pinned to ``mlp`` exports
``--recompute-granularity selective --recompute-modules mlp``, passes Megatron-LM's ``validate_args``
rules (``exporters.megatron.validate``) and builds megatron-core 0.16.1's ``TransformerConfig`` with
``recompute_modules == ["mlp"]`` (``core_transformer_config_from_args`` copies both flags), which
``TransformerLayer`` reads as ``recompute_mlp`` for every dense layer."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from exporters.validate import megatron_violations, parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_megatron_mlp_recompute_rows_build_megatron_core_configs():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "gpt2.onnx", {"batch": 32, "seq": 128}, [request],
                                       launchers=("megatron",), pins=Pins(recompute="mlp"))
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows and all(row.point.recompute == "mlp" for row in rows)
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        assert args["recompute-granularity"] == "selective" and args["recompute-modules"] == ["mlp"]
        world = args["tensor-model-parallel-size"] * args["pipeline-model-parallel-size"] * row.degrees.dp
        assert not [v for v in megatron_violations(args, world_size=world) if "recompute" in v]
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.recompute_granularity == "selective" and config.recompute_modules == ["mlp"]
