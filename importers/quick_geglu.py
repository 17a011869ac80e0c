r"""The constants of a quick-GELU gated MLP, read from the file's nodes (issue 25, GPT-OSS).

GPT-OSS (transformers 5.24 ``GptOssExperts._apply_gate``) gates its MLP as

.. math::

    \operatorname{clamp}(g, \le L)\,\sigma\!\big(a \operatorname{clamp}(g, \le L)\big)\,
    \big(\operatorname{clamp}(u, -L, L) + c\big),

with :math:`a = 1.702`, :math:`L = 7` (``swiglu_limit``) and :math:`c = 1`. The op graph keeps node types, not
constants (:func:`importers.layer_features.mlp_activation` reads "x * sigmoid(a x)" from a ``Mul`` before the
``Sigmoid``), so this reader goes back to the file (:mod:`importers.onnx_facts`) and reads, at each ``Sigmoid``
whose input is ``Mul(g, a)`` with ``a`` a one-element constant and whose output multiplies ``g``:

* ``alpha``: :math:`a`;
* ``gate_clamp``: the bounds of the ``Clip`` (inputs ``min``, ``max``, "" for an open side), ``Min`` (upper) or
  ``Max`` (lower) that writes ``g``, ``(None, None)`` without one;
* ``linear_offset``: :math:`c` of the ``Add(u, c)`` that the gate's product multiplies, 0 without one;
* ``linear_clamp``: the bounds on :math:`u`, read as ``gate_clamp``'s.

Both torch exporters write GPT-OSS so (``Clip(g, "", 7)``, ``Clip(u, -7, 7)``, ``Mul(g, 1.702)``, ``Add(u, 1)``).
A constant whose value is not in the file (an external one-element initializer) reads as ``nan``.

The same node types also write a SiLU of a scaled input, :math:`\operatorname{silu}(a g) = a g\,\sigma(a g)`
(Falcon-H1's ``FalconH1MLP``: ``act_fn(gate_proj(x) * gate_multiplier)``, one of its ``mlp_multipliers``): there the
product reads the ``Mul``'s output, not ``g``. :func:`scaled_silu_inputs` names those ``Sigmoid`` nodes and their
:math:`a`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import onnx

from importers.onnx_facts import OnnxFacts, per_reading

__all__ = ["QuickGeglu", "quick_geglu_gates", "scaled_silu_inputs"]

Bounds = tuple[float | None, float | None]


@dataclass(frozen=True, slots=True, kw_only=True)
class QuickGeglu:
    """One quick-GELU gate's constants (module docstring); ``nan`` where the file does not hold one."""

    alpha: float
    """:math:`a` of :math:`g \\sigma(a g)` (dimensionless)."""
    gate_clamp: Bounds = (None, None)
    """``(lower, upper)`` bound applied to the gate before the activation; ``None``: that side open."""
    linear_clamp: Bounds = (None, None)
    """``(lower, upper)`` bound applied to the linear half before the offset."""
    linear_offset: float = 0.0
    """:math:`c` added to the linear half before the product."""


def quick_geglu_gates(path: str, sha256: str = "") -> tuple[QuickGeglu, ...]:
    """Every quick-GELU gate of the ONNX file at ``path``, in file order (module docstring); ``()`` without one.

    Examples
    --------
    >>> import tempfile
    >>> from onnx import TensorProto as T, helper
    >>> c = lambda name, v: helper.make_tensor(name, T.FLOAT, [], [v])
    >>> nodes = [helper.make_node("Clip", ["g", "", "seven"], ["gc"]), helper.make_node("Clip", ["u", "m7", "seven"], ["uc"]),
    ...          helper.make_node("Mul", ["gc", "a"], ["ag"]), helper.make_node("Sigmoid", ["ag"], ["s"]),
    ...          helper.make_node("Mul", ["gc", "s"], ["glu"]), helper.make_node("Add", ["uc", "one"], ["up"]),
    ...          helper.make_node("Mul", ["up", "glu"], ["y"])]
    >>> io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("g", "u", "y")]
    >>> inits = [c("seven", 7.0), c("m7", -7.0), c("a", 1.702), c("one", 1.0)]
    >>> model = helper.make_model(helper.make_graph(nodes, "g", io[:2], io[2:], inits), opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     gate, = quick_geglu_gates(d + "/m.onnx")
    >>> round(gate.alpha, 3), gate.gate_clamp, gate.linear_clamp, gate.linear_offset
    (1.702, (None, 7.0), (-7.0, 7.0), 1.0)
    """
    return _gates(path, sha256)


@per_reading
def _gates(facts: OnnxFacts) -> tuple[QuickGeglu, ...]:
    """:func:`quick_geglu_gates` of one reading of a file."""
    found = []
    for node in facts.nodes:
        if node.op_type == "Sigmoid" and node.input:
            gate = _gate(facts, node)
            if gate is not None:
                found.append(gate)
    return tuple(found)


