"""What torch's model holds that an export may not show: ``make_zoo.py``'s per-file counts.

``zoo.json`` records, beside ``param_count``, the elements of tied weights (``_tied_count``), of
floating-point buffers (``_buffer_count``) and of parameters the export folds away
(``_folded_count``), each computed from the torch model (and, for the folds, the exported graph)
when a file is built; ``tests/zoo/test_zoo.py`` bounds the importer's warnings by them. The importer
never reads them.
"""

from __future__ import annotations

from collections import Counter
from typing import Any

import onnx
import torch
from torch import nn

__all__ = ["_buffer_count", "_folded_count", "_initializer_shapes", "_inline_float_values", "_tied_count"]


def _tied_count(model: nn.Module) -> int:
    """Elements of the parameters a model reuses (``lm_head`` tied to the embedding), counted once.

    ``param_count`` counts each once; the TorchScript exporter writes such a weight twice (the
    table, and its transpose for the MatMul), so a file without values cannot show the tie.
    """
    every = sum(p.numel() for _, p in model.named_parameters(remove_duplicate=False))
    return every - sum(p.numel() for p in model.parameters())


def _buffer_count(model: nn.Module) -> int:
    """Elements of the model's floating-point buffers (``parameters()`` leaves them out).

    An export writes a buffer as an initializer like any weight; where the file cannot tell the
    two apart (BART's ``final_logits_bias``, folded by TorchScript into an ``onnx::Add_N``) the
    importer counts it and warns, and the test bounds what it warned by this.
    """
    return sum(b.numel() for b in model.buffers() if b.is_floating_point())


# Parameters an eval-mode export folds with their indices into constants of other shapes: the
# file no longer holds them in any form the importer may count (issue 15: counted by hand here).
_FOLDED_WITH_INDEX = ("relative_position_bias_table",)


def _initializer_shapes(proto: onnx.ModelProto) -> Counter:
    """How many float initializers of each shape the exported graph holds (values not needed)."""
    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.BFLOAT16, onnx.TensorProto.DOUBLE)
    return Counter(tuple(int(d) for d in t.dims) for t in proto.graph.initializer if t.data_type in floats)


def _inline_float_values(proto: onnx.ModelProto) -> list[Any]:
    """Each inline float initializer's values, sorted (none in a FakeTensor or graph-only export)."""
    from onnx import numpy_helper

    floats = (onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE)
    return [numpy_helper.to_array(t).astype("float64").ravel() for t in proto.graph.initializer
            if t.data_type in floats and t.data_location != onnx.TensorProto.EXTERNAL]


def _held_by_values(param: torch.Tensor, values: list[Any]) -> bool:
    """The export holds ``param``'s elements as they are, cut or reshaped (BEiT's TorchScript table
    becomes a [1, heads, 2w-1, 2w-1] grid and its [3, heads] class rows): the initializers whose values
    all come from ``param`` hold exactly its elements. A fold by an index (Swin's per-window biases)
    repeats and drops elements, so it fails this. The weights are random (distinct) values."""
    import numpy as np

    want = np.sort(param.detach().double().numpy().ravel())
    parts = [v for v in values if v.size <= want.size and np.isin(v, want).all()]
    got = np.sort(np.concatenate(parts)) if parts else np.empty(0)
    return got.shape == want.shape and bool((got == want).all())


def _folded_count(model: nn.Module, exporter: str, shapes: Counter, values: list[Any] | None = None) -> int:
    """Parameter elements the export folds away, so that no importer can count them from the file.

    * Swin's ``relative_position_bias_table`` ((2w-1)^2 x heads per block): both exporters gather
      it by its index buffer and fold the result into per-window biases ``[heads, w^2, w^2]``;
      the dynamo exporter's optimizer leaves large ones unfolded (Swin-T's ``[169, heads]``), so a
      table whose shape the exported graph still holds (``shapes``: float initializers per shape,
      used up one by one), or, where the export's ``values`` are known, whose elements it holds cut
      or reshaped (``_held_by_values``: BEiT's), is not folded.
    * A weight norm's magnitude ``g`` (``parametrizations.weight.original0``: Wav2Vec2's positional
      conv): TorchScript's constant folding computes ``g * v / ||v||`` into one weight of ``v``'s shape;
      ``g``'s elements are folded unless the export holds them (``values``; without values: TorchScript
      folds, the other exporters keep it).
    * TorchScript (eval mode, constant folding) fuses each Conv -> BatchNorm into one Conv: the
      BatchNorm's scale and shift (2 C) and the bias-free Conv become a Conv with a bias (C), so C
      elements per BatchNorm are gone. The dynamo exporter's optimizer fuses them too, but names the
      bias ``<weight>_bias``, from which the importer restores the scale (counted, not folded).
    """
    if exporter == "ts_train":
        return 0  # training mode, no constant folding: nothing is folded
    left = Counter(shapes)
    folded = 0
    for name, p in model.named_parameters():
        if name.rsplit(".", 1)[-1] in _FOLDED_WITH_INDEX:
            shape = tuple(p.shape)
            if left[shape] > 0:
                left[shape] -= 1
            elif not (values and _held_by_values(p, values)):
                folded += p.numel()
        elif name.endswith("parametrizations.weight.original0"):
            if (not values and exporter == "ts") or (values and not _held_by_values(p, values)):
                folded += p.numel()
    if exporter == "ts":
        folded += sum(m.num_features for m in model.modules() if isinstance(m, nn.modules.batchnorm._BatchNorm))
    return folded
