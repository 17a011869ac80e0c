"""An axis a folded repeat leaves to its consumers is a batch dim (issue 25, importers/shape_batch.py,
``generated_batch_dims``).

XLNet expands its sinusoid position table over the batch (``pos_emb.expand(-1, bsz, -1)``), a shape computation the
importer folds to a constant at the bound dims; its projection ``einsum("ibh,hnd->ibnd", pos_emb, r)`` then iterates
a batch axis no operand brings, and was left unsplit under data parallelism: 9% of XLNet's FLOPs at seq 256 priced
dp times too high. The hand-built graph is the same folded repeat written by hand; the FLOPs are worked out below.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper

from importers.transformer import analyze_transformer
from planner.plan import load_graph
from tests.importers.test_einsum_attention import DATA, D, H, N, S, V, _Builder, _op


def test_xlnets_position_projection_runs_on_each_ranks_samples():
    # pos_emb.expand(-1, bsz, -1) is folded to a constant, so the projection einsum("ibh,hnd->ibnd", pos_emb, r)
    # reads its batch axis from no operand: it is a batch dim, split by data parallelism like the content's
    graph = load_graph(DATA / "xlnet_ts_bare.onnx", {"batch": 8, "seq": 64})
    model = analyze_transformer(graph)
    for block in model.attention:
        (proj,) = block.position_proj
        op = graph.ops[proj]
        assert [d.size for d in op.dims if d.is_batch] == [8]
        # 2 FLOPs x (2 x 64 relative positions) x 8 samples x 128 in x (4 heads x 32) out = 33,554,432, unchanged
        assert op.flops == 2 * 128 * 8 * 128 * 128 == 33_554_432


def _expanded_table_graph(tmp_path: Path) -> Path:
    """``x = emb[ids]`` and a ``[1, S, H]`` table expanded to ``[batch, S, H]`` by ``Shape(ids)[0]``, each projected to
    ``[batch, S, N, D]`` by an einsum, then added: the table's projection reads its batch from no operand."""
    g = _Builder()
    x = g.node("Gather", [g.param("emb", V, H), "ids"], "embed")
    batch = g.node("Slice", [g.node("Shape", ["ids"], "shape"), g.const(np.array([0])), g.const(np.array([1]))], "bsz")
    size = g.node("Concat", [batch, g.const(np.array([S, H], np.int64))], "size", axis=0)
    table = g.node("Expand", [g.const(np.ones((1, S, H), np.float32)), size], "expand")
    xp = g.node("Einsum", [x, g.param("wx", H, N, D)], "xp", equation="bsh,hnd->bsnd")
    tp = g.node("Einsum", [table, g.param("wt", H, N, D)], "tp", equation="bsh,hnd->bsnd")
    g.node("Add", [xp, tp], "out")
    graph = helper.make_graph(g.nodes, "expanded", [helper.make_tensor_value_info("ids", T.INT64, ["batch", S])],
                              [helper.make_tensor_value_info("out", T.FLOAT, ["batch", S, N, D])], initializer=g.inits)
    path = tmp_path / "expanded.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), path)
    return path


def test_a_folded_repeat_over_the_batch_is_a_batch_dim(tmp_path):
    graph = load_graph(_expanded_table_graph(tmp_path), {"batch": 4})
    projection = graph.ops[_op(graph, "tp")]
    assert not projection.inputs or all(a.tensor.startswith("wt") for a in projection.inputs)  # the table is folded
    assert [(d.name, d.size) for d in projection.dims if d.is_batch] == [("b", 4)]
    assert projection.flops == 2 * 4 * S * H * N * D  # 2 x 4 x 16 x 32 x 4 x 8 = 131,072, as before: only the label moved


def test_transformers_padding_mask_is_built_per_rank(tmp_path):
    """transformers 5 builds a decoder's mask from ``attention_mask.flatten()`` gathered at ``arange(batch) * seq +
    arange(seq)`` and ANDed with the causal mask before the scores read it: the gather's output axis is the samples
    (its index runs over the batch), brought by no operand, and the AND reads it from the gather. Both are batch dims,
    so under data parallelism each rank builds its own samples' mask, as DDP runs the model; before, every rank was
    priced the whole batch's seq x seq mask (dp=8 on the zoo's Llama at seq 8,192: 11.1 ms a step against 4.3 ms for
    one sample on one device)."""
    graph = load_graph(Path(__file__).resolve().parents[1] / "zoo" / "llama_ts_consts.onnx", {"batch": 8, "seq": 64})
    by_name = {op.name: op for op in graph.ops}
    gather, mask = by_name["/model/Gather_4"], by_name["/model/And_1"]
    assert [d.size for d in gather.dims if d.is_batch] == [8]
    assert [(d.size, d.is_batch) for d in mask.dims] == [(8, True), (64, False), (64, False)]  # samples, queries, keys
    # no op of the graph keeps an axis of the batch's size unmarked (the hidden size is 64, the heads 4, the vocab 1,000)
    assert [op.name for op in graph.ops if any(d.size == 8 for d in op.dims) and not any(d.is_batch for d in op.dims)] == []
