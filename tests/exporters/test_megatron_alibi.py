"""Issue 25: BLOOM's ALiBi is found in the graph (importers/attention_masks.py: ``attention_biases``)
and the Megatron export refuses it in one line, where it used to assume rotary embeddings.

Fixtures: the zoo's ``bloom_*`` files (``tests/zoo/make_zoo.py``: transformers' ``BloomForCausalLM``
of 2 layers, hidden 64, 4 heads, both exporters, graph-only with and without small constants) and
two hand-built ONNX graphs of one attention, with and without slopes.
"""

from __future__ import annotations

from pathlib import Path

import pytest
from onnx import TensorProto as T
from onnx import helper

from exporters.megatron import feature_refusals, megatron_masks
from exporters.megatron.families import megatron_family
from importers.attention_masks import attention_biases
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import spaces_for

ZOO = Path(__file__).resolve().parents[1] / "zoo"
DIMS = {"batch": 16, "seq": 16, "tgt_seq": 16}
STYLES = ["dynamo_bare", "ts_bare", "dynamo_consts", "ts_consts"]


def _one_attention(factor_shape: list[int], positions: str) -> tuple:
    """``softmax(q k^T + factor * positions)`` over 4 heads and 8 tokens; ``positions``: the op
    that counts them (``Range`` or, for a value that is no position, ``Identity`` of an input)."""
    q = helper.make_tensor_value_info("q", T.FLOAT, [4, 8, 16])
    n = helper.make_tensor_value_info("n", T.FLOAT, [8])
    p = helper.make_tensor_value_info("p", T.FLOAT, [4, 8, 8])
    factor = helper.make_tensor("factor", T.FLOAT, factor_shape, [0.5] * max(1, _prod(factor_shape)))
    count = (helper.make_node("Range", ["zero", "eight", "one"], ["pos"]) if positions == "Range"
             else helper.make_node("Identity", ["n"], ["pos"]))
    nodes = [count, helper.make_node("Mul", ["factor", "pos"], ["bias"]),
             helper.make_node("MatMul", ["q", "kt"], ["s"]), helper.make_node("Add", ["s", "bias"], ["a"]),
             helper.make_node("Softmax", ["a"], ["p"], name="sm")]
    model = helper.make_model(helper.make_graph(nodes, "g", [q, n], [p], [factor]))
    shapes = {"factor": tuple(factor_shape), "pos": (8,), "bias": (4, 1, 8), "s": (4, 8, 8)}
    return model, shapes


def _prod(shape: list[int]) -> int:
    out = 1
    for d in shape:
        out *= d
    return out


class TestDetection:
    @pytest.mark.parametrize("style", STYLES)
    def test_every_bloom_layer_has_alibi(self, style):
        graph = load_graph(ZOO / f"bloom_{style}.onnx", DIMS)
        # 2 layers, one softmax each (tests/zoo/README.md: bloom has n_layer=2)
        assert list(graph.attention_biases.values()) == ["alibi", "alibi"]
        assert analyze_transformer(graph).features.alibi

    @pytest.mark.parametrize("arch", ["gpt2", "llama", "mistral", "qwen2", "phi", "falcon", "gpt_neox", "opt",
                                      "bert", "t5", "deberta_v2"])
    def test_no_other_position_scheme_is_alibi(self, arch):
        # learned tables (GPT-2, OPT), rotary (Llama...), T5's bucketed relative bias, DeBERTa's disentangled one
        graph = load_graph(ZOO / f"{arch}_ts_bare.onnx", DIMS)
        assert graph.attention_biases == {}

    def test_slopes_times_a_range(self):
        assert attention_biases(*_one_attention([4, 1, 1], "Range")) == {"sm": "alibi"}
        assert attention_biases(*_one_attention([4, 1], "Range")) == {"sm": "alibi"}  # BLOOM's TorchScript layout

    @pytest.mark.parametrize(("shape", "positions"), [
        ([1], "Range"),          # a scalar factor: a padding mask's (1 - m) * min, not per-head slopes
        ([1, 1, 1], "Range"),
        ([4, 1, 8], "Range"),    # varies along the key axis itself: a table, not slopes
        ([4, 1, 1], "Identity"),  # no position count in the other operand's lineage
    ])
    def test_what_is_not_alibi(self, shape, positions):
        assert attention_biases(*_one_attention(shape, positions)) == {}


class TestMegatronRefusal:
    @pytest.mark.parametrize("style", STYLES)
    def test_bloom_is_refused_in_one_line(self, style):
        graph = load_graph(ZOO / f"bloom_{style}.onnx", DIMS)
        model = analyze_transformer(graph)
        with pytest.raises(UnsupportedExport) as info:
            megatron_family(graph, model)
        reason = str(info.value)
        assert "\n" not in reason and "ALiBi" in reason and reason.endswith("; export as the generic plan")
        # and its embedding LayerNorm: 6 norms where Megatron's GPT of 2 layers has 2 x 2 + 1
        assert "it has 6 norms where Megatron-LM's GPT of 2 layers has 5" in reason
        # before: the export went through, with "--position-embedding-type rope" assumed
        assert megatron_masks(graph, spaces_for(graph, 2), dp=2, tp=1) is None

    def test_the_clause_names_the_flag_choices(self):
        model = analyze_transformer(load_graph(ZOO / "bloom_dynamo_bare.onnx", DIMS))
        (clause,) = feature_refusals(model)
        assert "learned_absolute, rope, mrope, yarn or none" in clause
