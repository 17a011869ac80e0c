"""BatchNormalization layers an exporter folded into convolutions, put back as the ops training runs.

An inference export folds each ``BatchNormalization`` that follows a bias-free Conv, ConvTranspose
or Gemm into that op (onnxscript's optimizer, the dynamo exporter's default, names the new bias
``<weight>_bias``; the Conv's weight absorbs the scale). The file then describes the inference
graph, but the model being planned is trained, and training runs the BatchNorm: per channel it
computes batch statistics, normalises and scales, and in backward reduces over the batch twice.
On an H100, ResNet-50's BatchNorms are about a third of a PyTorch step (measured:
``../shared/calibration/``); priced without them a ResNet-50 step came out 31-47% too fast.

:func:`restore_folded_batchnorms` rewrites the loaded model before shapes are resolved: the folded
op writes a new value, and a ``BatchNormalization`` (scale ``<bias>.bn_scale``, shift the folded
bias, running statistics ``<bias>.bn_mean``/``<bias>.bn_var``, which are buffers, not parameters)
produces the op's original output. Parameter counts are the trained model's (the Conv's weight,
the BatchNorm's scale and shift: the bias the exporter made is the shift), and the op graph is the
one an export without the optimizer (``optimize=False``) gives.

The rule is the name the optimizer writes: a bias called ``<weight>_bias`` read by the op that reads
``<weight>``. A bias the model really has is named after its module (``conv.bias``), and a
TorchScript export, which folds BatchNorms into anonymous ``onnx::Conv_N`` constants, cannot be
told from a convolution with a bias, so it is left alone.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import helper

__all__ = ["FOLDING_OPS", "restore_folded_batchnorms"]

FOLDING_OPS = frozenset({"Conv", "ConvTranspose", "Gemm"})
"""Op types the optimizer folds a following BatchNormalization into (their input 2 is the bias)."""

_SUFFIX = "_bias"


def _filled(like: onnx.TensorProto, name: str, value: float) -> onnx.TensorProto:
    """A tensor of ``like``'s type and shape filled with ``value`` (a running statistic or scale)."""
    try:
        dtype = helper.tensor_dtype_to_np_dtype(like.data_type)
    except (KeyError, ValueError, TypeError):
        dtype = np.dtype(np.float32)
    if dtype.kind != "f":
        dtype = np.dtype(np.float32)
    return onnx.numpy_helper.from_array(np.full(tuple(like.dims), value, dtype=dtype), name)


def restore_folded_batchnorms(model: onnx.ModelProto) -> int:
    """Put back every BatchNormalization the exporter folded into a Conv/ConvTranspose/Gemm.

    Changes ``model`` in place (module docstring) and returns how many were restored.

    Examples
    --------
    >>> import numpy as np
    >>> from onnx import TensorProto as T, numpy_helper
    >>> w = numpy_helper.from_array(np.ones((8, 3, 3, 3), np.float32), "conv.weight")
    >>> b = numpy_helper.from_array(np.zeros(8, np.float32), "conv.weight_bias")
    >>> node = helper.make_node("Conv", ["x", "conv.weight", "conv.weight_bias"], ["y"], pads=[1] * 4)
    >>> graph = helper.make_graph([node], "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 3, 8, 8])],
    ...                           [helper.make_tensor_value_info("y", T.FLOAT, [2, 8, 8, 8])], [w, b])
    >>> model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])
    >>> restore_folded_batchnorms(model)
    1
    >>> [(n.op_type, list(n.input), list(n.output)) for n in model.graph.node]  # doctest: +NORMALIZE_WHITESPACE
    [('Conv', ['x', 'conv.weight'], ['y.pre_bn']),
     ('BatchNormalization', ['y.pre_bn', 'conv.weight_bias.bn_scale', 'conv.weight_bias',
                             'conv.weight_bias.bn_mean', 'conv.weight_bias.bn_var'], ['y'])]
    """
    graph = model.graph
    initializers = {t.name: t for t in graph.initializer}
    taken = {t.name for t in graph.initializer} | {o for n in graph.node for o in n.output} | {
        i.name for i in graph.input
    }
    readers: dict[str, int] = {}
    for node in graph.node:
        for name in node.input:
            readers[name] = readers.get(name, 0) + 1
    nodes: list[onnx.NodeProto] = []
    restored = 0
    for node in graph.node:
        nodes.append(node)
        if node.op_type not in FOLDING_OPS or len(node.input) < 3 or len(node.output) != 1:
            continue
        weight, bias = node.input[1], node.input[2]
        folded_bias = initializers.get(bias)
        if (
            bias != weight + _SUFFIX
            or weight not in initializers
            or folded_bias is None
            or len(folded_bias.dims) != 1
            or readers.get(bias, 0) != 1
        ):
            continue
        names = {part: f"{bias}.bn_{part}" for part in ("scale", "mean", "var")}
        pre_norm = f"{node.output[0]}.pre_bn"
        if taken & (set(names.values()) | {pre_norm}):
            continue  # a name the file already uses: leave this op as it is
        graph.initializer.extend([
            _filled(folded_bias, names["scale"], 1.0),
            _filled(folded_bias, names["mean"], 0.0),
            _filled(folded_bias, names["var"], 1.0),
        ])
        output = node.output[0]
        del node.input[2]
        node.output[0] = pre_norm
        norm = helper.make_node(
            "BatchNormalization",
            [pre_norm, names["scale"], bias, names["mean"], names["var"]],
            [output],
            name=f"{node.name or output}.bn",
        )
        nodes.append(norm)
        taken |= set(names.values()) | {pre_norm}
        restored += 1
    if restored:
        del graph.node[:]
        graph.node.extend(nodes)
    return restored
