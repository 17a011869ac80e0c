r"""Zero-centred norm scales, ``y = norm(x) * (1 + w)``, read from a model file.

Gemma's RMSNorm (transformers' ``GemmaRMSNorm``: ``output * (1.0 + self.weight.float())``) and
NeMo's LayerNorm1P (transformers' ``NemotronLayerNorm1P``: ``F.layer_norm(..., self.weight + 1, ...)``)
learn :math:`w` with :math:`1 + w` as the scale: the weight starts at 0 and weight decay pulls the
scale towards 1, not towards 0. Same function, another parametrisation, so a launcher that builds the
model from flags must be told (Megatron-LM's ``--apply-layernorm-1p``) or refuse.

The importer reads ``weight + c`` (``c`` a one-element constant) as the weight itself
(:func:`importers.parameters.affine_of_weight`, folded by :mod:`importers.fold_views`), so the op
graph no longer shows the ``+ 1``; the ONNX nodes do. :func:`scale_offsets` finds, per node, the
parameters it reads as ``Add(weight, c)`` (either order, through ``Cast`` / ``Identity`` on either
side, as bf16 exports cast the weight first) and ``c``: its value, or ``nan`` when the file does not
hold it (a graph-only export that stripped the scalar). :func:`norm_scale_offsets` gives each norm op
of the graph (:attr:`planner.core.graph.Op.onnx_nodes`) its offset: ``None`` for a plain scale.

A file whose exporter folded ``weight + 1`` into a new constant (both exporters' default constant
folding: the zoo's ``gemma_*``) holds no ``Add`` to read: its norms read as plain, and the folded
constant is what the importer counts as the weight. What the file does show is the fold itself: the
constant carries a name the exporter made (TorchScript's ``onnx::LayerNormalization_561``, dynamo's
``add_99``) where a weight read as it is keeps its module path (``model.norm.weight``), often beside
the same norm's ``...layernorm.bias``. :func:`folded_norm_scales` lists those scales, so a launcher
that builds the model from flags can say it cannot tell (Megatron-LM's ``--apply-layernorm-1p``).
"""

from __future__ import annotations

import math
from pathlib import Path
from typing import Iterable

import onnx

from importers.onnx_facts import NUMBER_TYPES, OnnxFacts, float_values, per_reading
from planner.core.graph import OpGraph

__all__ = ["scale_offsets", "norm_scale_offsets", "folded_norm_scales"]

_THROUGH = frozenset({"Cast", "Identity"})
"""Nodes that copy a value (a dtype cast of the weight or of the constant) between it and the ``Add``."""


def _root(producer: dict[str, onnx.NodeProto], name: str) -> str:
    """The value ``name`` copies through :data:`_THROUGH` nodes."""
    for _ in range(8):  # a cast chain is one or two nodes long
        node = producer.get(name)
        if node is None or node.op_type not in _THROUGH or not node.input:
            return name
        name = node.input[0]
    return name


@per_reading
def scale_offsets(facts: OnnxFacts) -> dict[str, tuple[tuple[str, str, float], ...]]:
    """``{node name: ((weight, constant, c), ...)}``: the file's nodes that read ``weight + c``, with
    ``weight`` an initializer of more than one element, ``constant`` the one-element value added
    (an initializer or a ``Constant`` node) and ``c`` its value (``nan``: not in the file). Called as
    ``scale_offsets(path, sha256="")``, read once per reading of the file
    (:func:`~importers.onnx_facts.per_reading`: a file rewritten in place is read again)."""
    values, sizes, producer = float_values(facts, types=NUMBER_TYPES), facts.initializer_sizes, facts.producer
    constants = {n.output[0] for n in facts.nodes if n.op_type == "Constant" and n.output}
    offsets: dict[str, tuple[str, str, float]] = {}  # Add's output -> (weight, constant, c)
    for node in facts.nodes:
        if node.op_type != "Add" or len(node.input) != 2 or not node.output:
            continue
        a, b = (_root(producer, name) for name in node.input)
        for weight, constant in ((a, b), (b, a)):
            if sizes.get(weight, 0) > 1 and (sizes.get(constant) == 1 or constant in constants):
                offsets[node.output[0]] = (weight, constant, values.get(constant, math.nan))
    found: dict[str, tuple[tuple[str, str, float], ...]] = {}
    for node in facts.nodes:  # the nodes that read an offset weight (a norm's scale), not the casts between
        read = tuple(offsets[r] for r in (_root(producer, name) for name in node.input) if r in offsets)
        if read and node.op_type not in _THROUGH:
            found[node.name] = read
    return found


