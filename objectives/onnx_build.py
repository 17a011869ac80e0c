r"""Rebuild an op's main ONNX node at its per-device shard shape, as a one-node ONNX model.

The profiler (:mod:`objectives.profile`) times every distinct per-device shard of every op. This
module answers the two questions it needs: which shapes one device feeds the op's main node under a
configuration (:func:`shard_spec`), and which one-node model with which inputs runs it
(:func:`build_shard_model`, :func:`random_inputs`, :func:`check_outputs`).

Mapping node inputs to the op's dims
------------------------------------
:class:`~planner.core.graph.NodeSpec` lists the main node's inputs in ONNX order;
:attr:`Op.inputs <planner.core.graph.Op.inputs>` lists the op's operands (activations, graph inputs,
parameters; constants left out, operands of fused elementwise ops added, views folded in). Each node
input is resolved, per op, in this order (``_plan()``):

1. ``NodeSpec.input_axes`` when the importer gave it: exact.
2. A constant (``NodeSpec.constant_inputs``) stays an initializer. Constants that encode a shape
   (Reshape's and Expand's target, ConstantOfShape's shape, Resize's sizes) are rewritten to the
   expected output shard shape (``_SHAPE_CONSTANTS``). An empty dtype marks an omitted optional
   input.
3. An access of the same rank whose axes agree with the node input's shape (every indexed axis is as
   long as the product of its dims, spatial axes unchecked): the access's dims, axis by axis.
4. Otherwise a folded view (Transpose/Reshape of a weight or activation): the next unused access; its
   *split* dims are placed on node axes by size when the configuration is known (``_place()``), and
   only a unique placement is accepted (or the unique one keeping the access's dim order).
5. No access left (a constant mask the op does not list): its axes follow output 0's by numpy
   broadcasting (size-1 axes stay whole); failing that, the full shape, kept only if it runs.

Outputs are resolved the same way against :attr:`Op.outputs`. Doubt is settled by running: the
profiler accepts a timing only when every resolved output comes out at its expected shard shape
(``check_outputs``; on a spatially split axis within the halo, since the shard keeps the node's
padding). Attributes that count channels or units are scaled to the shard (``_ATTRIBUTE_RULES``:
Conv ``group``, GroupNormalization ``num_groups``, LSTM/GRU/RNN ``hidden_size``), and integer inputs
that index another input (Gather, GatherND, ScatterND, OneHot...) get values inside the shard
(``_INDEX_RULES``).

Only the main node is rebuilt: elementwise ops fused into the coarse op are not part of the timing.
"""

from __future__ import annotations

import hashlib
from dataclasses import dataclass
from typing import Callable, Literal, Mapping

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from planner.core.graph import IterDim, NodeSpec, Op, TensorAccess
from planner.core.layout import shard_shape

__all__ = [
    "ONNX_DTYPES",
    "FLOAT32_FALLBACK",
    "InputSlot",
    "OutputSlot",
    "ShardSpec",
    "shard_spec",
    "shard_spec_or_reason",
    "build_shard_model",
    "random_inputs",
    "check_outputs",
]

#: numpy-style dtype name -> ONNX ``TensorProto`` element type.
ONNX_DTYPES: dict[str, int] = {
    "float32": TensorProto.FLOAT,
    "float16": TensorProto.FLOAT16,
    "bfloat16": TensorProto.BFLOAT16,
    "float64": TensorProto.DOUBLE,
    "float8e4m3fn": TensorProto.FLOAT8E4M3FN,
    "float8e5m2": TensorProto.FLOAT8E5M2,
    "int64": TensorProto.INT64,
    "int32": TensorProto.INT32,
    "int16": TensorProto.INT16,
    "int8": TensorProto.INT8,
    "uint64": TensorProto.UINT64,
    "uint32": TensorProto.UINT32,
    "uint16": TensorProto.UINT16,
    "uint8": TensorProto.UINT8,
    "bool": TensorProto.BOOL,
    "complex64": TensorProto.COMPLEX64,
    "complex128": TensorProto.COMPLEX128,
}

#: Low-precision float dtypes measured as float32 when the provider has no kernel for them.
FLOAT32_FALLBACK: frozenset[str] = frozenset({"float16", "bfloat16", "float8e4m3fn", "float8e5m2"})

#: Dtypes numpy cannot hold: a shard using them is measured in float32 straight away.
_NO_NUMPY: frozenset[str] = frozenset({"bfloat16", "float8e4m3fn", "float8e5m2"})

