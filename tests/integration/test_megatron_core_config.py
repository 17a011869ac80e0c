"""The Megatron-LM export (tests/exporters/test_megatron.py) against megatron-core 0.16.1's own argument and config code."""

from __future__ import annotations

import pytest

from exporters.megatron import export_megatron
from exporters.validate import megatron_violations, parse_megatron_args
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import gpt_graph, llama_graph, make_input, spaces_for
from tests.exporters.test_megatron import _megatron_choice, _megatron_layers_per_rank, _pipeline_input, _transformer_config_kwargs


@pytest.mark.integration
class TestWithMegatronCore:
    """Cross-checks against megatron-core 0.16.1 (skipped when it or torch is not installed)."""

    @pytest.fixture(autouse=True)
    def _core(self):
        pytest.importorskip("torch")
        pytest.importorskip("megatron.core")

    @pytest.mark.parametrize(
        ("graph", "dp", "tp", "sp", "settings"),
        [
            (gpt_graph(), 4, 2, False, TrainingSettings()),
            (gpt_graph(), 2, 4, True, TrainingSettings(recompute="full")),
            (llama_graph(heads=8, kv_heads=2), 2, 4, False, TrainingSettings(recompute="selective", precision="fp32")),
            (llama_graph(heads=8, kv_heads=2), 4, 2, True, TrainingSettings()),
        ],
    )
    def test_transformer_config_accepts_exports(self, graph, dp, tp, sp, settings):
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.transformer.transformer_config import TransformerConfig

        spaces = spaces_for(graph, dp * tp)
        out = export_megatron(make_input(graph, spaces, _megatron_choice(graph, spaces, dp, tp, sp=sp), settings=settings, global_batch=16))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.tensor_model_parallel_size == tp and config.sequence_parallel == sp
        calculator = ConstantNumMicroBatchesCalculator(args["global-batch-size"], args["micro-batch-size"], dp, False, 0)
        assert calculator.get() == out["batch"]["num_microbatches"]

    @pytest.mark.parametrize(
        ("heads", "groups", "tp"),
        [(6, None, 4), (8, None, 4), (8, 2, 8), (16, 4, 8), (12, 4, 8), (8, 4, 3)],
    )
    def test_head_rules_agree(self, heads, groups, tp):
        from megatron.core.transformer.transformer_config import TransformerConfig

        from exporters.validate import megatron_violations

        flags = f"--num-layers 2 --hidden-size {heads * 16} --num-attention-heads {heads} --max-position-embeddings 64 --micro-batch-size 1 --tensor-model-parallel-size {tp}"
        if groups:
            flags += f" --group-query-attention --num-query-groups {groups}"
        ours = [p for p in megatron_violations(flags, world_size=tp, env={"CUDA_DEVICE_MAX_CONNECTIONS": "1"}) if "head" in p or "group" in p]
        kwargs = _transformer_config_kwargs(parse_megatron_args(flags + " --ffn-hidden-size 64 --pipeline-model-parallel-size 1"))
        try:
            TransformerConfig(**kwargs)
            theirs_ok = True
        except (ValueError, AssertionError):
            theirs_ok = False
        assert theirs_ok == (not ours), ours

    def test_rank_order_puts_tp_innermost(self):
        from megatron.core.parallel_state import RankGenerator

        ranks = RankGenerator(tp=2, ep=1, dp=4, pp=1, cp=1, order="tp-cp-ep-dp-pp")
        assert ranks.get_ranks("tp") == [[0, 1], [2, 3], [4, 5], [6, 7]]
        assert ranks.get_ranks("dp") == [[0, 2, 4, 6], [1, 3, 5, 7]]

    @pytest.mark.parametrize(
        ("layers", "chunks", "schedule"),
        [
            ([2, 2, 2, 2], 1, "1f1b"),
            ([3, 5], 1, "1f1b"),
            ([1, 2, 2, 3], 1, "1f1b"),
            ([2, 2, 2, 1], 1, "1f1b"),
            ([3, 1, 2, 2], 1, "1f1b"),
            ([0, 3, 3, 2], 1, "1f1b"),
            ([4, 4], 2, "interleaved"),
            ([2, 2, 2, 4], 2, "interleaved"),
            ([2, 4, 2, 4], 2, "interleaved"),
        ],
    )
    def test_pipeline_exports_build_the_planned_stages(self, layers, chunks, schedule):
        from megatron.core.num_microbatches_calculator import ConstantNumMicroBatchesCalculator
        from megatron.core.transformer.transformer_config import TransformerConfig

        g = gpt_graph(layers=sum(layers))
        # priced as Megatron-LM's search prices them: interleaved transfers overlapped (Target.priced_p2p_overlap)
        out = export_megatron(_pipeline_input(g, 1, 2, layers, schedule=schedule, chunks=chunks, micro_batches=8,
                                              settings=TrainingSettings(p2p_overlap=chunks > 1 or None)))
        args = parse_megatron_args(out["args"])
        config = TransformerConfig(**_transformer_config_kwargs(args))
        assert config.pipeline_model_parallel_size == len(layers)
        assert (config.virtual_pipeline_model_parallel_size or 1) == chunks
        assert config.overlap_p2p_comm == (chunks > 1) and config.batch_p2p_comm == (chunks == 1)  # as priced
        assert _megatron_layers_per_rank(config) == layers
        calculator = ConstantNumMicroBatchesCalculator(args["global-batch-size"], args["micro-batch-size"], 1, False, 0)
        assert calculator.get() == out["batch"]["num_microbatches"] == 8

    @pytest.mark.parametrize(
        ("flags", "ours_ok"),
        [
            ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 1 --decoder-last-pipeline-num-layers 2", False),
            ("--pipeline-model-parallel-size 4 --decoder-first-pipeline-num-layers 2 --decoder-last-pipeline-num-layers 4", True),
            ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*4", False),
            ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*4L", False),
            ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et*3|t*5L", True),
            ("--pipeline-model-parallel-size 2 --pipeline-model-parallel-layout Et|t*2|t*3|t*2L", True),
            ("--pipeline-model-parallel-size 3 --pipeline-model-parallel-layout Et|t*2|t*3|t*2L", False),
        ],
    )
    def test_pipeline_rules_agree(self, flags, ours_ok):
        from megatron.core.transformer.transformer_config import TransformerConfig

        base = "--tensor-model-parallel-size 1 --num-layers 8 --hidden-size 64 --num-attention-heads 4 --max-position-embeddings 64 --micro-batch-size 1 --global-batch-size 8 --ffn-hidden-size 64"
        ours = megatron_violations(f"{base} {flags}", world_size=8)
        assert (ours == []) == ours_ok, ours
        args = parse_megatron_args(f"{base} {flags}")
        try:
            TransformerConfig(**_transformer_config_kwargs(args))
            theirs_ok = True
        except (ValueError, AssertionError):
            theirs_ok = False
        assert theirs_ok == ours_ok
