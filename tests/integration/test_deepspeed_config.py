"""The DeepSpeed export (tests/exporters/test_deepspeed.py) against deepspeed 0.19.8's own config code."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from exporters.deepspeed import export_deepspeed
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import cnn_graph, gpt_graph, llama_graph, make_input, spaces_for
from tests.exporters.test_deepspeed import _choice, _pipeline_input


@pytest.mark.integration
class TestWithDeepSpeed:
    """Cross-checks against deepspeed 0.19.8 (skipped when it is not installed)."""

    @pytest.fixture
    def ds_config(self, monkeypatch):
        pytest.importorskip("torch")
        pytest.importorskip("deepspeed")
        import deepspeed.runtime.config as ds_runtime_config

        def build(config, world):
            # No process group: stub dist so DeepSpeedConfig checks the batch at `world` ranks (reference §2.2).
            monkeypatch.setattr(ds_runtime_config, "dist", SimpleNamespace(get_rank=lambda *a, **k: 0, get_world_size=lambda *a, **k: world))
            return ds_runtime_config.DeepSpeedConfig(config)

        return build

    @pytest.mark.parametrize(
        ("graph", "dp", "tp", "settings"),
        [
            (llama_graph(), 2, 2, TrainingSettings(zero_stage=2)),
            (llama_graph(fused_qkv=True, heads=8, kv_heads=2), 1, 2, TrainingSettings(zero_stage=1, recompute="selective")),
            (cnn_graph(), 4, 1, TrainingSettings(zero_stage=3, precision="fp32")),
        ],
    )
    def test_deepspeed_accepts_exports(self, ds_config, graph, dp, tp, settings):
        from deepspeed.module_inject.autotp_config import AutoTPConfig

        spaces = spaces_for(graph, dp * tp)
        out = export_deepspeed(make_input(graph, spaces, _choice(graph, spaces, dp, tp), settings=settings, global_batch=16))
        config = ds_config(out["ds_config"], out["world_size"])
        assert config.zero_optimization_stage == settings.zero_stage
        if settings.zero_stage == 3:  # DeepSpeed reads back the gather bounds the memory was priced with
            from exporters.deepspeed.zero3 import ZERO3_GATHER

            zero = config.zero_config
            assert (zero.prefetch_bucket_size, zero.max_live_parameters, zero.max_reuse_distance,
                    zero.param_persistence_threshold, zero.reduce_bucket_size) == (
                ZERO3_GATHER.prefetch_bucket, ZERO3_GATHER.max_live, ZERO3_GATHER.max_reuse_distance,
                ZERO3_GATHER.persistence_threshold, ZERO3_GATHER.reduce_bucket)
        assert config.gradient_accumulation_steps == out["batch"]["gradient_accumulation_steps"]
        if tp > 1:
            partition = AutoTPConfig.from_dict(out["ds_config"]["tensor_parallel"]["partition_config"])
            for name in graph.tensors:
                spec = partition.find_matching_spec(name)
                if name.endswith(("q_proj.weight", "qkv_proj.weight", "up_proj.weight")):
                    assert spec is not None and spec.partition_type.value == "column", name
                elif name.endswith(("o_proj.weight", "down_proj.weight")):
                    assert spec is not None and spec.partition_type.value == "row", name
                elif name in ("lm_head.weight", "model.embed_tokens.weight") or "norm" in name:
                    assert spec is None, name

    @pytest.mark.parametrize(
        ("config", "world"),
        [
            ({"train_batch_size": 30, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 2}, 8),
            ({"train_batch_size": 32, "zero_optimization": {"stage": 4}}, 8),
            ({"train_batch_size": 32, "zero_optimization": {"stage": 2, "overlap_comms": True}}, 8),
            ({"train_batch_size": 32, "bf16": {"enabled": True}, "fp16": {"enabled": True}}, 8),
            ({"train_batch_size": 32, "zero_optimization": {"stage": 2, "offload_optimizer": {"device": "gpu"}}}, 8),
            ({"train_batch_size": 2, "train_micro_batch_size_per_gpu": 1, "tensor_parallel": {"autotp_size": 2}}, 4),
        ],
    )
    def test_rejections_agree(self, ds_config, config, world):
        from exporters.validate import deepspeed_violations

        assert deepspeed_violations(config, world_size=world)
        with pytest.raises(Exception):
            ds_config(config, world)

    @pytest.mark.parametrize(("layers", "settings"), [([2, 2], TrainingSettings()), ([1, 1, 1, 1], TrainingSettings(zero_stage=1, recompute="full")), ([1, 3], TrainingSettings())])
    def test_deepspeed_accepts_pipeline_exports(self, ds_config, layers, settings):
        from deepspeed.runtime.utils import partition_balanced

        g = gpt_graph(layers=4)
        out = export_deepspeed(_pipeline_input(g, 2, layers, settings=settings))
        dp = out["degrees"]["dp"]
        # PipelineEngine: DeepSpeedConfig's world is the data-parallel size of the pipe topology
        config = ds_config(out["ds_config"], dp)
        assert config.train_batch_size == config.train_micro_batch_size_per_gpu * config.gradient_accumulation_steps * dp
        assert config.pipeline["activation_checkpoint_interval"] == out["pipeline"]["activation_checkpoint_interval"]
        pipe = out["pipeline"]
        if pipe["partition_method"].startswith("type:"):
            # PipelineModule._partition_layers("type:BlockPipe"): balance the block indicator
            weights = [0] + [1] * sum(layers) + [0]
            assert partition_balanced(weights, len(layers)) == pipe["parts"]
