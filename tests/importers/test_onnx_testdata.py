"""Every model the onnx wheel ships as test data imports (issue 15): old opsets converted, stand-in
weights counted, a fixed batch of 1 rebindable, and no file crashes or hangs the importer.

The wheel's ``backend/test/data`` holds 149 files: the model-zoo CNNs in ``light/`` (IR 3, opset 9,
every weight made by ``ConstantOfShape`` so the files ship without data, initializers listed as graph
inputs, a fixed batch of 1), 117 single-module PyTorch exports (``pytorch-converted/``,
``pytorch-operator/``, opset 6-12) and 23 ``simple/`` models (opset 9-12); 124 of the 149 are IR 3,
none is opset 13 or newer. ``real/`` holds only download links.

Oracles, independent of the importer:

* AlexNet (BVLC, grouped conv2/4/5), ResNet-50, VGG-19 and SqueezeNet 1.1 parameter counts from their
  architecture definitions (layer shapes as published), by formula;
* for every file, a count made directly on the ONNX graph (``_onnx_weight_count``): the float tensors
  (initializers or ConstantOfShape outputs) read at a weight position of Conv/Gemm/MatMul/norm/RNN
  nodes, or as a per-channel operand of Mul/Add with an activation;
* FLOPs at ``--dim batch=8`` are exactly 8 times those at the file's batch of 1 (every op is per sample).

``EXPECTED`` records each file's outcome at the file's own dims (the parameter count, or the one-line
error class); a file that regresses, crashes or runs past ``TIMEOUT_S`` fails its own case.
"""

from __future__ import annotations

import math
import signal
from pathlib import Path

import onnx
import pytest
from onnx import numpy_helper

from importers import import_model
from planner.core.errors import PlannerError

DATA = Path(onnx.__file__).parent / "backend" / "test" / "data"
TIMEOUT_S = 60
"""Per-file limit (the slowest file, DenseNet-121, imports in about 1 s)."""

pytestmark = pytest.mark.skipif(not (DATA / "light").is_dir(), reason="the onnx wheel ships no test data")


# ------------------------------------------------------------------------------------------------
# Architecture formulas (published layer shapes)
# ------------------------------------------------------------------------------------------------


