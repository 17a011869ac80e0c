"""Files as they come: old opsets converted, stand-in weights recognised, a fixed batch of 1 rebindable.

Most ONNX files people have (the ONNX Model Zoo, the CNNs the onnx wheel ships as test data) are
IR 3 / opset 7-9 files. :func:`modernize` turns such a model, in memory, into one the rest of the
importer reads, and returns notes that say what it did (shown as import warnings):

1. **Old opsets** (default-domain opset < ``MIN_OPSET``) are converted to ``TARGET_OPSET`` with
   onnx's own ``onnx.version_converter.convert_version`` (``_convert``): the rules model the
   opset >= 13 forms of Split/Squeeze/Unsqueeze/Reduce* (axes as inputs), which the adapters write.
   A file the converter cannot convert is a one-line ModelError.
2. **Initializers listed as graph inputs** (IR < 4 requires it): they are parameters with a default
   value, not inputs the caller feeds; they leave ``graph.input`` (``_drop_initializer_inputs``).
3. **Weights made by ConstantOfShape** (the "light" zoo files fill every weight with a constant of a
   constant shape, to ship without their data): a float ``ConstantOfShape`` of a constant shape read
   where only a trainable weight sits (a Conv/Gemm/MatMul weight, a norm scale, an embedding table)
   becomes a weightless initializer of that shape and dtype (``_constant_of_shape_weights``), so it
   is counted like any stripped weight. The data is never materialised (VGG-19's would be 575 MB).
4. **A fixed batch of 1** in a converted file (every runtime input has ``1`` on axis 0): axis 0
   becomes the symbolic dim ``batch`` and reshape targets that copy that 1 become ``0`` ("copy the
   input's dim"), so ``--dim batch=N`` rebinds it; without ``--dim`` the file's batch of 1 is used
   (``_rebind_batch``; :data:`REBOUND_BATCH_DIM` and :func:`default_dims`).

Everything is linear in the graph size.
"""

from __future__ import annotations

import math

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from planner.core.errors import ModelError

__all__ = ["modernize", "default_dims", "TARGET_OPSET", "MIN_OPSET", "REBOUND_BATCH_DIM"]

MIN_OPSET = 13
"""Oldest default-domain opset the rules read directly (Split/Squeeze/Unsqueeze/ReduceSum take axes
as inputs); older files are converted."""

TARGET_OPSET = 13
"""Opset old files are converted to: the oldest the rules read, so the converter applies the fewest
adapters (each adapter is a chance to fail on an unusual node)."""

REBOUND_BATCH_DIM = "batch"
"""Name given to a fixed batch of 1 in a converted file."""

_REBOUND_KEY = "planner.rebound_batch"
"""``metadata_props`` key marking a model whose batch was rebound (its default is the file's 1)."""

_DEFAULT_DOMAINS = ("", "ai.onnx")
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.DOUBLE, TensorProto.BFLOAT16})
# Where a ConstantOfShape output is a stand-in weight: positions only a trainable weight takes (a
# Conv weight, not an Add operand, which masks and fill values also take).
_WEIGHT_POSITIONS: dict[str, tuple[int, ...]] = {
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gemm": (1, 2),
    "MatMul": (1,),
    "Gather": (0,),
    "BatchNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "LayerNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "PRelu": (1,),
    "LSTM": (1, 2, 3),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
}
_LAYOUT_OPS = frozenset({"Transpose", "Cast", "Identity", "Reshape", "Unsqueeze", "Squeeze", "Flatten"})


def default_opset(model: onnx.ModelProto) -> int:
    """The model's default-domain opset version (0 when it declares none)."""
    return max((int(o.version) for o in model.opset_import if o.domain in _DEFAULT_DOMAINS), default=0)


