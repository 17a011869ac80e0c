"""Tests of exporters.dtensor: the family masks, the exported plan (styles, FQNs, parameter shards)
and the refusals. The plans are run for real in tests/integration/test_dtensor_run.py."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters import export, runnable_targets, target_masks
from exporters.dtensor import DtensorFamily, dtensor_families, dtensor_masks, export_dtensor, generalise_fqn
from exporters.megatron import megatron_masks
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import cnn_graph, first_rows, gpt_graph, llama_graph, make_cluster, make_input, set_split, spaces_for

FP32 = TrainingSettings(precision="fp32", optimizer="adam")
ROOT = Path(__file__).resolve().parents[2]


def _allowed(graph, spaces, masks, name):
    index = graph.op_index(name)
    return [spaces[index].describe(int(r)) for r in np.flatnonzero(masks[index])]


def _plan(graph, *, dp, tp, settings=FP32, cluster=None, **family):
    per_node = cluster.devices_per_node if cluster else None
    spaces = spaces_for(graph, dp * tp, per_node)
    masks = dtensor_masks(graph, spaces, dp=dp, tp=tp, devices_per_node=per_node, **family)
    assert masks is not None
    return export_dtensor(make_input(graph, spaces, first_rows(masks), settings=settings, cluster=cluster))


class TestMasks:
    def test_gpt_dp2_tp2_replicated_embedding_and_head(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        masks = dtensor_masks(g, spaces, dp=2, tp=2)
        expected = {
            "pos_emb": [{}],
            "tok_emb": [{"i0": 2}],  # replicated over tp
            "ln1_0": [{"d0": 2}],
            "qkv_0": [{"m_0": 2, "n": 2}],  # colwise
            "score_0": [{"b0": 2, "b1": 2}],  # local heads
            "out_0": [{"m_0": 2, "k_0": 2}],  # rowwise
            "fc2_0": [{"m_0": 2, "k": 2}],
            "lm_head": [{"b0": 2}],  # replicated over tp
        }
        for name, allowed in expected.items():
            assert _allowed(g, spaces, masks, name) == allowed, name

    def test_vocabulary_parallel_is_megatrons_pattern(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        for sp in (False, True):
            ours = dtensor_masks(g, spaces, dp=2, tp=2, sequence_parallel=sp, vocab_parallel_embedding=True, vocab_parallel_head=True)
            theirs = megatron_masks(g, spaces, dp=2, tp=2, sequence_parallel=sp)
            assert all(np.array_equal(a, b) for a, b in zip(ours, theirs))

    def test_tied_embedding_and_head_share_one_layout(self):
        g = gpt_graph()  # the LM head reads the embedding table
        spaces = spaces_for(g, 4)
        assert dtensor_masks(g, spaces, dp=2, tp=2, vocab_parallel_embedding=True) is None
        assert dtensor_masks(g, spaces, dp=2, tp=2, vocab_parallel_head=True) is None
        untied = llama_graph()
        spaces = spaces_for(untied, 4)
        assert dtensor_masks(untied, spaces, dp=2, tp=2, vocab_parallel_head=True) is not None

    def test_kv_heads_must_divide_by_tp(self):
        g = llama_graph(heads=8, kv_heads=2)
        spaces = spaces_for(g, 4)
        assert dtensor_masks(g, spaces, dp=1, tp=2) is not None
        assert dtensor_masks(g, spaces, dp=1, tp=4) is None  # Megatron replicates KV heads; DTensor would cut one
        assert megatron_masks(g, spaces, dp=1, tp=4) is not None

    def test_vocabulary_must_divide(self):
        g = llama_graph(vocab=90, kv_heads=4)
        spaces = spaces_for(g, 4)
        assert dtensor_masks(g, spaces, dp=1, tp=4) is not None
        assert dtensor_masks(g, spaces, dp=1, tp=4, vocab_parallel_head=True) is None  # 90 rows, 4 ranks

    def test_families_on_4_devices(self):
        # tp=1: dp 1, 2, 4; tp=2 (dp 1, 2) and tp=4 (dp 1): sp x {both or neither vocab-parallel}.
        tied = {f.label for f in dtensor_families(gpt_graph(), devices=4)}
        assert len(tied) == 3 + 2 * 2 * 2 + 2 * 2
        assert "dp=2 x tp=2 sp vocab-embedding vocab-head" in tied and "dp=2 x tp=2 vocab-head" not in tied
        untied = dtensor_families(llama_graph(), devices=4)
        assert len(untied) == 3 + 3 * 2 * 4
        assert {f.label for f in dtensor_families(cnn_graph(), devices=4)} == {"dp=1 x tp=1", "dp=2 x tp=1", "dp=4 x tp=1"}

    def test_target_masks_lists_the_runnable_families(self):
        g = llama_graph(heads=8, kv_heads=2)
        labels = {label for label, _ in target_masks("dtensor", g, spaces_for(g, 4), devices=4)}
        assert "dp=2 x tp=2 sp vocab-embedding" in labels
        assert not any(label.startswith("dp=1 x tp=4") for label in labels)  # 2 KV heads


class TestPlan:
    def test_gpt_2x2_tp_plan_in_torch_vocabulary(self):
        plan = _plan(gpt_graph(), dp=2, tp=2, vocab_parallel_embedding=True, vocab_parallel_head=True)
        assert plan["mesh"] == {"shape": [2, 2], "dim_names": ["dp", "tp"]}
        assert plan["world_size"] == 4 and plan["command"].startswith("torchrun --nproc-per-node 4 -m planner.run")
        tp_plan = plan["tp_plan"]
        assert set(tp_plan) == {
            "transformer.wte",
            "transformer.h.*.attn.c_attn",
            "transformer.h.*.attn.c_proj",
            "transformer.h.*.mlp.c_fc",
            "transformer.h.*.mlp.c_proj",
            "lm_head",
        }
        replicate, shard_last = [["replicate"]], [["shard", -1]]
        assert tp_plan["transformer.h.*.attn.c_attn"] == {
            "style": "colwise", "input_layouts": replicate, "output_layouts": shard_last, "use_local_output": True,
            "packed": [64, 64, 64],  # q, k, v of the fused Conv1D
        }
        assert tp_plan["transformer.h.*.mlp.c_proj"] == {
            "style": "rowwise", "input_layouts": shard_last, "output_layouts": replicate, "use_local_output": True,
        }
        assert tp_plan["transformer.wte"]["style"] == "rowwise" and tp_plan["transformer.wte"]["input_layouts"] == replicate
        assert tp_plan["lm_head"]["style"] == "colwise" and tp_plan["lm_head"]["output_layouts"] == replicate
        assert plan["fsdp"] is None and plan["data_parallel"]["gradient_sync"] == "all_reduce_mean"
        assert plan["batch"]["micro_batch_per_rank"] == 4  # gpt_graph's batch of 8 over dp=2

    def test_gpt_parameter_shards_by_hand(self):
        params = _plan(gpt_graph(), dp=2, tp=2, vocab_parallel_embedding=True, vocab_parallel_head=True)["params"]
        # Conv1D weights [in, out] are given as nn.Linear's [out, in]; 3 x 64 QKV rows over tp=2.
        qkv = params["transformer.h.0.attn.c_attn.weight"]
        assert (qkv["shape"], qkv["local_shape"], qkv["from_conv1d"]) == ([192, 64], [96, 64], True)
        assert qkv["placements"] == {"dp": "replicate", "tp": "shard(0)"}
        out = params["transformer.h.1.attn.c_proj.weight"]
        assert (out["shape"], out["local_shape"], out["placements"]["tp"]) == ([64, 64], [64, 32], "shard(1)")
        assert params["transformer.h.1.attn.c_proj.bias"]["local_shape"] == [64]  # rowwise bias: replicated
        table = params["lm_head.weight"]  # the tied table, read by the embedding and the head
        assert (table["local_shape"], table["aliases"]) == ([48, 64], ["transformer.wte.weight"])
        assert params["transformer.wpe.weight"]["local_shape"] == [32, 64]

    def test_zero3_shards_dim0_over_dp(self):
        plan = _plan(gpt_graph(), dp=2, tp=2, settings=TrainingSettings(precision="fp32", zero_stage=3))
        assert plan["fsdp"] == {"mesh_dims": ["dp"], "reshard_after_forward": True, "modules": ["transformer.h.*"], "root": True}
        params = plan["params"]
        assert params["transformer.h.0.attn.c_attn.weight"]["local_shape"] == [48, 64]  # 192 / tp 2 / dp 2
        assert params["transformer.h.0.mlp.c_proj.weight"]["local_shape"] == [32, 128]  # [64 / dp, 256 / tp]
        assert params["transformer.h.0.ln_1.weight"]["placements"] == {"dp": "shard(0)", "tp": "replicate"}

    def test_hsdp_shards_over_the_inner_mesh_dim(self):
        # dp=4 as 2 replicas x a shard group of 2: fully_shard per block and at the root on a
        # (dp_replicate 2, dp_shard 2) mesh; dim 0 divided by 2, not 4
        settings = TrainingSettings(precision="fp32", zero_stage=3, dp_shard=2)
        plan = _plan(gpt_graph(), dp=4, tp=1, settings=settings)
        assert plan["fsdp"] == {"mesh_dims": ["dp_replicate", "dp_shard"], "mesh_shape": [2, 2], "reshard_after_forward": True,
                                "modules": ["transformer.h.*"], "root": True}
        assert plan["data_parallel"]["gradient_sync"] == "hsdp_reduce_scatter_all_reduce"
        assert plan["params"]["transformer.h.0.attn.c_attn.weight"]["local_shape"] == [96, 64]  # 192 / 2
        # a shard group of every dp rank is plain FSDP2
        plain = _plan(gpt_graph(), dp=4, tp=1, settings=TrainingSettings(precision="fp32", zero_stage=3, dp_shard=4))
        assert plain["fsdp"]["mesh_dims"] == ["dp"] and plain["params"]["transformer.h.0.attn.c_attn.weight"]["local_shape"] == [48, 64]

    def test_sequence_parallel_styles(self):
        tp_plan = _plan(gpt_graph(), dp=1, tp=2, sequence_parallel=True)["tp_plan"]
        shard_seq = [["shard", 1]]
        assert tp_plan["transformer.h.*.ln_1"] == {"style": "sequence_parallel", "sequence_dim": 1, "use_local_output": False}
        assert tp_plan["transformer.ln_f"]["style"] == "sequence_parallel"
        assert tp_plan["transformer.h.*.attn.c_attn"]["input_layouts"] == shard_seq
        assert tp_plan["transformer.h.*.mlp.c_proj"]["output_layouts"] == shard_seq
        assert tp_plan["transformer.h.*.mlp.c_proj"]["use_local_output"] is False
        # Replicated embeddings and head: their outputs / input turned into / from sequence shards.
        for name in ("transformer.wte", "transformer.wpe"):
            assert tp_plan[name]["style"] == "prepare_output" and tp_plan[name]["desired_output_layouts"] == shard_seq
        assert tp_plan["lm_head"] == {
            "style": "prepare_input", "input_layouts": shard_seq, "desired_input_layouts": [["replicate"]], "use_local_output": True,
        }

    def test_llama_anonymous_weights_take_the_module_path(self):
        params = _plan(llama_graph(named_weights=False), dp=1, tp=2)["params"]
        q = params["model.layers.0.self_attn.q_proj.weight"]  # a pre-transposed val_N [in, out] in the graph
        assert (q["shape"], q["local_shape"], q["from_conv1d"]) == ([128, 128], [64, 128], False)
        kv = params["model.layers.1.self_attn.k_proj.weight"]
        assert (kv["shape"], kv["local_shape"]) == ([32, 128], [16, 128])  # 2 KV heads of 16
        assert params["model.layers.0.mlp.down_proj.weight"]["local_shape"] == [128, 96]

    def test_fused_qkv_with_gqa_is_packed_by_part(self):
        tp_plan = _plan(llama_graph(fused_qkv=True), dp=1, tp=2)["tp_plan"]
        assert tp_plan["model.layers.*.self_attn.qkv_proj"]["packed"] == [128, 32, 32]

    def test_layers_differing_are_not_generalised(self):
        g = gpt_graph()
        spaces = spaces_for(g, 2)
        masks = dtensor_masks(g, spaces, dp=1, tp=2, sequence_parallel=True)
        plan = export_dtensor(make_input(g, spaces, first_rows(masks), settings=FP32))
        assert generalise_fqn("transformer.h.1.ln_2") in plan["tp_plan"]

    def test_plan_across_nodes(self):
        plan = _plan(llama_graph(), dp=4, tp=2, cluster=make_cluster(nodes=2, devices_per_node=4))
        assert (plan["nnodes"], plan["nproc_per_node"]) == (2, 4)
        assert "--nnodes 2" in plan["command"] and "$MASTER_ADDR" in plan["command"]

    def test_pure_data_parallel_of_any_model(self):
        g = cnn_graph()
        spaces = spaces_for(g, 4)
        choice = [s.index_of({d.name: 4 for d in op.dims if d.is_batch}) for op, s in zip(g.ops, spaces)]
        plan = export_dtensor(make_input(g, spaces, choice, settings=FP32))
        assert plan["tp_plan"] == {} and plan["mesh"]["shape"] == [4, 1] and plan["model"] is None
        assert plan["params"]["fc.weight"]["local_shape"] == [10, 1024]

    def test_registered(self):
        g = llama_graph()
        spaces = spaces_for(g, 4)
        plan_input = make_input(g, spaces, first_rows(dtensor_masks(g, spaces, dp=2, tp=2)), settings=FP32)
        assert export("dtensor", plan_input)["target"] == "dtensor"
        assert "dtensor" in runnable_targets(plan_input)

    def test_real_gpt2_export(self):
        from planner.plan import load_graph

        g = load_graph(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"batch": 4, "seq": 16})
        plan = _plan(g, dp=2, tp=2, vocab_parallel_embedding=True, vocab_parallel_head=True)
        params = plan["params"]
        assert sum(np.prod(e["shape"]) for e in params.values()) == 172288  # models.json param_count
        assert params["lm_head.weight"]["aliases"] == ["transformer.wte.weight"]
        assert plan["tp_plan"]["transformer.h.*.attn.c_attn"]["packed"] == [64, 64, 64]
        assert plan["model"]["num_layers"] == 2 and plan["model"]["tied_embeddings"] is True


class TestRefusals:
    def _input(self, graph, dp, tp, settings=FP32, **family):
        spaces = spaces_for(graph, dp * tp)
        return graph, spaces, first_rows(dtensor_masks(graph, spaces, dp=dp, tp=tp, **family))

    @pytest.mark.parametrize("stage", [1, 2])
    def test_zero_1_and_2(self, stage):
        g, spaces, choice = self._input(gpt_graph(), 2, 1)
        with pytest.raises(UnsupportedExport, match=f"ZeRO-{stage} has no FSDP2 equivalent"):
            export_dtensor(make_input(g, spaces, choice, settings=TrainingSettings(zero_stage=stage)))

    def test_selective_recompute(self):
        g, spaces, choice = self._input(gpt_graph(), 2, 1)
        with pytest.raises(UnsupportedExport, match="selective"):
            export_dtensor(make_input(g, spaces, choice, settings=TrainingSettings(recompute="selective")))

    def test_off_pattern_op_is_named(self):
        g, spaces, choice = self._input(gpt_graph(), 2, 2)
        bad = set_split(g, spaces, choice, "fc2_1", {"m_0": 2, "n": 2})
        with pytest.raises(UnsupportedExport, match=r"op fc2_1 \(fc2\) is split m_0=2 x n=2; a DTensor plan on dp=2 x tp=2 splits it m_0=2 x k=2"):
            export_dtensor(make_input(g, spaces, bad, settings=FP32))

    def test_partial_sequence_parallelism(self):
        g, spaces, choice = self._input(gpt_graph(), 1, 2, sequence_parallel=True)
        bad = set_split(g, spaces, choice, "ln2_0", {})
        with pytest.raises(UnsupportedExport, match="splits every norm and residual op"):
            export_dtensor(make_input(g, spaces, bad, settings=FP32))

    def test_kv_heads(self):
        g = llama_graph(heads=8, kv_heads=2)
        spaces = spaces_for(g, 4)
        choice = first_rows(megatron_masks(g, spaces, dp=1, tp=4))
        with pytest.raises(UnsupportedExport, match="2 KV heads are not divisible by tp=4"):
            export_dtensor(make_input(g, spaces, choice, settings=FP32))

    def test_tied_weight_split_one_way(self):
        g = gpt_graph()
        spaces = spaces_for(g, 4)
        choice = first_rows(dtensor_masks(g, spaces, dp=2, tp=2))
        bad = set_split(g, spaces, choice, "lm_head", {"b0": 2, "n": 2})
        with pytest.raises(UnsupportedExport, match="tied embedding and LM head share one weight"):
            export_dtensor(make_input(g, spaces, bad, settings=FP32))


def test_family_label():
    assert DtensorFamily(dp=2, tp=4, sequence_parallel=True, vocab_parallel_head=True).label == "dp=2 x tp=4 sp vocab-head"


def test_a_root_parameter_is_refused_with_the_reason(tmp_path):
    # a weight held by the root module (named "w", no dotted path) cannot be named by a DTensor plan
    import onnx
    from onnx import TensorProto, helper

    from importers import import_model

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 16])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 8])
    w = helper.make_tensor("w", TensorProto.FLOAT, [16, 8], [0.5] * 128)
    graph = helper.make_graph([helper.make_node("MatMul", ["x", "w"], ["y"])], "m", [x], [y], [w])
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), tmp_path / "m.onnx")
    g = import_model(tmp_path / "m.onnx", {"batch": 8})
    spaces = spaces_for(g, 2)
    split = [s.index_of({"m": 2}) for s in spaces]  # data parallel
    with pytest.raises(UnsupportedExport, match="root module"):
        export_dtensor(make_input(g, spaces, split, settings=FP32))
