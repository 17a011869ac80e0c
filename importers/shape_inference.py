r"""Shape stages 2 and 4: ONNX shape inference on a weightless skeleton, and the declared fallbacks.

2. **Infer** on a *skeleton* of the model: graph inputs made concrete, big or external initializers
   turned into graph inputs of the same dtype and dims (so no weight bytes are copied and
   onnxruntime's symbolic inference, which reads initializer data, works on stripped files), graph
   outputs' declared shapes dropped. ``onnx.shape_inference.infer_shapes(data_prop=True)``, with each
   ``Unsqueeze`` of a per-token vector handed to it as a ``Reshape`` to the same shape (data
   propagation costs time and memory per element of such vectors). → ``_skeleton()``, ``_infer()``,
   ``_without_long_unsqueezes()``
4. **Fall back** for values still unknown: declared ``value_info`` made concrete by the bindings is
   fed to inference for exactly those values (so downstream inference resumes; this is what a
   graph-only file whose shape constants were stripped needs), then onnxruntime's
   ``SymbolicShapeInference`` when a ``com.microsoft``-style op is where inference stopped (it
   needs sympy, and is skipped without it). → ``_declared()``, ``_ort_infer()``
"""

from __future__ import annotations

import warnings
from dataclasses import dataclass
from typing import Iterable, Mapping, NamedTuple

import numpy as np
import onnx
from onnx import numpy_helper

from importers.dim_expr import _try_eval_dim
from importers.onnx_protos import _concrete_shape, _dim_text, _first_line, _is_anonymous, _tensor_type

_MAX_ROUNDS = 8


# --------------------------------------------------------------------------------------------
# Declared shapes (value_info, graph outputs)
# --------------------------------------------------------------------------------------------


class _Decl(NamedTuple):
    """A shape declared in the model (graph outputs, ``value_info``)."""

    values: tuple[int | None, ...] | None
    """Dims evaluated under the bindings (None where unknown); None when no shape is declared."""
    texts: tuple[str, ...]
    """Dims as written (``"batch"``, ``"128"``, ``"?"``), for messages."""
    elem_type: int
    """ONNX element type, 0 when undeclared."""


def _declared(
    graph: onnx.GraphProto, bindings: Mapping[str, int], derived: dict[str, int]
) -> dict[str, _Decl]:
    """Declared shapes of intermediate values and graph outputs; records evaluated dim_params."""
    out: dict[str, _Decl] = {}
    for vi in list(graph.value_info) + list(graph.output):
        tt = _tensor_type(vi)
        if tt is None:
            continue
        if not tt.HasField("shape"):
            out[vi.name] = _Decl(values=None, texts=(), elem_type=tt.elem_type)
            continue
        values: list[int | None] = []
        texts: list[str] = []
        for d in tt.shape.dim:
            texts.append(_dim_text(d))
            if d.WhichOneof("value") == "dim_value":
                values.append(int(d.dim_value))
            elif not _is_anonymous(d):
                value = _try_eval_dim(d.dim_param, bindings)
                if value is not None:
                    derived.setdefault(d.dim_param, value)
                values.append(value)
            else:
                values.append(None)
        out[vi.name] = _Decl(values=tuple(values), texts=tuple(texts), elem_type=tt.elem_type)
    return out


# --------------------------------------------------------------------------------------------
# Skeleton and inference
# --------------------------------------------------------------------------------------------


@dataclass(slots=True)
class _Parts:
    """The fixed parts of every skeleton model."""

    inputs: list[onnx.ValueInfoProto]
    initializers: list[onnx.TensorProto]
    outputs: list[onnx.ValueInfoProto]
    dropped_nodes: set[int]


def _skeleton(
    model: onnx.ModelProto,
    parts: _Parts,
    removed: set[int],
    injected: Mapping[str, np.ndarray],
    extra_vis: Iterable[onnx.ValueInfoProto],
) -> onnx.ModelProto:
    """A weightless copy of ``model`` with concrete inputs, for shape inference."""
    skel = onnx.ModelProto()
    skel.ir_version = model.ir_version
    skel.opset_import.extend(model.opset_import)
    skel.functions.extend(model.functions)
    g = skel.graph
    g.name = "skeleton"
    g.node.extend(
        node
        for i, node in enumerate(model.graph.node)
        if i not in removed and i not in parts.dropped_nodes
    )
    g.input.extend(parts.inputs)
    g.initializer.extend(parts.initializers)
    for name, value in injected.items():
        g.initializer.append(numpy_helper.from_array(value, name))
    g.output.extend(parts.outputs)
    g.value_info.extend(extra_vis)
    return skel