def modernize(model: onnx.ModelProto, source: str = "the model") -> tuple[onnx.ModelProto, list[str]]:
    """The model in a form the importer reads, and notes saying what changed (see module docstring).

    Parameters
    ----------
    model:
        A parsed model (weights need not be present); not modified.
    source:
        How to name the file in messages.

    Returns
    -------
    model:
        ``model`` itself when nothing applies, else a converted copy.
    notes:
        One line per change, each saying what was done and, for the batch, how to rebind it.

    Raises
    ------
    ModelError
        onnx's version converter cannot convert the file (one line, with the fix).

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> x = helper.make_tensor_value_info("x", T.FLOAT, [1, 4])
    >>> y = helper.make_tensor_value_info("y", T.FLOAT, [1, 4])
    >>> old = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
    ...                         opset_imports=[helper.make_opsetid("", 9)])
    >>> new, notes = modernize(old)
    >>> default_opset(new), new.graph.input[0].type.tensor_type.shape.dim[0].dim_param
    (13, 'batch')
    >>> [n.split(";")[0] for n in notes]
    ['the model uses opset 9: converted to opset 13 with onnx.version_converter', 'the model fixes the batch at 1 (axis 0 of x)']
    """
    notes: list[str] = []
    opset = default_opset(model)
    legacy = 0 < opset < MIN_OPSET
    ir_version = model.ir_version
    dropped = 0
    if legacy or ir_version < 4 or any(n.op_type == "ConstantOfShape" for n in model.graph.node):
        model = _copy(model)  # the passes below edit in place; the caller's model stays as it was
    if legacy or ir_version < 4:
        # First, so the converter sees IR >= 4 semantics: an IR 3 file that lists only some of its
        # initializers as inputs is otherwise refused ("Input ... is undefined").
        dropped = _drop_initializer_inputs(model)
    if legacy:
        model = _convert(model, opset, source)
        notes.append(f"{source} uses opset {opset}: converted to opset {TARGET_OPSET} with onnx.version_converter")
    if dropped:
        notes.append(
            f"{dropped} initializers listed as graph inputs (IR {ir_version}) are taken as parameters, "
            "not inputs"
        )
    made, scales = _constant_of_shape_weights(model)
    if made:
        notes.append(
            f"{made} weights made by ConstantOfShape (a file shipped without its weights) are counted as "
            "parameters of their shapes"
        )
    if scales:
        # Caffe's BatchNorm has no affine of its own (the converter fills scale 1, shift 0) and a
        # Scale layer after it learns one; a stripped file cannot say which pair trains.
        notes.append(
            f"{scales[0]:,} elements of {scales[1]} per-channel Mul/Add operands made by ConstantOfShape "
            "follow BatchNormalizations (Caffe's BatchNorm + Scale): they are not counted, the "
            "BatchNormalizations' scale and shift are (one affine pair per layer, as torchvision counts "
            f"these networks); if both pairs are trainable, the true count is {scales[0]:,} higher"
        )
    if legacy:
        rebound = _rebind_batch(model)
        if rebound:
            notes.append(
                f"{source} fixes the batch at 1 (axis 0 of {', '.join(rebound)}); that axis is now the dim "
                f"'{REBOUND_BATCH_DIM}': pass --dim {REBOUND_BATCH_DIM}=N to plan another batch (default: the file's 1)"
            )
    return model, notes


def default_dims(model: onnx.ModelProto) -> dict[str, int]:
    """Dims a :func:`modernize` d model binds by default: its rebound batch at the file's 1.

    Examples
    --------
    >>> default_dims(onnx.ModelProto())
    {}
    """
    for prop in model.metadata_props:
        if prop.key == _REBOUND_KEY:
            return {prop.value: 1}
    return {}


def _copy(model: onnx.ModelProto) -> onnx.ModelProto:
    copy = onnx.ModelProto()
    copy.CopyFrom(model)
    return copy


def _convert(model: onnx.ModelProto, opset: int, source: str) -> onnx.ModelProto:
    """onnx's version converter to ``TARGET_OPSET``; a ModelError when it cannot."""
    from onnx import version_converter

    try:
        converted = version_converter.convert_version(model, TARGET_OPSET)
    except Exception as exc:  # the C++ converter raises RuntimeError/ValueError/ConvertError
        text = str(exc).strip().splitlines()
        reason = text[0][:160] if text else type(exc).__name__
        raise ModelError(
            f"{source} uses opset {opset} and onnx's version converter cannot convert it to opset "
            f"{TARGET_OPSET} ({reason}); re-export the model with opset >= {MIN_OPSET} "
            "(torch.onnx.export(..., opset_version=18))"
        ) from None
    if default_opset(converted) != TARGET_OPSET:
        raise ModelError(
            f"{source} uses opset {opset} and onnx's version converter did not convert it to opset "
            f"{TARGET_OPSET}; re-export the model with opset >= {MIN_OPSET}"
        )
    return converted


