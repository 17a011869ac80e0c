"""Parameter patterns exporters leave in a file (issue 25): a norm scale written ``weight + 1``, a
learned table tiled to the batch beside zeros, and a parameter folded into ``1 - p`` beside it.

Two kinds of check:

* small graphs written with ``onnx.helper``, one pattern each, whose counts are the products of the
  initializers' shapes named in the test;
* real exports (``tests/data/param_cases``, built by ``make_param_cases.py`` with torch: a
  Nemotron-style LM with LayerNorm1P, a DETR-style decoder, an RWKV LM; both exporters, graph-only)
  checked against torch's own count, ``sum(p.numel() for p in model.parameters())``, recorded when
  the file was built.
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

from exporters.megatron import megatron_masks
from importers import import_model
from tests.exporters.graphs import spaces_for

CASES = Path(__file__).resolve().parents[1] / "data" / "param_cases"
RECORDS: dict[str, dict[str, int]] = json.loads((CASES / "counts.json").read_text())
DIMS = {"batch": 4, "seq": 16}
_LERP_WARNING = re.compile(r"^([\d,]+) elements of constants the exporter made .* taken as folded from it")


def _save(tmp_path: Path, nodes, inputs, outputs, initializers, name: str = "m") -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=initializers)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    return path


def _tensor(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    values = np.random.default_rng(seed).standard_normal(shape).astype(np.float32)
    return numpy_helper.from_array(values, name)


def _scalar(name: str, value: float) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(value, dtype=np.float32), name)


class TestWeightPlusOne:
    H = 16

    def _layer_norm_1p(self, tmp_path: Path) -> Path:
        H = self.H
        nodes = [
            helper.make_node("Add", ["ln.weight", "one"], ["scale"]),
            helper.make_node("LayerNormalization", ["x", "scale", "ln.bias"], ["h"], axis=-1),
            helper.make_node("MatMul", ["h", "fc.weight"], ["y"]),
        ]
        inputs = [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", H])]
        outputs = [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", 2 * H])]
        inits = [_tensor("ln.weight", (H,), 0), _tensor("ln.bias", (H,), 1), _tensor("fc.weight", (H, 2 * H), 2),
                 _scalar("one", 1.0)]
        return _save(tmp_path, nodes, inputs, outputs, inits, "ln1p")

    def test_layer_norm_1p_counts_the_weight_once_and_makes_no_op_of_it(self, tmp_path):
        graph = import_model(self._layer_norm_1p(tmp_path), DIMS)
        assert graph.parameter_count == self.H + self.H + self.H * 2 * self.H
        # weight + 1 is the weight, read by the norm: no op without the batch's dims is left.
        assert [op.op_type for op in graph.ops] == ["LayerNormalization", "MatMul"]
        assert all(any(d.is_batch for d in op.dims) for op in graph.ops)

    def test_gemma_rms_norm_one_plus_weight(self, tmp_path):
        H = self.H
        nodes = [
            helper.make_node("Mul", ["x", "x"], ["sq"]),
            helper.make_node("ReduceMean", ["sq", "axes"], ["ms"], keepdims=1),
            helper.make_node("Add", ["ms", "eps"], ["mse"]),
            helper.make_node("Sqrt", ["mse"], ["rms"]),
            helper.make_node("Div", ["x", "rms"], ["normed"]),
            helper.make_node("Add", ["one", "norm.weight"], ["scale"]),  # 1 + weight: the constant first
            helper.make_node("Mul", ["normed", "scale"], ["h"]),
            helper.make_node("MatMul", ["h", "fc.weight"], ["y"]),
        ]
        inputs = [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", H])]
        outputs = [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", H])]
        inits = [_tensor("norm.weight", (H,), 0), _tensor("fc.weight", (H, H), 1), _scalar("one", 1.0),
                 _scalar("eps", 1e-6), numpy_helper.from_array(np.array([-1], dtype=np.int64), "axes")]
        graph = import_model(_save(tmp_path, nodes, inputs, outputs, inits, "rms1p"), DIMS)
        assert graph.parameter_count == H + H * H
        assert all(any(d.is_batch for d in op.dims) for op in graph.ops)


class TestLearnedTableBesideZeros:
    def test_tiled_queries_and_their_first_projection_are_parameters(self, tmp_path):
        """DETR: ``zeros + query_pos`` with ``query_pos`` a [Q, D] table tiled to the batch, projected
        by a weight the exporter made (an anonymous name): the table, the weight and the bias count."""
        Q, D = 10, 8
        nodes = [
            helper.make_node("Shape", ["memory"], ["mshape"], start=0, end=1),
            helper.make_node("Concat", ["mshape", "ones2"], ["reps"], axis=0),
            helper.make_node("Tile", ["val_7", "reps"], ["query_pos"]),
            helper.make_node("Shape", ["query_pos"], ["qshape"]),
            helper.make_node("ConstantOfShape", ["qshape"], ["zeros"]),
            helper.make_node("Add", ["zeros", "query_pos"], ["q"]),
            helper.make_node("MatMul", ["q", "val_17"], ["qp"]),
            helper.make_node("Add", ["qp", "val_18"], ["qb"]),
            helper.make_node("MatMul", ["qb", "memory_t"], ["scores"]),
        ]
        inputs = [helper.make_tensor_value_info("memory", T.FLOAT, ["batch", 12, D]),
                  helper.make_tensor_value_info("memory_t", T.FLOAT, ["batch", D, 12])]
        outputs = [helper.make_tensor_value_info("scores", T.FLOAT, ["batch", Q, 12])]
        inits = [_tensor("val_7", (1, Q, D), 0), _tensor("val_17", (D, D), 1), _tensor("val_18", (D,), 2),
                 numpy_helper.from_array(np.array([1, 1], dtype=np.int64), "ones2")]
        graph = import_model(_save(tmp_path, nodes, inputs, outputs, inits, "detr"), {"batch": 4})
        assert graph.parameter_count == Q * D + D * D + D


class TestFoldedOneMinus:
    C = 8

    def _time_mix(self, tmp_path: Path, *, values: bool, folded: np.ndarray | None = None) -> Path:
        """``x * time_mix + shifted * sub`` with ``sub`` the exporter's fold of ``1 - time_mix``."""
        C = self.C
        mix = _tensor("blocks.0.time_mix_key", (1, 1, C), 0)
        sub = numpy_helper.from_array(1.0 - numpy_helper.to_array(mix) if folded is None else folded, "onnx::Mul_9")
        nodes = [
            helper.make_node("Mul", ["x", "blocks.0.time_mix_key"], ["a"]),
            helper.make_node("Mul", ["shifted", "onnx::Mul_9"], ["b"]),
            helper.make_node("Add", ["a", "b"], ["mixed"]),
            helper.make_node("MatMul", ["mixed", "blocks.0.key.weight"], ["y"]),
        ]
        inputs = [helper.make_tensor_value_info(n, T.FLOAT, ["batch", "seq", C]) for n in ("x", "shifted")]
        outputs = [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", C])]
        inits = [mix, sub, _tensor("blocks.0.key.weight", (C, C), 3)]
        if not values:  # graph-only: the values are gone, the names and shapes stay
            for tensor in inits:
                tensor.ClearField("raw_data")
                tensor.ClearField("float_data")
                tensor.data_location = T.EXTERNAL
                entry = tensor.external_data.add()
                entry.key, entry.value = "location", "absent.data"
        return _save(tmp_path, nodes, inputs, outputs, inits, "mix")

    def test_proven_by_values_counts_time_mix_once_without_a_warning(self, tmp_path):
        graph = import_model(self._time_mix(tmp_path, values=True), DIMS)
        assert graph.parameter_count == self.C + self.C * self.C
        assert not any(_LERP_WARNING.match(w) for w in graph.warnings)

    def test_graph_only_counts_it_once_and_says_so(self, tmp_path):
        graph = import_model(self._time_mix(tmp_path, values=False), DIMS)
        assert graph.parameter_count == self.C + self.C * self.C
        found = [_LERP_WARNING.match(w) for w in graph.warnings]
        assert [int(f.group(1).replace(",", "")) for f in found if f] == [self.C]

    def test_values_that_are_not_affine_in_it_are_a_parameter(self, tmp_path):
        other = np.random.default_rng(9).standard_normal((1, 1, self.C)).astype(np.float32)
        graph = import_model(self._time_mix(tmp_path, values=True, folded=other), DIMS)
        assert graph.parameter_count == 2 * self.C + self.C * self.C


# ------------------------------------------------------------------------------------------------
# Real exports: torch's count, and sequence parallelism on LayerNorm1P
# ------------------------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(RECORDS), ids=lambda n: n.removesuffix(".onnx"))
def test_count_is_torchs(name: str) -> None:
    record = RECORDS[name]
    graph = import_model(CASES / name, DIMS)
    warned = [int(m.group(1).replace(",", "")) for m in map(_LERP_WARNING.match, graph.warnings) if m]
    assert graph.parameter_count == record["param_count"], graph.warnings
    if name.endswith("_bare.onnx") and record["derived_elements"]:
        # No values to prove the fold: the elements taken as folded are said, and they are the
        # time-mix parameters' own count.
        assert warned == [record["derived_elements"]]
    else:
        assert warned == []


@pytest.mark.parametrize("name", sorted(n for n in RECORDS if n.startswith("nemotron")),
                         ids=lambda n: n.removesuffix(".onnx"))
def test_layer_norm_1p_allows_sequence_parallelism(name: str) -> None:
    graph = import_model(CASES / name, DIMS)
    spaces = spaces_for(graph, 4)
    masks = megatron_masks(graph, spaces, dp=2, tp=2, sequence_parallel=True)
    assert masks is not None
    norms = [i for i, op in enumerate(graph.ops) if op.kind == "norm"]
    assert len(norms) == 5  # two per layer and the final one
    for i in norms:  # each norm may split the sequence (Megatron's --sequence-parallel)
        seq = [d.name for d in graph.ops[i].dims if d.size == DIMS["seq"]]
        assert any(spaces[i].describe(int(r)).get(seq[0], 1) == 2 for r in np.flatnonzero(masks[i])), graph.ops[i].name


# ------------------------------------------------------------------------------------------------
# The CNNs the onnx wheel ships (Caffe's BatchNorm + Scale, weights stripped to ConstantOfShape)
# ------------------------------------------------------------------------------------------------

LIGHT = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
_SCALE_WARNING = re.compile(r"^([\d,]+) elements of (\d+) per-channel Mul/Add operands made by ConstantOfShape")


def _scale_layer_stand_ins(path: Path) -> tuple[int, int]:
    """(elements, count) of float ConstantOfShape outputs read only through Unsqueeze by Mul/Add."""
    graph = onnx.load(path).graph
    inits = {t.name: t for t in graph.initializer}
    readers: dict[str, list[onnx.NodeProto]] = {}
    for node in graph.node:
        for name in node.input:
            readers.setdefault(name, []).append(node)
    elements = count = 0
    for node in graph.node:
        if node.op_type != "ConstantOfShape" or node.input[0] not in inits:
            continue
        users = readers.get(node.output[0], [])
        if users and all(u.op_type == "Unsqueeze" for u in users) and all(
                r.op_type in ("Mul", "Add") for u in users for r in readers.get(u.output[0], [])):
            elements += int(np.prod(numpy_helper.to_array(inits[node.input[0]])))
            count += 1
    return elements, count


@pytest.mark.parametrize("stem", ["light_densenet121", "light_inception_v2"])
def test_caffe_scale_layers_are_said(stem: str) -> None:
    path = LIGHT / f"{stem}.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this onnx wheel")
    graph = import_model(path)
    found = [m for m in map(_SCALE_WARNING.match, graph.warnings) if m]
    assert [(int(m.group(1).replace(",", "")), int(m.group(2))) for m in found] == [_scale_layer_stand_ins(path)]


