"""Deep graphs import without recursion and with the right totals (issue 16: denial of service).

A 1,000-node chain of Relu raised RecursionError in the pointwise fusion (``absorb``/``read``), and
a 20,000-node one took over 100 s (every link walked the whole chain). Each chain here is several
times deeper than Python's default recursion limit (1,000 frames); the expected FLOPs and
parameter counts are counted by hand from the chain's definition. Speed is measured in
bench/import_time.py (``--chain``), not asserted here.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model
from tests.importers.graph_checks import check_graph

DEPTH = 2_500
WIDTH = 16
BATCH = 4


def _chain(kind: str, depth: int) -> onnx.ModelProto:
    """A chain of ``depth`` links of ``kind`` on a [batch, WIDTH] activation."""
    nodes: list[onnx.NodeProto] = []
    weights: list[onnx.TensorProto] = []
    for i in range(depth):
        a, o = (f"v{i}" if i else "x"), f"v{i + 1}"
        if kind == "relu":
            nodes.append(helper.make_node("Relu", [a], [o], name=f"relu{i}"))
        elif kind == "silu":  # x * sigmoid(x): the fused chain reads its own source twice
            nodes += [helper.make_node("Sigmoid", [a], [f"s{i}"]), helper.make_node("Mul", [a, f"s{i}"], [o])]
        elif kind == "identity":
            nodes.append(helper.make_node("Identity", [a], [o]))
        elif kind == "mlp":
            weights.append(numpy_helper.from_array(np.zeros((WIDTH, WIDTH), np.float32), f"layer{i}.weight"))
            nodes += [
                helper.make_node("MatMul", [a, f"layer{i}.weight"], [f"m{i}"], name=f"layer{i}.mm"),
                helper.make_node("Relu", [f"m{i}"], [o], name=f"layer{i}.relu"),
            ]
    x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", WIDTH])
    y = helper.make_tensor_value_info(f"v{depth}", T.FLOAT, ["batch", WIDTH])
    graph = helper.make_graph(nodes, kind, [x], [y], weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _import(tmp_path: Path, kind: str, depth: int = DEPTH):
    path = tmp_path / f"{kind}.onnx"
    onnx.save(_chain(kind, depth), path)
    graph = import_model(path, {"batch": BATCH})
    assert check_graph(graph) == []
    return graph


def test_chain_is_deeper_than_the_recursion_limit():
    assert DEPTH > 2 * sys.getrecursionlimit()


@pytest.mark.parametrize(
    "kind, ops, flops_per_link",
    [
        # One fused pointwise op; Relu: 1 FLOP per element.
        ("relu", 1, BATCH * WIDTH),
        # Sigmoid + Mul, 1 FLOP per element each, fused into one op.
        ("silu", 1, 2 * BATCH * WIDTH),
        # Every link a MatMul (2*m*n*k) with its Relu fused: one op per link.
        ("mlp", DEPTH, 2 * BATCH * WIDTH * WIDTH + BATCH * WIDTH),
    ],
)
def test_deep_chain_imports_with_hand_counted_totals(tmp_path, kind, ops, flops_per_link):
    graph = _import(tmp_path, kind)
    assert len(graph.ops) == ops
    assert graph.forward_flops() == DEPTH * flops_per_link
    assert graph.raw_node_count == DEPTH * (2 if kind in ("silu", "mlp") else 1)


def test_deep_mlp_counts_every_weight_and_finds_one_repeated_block(tmp_path):
    graph = _import(tmp_path, "mlp")
    assert graph.parameter_count == DEPTH * WIDTH * WIDTH
    assert len(graph.blocks) == 1


def test_deep_identity_chain_is_views_only(tmp_path):
    # Identity copies fold into views of the input: nothing to compute, nothing to plan.
    graph = _import(tmp_path, "identity")
    assert len(graph.ops) == 0
    assert graph.forward_flops() == 0
