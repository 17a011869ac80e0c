"""A rotary embedding written out, ``(x1 cos - x2 sin, x2 cos + x1 sin)`` with no ``Neg`` (GPT-OSS, DeepSeek-V3's
interleaved form, hand-written rotaries), is read as rotating its layers (issue 25; such a model read as rotating
none, so SmolLM3's NoPE layers were lost from the Megatron-LM export and torchtitan's took them for RoPE layers).

Fixtures: ``tests/data/rotary_cases/*_sub_*`` (``tests/importers/make_rotary_cases.py``: transformers' SmolLM3 and
GPT-NeoX with their ``apply_rotary_pos_emb`` written out, checked equal to it on the export's input). Oracles: the
configs (``SmolLM3Config.no_rope_layers[i] = int((i + 1) % interval != 0)``, 1 rotating; GPT-NeoX's
``partial_rotary_factor`` 0.25 of 64-channel heads and base 50,000), megatron-core 0.16.1's expansion of
``no_rope_freq`` N to ``([0] * (N - 1) + [1]) * (L / N)``, and hand-built graphs for the pattern's edges.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

from exporters import export
from exporters.megatron.families import megatron_family, megatron_rotary_args
from exporters.torchtitan import families as titan
from exporters.validate import parse_megatron_args
from importers.rotary import _written_rotations, rotary_frequencies, rotated_layers
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import make_cluster, make_input, spaces_for

DATA = Path(__file__).resolve().parents[1] / "data" / "rotary_cases"
DIMS = {"batch": 2, "seq": 64}
SMOLLM3_LAYERS, INTERVAL = 4, 2
NEOX_HEAD, NEOX_FRACTION, NEOX_BASE = 64, 0.25, 50000.0


def _no_neg(path: Path) -> bool:
    model = onnx.load(str(path), load_external_data=False)
    return all(node.op_type != "Neg" for node in model.graph.node)


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_nope_layers_of_a_written_rotation_reach_megatron(exporter):
    path = DATA / f"smollm3_sub_{exporter}_consts.onnx"
    assert _no_neg(path)  # the rotation is written with Sub, as the fixture means
    graph = load_graph(path, DIMS)
    model = analyze_transformer(graph)
    rotates = [int((i + 1) % INTERVAL != 0) for i in range(SMOLLM3_LAYERS)]  # SmolLM3Config's no_rope_layers
    assert rotated_layers(graph, model.attention) == tuple("both" if r else "none" for r in rotates)
    args, note = megatron_rotary_args(graph, model)
    assert args == ["--rotary-base", "2000000", "--no-rope-freq", "2"]  # SmolLM3Config's rope_theta 2e6
    freq = parse_megatron_args(["--num-layers", "4", *args])["no-rope-freq"]
    assert ([0] * (freq - 1) + [1]) * (SMOLLM3_LAYERS // freq) == [1 - r for r in rotates]  # TransformerConfig's
    out = export("megatron", make_input(graph, spaces_for(graph, 2), [0] * len(graph.ops), cluster=make_cluster(1, 2)))
    assert out["args"][out["args"].index("--no-rope-freq") + 1] == "2"
    with pytest.raises(UnsupportedExport, match=r"in layers 1, 3 \(counting from 0\) its attention does not rotate"):
        titan.torchtitan_arch(graph)


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_a_written_partial_rotation_reads_its_fraction_and_base(exporter):
    path = DATA / f"neox_sub_{exporter}_consts.onnx"
    assert _no_neg(path)
    graph = load_graph(path, DIMS)
    model = analyze_transformer(graph)
    assert rotated_layers(graph, model.attention) == ("both", "both")
    found = rotary_frequencies(path)
    assert found is not None and (2 * found.pairs, found.base) == (NEOX_HEAD * NEOX_FRACTION, NEOX_BASE)
    assert megatron_family(graph, model).family == "gpt"
    args, note = megatron_rotary_args(graph, model)
    assert args == ["--rotary-base", str(int(NEOX_BASE)), "--rotary-percent", f"{NEOX_FRACTION:g}"]
    assert "--no-rope-freq" not in args and "over 16 of 64 channels" in note


def _graph(nodes: list, path: Path) -> Path:
    """A graph over 4-element tensors ``x1 x2 c s`` (inputs) writing ``out``."""
    inputs = [helper.make_tensor_value_info(n, TensorProto.FLOAT, [4]) for n in ("x1", "x2", "c", "s")]
    outputs = [helper.make_tensor_value_info(n.output[0], TensorProto.FLOAT, [4]) for n in nodes[-2:]]
    model = helper.make_model(helper.make_graph(nodes, "g", inputs, outputs), opset_imports=[helper.make_opsetid("", 18)])
    onnx.save(model, str(path))
    return path


def _mul(a: str, b: str, out: str) -> onnx.NodeProto:
    return helper.make_node("Mul", [a, b], [out], name=out)


@pytest.mark.parametrize(("crossed", "expected"), [
    ((("x2", "c"), ("x1", "s")), {"sub"}),   # x2 c + x1 s: the rotation
    ((("s", "x1"), ("c", "x2")), {"sub"}),   # the same sum, operands the other way round
    ((("x1", "c"), ("x2", "s")), set()),     # x1 c + x2 s: not crossed, no rotation
    ((("x2", "s"), ("x1", "c")), set()),     # likewise
])
def test_the_crossed_sum_makes_the_rotation(tmp_path, crossed, expected):
    (a, b), (c, d) = crossed
    nodes = [_mul("x1", "c", "p"), _mul("x2", "s", "q"), _mul(a, b, "r"), _mul(c, d, "t"),
             helper.make_node("Sub", ["p", "q"], ["first"], name="sub"),
             helper.make_node("Add", ["r", "t"], ["second"], name="add")]
    assert set(_written_rotations(_graph(nodes, tmp_path / "m.onnx"))) == expected


def test_a_layernorm_difference_is_no_rotation(tmp_path):
    """``x - mean`` then a scale (a LayerNorm written out) subtracts no products."""
    nodes = [helper.make_node("ReduceMean", ["x1"], ["mean"], name="mean"),
             helper.make_node("Sub", ["x1", "mean"], ["centred"], name="sub"), _mul("centred", "c", "scaled"),
             helper.make_node("Add", ["scaled", "s"], ["out"], name="add")]
    assert _written_rotations(_graph(nodes, tmp_path / "m.onnx")) == frozenset()
