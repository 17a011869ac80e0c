"""Issue 25: attention with QK-norm (Qwen3, OLMo-2, Gemma-3) is found, split over tp, and exported to
Megatron-LM (``--qk-layernorm``) or refused in one line naming what Megatron-LM cannot run.

Fixtures (``tests/exporters/data/``, TorchScript graph-only exports written by
``tests/integration/make_qk_norm_fixtures.py``): 2 layers, hidden 128, 4 heads of 16 channels, 2 KV
heads, FFN 256, vocabulary 512 (its ``COMMON``). Before the QK-norm walk the importer stopped at the
``q_norm`` between the projection and the scores, found no projection and said "model has no attention".
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters._tp import tp_layout
from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.families import family_refusals
from exporters.torchtitan.export import llama_refusals
from exporters.validate import validate_megatron
from importers.transformer import LayerFeatures, analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, llama_graph, make_input, spaces_for

DATA = Path(__file__).resolve().parent / "data"
DIMS = {"batch": 4, "seq": 16}
LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB = 2, 128, 4, 2, 16, 256, 512
"""make_qk_norm_fixtures.COMMON."""


@pytest.fixture(scope="module", params=["qwen3_tiny", "olmo2_tiny", "gemma3_tiny"])
def any_model(request):
    return request.param, load_graph(DATA / f"{request.param}.onnx", DIMS)


@pytest.fixture(scope="module")
def qwen3():
    return load_graph(DATA / "qwen3_tiny.onnx", DIMS)


def _norms(graph, model, role):
    return [i for i, op in enumerate(graph.ops) if op.kind == "norm" and model.roles[i] == role]


class TestRecognition:
    def test_attention_found_with_the_config_sizes(self, any_model):
        name, graph = any_model
        model = analyze_transformer(graph)
        assert model.irregular == ()
        assert (model.num_layers, model.hidden_size, model.num_attention_heads, model.num_query_groups,
                model.head_dim, model.ffn_hidden_size, model.vocab_size) == (
            LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN, VOCAB)
        assert model.normalization == "RMSNorm" and model.gated_mlp
        expected = "whole-projection" if name == "olmo2_tiny" else "per-head"
        assert [a.qk_norm for a in model.attention] == [expected] * LAYERS
        assert model.features.qk_norm == expected

    def test_layer_features(self, any_model):
        name, graph = any_model
        features = analyze_transformer(graph).features
        post = name != "qwen3_tiny"  # OLMo-2: output norms only; Gemma-3: sandwich (input and output norms)
        assert (features.post_attention_norm, features.post_mlp_norm) == (post, post)
        assert features.reordered_norm == (name == "olmo2_tiny")
        assert features.mlp_activation == ("gelu-tanh" if name == "gemma3_tiny" else "silu")
        assert features.attention_mask == "causal" and not features.parallel_residual

    def test_per_head_qk_norms_split_with_the_heads(self, qwen3):
        model = analyze_transformer(qwen3)
        qk = _norms(qwen3, model, "attention-glue")
        assert len(qk) == 2 * LAYERS  # q_norm and k_norm per layer
        assert len(_norms(qwen3, model, "norm")) == 2 * LAYERS + 1  # input, pre-MLP and the final norm
        layout = tp_layout(qwen3, model, target="megatron")
        for i in qk:  # split along the (KV) heads; the head_dim axis is normalised, its weight replicated
            dims = {d.name: d for d in qwen3.ops[i].dims}
            (split,) = layout.rules[i].split
            assert dims[split].size in (HEADS, KV_HEADS)
            assert [d.size for d in dims.values() if d.kind == "normalized"] == [HEAD_DIM]

    def test_whole_projection_norm_is_replicated(self):
        graph = load_graph(DATA / "olmo2_tiny.onnx", DIMS)
        model = analyze_transformer(graph)
        assert _norms(graph, model, "attention-glue") == []
        # OLMo-2: q_norm over 4 x 16, k_norm over 2 x 16 channels per layer, beside 2 output norms and the final one
        sizes = sorted(d.size for i in _norms(graph, model, "norm") for d in graph.ops[i].dims if d.kind == "normalized")
        assert sizes == sorted([KV_HEADS * HEAD_DIM] * LAYERS + [HEADS * HEAD_DIM] * LAYERS + [HIDDEN] * (2 * LAYERS + 1))


class TestMegatron:
    @pytest.mark.parametrize(("dp", "tp"), [(4, 1), (2, 2)])
    def test_qwen3_exports_with_qk_layernorm(self, qwen3, dp, tp):
        spaces = spaces_for(qwen3, dp * tp)
        masks = megatron_masks(qwen3, spaces, dp=dp, tp=tp)
        assert masks is not None  # tp=2 splits 4 heads and 2 KV heads 2 ways
        plan = export_megatron(make_input(qwen3, spaces, first_rows(masks), global_batch=16))
        assert plan["script"] == "pretrain_gpt.py" and plan["model_family"] == "gpt"
        args = validate_megatron(plan["args"], world_size=dp * tp, env=plan["env"])
        assert args["qk-layernorm"] is True and args["normalization"] == "RMSNorm" and args["swiglu"] is True
        assert (args["num-layers"], args["hidden-size"], args["num-attention-heads"], args["num-query-groups"],
                args["kv-channels"], args["ffn-hidden-size"]) == (LAYERS, HIDDEN, HEADS, KV_HEADS, HEAD_DIM, FFN)
        assert args["tensor-model-parallel-size"] == tp

    def test_no_qk_layernorm_without_qk_norm(self):
        graph = llama_graph()
        spaces = spaces_for(graph, 2)
        masks = megatron_masks(graph, spaces, dp=2, tp=1)
        plan = export_megatron(make_input(graph, spaces, first_rows(masks), global_batch=16))
        assert "--qk-layernorm" not in plan["args"]

    @pytest.mark.parametrize(
        ("name", "clauses"),
        [
            ("olmo2_tiny", ["not their inputs (x + norm(f(x)), OLMo-2's reordered norm)",
                            "queries and keys over the whole projection"]),
            ("gemma3_tiny", ["gated MLP gates with GELU, tanh approximation", "(sandwich norms, Gemma-2 and -3)",
                             "scales the attention scores by 1/sqrt(256), not 1/sqrt(16) of its head size"]),
        ],
    )
    def test_refused_in_one_line_naming_each_feature(self, name, clauses):
        graph = load_graph(DATA / f"{name}.onnx", DIMS)
        spaces = spaces_for(graph, 4)
        assert megatron_masks(graph, spaces, dp=2, tp=2) is None
        with pytest.raises(UnsupportedExport) as caught:
            export_megatron(make_input(graph, spaces, [0] * len(graph.ops), global_batch=16))
        reason = caught.value.reason
        assert "\n" not in reason and reason.startswith("Megatron-LM would train a different model: ")
        for clause in clauses:
            assert clause in reason
        assert ("sandwich" in reason) == (name == "gemma3_tiny")  # OLMo-2's output norms are not called sandwich

    def test_feature_clauses(self):
        model = analyze_transformer(llama_graph())

        def clauses(**features):
            return family_refusals(dataclasses.replace(model, features=LayerFeatures(mlp_activation="silu", **features)))

        assert clauses(qk_norm="per-head") == []  # --qk-layernorm reproduces it
        assert len(clauses(qk_norm="whole-projection")) == 1
        (reordered,) = clauses(post_attention_norm=True, post_mlp_norm=True, reordered_norm=True)
        assert "reordered norm" in reordered and "sandwich" not in reordered


def test_torchtitan_llama3_refuses_qk_norm(qwen3):
    """torchtitan 0.3's llama3 Attention has no q_norm / k_norm: the family must not train Qwen3 as Llama."""
    refusals = llama_refusals(analyze_transformer(qwen3))
    assert any("QK-norm" in r for r in refusals)


