r"""The constant an attention's scores are scaled by, read from the ONNX nodes.

Attention scales :math:`QK^T` by :math:`1/\sqrt{d}`, ``d`` the head size (Vaswani et al. 2017, eq. 1),
and launchers that build the model from flags assume it (megatron-core 0.16.1's ``DotProductAttention``:
``softmax_scale = 1 / sqrt(hidden_size_per_attention_head)`` unless ``TransformerConfig.softmax_scale``).
Gemma-2 and Gemma-3 scale by ``query_pre_attn_scalar ** -0.5`` instead (transformers'
``Gemma3Attention.scaling``), which a graph-only file still shows: the coarse op graph drops constants,
but the ONNX nodes keep small ones (a scalar is a few bytes, under any stripping threshold).

:func:`attention_scales` walks back from each ``Softmax`` through elementwise nodes to the score
``MatMul`` and multiplies the scalar constants that scale the scores, wherever the exporter put them:

* on the path from the product to the softmax (``Mul`` by or ``Div`` by a constant): transformers'
  eager attention, ``matmul(q, k^T) * scaling``, then the mask's ``Add``;
* on either operand of the product, back through layout nodes (:data:`_LAYOUT`: ``Reshape``,
  ``Transpose``, GQA's ``Expand``...) to the first node that is neither: torch's SDPA decomposition
  (``torch/_decomp/decompositions.py`` ``scaled_dot_product_attention``'s math path, which both the
  dynamo exporter and a TorchScript export of ``F.scaled_dot_product_attention`` in torch 2.x write)
  multiplies ``q`` and ``k^T`` by ``sqrt(scale)`` each, so that the product does not overflow in half
  precision; Whisper's ``q_proj(x) * scaling`` scales the query alone.

The scale is the product of the factors found. A path with no ``Mul`` or ``Div`` at all, whose operands
come from other nodes (a projection, its bias, a rotary's ``Add``), is unscaled: 1 (T5's scores; Granite's
``attention_multiplier`` 1, whose ``* 1.0`` the dynamo exporter's optimiser drops, :func:`_unscaled`). A
``Mul`` or ``Div`` whose other operand is no constant scalar (a graph-only file stripped it, or it is computed
from shapes at run time) gives ``None`` (not read, nothing refused). Not seen: a scale folded into the query
projection's weights (``W_q / sqrt(d)``, as some conversions do) or applied before a rotary embedding, which
read as unscaled.

The answer is kept per reading of the file (:func:`importers.onnx_facts.per_reading`: its SHA-256 when
the caller has it, else its size and modification time), so a file rewritten in place is read again.
"""

from __future__ import annotations

import math
from typing import Callable

import onnx

from importers.onnx_facts import NUMBER_TYPES, OnnxFacts, float_values, per_reading

__all__ = ["attention_scales"]

_THROUGH = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Tanh", "Reshape"})
"""Node types between the score product and the softmax (scale, mask, soft-capping; BLOOM's ``baddbmm``
of the ALiBi bias and the scaled product, then a ``Reshape`` to heads)."""
_MAX_HOPS = 8  # Gemma-2's longest path: Mul, Div, Tanh, Mul, Add (mask), Cast
_LAYOUT = frozenset({"Reshape", "Transpose", "Expand", "Squeeze", "Unsqueeze", "Identity", "Cast"})
"""Nodes that move or repeat an operand's elements without changing them (heads split, ``k^T``, GQA)."""


def _path_to_matmul(producer: dict[str, onnx.NodeProto], start: str) -> list[onnx.NodeProto] | None:
    """The nodes from the value ``start`` back to the first ``MatMul`` (breadth first through
    :data:`_THROUGH`), the ``MatMul`` last; ``None`` when none is reached within :data:`_MAX_HOPS`."""
    frontier: list[tuple[str, list[onnx.NodeProto]]] = [(start, [])]
    for _ in range(_MAX_HOPS):
        following = []
        for value, path in frontier:
            node = producer.get(value)
            if node is None:
                continue
            if node.op_type == "MatMul":
                return path + [node]
            if node.op_type in _THROUGH:
                following += [(i, path + [node]) for i in node.input if i]
        frontier = following
    return None


_UNARY: dict[str, Callable[[float], float | None]] = {
    "Cast": lambda v: v, "Identity": lambda v: v, "Squeeze": lambda v: v, "Unsqueeze": lambda v: v,
    "Reshape": lambda v: v, "Neg": lambda v: -v, "Sqrt": lambda v: v ** 0.5 if not v < 0 else None,
    "Reciprocal": lambda v: 1 / v if v else None,
}
"""Scalar nodes of a scale's expression, on their first input (TorchScript's ``Cast(Sqrt(scale))``)."""
_BINARY: dict[str, Callable[[float, float], float | None]] = {
    "Mul": lambda a, b: a * b, "Div": lambda a, b: a / b if b else None,
    "Add": lambda a, b: a + b, "Sub": lambda a, b: a - b,
}
_FROM_SHAPE = frozenset({"Shape", "Size"})
"""Nodes whose value is known at run time only (here): a factor computed from them is not read."""


