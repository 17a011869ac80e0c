"""The torchtitan exporter (issue 24 item 6): overrides, refusals, the stage cut and torchtitan's rules.

The facts asserted are torchtitan 0.3.0's: its field names, its schedule names, its loop-style stage
placement, the rules its ``ParallelDims`` / ``Trainer.Config`` enforce. ``tests/integration`` holds
the same exports against torchtitan's own ``ConfigManager``.
"""

from __future__ import annotations

import pytest

from exporters import export
from exporters.torchtitan import (
    TorchtitanModel,
    parse_torchtitan_overrides,
    torchtitan_masks,
    torchtitan_violations,
)
from planner.core.errors import InputError, UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, gpt_graph, llama_graph, make_cluster, make_input, pipeline_spec, spaces_for


def _llama_input(dp: int, tp: int, *, sp: bool = False, settings: TrainingSettings | None = None):
    graph = llama_graph()
    spaces = spaces_for(graph, dp * tp)
    choice = first_rows(torchtitan_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp))
    return make_input(graph, spaces, choice, cluster=make_cluster(1, dp * tp), settings=settings or TrainingSettings())


class TestExportTorchtitan:
    def test_fsdp2_tp_and_sequence_parallel_overrides(self):
        out = export("torchtitan", _llama_input(2, 2, sp=True, settings=TrainingSettings(zero_stage=3)))
        a = parse_torchtitan_overrides(out["overrides"])
        assert (a["parallelism.data_parallel_replicate_degree"], a["parallelism.data_parallel_shard_degree"]) == (1, 2)
        assert a["parallelism.tensor_parallel_degree"] == 2 and a["parallelism.enable_sequence_parallel"]
        assert a["parallelism.pipeline_parallel_degree"] == 1 and a["parallelism.context_parallel_degree"] == 1
        assert a["training.local_batch_size"] * 2 == a["training.global_batch_size"] == 8  # llama_graph's batch
        assert a["compile.enable"] and a["activation_checkpoint"] == "none"
        assert out["overrides"][-1] == "activation-checkpoint:none"  # tyro reads a subcommand's options after it
        assert out["command"].startswith("PYTHONPATH=. torchrun --nproc-per-node 4 -m torchtitan.train --module "
                                         "planner_torchtitan --config planner_model ")
        text = out["config_file"]["text"]
        assert "n_layers=2" in text and "n_kv_heads=2" in text and "hidden_dim=192" in text
        # a hand-built graph has no file: llama3's RMSNorm default eps and RoPE default theta, both said in a note
        assert "dim, vocab, eps = 128, 96, 1e-05" in text and "theta=10000.0" in text and "head_dim" not in text
        assert any("theta=10000" in n for n in out["notes"]) and any("eps=1e-05" in n for n in out["notes"])

    def test_zero0_is_replication_and_full_recompute_is_full_ac(self):
        out = export("torchtitan", _llama_input(4, 1, settings=TrainingSettings(recompute="full")))
        a = parse_torchtitan_overrides(out["overrides"])
        assert (a["parallelism.data_parallel_replicate_degree"], a["parallelism.data_parallel_shard_degree"]) == (4, 1)
        assert not a["parallelism.enable_sequence_parallel"] and a["activation_checkpoint"] == "full"

    def test_op_level_recomputation_is_selective_ac_and_others_refuse_it(self):
        """The planner's ``op`` mode is torchtitan's SelectiveAC; Megatron-LM, DeepSpeed, DTensor and
        Mesh-TF have no such policy and say so in one line."""
        plan = _llama_input(4, 1, settings=TrainingSettings(zero_stage=3, recompute="op"))
        assert parse_torchtitan_overrides(export("torchtitan", plan)["overrides"])["activation_checkpoint"] == "selective"
        for name in ("megatron", "deepspeed", "dtensor", "meshtf"):
            with pytest.raises(UnsupportedExport, match=r"not 'op' \(torchtitan's op-level policy\)"):
                export(name, plan)

    @pytest.mark.parametrize(
        ("settings", "message"),
        [
            (TrainingSettings(zero_stage=1), r"ZeRO-1 has no setting"),
            (TrainingSettings(zero_stage=2), r"ZeRO-2 has no setting"),
            (TrainingSettings(recompute="selective"), r"not 'selective' \(Megatron-LM's recomputed attention core\)"),
            (TrainingSettings(optimizer="sgd"), r"AdamW"),
        ],
    )
    def test_settings_it_cannot_run_are_one_line_refusals(self, settings, message):
        with pytest.raises(UnsupportedExport, match=message) as error:
            export("torchtitan", _llama_input(2, 2, settings=settings))
        assert "\n" not in str(error.value)

    def test_a_gpt2_model_is_refused_with_the_reasons(self):
        graph = gpt_graph()
        spaces = spaces_for(graph, 2)
        with pytest.raises(UnsupportedExport, match=r"llama3 family would train a different model: .*LayerNorm.*"
                                                    r"SwiGLU.*position table.*biases"):
            export("torchtitan", make_input(graph, spaces, [0] * len(graph.ops), cluster=make_cluster(1, 2)))
        assert torchtitan_masks(graph, spaces, dp=2, tp=1) is None

    def test_kv_heads_must_divide_by_tp(self):
        graph = llama_graph()  # 8 heads, 2 KV heads: torchtitan's colwise K/V needs tp | n_kv_heads
        assert torchtitan_masks(graph, spaces_for(graph, 4), dp=1, tp=4) is None
        assert torchtitan_masks(graph, spaces_for(graph, 4), dp=2, tp=2) is not None

    @pytest.mark.parametrize(
        ("schedule", "chunks", "name", "parts"),
        [
            ("1f1b", 1, "1F1B", [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "lm_head"]]),
            ("gpipe", 1, "GPipe", [["tok_embeddings", "layers.0", "layers.1"], ["layers.2", "layers.3", "norm", "lm_head"]]),
            # loop style: rank 0 holds parts 0 and 2, rank 1 parts 1 and 3
            ("interleaved", 2, "Interleaved1F1B",
             [["tok_embeddings", "layers.0"], ["layers.1"], ["layers.2"], ["layers.3", "norm", "lm_head"]]),
        ],
    )
    def test_pipeline_stage_cut_and_schedule(self, schedule, chunks, name, parts):
        graph = llama_graph(layers=4)
        settings = TrainingSettings(zero_stage=3)
        spec = pipeline_spec(graph, [2, 2], devices_per_stage=1, micro_batch=8, micro_batches=4, schedule=schedule,
                             chunks=chunks, settings=settings)
        plan_input = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops), cluster=make_cluster(1, 8),
                                settings=settings, global_batch=spec.global_batch, pipeline=spec)
        out = export("torchtitan", plan_input)
        a = parse_torchtitan_overrides(out["overrides"])
        assert a["parallelism.pipeline_parallel_degree"] == 2 and a["parallelism.pipeline_parallel_schedule"] == name
        assert a["parallelism.module_fqns_per_model_part"] == parts
        assert a["training.local_batch_size"] // a["parallelism.pipeline_parallel_microbatch_size"] == 4
        assert a["training.disable_cuda_graphs"]


