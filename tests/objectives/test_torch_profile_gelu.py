"""The torch profile runs each GELU-family node in the form it computes (issue 25, :mod:`objectives.torch_profile`).

ONNX ``Gelu``-20 is erf GELU or, with ``approximate="tanh"``, its tanh approximation; onnxruntime's contrib ops
(domain ``com.microsoft``; the schemas of onnxruntime 1.32.0: ``BiasGelu(A, B)``, ``FastGelu(X, bias?)``,
``QuickGelu(X)`` with ``alpha`` 1.702 by default) are ``Gelu(A + B)`` (erf), the tanh form of ``X + bias``,
and ``x sigmoid(alpha x)``. Before, every ``Gelu`` ran as erf ``F.gelu`` and the three contrib ops had no
call (the roofline priced them).

The mapping tests need no torch: each tiny graph is imported as the planner imports a file and the call's
shapes are worked out by hand. The numeric tests (tests/integration/test_torch_profile_gelu_onnxruntime.py) run the very
closure the profile times and onnxruntime on the same node with the same inputs: onnxruntime is the
independent oracle of what each node computes. The profile then times the contrib ops (counted
unprofilable before) and the cost model reads their timings.
"""

from __future__ import annotations

import hashlib

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper

from importers import import_model
from importers.gelu_form import gelu_forms
from objectives.torch_profile import TorchCall, call_signature, tensor_view, torch_call
from planner.core.gelu import QUICK_GELU_ALPHA

ROWS, WIDTH = 16, 64
"""The node's input ``x`` is ``[ROWS, WIDTH]``; a bias is ``[WIDTH]``."""

MS = "com.microsoft"

#: case -> (op type, domain, attributes, has a bias input)
NODES = {
    "gelu-erf": ("Gelu", "", {}, False),
    "gelu-none": ("Gelu", "", {"approximate": "none"}, False),
    "gelu-tanh": ("Gelu", "", {"approximate": "tanh"}, False),
    "ms-gelu": ("Gelu", MS, {}, False),
    "bias-gelu": ("BiasGelu", MS, {}, True),
    "fast-gelu": ("FastGelu", MS, {}, False),
    "fast-gelu-bias": ("FastGelu", MS, {}, True),
    "quick-gelu": ("QuickGelu", MS, {}, False),
    "quick-gelu-alpha": ("QuickGelu", MS, {"alpha": 1.25}, False),
}

#: case -> (TorchCall.name, alpha) the profile should run: by the ONNX spec and onnxruntime's schemas
FORMS = {
    "gelu-erf": ("gelu", None), "gelu-none": ("gelu", None), "gelu-tanh": ("gelu_tanh", None),
    "ms-gelu": ("gelu", None), "bias-gelu": ("gelu", None), "fast-gelu": ("gelu_tanh", None),
    "fast-gelu-bias": ("gelu_tanh", None), "quick-gelu": ("quick_gelu", 1.702),
    "quick-gelu-alpha": ("quick_gelu", 1.25),
}


def _model(case: str) -> onnx.ModelProto:
    op_type, domain, attributes, bias = NODES[case]
    names = ["x", "b"] if bias else ["x"]
    node = helper.make_node(op_type, names, ["y"], name="act", domain=domain, **attributes)
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, [ROWS, WIDTH])]
    inputs += [helper.make_tensor_value_info("b", T.FLOAT, [WIDTH])] if bias else []
    output = helper.make_tensor_value_info("y", T.FLOAT, [ROWS, WIDTH])
    graph = helper.make_graph([node], case, inputs, [output])
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 20), helper.make_opsetid(MS, 1)])


@pytest.fixture(scope="module")
def imported(tmp_path_factory):
    """case -> (path of its file, its one op, the graph's tensors), imported as ``planner`` imports a file."""
    found = {}
    for case in NODES:
        path = tmp_path_factory.mktemp(case) / "m.onnx"
        onnx.save(_model(case), str(path))
        graph = import_model(path)
        assert len(graph.ops) == 1
        found[case] = (path, graph.ops[0], tensor_view(graph))
    return found


class TestMapping:
    @pytest.mark.parametrize("case", sorted(NODES))
    def test_each_node_runs_in_its_form(self, imported, case):
        _, op, tensors = imported[case]
        name, alpha = FORMS[case]
        # split on the width (d1) by 2: x [16, 64] -> [16, 32], a bias [64] -> [32] (broadcast on the rows)
        shapes = ((ROWS, WIDTH // 2), (WIDTH // 2,)) if NODES[case][3] else ((ROWS, WIDTH // 2),)
        call = torch_call(op, {"d1": 2}, tensors=tensors)
        assert isinstance(call, TorchCall), call  # before: FastGelu/BiasGelu/QuickGelu had no call
        assert (call.fn, call.name, call.shapes) == ("unary", name, shapes)
        assert call.alpha == (None if alpha is None else pytest.approx(alpha, rel=1e-7))  # float32 attribute
        assert call.flops == ROWS * WIDTH // 2  # one per output element of the shard

    def test_the_erf_call_keeps_its_signature_and_the_tanh_call_gets_its_own(self, imported):
        erf = torch_call(imported["gelu-erf"][1], {}, tensors=imported["gelu-erf"][2])
        tanh = torch_call(imported["gelu-tanh"][1], {}, tensors=imported["gelu-tanh"][2])
        # the database key before forms were read: digest of ((fn, shapes, name, dim, widths), dtype)
        before = hashlib.sha256(repr((("unary", ((ROWS, WIDTH),), "gelu", -1, ()), "float32")).encode())
        assert call_signature(erf, "float32") == "torch:" + before.hexdigest()[:32]  # stored erf timings still apply
        assert call_signature(tanh, "float32") != call_signature(erf, "float32")

    def test_quick_gelu_default_alpha_and_the_written_default_share_a_signature(self, imported, tmp_path):
        node = helper.make_node("QuickGelu", ["x"], ["y"], name="act", domain=MS, alpha=QUICK_GELU_ALPHA)
        model = _model("quick-gelu")
        model.graph.node[0].CopyFrom(node)
        onnx.save(model, str(tmp_path / "m.onnx"))
        graph = import_model(tmp_path / "m.onnx")
        written = torch_call(graph.ops[0], {}, tensors=tensor_view(graph))
        default = torch_call(imported["quick-gelu"][1], {}, tensors=imported["quick-gelu"][2])
        assert written == default and call_signature(written, "float32") == call_signature(default, "float32")

    @pytest.mark.parametrize("case", sorted(NODES))
    def test_the_importer_reads_the_same_form(self, imported, case):
        """One rule (planner.core.gelu): the importer's form of the node is the one the profile runs."""
        path, op, tensors = imported[case]
        importer = gelu_forms(str(path)).get("act")
        profile = torch_call(op, {}, tensors=tensors).name
        assert {"gelu-erf": "gelu", "gelu-tanh": "gelu_tanh", None: "quick_gelu"}[importer] == profile

    def test_a_hand_built_gelu_without_its_node_stays_erf(self, imported):
        _, op, tensors = imported["gelu-tanh"]
        bare = type(op)(**{**{f: getattr(op, f) for f in op.__dataclass_fields__}, "node": None})
        assert torch_call(bare, {}, tensors=tensors).name == "gelu"  # the ONNX default, as before
