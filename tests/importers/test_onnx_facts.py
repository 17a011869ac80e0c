"""Issue 25 follow-up: the readers of a file's ONNX nodes share one reading of it (importers/onnx_facts.py).

A plan parses its file once (the import's own :func:`importers.onnx_load.load_onnx`): the norm
epsilons, MoE router, rotary, sliding-window, zero-centred and attention-scale readers and
:func:`importers.batch_dim_name` all use the model the import remembered. The one-element constants
are read once, with their element type, and each reader keeps its own rule of which it reads.
"""

from __future__ import annotations

import shutil
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto as T
from onnx import helper, numpy_helper

import importers.onnx_load as onnx_load
from importers import batch_dim_name, import_model
from importers.attention_scale import attention_scales
from importers.moe import find_moe_layers
from importers.moe_router import router_reading
from importers.norm_eps import norm_epsilons
from importers.onnx_facts import Scalar, file_facts, float_values
from importers.rotary import rotary_frequencies
from importers.sliding_window import sliding_windows, window_unread
from importers.zero_centred import scale_offsets
from tests.importers.test_batchnorm import folded

ROOT = Path(__file__).resolve().parents[2]


@pytest.fixture
def loads(monkeypatch):
    """The paths :func:`importers.onnx_load.load_onnx` parses while the test runs."""
    parsed: list[str] = []
    real = onnx_load.load_onnx

    def counting(path, notes=None):
        parsed.append(Path(path).name)
        return real(path, notes)

    monkeypatch.setattr(onnx_load, "load_onnx", counting)
    return parsed


def test_a_plan_reads_its_file_once(tmp_path, loads):
    # a fresh path, so no reader's own cache (keyed by path) answers before asking for the file
    path = tmp_path / "mixtral.onnx"
    shutil.copy(ROOT / "tests" / "zoo" / "mixtral_ts_consts.onnx", path)
    graph = import_model(path, {"batch": 2, "seq": 16})
    norms = [i for i, op in enumerate(graph.ops) if op.kind == "norm"]
    # transformers' MixtralConfig defaults, which the zoo keeps: rms_norm_eps 1e-5, rope_theta 1e6, no window
    assert norm_epsilons(graph, norms[:1]) == (1e-5,)
    assert rotary_frequencies(graph.source_path).base == 1_000_000
    assert sliding_windows(graph.source_path, graph.source_sha256) == ()
    assert window_unread(graph.source_path, graph.source_sha256) is False
    assert scale_offsets(graph.source_path, graph.source_sha256) == {}  # plain RMSNorm scales
    # 2 layers, each an attention softmax and a router softmax; TorchScript's SDPA scales q and k by
    # sqrt(1/sqrt(16)) each (the zoo's head size 64 / 4), read as their product; a router has none
    assert attention_scales(graph.source_path) == {
        f"/model/layers.{i}/{where}/Softmax": (16 ** -0.5 if where == "self_attn" else None)
        for i in (0, 1) for where in ("self_attn", "mlp/gate")}
    layers = find_moe_layers(graph)
    assert len(layers) == 2 and {router_reading(graph, layer).top_k for layer in layers} == {2}
    assert batch_dim_name(path) == "batch"
    assert loads == ["mixtral.onnx"]  # the import's parse, and no other


def test_the_import_leaves_the_remembered_model_as_the_file_reads(tmp_path, loads):
    path = tmp_path / "llama.onnx"
    shutil.copy(ROOT / "tests" / "zoo" / "llama_dynamo_consts.onnx", path)
    import_model(path, {"batch": 2, "seq": 16})
    remembered = file_facts(path).model
    reread, _ = onnx_load.load_onnx(path)
    assert remembered.SerializeToString() == reread.SerializeToString()
    assert loads == ["llama.onnx", "llama.onnx"]  # the import, then this test's own reading


def test_a_graph_the_import_changed_is_not_remembered(tmp_path, loads):
    # a folded BatchNormalization put back changes the loaded model: the readers must see the file's
    path = folded(tmp_path)
    import_model(path, {"batch": 2})
    assert [n.op_type for n in file_facts(path).nodes] == ["Conv", "Relu"]  # as written, no BatchNormalization
    assert loads == ["folded.onnx", "folded.onnx"]


def test_a_file_rewritten_in_place_is_read_again(tmp_path):
    path = tmp_path / "m.onnx"

    def save(value: float) -> None:
        constant = helper.make_node("Constant", [], ["c"], value=helper.make_tensor("c", T.FLOAT, [], [value]))
        io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
        graph = helper.make_graph([constant, helper.make_node("Mul", ["x", "c"], ["y"])], "g", io[:1], io[1:])
        onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), path)

    save(2.0)
    first = file_facts(path)
    assert first.scalars["c"].value == 2.0 and file_facts(path, first.sha256) is first
    save(3.0)  # same size, a new modification time
    assert file_facts(path).scalars["c"].value == 3.0


def test_one_element_constants_keep_their_type_and_absence(tmp_path):
    external = helper.make_tensor("w", T.INT64, [], [0])
    external.ClearField("int64_data")
    external.data_location = T.EXTERNAL
    external.external_data.add(key="location", value="gone.data")
    initializers = [
        numpy_helper.from_array(np.array(0.5, np.float16), "half"),
        numpy_helper.from_array(np.array([7], np.int64), "seven"),
        numpy_helper.from_array(np.array([True]), "yes"),
        numpy_helper.from_array(np.ones(3, np.float32), "vector"),  # three elements: not a scalar
        external,
    ]
    nodes = [helper.make_node("Constant", [], ["f"], value_float=2.5),
             helper.make_node("Constant", [], ["s"], value=helper.make_tensor("s", T.STRING, [], [b"a"])),
             helper.make_node("Identity", ["x"], ["y"])]
    io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
    path = tmp_path / "m.onnx"
    onnx.save(helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:], initializers),
                                opset_imports=[helper.make_opsetid("", 18)]), path)
    facts = file_facts(path)
    assert facts.scalars == {
        "half": Scalar(0.5, T.FLOAT16), "seven": Scalar(7.0, T.INT64), "yes": Scalar(1.0, T.BOOL),
        "w": Scalar(None, T.INT64), "f": Scalar(2.5, T.FLOAT),
    }
    assert float_values(facts) == {"half": 0.5, "f": 2.5}  # floats whose data is in the file
    assert facts.initializer_sizes == {"half": 1, "seven": 1, "yes": 1, "vector": 3, "w": 1}
