r"""The constant an attention's scores are scaled by, read from the ONNX nodes.

Attention scales :math:`QK^T` by :math:`1/\sqrt{d}`, ``d`` the head size (Vaswani et al. 2017, eq. 1),
and launchers that build the model from flags assume it (megatron-core 0.16.1's ``DotProductAttention``:
``softmax_scale = 1 / sqrt(hidden_size_per_attention_head)`` unless ``TransformerConfig.softmax_scale``).
Gemma-2 and Gemma-3 scale by ``query_pre_attn_scalar ** -0.5`` instead (transformers'
``Gemma3Attention.scaling``), which a graph-only file still shows: the coarse op graph drops constants,
but the ONNX nodes keep small ones (a scalar is a few bytes, under any stripping threshold).

:func:`attention_scales` walks back from each ``Softmax`` through elementwise nodes to the score
``MatMul`` and multiplies the scalar constants the path multiplies by (``Mul``) or divides by
(``Div``): transformers' eager attention, ``matmul(q, k^T) * scaling``, then the mask's ``Add``. A
path without such a factor (the scale applied to the query before the product, as SDPA
decompositions do, or computed from shapes at run time) or with a factor that is not a constant
scalar gives ``None``: not read, nothing refused.

The answer is kept per reading of the file (:func:`importers.onnx_facts.per_reading`: its SHA-256 when
the caller has it, else its size and modification time), so a file rewritten in place is read again.
"""

from __future__ import annotations


import onnx

from importers.onnx_facts import NUMBER_TYPES, OnnxFacts, float_values, per_reading

__all__ = ["attention_scales"]

_THROUGH = frozenset({"Add", "Sub", "Mul", "Div", "Where", "Cast", "Tanh"})
"""Elementwise node types between the score product and the softmax (scale, mask, soft-capping)."""
_MAX_HOPS = 8  # Gemma-2's longest path: Mul, Div, Tanh, Mul, Add (mask), Cast


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


def _scale(path: list[onnx.NodeProto], scalars: dict[str, float]) -> float | None:
    """The product of the path's constant factors (``None``: none, or one not a constant scalar)."""
    scale, factors, on_path = 1.0, 0, {o for n in path for o in n.output}
    for node in path[:-1]:
        if node.op_type not in ("Mul", "Div"):
            continue
        operands = [i for i in node.input if i not in on_path]
        if len(operands) != 1 or operands[0] not in scalars or scalars[operands[0]] == 0:
            return None
        value = scalars[operands[0]]
        divides = node.op_type == "Div" and node.input[1] == operands[0]
        scale, factors = scale / value if divides else scale * value, factors + 1
    return scale if factors else None


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
            route = _path_to_matmul(producer, node.input[0])
            found[node.name] = None if route is None else _scale(route, scalars)
    return found
