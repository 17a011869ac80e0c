"""Tensor-parallel communication overlap (``--fix tp_overlap=on``, ``objectives.tp_overlap``) accepted by
Megatron-LM's own config code: every row of GPT-2's Megatron-LM frontier priced with the overlap splits
the sequence wherever ``tp > 1``, writes ``--tp-comm-overlap`` exactly there, passes Megatron-LM's
``validate_args`` rules (``exporters.megatron.validate``) and builds megatron-core 0.16.1's
``TransformerConfig`` with ``tp_comm_overlap`` and ``sequence_parallel`` set, as
``core_transformer_config_from_args`` copies both flags."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from exporters.validate import megatron_violations, parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.settings import TrainingSettings
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.exporters.test_megatron import _transformer_config_kwargs

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_megatron_rows_with_tp_overlap_build_megatron_core_configs():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    from megatron.core.transformer.transformer_config import TransformerConfig

    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=8), settings=TrainingSettings(tp_comm_overlap=True))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "gpt2.onnx", {"batch": 32, "seq": 128}, [request],
                                       launchers=("megatron",))
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows and any(row.degrees.tp > 1 for row in rows)
    for row in rows:
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        tp = args["tensor-model-parallel-size"]
        assert bool(args.get("tp-comm-overlap")) == (tp > 1) and bool(args.get("sequence-parallel")) == (tp > 1)
        world = tp * args["pipeline-model-parallel-size"] * row.degrees.dp
        assert not [v for v in megatron_violations(args, world_size=world) if "tp-comm-overlap" in v]
        config = TransformerConfig(**_transformer_config_kwargs(args), tp_comm_overlap=bool(args.get("tp-comm-overlap")))
        assert config.tp_comm_overlap == (tp > 1) and config.sequence_parallel == (tp > 1)
