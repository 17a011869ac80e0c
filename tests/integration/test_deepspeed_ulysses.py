"""DeepSpeed's own code accepts the Ulysses exports: ``DeepSpeedConfig`` with the ``mpu`` that
``UlyssesSPAttentionHF.register_with_transformers`` returns (its batch checked against ``world / cp``
ranks), and ``UlyssesSPAttentionHF`` built at the export's heads and degree (its divisibility checks)."""

from __future__ import annotations

from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import launch_frontier, row_plan_input
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def exports():
    loader = graph_loader(ROOT / "tests" / "data" / "llama_tiny.onnx", {"seq": 4096})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8, devices_per_node=8))
    outs = []
    for cp in (2, 4):
        found = launch_frontier(loader, request, options=PipelineOptions(global_batch=8), launchers=("deepspeed",),
                                pins=Pins(cp=cp))
        assert found.rows
        outs += [(row, export("deepspeed", row_plan_input(row))) for row in found.rows]
    return outs


def test_deepspeed_config_counts_world_over_cp(exports, monkeypatch):
    torch = pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_runtime_config

    for row, out in exports:
        world, cp = out["world_size"], out["degrees"]["cp"]
        monkeypatch.setattr(ds_runtime_config, "dist",
                            SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, w=world, **k: w))
        # the mpu of parallel_state_sp: no get_data_parallel_world_size, so the world is divided by cp
        mpu = SimpleNamespace(get_sequence_parallel_world_size=lambda c=cp: c)
        config = ds_runtime_config.DeepSpeedConfig(out["ds_config"], mpu=mpu)
        assert config.world_size == world // cp == row.degrees.dp
        assert config.train_batch_size == config.train_micro_batch_size_per_gpu * row.point.micro_batches * row.degrees.dp
        assert config.zero_optimization_stage == row.point.zero_stage
        # the engine reduces every gradient in this dtype under Ulysses (DeepSpeedEngine._configure_distributed_model)
        assert config.seq_parallel_communication_data_type == torch.bfloat16


def test_ulysses_attention_accepts_the_heads(exports, monkeypatch):
    pytest.importorskip("torch")
    pytest.importorskip("transformers")
    ulysses_sp = pytest.importorskip("deepspeed.runtime.sequence_parallel.ulysses_sp")

    from importers.transformer import analyze_transformer

    for row, out in exports:
        cp = out["ulysses"]["sequence_parallel_size"]
        model = analyze_transformer(row_plan_input(row).graph)
        monkeypatch.setattr(ulysses_sp, "register_all_to_all_group", lambda group: None)
        monkeypatch.setattr(ulysses_sp.dist, "get_world_size", lambda group=None, c=cp: c)
        monkeypatch.setattr(ulysses_sp.dist, "get_rank", lambda group=None: 0)
        attention = ulysses_sp.UlyssesSPAttentionHF(
            attn=None, batch_size=1, attn_head_count=model.num_attention_heads, attn_head_size=model.head_dim,
            kv_head_count=model.num_query_groups, num_hidden_layers=model.num_layers, process_group=None,
            seq_length_is_variable=False, local_seq_length=model.seq_length // cp, global_seq_length=model.seq_length,
        )
        assert attention.local_q_head_count == model.num_attention_heads // cp
