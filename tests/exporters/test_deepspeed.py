"""Tests of exporters.deepspeed: ZeRO data parallelism for any model, AutoTP for transformers, the
refusals, and the helpers of its deepspeed cross-checks (tests/integration/test_deepspeed_config.py)."""

from __future__ import annotations

import dataclasses
import re

import numpy as np
import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed, pipeline_parts
from exporters.megatron import megatron_masks
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import (
    cnn_graph,
    first_rows,
    gpt_graph,
    llama_graph,
    make_cluster,
    make_input,
    pipeline_spec,
    set_split,
    spaces_for,
)

P = r"^model\.layers\.\d+\."
COLUMN = [P + r"mlp\.gate_proj\.weight$", P + r"mlp\.up_proj\.weight$", P + r"self_attn\.k_proj\.weight$", P + r"self_attn\.q_proj\.weight$", P + r"self_attn\.v_proj\.weight$"]
ROW = [P + r"mlp\.down_proj\.weight$", P + r"self_attn\.o_proj\.weight$"]


def _choice(graph, spaces, dp, tp):
    return first_rows(deepspeed_masks(graph, spaces, dp=dp, tp=tp))


class TestMasks:
    def test_autotp_keeps_embeddings_and_head_replicated(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        masks = deepspeed_masks(g, spaces, dp=2, tp=2)
        allowed = {op.name: [s.describe(int(r)) for r in np.flatnonzero(m)] for op, s, m in zip(g.ops, spaces, masks)}
        assert allowed["tok_emb"] == [{"i0": 2}] and allowed["lm_head"] == [{"b0": 2}]
        assert allowed["q_0"] == [{"b0": 2, "n": 2}] and allowed["o_proj_0"] == [{"b0": 2, "k_0": 2}]
        assert allowed["norm1_0"] == [{"d0": 2}] and allowed["mul_0"] == [{"d0": 2, "d2": 2}]

    def test_any_model_at_tp1(self):
        g = cnn_graph()
        masks = deepspeed_masks(g, spaces_for(g, 4), dp=4, tp=1)
        assert masks is not None and all(m.sum() == 1 for m in masks)
        assert deepspeed_masks(g, spaces_for(g, 4), dp=2, tp=2) is None

    @pytest.mark.parametrize(
        ("graph", "tp"),
        [(gpt_graph(), 2), (llama_graph(heads=8, kv_heads=2), 4)],
        ids=["conv1d-weights", "kv-heads"],
    )
    def test_autotp_limits(self, graph, tp):
        assert deepspeed_masks(graph, spaces_for(graph, tp), dp=1, tp=tp) is None


class TestExport:
    @pytest.mark.parametrize("named", [True, False], ids=["named-linear", "anonymous-with-module-paths"])
    def test_llama_autotp(self, named):
        g = llama_graph(named_weights=named)
        spaces = spaces_for(g, 4)
        out = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 2, 2)))
        assert out["ds_config"] == {
            "train_batch_size": 16,  # 4 per GPU x 1 step x all 4 ranks (config-only AutoTP counts every rank)
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 1,
            "zero_optimization": {"stage": 0},
            "bf16": {"enabled": True},
            "tensor_parallel": {
                "autotp_size": 2,
                "partition_config": {
                    "use_default_specs": False,
                    "layer_specs": [{"patterns": COLUMN, "partition_type": "column"}, {"patterns": ROW, "partition_type": "row"}],
                },
            },
        }
        assert out["command"] == "deepspeed --num_gpus 4 train.py --deepspeed --deepspeed_config ds_config.json"
        assert out["batch"]["samples_per_step"] == 8
        assert any("counts all 4 ranks; a step takes 8 samples" in n for n in out["notes"])

    def test_patterns_match_exactly_the_sharded_layers(self):
        g = llama_graph(layers=3)
        spaces = spaces_for(g, 4)
        specs = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 2, 2)))["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
        kind = {}
        for spec in specs:
            for name in (t for t in g.tensors if t.endswith(".weight")):
                if any(re.match(p, name) for p in spec["patterns"]):
                    kind[name] = spec["partition_type"]
        by_suffix = {n.split(".", 3)[-1]: k for n, k in kind.items()}
        assert by_suffix == {
            "self_attn.q_proj.weight": "column", "self_attn.k_proj.weight": "column", "self_attn.v_proj.weight": "column",
            "mlp.gate_proj.weight": "column", "mlp.up_proj.weight": "column",
            "self_attn.o_proj.weight": "row", "mlp.down_proj.weight": "row",
        }
        assert len(kind) == 3 * 7  # every layer's 7 linears, and not lm_head, norms or embeddings

    @pytest.mark.parametrize(("kv_heads", "shape"), [(8, [3, -1]), (2, [[128, 32, 32], -1])])
    def test_fused_qkv_shape(self, kv_heads, shape):
        g = llama_graph(heads=8, kv_heads=kv_heads, fused_qkv=True)
        spaces = spaces_for(g, 2)
        specs = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 1, 2)))["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
        assert specs[-1] == {"patterns": [P + r"self_attn\.qkv_proj\.weight$"], "partition_type": "column", "shape": shape, "partition_dim": 0}

    def test_zero_data_parallel_of_any_model(self):
        g = cnn_graph()
        spaces = spaces_for(g, 4)
        settings = TrainingSettings(zero_stage=3, recompute="full", precision="fp32")
        out = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 4, 1), settings=settings, global_batch=32))
        assert out["ds_config"] == {
            "train_batch_size": 32,
            "train_micro_batch_size_per_gpu": 2,
            "gradient_accumulation_steps": 4,
            "zero_optimization": {
                "stage": 3, "offload_optimizer": {"device": "none"}, "overlap_comm": True, "offload_param": {"device": "none"},
                # the gather bounds the memory was priced with: DeepSpeed 0.19.8's defaults (zero3.ZERO3_GATHER)
                "stage3_prefetch_bucket_size": 50_000_000, "stage3_max_live_parameters": 1_000_000_000,
                "stage3_max_reuse_distance": 1_000_000_000, "stage3_param_persistence_threshold": 100_000,
                "reduce_bucket_size": 500_000_000, "contiguous_gradients": True,
            },
            "activation_checkpointing": {
                "partition_activations": False, "cpu_checkpointing": False, "contiguous_memory_optimization": False,
                "synchronize_checkpoint_boundary": False, "profile": False,
            },
        }
        assert any("wrap each layer (transformer block)" in n for n in out["notes"])

    def test_zero3_writes_the_gather_bounds_it_was_priced_with(self):
        from planner.core.settings import Zero3Gather

        g = gpt_graph()
        spaces = spaces_for(g, 8)
        gather = Zero3Gather(prefetch_bucket=7, max_live=11, max_reuse_distance=13, persistence_threshold=17, reduce_bucket=19)
        out = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 8, 1),
                                          settings=TrainingSettings(zero_stage=3, zero3_gather=gather)))
        zero = out["ds_config"]["zero_optimization"]
        assert (zero["stage3_prefetch_bucket_size"], zero["stage3_max_live_parameters"], zero["stage3_max_reuse_distance"],
                zero["stage3_param_persistence_threshold"], zero["reduce_bucket_size"]) == (7, 11, 13, 17, 19)
        below = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 8, 1), settings=TrainingSettings(zero_stage=2)))
        assert not any(k.startswith("stage3_") for k in below["ds_config"]["zero_optimization"])

    def test_gpt2_data_parallel(self):
        g = gpt_graph()
        spaces = spaces_for(g, 8)
        out = export_deepspeed(make_input(g, spaces, _choice(g, spaces, 8, 1), settings=TrainingSettings(zero_stage=1)))
        assert out["degrees"] == {"dp": 8, "cp": 1, "tp": 1, "pp": 1} and out["ds_config"]["train_batch_size"] == 8


