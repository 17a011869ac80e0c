"""The dynamo exporter's folded transposed copy of a tied LM head (issue 25, "parameter counts exact or explained
by a warning"; h31d).

torch.export names a tied parameter once. Where that name is the output layer's (MPT's ``model.lm_head.weight``,
ModernBERT's ``model.decoder.weight``) the embedding's ``Gather`` reads it, and the head's ``MatMul`` reads its
transpose, which the exporter may fold into an anonymous ``val_N`` constant: the file then holds the table twice.
Before h31d the copy was counted without a word (MPT and ModernBERT graph-only files: torch's count + 6,144).

Oracles: torch's own count (``sum(p.numel() for p in model.parameters())``) recorded in each fixture's
``counts.json`` when it was built, and products of the initializers' shapes for the ``onnx.helper`` graphs.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model

DATA = Path(__file__).resolve().parents[1] / "data"
_TIED = re.compile(r"may be a transposed copy of the tied embedding '([^']+)' .* it is counted \(([\d,]+) parameters\)")
V, H = 96, 16


def _external(tensor: onnx.TensorProto) -> onnx.TensorProto:
    """The tensor as a graph-only file holds it: values in a data file that is gone."""
    tensor.ClearField("raw_data")
    tensor.data_location = T.EXTERNAL
    tensor.external_data.add(key="location", value="gone.data")
    return tensor


def _lm(tmp_path: Path, table_name: str, *, copy_values: str) -> Path:
    """Embedding ``Gather`` -> ``MatMul`` by ``val_7`` [H, V] -> logits (a graph output). ``copy_values``:
    ``stripped`` (graph-only), ``tied`` (the table transposed, inline) or ``untied`` (other values, inline)."""
    rng = np.random.default_rng(0)
    table = rng.standard_normal((V, H)).astype(np.float32)
    head = {"tied": table.T.copy(), "untied": rng.standard_normal((H, V)).astype(np.float32),
            "stripped": table.T.copy()}[copy_values]
    initializers = [numpy_helper.from_array(table, table_name), numpy_helper.from_array(head, "val_7")]
    if copy_values == "stripped":
        initializers = [_external(t) for t in initializers]
    nodes = [helper.make_node("Gather", [table_name, "input_ids"], ["embedding"]),
             helper.make_node("MatMul", ["embedding", "val_7"], ["logits"])]
    inputs = [helper.make_tensor_value_info("input_ids", T.INT64, ["batch", "seq"])]
    outputs = [helper.make_tensor_value_info("logits", T.FLOAT, ["batch", "seq", V])]
    model = helper.make_model(helper.make_graph(nodes, "lm", inputs, outputs, initializer=initializers),
                              opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / f"lm_{copy_values}.onnx"
    onnx.save(model, str(path))
    return path


def _warned(graph) -> list[tuple[str, int]]:
    return [(m.group(1), int(m.group(2).replace(",", ""))) for w in graph.warnings if (m := _TIED.search(w))]


@pytest.mark.parametrize("table", ["model.lm_head.weight", "model.decoder.weight", "proj_out.weight"])
def test_a_stripped_copy_of_a_head_named_table_is_counted_and_said(tmp_path, table):
    graph = import_model(_lm(tmp_path, table, copy_values="stripped"), {"batch": 2, "seq": 8})
    assert graph.parameter_count == 2 * V * H
    assert _warned(graph) == [(table, V * H)]


def test_an_inline_equal_copy_is_one_parameter(tmp_path):
    graph = import_model(_lm(tmp_path, "model.lm_head.weight", copy_values="tied"), {"batch": 2, "seq": 8})
    assert graph.parameter_count == V * H and _warned(graph) == []


def test_an_inline_different_copy_is_an_untied_head(tmp_path):
    graph = import_model(_lm(tmp_path, "model.lm_head.weight", copy_values="untied"), {"batch": 2, "seq": 8})
    assert graph.parameter_count == 2 * V * H and _warned(graph) == []


def test_a_table_named_after_the_embedding_is_an_untied_head(tmp_path):
    """Llama's untied head exports as ``model.embed_tokens.weight`` plus a folded ``val_N``: no tie to say."""
    graph = import_model(_lm(tmp_path, "model.embed_tokens.weight", copy_values="stripped"), {"batch": 2, "seq": 8})
    assert graph.parameter_count == 2 * V * H and _warned(graph) == []


@pytest.mark.parametrize(("folder", "name"), [
    ("mpt_alibi_cases", "mpt_dynamo_consts.onnx"), ("mpt_alibi_cases", "mpt_dynamo_bare.onnx"),
    ("window_cases", "modernbert_local_dynamo_consts.onnx"), ("window_cases", "modernbert_local_dynamo_bare.onnx"),
])
def test_real_exports_are_torchs_count_give_or_take_the_warning(folder, name):
    counts = json.loads((DATA / folder / "counts.json").read_text())
    entry = counts.get("files", counts)[name]
    torch_count = entry if isinstance(entry, int) else entry["param_count"]
    graph = import_model(DATA / folder / name, {"batch": 2, "seq": 16})
    warned = _warned(graph)
    assert len(warned) == 1 and graph.parameter_count - warned[0][1] == torch_count
