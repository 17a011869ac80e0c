"""Routed-experts layers are found in every export style (importers.moe), numbers from the configs."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from importers.moe import find_moe_layers
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data"
ZOO = Path(__file__).resolve().parents[1] / "zoo"


def _weight(name: str, shape: tuple[int, ...]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.full(shape, 0.01, dtype=np.float32), name)


def _const(name: str, values: list[int]) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], value=numpy_helper.from_array(np.array(values, dtype=np.int64), name + "_v"))


def _router(hidden: int, experts: int, top_k: int) -> tuple[list, list]:
    nodes = [
        helper.make_node("MatMul", ["x", "router.weight"], ["logits"], name="router"),
        helper.make_node("Softmax", ["logits"], ["probs"], axis=-1, name="softmax"),
        _const("k", [top_k]),
        helper.make_node("TopK", ["probs", "k"], ["top_values", "top_indices"], axis=-1, name="topk"),
        _const("axis_last", [-1]),
        helper.make_node("ReduceSum", ["top_values", "axis_last"], ["kept"], keepdims=1, name="kept_sum"),
    ]
    return nodes, [_weight("router.weight", (hidden, experts))]


def batched_moe(path: Path, *, hidden: int = 16, ffn: int = 32, experts: int = 4, top_k: int = 2) -> Path:
    """Dense batched experts: every token through every expert as [E, T, h] x [E, h, f] matmuls."""
    nodes, weights = _router(hidden, experts, top_k)
    nodes += [
        _const("axis0", [0]),
        helper.make_node("Unsqueeze", ["x", "axis0"], ["x1"], name="x_unsqueeze"),
        helper.make_node("MatMul", ["x1", "experts.w1"], ["up"], name="experts_up"),
        helper.make_node("Relu", ["up"], ["act"], name="experts_act"),
        helper.make_node("MatMul", ["act", "experts.w2"], ["down"], name="experts_down"),
        helper.make_node("Transpose", ["probs"], ["gates_t"], perm=[1, 0], name="gates_t"),
        helper.make_node("Unsqueeze", ["gates_t", "axis_last"], ["gates"], name="gates_unsqueeze"),
        helper.make_node("Mul", ["down", "gates"], ["weighted"], name="combine_mul"),
        helper.make_node("ReduceSum", ["weighted", "axis0"], ["combined"], keepdims=0, name="combine"),
        helper.make_node("Mul", ["combined", "kept"], ["y"], name="scale"),
    ]
    weights += [_weight("experts.w1", (experts, hidden, ffn)), _weight("experts.w2", (experts, ffn, hidden))]
    return _save(path, nodes, weights, hidden)


def linear_experts_moe(path: Path, *, hidden: int = 16, ffn: int = 32, experts: int = 4, top_k: int = 2) -> Path:
    """Per-expert linears: E pairs of [h, f] / [f, h] matmuls over every token, summed by gate."""
    nodes, weights = _router(hidden, experts, top_k)
    total = None
    for e in range(experts):
        nodes += [
            helper.make_node("MatMul", ["x", f"experts.{e}.w1"], [f"up{e}"], name=f"experts.{e}.up"),
            helper.make_node("Relu", [f"up{e}"], [f"act{e}"], name=f"experts.{e}.act"),
            helper.make_node("MatMul", [f"act{e}", f"experts.{e}.w2"], [f"down{e}"], name=f"experts.{e}.down"),
            _const(f"col{e}", [e]),
            helper.make_node("Gather", ["probs", f"col{e}"], [f"gate{e}"], axis=1, name=f"gate{e}"),
            helper.make_node("Mul", [f"down{e}", f"gate{e}"], [f"weighted{e}"], name=f"experts.{e}.weight"),
        ]
        weights += [_weight(f"experts.{e}.w1", (hidden, ffn)), _weight(f"experts.{e}.w2", (ffn, hidden))]
        if total is None:
            total = f"weighted{e}"
        else:
            nodes.append(helper.make_node("Add", [total, f"weighted{e}"], [f"sum{e}"], name=f"sum{e}"))
            total = f"sum{e}"
    nodes.append(helper.make_node("Mul", [total, "kept"], ["y"], name="scale"))
    return _save(path, nodes, weights, hidden)


def _save(path: Path, nodes: list, weights: list, hidden: int) -> Path:
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", hidden])
    y = helper.make_tensor_value_info("y", T.FLOAT, ["batch", hidden])
    model = helper.make_model(helper.make_graph(nodes, "moe", [x], [y], weights), opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    onnx.save(model, path)
    return path


def test_mixtral_gather_export_is_recognised_with_its_config_numbers():
    config = json.loads((DATA / "models.json").read_text())["mixtral_tiny"]["config"]
    batch, seq = 16, 512
    graph = import_model(DATA / "mixtral_tiny.onnx", {"batch": batch, "seq": seq})
    layers = find_moe_layers(graph)
    assert len(layers) == config["layers"] == 2
    experts, top_k = config["num_local_experts"], config["num_experts_per_tok"]
    hidden, ffn = config["hidden"], config["intermediate"]
    for layer in layers:
        assert (layer.num_experts, layer.top_k, layer.hidden, layer.ffn) == (experts, top_k, hidden, ffn)
        assert layer.style == "gather"
        assert layer.tokens == batch * seq
        assert len(layer.weight_gathers) == 2 and len(layer.expert_matmuls) == 2
        # the expert weights hold E x (2 ffn x h + h x ffn) parameters (fused gate+up, then down)
        sizes = sum(graph.tensors[p].num_elements for p in layer.expert_parameters)
        assert sizes == experts * (2 * ffn * hidden + hidden * ffn)
        assert graph.ops[layer.topk_op].op_type == "TopK"
        assert graph.ops[layer.router_op].kind == "matmul"
        assert set(layer.weight_gathers) | set(layer.expert_matmuls) <= set(layer.expert_ops)


def test_routed_graph_drops_the_weight_gathers_and_keeps_the_parameters():
    dims = {"batch": 4, "seq": 32}
    raw = import_model(DATA / "mixtral_tiny.onnx", dims)
    routed = load_graph(DATA / "mixtral_tiny.onnx", dims)
    expected = json.loads((DATA / "models.json").read_text())["mixtral_tiny"]["param_count"]
    assert raw.parameter_count == routed.parameter_count == expected
    assert len(raw.ops) - len(routed.ops) == 4  # 2 gathers per layer, 2 layers
    layers = find_moe_layers(routed)
    assert [layer.style for layer in layers] == ["routed", "routed"]
    assert all((layer.num_experts, layer.top_k) == (4, 2) for layer in layers)
    # no op writes a per-token copy of the expert weights any more ([T k, a, b] with T k = 4*32*2)
    copies = {(4 * 32 * 2, 256, 64), (4 * 32 * 2, 64, 128)}
    assert any(raw.tensors[o.tensor].shape in copies for op in raw.ops for o in op.outputs)
    assert not any(routed.tensors[o.tensor].shape in copies for op in routed.ops for o in op.outputs)
    # edges still join producers to consumers through real tensors
    for edge in routed.edges:
        assert routed.ops[edge.producer].outputs[edge.producer_output].tensor == edge.tensor
        assert routed.ops[edge.consumer].inputs[edge.consumer_input].tensor == edge.tensor
    assert all(len(i) == len(routed.blocks[0].instances[0]) for i in routed.blocks[0].instances)


def test_torchscript_export_of_the_same_layer_is_recognised():
    path = ZOO / "mixtral_ts_consts.onnx"
    if not path.exists():
        pytest.skip("the zoo's TorchScript Mixtral is not built here")
    layers = find_moe_layers(import_model(path, {"batch": 2, "seq": 16}))
    assert [(layer.num_experts, layer.top_k, layer.hidden, layer.ffn, layer.style) for layer in layers] == [(4, 2, 64, 128, "gather")] * 2


def test_batched_expert_matmuls_are_recognised(tmp_path):
    graph = import_model(batched_moe(tmp_path / "batched.onnx", hidden=16, ffn=32, experts=4, top_k=2), {"batch": 8})
    (layer,) = find_moe_layers(graph)
    assert (layer.style, layer.num_experts, layer.top_k, layer.hidden, layer.ffn, layer.tokens) == ("batched", 4, 2, 16, 32, 8)
    assert sorted(graph.ops[i].name for i in layer.expert_matmuls) == ["experts_down", "experts_up"]
    assert set(layer.expert_parameters) == {"experts.w1", "experts.w2"}


def test_per_expert_linears_are_recognised(tmp_path):
    graph = import_model(linear_experts_moe(tmp_path / "linears.onnx", hidden=16, ffn=32, experts=4, top_k=1), {"batch": 8})
    (layer,) = find_moe_layers(graph)
    assert (layer.style, layer.num_experts, layer.top_k, layer.hidden, layer.ffn) == ("linears", 4, 1, 16, 32)
    assert len(layer.expert_matmuls) == 2 * 4
    assert len(layer.expert_parameters) == 8


def test_a_dense_model_has_no_moe_layers():
    assert find_moe_layers(import_model(DATA / "llama_tiny.onnx", {"batch": 2, "seq": 16})) == ()