class TestRefusals:
    def test_conv1d_weights(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        choice = first_rows(megatron_masks(g, spaces, dp=2, tp=2))
        with pytest.raises(UnsupportedExport, match=r"stored \[in, out\].*torch.nn.Linear"):
            export_deepspeed(make_input(g, spaces, choice))

    def test_zero3_with_autotp(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        with pytest.raises(UnsupportedExport, match="ZeRO stages 0-2"):
            export_deepspeed(make_input(g, spaces, _choice(g, spaces, 2, 2), settings=TrainingSettings(zero_stage=3)))

    def test_kv_heads_not_divisible(self):
        g = llama_graph(heads=8, kv_heads=2)
        spaces = spaces_for(g, 4)
        choice = first_rows(megatron_masks(g, spaces, dp=1, tp=4))
        with pytest.raises(UnsupportedExport, match="tp=4 must divide the 2 KV heads"):
            export_deepspeed(make_input(g, spaces, choice))

    def test_vocabulary_parallel_embedding(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        choice = first_rows(megatron_masks(g, spaces, dp=2, tp=2))
        with pytest.raises(UnsupportedExport, match=r"op tok_emb \(embedding\) is split i0=2 x v=2; DeepSpeed AutoTP at dp=2 x tp=2 splits it i0=2"):
            export_deepspeed(make_input(g, spaces, choice))

    def test_model_parallel_op_at_tp1(self):
        g = cnn_graph()
        spaces = spaces_for(g, 4)
        choice = set_split(g, spaces, _choice(g, spaces, 2, 1), "relu", {"d0": 2, "d1": 2})
        with pytest.raises(UnsupportedExport, match=r"op relu \(op\) is split d0=2 x d1=2; DeepSpeed ZeRO data parallelism \(dp=2\) splits it d0=2"):
            export_deepspeed(make_input(g, spaces, choice))

    def test_layers_that_share_a_name(self):
        g = llama_graph(named_weights=False)
        q_path = g.ops[g.op_index("q_0")].module_path
        ops = tuple(dataclasses.replace(op, module_path=q_path) if op.name == "o_proj_0" else op for op in g.ops)
        g = dataclasses.replace(g, ops=ops)
        spaces = spaces_for(g, 4)
        with pytest.raises(UnsupportedExport, match="row-parallel layout but shares the name pattern"):
            export_deepspeed(make_input(g, spaces, _choice(g, spaces, 2, 2)))


def _pipeline_input(graph, dp, layers, *, tp=1, micro_batches=4, settings=None, schedule="1f1b", devices_per_stage=None):
    """DeepSpeed's pattern at dp x tp on every stage of a ``layers``-split pipeline (8 devices a node)."""
    settings = settings or TrainingSettings()
    devices = devices_per_stage or dp * tp
    spaces = spaces_for(graph, devices)
    spec = pipeline_spec(
        graph, layers, devices_per_stage=devices, micro_batch=graph.dim_bindings["batch"] // dp,
        micro_batches=micro_batches, schedule=schedule, chunks=2 if schedule == "interleaved" else 1, settings=settings,
    )
    choice = first_rows(megatron_masks(graph, spaces, dp=dp, tp=tp)) if tp > 1 else _choice(graph, spaces, dp, 1)
    return make_input(
        graph, spaces, choice, cluster=make_cluster(1, 8), settings=settings, global_batch=spec.global_batch, pipeline=spec,
    )


class TestPipeline:
    def test_parts(self):
        # layer list [embeddings, block x L, head]: stage s runs [parts[s], parts[s + 1])
        assert pipeline_parts([2, 2]) == [0, 3, 6]
        assert pipeline_parts([1, 3]) == [0, 2, 6]
        assert pipeline_parts([3, 4, 4, 1]) == [0, 4, 8, 12, 14]
        assert pipeline_parts([12]) == [0, 14]

    def test_even_stages(self):
        g = gpt_graph(layers=4)
        out = export_deepspeed(_pipeline_input(g, 2, [2, 2]))
        # 8 samples per pass over dp=2: 4 per GPU, 4 micro-batches: 32 samples a step
        assert out["ds_config"] == {
            "train_batch_size": 32,
            "train_micro_batch_size_per_gpu": 4,
            "gradient_accumulation_steps": 4,
            "zero_optimization": {"stage": 0},
            "bf16": {"enabled": True},
            "pipeline": {"stages": 2, "activation_checkpoint_interval": 0},
        }
        assert (out["world_size"], out["nproc_per_node"], out["degrees"]) == (4, 4, {"dp": 2, "cp": 1, "tp": 1, "pp": 2})
        pipe = out["pipeline"]
        assert (pipe["num_stages"], pipe["partition_method"], pipe["parts"]) == (2, "type:BlockPipe", [0, 3, 6])
        assert 'partition_method="type:BlockPipe"' in pipe["code"] and "num_stages=2" in pipe["code"]
        assert "TiedLayerSpec" in pipe["code"]  # GPT's head shares the token embedding
        compile(pipe["code"], "pipeline_module.py", "exec")

    def test_uneven_stages_list_their_parts(self):
        g = gpt_graph(layers=4)
        pipe = export_deepspeed(_pipeline_input(g, 2, [1, 3]))["pipeline"]
        assert (pipe["partition_method"], pipe["parts"], pipe["layers_per_stage"]) == ("parts", [0, 2, 6], [1, 3])
        assert "PARTS = [0, 2, 6]" in pipe["code"] and "class PlannedPipelineModule(PipelineModule)" in pipe["code"]
        compile(pipe["code"], "pipeline_module.py", "exec")

    def test_full_recompute_checkpoints_every_block(self):
        g = gpt_graph(layers=4)
        out = export_deepspeed(_pipeline_input(g, 2, [2, 2], settings=TrainingSettings(zero_stage=1, recompute="full")))
        assert out["ds_config"]["pipeline"]["activation_checkpoint_interval"] == 1
        assert out["ds_config"]["zero_optimization"]["stage"] == 1
        assert 'checkpointable_layers=["BlockPipe"]' in out["pipeline"]["code"]

    @pytest.mark.parametrize("stage", [2, 3])
    def test_zero_2_3_refused(self, stage):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match="PipelineEngine asserts ZeRO stage < 2"):
            export_deepspeed(_pipeline_input(g, 2, [2, 2], settings=TrainingSettings(zero_stage=stage)))

    @pytest.mark.parametrize("schedule", ["gpipe", "interleaved"])
    def test_other_schedules_refused(self, schedule):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match=f"TrainSchedule \\(1F1B\\); it has no {schedule} schedule"):
            export_deepspeed(_pipeline_input(g, 2, [2, 2], schedule=schedule))

    def test_autotp_with_pipeline_refused(self):
        g = llama_graph(layers=4)
        with pytest.raises(UnsupportedExport, match="AutoTP sets up its own tensor-parallel groups"):
            export_deepspeed(_pipeline_input(g, 1, [2, 2], tp=2))

    def test_idle_devices_refused(self):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match="dp=2 on stages of 4 devices"):
            export_deepspeed(_pipeline_input(g, 2, [2, 2], devices_per_stage=4))

    def test_one_stage_is_plain_zero_data_parallelism(self):
        g = gpt_graph(layers=4)
        out = export_deepspeed(_pipeline_input(g, 2, [4], settings=TrainingSettings(zero_stage=3)))
        assert out["pipeline"] is None and "pipeline" not in out["ds_config"]
        assert out["ds_config"]["gradient_accumulation_steps"] == 4 and out["ds_config"]["zero_optimization"]["stage"] == 3