class TestZeroBubbleSchedules:
    """torch 2.13's zero-bubble schedules as torchtitan 0.3 names them (Qi et al., ICLR 2024): ZB-V
    (``ZBVZeroBubble``: two parts per rank in a V) and looped ZB-H1 (``InterleavedZeroBubble``); neither
    runs torch.compile'd stages, so they export under ``--engine eager`` only, and Megatron-LM refuses both."""

    @staticmethod
    def _input(schedule: str, chunks: int, counts, *, engine: str = "eager"):
        graph = llama_graph(layers=sum(counts))
        # priced as torchtitan runs it: bf16 modules under FSDP2's policy, no autocast (Target.autocast_zero)
        settings = TrainingSettings(zero_stage=3, engine=engine, attention="flash", autocast=False)
        spec = pipeline_spec(graph, list(counts), devices_per_stage=1, micro_batch=8, micro_batches=4,
                             schedule=schedule, chunks=chunks, settings=settings)
        return make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops), cluster=make_cluster(1, 8),
                          settings=settings, global_batch=spec.global_batch, pipeline=spec)

    def test_zbv_places_the_parts_in_a_v(self):
        a = parse_torchtitan_overrides(export("torchtitan", self._input("zbv", 2, [4, 2]))["overrides"])
        assert a["parallelism.pipeline_parallel_schedule"] == "ZBVZeroBubble" and not a["compile.enable"]
        # rank 0 holds parts 0 and 3 (2 layers each), rank 1 parts 1 and 2 (1 layer each)
        assert a["parallelism.module_fqns_per_model_part"] == [
            ["tok_embeddings", "layers.0", "layers.1"], ["layers.2"], ["layers.3"], ["layers.4", "layers.5", "norm", "lm_head"]]

    def test_looped_zb_h1_is_interleaved_zero_bubble(self):
        a = parse_torchtitan_overrides(export("torchtitan", self._input("zb-h1", 2, [2, 2]))["overrides"])
        assert a["parallelism.pipeline_parallel_schedule"] == "InterleavedZeroBubble"
        assert len(a["parallelism.module_fqns_per_model_part"]) == 4

    @pytest.mark.parametrize(("schedule", "chunks", "engine", "message"), [
        ("zbv", 2, "fused", r"torch.compile'd blocks do not support; plan with --engine eager"),
        ("zb-h1", 1, "eager", r"looped only .* plan with --chunks 2"),
    ])
    def test_refusals(self, schedule, chunks, engine, message):
        with pytest.raises(UnsupportedExport, match=message):
            export("torchtitan", self._input(schedule, chunks, [2, 2], engine=engine))

    def test_megatron_runs_no_zero_bubble_schedule(self):
        graph = gpt_graph(layers=4)
        spec = pipeline_spec(graph, [2, 2], devices_per_stage=1, micro_batch=8, micro_batches=4, schedule="zbv", chunks=2)
        plan_input = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops), cluster=make_cluster(1, 8),
                                global_batch=spec.global_batch, pipeline=spec)
        with pytest.raises(UnsupportedExport, match=r"megatron-core 0.16.1 runs no zero-bubble schedule \(zbv"):
            export("megatron", plan_input)

    def test_compiled_zero_bubble_is_a_violation(self):
        args = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule", "ZBVZeroBubble",
                "--parallelism.module_fqns_per_model_part", "tok_embeddings,layers.0", "layers.1,norm,lm_head",
                "--training.local_batch_size", "4", "--parallelism.pipeline_parallel_microbatch_size", "1",
                "--training.disable_cuda_graphs", "--compile.enable"]
        found = torchtitan_violations(args, world_size=2, model=TorchtitanModel(num_layers=2, num_attention_heads=8, num_kv_heads=2))
        assert any("at least two model parts per rank" in v for v in found)
        assert any("torch.compile'd stages do not support" in v for v in found)
        six = ["tok_embeddings,layers.0", *(f"layers.{i}" for i in range(1, 5)), "layers.5,norm,lm_head"]
        args[args.index("layers.1,norm,lm_head") - 1:args.index("layers.1,norm,lm_head") + 1] = six
        found = torchtitan_violations(args, world_size=2, model=TorchtitanModel(num_layers=6, num_attention_heads=8, num_kv_heads=2))
        assert any("ZBVZeroBubble requires exactly 2 stages per rank, got 6" in v for v in found)


