"""Small ONNX models whose batch is coupled across samples, or is not a sample dim at all, built
with ``onnx.helper`` (no torch), for the batch-coupling tests.

* :func:`clip_model`: two towers embed images and texts; ``logits = image_emb @ text_emb^T`` is
  batch x batch, and the loss is cross entropy of both directions against ``arange(batch)``
  (CLIP's contrastive loss, as ``transformers.CLIPModel(return_loss=True)`` computes it).
* :func:`bn_cnn`: Conv -> BatchNormalization -> ReLU -> global pool -> linear -> mean loss.
* :func:`mean_loss_mlp`: an MLP whose loss is ``ReduceMean`` over the batch (the ordinary loss,
  coupled across samples only by the mean that gradient accumulation reproduces).
* :func:`gnn_model`: one GAT-like message-passing layer over ``x[num_nodes, 16]`` and
  ``edge_index[2, num_edges]``: Gather of the source nodes' rows by ``edge_index[0]``,
  ScatterElements (add) of the messages into the target nodes by ``edge_index[1]``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
from onnx import TensorProto as T
from onnx import helper, numpy_helper

__all__ = ["clip_model", "bn_cnn", "mean_loss_mlp", "gnn_model", "save"]


def _weight(name: str, *shape: int) -> onnx.TensorProto:
    return numpy_helper.from_array(np.full(shape, 0.01, np.float32), name)


def _int64(name: str, values: list[int]) -> onnx.TensorProto:
    return numpy_helper.from_array(np.array(values, np.int64), name)


def _model(nodes: list, name: str, inputs: list, outputs: list, weights: list) -> onnx.ModelProto:
    graph = helper.make_graph(nodes, name, inputs, outputs, weights)
    return helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)])


def save(model: onnx.ModelProto, directory: Path, name: str) -> Path:
    """Write ``model`` as ``directory/name.onnx`` (checked first) and return the path."""
    onnx.checker.check_model(model)
    path = Path(directory) / f"{name}.onnx"
    onnx.save(model, path)
    return path


def clip_model(layers: int = 2, hidden: int = 64, embed: int = 32) -> onnx.ModelProto:
    """A CLIP-like two-tower model with its contrastive loss (module docstring).

    Image tower: ``pixels[batch, 48] -> (MatMul -> Relu) x layers -> MatMul`` to ``embed``; text tower the
    same from ``text[batch, 40]``. Both embeddings are L2-normalised, ``logits_per_text = text @ image^T``
    (batch x batch) scaled by a learned temperature, ``logits_per_image`` its transpose, and the loss is
    the mean of both cross entropies against ``arange(batch)``.
    """
    nodes: list = []
    weights: list = [_int64("axes_last", [-1])]

    def tower(prefix: str, source: str, width: int) -> str:
        current, size = source, width
        for index in range(layers):
            weights.append(_weight(f"{prefix}.layers.{index}.weight", size, hidden))
            nodes.append(helper.make_node("MatMul", [current, f"{prefix}.layers.{index}.weight"], [f"{prefix}_h{index}"],
                                          name=f"{prefix}.layers.{index}.fc"))
            nodes.append(helper.make_node("Relu", [f"{prefix}_h{index}"], [f"{prefix}_a{index}"], name=f"{prefix}.layers.{index}.act"))
            current, size = f"{prefix}_a{index}", hidden
        weights.append(_weight(f"{prefix}.projection.weight", size, embed))
        nodes.append(helper.make_node("MatMul", [current, f"{prefix}.projection.weight"], [f"{prefix}_emb"], name=f"{prefix}.projection"))
        nodes.append(helper.make_node("ReduceL2", [f"{prefix}_emb", "axes_last"], [f"{prefix}_norm"], name=f"{prefix}.norm", keepdims=1))
        nodes.append(helper.make_node("Div", [f"{prefix}_emb", f"{prefix}_norm"], [f"{prefix}_embeds"], name=f"{prefix}.normalize"))
        return f"{prefix}_embeds"

    image = tower("vision", "pixels", 48)
    text = tower("text", "text", 40)
    weights.append(numpy_helper.from_array(np.array(2.6592, np.float32), "logit_scale"))
    nodes += [
        helper.make_node("Transpose", [image], ["image_t"], name="image_t", perm=[1, 0]),
        helper.make_node("MatMul", [text, "image_t"], ["sim"], name="logits_per_text"),
        helper.make_node("Exp", ["logit_scale"], ["scale"], name="scale"),
        helper.make_node("Mul", ["sim", "scale"], ["logits_t"], name="scaled"),
        helper.make_node("Transpose", ["logits_t"], ["logits_i"], name="logits_per_image", perm=[1, 0]),
        helper.make_node("Shape", ["logits_t"], ["shape"], name="shape", start=0, end=1),
        helper.make_node("Squeeze", ["shape"], ["n"], name="n"),
        helper.make_node("Range", ["zero", "n", "one"], ["labels"], name="labels"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits_t", "labels"], ["loss_t"], name="text_loss", reduction="mean"),
        helper.make_node("SoftmaxCrossEntropyLoss", ["logits_i", "labels"], ["loss_i"], name="image_loss", reduction="mean"),
        helper.make_node("Add", ["loss_t", "loss_i"], ["loss_sum"], name="loss_sum"),
        helper.make_node("Div", ["loss_sum", "two"], ["loss"], name="loss"),
    ]
    weights += [
        numpy_helper.from_array(np.array(0, np.int64), "zero"),
        numpy_helper.from_array(np.array(1, np.int64), "one"),
        numpy_helper.from_array(np.array(2.0, np.float32), "two"),
    ]
    inputs = [helper.make_tensor_value_info("pixels", T.FLOAT, ["batch", 48]),
              helper.make_tensor_value_info("text", T.FLOAT, ["batch", 40])]
    return _model(nodes, "clip", inputs, [helper.make_tensor_value_info("loss", T.FLOAT, [])], weights)


def bn_cnn(training_mode: int = 1, blocks: int = 2) -> onnx.ModelProto:
    """Conv(3x3) -> BatchNormalization -> ReLU, ``blocks`` times, then global pool, a linear layer and
    a mean loss; ``training_mode`` is the BatchNormalization attribute (1: batch statistics)."""
    nodes: list = []
    weights: list = [_int64("axes_batch", [0])]
    current, channels = "images", 3
    for index in range(blocks):
        prefix = f"layer{index}"
        weights += [_weight(f"{prefix}.conv.weight", 16, channels, 3, 3), _weight(f"{prefix}.bn.weight", 16),
                    _weight(f"{prefix}.bn.bias", 16), _weight(f"{prefix}.bn.running_mean", 16),
                    _weight(f"{prefix}.bn.running_var", 16)]
        nodes.append(helper.make_node("Conv", [current, f"{prefix}.conv.weight"], [f"{prefix}_c"], name=f"{prefix}.conv", pads=[1] * 4))
        bn_outputs = [f"{prefix}_b"] + ([f"{prefix}_rm", f"{prefix}_rv"] if training_mode else [])
        nodes.append(helper.make_node(
            "BatchNormalization",
            [f"{prefix}_c", f"{prefix}.bn.weight", f"{prefix}.bn.bias", f"{prefix}.bn.running_mean", f"{prefix}.bn.running_var"],
            bn_outputs, name=f"{prefix}.bn", training_mode=training_mode,
        ))
        nodes.append(helper.make_node("Relu", [f"{prefix}_b"], [f"{prefix}_r"], name=f"{prefix}.relu"))
        current, channels = f"{prefix}_r", 16
    weights.append(_weight("fc.weight", 16, 10))
    nodes += [
        helper.make_node("GlobalAveragePool", [current], ["pooled"], name="pool"),
        helper.make_node("Flatten", ["pooled"], ["flat"], name="flatten"),
        helper.make_node("MatMul", ["flat", "fc.weight"], ["logits"], name="fc"),
        helper.make_node("ReduceMean", ["logits", "axes_batch"], ["loss"], name="loss", keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info("images", T.FLOAT, ["batch", 3, 16, 16])]
    return _model(nodes, "bn_cnn", inputs, [helper.make_tensor_value_info("loss", T.FLOAT, [10])], weights)


def mean_loss_mlp() -> onnx.ModelProto:
    """Two linear layers and a ``ReduceMean`` over the batch axis: the ordinary mean loss."""
    weights = [_weight("fc1.weight", 32, 64), _weight("fc2.weight", 64, 8), _int64("axes_all", [0, 1])]
    nodes = [
        helper.make_node("MatMul", ["x", "fc1.weight"], ["h"], name="fc1"),
        helper.make_node("Relu", ["h"], ["a"], name="act"),
        helper.make_node("MatMul", ["a", "fc2.weight"], ["y"], name="fc2"),
        helper.make_node("ReduceMean", ["y", "axes_all"], ["loss"], name="loss", keepdims=0),
    ]
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, ["batch", 32])]
    return _model(nodes, "mlp", inputs, [helper.make_tensor_value_info("loss", T.FLOAT, [])], weights)


def gnn_model(features: int = 16, hidden: int = 32) -> onnx.ModelProto:
    """One GAT-like layer (module docstring) and a mean loss over the nodes.

    ``h = x @ W``; ``src, dst = edge_index[0], edge_index[1]``; ``msg = h[src] * sigmoid(h[src] @ a)``
    (the attention weight of each edge); ``out[dst] += msg`` (ScatterElements add into zeros shaped like
    ``h``); ``loss = mean(relu(out) @ W2)``.
    """
    weights = [
        _weight("conv.lin.weight", features, hidden), _weight("conv.att.weight", hidden, 1),
        _weight("head.weight", hidden, 4), _int64("zero_axis", [0]), _int64("one_axis", [1]),
        _int64("axes_all", [0, 1]), numpy_helper.from_array(np.array(0, np.int64), "row0"),
        numpy_helper.from_array(np.array(1, np.int64), "row1"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "conv.lin.weight"], ["h"], name="conv.lin"),
        helper.make_node("Gather", ["edge_index", "row0"], ["src"], name="src", axis=0),
        helper.make_node("Gather", ["edge_index", "row1"], ["dst"], name="dst", axis=0),
        helper.make_node("Gather", ["h", "src"], ["h_src"], name="conv.gather_src", axis=0),
        helper.make_node("MatMul", ["h_src", "conv.att.weight"], ["score"], name="conv.att"),
        helper.make_node("Sigmoid", ["score"], ["alpha"], name="conv.alpha"),
        helper.make_node("Mul", ["h_src", "alpha"], ["msg"], name="conv.message"),
        helper.make_node("Unsqueeze", ["dst", "one_axis"], ["dst_col"], name="dst_col"),
        helper.make_node("Shape", ["msg"], ["msg_shape"], name="msg_shape"),
        helper.make_node("Expand", ["dst_col", "msg_shape"], ["index"], name="index"),
        helper.make_node("Mul", ["h", "zero_f"], ["zeros"], name="zeros"),
        helper.make_node("ScatterElements", ["zeros", "index", "msg"], ["agg"], name="conv.aggregate", axis=0,
                         reduction="add"),
        helper.make_node("Relu", ["agg"], ["act"], name="act"),
        helper.make_node("MatMul", ["act", "head.weight"], ["out"], name="head"),
        helper.make_node("ReduceMean", ["out", "axes_all"], ["loss"], name="loss", keepdims=0),
    ]
    weights.append(numpy_helper.from_array(np.array(0.0, np.float32), "zero_f"))
    inputs = [helper.make_tensor_value_info("x", T.FLOAT, ["num_nodes", features]),
              helper.make_tensor_value_info("edge_index", T.INT64, [2, "num_edges"])]
    return _model(nodes, "gnn", inputs, [helper.make_tensor_value_info("loss", T.FLOAT, [])], weights)