_LONG_VECTOR = 4096
"""Elements of a vector past which :func:`_without_long_unsqueezes` rewrites an ``Unsqueeze`` of it:
no shape vector is that long (a tensor's rank is its length), only per-token data is (an MoE
export's flattened top-k expert ids or weights, ``tokens x k``)."""


def _infer(skel: onnx.ModelProto, warn: list[str]) -> onnx.ModelProto | None:
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            return onnx.shape_inference.infer_shapes(
                _without_long_unsqueezes(skel), check_type=False, strict_mode=False, data_prop=True
            )
    except Exception as exc:  # onnx raises InferenceError, ValueError, RuntimeError...
        warn.append(
            f"ONNX shape inference failed ({_first_line(exc)}); using folded and declared shapes"
        )
        return None


def _without_long_unsqueezes(skel: onnx.ModelProto) -> onnx.ModelProto:
    """``skel`` with each ``Unsqueeze`` of a vector longer than :data:`_LONG_VECTOR` replaced by a
    ``Reshape`` to the same shape (from inference without data propagation), or ``skel`` itself when
    it has none.

    Why: ``onnx.shape_inference.infer_shapes(data_prop=True)`` spends time and memory in proportion to
    the length of every 1-D input of a data-propagating op (0.9 s for one ``Unsqueeze`` of 2,097,152
    elements, onnx 1.23), and an MoE export at the global batch unsqueezes ``tokens x k`` expert ids
    (OLMoE widths at 512 x 4,096 tokens: 28 s and 9 GB per inference). Nothing is lost: the
    ``Unsqueeze`` of a vector is a matrix, which data propagation never carries (it tracks values of
    rank 0 or 1 only, shape vectors), and the ``Reshape`` to a constant gives the same shape."""
    unsqueezes = [i for i, node in enumerate(skel.graph.node)
                  if node.op_type == "Unsqueeze" and node.domain in ("", "ai.onnx")]
    if not unsqueezes:
        return skel
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            plain = onnx.shape_inference.infer_shapes(skel, check_type=False, strict_mode=False, data_prop=False)
    except Exception:  # the data-propagating inference that follows reports it
        return skel
    shapes = {vi.name: shape for vi in [*plain.graph.value_info, *plain.graph.input, *plain.graph.output]
              if (shape := _concrete_shape(vi)) is not None}  # fmt: skip
    targets = {}
    for i in unsqueezes:
        node = skel.graph.node[i]
        data = shapes.get(node.input[0]) if node.input else None
        out = shapes.get(node.output[0]) if node.output else None
        if data is not None and len(data) == 1 and data[0] > _LONG_VECTOR and out is not None:
            targets[i] = out
    if not targets:
        return skel
    cut = onnx.ModelProto()
    cut.CopyFrom(skel)
    for i, shape in targets.items():
        node = cut.graph.node[i]
        shape_name = f"{node.output[0]}::skeleton_shape"
        cut.graph.initializer.append(numpy_helper.from_array(np.array(shape, dtype=np.int64), shape_name))
        reshape = onnx.helper.make_node("Reshape", [node.input[0], shape_name], list(node.output), name=node.name)
        node.CopyFrom(reshape)
    return cut


def _ort_infer(skel: onnx.ModelProto) -> onnx.ModelProto | None:
    """onnxruntime's symbolic shape inference on the skeleton, or None (no sympy, or it failed)."""
    try:
        from onnxruntime.tools.symbolic_shape_infer import SymbolicShapeInference
    except Exception:  # ImportError without sympy; anything else from an odd install
        return None
    # The steps of SymbolicShapeInference.infer_shapes, run here because that wrapper discards
    # partial results (raising when any shape stays unknown) and then writes
    # ``sym_shape_infer_temp.onnx`` into the working directory.
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            engine = SymbolicShapeInference(2**31 - 1, True, True, 0)
            engine._preprocess(skel)
            for _ in range(_MAX_ROUNDS):
                if not engine.run_:
                    break
                engine._infer_impl()
            engine._update_output_from_vi()
            return engine.out_mp_
    except Exception:  # plain Exceptions on ops it does not know; AttributeError if its API moved
        return None


def _harvest(
    inferred: onnx.ModelProto,
) -> tuple[dict[str, tuple[int, ...]], dict[str, int]]:
    """Concrete shapes and element types of every value that inference annotated."""
    shapes: dict[str, tuple[int, ...]] = {}
    types: dict[str, int] = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.output):
        tt = _tensor_type(vi)
        if tt is None:
            continue
        if tt.elem_type:
            types[vi.name] = tt.elem_type
        shape = _concrete_shape(vi)
        if shape is not None:
            shapes[vi.name] = shape
    return shapes, types