class TestTorchtitanViolations:
    MODEL = TorchtitanModel(num_layers=2, num_attention_heads=8, num_kv_heads=2)

    def test_world_size_and_batch(self):
        args = ["--parallelism.data_parallel_shard_degree", "3", "--parallelism.tensor_parallel_degree", "2",
                "--training.local_batch_size", "2", "--training.global_batch_size", "10", "--training.seq_len", "16"]
        found = torchtitan_violations(args, world_size=4, model=self.MODEL)
        assert any("is not the world size 4" in v for v in found)
        found = torchtitan_violations(args, world_size=6, model=self.MODEL)
        assert found == ["global batch size 10 is not a multiple of local batch size x data-parallel degree (2 x 3)"]

    def test_tp_heads_and_sequence(self):
        args = ["--parallelism.tensor_parallel_degree", "4", "--training.seq_len", "18"]
        found = torchtitan_violations(args, world_size=4, model=self.MODEL)
        assert "tensor_parallel_degree (4) must divide n_kv_heads (2)" in found
        assert any("seq_len (18) must be divisible by 4" in v for v in found)

    def test_pipeline_rules(self):
        args = ["--parallelism.pipeline_parallel_degree", "2", "--parallelism.pipeline_parallel_schedule",
                "Interleaved1F1B", "--parallelism.module_fqns_per_model_part", "tok_embeddings,layers.0",
                "layers.1,norm,lm_head", "--training.local_batch_size", "3",
                "--parallelism.pipeline_parallel_microbatch_size", "2"]
        found = torchtitan_violations(args, world_size=2, model=self.MODEL)
        assert any("divisible by the pipeline micro-batch" in v for v in found)
        assert any("disable_cuda_graphs" in v for v in found)
        assert any("at least two model parts per rank" in v for v in found)

    def test_unknown_override_is_an_input_error(self):
        with pytest.raises(InputError, match="unknown torchtitan override '--float8.enable'"):
            parse_torchtitan_overrides(["--float8.enable"])