@pytest.mark.parametrize("name", ["qwen3_tiny", "olmo2_tiny"])
def test_column_split_launchers_refuse_a_whole_projection_qk_norm_at_tp(name):
    """DeepSpeed AutoTP and a DTensor plan run the model's own q_norm on the local heads of a column-split
    projection: right per head (Qwen3), wrong over the whole projection (OLMo-2), so tp > 1 is refused there."""
    from exporters.deepspeed import deepspeed_masks
    from exporters.dtensor.export import dtensor_masks

    graph = load_graph(DATA / f"{name}.onnx", DIMS)
    spaces = spaces_for(graph, 4)
    per_head = name == "qwen3_tiny"
    assert deepspeed_masks(graph, spaces, dp=4, tp=1) is not None
    assert (deepspeed_masks(graph, spaces, dp=2, tp=2) is not None) == per_head
    assert (dtensor_masks(graph, spaces, dp=2, tp=2) is not None) == per_head


class TestAttentionScale:
    @pytest.mark.parametrize(("name", "scale"), [("qwen3_tiny", HEAD_DIM ** -0.5), ("olmo2_tiny", HEAD_DIM ** -0.5),
                                                 ("gemma3_tiny", 256 ** -0.5)])  # Gemma-3: query_pre_attn_scalar 256
    def test_read_from_the_fixtures(self, name, scale):
        features = analyze_transformer(load_graph(DATA / f"{name}.onnx", DIMS)).features
        assert features.attention_scale == pytest.approx(scale)

    @staticmethod
    def _scores(tmp_path, *, factor_op, factor):
        """softmax((q @ k) <factor_op> factor + mask), ``factor`` a Constant scalar or a graph input."""
        import onnx
        from onnx import TensorProto as T
        from onnx import helper

        nodes = [helper.make_node("MatMul", ["q", "k"], ["s"], name="mm")]
        if factor is not None:
            nodes.append(helper.make_node("Constant", [], ["c"], value=helper.make_tensor("v", T.FLOAT, [], [factor])))
        nodes += [helper.make_node(factor_op, ["s", "c"], ["t"], name="scale"),
                  helper.make_node("Add", ["t", "mask"], ["u"], name="add"),
                  helper.make_node("Softmax", ["u"], ["p"], name="sm", axis=-1)]
        inputs = [helper.make_tensor_value_info(n, T.FLOAT, [2, 4, 4]) for n in ("q", "k", "mask")]
        if factor is None:
            inputs.append(helper.make_tensor_value_info("c", T.FLOAT, []))
        graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("p", T.FLOAT, [2, 4, 4])])
        path = tmp_path / f"{factor_op}_{factor}.onnx"
        onnx.save(helper.make_model(graph), path)
        return str(path)

    def test_hand_built(self, tmp_path):
        from importers.attention_scale import attention_scales

        assert attention_scales(self._scores(tmp_path, factor_op="Div", factor=8.0)) == {"sm": 1 / 8}  # GPT-2: / sqrt(64)
        assert attention_scales(self._scores(tmp_path, factor_op="Mul", factor=0.0625)) == {"sm": 0.0625}
        assert attention_scales(self._scores(tmp_path, factor_op="Mul", factor=None)) == {"sm": None}  # not a constant