def test_no_scale_warning_without_scale_layers() -> None:
    path = LIGHT / "light_resnet50.onnx"
    if not path.exists():
        pytest.skip(f"{path.name} is not in this onnx wheel")
    assert not any(_SCALE_WARNING.match(w) for w in import_model(path).warnings)


class TestLinearToOneOutput:
    """``nn.Linear(h, 1)`` on a 3-D input exports as ``MatMul`` by an ``[h, 1]`` weight plus an ``Add`` of its
    one-element bias (ELECTRA's discriminator head; reward, value and binary heads): a parameter, though a
    one-element value kept in the file reads like a scalar constant (issue 25, sweep H4 finding 6)."""

    H = 8

    def _head(self, tmp_path: Path, width: int) -> Path:
        H = self.H
        nodes = [
            helper.make_node("MatMul", ["x", "onnx::MatMul_7"], ["logits"]),
            helper.make_node("Add", ["head.bias", "logits"], ["y"]),
        ]
        inputs = [helper.make_tensor_value_info("x", T.FLOAT, ["batch", "seq", H])]
        outputs = [helper.make_tensor_value_info("y", T.FLOAT, ["batch", "seq", width])]
        inits = [_tensor("onnx::MatMul_7", (H, width), 0), _scalar("head.bias", 0.5)]
        return _save(tmp_path, nodes, inputs, outputs, inits, f"head{width}")

    def test_the_one_element_bias_of_a_one_column_linear_is_counted(self, tmp_path):
        assert import_model(self._head(tmp_path, 1), DIMS).parameter_count == self.H * 1 + 1

    def test_a_one_element_constant_added_to_a_wider_linear_is_not(self, tmp_path):
        # the same named scalar beside a 4-column product is a shift of every output, as before
        assert import_model(self._head(tmp_path, 4), DIMS).parameter_count == self.H * 4

    def test_electra_torchscript_export_counts_torchs_parameters(self):
        # transformers' ElectraForPreTraining (2 layers, hidden 128), TorchScript export, graph-only with small
        # values inline; torch: sum(p.numel() for p in model.parameters()) = 370,561, of which the
        # discriminator's dense_prediction.bias is 1 (the dynamo export of the same model already read it)
        path = Path(__file__).resolve().parents[1] / "data" / "linear_one_cases" / "electra_ts_consts.onnx"
        assert import_model(path, {"batch": 2, "seq": 16}).parameter_count == 370_561
