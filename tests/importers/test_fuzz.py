"""Property test: any mutation of a valid ONNX file either imports or raises a PlannerError.

Valid models are mutated at the proto level (dropped/renamed inputs, corrupted dims and dim names,
changed attributes, random op types and domains, corrupted initializers, deleted nodes, other
opsets) and at the byte level (truncation, flipped bytes), then loaded and shaped. Anything but a
:class:`~planner.core.errors.PlannerError` (a crash in onnx, numpy or our code) fails the test.
When ``importers.import_model`` exists, the full import is exercised instead of the two stages.
"""

from __future__ import annotations

import inspect
import os
import tempfile
from pathlib import Path
from typing import Callable

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper, numpy_helper

import importers
from importers.onnx_load import load_onnx
from importers.shapes import resolve_shapes
from planner.core.errors import PlannerError

OPSET = [helper.make_opsetid("", 18)]
# Deterministic and modest by default; PLANNER_FUZZ_EXAMPLES=5000 PLANNER_FUZZ_RANDOM=1 runs a
# deeper, randomly seeded campaign.
FUZZ = settings(
    max_examples=int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "120")),
    derandomize=os.environ.get("PLANNER_FUZZ_RANDOM") != "1",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)


# ------------------------------------------------------------------------------------------------
# Seed models (small, valid, covering shape subgraphs, weights, convolutions, value_info)
# ------------------------------------------------------------------------------------------------


