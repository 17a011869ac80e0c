r"""Which GELU each fused GELU node of a file computes: the exact one, ``x Φ(x)`` with ``Φ`` by ``erf``, or
its tanh approximation, ``0.5 x (1 + tanh(√(2/π) (x + 0.044715 x³)))`` (issue 25).

The op graph keeps a node's type (:attr:`planner.core.graph.Op.node_types`), not its attributes, and one
type names both: ONNX's ``Gelu`` (opset 20) has an attribute ``approximate``, ``"none"`` (the default, erf)
or ``"tanh"``; torch's dynamo exporter at opset 20 or later writes ``F.gelu(x, approximate="tanh")``
(transformers' ``hidden_act="gelu_pytorch_tanh"``) as one ``Gelu`` with ``approximate="tanh"``. So this
reader goes back to the file's nodes (:mod:`importers.onnx_facts`), once per reading, and asks each the rule
of :func:`planner.core.gelu.gelu_form` (shared with the torch profile):

* ``Gelu`` in the ONNX domain: ``approximate="tanh"`` -> ``gelu-tanh``, ``"none"`` or absent -> ``gelu-erf``
  (ONNX operator spec, ``Gelu``-20);
* onnxruntime's contrib ops (domain ``com.microsoft``, onnxruntime ``docs/ContribOperators.md``): ``Gelu`` and
  ``BiasGelu`` (``Gelu(A + B)``) are erf GELU, ``FastGelu`` the tanh approximation; ``QuickGelu``,
  ``x sigmoid(alpha x)``, is no GELU form and is told by its type alone
  (:func:`importers.layer_features.mlp_activation`), as ``FastGelu`` and ``BiasGelu`` are;
* a ``Gelu`` of any other domain is not listed: its form is not known.
"""

from __future__ import annotations

from importers.onnx_facts import OnnxFacts, per_reading
from planner.core.gelu import GeluForm, gelu_form

__all__ = ["GeluForm", "gelu_forms"]


def gelu_forms(path: str, sha256: str = "") -> dict[str, GeluForm]:
    """ONNX node name -> :data:`GeluForm` of every GELU node of the file at ``path`` (module docstring),
    whose graph is read as :func:`importers.onnx_facts.file_facts` reads it. ``sha256`` (``OpGraph.source_sha256``;
    "" unknown) says which version of the file is meant.

    Examples
    --------
    >>> import tempfile
    >>> import onnx
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Gelu", ["x"], ["a"], name="tanh", approximate="tanh"),
    ...          helper.make_node("Gelu", ["a"], ["b"], name="exact"),
    ...          helper.make_node("FastGelu", ["b"], ["y"], name="fast", domain="com.microsoft")]
    >>> io = [helper.make_tensor_value_info(n, T.FLOAT, [4]) for n in ("x", "y")]
    >>> model = helper.make_model(helper.make_graph(nodes, "g", io[:1], io[1:]), opset_imports=[
    ...     helper.make_opsetid("", 20), helper.make_opsetid("com.microsoft", 1)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     print(gelu_forms(d + "/m.onnx"))
    {'tanh': 'gelu-tanh', 'exact': 'gelu-erf', 'fast': 'gelu-tanh'}
    """
    return _forms(path, sha256)


@per_reading
def _forms(facts: OnnxFacts) -> dict[str, GeluForm]:
    """:func:`gelu_forms` of one reading of a file."""
    found: dict[str, GeluForm] = {}
    for node in facts.nodes:
        approximate = next((a.s.decode(errors="replace") for a in node.attribute if a.name == "approximate"), "none")
        if (form := gelu_form(node.domain, node.op_type, approximate)) is not None:
            found[node.name] = form
    return found