def _drop_initializer_inputs(model: onnx.ModelProto) -> int:
    """Remove graph inputs that name an initializer (in place); how many were removed."""
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    keep = [vi for vi in graph.input if vi.name not in weights]
    dropped = len(graph.input) - len(keep)
    if dropped:
        del graph.input[:]
        graph.input.extend(keep)
    model.ir_version = max(model.ir_version, 4)  # IR 4 lets initializers stand alone
    return dropped


def _consumers(graph: onnx.GraphProto) -> dict[str, list[tuple[onnx.NodeProto, int]]]:
    users: dict[str, list[tuple[onnx.NodeProto, int]]] = {}
    for node in graph.node:
        for position, name in enumerate(node.input):
            if name:
                users.setdefault(name, []).append((node, position))
    return users


def _read_as_weight(name: str, users: dict[str, list[tuple[onnx.NodeProto, int]]]) -> bool:
    """Whether ``name`` (through layout ops of it) is read at a weight position."""
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for node, position in users.get(value, ()):
            if node.domain not in _DEFAULT_DOMAINS:
                continue
            if position in _WEIGHT_POSITIONS.get(node.op_type, ()):
                return True
            if node.op_type in _LAYOUT_OPS and position == 0:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
    return False


def _constant_of_shape_weights(model: onnx.ModelProto) -> tuple[int, tuple[int, int] | None]:
    """Replace stand-in weights (ConstantOfShape of a constant shape) by weightless initializers.

    Returns how many were replaced and, for the stand-ins left that only a per-channel Mul/Add
    reads in a graph with BatchNormalizations (Caffe's Scale layer), ``(elements, count)``.
    """
    graph = model.graph
    shapes = {t.name: t for t in graph.initializer}
    users = _consumers(graph)
    replaced: list[int] = []
    made: list[TensorProto] = []
    normalised = any(n.op_type == "BatchNormalization" for n in graph.node)
    scale_elements = scale_count = 0
    for index, node in enumerate(graph.node):
        if node.op_type != "ConstantOfShape" or node.domain not in _DEFAULT_DOMAINS or len(node.output) != 1:
            continue
        shape_tensor = shapes.get(node.input[0]) if node.input else None
        if shape_tensor is None or shape_tensor.data_location == TensorProto.EXTERNAL:
            continue
        try:
            dims = [int(d) for d in numpy_helper.to_array(shape_tensor).reshape(-1)]
        except Exception:  # data that does not match its dims in a corrupt file: leave the node
            continue
        elem_type = TensorProto.FLOAT
        for attribute in node.attribute:
            if attribute.name == "value" and attribute.type == onnx.AttributeProto.TENSOR:
                elem_type = attribute.t.data_type
        if elem_type not in _FLOAT_TYPES or any(d < 0 for d in dims) or math.prod(dims) <= 1:
            continue
        if not _read_as_weight(node.output[0], users):
            if normalised and _read_by_mul_add(node.output[0], users):
                scale_elements += math.prod(dims)
                scale_count += 1
            continue
        weight = TensorProto(name=node.output[0], data_type=elem_type, dims=dims)
        # A weightless initializer, like a graph-only export's: external, its data file absent.
        weight.data_location = TensorProto.EXTERNAL
        entry = weight.external_data.add()
        entry.key, entry.value = "location", f"{node.output[0]}.absent"
        made.append(weight)
        replaced.append(index)
    scales = (scale_elements, scale_count) if scale_count else None
    if not made:
        return 0, scales
    gone = set(replaced)
    nodes = [n for i, n in enumerate(graph.node) if i not in gone]
    del graph.node[:]
    graph.node.extend(nodes)
    graph.initializer.extend(made)
    return len(made), scales


def _read_by_mul_add(name: str, users: dict[str, list[tuple[onnx.NodeProto, int]]]) -> bool:
    """Whether ``name`` (through layout ops of it) is read only by Mul/Add nodes, and by one at least."""
    stack, seen, found = [name], {name}, False
    while stack:
        value = stack.pop()
        for node, position in users.get(value, ()):
            if node.op_type in _LAYOUT_OPS and position == 0:
                stack.extend(o for o in node.output if o and o not in seen)
                seen.update(node.output)
            elif node.op_type in ("Mul", "Add"):
                found = True
            else:
                return False
    return found


