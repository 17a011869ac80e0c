"""Tests of exporters.megatron: the masks of Megatron's pattern, the exported launch, the refusals,
and the helpers of its megatron-core cross-checks (tests/integration/test_megatron_core_config.py)."""

from __future__ import annotations

import numpy as np
import pytest

from exporters.megatron import export_megatron, megatron_masks, megatron_pipeline_args
from exporters.validate import megatron_violations, parse_megatron_args
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


def _allowed(graph, spaces, masks, name):
    """The allowed configurations of op ``name`` as ``{dim: factor}`` dicts (split dims only)."""
    index = graph.op_index(name)
    return [spaces[index].describe(int(r)) for r in np.flatnonzero(masks[index])]


class TestMasks:
    def test_gpt_dp2_tp2_by_hand(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        masks = megatron_masks(g, spaces, dp=2, tp=2)
        expected = {
            "pos_emb": [{}],  # no batch dim, replicated over tp
            "tok_emb": [{"i0": 2, "v": 2}],  # vocabulary-parallel embedding
            "ln1_0": [{"d0": 2}],
            "qkv_0": [{"m_0": 2, "n": 2}],  # column-parallel
            "split_0": [{"d0": 2}],  # its split axis is unsplittable: replicated over tp
            "score_0": [{"b0": 2, "b1": 2}],  # heads
            "softmax_0": [{"d0": 2, "d1": 2}],
            "value_0": [{"b0": 2, "b1": 2}],
            "out_0": [{"m_0": 2, "k_0": 2}],  # row-parallel over (heads, head_dim): heads first
            "add1_0": [{"d0": 2}],
            "fc1_0": [{"m_0": 2, "n": 2}],
            "gelu_0": [{"d0": 2, "d2": 2}],
            "fc2_0": [{"m_0": 2, "k": 2}],
            "lm_head": [{"b0": 2, "n": 2}],
        }
        for name, allowed in expected.items():
            assert _allowed(g, spaces, masks, name) == allowed, name

    def test_sequence_parallel_splits_norms_and_residuals(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        masks = megatron_masks(g, spaces, dp=2, tp=2, sequence_parallel=True)
        assert _allowed(g, spaces, masks, "ln1_0") == [{"d0": 2, "d1": 2}]
        assert _allowed(g, spaces, masks, "add2_1") == [{"d0": 2, "d1": 2}]
        assert _allowed(g, spaces, masks, "pos_emb") == [{}, {"i1": 2}]
        assert _allowed(g, spaces, masks, "fc1_0") == [{"m_0": 2, "n": 2}]
        assert megatron_masks(g, spaces, dp=4, tp=1, sequence_parallel=True) is None

    def test_gqa_with_more_ranks_than_groups(self):
        # 8 heads, 2 KV groups, tp=4: K/V columns split 4 ways, each rank's K heads split 2 ways.
        g = llama_graph(heads=8, kv_heads=2)
        spaces = spaces_for(g, 8)
        masks = megatron_masks(g, spaces, dp=2, tp=4)
        assert _allowed(g, spaces, masks, "k_0") == [{"b0": 2, "n": 4}]
        assert _allowed(g, spaces, masks, "rope_k_0") == [{"d0": 2, "d2": 2}]
        assert _allowed(g, spaces, masks, "score_0") == [{"b0": 2, "b1_0": 2, "b1_1": 2}]
        assert _allowed(g, spaces, masks, "o_proj_0") == [{"b0": 2, "k_0": 4}]

    def test_pure_data_parallel(self):
        g = gpt_graph()
        spaces = spaces_for(g, 8)
        masks = megatron_masks(g, spaces, dp=8, tp=1)
        for op, space, mask in zip(g.ops, spaces, masks):
            want = {d.name: 8 for d in op.dims if d.is_batch}
            assert [space.describe(int(r)) for r in np.flatnonzero(mask)] == [want], op.name

    def test_rank_order_across_nodes(self):
        # 2 nodes x 2 devices, dp=2 x tp=2: tp inside a node, the batch split across nodes.
        g = gpt_graph()
        spaces = spaces_for(g, 4, 2)
        index = g.op_index("fc1_0")
        placed = megatron_masks(g, spaces, dp=2, tp=2, devices_per_node=2)[index]
        assert [spaces[index].inter_factors[r].tolist() for r in np.flatnonzero(placed)] == [[2, 1, 1, 1]]
        free = megatron_masks(g, spaces, dp=2, tp=2)[index]
        assert sorted(spaces[index].inter_factors[r].tolist() for r in np.flatnonzero(free)) == [[1, 1, 2, 1], [2, 1, 1, 1]]

    def test_vocabulary_not_divisible_stays_replicated(self):
        g = gpt_graph(vocab=95)
        spaces = spaces_for(g, 4)
        masks = megatron_masks(g, spaces, dp=2, tp=2)
        assert _allowed(g, spaces, masks, "lm_head") == [{"b0": 2}]
        assert _allowed(g, spaces, masks, "tok_emb") == [{"i0": 2}]

    @pytest.mark.parametrize(
        ("graph", "dp", "tp"),
        [
            (gpt_graph(heads=4), 1, 8),  # 4 heads, tp=8
            (gpt_graph(batch=6), 4, 2),  # batch 6 not divisible by dp=4
            (gpt_graph(ffn=250), 1, 4),  # FFN 250 not divisible by tp=4
            (llama_graph(hidden=96, heads=6, kv_heads=3), 1, 2),  # 3 groups vs tp=2
        ],
        ids=["heads", "batch", "ffn", "groups"],
    )
    def test_impossible_degrees(self, graph, dp, tp):
        assert megatron_masks(graph, spaces_for(graph, dp * tp), dp=dp, tp=tp) is None

    def test_not_a_gpt_model(self):
        for graph in (cnn_graph(), gpt_graph(extra_linear=True)):
            assert megatron_masks(graph, spaces_for(graph, 4), dp=2, tp=2) is None


def _megatron_choice(graph, spaces, dp, tp, *, sp=False, per_node=None):
    return first_rows(megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sp, devices_per_node=per_node))


class TestExport:
    def test_gpt(self):
        g = gpt_graph()
        spaces = spaces_for(g, 8)
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 4, 2)))
        assert out["args"] == [
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "1",
            "--micro-batch-size", "2", "--global-batch-size", "8", "--overlap-grad-reduce", "--bf16",
            "--num-layers", "2", "--hidden-size", "64", "--ffn-hidden-size", "256", "--num-attention-heads", "4",
            "--seq-length", "16", "--max-position-embeddings", "32",
        ]
        assert out["env"] == {"CUDA_DEVICE_MAX_CONNECTIONS": "1"}
        assert (out["world_size"], out["nnodes"], out["nproc_per_node"]) == (8, 1, 8)
        assert out["degrees"] == {"dp": 4, "tp": 2, "pp": 1, "cp": 1, "sequence_parallel": False}
        assert out["command"] == "CUDA_DEVICE_MAX_CONNECTIONS=1 torchrun --nproc-per-node 8 pretrain_gpt.py " + " ".join(out["args"])
        assert out["batch"] == {"micro_batch_size": 2, "global_batch_size": 8, "num_microbatches": 1}

    def test_llama_settings_and_gqa(self):
        g = llama_graph(heads=8, kv_heads=2)
        spaces = spaces_for(g, 8)
        settings = TrainingSettings(precision="fp32", zero_stage=1, recompute="full")
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 2, 4), settings=settings, global_batch=32))
        assert out["args"] == [
            "--tensor-model-parallel-size", "4", "--pipeline-model-parallel-size", "1",
            "--micro-batch-size", "4", "--global-batch-size", "32",
            "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
            "--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather",
            "--num-layers", "2", "--hidden-size", "128", "--ffn-hidden-size", "192", "--num-attention-heads", "8",
            "--group-query-attention", "--num-query-groups", "2",
            "--seq-length", "16", "--max-position-embeddings", "16", "--position-embedding-type", "rope",
            "--swiglu", "--normalization", "RMSNorm", "--disable-bias-linear", "--untie-embeddings-and-output-weights",
        ]
        assert out["batch"]["num_microbatches"] == 4

    @pytest.mark.parametrize(
        ("biases", "flags"),
        [("all", []), ("qkv", ["--disable-bias-linear", "--add-qkv-bias"]), ("none", ["--disable-bias-linear"])],
    )
    def test_bias_flags(self, biases, flags):
        # Megatron-LM: biases on every linear layer by default; --disable-bias-linear drops them all
        # and --add-qkv-bias puts them back on the QKV projections only (Qwen2)
        from importers.transformer import analyze_transformer

        g = gpt_graph(biases=biases)
        model = analyze_transformer(g)
        assert (model.linear_bias, model.qkv_bias) == {"all": (True, True), "qkv": (False, True), "none": (False, False)}[biases]
        spaces = spaces_for(g, 8)
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 4, 2)))
        assert [a for a in out["args"] if a in ("--disable-bias-linear", "--add-qkv-bias")] == flags
        assert not megatron_violations(out["args"], world_size=8, env=out["env"])

    @pytest.mark.parametrize(("stage", "strategy"), [(2, "optim_grads"), (3, "optim_grads_params")])
    def test_zero_2_3_is_megatron_fsdp(self, stage, strategy):
        g = gpt_graph()
        spaces = spaces_for(g, 8)
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 4, 2), settings=TrainingSettings(zero_stage=stage, recompute="selective")))
        args = parse_megatron_args(out["args"])
        assert args["use-megatron-fsdp"] and args["data-parallel-sharding-strategy"] == strategy
        assert args["ckpt-format"] == "fsdp_dtensor" and args["recompute-granularity"] == "selective"
        assert out["env"] == {}

    def test_sequence_parallel_across_nodes(self):
        g = gpt_graph()
        spaces = spaces_for(g, 8, 4)
        choice = _megatron_choice(g, spaces, 2, 4, sp=True, per_node=4)
        out = export_megatron(make_input(g, spaces, choice, cluster=make_cluster(2, 4)))
        assert "--sequence-parallel" in out["args"] and out["degrees"]["sequence_parallel"]
        assert (out["nnodes"], out["nproc_per_node"]) == (2, 4)
        assert "--nnodes 2 --node-rank $NODE_RANK --master-addr $MASTER_ADDR" in out["command"]

    def test_sgd(self):
        g = gpt_graph()
        spaces = spaces_for(g, 2)
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 2, 1), settings=TrainingSettings(optimizer="sgd")))
        assert out["args"][out["args"].index("--optimizer") + 1] == "sgd"

    def test_emitted_flags_are_frozen(self):
        # Every flag the exporter can emit; a new one must be added here deliberately.
        seen = set()
        for graph, (dp, tp) in ((gpt_graph(), (2, 2)), (llama_graph(heads=8, kv_heads=2), (1, 4)), (gpt_graph(heads=4, head_dim=8), (4, 1))):
            spaces = spaces_for(graph, dp * tp)
            for sp in (False, True) if tp > 1 else (False,):
                for settings in (
                    TrainingSettings(),
                    TrainingSettings(zero_stage=1, recompute="selective", optimizer="sgd"),
                    TrainingSettings(zero_stage=3, recompute="full", precision="fp32"),
                ):
                    out = export_megatron(make_input(graph, spaces, _megatron_choice(graph, spaces, dp, tp, sp=sp), settings=settings))
                    seen |= {a for a in out["args"] if a.startswith("--")}
        assert seen == {
            "--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--sequence-parallel",
            "--micro-batch-size", "--global-batch-size",
            "--recompute-granularity", "--recompute-method", "--recompute-num-layers",
            "--use-distributed-optimizer", "--use-megatron-fsdp", "--data-parallel-sharding-strategy",
            "--overlap-grad-reduce", "--overlap-param-gather",
            "--no-gradient-accumulation-fusion", "--ckpt-format", "--bf16", "--optimizer",
            "--num-layers", "--hidden-size", "--ffn-hidden-size", "--num-attention-heads",
            "--group-query-attention", "--num-query-groups", "--kv-channels", "--seq-length", "--max-position-embeddings",
            "--position-embedding-type", "--swiglu", "--normalization", "--disable-bias-linear",
            "--untie-embeddings-and-output-weights",
        }

    def test_degrees_are_read_from_the_layers(self):
        # A vocabulary of 9999 rows (odd) holds most FLOPs and stays replicated over tp: the degrees
        # still come out as dp=2 x tp=2.
        g = gpt_graph(vocab=9999)
        spaces = spaces_for(g, 4)
        lm_head = g.ops[g.op_index("lm_head")]
        assert lm_head.flops > sum(op.flops for op in g.ops) / 2
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 2, 2)))
        assert (out["degrees"]["dp"], out["degrees"]["tp"]) == (2, 2)

    def test_vocabulary_fallback_is_noted(self):
        g = gpt_graph(vocab=95)
        spaces = spaces_for(g, 4)
        out = export_megatron(make_input(g, spaces, _megatron_choice(g, spaces, 2, 2)))
        assert any("embedding, lm-head" in note for note in out["notes"])


