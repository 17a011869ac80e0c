"""Traced per-expert MoE loops (issue 25, h25c): TorchScript unrolls transformers' ``for expert in
expert_mask.nonzero()`` over the experts its example reached. The fixtures are two files of
``bench/unseen_archs.py`` (``tests/data/expert_loops/counts.json``: torch's own parameter counts and configs):

* Switch Transformers (``d_model`` 64, ``d_ff`` 128, 4 experts in one encoder and one decoder layer), traced on 8
  decoder tokens: the decoder's loop holds 3 of its 4 experts, each a ``wi`` [64, 128] and a ``wo`` [128, 64], so
  the file lacks 2 x 64 x 128 = 16,384 of torch's parameters;
* DBRX (4 experts of ``ffn_hidden_size`` 128 in each of 2 layers): every iteration takes ``w1[e]``, ``v1[e]``,
  ``w2[e]`` of whole ``[4, 128, 64]`` tensors, so every expert's weights are in the file whatever the trace took.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.torchtitan.families import torchtitan_arch
from importers.expert_loop import weight_slices
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

DATA = Path(__file__).resolve().parents[1] / "data" / "expert_loops"
COUNTS = json.loads((DATA / "counts.json").read_text())["files"]


def _graph(name: str):
    return load_graph(DATA / name, {"batch": 2, "seq": 16, "tgt_seq": 8})


def _note(graph) -> str:
    notes = [w for w in graph.warnings if w.startswith(("1 traced per-expert", "2 traced per-expert"))]
    assert len(notes) == 1
    return notes[0]


def _planner_count(graph) -> int:
    return sum(t.num_elements for t in graph.tensors.values() if t.role == "parameter")


def test_switch_trace_lacks_one_expert_and_says_exactly_how_many_parameters():
    graph = _graph("switch_ts_consts.onnx")
    config = COUNTS["switch_ts_consts.onnx"]["config"]
    one_expert = 2 * config["d_model"] * config["d_ff"]  # wi and wo, no bias (T5's dense layers)
    assert one_expert == 16_384
    # torch's count + TorchScript's untied copy of the shared LM head (warned on its own) - the missing expert
    head_copy = config["vocab_size"] * config["d_model"]
    assert COUNTS["switch_ts_consts.onnx"]["param_count"] + head_copy - _planner_count(graph) == one_expert
    note = _note(graph)
    assert "2 traced per-expert MoE loop(s)" in note and "7 expert iteration(s)" in note
    assert "1 of 4 at /decoder/block.1/layer.2/mlp/router/OneHot" in note
    assert note.endswith(f"the parameter count is {one_expert:,} short of the model's, and their share of the tokens "
                         "is not priced")


def test_dbrx_loop_over_shared_expert_tensors_holds_every_expert():
    graph = _graph("dbrx_ts_consts.onnx")
    assert _planner_count(graph) == COUNTS["dbrx_ts_consts.onnx"]["param_count"] == 350_016
    note = _note(graph)
    assert "8 expert iteration(s)" in note and note.endswith("every expert's weights are in the file (the parameter count is exact)")
    # w1[e], v1[e], w2[e] per iteration: 3 x 4 experts x 2 layers whole [128, 64] matrices of [4, 128, 64] tensors
    slices = weight_slices(graph)
    assert len(slices) == 24
    assert {graph.tensors[graph.ops[i].outputs[0].tensor].shape for i in slices} == {(128, 64)}


def test_dbrx_expert_weights_are_no_embedding_table():
    """torchtitan's refusal named the experts' [4, 128, 64] weights "a 4-row embedding table" and said its
    (SwiGLU) experts were "not SwiGLU"; it now names the traced loop and leaves both out."""
    graph = _graph("dbrx_ts_consts.onnx")
    model = analyze_transformer(graph)
    assert model.position_table_rows is None and model.position_embeddings == ()
    assert model.irregular[0].startswith("its experts run as a traced per-expert loop")
    with pytest.raises(UnsupportedExport) as refusal:
        torchtitan_arch(graph)
    reason = str(refusal.value)
    assert "traced per-expert loop" in reason and "routes tokens to experts" in reason
    assert "embedding table" not in reason and "not SwiGLU" not in reason


def test_a_model_without_loops_gets_no_note():
    graph = load_graph(Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx", {"batch": 2, "seq": 16})
    assert not [w for w in graph.warnings if "traced per-expert" in w]


def test_a_loop_with_biases_counts_a_missing_expert_whole(tmp_path):
    """A hand-built trace: a router over E = 3 experts (TopK of x Wr), the loop unrolled for experts 0 and 1 only,
    each expert Linear(4 -> 6) + ReLU + Linear(6 -> 4) with biases: one expert is 4 x 6 + 6 + 6 x 4 + 4 = 58
    parameters, so the trace lacks 58."""
    import onnx
    from onnx import TensorProto as T, helper

    from importers.expert_loop import expert_loops
    from importers.onnx_load import load_onnx
    from importers.shapes import resolve_shapes

    def const(name, dtype, dims, values):
        return helper.make_tensor(name, dtype, dims, values)

    inits = [const("wr", T.FLOAT, [4, 3], [0.0] * 12), const("k", T.INT64, [1], [1]), const("depth", T.INT64, [], [3]),
             const("onoff", T.INT64, [2], [0, 1]), const("row", T.INT64, [], [1])]
    nodes = [helper.make_node("MatMul", ["x", "wr"], ["logits"]),
             helper.make_node("TopK", ["logits", "k"], ["top", "idx"]),
             helper.make_node("OneHot", ["idx", "depth", "onoff"], ["mask"]),
             helper.make_node("Transpose", ["mask"], ["mt"], perm=[2, 1, 0])]
    outputs = []
    for e in (0, 1):  # expert 2 never reached by the example: not traced
        inits += [const(f"e{e}", T.INT64, [], [e]), const(f"w1_{e}", T.FLOAT, [4, 6], [0.0] * 24),
                  const(f"b1_{e}", T.FLOAT, [6], [0.0] * 6), const(f"w2_{e}", T.FLOAT, [6, 4], [0.0] * 24),
                  const(f"b2_{e}", T.FLOAT, [4], [0.0] * 4)]
        nodes += [helper.make_node("Gather", ["mt", f"e{e}"], [f"me{e}"], axis=0),
                  helper.make_node("NonZero", [f"me{e}"], [f"nz{e}"]),
                  helper.make_node("Gather", [f"nz{e}", "row"], [f"tok{e}"], axis=0),
                  helper.make_node("Gather", ["x", f"tok{e}"], [f"xe{e}"], axis=0),
                  helper.make_node("MatMul", [f"xe{e}", f"w1_{e}"], [f"h{e}"]),
                  helper.make_node("Add", [f"h{e}", f"b1_{e}"], [f"hb{e}"]),
                  helper.make_node("Relu", [f"hb{e}"], [f"a{e}"]),
                  helper.make_node("MatMul", [f"a{e}", f"w2_{e}"], [f"o{e}"]),
                  helper.make_node("Add", [f"o{e}", f"b2_{e}"], [f"y{e}"])]
        outputs.append(helper.make_tensor_value_info(f"y{e}", T.FLOAT, None))
    graph = helper.make_graph(nodes, "loop", [helper.make_tensor_value_info("x", T.FLOAT, [8, 4])], outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), tmp_path / "loop.onnx")
    model, _ = load_onnx(tmp_path / "loop.onnx", [])
    shaped = resolve_shapes(model, {})
    (loop,) = expert_loops(shaped.model, shaped.shapes, shaped.dtypes)
    assert (loop.experts, loop.traced, loop.shared, loop.expert_parameters) == (3, 2, False, 58)
    assert loop.missing_parameters == 4 * 6 + 6 + 6 * 4 + 4


def test_dbrx_iterations_are_priced_at_balanced_rows():
    """At batch 2 x 16 tokens (T = 32), top-2 of 4 experts: each iteration's NonZero lists T k / E = 16 token
    choices, so each of the 3 expert matmuls (w1, v1: 64 -> 128; w2: 128 -> 64) does 2 x 16 x 64 x 128 FLOPs, plus
    what the coarsening folds into them: w1's SiLU (sigmoid and multiply, 2 x 16 x 128) and w2's routing-weight
    scale (16 x 64); 4 experts x 2 layers = 8 iterations, and no expert matmul is left opaque."""
    graph = _graph("dbrx_ts_consts.onnx")
    experts = [op for op in graph.ops if "/ffn/experts/mlp" in op.name and op.op_type == "MatMul"]
    assert len(experts) == 24 and {op.kind for op in experts} == {"matmul"}
    per_iteration = 3 * 2 * 16 * 64 * 128 + 2 * 16 * 128 + 16 * 64
    assert sum(op.flops for op in experts) == 8 * per_iteration == 6_332_416
    # the rows are tokens of the batch (importers.shape_batch.selected_batch_axes): data parallelism splits them
    assert all(next(d for d in op.dims if d.name == "m").is_batch for op in experts)


def test_switch_iterations_rows_are_batch_rows():
    """Switch's top-1 loops at batch 2 x 16 encoder tokens (T = 32) and 2 x 8 decoder tokens (T = 16): T / E rows
    per iteration, 8 and 4, marked as batch rows."""
    graph = _graph("switch_ts_consts.onnx")
    experts = [op for op in graph.ops if "/mlp/experts/expert_" in op.name and op.op_type == "MatMul"]
    assert len(experts) == 14 and {op.kind for op in experts} == {"matmul"}
    rows = sorted({(op.name.split("/")[1], next(d for d in op.dims if d.name == "m").size) for op in experts})
    assert rows == [("decoder", 16 // 4), ("encoder", 32 // 4)]
    assert all(next(d for d in op.dims if d.name == "m").is_batch for op in experts)