def _rebind_batch(model: onnx.ModelProto) -> list[str]:
    """Make a fixed batch of 1 symbolic (in place); the inputs rebound (none: left alone)."""
    graph = model.graph
    weights = {t.name for t in graph.initializer}
    inputs = [vi for vi in graph.input if vi.name not in weights and vi.type.HasField("tensor_type")]
    used = {name for node in graph.node for name in node.input}
    inputs = [vi for vi in inputs if vi.name in used]
    if not inputs or any(_dims_named(vi, REBOUND_BATCH_DIM) for vi in graph.input):
        return []
    for vi in inputs:
        dims = vi.type.tensor_type.shape.dim
        if not dims or dims[0].WhichOneof("value") != "dim_value" or dims[0].dim_value != 1 or len(dims) < 2:
            return []  # not every input starts with a batch of 1: nothing to rebind safely
    first_axis = _first_axes(model)  # at the file's batch of 1, before any dim is renamed
    for vi in inputs:
        vi.type.tensor_type.shape.dim[0].dim_param = REBOUND_BATCH_DIM
    for vi in list(graph.output) + list(graph.value_info):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if dims and dims[0].WhichOneof("value") == "dim_value" and dims[0].dim_value == 1:
            # Unknown, not 'batch': a declared 1 may be the batch or a weight's own axis (Inception
            # v1 declares its classifier weight [1, 1, 1000, 1024]); the computed shape decides.
            dims[0].Clear()
    _copy_batch_in_reshapes(graph, first_axis)
    prop = model.metadata_props.add()
    prop.key, prop.value = _REBOUND_KEY, REBOUND_BATCH_DIM
    return [vi.name for vi in inputs]


def _dims_named(vi: onnx.ValueInfoProto, name: str) -> bool:
    return vi.type.HasField("tensor_type") and any(d.dim_param == name for d in vi.type.tensor_type.shape.dim)


def _first_axes(model: onnx.ModelProto) -> dict[str, int]:
    """Axis 0 of every value whose static shape onnx's inference finds (no weights are read)."""
    try:
        inferred = onnx.shape_inference.infer_shapes(model, check_type=False, strict_mode=False)
    except Exception:  # inference refuses some converted files: then no target is rewritten
        return {}
    out = {}
    for vi in list(inferred.graph.value_info) + list(inferred.graph.input):
        dims = vi.type.tensor_type.shape.dim if vi.type.HasField("tensor_type") else []
        if dims and dims[0].WhichOneof("value") == "dim_value":
            out[vi.name] = int(dims[0].dim_value)
    return out


def _copy_batch_in_reshapes(graph: onnx.GraphProto, first_axis: dict[str, int]) -> None:
    """Reshape targets written for batch 1 (``[1, 9216]``) copy the input's batch instead (``[0, 9216]``).

    At batch 1 the two are the same reshape only when the reshaped value's axis 0 is 1 there (its
    batch), which ``first_axis`` (onnx's inference at the file's batch) must show; at batch N only
    the second keeps the batch. A target is rewritten only when every reader is such a Reshape.
    """
    targets = {t.name: t for t in graph.initializer if t.data_type == TensorProto.INT64 and len(t.dims) == 1}
    users = _consumers(graph)
    for name, tensor in targets.items():
        readers = users.get(name, [])
        if not readers or any(node.op_type != "Reshape" or position != 1 for node, position in readers):
            continue
        if any(first_axis.get(node.input[0]) != 1 for node, _ in readers):
            continue  # the reshaped value does not start with the batch of 1: 0 would change it
        if any(_attr(node, "allowzero") for node, _ in readers):
            continue  # 0 would mean an empty dim there
        try:
            values = numpy_helper.to_array(tensor).copy()
        except Exception:
            continue
        if values.size >= 2 and values[0] == 1:
            values[0] = 0
            tensor.CopyFrom(numpy_helper.from_array(values.astype(np.int64), name))


def _attr(node: onnx.NodeProto, name: str) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(attribute.i)
    return 0