def _attention() -> onnx.ModelProto:
    rng = np.random.default_rng(0)
    inits = [
        numpy_helper.from_array(rng.standard_normal((8, 24)).astype(np.float32), "w_qkv"),
        numpy_helper.from_array(np.array([2], np.int64), "heads"),
        numpy_helper.from_array(np.array([0], np.int64), "i0"),
        numpy_helper.from_array(np.array([1], np.int64), "i1"),
        numpy_helper.from_array(np.array([2], np.int64), "i2"),
        numpy_helper.from_array(np.array([-1], np.int64), "minus1"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "w_qkv"], ["qkv"], name="mm"),
        helper.make_node("Split", ["qkv"], ["q", "k", "v"], axis=2, num_outputs=3, name="split"),
        helper.make_node("Shape", ["x"], ["xs"], name="shape"),
        helper.make_node("Gather", ["xs", "i0"], ["b"], axis=0, name="gb"),
        helper.make_node("Gather", ["xs", "i1"], ["s"], axis=0, name="gs"),
        helper.make_node("Gather", ["xs", "i2"], ["h"], axis=0, name="gh"),
        helper.make_node("Div", ["h", "heads"], ["hd"], name="div"),
        helper.make_node("Concat", ["b", "s", "heads", "hd"], ["hs"], axis=0, name="cat"),
        helper.make_node("Reshape", ["q", "hs"], ["q4"], name="rq"),
        helper.make_node("Reshape", ["k", "hs"], ["k4"], name="rk"),
        helper.make_node("Transpose", ["q4"], ["qt"], perm=[0, 2, 1, 3], name="tq"),
        helper.make_node("Transpose", ["k4"], ["kt"], perm=[0, 2, 3, 1], name="tk"),
        helper.make_node("MatMul", ["qt", "kt"], ["sc"], name="qk"),
        helper.make_node("Softmax", ["sc"], ["p"], axis=-1, name="sm"),
        helper.make_node("Reshape", ["v", "hs"], ["v4"], name="rv"),
        helper.make_node("Transpose", ["v4"], ["vt"], perm=[0, 2, 1, 3], name="tv"),
        helper.make_node("MatMul", ["p", "vt"], ["ctx"], name="pv"),
        helper.make_node("Transpose", ["ctx"], ["ct"], perm=[0, 2, 1, 3], name="tc"),
        helper.make_node("Concat", ["b", "s", "minus1"], ["os"], axis=0, name="cat2"),
        helper.make_node("Reshape", ["ct", "os"], ["y"], name="ro"),
    ]
    vis = [
        helper.make_tensor_value_info("qkv", TensorProto.FLOAT, ["batch", "seq", 24]),
        helper.make_tensor_value_info("sc", TensorProto.FLOAT, ["batch", 2, "seq", "seq"]),
        helper.make_tensor_value_info("q4", TensorProto.FLOAT, ["batch", "seq", 2, "unk__0"]),
    ]
    graph = helper.make_graph(
        nodes,
        "attn",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])],
        initializer=inits,
        value_info=vis,
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _mask() -> onnx.ModelProto:
    inits = [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array([1], np.int64), "ax1"),
        numpy_helper.from_array(np.array(-1e4, np.float32), "neg"),
        numpy_helper.from_array(np.array(0.0, np.float32), "zf"),
    ]
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], start=1, end=2, name="shape"),
        helper.make_node("Squeeze", ["shape"], ["n"], name="sq"),
        helper.make_node("Range", ["zero", "n", "one"], ["pos"], name="range"),
        helper.make_node("Unsqueeze", ["pos", "ax1"], ["col"], name="unsq"),
        helper.make_node("Less", ["pos", "col"], ["fut"], name="less"),
        helper.make_node("Where", ["fut", "neg", "zf"], ["mask"], name="where"),
        helper.make_node("ConstantOfShape", ["shape"], ["zeros"],
                         value=helper.make_tensor("v", TensorProto.FLOAT, [1], [0.0]), name="cos"),
        helper.make_node("Expand", ["mask", "shape"], ["mexp"], name="expand"),
        helper.make_node("Add", ["x", "mexp"], ["y"], name="add"),
    ]
    graph = helper.make_graph(
        nodes,
        "mask",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", "seq"])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=OPSET)


def _convnet() -> onnx.ModelProto:
    rng = np.random.default_rng(1)
    inits = [
        numpy_helper.from_array(rng.standard_normal((4, 3, 3, 3)).astype(np.float32), "wc"),
        numpy_helper.from_array(rng.standard_normal((4 * 4 * 4, 5)).astype(np.float32), "wf"),
        numpy_helper.from_array(np.zeros(5, np.float32), "bf"),
    ]
    nodes = [
        helper.make_node("Conv", ["x", "wc"], ["c"], pads=[1, 1, 1, 1], name="conv"),
        helper.make_node("Relu", ["c"], ["r"], name="relu"),
        helper.make_node("MaxPool", ["r"], ["p"], kernel_shape=[2, 2], strides=[2, 2], name="pool"),
        helper.make_node("Flatten", ["p"], ["f"], axis=1, name="flat"),
        helper.make_node("Gemm", ["f", "wf", "bf"], ["y"], name="fc"),
    ]
    graph = helper.make_graph(
        nodes,
        "conv",
        [helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", 3, 8, 8])],
        [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", 5])],
        initializer=inits,
    )
    return helper.make_model(graph, opset_imports=OPSET)


SEEDS: list[Callable[[], onnx.ModelProto]] = [_attention, _mask, _convnet]

OP_TYPES = [
    "Relu", "Add", "MatMul", "Reshape", "Concat", "Gather", "Slice", "Shape", "Expand", "Range",
    "ConstantOfShape", "Tile", "Pad", "Resize", "ConvTranspose", "Squeeze", "Unsqueeze", "Where",
    "Split", "TopK", "NonZero", "Einsum", "Transpose", "Cast", "If", "Loop", "Scan", "Foo", "",
    "Constant", "Identity", "Div", "Mod", "CumSum", "Unique", "OneHot", "Softmax", "LayerNormalization",
]
DIM_TEXTS = [
    "batch", "seq", "batch*seq", "seq + 1", "seq/0", "seq/7", "__import__('os')", "", "unk__4",
    "a.b", "-seq", "seq - seq", "9" * 30, "max(", "batch**2", "floor(seq/2)",
]
INTS = st.one_of(
    st.integers(-3, 12),
    st.sampled_from([0, -1, 2**31, 2**40, -(2**62), 10**6]),
)


# ------------------------------------------------------------------------------------------------
# Mutations
# ------------------------------------------------------------------------------------------------


def _value_infos(model: onnx.ModelProto) -> list[onnx.ValueInfoProto]:
    g = model.graph
    return list(g.input) + list(g.output) + list(g.value_info)


def _mutate(model: onnx.ModelProto, data: st.DataObject) -> None:
    """Apply one random mutation in place."""
    g = model.graph
    kind = data.draw(
        st.sampled_from(
            ["drop_input", "rename_input", "dim", "attr", "op_type", "domain", "initializer",
             "delete_node", "opset", "node_input", "ir", "add_output", "drop_output", "swap_nodes"]
        )
    )
    nodes = g.node
    if kind == "drop_input" and len(g.input):
        del g.input[data.draw(st.integers(0, len(g.input) - 1))]
    elif kind == "rename_input" and len(g.input):
        g.input[data.draw(st.integers(0, len(g.input) - 1))].name = data.draw(st.sampled_from(["z", "y", "w_qkv", ""]))
    elif kind == "dim":
        vis = [vi for vi in _value_infos(model) if vi.type.tensor_type.shape.dim]
        if vis:
            vi = data.draw(st.sampled_from(vis))
            dims = vi.type.tensor_type.shape.dim
            d = dims[data.draw(st.integers(0, len(dims) - 1))]
            choice = data.draw(st.integers(0, 3))
            if choice == 0:
                d.dim_value = data.draw(INTS)
            elif choice == 1:
                d.dim_param = data.draw(st.sampled_from(DIM_TEXTS))
            elif choice == 2:
                d.Clear()
            else:
                vi.type.tensor_type.ClearField("shape")
    elif kind == "attr" and len(nodes):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        if len(node.attribute) and data.draw(st.booleans()):
            attr = node.attribute[data.draw(st.integers(0, len(node.attribute) - 1))]
            if attr.type == onnx.AttributeProto.INT:
                attr.i = data.draw(INTS)
            elif attr.type == onnx.AttributeProto.INTS:
                attr.ClearField("ints")
                attr.ints.extend(data.draw(st.lists(INTS, max_size=5)))
            elif attr.type == onnx.AttributeProto.FLOAT:
                attr.f = data.draw(st.floats(allow_nan=True, allow_infinity=True, width=32))
            elif attr.type == onnx.AttributeProto.TENSOR:
                attr.t.data_type = data.draw(st.integers(0, 25))
            else:
                attr.type = data.draw(st.integers(0, 14))
        else:
            name = data.draw(st.sampled_from(["axis", "perm", "to", "axes", "start", "end", "value", "num_outputs"]))
            node.attribute.append(helper.make_attribute(name, data.draw(st.one_of(INTS, st.lists(INTS, min_size=1, max_size=4)))))
    elif kind == "op_type" and len(nodes):
        nodes[data.draw(st.integers(0, len(nodes) - 1))].op_type = data.draw(st.sampled_from(OP_TYPES))
    elif kind == "domain" and len(nodes):
        nodes[data.draw(st.integers(0, len(nodes) - 1))].domain = data.draw(
            st.sampled_from(["com.microsoft", "custom", "ai.onnx.ml", "ai.onnx"])
        )
    elif kind == "initializer" and len(g.initializer):
        t = g.initializer[data.draw(st.integers(0, len(g.initializer) - 1))]
        what = data.draw(st.integers(0, 3))
        if what == 0:
            t.ClearField("dims")
            t.dims.extend(data.draw(st.lists(st.integers(-2, 10**6), max_size=4)))
        elif what == 1:
            t.data_type = data.draw(st.integers(0, 25))
        elif what == 2:
            t.raw_data = t.raw_data[: data.draw(st.integers(0, max(len(t.raw_data), 1)))]
        else:
            t.data_location = onnx.TensorProto.EXTERNAL
            entry = t.external_data.add()
            entry.key, entry.value = "location", data.draw(st.sampled_from(["gone.bin", "../../etc/passwd", "/etc/passwd", ""]))
    elif kind == "delete_node" and len(nodes):
        del nodes[data.draw(st.integers(0, len(nodes) - 1))]
    elif kind == "opset":
        model.opset_import[0].version = data.draw(st.integers(-1, 30))
    elif kind == "node_input" and len(nodes):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        names = [o for n in nodes for o in n.output] + [t.name for t in g.initializer] + ["", "nowhere"]
        if len(node.input) and data.draw(st.booleans()):
            node.input[data.draw(st.integers(0, len(node.input) - 1))] = data.draw(st.sampled_from(names))
        else:
            node.input.append(data.draw(st.sampled_from(names)))
    elif kind == "ir":
        model.ir_version = data.draw(st.integers(-1, 20))
    elif kind == "add_output" and len(nodes):
        node = nodes[data.draw(st.integers(0, len(nodes) - 1))]
        node.output.append(data.draw(st.sampled_from(["extra", "x", node.output[0] if node.output else "e2"])))
    elif kind == "drop_output" and len(g.output):
        del g.output[0]
    elif kind == "swap_nodes" and len(nodes) > 1:
        i, j = data.draw(st.integers(0, len(nodes) - 1)), data.draw(st.integers(0, len(nodes) - 1))
        a, b = onnx.NodeProto(), onnx.NodeProto()
        a.CopyFrom(nodes[i])
        b.CopyFrom(nodes[j])
        nodes[i].CopyFrom(b)
        nodes[j].CopyFrom(a)


def _import(path: Path, dims: dict[str, int]) -> None:
    """The full import when it exists, else the two stages this package owns."""
    import_model = getattr(importers, "import_model", None)
    if import_model is not None:
        params = inspect.signature(import_model).parameters
        if "dims" in params:
            import_model(path, dims=dims)
        else:
            import_model(path, dims)
        return
    model, _ = load_onnx(path)
    resolve_shapes(model, dims)


def _check(blob: bytes, dims: dict[str, int]) -> None:
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.onnx"
        path.write_bytes(blob)
        try:
            _import(path, dims)
        except PlannerError as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)


DIMS = st.fixed_dictionaries(
    {"batch": st.integers(1, 4), "seq": st.integers(1, 9)},
    optional={"x[1]": st.integers(1, 5), "unused": st.integers(1, 3)},
)


@pytest.mark.parametrize("seed", range(len(SEEDS)), ids=[f.__name__.strip("_") for f in SEEDS])
def test_seed_models_import(seed: int) -> None:
    """The unmutated seeds import cleanly (so the fuzz below starts from valid models)."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "seed.onnx"
        onnx.save(SEEDS[seed](), str(path))
        model, _ = load_onnx(path)
        shaped = resolve_shapes(model, {"batch": 2, "seq": 4})
        assert all(o in shaped.shapes for n in model.graph.node for o in n.output)
        _import(path, {"batch": 2, "seq": 4})


@FUZZ
@given(seed=st.integers(0, len(SEEDS) - 1), count=st.integers(1, 3), dims=DIMS, data=st.data())
def test_proto_mutations_raise_only_planner_errors(seed: int, count: int, dims: dict[str, int], data: st.DataObject) -> None:
    model = SEEDS[seed]()
    for _ in range(count):
        _mutate(model, data)
    try:
        blob = model.SerializeToString()
    except Exception:  # a mutation the protobuf library itself refuses to encode
        return
    _check(blob, dims)


@FUZZ
@given(seed=st.integers(0, len(SEEDS) - 1), dims=DIMS, data=st.data())
def test_byte_mutations_raise_only_planner_errors(seed: int, dims: dict[str, int], data: st.DataObject) -> None:
    blob = bytearray(SEEDS[seed]().SerializeToString())
    if data.draw(st.booleans()):
        blob = blob[: data.draw(st.integers(0, len(blob)))]
    for _ in range(data.draw(st.integers(0, 4))):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    _check(bytes(blob), dims)
