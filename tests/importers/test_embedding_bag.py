"""``nn.EmbeddingBag``: the Loop both torch exporters write becomes one embedding-bag op (issue 25).

Files: a DLRM-style model (``tests/importers/make_dlrm_cases.py``; three tables of 400,000 / 100,000 /
50,000 rows of 64, sum / mean / sum pooling of 20 indices per sample) exported by both exporters,
graph-only, and a small one with its weights whose torch output ``counts.json`` records.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

from importers import import_model
from importers.embedding_bag import DOMAIN, recognise_embedding_bags
from importers.onnx_load import load_onnx
from planner.core.errors import ModelError
from tests.planner.cli_helpers import run_cli

CASES = Path(__file__).resolve().parents[1] / "data" / "dlrm_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
FULL = sorted(n for n in COUNTS["files"] if not n.startswith("dlrm_small"))
SMALL = sorted(n for n in COUNTS["files"] if n.startswith("dlrm_small"))
BATCH = 64


@pytest.mark.parametrize("name", SMALL)
def test_the_rewritten_graph_computes_torchs_output(name: str) -> None:
    """The new ops' function bodies run (onnx's reference evaluator) and give torch's logits."""
    from onnx.reference import ReferenceEvaluator

    model = onnx.load(str(CASES / name))
    assert [n.op_type for n in model.graph.node].count("Loop") == 3
    assert recognise_embedding_bags(model) == 3
    assert not any(n.op_type == "Loop" for n in model.graph.node)
    io = COUNTS["small_io"]
    feeds = {k: np.asarray(v, dtype=np.float32 if k == "dense" else np.int64) for k, v in io["inputs"].items()}
    got = ReferenceEvaluator(model).run(None, feeds)[0]
    np.testing.assert_allclose(got, np.asarray(io["logit"], dtype=np.float32), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", FULL + SMALL)
def test_parameter_count_is_torchs(name: str) -> None:
    assert import_model(CASES / name, {"batch": BATCH}).parameter_count == COUNTS["files"][name]["param_count"]


@pytest.mark.parametrize("name", FULL)
def test_each_bag_is_one_embedding_op_with_its_shapes_and_flops(name: str) -> None:
    record = COUNTS["files"][name]
    graph = import_model(CASES / name, {"batch": BATCH})
    bags = [op for op in graph.ops if op.op_type.startswith("EmbeddingBag")]
    width, nnz = record["width"], COUNTS["pooling"] * BATCH  # 64 wide; 20 indices per sample
    assert [op.op_type for op in bags] == ["EmbeddingBagSum", "EmbeddingBagMean", "EmbeddingBagSum"]
    for op, (rows, mode) in zip(bags, record["tables"]):
        assert op.kind == "embedding"
        assert [(d.name, d.size, d.kind, d.is_batch) for d in op.dims] == [
            ("b", BATCH, "parallel", True), ("d", width, "parallel", False), ("v", rows, "reduction", False)]
        # one add per gathered element (20 x 64 x 64 = 81,920), a mean also one divide per output
        assert op.flops == nnz * width + (BATCH * width if mode == "mean" else 0)
        table = graph.tensors[op.inputs[0].tensor]
        assert (table.role, table.shape, op.inputs[0].axes) == ("parameter", (rows, width), (("v",), ("d",)))
        assert graph.tensors[op.inputs[1].tensor].shape == (nnz,)
        assert graph.tensors[op.outputs[0].tensor].shape == (BATCH, width)
    assert not [op for op in graph.ops if op.kind == "opaque"]


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_graph_only_and_small_constants_inline_import_to_the_same_ops(exporter: str) -> None:
    def ops(style: str):
        graph = import_model(CASES / f"dlrm_{exporter}_{style}.onnx", {"batch": BATCH})
        return [(op.name, op.kind, op.op_type, op.dims, op.flops) for op in graph.ops]

    assert ops("bare") == ops("consts")


def test_plan_at_8_devices_shards_the_tables() -> None:
    result = run_cli(["plan", CASES / "dlrm_ts_bare.onnx", "-n", "8", "--dim", "batch=2048",
                      "--target", "generic", "--json"])
    rows = json.loads(result.stdout)["rows"]
    assert rows
    splits = rows[0]["splits"]
    tables = [name for name in splits if name.startswith("/tables.")]
    assert len(tables) == 3
    # each table split over its columns (d) or rows (v), not replicated
    assert all(set(splits[name]) & {"d", "v"} for name in tables)


def _loop_model(body_nodes, body_outputs, outer_nodes, inputs, initializers) -> onnx.ModelProto:
    body = helper.make_graph(
        body_nodes, "body",
        [helper.make_tensor_value_info("i", TensorProto.INT64, []), helper.make_tensor_value_info("c", TensorProto.BOOL, [])],
        body_outputs)
    loop = helper.make_node("Loop", ["trips", "cond"], ["y"], name="loop", body=body)
    graph = helper.make_graph(outer_nodes + [loop], "g", inputs,
                              [helper.make_tensor_value_info("y", TensorProto.FLOAT, None)], initializers)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])


def test_a_loop_that_is_no_embedding_bag_is_still_refused(tmp_path: Path) -> None:
    """A loop summing a weight's rows by the iteration count is not a bag: no rewrite, one-line refusal."""
    w = helper.make_tensor("w", TensorProto.FLOAT, [4, 3], [0.5] * 12)
    trips = helper.make_tensor("trips", TensorProto.INT64, [], [2])
    cond = helper.make_tensor("cond", TensorProto.BOOL, [], [True])
    body = [helper.make_node("Gather", ["w", "i"], ["row"]),
            helper.make_node("ReduceSum", ["row"], ["s"], keepdims=0),
            helper.make_node("Identity", ["c"], ["c_out"])]
    model = _loop_model(body, [helper.make_tensor_value_info("c_out", TensorProto.BOOL, []),
                               helper.make_tensor_value_info("s", TensorProto.FLOAT, None)], [], [], [w, trips, cond])
    assert recognise_embedding_bags(model) == 0
    onnx.save(model, str(tmp_path / "loop.onnx"))
    with pytest.raises(ModelError, match="contains control flow"):
        load_onnx(tmp_path / "loop.onnx")


def test_the_new_nodes_are_calls_of_model_local_functions() -> None:
    model, _ = load_onnx(CASES / "dlrm_dynamo_bare.onnx")
    bags = [n for n in model.graph.node if n.domain == DOMAIN]
    assert len(bags) == 3
    assert {(f.domain, f.name) for f in model.functions} == {(DOMAIN, "EmbeddingBagSum"), (DOMAIN, "EmbeddingBagMean")}
    # the Gather, ones and loop they replace are gone, and the exporter's ones with them
    assert not [n for n in model.graph.node if n.op_type in ("Loop", "SequenceEmpty", "ConcatFromSequence", "Expand")]
