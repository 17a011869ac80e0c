"""A vector parameter read by the norms of several modules is named in a warning (issue 25).

The TorchScript exporter merges initializers of equal values into one, read through ``Identity``
copies, and a freshly initialised model's norm scales are all ones: a graph-only export of a model
built from a config then holds one scale for all its norms, which reads exactly as a tie. The count
keeps the tie (a real one stays possible); the warning names the parameter, how many modules read it
and how much higher the count is if they are separate weights: ``(modules - 1) x elements``.

Small graphs written with ``onnx.helper`` (counts are products of the shapes named in each test) and
``phi3_init_ts_bare.onnx`` (``make_unseen_cases.py``: a default-init Phi-3 exported by TorchScript,
graph-only; torch's count in ``counts.json``).
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

from importers import import_model

CASES = Path(__file__).resolve().parents[1] / "data" / "unseen_cases"
DIMS = {"batch": 2, "seq": 8}
H = 16
_SHARED = re.compile(r"^(\d+) vector parameter\(s\) are each read as the norm scale.*\((.*)\) and counted once.*"
                     r"the true count is ([\d,]+) higher")


def _shared_warnings(graph) -> list[re.Match]:
    return [match for w in graph.warnings if (match := _SHARED.match(w))]


def _save(tmp_path: Path, nodes, initializers, name: str, *, x_dims=("batch", "seq", H)) -> Path:
    x = helper.make_tensor_value_info("x", T.INT64 if len(x_dims) == 2 else T.FLOAT, list(x_dims))
    y = helper.make_tensor_value_info("y", T.FLOAT, None)
    graph = helper.make_graph(nodes, name, [x], [y], initializer=initializers)
    path = tmp_path / f"{name}.onnx"
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), str(path))
    return path


def _random(name: str, shape: tuple[int, ...], seed: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.random.default_rng(seed).standard_normal(shape).astype(np.float32), name)


def _layer_norms(scale: onnx.TensorProto, layers: int = 2) -> tuple[list, list]:
    """``layers`` pre-LN blocks ``x -> LayerNorm(x, scale_i) @ W_i`` whose scales are ``Identity``
    copies of one initializer (as the TorchScript exporter writes merged equal initializers)."""
    nodes, inits, value = [], [scale], "x"
    for i in range(layers):
        nodes.append(helper.make_node("Identity", [scale.name], [f"layers.{i}.ln.weight"], name=f"Identity_{i}"))
        nodes.append(helper.make_node("LayerNormalization", [value, f"layers.{i}.ln.weight"], [f"n{i}"],
                                      name=f"/layers.{i}/ln/LayerNormalization", axis=-1))
        out = "y" if i == layers - 1 else f"h{i}"
        nodes.append(helper.make_node("MatMul", [f"n{i}", f"layers.{i}.fc.weight"], [out], name=f"/layers.{i}/fc/MatMul"))
        inits.append(_random(f"layers.{i}.fc.weight", (H, H), i + 1))
        value = out
    return nodes, inits


def test_layer_norms_reading_one_ones_initializer_warn_with_the_missing_elements(tmp_path):
    ones = numpy_helper.from_array(np.ones(H, np.float32), "layers.0.ln.scale")
    nodes, inits = _layer_norms(ones, layers=3)
    graph = import_model(_save(tmp_path, nodes, inits, "ln3"), DIMS)
    assert graph.parameter_count == H + 3 * H * H  # the tie is kept: one scale, three matrices
    (match,) = _shared_warnings(graph)
    assert match[1] == "1" and match[2] == f"'layers.0.ln.scale' [{H}] by 3 modules"
    assert match[3] == f"{2 * H:,}"  # two more scales of H elements if they are separate


def test_rms_norm_scales_and_biases_without_values_warn_once_with_the_total(tmp_path):
    """Decomposed RMSNorms (Mul by the scale, then Add a bias) in two modules, graph-only: every
    merged vector is listed in one warning, the total is (2 - 1) x H for each of the two."""
    nodes, value = [], "x"
    for i in range(2):
        nodes += [
            helper.make_node("Identity", ["norm.weight"], [f"layers.{i}.norm.weight"], name=f"Identity_w{i}"),
            helper.make_node("Identity", ["norm.bias"], [f"layers.{i}.norm.bias"], name=f"Identity_b{i}"),
            helper.make_node("Mul", [value, value], [f"sq{i}"], name=f"/layers.{i}/norm/Pow"),
            helper.make_node("ReduceMean", [f"sq{i}", "axes"], [f"ms{i}"], name=f"/layers.{i}/norm/ReduceMean"),
            helper.make_node("Sqrt", [f"ms{i}"], [f"rms{i}"], name=f"/layers.{i}/norm/Sqrt"),
            helper.make_node("Div", [value, f"rms{i}"], [f"d{i}"], name=f"/layers.{i}/norm/Div"),
            helper.make_node("Mul", [f"d{i}", f"layers.{i}.norm.weight"], [f"s{i}"], name=f"/layers.{i}/norm/Mul_1"),
            helper.make_node("Add", [f"s{i}", f"layers.{i}.norm.bias"], [f"b{i}"], name=f"/layers.{i}/norm/Add_1"),
            helper.make_node("MatMul", [f"b{i}", f"fc{i}.weight"], ["y" if i else "h0"], name=f"/layers.{i}/fc/MatMul"),
        ]
        value = "h0"
    inits = [numpy_helper.from_array(np.ones(H, np.float32), "norm.weight"),
             numpy_helper.from_array(np.zeros(H, np.float32), "norm.bias"),
             _random("fc0.weight", (H, H), 1), _random("fc1.weight", (H, H), 2),
             numpy_helper.from_array(np.array([-1], np.int64), "axes")]
    model = onnx.load(str(_save(tmp_path, nodes, inits, "rms")))
    for tensor in model.graph.initializer:  # graph-only: the vectors' values are not in the file
        if tensor.name.startswith("norm."):
            tensor.ClearField("raw_data")
    onnx.save(model, str(tmp_path / "rms.onnx"))
    graph = import_model(tmp_path / "rms.onnx", DIMS)
    assert graph.parameter_count == 2 * H + 2 * H * H
    (match,) = _shared_warnings(graph)
    assert match[1] == "2" and match[2] == f"'norm.bias' [{H}] by 2 modules, 'norm.weight' [{H}] by 2 modules"
    assert match[3] == f"{2 * H:,}"


def test_a_shared_scale_with_differing_values_is_a_real_tie_and_not_named(tmp_path):
    """No exporter merges tensors that differ: random values read by both norms are a tie."""
    nodes, inits = _layer_norms(_random("layers.0.ln.scale", (H,), 9))
    graph = import_model(_save(tmp_path, nodes, inits, "tie"), DIMS)
    assert graph.parameter_count == H + 2 * H * H and not _shared_warnings(graph)


def test_layers_that_share_their_matrices_too_are_not_named(tmp_path):
    """ALBERT shares a whole layer across depth: its norm is read by every repeat, as the matrix is."""
    nodes, inits = _layer_norms(numpy_helper.from_array(np.ones(H, np.float32), "ln.scale"))
    for node in nodes:
        if node.op_type == "MatMul":
            node.input[1] = "shared.fc.weight"
    inits = [inits[0], _random("shared.fc.weight", (H, H), 1)]
    graph = import_model(_save(tmp_path, nodes, inits, "albert"), DIMS)
    assert graph.parameter_count == H + H * H and not _shared_warnings(graph)


def test_an_embedding_tied_to_the_lm_head_is_not_named(tmp_path):
    """GPT-2's head reads the embedding table (transposed): a matrix tie, the legitimate one."""
    V = 32
    nodes = [
        helper.make_node("Gather", ["wte.weight", "x"], ["e"], name="/wte/Gather"),
        helper.make_node("LayerNormalization", ["e", "ln_f.weight", "ln_f.bias"], ["n"], name="/ln_f/LayerNorm", axis=-1),
        helper.make_node("Transpose", ["wte.weight"], ["wte_t"], name="/lm_head/Transpose", perm=[1, 0]),
        helper.make_node("MatMul", ["n", "wte_t"], ["y"], name="/lm_head/MatMul"),
    ]
    inits = [_random("wte.weight", (V, H), 0), numpy_helper.from_array(np.ones(H, np.float32), "ln_f.weight"),
             numpy_helper.from_array(np.zeros(H, np.float32), "ln_f.bias")]
    graph = import_model(_save(tmp_path, nodes, inits, "gpt", x_dims=("batch", "seq")), DIMS)
    assert graph.parameter_count == V * H + 2 * H and not _shared_warnings(graph)


def test_a_default_init_phi3_export_names_its_merged_rms_norm_scales():
    """Phi-3 (hidden 64, 2 layers): five all-ones RMSNorm scales (two per layer, one final) are one
    initializer in the file: counted once, 4 x 64 short of torch's count, which the warning names."""
    counts = json.loads((CASES / "counts.json").read_text())["files"]
    torch_count = counts["phi3_init_ts_bare.onnx"]["param_count"]
    graph = import_model(CASES / "phi3_init_ts_bare.onnx", {"batch": 2, "seq": 16})
    (match,) = _shared_warnings(graph)
    assert match[1] == "1" and match[2].endswith("[64] by 5 modules") and match[3] == f"{4 * 64:,}"
    assert graph.parameter_count == torch_count - 4 * 64
    # the randomised export of the same model is exact and says nothing
    exact = import_model(CASES / "phi3_ts_bare.onnx", {"batch": 2, "seq": 16})
    assert exact.parameter_count == torch_count and not _shared_warnings(exact)
