"""A graph-only Mamba-2 (issue 25): the chunked scan's Einsums get shapes and FLOPs.

Files: transformers' ``Mamba2ForCausalLM`` (``tests/importers/make_mamba2_cases.py``: one layer, 8 heads
of 16, state 16, chunks of 8), both exporters, graph-only (``bare``: every initializer stripped) and
with its small constants inline (``consts``). Two causes had left the Einsums opaque:

* torch.export's file keeps the chunk padding's amounts in int64 initializers (stripped in ``bare``);
  the declared ``value_info`` has the dims, written with sympy's ``Mod(...)``, which the dim
  evaluator did not read (``importers/dim_expr.py``);
* the TorchScript exporter writes ``permute(0, -2, -1, 1)`` as a Transpose with negative ``perm``,
  against the ONNX spec, where ONNX's shape inference stopped (``importers/onnx_load.py``).
"""

from __future__ import annotations

import json
import math
from pathlib import Path

import pytest
from onnx import TensorProto, helper

from importers import import_model
from importers.dim_expr import eval_dim_expr
from importers.shapes import resolve_shapes

CASES = Path(__file__).resolve().parents[1] / "data" / "mamba2_cases"
COUNTS = json.loads((CASES / "counts.json").read_text())
FILES = sorted(COUNTS["files"])
CONFIG = COUNTS["config"]


def _hand_contractions(batch: int, seq: int) -> list[float]:
    """2 x (product of the einsum's index sizes) of transformers' torch_forward, in its order."""
    b, l = batch, CONFIG["chunk_size"]
    c = math.ceil(seq / l)  # the sequence is padded to whole chunks
    h, p, n = CONFIG["num_heads"], CONFIG["head_dim"], CONFIG["state_size"]
    return [
        2.0 * b * c * l * l * h * n,  # bclhn,bcshn->bclsh  (C . B within a chunk)
        2.0 * b * c * l * l * h * p,  # bclsh,bcshp->bclhp  (the masked scores times x)
        2.0 * b * c * l * h * p * n,  # bclhn,bclhp->bchpn  (each chunk's final states)
        2.0 * b * (c + 1) * (c + 1) * h * p * n,  # bzch,bzhpn->bchpn  (states across chunks, + the initial)
        2.0 * b * c * l * h * n * p,  # bclhn,bchpn->bclhp  (states to outputs)
    ]


@pytest.mark.parametrize("seq", [16, 13])
@pytest.mark.parametrize("name", FILES)
def test_every_einsum_has_its_shapes_and_flops(name: str, seq: int) -> None:
    graph = import_model(CASES / name, {"batch": 2, "seq": seq})
    einsums = [op for op in graph.ops if op.op_type == "Einsum"]
    assert [op.kind for op in einsums] == ["matmul"] * 5
    assert [2.0 * math.prod(op.dim_sizes) for op in einsums] == _hand_contractions(2, seq)
    assert not [op.name for op in graph.ops if op.kind == "opaque"]
    assert graph.parameter_count == COUNTS["files"][name]


@pytest.mark.parametrize("exporter", ["dynamo", "ts"])
def test_graph_only_imports_to_the_same_ops_as_with_constants_inline(exporter: str) -> None:
    def ops(style: str):
        graph = import_model(CASES / f"mamba2_{exporter}_{style}.onnx", {"batch": 2, "seq": 13})
        return graph.ops

    bare, consts = ops("bare"), ops("consts")
    assert [(op.name, op.kind, op.op_type, [(d.name, d.size, d.kind, d.is_batch) for d in op.dims], op.flops)
            for op in bare] == [(op.name, op.kind, op.op_type, [(d.name, d.size, d.kind, d.is_batch) for d in op.dims],
                                 op.flops) for op in consts]
    # Only a CumSum may differ: its axis is a runtime scalar that torch.export's stripped file lost and
    # no shape tells, so every axis is kept unsplit there (the conservative reading).
    differ = {a.op_type for a, b in zip(bare, consts) if a.dims != b.dims}
    assert differ <= {"CumSum"}
    for a in bare:
        if a.op_type == "CumSum" and a.op_type in differ:
            assert not any(d.splittable for d in a.dims)


def test_sympy_functions_in_declared_dims() -> None:
    # Mamba-2's padded length at seq = 13, chunk 8: 13 + (8 - 13 % 8) % 8 = 16
    assert eval_dim_expr("seq + (Mod(8 - (Mod(seq, 8)), 8))", {"seq": 13}) == 16
    assert eval_dim_expr("FloorDiv(seq, 8) + CleanDiv(16, 8) + PythonMod(seq, 5)", {"seq": 13}) == 1 + 2 + 3


def test_a_transpose_with_negative_perm_is_the_permutation_torch_meant(tmp_path: Path) -> None:
    from importers.onnx_load import load_onnx
    import onnx

    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 5, 7])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    node = helper.make_node("Transpose", ["x"], ["t"], perm=[0, -2, -1, 1])
    relu = helper.make_node("Relu", ["t"], ["y"])
    model = helper.make_model(helper.make_graph([node, relu], "g", [x], [y]), opset_imports=[helper.make_opsetid("", 17)])
    onnx.save(model, str(tmp_path / "t.onnx"))
    loaded, _ = load_onnx(tmp_path / "t.onnx")
    assert resolve_shapes(loaded, {"batch": 2}).shapes["y"] == (2, 5, 7, 3)