def norm_scale_offsets(graph: OpGraph, indices: Iterable[int]) -> list[float | None]:
    """Per norm op of ``indices`` that reads a parameter (its scale; a norm without one is left out):
    the ``c`` of its ``weight + c`` (``nan``: not in the file), or ``None`` for a plain scale. Empty
    when the graph has no file (a hand-built graph).

    Examples
    --------
    >>> import tempfile
    >>> from types import SimpleNamespace as N
    >>> import numpy as np, onnx
    >>> from onnx import TensorProto as T, helper, numpy_helper
    >>> nodes = [helper.make_node("Constant", [], ["one"], value=helper.make_tensor("one", T.FLOAT, [], [1.0])),
    ...          helper.make_node("Add", ["w", "one"], ["scale"], name="add"),
    ...          helper.make_node("LayerNormalization", ["x", "scale"], ["y"], name="ln")]
    >>> g = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("x", T.FLOAT, [2, 4])],
    ...                       [helper.make_tensor_value_info("y", T.FLOAT, [2, 4])],
    ...                       [numpy_helper.from_array(np.zeros(4, np.float32), "w")])
    >>> op = N(kind="norm", name="ln", onnx_nodes=("ln",), inputs=(N(tensor="x"), N(tensor="w")))
    >>> tensors = {"x": N(role="activation"), "w": N(role="parameter")}
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(helper.make_model(g), d + "/m.onnx")
    ...     print(norm_scale_offsets(N(ops=(op,), tensors=tensors, source_path=d + "/m.onnx"), [0]))
    [1.0]
    """
    path = graph.source_path
    if not path or not Path(path).is_file():
        return []
    found = scale_offsets(str(path), getattr(graph, "source_sha256", ""))
    out: list[float | None] = []
    for index in indices:
        op = graph.ops[index]
        params = {a.tensor for a in op.inputs if getattr(graph.tensors.get(a.tensor), "role", None) == "parameter"}
        if not params:
            continue
        read = [c for name in op.onnx_nodes or (op.name,) for weight, constant, c in found.get(name, ())
                if weight in params and getattr(graph.tensors.get(constant), "role", None) != "parameter"]
        out.append(read[0] if read else None)
    return out


def _module_path(name: str) -> bool:
    """Whether ``name`` is a module path (``model.layers.0.input_layernorm.weight``), the name both torch
    exporters give a parameter they read as it is, not one they made for a computed constant
    (``onnx::Mul_736``, ``add_99``, ``val_4``)."""
    return "." in name and not name.startswith("onnx::")


def folded_norm_scales(graph: OpGraph) -> tuple[str, ...]:
    """The parameters of the graph's norm ops that are constants the exporter computed (module docstring):
    a norm's parameter without a module path, read with no ``weight + c`` in the file, in a file that names
    its other parameters by module path (one that names none says nothing). Empty when every norm's
    scale is a weight read as it is, or an offset the file shows.

    Examples
    --------
    >>> from types import SimpleNamespace as N
    >>> p = N(role="parameter")
    >>> tensors = {"x": N(role="activation"), "onnx::LayerNormalization_561": p, "m.ln.bias": p, "m.ln2.weight": p}
    >>> ln = N(kind="norm", name="ln", onnx_nodes=("ln",), inputs=(N(tensor="x"), N(tensor="onnx::LayerNormalization_561"), N(tensor="m.ln.bias")))
    >>> ln2 = N(kind="norm", name="ln2", onnx_nodes=("ln2",), inputs=(N(tensor="x"), N(tensor="m.ln2.weight")))
    >>> folded_norm_scales(N(ops=(ln, ln2), tensors=tensors, source_path=""))
    ('onnx::LayerNormalization_561',)
    >>> unnamed = {"x": N(role="activation"), "onnx::LayerNormalization_561": p, "onnx::Add_7": p}
    >>> ln_bare = N(kind="norm", name="ln", onnx_nodes=("ln",), inputs=(N(tensor="x"), N(tensor="onnx::LayerNormalization_561"), N(tensor="onnx::Add_7")))
    >>> folded_norm_scales(N(ops=(ln_bare,), tensors=unnamed, source_path=""))  # no module path anywhere: says nothing
    ()
    >>> folded_norm_scales(N(ops=(ln2,), tensors=tensors, source_path=""))
    ()
    """
    parameters = [name for name, tensor in graph.tensors.items() if getattr(tensor, "role", None) == "parameter"]
    if not any(_module_path(name) for name in parameters):
        return ()
    folded: list[str] = []
    for index, op in enumerate(graph.ops):
        if op.kind != "norm" or any(c is not None for c in norm_scale_offsets(graph, [index])):
            continue  # not a norm, or one whose weight + c the file shows
        params = [a.tensor for a in op.inputs if getattr(graph.tensors.get(a.tensor), "role", None) == "parameter"]
        folded += [name for name in params if not _module_path(name) and name not in folded]
    return tuple(folded)
