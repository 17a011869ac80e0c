"""FP8 rows exported to Megatron-LM with ``--fp8-param-gather`` (issue 24 item 3), accepted by megatron-core
0.16.1's own config code: every FP8 row of llama_tiny's Megatron frontier on 4 H100s builds
``TransformerConfig(fp8=..., fp8_param=...)`` (``core_transformer_config_from_args`` maps
``--fp8-param-gather`` to ``fp8_param``) and ``DistributedDataParallelConfig(fp8_param_gather=...)`` with the
distributed optimizer or Megatron-FSDP the row names; a ZeRO-1+ row, priced with FP8 gathers, carries the
flag. megatron-core's own rule that the flag needs FP8 is the validator's message."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.settings import TrainingSettings
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_megatron_fp8_rows_build_megatron_core_configs():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.distributed import DistributedDataParallelConfig
    from megatron.core.transformer.transformer_config import TransformerConfig

    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=4), settings=TrainingSettings(fp8="delayed"))
    _, (found,) = plan_launchable_file(ROOT / "tests" / "data" / "llama_tiny.onnx", {"batch": 8, "seq": 128}, [request],
                                       launchers=["megatron"], pins=Pins(pp=1), collapse=0.0)
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows and any(row.point.zero_stage >= 1 for row in rows)
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        gathers = row.point.zero_stage >= 1
        assert bool(args.get("fp8-param-gather")) == gathers == row_plan_input(row).settings.gathers_fp8
        config = TransformerConfig(
            **_transformer_config_kwargs(args), fp8=args["fp8-format"], fp8_recipe=args["fp8-recipe"],
            fp8_amax_history_len=args["fp8-amax-history-len"], fp8_amax_compute_algo=args["fp8-amax-compute-algo"],
            fp8_param=bool(args.get("fp8-param-gather")),
        )
        assert config.fp8 == "hybrid" and config.fp8_param == gathers
        ddp = DistributedDataParallelConfig(
            use_distributed_optimizer=bool(args.get("use-distributed-optimizer")),
            use_megatron_fsdp=bool(args.get("use-megatron-fsdp")),
            data_parallel_sharding_strategy=args.get("data-parallel-sharding-strategy", "no_shard"),
            fp8_param_gather=bool(args.get("fp8-param-gather")),
        )
        assert ddp.fp8_param_gather == gathers
        if gathers:  # Megatron-LM's validate_args: the distributed optimizer or an FSDP
            assert ddp.use_distributed_optimizer or ddp.use_megatron_fsdp
            with pytest.raises(ValueError, match="fp8_param must be used together with fp8 mode."):
                TransformerConfig(**_transformer_config_kwargs(args), fp8_param=True)