def _conv(c_in: int, c_out: int, k: int, *, groups: int = 1, bias: bool = True) -> int:
    return c_out * (c_in // groups) * k * k + (c_out if bias else 0)


def _linear(n_in: int, n_out: int) -> int:
    return n_in * n_out + n_out


def alexnet_bvlc() -> int:
    """Caffe's BVLC AlexNet: conv2, conv4 and conv5 in two groups."""
    convs = _conv(3, 96, 11) + _conv(96, 256, 5, groups=2) + _conv(256, 384, 3)
    convs += _conv(384, 384, 3, groups=2) + _conv(384, 256, 3, groups=2)
    return convs + _linear(256 * 6 * 6, 4096) + _linear(4096, 4096) + _linear(4096, 1000)


def resnet50() -> int:
    """ResNet-50 (bottlenecks [3, 4, 6, 3], expansion 4); BatchNorm scale and shift are learnable."""
    total = _conv(3, 64, 7, bias=False) + 2 * 64
    c_in = 64
    for width, blocks in ((64, 3), (128, 4), (256, 6), (512, 3)):
        for block in range(blocks):
            total += _conv(c_in, width, 1, bias=False) + 2 * width
            total += _conv(width, width, 3, bias=False) + 2 * width
            total += _conv(width, 4 * width, 1, bias=False) + 2 * 4 * width
            if block == 0:
                total += _conv(c_in, 4 * width, 1, bias=False) + 2 * 4 * width  # downsample
            c_in = 4 * width
    return total + _linear(2048, 1000)


def vgg19() -> int:
    """VGG-19 (configuration E), no BatchNorm."""
    total, c_in = 0, 3
    for c_out in (64, 64, 128, 128, 256, 256, 256, 256, 512, 512, 512, 512, 512, 512, 512, 512):
        total += _conv(c_in, c_out, 3)
        c_in = c_out
    return total + _linear(512 * 7 * 7, 4096) + _linear(4096, 4096) + _linear(4096, 1000)


def squeezenet_1_1() -> int:
    """SqueezeNet 1.1: fire modules (squeeze, expand 1x1 + expand 3x3), a 1x1 conv classifier."""
    total = _conv(3, 64, 3)
    fires = [(64, 16, 64), (128, 16, 64), (128, 32, 128), (256, 32, 128), (256, 48, 192), (384, 48, 192), (384, 64, 256), (512, 64, 256)]
    for c_in, squeeze, expand in fires:
        total += _conv(c_in, squeeze, 1) + _conv(squeeze, expand, 1) + _conv(squeeze, expand, 3)
    return total + _conv(512, 1000, 1)


def test_formulas_match_published_counts():
    # torchvision's documented counts for the same architectures (alexnet differs: BVLC groups).
    assert (resnet50(), vgg19(), squeezenet_1_1()) == (25_557_032, 143_667_240, 1_235_496)
    assert alexnet_bvlc() == 60_965_224


@pytest.mark.parametrize(
    "name, expected",
    [
        ("light_bvlc_alexnet", alexnet_bvlc()),
        ("light_resnet50", resnet50()),
        ("light_vgg19", vgg19()),
        ("light_squeezenet", squeezenet_1_1()),
    ],
)
def test_zoo_cnn_exact_parameter_count(name, expected):
    graph = import_model(DATA / "light" / f"{name}.onnx")
    assert graph.parameter_count == expected
    notes = "\n".join(graph.warnings)
    assert "uses opset 9: converted to opset 13 with onnx.version_converter" in notes
    assert "weights made by ConstantOfShape" in notes
    assert "initializers listed as graph inputs (IR 3) are taken as parameters" in notes
    assert "pass --dim batch=N to plan another batch (default: the file's 1)" in notes


@pytest.mark.parametrize("path", sorted((DATA / "light").glob("*.onnx")), ids=lambda p: p.stem)
def test_fixed_batch_of_one_rebinds(path):
    one, eight = import_model(path), import_model(path, {"batch": 8})
    assert one.parameter_count == eight.parameter_count
    assert eight.forward_flops() == 8 * one.forward_flops()
    assert one.forward_flops() == import_model(path, {"batch": 1}).forward_flops()


# ------------------------------------------------------------------------------------------------
# Every file: the graph-level oracle and the recorded outcome
# ------------------------------------------------------------------------------------------------

_WEIGHT_POSITIONS = {
    "Conv": (1, 2), "ConvTranspose": (1, 2), "Gemm": (1, 2), "MatMul": (1,), "BatchNormalization": (1, 2),
    "InstanceNormalization": (1, 2), "PRelu": (1,), "LSTM": (1, 2, 3), "GRU": (1, 2, 3), "RNN": (1, 2, 3),
    "Gather": (0,),
}
_LAYOUT = {"Unsqueeze", "Reshape", "Transpose", "Identity", "Squeeze", "Flatten", "Cast"}

# Where the oracle's narrow rule differs from the truth, and why.
_ORACLE_EXCEPTIONS = {
    # y = (x + p) * x with p a [2, 2] nn.Parameter: a parameter, though not a per-channel vector.
    "pytorch-operator/test_operator_params": 4,
    # Caffe's BatchNorm (affine fixed at 1/0) + Scale (learnable, via Unsqueeze -> Mul/Add): the file
    # fills both with ConstantOfShape; the importer counts the BatchNorm's pair once per layer (the
    # number torchvision counts, 7,978,856, plus the first layer's two initializer pairs: +256),
    # the oracle counts both pairs.
    "light/light_densenet121.onnx": 7_979_112,
    "light/light_inception_v2.onnx": 11_196_584,
}


def _onnx_weight_count(path: Path) -> int:
    """Parameters counted directly on the ONNX graph (see the module docstring)."""
    graph = onnx.load(path, load_external_data=False).graph
    inits = {t.name: t for t in graph.initializer}
    shapes = {name: [int(d) for d in t.dims] for name, t in inits.items() if t.data_type in (1, 10, 11, 16)}
    for node in graph.node:
        if node.op_type == "ConstantOfShape" and node.input and node.input[0] in inits:
            shapes[node.output[0]] = [int(v) for v in numpy_helper.to_array(inits[node.input[0]]).reshape(-1)]
    root: dict[str, str] = {}
    for node in graph.node:
        if node.op_type in _LAYOUT and node.input and (node.input[0] in shapes or node.input[0] in root):
            root[node.output[0]] = root.get(node.input[0], node.input[0])
    runtime = {i.name for i in graph.input if i.name not in shapes}
    for node in graph.node:
        if any(i in runtime for i in node.input):
            runtime.update(node.output)
    counted: set[str] = set()
    for node in graph.node:
        for position, name in enumerate(node.input):
            weight = root.get(name, name)
            if weight not in shapes:
                continue
            with_activation = any(i in runtime for q, i in enumerate(node.input) if q != position)
            if position in _WEIGHT_POSITIONS.get(node.op_type, ()) and with_activation:
                counted.add(weight)
            elif node.op_type in ("Mul", "Add") and with_activation and sum(d > 1 for d in shapes[weight]) == 1:
                counted.add(weight)
    return sum(math.prod(shapes[w]) for w in counted)


EXPECTED: dict[str, int | str] = {
    "light/light_bvlc_alexnet.onnx": 60965224,
    "light/light_densenet121.onnx": 7979112,
    "light/light_inception_v1.onnx": 6998552,
    "light/light_inception_v2.onnx": 11196584,
    "light/light_resnet50.onnx": 25557032,
    "light/light_shufflenet.onnx": 1393320,
    "light/light_squeezenet.onnx": 1235496,
    "light/light_vgg19.onnx": 143667240,
    "light/light_zfnet512.onnx": 87250536,
    "pytorch-converted/test_AvgPool1d": 0,
    "pytorch-converted/test_AvgPool1d_stride": 0,
    "pytorch-converted/test_AvgPool2d": 0,
    "pytorch-converted/test_AvgPool2d_stride": 0,
    "pytorch-converted/test_AvgPool3d": 0,
    "pytorch-converted/test_AvgPool3d_stride": 0,
    "pytorch-converted/test_AvgPool3d_stride1_pad0_gpu_input": 0,
    "pytorch-converted/test_BatchNorm1d_3d_input_eval": 10,
    "pytorch-converted/test_BatchNorm2d_eval": 6,
    "pytorch-converted/test_BatchNorm2d_momentum_eval": 6,
    "pytorch-converted/test_BatchNorm3d_eval": 6,
    "pytorch-converted/test_BatchNorm3d_momentum_eval": 6,
    "pytorch-converted/test_ConstantPad2d": 0,
    "pytorch-converted/test_Conv1d": 65,
    "pytorch-converted/test_Conv1d_dilated": 65,
    "pytorch-converted/test_Conv1d_groups": 42,
    "pytorch-converted/test_Conv1d_pad1": 65,
    "pytorch-converted/test_Conv1d_pad1size1": 52,
    "pytorch-converted/test_Conv1d_pad2": 105,
    "pytorch-converted/test_Conv1d_pad2size1": 84,
    "pytorch-converted/test_Conv1d_stride": 65,
    "pytorch-converted/test_Conv2d": 76,
    "pytorch-converted/test_Conv2d_depthwise": 40,
    "pytorch-converted/test_Conv2d_depthwise_padded": 40,
    "pytorch-converted/test_Conv2d_depthwise_strided": 40,
    "pytorch-converted/test_Conv2d_depthwise_with_multiplier": 80,
    "pytorch-converted/test_Conv2d_dilated": 56,
    "pytorch-converted/test_Conv2d_groups": 78,
    "pytorch-converted/test_Conv2d_groups_thnn": 78,
    "pytorch-converted/test_Conv2d_no_bias": 72,
    "pytorch-converted/test_Conv2d_padding": 112,
    "pytorch-converted/test_Conv2d_strided": 112,
    "pytorch-converted/test_Conv3d": 292,
    "pytorch-converted/test_Conv3d_dilated": 100,
    "pytorch-converted/test_Conv3d_dilated_strided": 100,
    "pytorch-converted/test_Conv3d_groups": 330,
    "pytorch-converted/test_Conv3d_no_bias": 288,
    "pytorch-converted/test_Conv3d_stride": 100,
    "pytorch-converted/test_Conv3d_stride_padding": 100,
    "pytorch-converted/test_ConvTranspose2d": 112,
    "pytorch-converted/test_ConvTranspose2d_no_bias": 108,
    "pytorch-converted/test_ELU": 0,
    "pytorch-converted/test_Embedding": 12,
    "pytorch-converted/test_Embedding_sparse": 12,
    "pytorch-converted/test_GLU": 0,
    "pytorch-converted/test_GLU_dim": 0,
    "pytorch-converted/test_LeakyReLU": 0,
    "pytorch-converted/test_LeakyReLU_with_negval": 0,
    "pytorch-converted/test_Linear": 88,
    "pytorch-converted/test_Linear_no_bias": 80,
    "pytorch-converted/test_LogSoftmax": 0,
    "pytorch-converted/test_MaxPool1d": 0,
    "pytorch-converted/test_MaxPool1d_stride": 0,
    "pytorch-converted/test_MaxPool1d_stride_padding_dilation": 0,
    "pytorch-converted/test_MaxPool2d": 0,
    "pytorch-converted/test_MaxPool2d_stride_padding_dilation": 0,
    "pytorch-converted/test_MaxPool3d": 0,
    "pytorch-converted/test_MaxPool3d_stride": 0,
    "pytorch-converted/test_MaxPool3d_stride_padding": 0,
    "pytorch-converted/test_PReLU_1d": 1,
    "pytorch-converted/test_PReLU_1d_multiparam": 3,
    "pytorch-converted/test_PReLU_2d": 1,
    "pytorch-converted/test_PReLU_2d_multiparam": 3,
    "pytorch-converted/test_PReLU_3d": 1,
    "pytorch-converted/test_PReLU_3d_multiparam": 3,
    "pytorch-converted/test_PixelShuffle": 0,
    "pytorch-converted/test_PoissonNLLLLoss_no_reduce": 0,
    "pytorch-converted/test_ReLU": 0,
    "pytorch-converted/test_ReflectionPad2d": 0,
    "pytorch-converted/test_ReplicationPad2d": 0,
    "pytorch-converted/test_SELU": 0,
    "pytorch-converted/test_Sigmoid": 0,
    "pytorch-converted/test_Softmax": 0,
    "pytorch-converted/test_Softmin": 0,
    "pytorch-converted/test_Softplus": 0,
    "pytorch-converted/test_Softsign": 0,
    "pytorch-converted/test_Tanh": 0,
    "pytorch-converted/test_ZeroPad2d": 0,
    "pytorch-converted/test_log_softmax_dim3": 0,
    "pytorch-converted/test_log_softmax_lastdim": 0,
    "pytorch-converted/test_softmax_functional_dim3": 0,
    "pytorch-converted/test_softmax_lastdim": 0,
    "pytorch-operator/test_operator_add_broadcast": 0,
    "pytorch-operator/test_operator_add_size1_broadcast": 0,
    "pytorch-operator/test_operator_add_size1_right_broadcast": 0,
    "pytorch-operator/test_operator_add_size1_singleton_broadcast": 0,
    "pytorch-operator/test_operator_addconstant": 0,
    "pytorch-operator/test_operator_addmm": 0,
    "pytorch-operator/test_operator_basic": 0,
    "pytorch-operator/test_operator_chunk": 0,
    "pytorch-operator/test_operator_clip": 0,
    "pytorch-operator/test_operator_concat2": 0,
    "pytorch-operator/test_operator_conv": 1872,
    "pytorch-operator/test_operator_convtranspose": 81,
    "pytorch-operator/test_operator_exp": 0,
    "pytorch-operator/test_operator_flatten": 0,
    "pytorch-operator/test_operator_index": 0,
    "pytorch-operator/test_operator_max": 0,
    "pytorch-operator/test_operator_maxpool": 0,
    "pytorch-operator/test_operator_min": 0,
    "pytorch-operator/test_operator_mm": 0,
    "pytorch-operator/test_operator_non_float_params": 0,
    "pytorch-operator/test_operator_pad": 0,
    "pytorch-operator/test_operator_params": 4,
    "pytorch-operator/test_operator_permute2": 0,
    "pytorch-operator/test_operator_pow": 0,
    "pytorch-operator/test_operator_reduced_mean": 0,
    "pytorch-operator/test_operator_reduced_mean_keepdim": 0,
    "pytorch-operator/test_operator_reduced_sum": 0,
    "pytorch-operator/test_operator_reduced_sum_keepdim": 0,
    "pytorch-operator/test_operator_repeat": 0,
    "pytorch-operator/test_operator_repeat_dim_overflow": 0,
    "pytorch-operator/test_operator_selu": 0,
    "pytorch-operator/test_operator_sqrt": 0,
    "pytorch-operator/test_operator_symbolic_override": 20,
    "pytorch-operator/test_operator_symbolic_override_nested": 0,
    "pytorch-operator/test_operator_view": 0,
    "simple/test_expand_shape_model1": 0,
    "simple/test_expand_shape_model2": 0,
    "simple/test_expand_shape_model3": 0,
    "simple/test_expand_shape_model4": 0,
    "simple/test_gradient_of_add": 0,
    "simple/test_gradient_of_add_and_mul": 0,
    "simple/test_sequence_model1": 0,
    "simple/test_sequence_model2": 0,
    "simple/test_sequence_model3": 0,
    "simple/test_sequence_model4": 0,
    "simple/test_sequence_model5": 0,
    "simple/test_sequence_model6": 0,
    "simple/test_sequence_model7": 0,
    "simple/test_sequence_model8": 'UnboundDimError',
    "simple/test_shrink": 0,
    "simple/test_sign_model": 0,
    "simple/test_single_relu_model": 0,
    "simple/test_strnorm_model_monday_casesensintive_lower": 0,
    "simple/test_strnorm_model_monday_casesensintive_nochangecase": 0,
    "simple/test_strnorm_model_monday_casesensintive_upper": 0,
    "simple/test_strnorm_model_monday_empty_output": 0,
    "simple/test_strnorm_model_monday_insensintive_upper_twodim": 0,
    "simple/test_strnorm_model_nostopwords_nochangecase": 0,
}
"""Outcome of ``import_model(file)`` at the file's own dims: parameter count, or error class name."""


def _key(path: Path) -> str:
    return str(path.relative_to(DATA)).replace("/model.onnx", "")


ALL_FILES = sorted(DATA.glob("**/*.onnx"))


def test_every_file_is_in_the_table():
    assert sorted(_key(p) for p in ALL_FILES) == sorted(EXPECTED)
    assert len(ALL_FILES) == 149


class _Timeout(Exception):
    pass


def _import_with_timeout(path: Path):
    def expire(signum, frame):
        raise _Timeout(f"{_key(path)} took more than {TIMEOUT_S} s")

    previous = signal.signal(signal.SIGALRM, expire)
    signal.alarm(TIMEOUT_S)
    try:
        return import_model(path)
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


@pytest.mark.parametrize("path", ALL_FILES, ids=_key)
def test_file_imports_or_fails_in_one_line(path):
    expected = EXPECTED[_key(path)]
    try:
        graph = _import_with_timeout(path)
    except PlannerError as exc:
        assert type(exc).__name__ == expected
        assert "\n" not in str(exc)
        return
    assert graph.parameter_count == expected
    oracle = _ORACLE_EXCEPTIONS.get(_key(path), _onnx_weight_count(path))
    assert graph.parameter_count == oracle
