"""The torch profile runs each GELU-family node in the form it computes (issue 25, :mod:`objectives.torch_profile`).

ONNX ``Gelu``-20 is erf GELU or, with ``approximate="tanh"``, its tanh approximation; onnxruntime's contrib ops
(domain ``com.microsoft``; the schemas of onnxruntime 1.32.0: ``BiasGelu(A, B)``, ``FastGelu(X, bias?)``,
``QuickGelu(X)`` with ``alpha`` 1.702 by default) are ``Gelu(A + B)`` (erf), the tanh form of ``X + bias``,
and ``x sigmoid(alpha x)``. Before, every ``Gelu`` ran as erf ``F.gelu`` and the three contrib ops had no
call (the roofline priced them).

The mapping tests need no torch: each tiny graph is imported as the planner imports a file and the call's
shapes are worked out by hand. The numeric tests (``integration``, skipped without torch) run the very
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
from objectives.torch_profile import TorchCall, build_call, call_signature, tensor_view, torch_call
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


@pytest.mark.integration
class TestAgainstOnnxruntime:
    @pytest.fixture(autouse=True)
    def _torch(self):
        pytest.importorskip("torch")

    def _both(self, imported, case: str) -> tuple[np.ndarray, np.ndarray, list[np.ndarray]]:
        """(the profile's forward output, onnxruntime's output, the inputs) for one case at full size."""
        import onnxruntime as ort
        import torch

        path, op, tensors = imported[case]
        call = torch_call(op, {}, tensors=tensors)
        torch.manual_seed(7)
        forward, backward = build_call(call, "cpu", "float32")
        ours = forward()[0].numpy()
        assert len(backward()) == len(call.shapes)  # autograd runs through the call (a gradient per input)
        torch.manual_seed(7)  # build_call draws its inputs first, one torch.randn per shape, in order
        inputs = [torch.randn(s).numpy() for s in call.shapes]
        session = ort.InferenceSession(str(path), providers=["CPUExecutionProvider"])
        feeds = dict(zip(["x", "b"], inputs))
        theirs = session.run(None, feeds)[0]
        return ours, theirs, inputs

    @pytest.mark.parametrize("case", sorted(NODES))
    def test_the_profiled_call_computes_what_onnxruntime_computes(self, imported, case):
        ours, theirs, _ = self._both(imported, case)
        np.testing.assert_allclose(ours, theirs, rtol=1e-5, atol=2e-6)

    def test_tanh_and_erf_differ_more_than_the_tolerance(self, imported):
        """The old mapping (erf for every Gelu) fails the test above for the tanh cases."""
        import torch

        for case in ("gelu-tanh", "fast-gelu", "fast-gelu-bias"):
            _, theirs, inputs = self._both(imported, case)
            x = torch.from_numpy(inputs[0] + (inputs[1] if len(inputs) > 1 else 0))
            erf = torch.nn.functional.gelu(x).numpy()
            # |tanh form - erf form| <= 4.7e-4 over all x; 1,024 N(0, 1) samples reach > 1e-4, 50x the tolerance
            assert 1e-4 < np.abs(theirs - erf).max() < 4.8e-4

    @pytest.mark.parametrize("case", ["fast-gelu-bias", "quick-gelu"])
    def test_profile_measures_the_contrib_ops_and_the_cost_model_reads_them(self, imported, case, tmp_path):
        """Before, ``planner profile --provider torch-*`` counted these ops unprofilable and the roofline
        priced them; now each configuration's call is timed and ``op_compute_time_s`` reads it."""
        from objectives.compute import op_compute_time_s
        from objectives.profile import ProfileDB, profile_graph
        from planner.core.cluster import Device
        from planner.core.configs import ConfigOptions, enumerate_configs
        from planner.core.settings import TrainingSettings

        _, op, tensors = imported[case]
        space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
        calls = {call_signature(torch_call(op, space.describe(r), tensors=tensors), "float32")
                 for r in range(space.size)}
        graph = import_model(imported[case][0])
        with ProfileDB(tmp_path / "p.db") as db:
            report = profile_graph(graph, [space], db, provider="torch-cpu", repeats=1, warmup=1)
            assert (report.measured, report.failed, report.unprofilable_by_type) == (len(calls), 0, {})
            measured = db.lookup_fn("torch-cpu", report.device_name, tensors=tensors, dtype="float32")
        device = Device(name="gpu", memory_bytes=2**34, peak_flops={"fp32": 1e13, "bf16": 1e14},
                        memory_bandwidth_bytes_per_s=1e12)
        times = op_compute_time_s(op, space, tensors=tensors, device=device, settings=TrainingSettings(),
                                  measured=measured)
        assert (times.measured, times.fallbacks) == (space.size, 0)
