"""Issue 25: the Megatron export reproduces what the layers compute or refuses, naming the feature.

Fixtures (``tests/exporters/data/``, written by ``tests/integration/make_megatron_fixtures.py``):
``gemma2_tiny.onnx`` (GeGLU with GELU-tanh, attention and final-logit soft-capping, sandwich norms)
and ``qwen2_moe_tiny.onnx`` (4 experts top-2 without top-k renormalisation, a shared expert of FFN 64
with a sigmoid gate). The sliding window of ``gemma2_tiny`` is not tested: the mask is built from
shapes only and folded away on import, so no op of the graph shows it (docs/ARCHITECTURE.md).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters.megatron import export_megatron, feature_refusals, megatron_masks, megatron_moe_args
from exporters.validate import parse_megatron_args, validate_megatron
from importers.transformer import LayerFeatures, MoeSummary, _mlp_activation, analyze_transformer, moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, gpt_graph, llama_graph, make_input, spaces_for

DATA = Path(__file__).resolve().parent / "data"
ROOT = Path(__file__).resolve().parents[2]
DIMS = {"batch": 4, "seq": 16}


@pytest.fixture(scope="module")
def gemma2():
    return load_graph(DATA / "gemma2_tiny.onnx", DIMS)


@pytest.fixture(scope="module")
def qwen2_moe():
    return load_graph(DATA / "qwen2_moe_tiny.onnx", DIMS)


def _export(graph, dp, tp, ep=1, sequence_parallel=False):
    spaces = spaces_for(graph, dp * tp)
    masks = megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sequence_parallel)
    assert masks is not None
    plan_input = make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(expert_parallel=ep), global_batch=16)
    return export_megatron(plan_input)


class TestRecognition:
    def test_gemma2_features(self, gemma2):
        model = analyze_transformer(gemma2)
        assert not model.irregular and model.gated_mlp
        assert model.features == LayerFeatures(
            mlp_activation="gelu-tanh", attention_softcap=True, logit_softcap=True,
            post_attention_norm=True, post_mlp_norm=True, attention_mask="causal",
            attention_scale=16 ** -0.5,  # query_pre_attn_scalar=16 (make_megatron_fixtures.CONFIGS), the head size
            # the embedding's sqrt(hidden) normaliser; the soft-cap's division of the logits
            stream_scales=("embedding", "logits"),
        )

    def test_qwen2_moe_shared_experts(self, qwen2_moe):
        model = analyze_transformer(qwen2_moe)
        # was "2 attention blocks but 4 MLP blocks": the shared experts are told apart from the routed ones
        assert model.irregular == ()
        assert model.ffn_hidden_size == 32  # moe_intermediate_size
        assert [m.ffn_hidden_size for m in model.shared_experts] == [64, 64]  # shared_expert_intermediate_size
        assert model.shared_expert_gate
        # its SDPA scales q and k by 16 ** -0.25 each: 1/sqrt(16) of its head size, read since issue 25
        assert model.features.mlp_activation == "silu" and model.features == LayerFeatures(
            mlp_activation="silu", attention_mask="causal", attention_scale=pytest.approx(16 ** -0.5))
        assert moe_summary(qwen2_moe) == MoeSummary(layers=2, num_experts=4, top_k=2, renormalized=False)

    @pytest.mark.parametrize(
        ("path", "activation", "gated", "head"),
        [  # head: the head size, whose 1/sqrt scales the scores (llama_tiny: 64 / 8 heads, tests/integration/configs.py;
           # mixtral_tiny and gpt2_tiny: 64 / 4, tests/data/models.json; the zoo's: 64 / 4, zoo.json)
            ("tests/data/llama_tiny.onnx", "silu", True, 8),
            ("tests/data/mixtral_tiny.onnx", "silu", True, 16),
            ("tests/data/gpt2_tiny.onnx", "gelu-tanh", False, 16),
            ("tests/zoo/gemma_dynamo_consts.onnx", "gelu-tanh", True, 16),
            ("tests/zoo/gemma_ts_bare.onnx", "gelu-tanh", True, 16),
            ("tests/zoo/gpt_neox_ts_bare.onnx", "gelu-erf", False, 16),
            ("tests/zoo/opt_dynamo_consts.onnx", "relu", False, 16),
        ],
    )
    def test_activations_and_no_false_features(self, path, activation, gated, head):
        model = analyze_transformer(load_graph(ROOT / path, {"batch": 2, "seq": 16}))
        assert (model.features.mlp_activation, model.gated_mlp) == (activation, gated)
        # GPT-NeoX runs attention and MLP in parallel (use_parallel_residual, transformers' default);
        # Gemma multiplies its embeddings by sqrt(hidden) (GemmaModel's normalizer); the scale is read
        # from the SDPA's factors on q and k (head ** -0.25 each) or after the product (GPT-2's eager)
        assert model.features == LayerFeatures(mlp_activation=activation, attention_mask="causal",
                                               attention_scale=pytest.approx(head ** -0.5),
                                               parallel_residual="gpt_neox" in path,
                                               stream_scales=("embedding",) if "gemma" in path else ())
        assert model.shared_experts == () and not model.shared_expert_gate

    def test_mixtral_routing_is_renormalised(self):
        summary = moe_summary(load_graph(ROOT / "tests" / "data" / "mixtral_tiny.onnx", {"batch": 2, "seq": 16}))
        assert summary == MoeSummary(layers=2, num_experts=4, top_k=2, score_function="softmax", renormalized=True)

    @pytest.mark.parametrize(
        ("types", "expected"),
        [
            (("MatMul", "Sigmoid", "Mul"), "silu"),
            (("Split", "Sigmoid", "Mul", "Mul"), "silu"),
            (("MatMul", "Mul", "Sigmoid", "Mul"), "scaled-sigmoid"),
            (("MatMul", "Div", "Erf", "Add", "Mul", "Mul"), "gelu-erf"),
            (("MatMul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"), "gelu-tanh"),
            (("Gemm", "Relu"), "relu"),
            (("MatMul",), None),
            ((), None),
        ],
    )
    def test_activation_from_node_types(self, types, expected):
        assert _mlp_activation(types) == expected


class TestRefusals:
    def test_gemma2_is_refused_naming_every_feature(self, gemma2):
        spaces = spaces_for(gemma2, 4)
        assert megatron_masks(gemma2, spaces, dp=2, tp=2) is None
        with pytest.raises(UnsupportedExport) as caught:
            export_megatron(make_input(gemma2, spaces, [0] * len(gemma2.ops), global_batch=16))
        reason = caught.value.reason
        assert "\n" not in reason and reason.startswith("Megatron-LM would train a different model: ")
        for clause in ("gated MLP gates with GELU, tanh approximation (GeGLU", "--swiglu would train a SiLU gate",
                       "soft-caps the attention scores", "soft-caps the final logits",
                       "output of attention and the MLP before the residual add (sandwich norms",
                       "; export as the generic plan"):  # export_megatron itself: exporters.export names others
            assert clause in reason

    def test_gemma_geglu_no_longer_exported_as_swiglu(self):
        graph = load_graph(ROOT / "tests" / "zoo" / "gemma_dynamo_consts.onnx", {"batch": 2, "seq": 16})
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None

    @pytest.mark.parametrize(
        ("graph", "features", "expected"),
        [
            (llama_graph(), LayerFeatures(mlp_activation="silu"), []),
            (llama_graph(), LayerFeatures(), []),  # node types not recorded: nothing to refuse
            (llama_graph(), LayerFeatures(mlp_activation="gelu-erf"), ["gated MLP gates with GELU (GeGLU"]),
            (llama_graph(), LayerFeatures(mlp_activation="scaled-sigmoid"), ["quick-GELU"]),
            (gpt_graph(), LayerFeatures(mlp_activation="gelu-tanh"), []),
            (gpt_graph(), LayerFeatures(mlp_activation="gelu-erf"), []),
            (gpt_graph(), LayerFeatures(mlp_activation="relu"), ["its MLP uses ReLU"]),
            (gpt_graph(), LayerFeatures(attention_softcap=True), ["soft-caps the attention scores"]),
            (gpt_graph(), LayerFeatures(logit_softcap=True), ["soft-caps the final logits"]),
            (gpt_graph(), LayerFeatures(post_mlp_norm=True), ["output of the MLP before"]),
            (gpt_graph(), LayerFeatures(post_attention_norm=True), ["output of attention before"]),
        ],
    )
    def test_each_feature_gives_its_clause(self, graph, features, expected):
        model = dataclasses.replace(analyze_transformer(graph), features=features)
        found = feature_refusals(model)
        assert len(found) == len(expected)
        for clause, text in zip(expected, found):
            assert clause in text


class TestSharedExperts:
    def test_qwen2_moe_exports_shared_expert_flags(self, qwen2_moe):
        out = _export(qwen2_moe, dp=2, tp=2, ep=2, sequence_parallel=True)  # MoE at tp > 1: megatron-core needs sp
        args = parse_megatron_args(out["args"])
        assert args["sequence-parallel"] and args["tensor-model-parallel-size"] == 2
        assert args["num-experts"] == 4 and args["moe-router-topk"] == 2 and args["expert-model-parallel-size"] == 2
        assert args["ffn-hidden-size"] == 32
        assert args["moe-shared-expert-intermediate-size"] == 64 and args["moe-shared-expert-gate"]
        assert args["moe-router-pre-softmax"]  # norm_topk_prob=False: softmax, then top-k
        assert args["swiglu"] and args["add-qkv-bias"] and args["disable-bias-linear"]
        validate_megatron(out["args"], world_size=out["world_size"], env=out["env"])

    def test_mixtral_keeps_the_default_router_and_no_shared_expert(self):
        graph = load_graph(ROOT / "tests" / "data" / "mixtral_tiny.onnx", DIMS)
        args = parse_megatron_args(_export(graph, dp=2, tp=2, sequence_parallel=True)["args"])
        assert not {"moe-router-pre-softmax", "moe-shared-expert-intermediate-size", "moe-shared-expert-gate"} & set(args)

    def test_moe_flags(self):
        moe = MoeSummary(layers=2, num_experts=8, top_k=2)
        flags = megatron_moe_args(moe, ep=1, shared_ffn=128, shared_gate=True)
        assert flags[flags.index("--moe-shared-expert-intermediate-size") + 1] == "128"
        assert "--moe-shared-expert-gate" in flags and "--moe-router-pre-softmax" not in flags
        assert "--moe-shared-expert-gate" not in megatron_moe_args(moe, ep=1, shared_ffn=128)
        assert "--moe-router-pre-softmax" in megatron_moe_args(dataclasses.replace(moe, renormalized=False), ep=1)
        with pytest.raises(UnsupportedExport, match="router's scores are a sigmoid, not a softmax"):
            megatron_moe_args(dataclasses.replace(moe, score_function="sigmoid"), ep=1)

    def test_tp_without_sequence_parallel_is_refused_with_megatron_cores_reason(self, qwen2_moe):
        """megatron-core 0.16.1 MoELayer.forward raises while training at tp > 1 without sequence parallelism
        (transformer/moe/moe_layer.py); before h28f these were the only MoE tp > 1 families offered."""
        from exporters.megatron.export import _layout, _masks

        spaces = spaces_for(qwen2_moe, 2)
        result = _masks(qwen2_moe, spaces, _layout(qwen2_moe), dp=1, tp=2, sequence_parallel=False, devices_per_node=2)
        assert result.masks is None and "enabled without also enabling sequence parallelism" in result.reason
        assert megatron_masks(qwen2_moe, spaces, dp=1, tp=2, sequence_parallel=True) is not None

    def test_the_router_runs_on_the_sequence_shard(self, qwen2_moe):
        """TopKRouter's weight is whole on every tp rank and reads the rank's sequence shard: the router linear (the
        matmul whose [hidden, 4] weight feeds the expert choice: 4 experts, read from the file's shapes) splits its
        sequence tp ways and not its experts; the TopK splits its flattened tokens dp x tp ways."""
        import numpy as np

        spaces = spaces_for(qwen2_moe, 4)
        masks = megatron_masks(qwen2_moe, spaces, dp=2, tp=2, sequence_parallel=True)
        routers = [i for i, op in enumerate(qwen2_moe.ops) if op.kind == "matmul" and any(
            qwen2_moe.tensors[a.tensor].role == "parameter" and sorted(qwen2_moe.tensors[a.tensor].shape) == [4, 64]
            for a in op.inputs)]
        assert routers
        for index in routers:
            op, space = qwen2_moe.ops[index], spaces[index]
            seq, experts = op.inputs[0].axes[1][0], op.outputs[0].axes[1][0]
            for row in np.flatnonzero(masks[index]):
                factors = dict(zip(space.dim_names, space.factors[row]))
                assert factors[seq] == 2 and factors[experts] == 1
        for index in (i for i, op in enumerate(qwen2_moe.ops) if "TopK" in op.node_types):
            op, space = qwen2_moe.ops[index], spaces[index]
            batch = [space.dim_names.index(d.name) for d in op.dims if d.is_batch]
            assert all(int(np.prod(space.factors[row, batch])) == 4 for row in np.flatnonzero(masks[index]))

    def test_shared_ffn_must_divide_by_tp(self, qwen2_moe):
        from exporters.megatron.export import _layout, _masks

        layout = _layout(qwen2_moe)
        spaces = spaces_for(qwen2_moe, 4)
        assert _masks(qwen2_moe, spaces, layout, dp=1, tp=4, sequence_parallel=True, devices_per_node=4).masks is not None
        odd = tuple(dataclasses.replace(m, ffn_hidden_size=66) for m in layout.model.shared_experts)
        layout = dataclasses.replace(layout, model=dataclasses.replace(layout.model, shared_experts=odd))
        result = _masks(qwen2_moe, spaces, layout, dp=1, tp=4, sequence_parallel=True, devices_per_node=4)
        assert result.masks is None and result.reason == "the shared experts' FFN size 66 is not divisible by tp=4"