#: (domain, op type) -> position of a constant input that holds the node's output shape.
_SHAPE_CONSTANTS: dict[tuple[str, str], int] = {
    ("", "Reshape"): 1,
    ("", "Expand"): 1,
    ("", "ConstantOfShape"): 0,
    ("", "Resize"): 3,
}

SlotKind = Literal["tensor", "constant", "absent"]


@dataclass(frozen=True, slots=True, kw_only=True)
class InputSlot:
    """One input of the rebuilt node."""

    kind: SlotKind
    """``tensor`` (a random graph input), ``constant`` (an initializer) or ``absent`` (omitted)."""
    shape: tuple[int, ...] = ()
    """Per-device shape (elements per axis)."""
    dtype: str = ""
    """numpy-style dtype name as in the model."""
    constant: bytes = b""
    """For constants: the serialized ``onnx.TensorProto`` (adjusted to the shard)."""
    index_high: tuple[int, ...] = ()
    """For integer tensors that index another input: exclusive upper bound of the values, one per
    column of the last axis (one value: all columns). ``()``: values in [1, 3), never zero."""


@dataclass(frozen=True, slots=True, kw_only=True)
class OutputSlot:
    """One output of the rebuilt node."""

    dtype: str
    """numpy-style dtype name as in the model; ``""`` for an omitted optional output."""
    shape: tuple[int, ...] | None
    """Expected per-device shape; ``None`` when unknown (not checked)."""
    tolerance: tuple[int, ...] = ()
    """Allowed difference per axis (spatially split axes: the shard keeps the node's padding)."""
    rank: int = 0
    """Number of axes (declared symbolic in the model)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class ShardSpec:
    """The main node of an op at one per-device shard shape: enough to build and run it."""

    op_name: str
    op_type: str
    domain: str
    opset: int
    attributes: tuple[bytes, ...]
    """Serialized ``onnx.AttributeProto``, adjusted to the shard."""
    inputs: tuple[InputSlot, ...]
    outputs: tuple[OutputSlot, ...]
    key: str
    """Signature: equal for shards that run the same node on the same shapes and dtypes, across
    ops and configurations (hex digest of op type, domain, opset, attributes, input shapes and dtypes,
    constants, expected output shapes)."""
    model_key: str
    """Like :attr:`key` without tensor shapes: shards with equal model keys run in one session
    built with symbolic input dims."""

    @property
    def description(self) -> str:
        """Readable one-line summary, e.g. ``MatMul(float32[4,8], float32[8,16]) -> [4,16]``."""
        parts = []
        for slot in self.inputs:
            if slot.kind == "absent":
                parts.append("-")
            else:
                shape = ",".join(map(str, slot.shape))
                parts.append(f"{'const ' if slot.kind == 'constant' else ''}{slot.dtype}[{shape}]")
        outs = [
            "?" if o.shape is None else "[" + ",".join(map(str, o.shape)) + "]"
            for o in self.outputs
            if o.dtype
        ]
        name = f"{self.domain}.{self.op_type}" if self.domain else self.op_type
        return f"{name}({', '.join(parts)}) -> {', '.join(outs)}"

    @property
    def dtypes(self) -> tuple[str, ...]:
        """Dtypes of the non-absent inputs and outputs."""
        return tuple(s.dtype for s in self.inputs if s.kind != "absent") + tuple(
            o.dtype for o in self.outputs if o.dtype
        )

    @property
    def needs_float32(self) -> bool:
        """True when some dtype has no numpy equivalent, so only a float32 run is possible."""
        return any(d in _NO_NUMPY for d in self.dtypes)

    @property
    def input_bytes(self) -> int:
        """Bytes of the random inputs one run feeds (as float32 for low-precision floats)."""
        total = 0
        for slot in self.inputs:
            if slot.kind == "tensor":
                itemsize = 4 if slot.dtype in FLOAT32_FALLBACK else np.dtype(_np_dtype(slot.dtype)).itemsize
                total += int(np.prod(slot.shape, dtype=np.int64)) * itemsize
        return total


# --------------------------------------------------------------------------------------------------
# Per-op plan: how each node input/output maps to the op's dims (independent of the configuration).

_Resolution = tuple  # ("axes", axes) | ("view", TensorAccess) | ("full",) | ("constant",) | ("absent",)


@dataclass(frozen=True, slots=True, kw_only=True)
class _Plan:
    inputs: tuple[_Resolution, ...]
    outputs: tuple[_Resolution, ...]
    dims: Mapping[str, IterDim]
    attributes: Mapping[str, onnx.AttributeProto]
    base: str
    """Digest of everything about the node that does not depend on the configuration."""


_PLANS: dict[int, tuple[Op, _Plan | str]] = {}
_PLAN_CACHE_LIMIT = 200_000


def _digest(payload: object) -> str:
    return hashlib.sha256(repr(payload).encode()).hexdigest()[:32]


def _agrees(axes: tuple[tuple[str, ...], ...], shape: tuple[int, ...], dims: Mapping[str, IterDim]) -> bool:
    """True when an access's axes fit a node tensor's shape axis by axis."""
    if len(axes) != len(shape):
        return False
    for names, size in zip(axes, shape):
        if not names:
            continue
        if any(n not in dims for n in names):
            return False
        if any(dims[n].kind == "spatial" for n in names):
            continue  # an input's spatial extent includes the halo and padding
        product = 1
        for n in names:
            product *= dims[n].size
        if product != size:
            return False
    return True


def _resolve(
    shapes: tuple[tuple[int, ...], ...],
    skip: set[int],
    accesses: tuple[TensorAccess, ...],
    dims: Mapping[str, IterDim],
) -> list[_Resolution | None]:
    """Steps 3-5 of the module docstring for the slots not in ``skip``."""
    result: list[_Resolution | None] = [None] * len(shapes)
    used: set[int] = set()
    for i, shape in enumerate(shapes):
        if i in skip:
            continue
        match = next(
            (j for j, a in enumerate(accesses) if j not in used and _agrees(a.axes, shape, dims)), None
        )
        if match is None:  # one tensor may feed two inputs (Mul(x, x)) but be listed once
            match = next((j for j, a in enumerate(accesses) if _agrees(a.axes, shape, dims)), None)
        if match is not None:
            used.add(match)
            result[i] = ("axes", accesses[match].axes)
    remaining = [a for j, a in enumerate(accesses) if j not in used]
    for i in range(len(shapes)):
        if i in skip or result[i] is not None:
            continue
        result[i] = ("view", remaining.pop(0)) if remaining else ("full",)
    return result


def _explicit(
    given: tuple[tuple[tuple[str, ...], ...] | None, ...],
    shapes: tuple[tuple[int, ...], ...],
    dims: Mapping[str, IterDim],
    what: str,
) -> list[_Resolution | None] | str:
    if len(given) != len(shapes):
        return f"NodeSpec.{what}_axes has {len(given)} entries for {len(shapes)} {what}s"
    result: list[_Resolution | None] = []
    for i, (axes, shape) in enumerate(zip(given, shapes)):
        if axes is None:
            result.append(None)
            continue
        if len(axes) != len(shape) or any(n not in dims for names in axes for n in names):
            return f"NodeSpec.{what}_axes[{i}] does not fit shape {list(shape)} and the op's dims"
        result.append(("axes", tuple(tuple(names) for names in axes)))
    return result


def _make_plan(op: Op) -> _Plan | str:
    node = op.node
    if node is None:
        return "no ONNX node to rebuild"
    if len(node.input_dtypes) != len(node.input_shapes):
        return "NodeSpec input shapes and dtypes differ in length"
    if len(node.output_dtypes) != len(node.output_shapes):
        return "NodeSpec output shapes and dtypes differ in length"
    dims = {d.name: d for d in op.dims}

    fixed_in: dict[int, _Resolution] = {}
    for i, dtype in enumerate(node.input_dtypes):
        if i in node.constant_inputs:
            fixed_in[i] = ("constant",)
        elif not dtype:
            fixed_in[i] = ("absent",)
        elif dtype not in ONNX_DTYPES:
            return f"input {i} has unsupported dtype '{dtype}'"
    for dtype in node.output_dtypes:
        if dtype and dtype not in ONNX_DTYPES:
            return f"an output has unsupported dtype '{dtype}'"
    if node.input_axes:
        explicit = _explicit(node.input_axes, node.input_shapes, dims, "input")
        if isinstance(explicit, str):
            return explicit
        inputs = [fixed_in.get(i) or r or ("full",) for i, r in enumerate(explicit)]
    else:
        found = _resolve(node.input_shapes, set(fixed_in), op.inputs, dims)
        inputs = [fixed_in.get(i) or found[i] for i in range(len(found))]
    absent_out = {i for i, d in enumerate(node.output_dtypes) if not d}
    if node.output_axes:
        explicit = _explicit(node.output_axes, node.output_shapes, dims, "output")
        if isinstance(explicit, str):
            return explicit
        outputs = [("absent",) if i in absent_out else (r or ("full",)) for i, r in enumerate(explicit)]
    else:
        found = _resolve(node.output_shapes, absent_out, op.outputs, dims)
        outputs = [("absent",) if i in absent_out else found[i] for i in range(len(found))]

    attributes = {}
    for raw in node.attributes:
        attr = onnx.AttributeProto.FromString(raw)
        attributes[attr.name] = attr
    shape_constant = _SHAPE_CONSTANTS.get((node.domain, node.op_type))
    base = _digest(
        (
            node.op_type,
            node.domain,
            node.opset,
            tuple(sorted(node.attributes)),
            node.input_dtypes,
            node.output_dtypes,
            tuple(
                (i, hashlib.sha256(node.constant_inputs[i]).hexdigest())
                for i in sorted(node.constant_inputs)
                if i != shape_constant  # rewritten per shard, so part of the per-shard key
            ),
        )
    )
    return _Plan(
        inputs=tuple(inputs), outputs=tuple(outputs), dims=dims, attributes=attributes, base=base
    )


def _plan(op: Op) -> _Plan | str:
    cached = _PLANS.get(id(op))
    if cached is not None and cached[0] is op:
        return cached[1]
    if len(_PLANS) > _PLAN_CACHE_LIMIT:
        _PLANS.clear()
    plan = _make_plan(op)
    _PLANS[id(op)] = (op, plan)  # keeps op alive, so its id is not reused while cached
    return plan


# --------------------------------------------------------------------------------------------------
# Per configuration: shard shapes, adjusted constants/attributes, index bounds, key.


def _place(
    access: TensorAccess, shape: tuple[int, ...], factors: Mapping[str, int], dims: Mapping[str, IterDim]
) -> tuple[tuple[str, ...], ...] | str:
    """Put the split dims of a folded-view access on the node tensor's axes, by size.

    Every dim of the access (size > 1) is given an axis whose size its size divides (several dims
    on one axis multiply). Placements that cover every axis exactly are preferred, then those that
    keep the access's dim order (a reshape keeps it, a transpose need not); within the first
    non-empty class the split dims must land on one placement only.
    """
    if not any(factors.get(n, 1) > 1 for names in access.axes for n in names):
        return tuple(() for _ in shape)
    if any(n not in dims for names in access.axes for n in names):
        return f"access of '{access.tensor}' names a dim the op does not have"
    atoms = [n for names in access.axes for n in names if dims[n].size > 1]
    sizes = [dims[n].size for n in atoms]
    solutions: list[tuple[tuple[int, ...], bool]] = []

    def search(k: int, left: list[int], chosen: list[int]) -> None:
        if len(solutions) >= 256:
            return
        if k == len(atoms):
            solutions.append((tuple(chosen), all(room == 1 for room in left)))
            return
        for j, room in enumerate(left):
            if room % sizes[k] == 0:
                left[j] //= sizes[k]
                chosen.append(j)
                search(k + 1, left, chosen)
                chosen.pop()
                left[j] = room

    search(0, list(shape), [])
    split = [i for i, n in enumerate(atoms) if factors.get(n, 1) > 1]
    for exact, ordered in ((True, True), (True, False), (False, True), (False, False)):
        chosen = {
            tuple(axes[i] for i in split)
            for axes, is_exact in solutions
            if (is_exact or not exact) and (not ordered or all(a <= b for a, b in zip(axes, axes[1:])))
        }
        if len(chosen) == 1:
            placement = chosen.pop()
            result: list[list[str]] = [[] for _ in shape]
            for i, axis in zip(split, placement):
                result[axis].append(atoms[i])
            return tuple(tuple(a) for a in result)
        if chosen:
            break
    names = [atoms[i] for i in split]
    what = "no unique" if solutions else "no"
    return f"{what} placement of split dims {names} of '{access.tensor}' on shape {list(shape)}"


def _shard_of(
    resolution: _Resolution,
    shape: tuple[int, ...],
    factors: Mapping[str, int],
    dims: Mapping[str, IterDim],
) -> tuple[tuple[int, ...], tuple[tuple[str, ...], ...] | None] | str:
    """Per-device shape of one node tensor and the dims on its axes (``None``: not known)."""
    kind = resolution[0]
    if kind == "axes":
        axes = resolution[1]
    elif kind == "view":
        placed = _place(resolution[1], shape, factors, dims)
        if isinstance(placed, str):
            return placed
        axes = placed
    else:  # "full": no access; the tensor is whole on every device
        return tuple(shape), None
    return shard_shape(tuple(shape), TensorAccess(tensor="", axes=axes), factors), axes


def _broadcast_axes(
    shape: tuple[int, ...], out_shape: tuple[int, ...], out_axes: tuple[tuple[str, ...], ...]
) -> tuple[tuple[str, ...], ...] | None:
    """Dims of an input with no access (a mask) that broadcasts to the output, numpy-style."""
    offset = len(out_shape) - len(shape)
    if offset < 0:
        return None
    axes = []
    for j, size in enumerate(shape):
        if size == 1:
            axes.append(())
        elif size == out_shape[offset + j]:
            axes.append(out_axes[offset + j])
        else:
            return None
    return tuple(axes)


def _int_attribute(plan: _Plan, name: str, default: int) -> int:
    attr = plan.attributes.get(name)
    return int(attr.i) if attr is not None else default


def _scaled(value: int, shard: int, full: int, what: str) -> int | str:
    if shard == full:
        return value
    if (value * shard) % full or value * shard < full:
        return f"cannot scale {what}={value} to a shard of {shard}/{full}"
    return value * shard // full


_Shapes = list[tuple[int, ...]]


def _conv_rule(plan: _Plan, shards: _Shapes, fulls: _Shapes) -> dict[str, int] | str:
    """Grouped convolution: groups follow the output channels (W's axis 0) onto the devices."""
    group = _int_attribute(plan, "group", 1)
    if group == 1 or len(shards) < 2 or not shards[1]:
        return {}
    scaled = _scaled(group, shards[1][0], fulls[1][0], "group")
    return scaled if isinstance(scaled, str) else {"group": scaled}


def _group_norm_rule(plan: _Plan, shards: _Shapes, fulls: _Shapes) -> dict[str, int] | str:
    """Groups follow the channels (X's axis 1)."""
    groups = _int_attribute(plan, "num_groups", 1)
    scaled = _scaled(groups, shards[0][1], fulls[0][1], "num_groups")
    return scaled if isinstance(scaled, str) else {"num_groups": scaled}


def _recurrent_rule(plan: _Plan, shards: _Shapes, fulls: _Shapes) -> dict[str, int] | str:
    """The hidden size is R's last axis at the shard."""
    if "hidden_size" not in plan.attributes or len(shards) < 3 or not shards[2]:
        return {}
    return {"hidden_size": shards[2][-1]}  # R is [directions, gates * hidden, hidden]


_AttributeRule = Callable[[_Plan, _Shapes, _Shapes], "dict[str, int] | str"]

#: op type -> rule giving integer attributes rescaled to the shard (or a reason it cannot be).
_ATTRIBUTE_RULES: dict[tuple[str, str], _AttributeRule] = {
    ("", "Conv"): _conv_rule,
    ("", "ConvTranspose"): _conv_rule,
    ("", "ConvInteger"): _conv_rule,
    ("", "GroupNormalization"): _group_norm_rule,
    ("", "LSTM"): _recurrent_rule,
    ("", "GRU"): _recurrent_rule,
    ("", "RNN"): _recurrent_rule,
}


def _axis(plan: _Plan, rank: int) -> int:
    axis = _int_attribute(plan, "axis", 0)
    return axis + rank if axis < 0 else axis


def _constant_value(node_constants: Mapping[int, bytes], index: int) -> np.ndarray | None:
    raw = node_constants.get(index)
    return None if raw is None else numpy_helper.to_array(TensorProto.FromString(raw))


def _index_bounds(plan: _Plan, op: Op, shards: list[tuple[int, ...]]) -> dict[int, tuple[int, ...]]:
    """Exclusive upper bounds for integer inputs that index another input (values start at 0)."""
    node = op.node
    if node is None:
        return {}
    key = node.op_type if node.domain == "" else ""
    if key in ("Gather", "GatherElements", "ScatterElements") and len(shards) > 1:
        return {1: (shards[0][_axis(plan, len(shards[0]))],)}
    if key in ("SoftmaxCrossEntropyLoss", "NegativeLogLikelihoodLoss") and len(shards) > 1 and len(shards[0]) > 1:
        return {1: (shards[0][1],)}  # labels index the classes (axis 1) of the scores' shard
    if key in ("GatherND", "ScatterND") and len(shards) > 1 and shards[1]:
        batch = _int_attribute(plan, "batch_dims", 0) if key == "GatherND" else 0
        columns = shards[1][-1]
        return {1: tuple(shards[0][batch + c] for c in range(columns))}
    if key == "OneHot":
        depth = _constant_value(node.constant_inputs, 1)
        return {0: (int(depth.reshape(-1)[0]) if depth is not None else 2,)}
    return {}


@dataclass(frozen=True, slots=True, kw_only=True)
class _OutputShards:
    """The shard of each node output (:func:`_output_shards`)."""

    shapes: list[tuple[int, ...] | None]
    """Per output, its shard shape (``None``: absent, or unknown under a split)."""
    tolerances: list[tuple[int, ...]]
    """Per output, per axis, the elements a split spatial dim may add or drop (halo)."""
    first: tuple[tuple[int, ...], tuple[tuple[str, ...], ...]] | None
    """The first output with known axes (full shape, axes): inputs read ``full`` broadcast against it."""


def _output_shards(plan: _Plan, node: NodeSpec, factors: Mapping[str, int]) -> _OutputShards | str:
    """Each output's shard shape and halo tolerance under ``factors``, or why one cannot be sharded."""
    dims = plan.dims
    out_shapes: list[tuple[int, ...] | None] = []
    tolerances: list[tuple[int, ...]] = []
    first_out: tuple[tuple[int, ...], tuple[tuple[str, ...], ...]] | None = None
    any_split = any(f > 1 for f in factors.values())
    for i, resolution in enumerate(plan.outputs):
        full = tuple(node.output_shapes[i])
        if resolution[0] == "absent":
            out_shapes.append(None)
            tolerances.append(())
            continue
        shard = _shard_of(resolution, full, factors, dims)
        if isinstance(shard, str):
            return f"output {i}: {shard}"
        shape, axes = shard
        if axes is None:  # no access: only known when nothing is split
            out_shapes.append(None if any_split else full)
            tolerances.append(())
            continue
        tolerance = []
        for names in axes:
            spatial = [dims[n] for n in names if dims[n].kind == "spatial" and factors.get(n, 1) > 1]
            tolerance.append(sum(d.halo // max(d.stride, 1) + 1 for d in spatial))
        out_shapes.append(shape)
        tolerances.append(tuple(tolerance))
        if first_out is None:
            first_out = (full, axes)
    return _OutputShards(shapes=out_shapes, tolerances=tolerances, first=first_out)


def _input_shapes(
    plan: _Plan, node: NodeSpec, factors: Mapping[str, int], first_out: tuple | None
) -> list[tuple[int, ...]] | str:
    """Each input's shard shape (constants and absent inputs whole), or why one cannot be sharded."""
    dims = plan.dims
    in_shapes: list[tuple[int, ...]] = []
    for i, resolution in enumerate(plan.inputs):
        full = tuple(node.input_shapes[i])
        if resolution[0] in ("constant", "absent"):
            in_shapes.append(full)
            continue
        if resolution[0] == "full" and first_out is not None:
            broadcast = _broadcast_axes(full, *first_out)
            if broadcast is not None:
                resolution = ("axes", broadcast)
        shard = _shard_of(resolution, full, factors, dims)
        if isinstance(shard, str):
            return f"input {i}: {shard}"
        in_shapes.append(shard[0])
    return in_shapes


def _scaled_attributes(
    plan: _Plan, node: NodeSpec, in_shapes: list[tuple[int, ...]]
) -> tuple[list[bytes], dict[str, int]] | str:
    """The node's serialized attributes with the shard-dependent ones (``group``, ...) rescaled by the
    op type's rule, and the rescaled values; or the rule's reason it cannot."""
    rule = _ATTRIBUTE_RULES.get((node.domain, node.op_type))
    new_attributes: dict[str, int] = {}
    if rule is not None:
        fulls = [tuple(s) for s in node.input_shapes]
        adjusted = rule(plan, in_shapes, fulls)
        if isinstance(adjusted, str):
            return adjusted
        new_attributes = adjusted
    attributes = list(node.attributes)
    if new_attributes:
        for index, raw in enumerate(attributes):
            attr = onnx.AttributeProto.FromString(raw)
            if attr.name in new_attributes and new_attributes[attr.name] != attr.i:
                scaled = helper.make_attribute(attr.name, new_attributes[attr.name])
                attributes[index] = scaled.SerializeToString()
    return attributes, new_attributes


def _input_slots(
    plan: _Plan, op: Op, node: NodeSpec, in_shapes: list[tuple[int, ...]], out_shapes: list[tuple[int, ...] | None]
) -> tuple[list[InputSlot], list[tuple]] | str:
    """Each input's slot (a shape-encoding constant rewritten to the output shard's shape) and its
    part of the signature; or why the shape constant cannot be rewritten."""
    shape_constant = _SHAPE_CONSTANTS.get((node.domain, node.op_type))
    bounds = _index_bounds(plan, op, in_shapes)
    slots: list[InputSlot] = []
    key_inputs: list[tuple] = []
    for i, resolution in enumerate(plan.inputs):
        dtype = node.input_dtypes[i]
        if resolution[0] == "absent":
            slots.append(InputSlot(kind="absent"))
            key_inputs.append(("-",))
            continue
        if resolution[0] == "constant":
            raw = node.constant_inputs[i]
            if i == shape_constant and out_shapes and out_shapes[0] != tuple(node.output_shapes[0]):
                if out_shapes[0] is None:
                    return f"input {i} encodes the output shape, which is unknown under this split"
                raw = numpy_helper.from_array(np.array(out_shapes[0], dtype=np.int64)).SerializeToString()
            value_shape = tuple(TensorProto.FromString(raw).dims)
            slots.append(InputSlot(kind="constant", shape=value_shape, dtype=dtype, constant=raw))
            key_inputs.append(("c", hashlib.sha256(raw).hexdigest()))
            continue
        slots.append(InputSlot(kind="tensor", shape=in_shapes[i], dtype=dtype, index_high=bounds.get(i, ())))
        key_inputs.append(("t", in_shapes[i], dtype, bounds.get(i, ())))
    return slots, key_inputs


def shard_spec_or_reason(op: Op, factors: Mapping[str, int]) -> ShardSpec | str:
    """The op's main node at its per-device shard under ``factors``, or why it cannot be rebuilt.

    Parameters
    ----------
    op:
        The coarse op; its :attr:`~planner.core.graph.Op.node` is rebuilt.
    factors:
        Split factor per iteration dim (missing dims: 1).

    Returns
    -------
    ShardSpec | str
        The shard, or a one-line reason (the op then counts as unprofilable).
    """
    plan = _plan(op)
    if isinstance(plan, str):
        return plan
    node = op.node
    assert node is not None  # _plan checked it
    shards = _output_shards(plan, node, factors)
    if isinstance(shards, str):
        return shards
    out_shapes, tolerances = shards.shapes, shards.tolerances
    in_shapes = _input_shapes(plan, node, factors, shards.first)
    if isinstance(in_shapes, str):
        return in_shapes
    scaled = _scaled_attributes(plan, node, in_shapes)
    if isinstance(scaled, str):
        return scaled
    attributes, new_attributes = scaled
    inputs = _input_slots(plan, op, node, in_shapes, out_shapes)
    if isinstance(inputs, str):
        return inputs
    slots, key_inputs = inputs
    outputs = tuple(
        OutputSlot(
            dtype=node.output_dtypes[i],
            shape=out_shapes[i],
            tolerance=tolerances[i],
            rank=len(node.output_shapes[i]),
        )
        for i in range(len(plan.outputs))
    )
    attr_key = tuple(sorted(new_attributes.items()))
    key = _digest((plan.base, tuple(key_inputs), tuple(out_shapes), attr_key))
    model_key = _digest(
        (
            plan.base,
            tuple(k if k[0] != "t" else ("t", len(k[1]), k[2]) for k in key_inputs),
            len(outputs),
            attr_key,
        )
    )
    return ShardSpec(
        op_name=op.name,
        op_type=node.op_type,
        domain=node.domain,
        opset=node.opset,
        attributes=tuple(attributes),
        inputs=tuple(slots),
        outputs=outputs,
        key=key,
        model_key=model_key,
    )


def shard_spec(op: Op, factors: Mapping[str, int]) -> ShardSpec | None:
    """The op's main node at its per-device shard under ``factors``; ``None`` if it cannot be rebuilt.

    See :func:`shard_spec_or_reason` (which also says why) and the module docstring.

    Examples
    --------
    >>> from planner.core.graph import IterDim, NodeSpec, Op, TensorAccess
    >>> op = Op(name="mm", kind="matmul", op_type="MatMul", flops=2.0 * 8 * 16 * 4,
    ...         dims=(IterDim(name="m", size=8), IterDim(name="n", size=16),
    ...               IterDim(name="k", size=4, kind="reduction")),
    ...         inputs=(TensorAccess(tensor="a", axes=(("m",), ("k",))),
    ...                 TensorAccess(tensor="b", axes=(("k",), ("n",)))),
    ...         outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),),
    ...         node=NodeSpec(op_type="MatMul", input_shapes=((8, 4), (4, 16)),
    ...                       input_dtypes=("float32", "float32"), output_shapes=((8, 16),),
    ...                       output_dtypes=("float32",)))
    >>> shard_spec(op, {"m": 2, "n": 4}).description
    'MatMul(float32[4,4], float32[4,4]) -> [4,4]'
    """
    result = shard_spec_or_reason(op, factors)
    return None if isinstance(result, str) else result


# --------------------------------------------------------------------------------------------------
# The one-node model and its inputs.


def _measured_dtype(dtype: str, float32: bool) -> str:
    return "float32" if float32 and dtype in FLOAT32_FALLBACK else dtype


def _np_dtype(dtype: str) -> np.dtype:
    return np.dtype(bool) if dtype == "bool" else np.dtype(dtype)


def build_shard_model(spec: ShardSpec, *, float32: bool = False, dynamic: bool = False) -> onnx.ModelProto:
    """The one-node ONNX model that runs ``spec``.

    Parameters
    ----------
    spec:
        The shard (see :func:`shard_spec`).
    float32:
        Replace low-precision float dtypes (float16, bfloat16, float8) by float32, for providers
        without kernels for them.
    dynamic:
        Declare input dims symbolic, so one session runs every shard with the same
        :attr:`ShardSpec.model_key`.

    Returns
    -------
    onnx.ModelProto
        Inputs ``x0, x1, ...`` (tensor slots), initializers for constants, outputs ``y0, y1, ...``.
    """
    graph_inputs = []
    initializers = []
    input_names = []
    for i, slot in enumerate(spec.inputs):
        if slot.kind == "absent":
            input_names.append("")
            continue
        name = f"x{i}"
        input_names.append(name)
        dtype = _measured_dtype(slot.dtype, float32)
        if slot.kind == "constant":
            tensor = TensorProto.FromString(slot.constant)
            if dtype != slot.dtype:
                tensor = numpy_helper.from_array(numpy_helper.to_array(tensor).astype(np.float32))
            tensor.name = name
            initializers.append(tensor)
            continue
        shape = [f"x{i}_{a}" for a in range(len(slot.shape))] if dynamic else list(slot.shape)
        graph_inputs.append(helper.make_tensor_value_info(name, ONNX_DTYPES[dtype], shape))
    output_names = [f"y{i}" if o.dtype else "" for i, o in enumerate(spec.outputs)]
    graph_outputs = [  # symbolic dims: onnxruntime checks nothing, the profiler checks the shapes
        helper.make_tensor_value_info(
            name, ONNX_DTYPES[_measured_dtype(o.dtype, float32)], [f"{name}_{a}" for a in range(o.rank)]
        )
        for name, o in zip(output_names, spec.outputs)
        if name
    ]
    node = helper.make_node(spec.op_type, input_names, output_names, name="node", domain=spec.domain or None)
    node.attribute.extend(onnx.AttributeProto.FromString(raw) for raw in spec.attributes)
    opsets = [helper.make_opsetid("", spec.opset)]
    if spec.domain:
        opsets.append(helper.make_opsetid(spec.domain, 1))
    graph = helper.make_graph([node], "shard", graph_inputs, graph_outputs, initializer=initializers)
    # the lowest IR version the opset needs, so older onnxruntime builds load the model too
    return helper.make_model(graph, opset_imports=opsets, ir_version=helper.find_min_ir_version_for(opsets))


def random_inputs(spec: ShardSpec, *, float32: bool = False, seed: int = 0) -> dict[str, np.ndarray]:
    """Random feeds for :func:`build_shard_model`'s inputs.

    Floats are uniform in [0.5, 1.5) (no zeros, negatives or denormals, so Div, Log, Sqrt and Pow run
    their ordinary path); booleans are fair coins; integers that index another input lie inside that
    input's shard (:attr:`InputSlot.index_high`), other integers in [1, 3) (never a zero divisor).
    """
    rng = np.random.default_rng(seed)
    feeds: dict[str, np.ndarray] = {}
    for i, slot in enumerate(spec.inputs):
        if slot.kind != "tensor":
            continue
        dtype = _measured_dtype(slot.dtype, float32)
        shape = slot.shape
        np_dtype = _np_dtype(dtype)
        if np_dtype.kind == "f" or np_dtype.kind == "c":
            value = rng.uniform(0.5, 1.5, size=shape).astype(np_dtype)
        elif np_dtype.kind == "b":
            value = rng.random(size=shape) < 0.5
        elif slot.index_high:
            high = np.array(slot.index_high, dtype=np.int64)
            value = np.floor(rng.random(size=shape) * np.maximum(high, 1)).astype(np_dtype)
        else:
            value = rng.integers(1, 3, size=shape).astype(np_dtype)
        feeds[f"x{i}"] = value
    return feeds


def check_outputs(spec: ShardSpec, outputs: list[np.ndarray]) -> str | None:
    """``None`` when every output with a known expected shape has it; else the reason."""
    produced = [o for o in spec.outputs if o.dtype]
    for index, (slot, value) in enumerate(zip(produced, outputs)):
        if slot.shape is None:
            continue
        actual = tuple(np.shape(value))
        tolerance = slot.tolerance or (0,) * len(slot.shape)
        if len(actual) != len(slot.shape) or any(
            abs(a - e) > t for a, e, t in zip(actual, slot.shape, tolerance)
        ):
            return f"output {index} has shape {list(actual)}, expected {list(slot.shape)}"
    return None

