r"""Coarsening stages 3-4: fold views into the ops that read them, and give every other node its rule.

3. **Fold views** (``_fold_views_and_rules``): Reshape/Transpose/Squeeze/Unsqueeze/Flatten/Identity/
   Cast/Expand of an activation or parameter become :class:`~importers.op_rules.views.ViewMap` s;
   ops read the original tensor through them. A view that cannot be folded exactly stays a
   ``data_movement`` op (a Reshape that changes the element count, as when an exporter baked a
   sequence length, is reported). Slices, splits and reordering concats of a weight (fused q/k/v,
   LSTM gates) are *parts* of it (``_fold_weight_part``): the ops using them read the weight. An
   affine function of a weight and a scalar constant (``weight + 1``, ``1 - p``) is the weight too
   (``_fold_affine_weight``).
4. **Rules**: each remaining node gets its iteration space from :mod:`importers.op_rules`.
"""

from __future__ import annotations

import math
from dataclasses import replace

import onnx
from onnx import helper

from importers.coarse_model import _DEFAULT_DOMAINS, _Model
from importers.op_rules import VIEW_OPS, NodeContext, ViewMap, apply_rule
from importers.op_rules.views import view_output, view_rule
from importers.parameters import affine_of_weight


# --------------------------------------------------------------------------------------------
# 3-4. Views and rules
# --------------------------------------------------------------------------------------------


def _context(m: _Model, index: int) -> NodeContext:
    node = m.nodes[index]
    attrs = {}
    for attribute in node.attribute:
        try:
            value = helper.get_attribute_value(attribute)
        except Exception:
            continue
        if isinstance(value, bytes):
            value = value.decode("utf-8", "replace")
        attrs[attribute.name] = value
    constants = {}
    parameters = set()
    for position, name in enumerate(node.input):
        if not name:
            continue
        if m.status.get(name) == "const":
            value = m.constant(name)
            if value is not None:
                constants[position] = value
        elif m.status.get(name) == "param":
            parameters.add(position)
    return NodeContext(
        name=m.names[index],
        op_type=node.op_type,
        domain=node.domain,
        attrs=attrs,
        input_shapes=tuple(m.shape(name) for name in node.input),
        input_dtypes=tuple(m.dtype(name) if name else None for name in node.input),
        output_shapes=tuple(m.shape(name) for name in node.output),
        output_dtypes=tuple(m.dtype(name) if name else None for name in node.output),
        constants=constants,
        parameters=frozenset(parameters),
        opset=m.opset or 18,
    )


def _source_view(m: _Model, name: str) -> ViewMap | None:
    if name in m.views:
        return m.views[name]
    shape = m.shape(name)
    if shape is None:
        return None
    return ViewMap.identity(name, shape)


def _fold_views_and_rules(m: _Model) -> None:
    """Fold view nodes into ViewMaps; give every other runtime node its rule (stages 3-4)."""
    for index, node in enumerate(m.nodes):
        outputs = [o for o in node.output if o]
        if not outputs or m.status.get(outputs[0]) != "act":
            continue
        data = node.input[0] if node.input else ""
        if (
            node.op_type in VIEW_OPS
            and node.domain in _DEFAULT_DOMAINS
            and data
            and m.status.get(data) in ("act", "param")
            and all(m.status.get(i) == "const" for i in node.input[1:] if i)
        ):
            source = _source_view(m, data)
            ctx = _context(m, index)
            folded = view_output(source, ctx) if source is not None else None
            if folded is not None:
                m.views[outputs[0]] = folded
                m.view_nodes.add(index)
                # A view of a parameter is the parameter (layout only).
                m.status[outputs[0]] = m.status[data]
                continue
            in_shape, out_shape = m.shape(data), m.shape(outputs[0])
            if node.op_type == "Reshape" and in_shape is not None and out_shape is not None and math.prod(in_shape) != math.prod(out_shape):
                m.baked.append(f"{m.names[index]} ({list(in_shape)} -> {list(out_shape)})")
            m.rules[index] = replace(view_rule(ctx), view=False)
            m.compute.append(index)
            continue
        if node.domain in _DEFAULT_DOMAINS and (_fold_weight_part(m, index) or _fold_affine_weight(m, index)):
            continue
        ctx = _context(m, index)
        result = apply_rule(ctx)
        if result.view:
            result = replace(result, view=False)
        m.rules[index] = result
        m.compute.append(index)
        if result.warning:
            key = node.op_type if node.domain in _DEFAULT_DOMAINS else f"{node.domain}:{node.op_type}"
            m.opaque.setdefault(key, []).append(m.names[index])


