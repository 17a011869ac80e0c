"""Hostile protobufs (issue 16): mutated bytes of real model files, and random models built with
onnx.helper, either import or fail with one line (a PlannerError); never a traceback, a hang or a
crash of the process.

Seeds are real files: a stripped TorchScript GPT-2 and LSTM LM from tests/data (opset 17), and the
model zoo's AlexNet shipped in the onnx wheel (IR 3, opset 9, so every mutation also runs onnx's
version converter and the stand-in-weight pass). Random models are chains of ops drawn from a
list with random shapes, attributes and opsets (7-21). Bounded examples, no deadline: fast in CI;
``PLANNER_FUZZ_EXAMPLES=2000 PLANNER_FUZZ_RANDOM=1`` runs a deeper, randomly seeded campaign.
"""

from __future__ import annotations

import os
import tempfile
from functools import lru_cache
from pathlib import Path

import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

from importers import import_model
from planner.core.errors import PlannerError

ROOT = Path(__file__).resolve().parents[2]
ZOO = Path(onnx.__file__).parent / "backend" / "test" / "data" / "light"
SEED_FILES = [ROOT / "tests" / "data" / "gpt2_ts.onnx", ROOT / "tests" / "data" / "lstm_lm.onnx", ZOO / "light_bvlc_alexnet.onnx"]

FUZZ = settings(
    max_examples=int(os.environ.get("PLANNER_FUZZ_EXAMPLES", "60")),
    derandomize=os.environ.get("PLANNER_FUZZ_RANDOM") != "1",
    deadline=None,
    database=None,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large],
)
DIMS = {"batch": 2, "seq": 8}


@lru_cache(maxsize=None)
def _seed_bytes(index: int) -> bytes:
    return SEED_FILES[index].read_bytes()


def _outcome(blob: bytes, dims: dict[str, int]) -> str:
    """``"ok"`` or ``"refused"``; anything but a one-line PlannerError fails the test."""
    with tempfile.TemporaryDirectory() as folder:
        path = Path(folder) / "fuzz.onnx"
        path.write_bytes(blob)
        try:
            import_model(path, dims)
        except PlannerError as exc:
            message = str(exc)
            assert message and "\n" not in message, repr(message)
            return "refused"
    return "ok"


@pytest.mark.parametrize("index", range(len(SEED_FILES)), ids=lambda i: SEED_FILES[i].name)
def test_seed_files_import(index):
    if not SEED_FILES[index].is_file():
        pytest.skip(f"{SEED_FILES[index]} is absent")
    assert _outcome(_seed_bytes(index), DIMS) == "ok"


@FUZZ
@given(index=st.integers(0, len(SEED_FILES) - 1), data=st.data())
def test_mutated_bytes_of_real_files(index, data):
    if not SEED_FILES[index].is_file():
        return
    blob = bytearray(_seed_bytes(index))
    if data.draw(st.booleans(), label="truncate"):
        blob = blob[: data.draw(st.integers(0, len(blob)), label="length")]
    for _ in range(data.draw(st.integers(1, 8), label="flips")):
        if blob:
            blob[data.draw(st.integers(0, len(blob) - 1))] = data.draw(st.integers(0, 255))
    if data.draw(st.booleans(), label="splice"):
        start = data.draw(st.integers(0, len(blob)))
        blob[start:start] = data.draw(st.binary(max_size=64))
    _outcome(bytes(blob), DIMS)


# Ops with their input count and attribute choices: unary, binary, products, shape ops, norms.
_OPS: dict[str, tuple[int, dict[str, st.SearchStrategy]]] = {
    "Relu": (1, {}),
    "Sigmoid": (1, {}),
    "Identity": (1, {}),
    "Softmax": (1, {"axis": st.integers(-3, 2)}),
    "Add": (2, {}),
    "Mul": (2, {}),
    "MatMul": (2, {}),
    "Gemm": (2, {"transA": st.integers(0, 1), "transB": st.integers(0, 1)}),
    "Transpose": (1, {"perm": st.permutations([0, 1])}),
    "Flatten": (1, {"axis": st.integers(-2, 2)}),
    "Concat": (2, {"axis": st.integers(-2, 1)}),
    "ReduceMean": (1, {"keepdims": st.integers(0, 1), "axes": st.lists(st.integers(-2, 1), min_size=1, max_size=2)}),
    "LayerNormalization": (1, {"axis": st.integers(-2, 1)}),
    "Conv": (2, {"group": st.integers(1, 2)}),
    "Squeeze": (1, {"axes": st.lists(st.integers(-2, 1), min_size=1, max_size=1)}),
    "Unsqueeze": (1, {"axes": st.lists(st.integers(-2, 2), min_size=1, max_size=1)}),
    "Dropout": (1, {"ratio": st.floats(0, 1)}),
    "Split": (1, {"axis": st.integers(-2, 1)}),
}
_DIM = st.one_of(st.integers(0, 6), st.sampled_from(["batch", "seq", "n", "batch*seq", "seq+1", ""]))


@st.composite
def random_models(draw) -> onnx.ModelProto:
    """A chain of 1-8 ops on random values, weights and shapes; opset 7-21; IR 3-10."""
    rank = draw(st.integers(1, 4))
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, [draw(_DIM) for _ in range(rank)])
    nodes, weights, values = [], [], ["x"]
    for i in range(draw(st.integers(1, 8))):
        op_type = draw(st.sampled_from(sorted(_OPS)))
        arity, attrs = _OPS[op_type]
        inputs = [draw(st.sampled_from(values))]
        if arity == 2:
            if draw(st.booleans()):
                shape = draw(st.lists(st.integers(0, 6), min_size=1, max_size=4))
                name = draw(st.sampled_from([f"layer{i}.weight", f"onnx::MatMul_{i}", f"val_{i}"]))
                weights.append(helper.make_tensor(name, TensorProto.FLOAT, shape, [0.5] * _numel(shape)))
                inputs.append(name)
            else:
                inputs.append(draw(st.sampled_from(values)))
        chosen = {key: draw(value) for key, value in attrs.items() if draw(st.booleans())}
        out = f"v{i}"
        nodes.append(helper.make_node(op_type, inputs, [out], name=f"n{i}", **chosen))
        values.append(out)
    y = helper.make_tensor_value_info(values[-1], TensorProto.FLOAT, None)
    graph = helper.make_graph(nodes, "fuzz", [x], [y], weights)
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", draw(st.integers(7, 21)))])
    model.ir_version = draw(st.integers(3, 10))
    return model


def _numel(shape: list[int]) -> int:
    total = 1
    for d in shape:
        total *= d
    return total


@FUZZ
@given(model=random_models(), batch=st.integers(1, 4), seq=st.integers(1, 9))
def test_random_models_built_with_helper(model, batch, seq):
    try:
        blob = model.SerializeToString()
    except Exception:  # a model the protobuf library itself refuses to encode
        return
    _outcome(blob, {"batch": batch, "seq": seq, "n": 3})