def scaled_silu_inputs(path: str, sha256: str = "") -> dict[str, float]:
    """``Sigmoid`` node name -> :math:`a` for every SiLU of a scaled input in the ONNX file at ``path`` (module
    docstring): the ``Sigmoid`` reads ``Mul(g, a)``, ``a`` a one-element constant (``nan`` where its data is not in
    the file), and a ``Mul`` reads both the ``Sigmoid``'s input and its output.

    >>> import tempfile
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Mul", ["g", "a"], ["ag"]), helper.make_node("Sigmoid", ["ag"], ["s"]),
    ...          helper.make_node("Mul", ["ag", "s"], ["y"])]
    >>> io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("g", "y")]
    >>> graph = helper.make_graph(nodes, "g", io[:1], io[1:], [helper.make_tensor("a", T.FLOAT, [], [0.8])])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 18)]), d + "/m.onnx")
    ...     found = scaled_silu_inputs(d + "/m.onnx")
    ...     quick = quick_geglu_gates(d + "/m.onnx")
    >>> {name: round(a, 3) for name, a in found.items()}, quick
    ({'': 0.8}, ())
    """
    return _silu_inputs(path, sha256)


@per_reading
def _silu_inputs(facts: OnnxFacts) -> dict[str, float]:
    """:func:`scaled_silu_inputs` of one reading of a file."""
    found = {}
    for node in facts.nodes:
        scaled = _scaled_input(facts, node) if node.op_type == "Sigmoid" and node.input else None
        if scaled is not None and any(n.op_type == "Mul" and node.input[0] in n.input
                                      for n in facts.readers.get(node.output[0], ())):
            found[node.name] = scaled[1]
    return found


def _value(facts: OnnxFacts, name: str) -> float | None:
    """The one-element constant ``name``'s value, ``nan`` when its data is not in the file, ``None`` when it is
    no constant."""
    scalar = facts.scalars.get(name)
    if scalar is None:
        return None
    return math.nan if scalar.value is None else scalar.value


def _scaled_input(facts: OnnxFacts, sigmoid: onnx.NodeProto) -> tuple[str, float] | None:
    """``(g, a)`` when ``sigmoid`` reads ``Mul(g, a)`` with ``a`` a one-element constant."""
    scale = facts.producer.get(sigmoid.input[0])
    if scale is None or scale.op_type != "Mul" or len(scale.input) != 2:
        return None
    for this, other in (scale.input, reversed(scale.input)):
        alpha = _value(facts, other)
        if alpha is not None and _value(facts, this) is None:
            return this, alpha
    return None


def _gate(facts: OnnxFacts, sigmoid: onnx.NodeProto) -> QuickGeglu | None:
    """The constants of the gate around ``sigmoid`` (module docstring), or ``None`` when it is no quick-GELU gate."""
    scaled = _scaled_input(facts, sigmoid)
    if scaled is None:
        return None
    gate, alpha = scaled
    glu = next((n for n in facts.readers.get(sigmoid.output[0], ()) if n.op_type == "Mul" and gate in n.input), None)
    if glu is None:
        return None
    product = next((n for n in facts.readers.get(glu.output[0], ()) if n.op_type == "Mul"), None)
    linear, offset = None, 0.0
    if product is not None:
        linear = next((i for i in product.input if i != glu.output[0]), None)
    adder = facts.producer.get(linear) if linear is not None else None
    if adder is not None and adder.op_type == "Add" and len(adder.input) == 2:
        values = [_value(facts, i) for i in adder.input]
        if values[1] is not None or values[0] is not None:
            at = 1 if values[1] is not None else 0
            offset, linear = values[at], adder.input[1 - at]  # type: ignore[assignment]
    return QuickGeglu(alpha=alpha, gate_clamp=_bounds(facts, gate),
                      linear_clamp=_bounds(facts, linear) if linear is not None else (None, None),
                      linear_offset=offset)


def _bounds(facts: OnnxFacts, name: str) -> Bounds:
    """``(lower, upper)`` of the ``Clip``, ``Min`` or ``Max`` that writes ``name``; ``(None, None)`` without one."""
    node = facts.producer.get(name)
    if node is None:
        return (None, None)
    if node.op_type == "Clip":
        bounds = [_value(facts, i) if i else None for i in (list(node.input[1:3]) + ["", ""])[:2]]
        for attribute in node.attribute:  # opset < 11: min and max are attributes
            if attribute.name in ("min", "max"):
                bounds[attribute.name == "max"] = float(attribute.f)
        return (bounds[0], bounds[1])
    if node.op_type in ("Min", "Max") and len(node.input) == 2:
        value = next((v for v in (_value(facts, i) for i in node.input) if v is not None), None)
        return (None, value) if node.op_type == "Min" else (value, None)
    return (None, None)