def _constant(producer: dict[str, onnx.NodeProto], scalars: dict[str, float], name: str,
              hops: int = _MAX_HOPS) -> float | None:
    """The value of the scalar ``name`` when a constant expression (:data:`_UNARY`, :data:`_BINARY`) of
    the file's scalar constants; ``nan`` when computed from a tensor's shape (TorchScript's SDPA without
    ``scale``: ``1 / sqrt(Shape(q)[-1])``); ``None`` when it is neither (a tensor: rotary's ``cos``)."""
    if name in scalars:
        return scalars[name]
    node = producer.get(name)
    if node is None or hops == 0 or not node.input:
        return None
    if node.op_type in _FROM_SHAPE:
        return math.nan
    if node.op_type in ("Slice", "Gather") and producer.get(node.input[0]) is not None \
            and producer[node.input[0]].op_type in _FROM_SHAPE:
        return math.nan
    values = [_constant(producer, scalars, i, hops - 1) for i in node.input[:2]]
    if node.op_type in _UNARY and values[0] is not None:
        return _UNARY[node.op_type](values[0])
    if node.op_type in _BINARY and len(values) == 2 and None not in values:
        return _BINARY[node.op_type](*values)
    return None


def _factor(node: onnx.NodeProto, value: str, producer: dict[str, onnx.NodeProto],
            scalars: dict[str, float]) -> float | None:
    """The factor the ``Mul`` or ``Div`` node ``node`` scales its operand ``value`` by: ``c`` for
    ``value * c``, ``1 / c`` for ``value / c`` (``c`` a :func:`_constant`, ``nan`` when computed at
    run time); ``None`` when ``c`` is not a nonzero scalar or ``value`` is the divisor."""
    others = [i for i in node.input if i != value]
    factor = _constant(producer, scalars, others[0]) if len(others) == 1 else None
    if not factor or node.op_type == "Div" and node.input[0] != value:
        return None
    return 1 / factor if node.op_type == "Div" else factor


def _scale(path: list[onnx.NodeProto], producer: dict[str, onnx.NodeProto],
           scalars: dict[str, float]) -> tuple[float, int] | None:
    """The product of the path's constant factors and their count (``None``: a ``Mul`` or ``Div``
    on the path whose other operand is not a constant scalar)."""
    scale, factors = 1.0, 0
    for node, before in zip(path[:-1], path[1:]):
        if node.op_type not in ("Mul", "Div"):
            continue
        factor = _factor(node, before.output[0], producer, scalars)
        if factor is None:
            return None
        scale, factors = scale * factor, factors + 1
    return scale, factors


def _operand_scale(producer: dict[str, onnx.NodeProto], value: str,
                   scalars: dict[str, float]) -> tuple[float, int]:
    """The product of the constant factors that scale the score product's operand ``value``, back
    through :data:`_LAYOUT` nodes to the first other node, and their count (module docstring)."""
    scale, factors = 1.0, 0
    for _ in range(_MAX_HOPS):
        node = producer.get(value)
        if node is None or not node.input:
            break
        if node.op_type in _LAYOUT:
            value = node.input[0]
            continue
        operand = node.input[0]
        factor = _factor(node, operand, producer, scalars) if node.op_type in ("Mul", "Div") else None
        if factor is None and node.op_type == "Mul" and len(node.input) == 2:
            operand = node.input[1]
            factor = _factor(node, operand, producer, scalars)
        if factor is None:
            break
        scale, factors, value = scale * factor, factors + 1, operand
    return scale, factors


def attention_scales(path: str, sha256: str = "") -> dict[str, float | None]:
    """``Softmax`` node name -> the constant its scores are scaled by (module docstring), for the ONNX
    file at ``path`` (its graph only, as :func:`importers.onnx_facts.file_facts` reads it: external data
    is not read). ``sha256`` (the op graph's hash of the file, ``OpGraph.source_sha256``; "" unknown)
    says which version of the file is meant."""
    return _scales(path, sha256)


@per_reading
def _scales(facts: OnnxFacts) -> dict[str, float | None]:
    """:func:`attention_scales` of one reading of a file."""
    producer, scalars = facts.producer, float_values(facts, types=NUMBER_TYPES)
    found: dict[str, float | None] = {}
    for node in facts.nodes:
        if node.op_type == "Softmax" and node.input:
            found[node.name] = _read(producer, node.input[0], scalars)
    return found


def _read(producer: dict[str, onnx.NodeProto], scores: str, scalars: dict[str, float]) -> float | None:
    """The scale of the softmax input ``scores``: the product of the factors after the score product
    and on its two operands (module docstring); ``None`` when there is none or one is not a constant."""
    route = _path_to_matmul(producer, scores)
    after = None if route is None else _scale(route, producer, scalars)
    if after is None:
        return None
    parts = [after] + [_operand_scale(producer, i, scalars) for i in route[-1].input]
    factors = sum(count for _, count in parts)
    scale = math.prod(scale for scale, _ in parts)
    if not factors:
        return 1.0 if _unscaled(producer, route) else None
    return None if math.isnan(scale) else scale


def _unscaled(producer: dict[str, onnx.NodeProto], route: list[onnx.NodeProto]) -> bool:
    """Whether nothing scales the scores of ``route`` (its path from the softmax back to the score product,
    which holds no factor): no ``Mul`` or ``Div`` on it, and each operand of the product, back through
    :data:`_LAYOUT` nodes, is written by a node that is neither (a ``Mul`` there holds a factor that is not
    a constant: a stripped one), not read straight from a graph input or an initializer."""
    if any(node.op_type in ("Mul", "Div") for node in route[:-1]):
        return False
    for value in route[-1].input:
        node = producer.get(value)
        for _ in range(_MAX_HOPS):
            if node is None or node.op_type not in _LAYOUT or not node.input:
                break
            node = producer.get(node.input[0])
        if node is None or node.op_type in ("Mul", "Div") or node.op_type in _LAYOUT:
            return False
    return True