def _weight_root(m: _Model, name: str) -> tuple[str, tuple[int | None, ...]] | None:
    """The parameter a weight value reads and, per axis of the value, the parameter's axis."""
    if name in m.part_views:
        return m.part_views[name]
    if name in m.parameters or name in m.aliases:
        shape = m.shape(name) or ()
        return name, tuple(range(len(shape)))
    view = m.views.get(name)
    if view is None or m.status.get(view.origin) != "param":
        return None
    base = _weight_root(m, view.origin)
    if base is None:
        return None
    root, amap = base
    axis_map: list[int | None] = []
    for j in range(len(view.axes)):
        pieces = view.pieces(j)
        if len(pieces) > 1:
            return None  # a reshape merging weight axes: not a part view
        axis_map.append(amap[pieces[0].origin_axis] if pieces and pieces[0].origin_axis is not None else None)
    return root, tuple(axis_map)


def _fold_weight_part(m: _Model, index: int) -> bool:
    """Slice/Split/Concat/Gather-by-constant of a weight read as the weight (``part_views``).

    A fused q/k/v projection sliced per head group, or LSTM gates reordered by Slice and Concat,
    are parts of one parameter: the ops that read a part read the parameter, each part axis
    indexing the parameter axis it was cut from (a split of a part is a blocked split of the
    whole, as Megatron shards fused q/k/v). Returns False when the node is not such a part.
    """
    node = m.nodes[index]
    op = node.op_type
    if op not in ("Slice", "Split", "Concat", "Gather") or not node.input:
        return False
    outputs = [o for o in node.output if o]
    data_positions = range(len(node.input)) if op == "Concat" else [0]
    roots = []
    for position in data_positions:
        name = node.input[position]
        if not name:
            continue
        status = m.status.get(name)
        if status == "const":
            continue
        if status != "param":
            return False
        root = _weight_root(m, name)
        if root is None:
            return False
        roots.append(root)
    others = [n for p, n in enumerate(node.input) if n and p not in data_positions]
    if not roots or len({r for r in roots}) != 1 or any(m.status.get(n) != "const" for n in others):
        return False
    root, amap = roots[0]
    if op == "Gather":
        indices = m.constant(node.input[1]) if len(node.input) > 1 else None
        if indices is None or indices.ndim != 0:
            return False
        rank = len(m.shape(node.input[0]) or ())
        axis = _attr_int(node, "axis", 0)
        axis = axis + rank if axis < 0 else axis
        amap = amap[:axis] + amap[axis + 1 :]
    for out in outputs:
        if len(m.shape(out) or ()) != len(amap):
            return False
    for out in outputs:
        m.part_views[out] = (root, amap)
        m.status[out] = "param"
    m.view_nodes.add(index)
    return True


def _fold_affine_weight(m: _Model, index: int) -> bool:
    """``weight + 1`` (LayerNorm1P, Gemma's RMSNorm) or ``1 - p`` (RWKV) read as the weight itself.

    An affine function of one parameter and a scalar constant (:func:`affine_of_weight`) is the
    parameter, seen through an identity view: the ops reading it read the weight (a norm's scale
    keeps the hidden dim, so sequence parallelism still splits the norm), and no op of the
    weight's size alone is left to have no batch or sequence dim. Returns False when it is not.
    """
    node = m.nodes[index]
    for position, name in enumerate(node.input[:2]):
        if name and m.status.get(name) == "param" and affine_of_weight(m, index, position):
            source = _source_view(m, name)
            if source is None:
                return False
            m.views[node.output[0]] = source
            m.status[node.output[0]] = "param"
            m.view_nodes.add(index)
            return True
    return False


def _attr_int(node: onnx.NodeProto, name: str, default: int) -> int:
    for attribute in node.attribute:
        if attribute.name == name:
            return int(helper.get_attribute_value(attribute))
    return default


def _origin(m: _Model, name: str) -> str:
    """The stored tensor a value reads (itself unless it is a folded view)."""
    view = m.views.get(name)
    return view.origin if view is not None else name


def _transparent(m: _Model, name: str) -> str:
    """Look through identity views (Cast, Identity, trivial reshapes) to the value they copy."""
    view = m.views.get(name)
    if view is not None and view.is_identity and m.shape(view.origin) == m.shape(name):
        return view.origin
    return name


def _users(m: _Model, name: str) -> list[int]:
    """Nodes reading a value, looking through identity views of it (any depth, no recursion)."""
    result: list[int] = []
    stack: list[tuple[str, int]] = [(name, 0)]  # (value, next consumer position)
    while stack:
        value, start = stack.pop()
        consumers = m.consumers.get(value, ())
        for position in range(start, len(consumers)):
            index = consumers[position][0]
            if index in m.view_nodes:
                out = m.nodes[index].output[0]
                if _transparent(m, out) == value:
                    # Visit the view's readers before this value's later consumers (recursion's order).
                    stack.append((value, position + 1))
                    stack.append((out, 0))
                    break
            result.append(index)
    return result