class TestRefusals:
    def test_per_op_strategy_megatron_cannot_express(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        choice = set_split(g, spaces, _megatron_choice(g, spaces, 2, 2), "fc1_0", {"m_0": 2, "k": 2})
        with pytest.raises(UnsupportedExport, match=r"op fc1_0 \(fc1\) is split m_0=2 x k=2; Megatron-LM at dp=2 x tp=2 splits it m_0=2 x n=2"):
            export_megatron(make_input(g, spaces, choice))

    def test_heads_not_divisible_by_tp(self):
        g = gpt_graph(hidden=48, heads=3)
        spaces = spaces_for(g, 4)
        # Every matmul column- or row-split 2 ways and the batch 2 ways: dominant dp=2 x tp=2.
        choice = []
        for op, space in zip(g.ops, spaces):
            wants = [{d.name: 2 for d in op.dims if d.is_batch} | {name: 2} for name in ("n", "d2", "d1", "m")]
            row = next((space.index_of(w) for w in wants if _in_space(space, w)), 0)
            choice.append(row)
        with pytest.raises(UnsupportedExport, match="3 attention heads are not divisible by tp=2"):
            export_megatron(make_input(g, spaces, choice))

    def test_mixed_sequence_parallel(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        choice = set_split(g, spaces, _megatron_choice(g, spaces, 2, 2, sp=True), "ln2_1", {"d0": 2})
        with pytest.raises(UnsupportedExport, match="split along the sequence but op ln2_1 is not"):
            export_megatron(make_input(g, spaces, choice))

    def test_not_a_transformer(self):
        g = cnn_graph()
        spaces = spaces_for(g, 2)
        with pytest.raises(UnsupportedExport, match="not a transformer"):
            export_megatron(make_input(g, spaces, [0] * len(g.ops)))

    def test_layers_outside_gpt(self):
        g = gpt_graph(extra_linear=True)
        spaces = spaces_for(g, 2)
        with pytest.raises(UnsupportedExport, match="uniform stack of GPT layers.*linear layer"):
            export_megatron(make_input(g, spaces, [0] * len(g.ops)))


OVERLAPPED = TrainingSettings(p2p_overlap=True)
"""As Megatron-LM's search prices its interleaved plans (``Target.priced_p2p_overlap``): transfers overlapped."""


def _pipeline_input(graph, dp, tp, layers, *, micro_batches=4, settings=None, schedule="1f1b", chunks=1, devices_per_stage=None):
    """Megatron's pattern at dp x tp on every stage of a ``layers``-split pipeline (8 devices a node)."""
    settings = settings or TrainingSettings()
    devices = devices_per_stage or dp * tp
    spaces = spaces_for(graph, devices)
    spec = pipeline_spec(
        graph, layers, devices_per_stage=devices, micro_batch=graph.dim_bindings["batch"] // dp,
        micro_batches=micro_batches, schedule=schedule, chunks=chunks, settings=settings,
    )
    return make_input(
        graph, spaces, _megatron_choice(graph, spaces, dp, tp), cluster=make_cluster(1, 8), settings=settings,
        global_batch=spec.global_batch, pipeline=spec,
    )


class TestPipelineArgs:
    """megatron_pipeline_args: the stage split as flags, each expected list written by hand."""

    @pytest.mark.parametrize(
        ("layers", "chunks", "expected"),
        [
            ([4], 1, []),
            ([3, 3, 3, 3], 1, []),
            ([3, 5], 1, ["--decoder-first-pipeline-num-layers", "3", "--decoder-last-pipeline-num-layers", "5"]),
            ([2, 3, 3, 4], 1, ["--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "4"]),
            ([3, 3, 3, 1], 1, ["--decoder-last-pipeline-num-layers", "1"]),
            ([1, 4, 4, 4], 1, ["--decoder-first-pipeline-num-layers", "1"]),
            ([5, 2, 4], 1, ["--decoder-first-pipeline-num-layers", "5", "--decoder-last-pipeline-num-layers", "4"]),
            ([3, 2, 4, 3], 1, ["--pipeline-model-parallel-layout", "Et*3|t*2|t*4|t*3L"]),
            ([1, 0, 2, 1], 1, ["--pipeline-model-parallel-layout", "Et||t*2|tL"]),
            ([0, 3, 3, 2], 1, ["--pipeline-model-parallel-layout", "E|t*3|t*3|t*2L"]),
            ([4, 4], 2, ["--num-layers-per-virtual-pipeline-stage", "2"]),
            ([6, 6, 6], 3, ["--num-layers-per-virtual-pipeline-stage", "2"]),
            ([2, 2, 2, 4], 2, ["--decoder-last-pipeline-num-layers", "4", "--num-virtual-stages-per-pipeline-rank", "2"]),
            ([2, 4, 2, 4], 2, ["--pipeline-model-parallel-layout", "Et|t*2|t|t*2|t|t*2|t|t*2L"]),
        ],
    )
    def test_flags(self, layers, chunks, expected):
        pp = str(len(layers)) if len(layers) > 1 else "1"
        assert megatron_pipeline_args(layers, chunks=chunks) == ["--pipeline-model-parallel-size", pp, *expected]

    @pytest.mark.parametrize(("layers", "chunks", "layout"), [
        # chunks as even as whole layers allow, the first rank's first chunk and the others' last the lighter
        ([3, 3], 2, "Et|t*2|t*2|tL"), ([2, 4, 3], 2, "Et|t*2|t*2|t|t*2|tL")])
    def test_unequal_chunks_are_a_layout(self, layers, chunks, layout):
        assert megatron_pipeline_args(layers, chunks=chunks)[2:] == ["--pipeline-model-parallel-layout", layout]

    @pytest.mark.parametrize(
        ("layers", "chunks"),
        [([3, 3, 3, 3], 1), ([3, 5], 1), ([2, 3, 3, 4], 1), ([3, 2, 4, 3], 1), ([4, 4], 2), ([2, 2, 2, 4], 2), ([2, 4, 2, 4], 2),
         ([8, 8, 7, 7], 2), ([3, 3], 2)],
    )
    def test_every_split_passes_the_validator(self, layers, chunks):
        flags = megatron_pipeline_args(layers, chunks=chunks)
        base = [
            "--num-layers", str(sum(layers)), "--hidden-size", "64", "--num-attention-heads", "4",
            "--max-position-embeddings", "64", "--micro-batch-size", "1", "--global-batch-size", str(4 * len(layers)),
        ]
        assert megatron_violations([*base, *flags], world_size=len(layers)) == []


class TestPipelineExport:
    def test_even_stages(self):
        g = gpt_graph(layers=4)
        out = export_megatron(_pipeline_input(g, 2, 2, [2, 2]))
        assert out["args"] == [
            "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
            "--micro-batch-size", "4", "--global-batch-size", "32", "--overlap-grad-reduce", "--bf16",
            "--num-layers", "4", "--hidden-size", "64", "--ffn-hidden-size", "256", "--num-attention-heads", "4",
            "--seq-length", "16", "--max-position-embeddings", "32",
        ]
        assert (out["world_size"], out["nnodes"], out["nproc_per_node"]) == (8, 1, 8)
        assert out["degrees"] == {"dp": 2, "tp": 2, "pp": 2, "cp": 1, "sequence_parallel": False}
        assert out["batch"] == {"micro_batch_size": 4, "global_batch_size": 32, "num_microbatches": 4}
        assert out["pipeline"] == {"pp": 2, "schedule": "1f1b", "virtual_stages": 1, "layers_per_stage": [2, 2], "ranks_per_stage": 4}

    def test_uneven_first_and_last(self):
        g = gpt_graph(layers=8)
        out = export_megatron(_pipeline_input(g, 1, 2, [1, 2, 2, 3], micro_batches=8))
        args = parse_megatron_args(out["args"])
        assert args["pipeline-model-parallel-size"] == 4
        assert (args["decoder-first-pipeline-num-layers"], args["decoder-last-pipeline-num-layers"]) == (1, 3)
        assert (args["micro-batch-size"], args["global-batch-size"], out["world_size"]) == (8, 64, 8)

    def test_uneven_middle_is_a_layout(self):
        g = gpt_graph(layers=8)
        out = export_megatron(_pipeline_input(g, 1, 1, [3, 1, 2, 2]))
        assert parse_megatron_args(out["args"])["pipeline-model-parallel-layout"] == "Et*3|t|t*2|t*2L"
        assert "'Et*3|t|t*2|t*2L'" in out["command"]  # quoted for the shell
        assert (out["world_size"], out["nproc_per_node"]) == (4, 4)

    def test_interleaved(self):
        g = gpt_graph(layers=8)
        out = export_megatron(_pipeline_input(g, 2, 1, [4, 4], schedule="interleaved", chunks=2, settings=OVERLAPPED))
        args = parse_megatron_args(out["args"])
        assert args["num-layers-per-virtual-pipeline-stage"] == 2 and out["pipeline"]["virtual_stages"] == 2
        assert "no-overlap-p2p-communication" not in args  # priced overlapped: Megatron-LM's default, nothing written
        # priced waited (unresolved): the flag that waits them, which Megatron-LM refuses at pp = 2 (validate_args)
        with pytest.raises(UnsupportedExport, match=r"virtual pipeline stages need --pipeline-model-parallel-size > 2"):
            export_megatron(_pipeline_input(g, 2, 1, [4, 4], schedule="interleaved", chunks=2))
        waited = export_megatron(_pipeline_input(gpt_graph(layers=8), 1, 1, [2, 2, 2, 2], schedule="interleaved",
                                                 chunks=2))
        assert parse_megatron_args(waited["args"])["no-overlap-p2p-communication"]

    def test_interleaved_chunks_not_dividing(self):
        g = gpt_graph(layers=6)
        out = export_megatron(_pipeline_input(g, 2, 1, [3, 3], schedule="interleaved", chunks=2, settings=OVERLAPPED))
        assert parse_megatron_args(out["args"])["pipeline-model-parallel-layout"] == "Et|t*2|t*2|tL"
        assert megatron_violations(out["args"], world_size=out["world_size"]) == []

    def test_interleaved_micro_batches_must_fill_groups(self):
        g = gpt_graph(layers=8)
        with pytest.raises(UnsupportedExport, match=r"micro-batches per step \(3\) to be a multiple"):
            export_megatron(_pipeline_input(g, 2, 1, [4, 4], schedule="interleaved", chunks=2, micro_batches=3))

    @pytest.mark.parametrize(
        ("settings", "flags"),
        [
            (TrainingSettings(zero_stage=1), ["--overlap-grad-reduce", "--use-distributed-optimizer", "--overlap-param-gather"]),
            (TrainingSettings(recompute="full"), ["--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1"]),
            (TrainingSettings(recompute="selective", zero_stage=1), ["--recompute-granularity", "selective", "--overlap-grad-reduce", "--use-distributed-optimizer"]),
            (TrainingSettings(recompute="mlp"), ["--recompute-granularity", "selective", "--recompute-modules", "mlp", "--overlap-grad-reduce"]),
        ],
    )
    def test_zero_1_and_recompute(self, settings, flags):
        g = gpt_graph(layers=4)
        args = export_megatron(_pipeline_input(g, 2, 2, [2, 2], settings=settings))["args"]
        start = args.index("--global-batch-size") + 2
        assert args[start:start + len(flags)] == flags

    @pytest.mark.parametrize("stage", [2, 3])
    def test_zero_2_3_with_pipeline_refused(self, stage):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match=f"ZeRO-{stage} as Megatron-FSDP.*not with pipeline parallelism"):
            export_megatron(_pipeline_input(g, 2, 2, [2, 2], settings=TrainingSettings(zero_stage=stage)))

    def test_zero_3_on_one_stage_is_megatron_fsdp(self):
        g = gpt_graph(layers=4)
        out = export_megatron(_pipeline_input(g, 2, 2, [4], settings=TrainingSettings(zero_stage=3)))
        args = parse_megatron_args(out["args"])
        assert args["pipeline-model-parallel-size"] == 1 and args["data-parallel-sharding-strategy"] == "optim_grads_params"
        assert out["pipeline"] is None and out["batch"]["num_microbatches"] == 4

    def test_gpipe_refused(self):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match="no GPipe schedule"):
            export_megatron(_pipeline_input(g, 2, 2, [2, 2], schedule="gpipe"))

    def test_idle_stage_devices_refused(self):
        g = gpt_graph(layers=4)
        with pytest.raises(UnsupportedExport, match="dp=2 x tp=1 on stages of 4 devices"):
            export_megatron(_pipeline_input(g, 2, 1, [2, 2], devices_per_stage=4))

    def test_emitted_pipeline_flags_are_frozen(self):
        seen = set()
        for layers, chunks in (([2, 2, 2, 2], 1), ([1, 2, 2, 3], 1), ([3, 1, 2, 2], 1), ([4, 4], 2), ([2, 2, 2, 2], 2)):
            g = gpt_graph(layers=sum(layers))
            schedule = "interleaved" if chunks > 1 else "1f1b"
            out = export_megatron(_pipeline_input(g, 1, 1, layers, schedule=schedule, chunks=chunks, micro_batches=4,
                                                  settings=OVERLAPPED))
            seen |= {a for a in out["args"] if a.startswith("--") and "pipeline" in a}
        assert seen == {
            "--pipeline-model-parallel-size", "--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers",
            "--pipeline-model-parallel-layout", "--num-layers-per-virtual-pipeline-stage",
        }


def _in_space(space, factors) -> bool:
    try:
        space.index_of(factors)
    except KeyError:
        return False
    return True


def _transformer_config_kwargs(args: dict) -> dict:
    """megatron.training.arguments.core_transformer_config_from_args, for the flags we emit."""
    import torch
    import torch.nn.functional as F

    kwargs = dict(
        num_layers=args["num-layers"],
        hidden_size=args["hidden-size"],
        num_attention_heads=args["num-attention-heads"],
        ffn_hidden_size=args["ffn-hidden-size"],
        tensor_model_parallel_size=args["tensor-model-parallel-size"],
        pipeline_model_parallel_size=args["pipeline-model-parallel-size"],
        context_parallel_size=args.get("context-parallel-size", 1),
        sequence_parallel=bool(args.get("sequence-parallel")),
        normalization=args.get("normalization", "LayerNorm"),
        add_bias_linear=not args.get("disable-bias-linear"),
        add_qkv_bias=bool(args.get("add-qkv-bias")),
        bf16=bool(args.get("bf16")),
        params_dtype=torch.bfloat16 if args.get("bf16") else torch.float32,
    )
    if "attention-backend" in args:  # arguments.py's type, AttnBackend[name], parses it (a KeyError if not);
        from megatron.core.transformer.enums import AttnBackend  # the enum stays out of kwargs, which some tests

        AttnBackend[args["attention-backend"]]  # hand to a worker as JSON
    if "cp-comm-type" in args:  # core_transformer_config_from_args: one value for every layer
        comm = args["cp-comm-type"]
        kwargs["cp_comm_type"] = comm[0] if isinstance(comm, list) and len(comm) == 1 else comm
    if args.get("group-query-attention"):
        kwargs["num_query_groups"] = args["num-query-groups"]
    if "kv-channels" in args:
        kwargs["kv_channels"] = args["kv-channels"]
    if "norm-epsilon" in args:  # TransformerConfig.layernorm_epsilon's argparse_meta: --norm-epsilon (a float)
        kwargs["layernorm_epsilon"] = float(args["norm-epsilon"])
    if "window-size" in args:  # arguments.py's tuple_type: "63,0" -> (63, 0); the frequency as parsed
        kwargs["window_size"] = tuple(int(side) for side in args["window-size"].strip("()").split(","))
        kwargs["window_attn_skip_freq"] = args.get("window-attn-skip-freq")
    if args.get("swiglu"):
        kwargs.update(gated_linear_unit=True, activation_func=F.silu)
    if args.get("quick-geglu"):  # core_transformer_config_from_args: bias_activation_fusion from --bias-gelu-fusion
        from megatron.core.fusions.fused_bias_geglu import quick_gelu

        kwargs.update(gated_linear_unit=True, activation_func=quick_gelu,
                      bias_activation_fusion=not args.get("no-bias-gelu-fusion"))
    if "activation-func-clamp-value" in args:  # TransformerConfig fields of the same names (floats)
        kwargs["activation_func_clamp_value"] = float(args["activation-func-clamp-value"])
    if "glu-linear-offset" in args:
        kwargs["glu_linear_offset"] = float(args["glu-linear-offset"])
    if "softmax-type" in args:
        kwargs["softmax_type"] = args["softmax-type"]
    if "num-experts" in args:  # core_transformer_config_from_args: --num-experts is num_moe_experts
        kwargs.update(
            num_moe_experts=args["num-experts"],
            moe_router_topk=args["moe-router-topk"],
            expert_model_parallel_size=args.get("expert-model-parallel-size", 1),
            moe_router_pre_softmax=bool(args.get("moe-router-pre-softmax")),
            moe_shared_expert_intermediate_size=args.get("moe-shared-expert-intermediate-size"),
            moe_shared_expert_gate=bool(args.get("moe-shared-expert-gate")),
            moe_grouped_gemm=bool(args.get("moe-grouped-gemm")),
            moe_token_dispatcher_type=args.get("moe-token-dispatcher-type", "allgather"),
            # the router and the dense layers (DeepSeek-V3); arguments.py's moe_freq_type already read the pattern
            moe_router_score_function=args.get("moe-router-score-function", "softmax"),
            moe_router_enable_expert_bias=bool(args.get("moe-router-enable-expert-bias")),
            moe_router_num_groups=args.get("moe-router-num-groups"),
            moe_router_group_topk=args.get("moe-router-group-topk"),
            moe_router_topk_scaling_factor=float(args["moe-router-topk-scaling-factor"])
            if "moe-router-topk-scaling-factor" in args else None,
            moe_ffn_hidden_size=args.get("moe-ffn-hidden-size"),
            moe_layer_freq=args.get("moe-layer-freq", 1),
        )
        if "moe-expert-capacity-factor" in args:
            kwargs["moe_expert_capacity_factor"] = float(args["moe-expert-capacity-factor"])
    for name in ("recompute-granularity", "recompute-method", "recompute-num-layers", "recompute-modules"):
        if name in args:
            kwargs[name.replace("-", "_")] = args[name]
    if args.get("cpu-offloading-num-layers", 0) > 0:  # validate_args sets cpu_offloading from the layer count
        kwargs.update(cpu_offloading=True, cpu_offloading_num_layers=args["cpu-offloading-num-layers"])
    # core_transformer_config_from_args: the pipeline dtype is the parameters' dtype, the uneven
    # stages and layout pass through, and validate_args derives the virtual pipeline size.
    kwargs["pipeline_dtype"] = kwargs["params_dtype"]
    pp = args["pipeline-model-parallel-size"]
    kwargs["num_layers_in_first_pipeline_stage"] = args.get("decoder-first-pipeline-num-layers")
    kwargs["num_layers_in_last_pipeline_stage"] = args.get("decoder-last-pipeline-num-layers")
    vpp = None
    if "pipeline-model-parallel-layout" in args:
        from megatron.core.transformer.pipeline_parallel_layer_layout import PipelineParallelLayerLayout

        kwargs["pipeline_model_parallel_layout"] = args["pipeline-model-parallel-layout"]
        vpp = PipelineParallelLayerLayout.get_num_stages_from_str(args["pipeline-model-parallel-layout"]) // pp
    elif "num-layers-per-virtual-pipeline-stage" in args:
        vpp = args["num-layers"] // pp // args["num-layers-per-virtual-pipeline-stage"]
    elif "num-virtual-stages-per-pipeline-rank" in args:
        vpp = args["num-virtual-stages-per-pipeline-rank"]
    kwargs["virtual_pipeline_model_parallel_size"] = vpp if vpp and vpp > 1 else None
    # --no-overlap-p2p-communication is store_false on overlap_p2p_comm, kept by validate_args with virtual stages
    # only; core_transformer_config_from_args: batch_p2p_comm = not overlap_p2p_comm
    kwargs["overlap_p2p_comm"] = kwargs["virtual_pipeline_model_parallel_size"] is not None and not args.get(
        "no-overlap-p2p-communication")
    kwargs["batch_p2p_comm"] = not kwargs["overlap_p2p_comm"]
    return kwargs


def _megatron_layers_per_rank(config) -> list[int]:
    """Transformer layers megatron-core builds on each pipeline rank (all its model chunks)."""
    from megatron.core.transformer.enums import LayerType
    from megatron.core.transformer.transformer_block import get_num_layers_to_build

    pp = config.pipeline_model_parallel_size
    vpp = config.virtual_pipeline_model_parallel_size or 1
    layout = config.pipeline_model_parallel_layout
    if layout is not None:
        return [sum(chunk.count(LayerType.decoder) for chunk in layout.layout[rank]) for rank in range(pp)]
    return [vpp * get_num_layers_to_build(config, vp_stage=0, pp_rank=rank) for rank in range(pp)]
