"""A constant the dynamo exporter folded from no parameter is not a parameter (issue 25).

A static-shape dynamo export of DeBERTa-v2 folds the all-ones attention mask that the embeddings are
multiplied by into a float initializer named after its FX node (``unsqueeze`` [2, 16, 1]); read as a
scale of the activations it was counted (+32 over torch's 100,504). The exporter's optimizer records
what each folded value came from (``pkg.onnxscript.optimizer.folded_from``), so the mask (from
``ones`` and shape values) is told from a folded copy of a weight (from ``...query_proj.weight``):
``importers.param_evidence._folded_from_no_parameter``.
"""

from __future__ import annotations

import json
from pathlib import Path

import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from importers import import_model
from importers.param_evidence import FOLDED_FROM_KEY, SIGNATURE_KIND_KEY

ROOT = Path(__file__).resolve().parents[2]
STATIC = ROOT / "tests" / "data" / "deberta_static"


def test_static_deberta_counts_as_torch():
    counts = json.loads((STATIC / "counts.json").read_text())
    graph = import_model(STATIC / "deberta_static_dynamo_consts.onnx", {})
    # torch's sum(p.numel() for p in model.parameters()), written by make_deberta_static.py (was 100,536)
    assert graph.parameter_count == counts["files"]["deberta_static_dynamo_consts.onnx"]["param_count"] == 100_504
    folded = [w for w in graph.warnings if FOLDED_FROM_KEY in w]
    assert len(folded) == 1 and "'unsqueeze' [2, 16, 1]; 32 elements" in folded[0]


def _info(name: str, dims: list[int], props: dict[str, str]) -> onnx.ValueInfoProto:
    info = helper.make_tensor_value_info(name, T.FLOAT, dims)
    helper.set_metadata_props(info, props)
    return info


def _model(tmp_path: Path, records: dict[str, str], *, extra: dict[str, str] | None = None) -> Path:
    """x [2, 4, 8] @ ``lin.weight`` [8, 8] (recorded a parameter), times ``unsqueeze`` [2, 4, 1] whose
    ``folded_from`` record is ``records["unsqueeze"]``; ``extra``: more records, of values not in the graph."""
    weight = helper.make_tensor("lin.weight", T.FLOAT, [8, 8], [0.01 * i for i in range(64)])
    mask = helper.make_tensor("unsqueeze", T.FLOAT, [2, 4, 1], [1.0] * 8)
    nodes = [helper.make_node("MatMul", ["x", "lin.weight"], ["h"]), helper.make_node("Mul", ["h", "unsqueeze"], ["y"])]
    infos = [_info("lin.weight", [8, 8], {SIGNATURE_KIND_KEY: "PARAMETER"})]
    infos += [_info(name, [2, 4, 1] if name == "unsqueeze" else [1], {FOLDED_FROM_KEY: value})
              for name, value in {**records, **(extra or {})}.items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4, 8])], [weight, mask],
                              value_info=infos)
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


@pytest.mark.parametrize(("record", "extra", "count"), [
    ("['ones', 'val_0', 'val_1']", None, 64),  # DeBERTa's mask: FX values and shapes only
    ("['val_3']", {"val_3": "['ones', 'val_0']"}, 64),  # followed through another folded value
    ("['lin.weight']", None, 64 + 8),  # a recorded parameter: a folded copy of a weight stays counted
    ("['enc.scale']", None, 64 + 8),  # a module path the file does not record: it may be a parameter
    ("['val_3']", {"val_3": "['enc.scale']"}, 64 + 8),
    ("not a list", None, 64 + 8),  # an unreadable record may be anything
])
def test_the_record_decides(tmp_path, record, extra, count):
    # 64: the 8 x 8 weight; 8: the [2, 4, 1] scale, which the weight rule takes (a named scale of activations)
    graph = import_model(_model(tmp_path, {"unsqueeze": record}, extra=extra), {})
    assert graph.parameter_count == count, graph.warnings
    assert any(FOLDED_FROM_KEY in w for w in graph.warnings) == (count == 64)


def test_without_a_record_the_weight_rule_stands(tmp_path):
    graph = import_model(_model(tmp_path, {}), {})
    assert graph.parameter_count == 64 + 8


