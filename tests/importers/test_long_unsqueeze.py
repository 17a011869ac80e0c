"""Shape inference without data propagation through per-token vectors (issue 22 "Speed", issue 25 budget).

``onnx.shape_inference.infer_shapes(data_prop=True)`` spends time and memory in proportion to the length
of each 1-D input of a data-propagating op: an OLMoE export at published widths, planned at a global
batch of 512 x 4,096 tokens, unsqueezes its flattened top-8 expert ids and weights (16.8 million
elements each), and each skeleton inference took 28 s and 9 GB (``planner plan`` 132 s wall, 9.9 GB
peak). :func:`importers.shape_inference._without_long_unsqueezes` hands onnx a ``Reshape`` to the same
shape instead. The oracle of every test: :func:`importers.shapes.resolve_shapes` with the rewrite
switched off (the unoptimised path) gives the same shapes, dtypes, folded constants, bindings and
warnings; and the shapes a hand count gives (tokens x k).
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest
from onnx import TensorProto, helper

import importers.shape_inference as shape_inference
from importers.onnx_load import load_onnx
from importers.shapes import resolve_shapes

ZOO = Path(__file__).resolve().parents[1] / "zoo"
TOKENS_K = 8


def _router_model() -> onnx.ModelProto:
    """A top-k router as an MoE export writes it: logits [batch, seq, 16] -> TopK k=8 -> ids and weights
    flattened to ``batch*seq*8`` -> each unsqueezed to a column (the ``GatherND`` / broadcast indices)."""
    x = helper.make_tensor_value_info("logits", TensorProto.FLOAT, ["batch", "seq", 16])
    outs = [helper.make_tensor_value_info(n, t, None)
            for n, t in (("ids_col", TensorProto.INT64), ("w_col", TensorProto.FLOAT))]
    inits = [helper.make_tensor("k", TensorProto.INT64, [1], [TOKENS_K]),
             helper.make_tensor("flat", TensorProto.INT64, [1], [-1]),
             helper.make_tensor("last", TensorProto.INT64, [1], [-1])]  # fmt: skip
    nodes = [
        helper.make_node("TopK", ["logits", "k"], ["w", "ids"], axis=-1),
        helper.make_node("Reshape", ["ids", "flat"], ["ids_flat"]),
        helper.make_node("Reshape", ["w", "flat"], ["w_flat"]),
        helper.make_node("Unsqueeze", ["ids_flat", "last"], ["ids_col"]),
        helper.make_node("Unsqueeze", ["w_flat", "last"], ["w_col"]),
        # a short shape vector unsqueezed too: data propagation must still carry it (not rewritten)
        helper.make_node("Shape", ["logits"], ["shape"]),
        helper.make_node("Unsqueeze", ["shape", "last"], ["shape_col"]),
    ]
    graph = helper.make_graph(nodes, "router", [x], outs, initializer=inits)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def _comparable(shaped):
    constants = {name: (value.dtype.str, value.shape, value.tobytes()) for name, value in shaped.constants.items()}
    return dict(shaped.shapes), dict(shaped.dtypes), constants, dict(shaped.dim_bindings), shaped.warnings


def _both_ways(model: onnx.ModelProto, dims: dict[str, int], monkeypatch) -> tuple:
    """``(with the rewrite, unoptimised, [(skeleton, what onnx saw of it with the rewrite)])``."""
    seen: list[tuple[onnx.ModelProto, onnx.ModelProto]] = []
    rewrite = shape_inference._without_long_unsqueezes

    def spy(skel):
        seen.append((skel, rewrite(skel)))
        return seen[-1][1]

    monkeypatch.setattr(shape_inference, "_without_long_unsqueezes", spy)
    fast = _comparable(resolve_shapes(model, dims))
    monkeypatch.setattr(shape_inference, "_without_long_unsqueezes", lambda skel: skel)
    plain = _comparable(resolve_shapes(model, dims))
    return fast, plain, seen


def _long_unsqueezes(skel: onnx.ModelProto) -> list[str]:
    """The ``Unsqueeze`` nodes of ``skel`` whose data input is a vector longer than ``_LONG_VECTOR``."""
    plain = onnx.shape_inference.infer_shapes(skel, data_prop=False)
    lengths = {vi.name: [d.dim_value for d in vi.type.tensor_type.shape.dim]
               for vi in [*plain.graph.value_info, *plain.graph.output]}
    return [node.output[0] for node in skel.graph.node if node.op_type == "Unsqueeze"
            and len(lengths.get(node.input[0], [])) == 1 and lengths[node.input[0]][0] > shape_inference._LONG_VECTOR]


def test_a_router_s_per_token_columns_keep_their_shapes(monkeypatch):
    dims = {"batch": 4, "seq": 2048}
    fast, plain, seen = _both_ways(_router_model(), dims, monkeypatch)
    assert fast == plain
    tokens_k = 4 * 2048 * TOKENS_K  # 65,536 ids and weights, past _LONG_VECTOR
    shapes, dtypes = fast[0], fast[1]
    assert shapes["ids_col"] == shapes["w_col"] == (tokens_k, 1)
    assert (dtypes["ids_col"], dtypes["w_col"]) == ("int64", "float32")
    assert shapes["shape_col"] == (3, 1)
    # the two per-token Unsqueezes reached onnx as Reshapes, the short shape vector's as it was
    assert seen and all(sorted(_long_unsqueezes(skel)) == ["ids_col", "w_col"] for skel, _ in seen)
    assert all(_long_unsqueezes(handed) == [] for _, handed in seen)
    assert all([node.output[0] for node in handed.graph.node if node.op_type == "Unsqueeze"] == ["shape_col"]
               for _, handed in seen)


def test_below_the_bound_the_skeleton_is_handed_on_untouched(monkeypatch):
    # 2 x 64 tokens x 8 = 1,024 elements, within _LONG_VECTOR: the very skeleton object goes to onnx
    assert 2 * 64 * TOKENS_K <= shape_inference._LONG_VECTOR
    handed: list[bool] = []
    rewrite = shape_inference._without_long_unsqueezes
    monkeypatch.setattr(shape_inference, "_without_long_unsqueezes",
                        lambda skel: handed.append(rewrite(skel) is skel) or skel)
    shaped = resolve_shapes(_router_model(), {"batch": 2, "seq": 64})
    assert handed and all(handed)
    assert shaped.shapes["ids_col"] == (2 * 64 * TOKENS_K, 1)


@pytest.mark.parametrize("name", ["qwen2_moe_dynamo_consts", "mixtral_dynamo_consts", "granite_moe_dynamo_bare",
                                  "qwen2_moe_ts_consts"])
def test_zoo_moe_exports_resolve_the_same_shapes(monkeypatch, name):
    # 16 x 4,096 tokens: each export's top-k columns are 65,536 x k long; the TorchScript file's too
    model = load_onnx(ZOO / f"{name}.onnx")[0]
    dims = {"batch": 16, "seq": 4096}
    fast, plain, seen = _both_ways(model, dims, monkeypatch)
    assert fast == plain
    assert seen and any(_long_unsqueezes(skel) for skel, _ in seen)  # there was something to rewrite
    assert all(_long_unsqueezes(handed) == [] for _, handed in seen)
    # the hand count: a value holds one entry per token and expert choice, tokens x k (k: TopK's last dim)
    shapes = fast[0]
    ks = {shapes[node.output[1]][-1] for node in model.graph.node
          if node.op_type == "TopK" and node.output[1] in shapes}
    assert ks and any(shape in ((16 * 4096 * k,), (16 * 4096 * k, 1)) for k in ks for shape in shapes.values())
