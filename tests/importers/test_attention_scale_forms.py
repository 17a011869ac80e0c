"""The attention scale is read wherever an exporter puts it (issue 25, importers/attention_scale.py).

torch's SDPA decomposition, which the dynamo exporter and a TorchScript export of
``F.scaled_dot_product_attention`` write, scales q and k^T by ``sqrt(scale)`` each before the
product; eager attention scales the product; Whisper and DeBERTa scale the query alone. Before, only
the product's factor was read: of the repo's 164 test ONNX files, the 127 read as transformers had 10
scales read, now 89. The small graphs check each form by hand; the committed files check the value
their transformers config gives.
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from importers.attention_scale import attention_scales

ROOT = Path(__file__).resolve().parents[2]
DATA, ZOO = ROOT / "tests" / "data", ROOT / "tests" / "zoo"


def _const(name: str, value: float, dtype: int = T.FLOAT) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=helper.make_tensor(name, dtype, [], [value]))


def _save(tmp_path: Path, nodes: list[onnx.NodeProto], name: str = "m.onnx",
          initializers: tuple[onnx.TensorProto, ...] = ()) -> str:
    """q and k [1, 2, 4, 8] (batch, heads, tokens, head size) and x [1, 4, 8] in; the Softmax ``sm`` of
    the scores ``s`` out."""
    inputs = [helper.make_tensor_value_info(n, T.FLOAT, [1, 2, 4, 8]) for n in ("q", "k")]
    inputs.append(helper.make_tensor_value_info("x", T.FLOAT, [1, 4, 8]))
    nodes = nodes + [helper.make_node("Softmax", ["s"], ["p"], name="sm", axis=-1)]
    graph = helper.make_graph(nodes, "g", inputs, [helper.make_tensor_value_info("p", T.FLOAT, None)],
                              initializer=list(initializers))
    path = tmp_path / name
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return str(path)


def _kt(key: str = "k") -> onnx.NodeProto:
    return helper.make_node("Transpose", [key], ["kt"], perm=[0, 1, 3, 2])


def test_sdpa_decomposition_scales_q_and_k_by_the_square_root(tmp_path):
    # torch._decomp's math SDPA (dynamo): q * sqrt(s) and k^T * sqrt(s), s = 1/sqrt(8) for a head of 8
    root = (1 / math.sqrt(8)) ** 0.5
    nodes = [_const("c", root), helper.make_node("Mul", ["q", "c"], ["qs"]), _kt(),
             helper.make_node("Mul", ["kt", "c"], ["ks"]), helper.make_node("MatMul", ["qs", "ks"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes))["sm"] == pytest.approx(1 / math.sqrt(8), rel=1e-7)


def test_torchscript_sdpa_with_an_explicit_scale(tmp_path):
    # torch.onnx's opset-14 SDPA symbolic with scale=0.0625 given: Cast(Sqrt(0.0625)) on each operand
    nodes = [_const("scale", 0.0625), helper.make_node("Sqrt", ["scale"], ["root"]),
             helper.make_node("Cast", ["root"], ["c"], to=T.FLOAT), helper.make_node("Mul", ["q", "c"], ["qs"]), _kt(),
             helper.make_node("Mul", ["kt", "c"], ["ks"]), helper.make_node("MatMul", ["qs", "ks"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes)) == {"sm": 0.0625}  # 0.25 * 0.25, exact in binary


def test_torchscript_sdpa_default_scale_from_the_shape_is_not_read(tmp_path):
    # scale=None: 1/sqrt(Shape(q)[-1]) computed at run time; the file holds no constant of it
    nodes = [helper.make_node("Shape", ["q"], ["shape"]),
             helper.make_node("Constant", [], ["start"], value=helper.make_tensor("start", T.INT64, [1], [-1])),
             helper.make_node("Constant", [], ["end"], value=helper.make_tensor("end", T.INT64, [1], [2 ** 62])),
             helper.make_node("Slice", ["shape", "start", "end"], ["last"]),
             helper.make_node("Cast", ["last"], ["d"], to=T.FLOAT), helper.make_node("Sqrt", ["d"], ["root_d"]),
             _const("one", 1.0), helper.make_node("Div", ["one", "root_d"], ["scale"]),
             helper.make_node("Sqrt", ["scale"], ["c"]), helper.make_node("Mul", ["q", "c"], ["qs"]), _kt(),
             helper.make_node("Mul", ["kt", "c"], ["ks"]), helper.make_node("MatMul", ["qs", "ks"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes)) == {"sm": None}


def test_a_divided_query_and_layout_nodes(tmp_path):
    # DeBERTa-v2: query / sqrt(head x 3) before the product, read back through the heads' Reshape
    shape = helper.make_tensor("shape", T.INT64, [4], [1, 2, 4, 8])
    nodes = [_const("root", math.sqrt(48.0)), helper.make_node("Div", ["q", "root"], ["qd"]),
             helper.make_node("Reshape", ["qd", "shape"], ["qr"]), _kt(), helper.make_node("MatMul", ["qr", "kt"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes, initializers=(shape,)))["sm"] == pytest.approx(48 ** -0.5, rel=1e-7)


def test_factors_on_both_sides_of_the_product_multiply(tmp_path):
    # 0.5 on the query, 0.25 on the key, then (q k^T) / 2 and a mask added: 0.5 x 0.25 / 2
    nodes = [_const("a", 0.5), _const("b", 0.25), _const("two", 2.0), helper.make_node("Mul", ["a", "q"], ["qs"]),
             _kt(), helper.make_node("Mul", ["kt", "b"], ["ks"]), helper.make_node("MatMul", ["qs", "ks"], ["raw"]),
             helper.make_node("Div", ["raw", "two"], ["scaled"]), helper.make_node("Add", ["scaled", "x"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes)) == {"sm": 0.0625}


def test_a_product_of_projections_with_no_factor_is_unscaled(tmp_path):
    # no Mul or Div between the projections and the softmax: the graph computes softmax(q k^T), scale 1 (T5's;
    # a W_q / sqrt(d) folded into the weights computes the same graph and cannot be told from it)
    weight = helper.make_tensor("w_q", T.FLOAT, [8, 8], [0.1] * 64)
    nodes = [helper.make_node("MatMul", ["q", "w_q"], ["qp"]), _kt(), helper.make_node("MatMul", ["qp", "kt"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes, initializers=(weight,))) == {"sm": None}  # k^T read from an input
    key = helper.make_tensor("w_k", T.FLOAT, [8, 8], [0.1] * 64)
    nodes = [helper.make_node("MatMul", ["q", "w_q"], ["qp"]), helper.make_node("MatMul", ["k", "w_k"], ["kp"]),
             _kt("kp"), helper.make_node("MatMul", ["qp", "kt"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes, initializers=(weight, key))) == {"sm": 1.0}


def test_a_stripped_factor_is_not_read_as_unscaled(tmp_path):
    # q * x, x no constant the file holds (as a stripped scalar): a factor not read, not 1
    key = helper.make_tensor("w_k", T.FLOAT, [8, 8], [0.1] * 64)
    nodes = [helper.make_node("Mul", ["q", "x"], ["qs"]), helper.make_node("MatMul", ["k", "w_k"], ["kp"]),
             _kt("kp"), helper.make_node("MatMul", ["qs", "kt"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes, initializers=(key,))) == {"sm": None}


def test_a_non_constant_factor_on_an_operand_stops_the_walk_there(tmp_path):
    # rotary's q * cos (a tensor, not a scalar) is not a scale: the factor after it still is
    nodes = [helper.make_node("Mul", ["q", "x"], ["qr"]), _const("c", 0.125), helper.make_node("Mul", ["qr", "c"], ["qs"]),
             _kt(), helper.make_node("MatMul", ["qs", "kt"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes)) == {"sm": 0.125}


def test_a_reshape_between_the_scaled_scores_and_the_softmax(tmp_path):
    # BLOOM's baddbmm: (q k^T) * 0.25 + alibi, reshaped to heads before the mask and the softmax
    shape = helper.make_tensor("shape", T.INT64, [4], [1, 2, 4, 4])
    nodes = [_kt(), helper.make_node("MatMul", ["q", "kt"], ["raw"]), _const("c", 0.25),
             helper.make_node("Mul", ["raw", "c"], ["scaled"]), helper.make_node("Reshape", ["scaled", "shape"], ["s"])]
    assert attention_scales(_save(tmp_path, nodes, initializers=(shape,))) == {"sm": 0.25}


def _read(path: Path) -> set[float | None]:
    """The scales of a file's attention softmaxes (a router's, which has none, left out)."""
    return {s for name, s in attention_scales(str(path)).items() if "gate" not in name}


@pytest.mark.parametrize("name", ["llama_dynamo_consts", "llama_ts_consts", "llama_ts_bare", "gpt_neox_dynamo_consts",
                                  "bert_ts_consts", "vit_dynamo_consts", "whisper_ts_consts", "mixtral_ts_consts"])
def test_the_zoo_default_scale(name):
    # zoo.json: hidden_size 64, 4 heads (d_model 64 for Whisper), so 1/sqrt(16) = 0.25 exactly
    config = json.loads((ZOO / "zoo.json").read_text())["files"][f"{name}.onnx"]["config"]
    head = (config.get("hidden_size") or config["d_model"]) // (config.get("num_attention_heads")
                                                               or config["encoder_attention_heads"])
    read = _read(ZOO / f"{name}.onnx")
    assert head == 16 and len(read) == 1 and read.pop() == pytest.approx(head ** -0.5, rel=1e-6)


def test_the_zoo_files_that_stay_unread():
    # dynamo bare: the scalar is external too, its data file deleted; TorchScript Falcon passes no scale,
    # so SDPA computes 1/sqrt(Shape(q)[-1]) at run time
    for name in ("llama_dynamo_bare", "falcon_ts_consts"):
        assert _read(ZOO / f"{name}.onnx") == {None}, name
    assert _read(ZOO / "t5_ts_consts.onnx") == {1.0}  # TorchScript writes T5's scale=1.0 as sqrt(1) on q and k
    assert _read(ZOO / "t5_dynamo_consts.onnx") == {1.0}  # dynamo writes no factor: MatMul(q, k^T) + bias


def test_yarn_mla_scale_is_transformers():
    # DeepseekV3Attention: qk_head_dim ** -0.5 x mscale ** 2, mscale = 0.1 mscale_all_dim ln(factor) + 1
    config = json.loads((DATA / "mla_cases" / "counts.json").read_text())["configs"]["mla_yarn"]
    rope = config["rope_parameters"]
    mscale = 0.1 * rope["mscale_all_dim"] * math.log(rope["factor"]) + 1
    expected = (config["qk_nope_head_dim"] + config["qk_rope_head_dim"]) ** -0.5 * mscale ** 2
    (read,) = _read(DATA / "mla_cases" / "mla_yarn_ts_consts.onnx")
    assert read == pytest.approx(expected, rel=1e-6) and read == pytest.approx(24 ** -0.5 * 1.1386294 ** 2, rel=1e-6)


def test_deberta_scale_factor_is_transformers():
    # DisentangledSelfAttention: 1/sqrt(head x (1 + len(pos_att_type))) = 1/sqrt(16 x 3)
    config = json.loads((DATA / "deberta_unshared" / "counts.json").read_text())["config"]
    head = config["hidden_size"] // config["num_attention_heads"]
    (read,) = _read(DATA / "deberta_unshared" / "deberta_unshared_dynamo_consts.onnx")
    assert read == pytest.approx((head * (1 + len(config["pos_att_type"]))) ** -0.5, rel=1e-6)