def test_records_naming_records_are_followed_once_each():
    # 40 records, each folded from the next two (2^40 chains to walk one by one); the last names "ones"
    # (no parameter) or a module path (may be one): then every record but r39, whose only source is
    # "ones" in both cases, may come from a parameter
    from importers.param_evidence import _folded_from_no_parameter

    def graph(last: str) -> onnx.GraphProto:
        g = helper.make_graph([], "g", [], [])
        for i in range(40):
            info = helper.make_tensor_value_info(f"r{i}", T.FLOAT, [1])
            names = [f"r{i + 1}", f"r{i + 2}"] if i < 38 else [last if i == 38 else "ones"]
            info.metadata_props.add(key=FOLDED_FROM_KEY, value=repr(names))
            g.value_info.append(info)
        return g

    assert _folded_from_no_parameter(graph("ones"), {}) == {f"r{i}" for i in range(40)}
    assert _folded_from_no_parameter(graph("encoder.weight"), {}) == {"r39"}
    assert _folded_from_no_parameter(graph("encoder.weight"), {"encoder.weight": "BUFFER"}) == {f"r{i}" for i in range(40)}


def _lambda_model(tmp_path: Path, records: dict[str, str], kinds: dict[str, str] | None = None,
                  keep: tuple[str, ...] = ()) -> Path:
    """A DiffLlama-style twin: x [2, 4, 8] @ ``lin.weight`` [8, 8], times the scalar ``add_5`` the dynamo
    optimiser folded from ``lambda_full`` (``records["add_5"]``; more records of values not in the graph);
    ``kinds``: signature records of names not in the graph; ``keep``: sources also kept as initializers [8]
    and read (a Mul of x's last axis), so they are in the file."""
    weight = helper.make_tensor("lin.weight", T.FLOAT, [8, 8], [0.01 * i for i in range(64)])
    scale = helper.make_tensor("add_5", T.FLOAT, [], [0.3])
    kept = [helper.make_tensor(name, T.FLOAT, [8], [0.1] * 8) for name in keep]
    nodes = [helper.make_node("MatMul", ["x", "lin.weight"], ["h"]), helper.make_node("Mul", ["h", "add_5"], ["y0"])]
    last = "y0"
    for i, name in enumerate(keep):
        nodes.append(helper.make_node("Mul", [last, name], [f"y{i + 1}"]))
        last = f"y{i + 1}"
    nodes.append(helper.make_node("Identity", [last], ["y"]))
    infos = [_info("lin.weight", [8, 8], {SIGNATURE_KIND_KEY: "PARAMETER"})]
    infos += [_info(name, [], {FOLDED_FROM_KEY: value}) for name, value in records.items()]
    infos += [_info(name, [8], {SIGNATURE_KIND_KEY: kind}) for name, kind in (kinds or {}).items()]
    graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4, 8])],
                              [helper.make_tensor_value_info("y", T.FLOAT, [2, 4, 8])], [weight, scale, *kept],
                              value_info=infos)
    path = tmp_path / "lambda.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)
    return path


LAMBDA = "['exp', 'attn.lambda_k1', 'attn.lambda_q1', 'sum_1', 'val_3']"


@pytest.mark.parametrize(("records", "kinds", "keep", "named"), [
    # DiffLlama's add_N: its record names the four lambda vectors, which no initializer keeps
    ({"add_5": LAMBDA, "sum_1": "['attn.lambda_q2', 'attn.lambda_k2']"}, None, (),
     ["attn.lambda_k1", "attn.lambda_k2", "attn.lambda_q1", "attn.lambda_q2"]),
    ({"add_5": LAMBDA}, None, ("attn.lambda_k1",), ["attn.lambda_q1"]),  # a source the file holds is counted
    ({"add_5": LAMBDA}, {"attn.lambda_k1": "BUFFER", "attn.lambda_q1": "BUFFER"}, (), []),  # recorded buffers
    ({"add_5": "['ones', 'val_0', 'val_1']"}, None, (), []),  # folded from no parameter: nothing lost
])
def test_parameters_folded_out_of_the_file_are_warned(tmp_path, records, kinds, keep, named):
    graph = import_model(_lambda_model(tmp_path, records, kinds, keep), {})
    # the 8 x 8 weight, and each kept [8] source (read as a per-channel scale); never the folded scalar
    assert graph.parameter_count == 64 + 8 * len(keep), graph.warnings
    lost = [w for w in graph.warnings if "may be parameters and that the file does not hold" in w]
    if not named:
        assert not lost, lost
        return
    assert len(lost) == 1 and "('add_5')" in lost[0] and f"from {len(named)} value(s)" in lost[0], lost
    assert all(repr(name) in lost[0] for name in named[:3]), lost
