r"""Coarsening: a shaped ONNX graph -> an :class:`~planner.core.graph.OpGraph` of meaningful ops.

Stages, in order (:func:`build_op_graph` runs them on one :class:`~importers.coarse_model._Model`,
the state they share); each module's docstring says what its stage does:

1. **Classify values** and 2. **find the parameters** (:mod:`importers.parameters`): every value
   is ``const``, ``param`` or ``act``; a float initializer is trainable when its use says so; tied
   weights are one parameter (aliases go to ``parameter_aliases``); what the file itself records is
   settled by :mod:`importers.param_evidence`.
3. **Fold views** and 4. **apply the rules** (:mod:`importers.fold_views`): layout views become
   :class:`~importers.op_rules.views.ViewMap` s that ops read through, parts of a weight are read as
   the weight, and every other node gets its iteration space from :mod:`importers.op_rules`.
5. **Decomposed norms** (:mod:`importers.norm_regions`): a LayerNorm/RMSNorm/softmax written as
   elementwise and reduce nodes becomes one ``norm`` (``softmax``) op.
6. **Fuse pointwise chains** (:mod:`importers.fusion`): elementwise nodes join the op they follow
   (or, as a prologue, the op they feed); residual Adds stay ops.
7. **Build ops** (:mod:`importers.build_ops`): accesses through views onto the original tensors,
   sub-dims where a view merged axes, batch dims, module paths; then edges join producers to
   consumers (here).

Everything is linear in the number of nodes (dictionary lookups, one topological pass each).
"""

from __future__ import annotations

from collections import Counter
from typing import Mapping

from onnx import helper

from importers.build_ops import _build_op, _infer_module_paths, _input_batch_axes, _mark_batch
from importers.coarse_model import _Group, _Model, module_path_of
from importers.fold_views import _fold_views_and_rules
from importers.fusion import _group
from importers.onnx_protos import _limited
from importers.parameters import _classify, _find_parameters, _finish_status, is_parameter_name
from importers.shape_batch import generated_batch_dims, selected_batch_axes, tiled_batch_axes
from importers.shapes import ShapedModel
from planner.core.graph import Edge, Op, OpGraph, Tensor

__all__ = ["build_op_graph", "module_path_of", "is_parameter_name"]


# --------------------------------------------------------------------------------------------
# Entry point
# --------------------------------------------------------------------------------------------


def build_op_graph(
    shaped: ShapedModel,
    *,
    name: str,
    source_sha256: str = "",
    source_path: str = "",
) -> OpGraph:
    """Coarsen a shaped ONNX model into an :class:`OpGraph` (blocks not yet found).

    Parameters
    ----------
    shaped:
        The model with concrete shapes (:func:`importers.shapes.resolve_shapes`).
    name:
        Model name (usually the file stem).
    source_sha256, source_path:
        Recorded in the graph for provenance.

    Returns
    -------
    OpGraph
        Ops in topological order, tensors (activations, inputs, parameters), edges; ``blocks`` empty.

    Examples
    --------
    >>> from onnx import TensorProto as T
    >>> g = helper.make_graph(
    ...     [helper.make_node("MatMul", ["x", "w"], ["h"], name="mm"), helper.make_node("Relu", ["h"], ["y"], name="act")],
    ...     "mlp", [helper.make_tensor_value_info("x", T.FLOAT, [8, 16])],
    ...     [helper.make_tensor_value_info("y", T.FLOAT, [8, 32])],
    ...     initializer=[helper.make_tensor("w", T.FLOAT, [16, 32], [0.0] * 512)])
    >>> shaped = ShapedModel(model=helper.make_model(g), shapes={"x": (8, 16), "w": (16, 32), "h": (8, 32), "y": (8, 32)},
    ...                      dtypes={"x": "float32", "w": "float32", "h": "float32", "y": "float32"})
    >>> graph = build_op_graph(shaped, name="mlp")
    >>> [(op.name, op.kind, op.fused_pointwise, op.flops) for op in graph.ops]
    [('mm', 'matmul', 1, 8448.0)]
    >>> graph.parameter_count
    512
    """
    m = _Model(shaped)
    _classify(m)
    _find_parameters(m)
    _finish_status(m)
    _fold_views_and_rules(m)
    ops, producers, tensors = _coarse_ops(m, _group(m))
    edges = _edges_and_sources(m, ops, producers, tensors)
    ops = _infer_module_paths(ops, edges)
    return OpGraph(
        name=name,
        ops=tuple(ops),
        tensors=tensors,
        edges=tuple(edges),
        dim_bindings=dict(shaped.dim_bindings),
        raw_node_count=len(m.nodes),
        opset=m.opset,
        source_sha256=source_sha256,
        source_path=source_path,
        warnings=_import_warnings(m),
        parameter_aliases=_parameter_aliases(m),
        raw_op_types=dict(Counter(n.op_type for n in m.nodes)),
    )


def _coarse_ops(m: _Model, groups: list[_Group]) -> tuple[list[Op], dict[str, tuple[int, int]], dict[str, Tensor]]:
    """Stage 7: one op per group (batch dims marked), the ``(op, output position)`` producing each
    activation, and the activation tensors."""
    ops: list[Op] = []
    producers: dict[str, tuple[int, int]] = {}
    tensors: dict[str, Tensor] = {}
    for group in groups:
        op, outs, _ = _build_op(m, group)
        for position, (tensor, shape) in enumerate(outs):
            producers[tensor] = (len(ops), position)
            tensors[tensor] = Tensor(name=tensor, shape=shape, dtype=m.dtype(tensor), role="activation", producer=op.name)
        ops.append(op)
    batch_axes = _input_batch_axes(m)  # _mark_batch extends it op by op

    def tiled(op: Op, samples: dict[str, set[int]]) -> set[int]:
        # a parameter repeated per sample (DETR's queries) is batched too, and so are the tokens a traced MoE loop picks
        return tiled_batch_axes(m, op, samples) | selected_batch_axes(m, op, batch_axes)
    # and an axis a folded repeat leaves to its consumers (XLNet's position table expanded over the batch)
    return generated_batch_dims(_mark_batch(ops, batch_axes, tiled), m.initializers.keys()), producers, tensors


def _edges_and_sources(
    m: _Model, ops: list[Op], producers: Mapping[str, tuple[int, int]], tensors: dict[str, Tensor]
) -> list[Edge]:
    """The edges between ops; every tensor no op produces (parameter, graph input, constant) is
    added to ``tensors``."""
    edges: list[Edge] = []
    for consumer, op in enumerate(ops):
        for position, access in enumerate(op.inputs):
            tensor = access.tensor
            if tensor in producers:
                producer, out_position = producers[tensor]
                edges.append(
                    Edge(producer=producer, consumer=consumer, tensor=tensor, producer_output=out_position, consumer_input=position)
                )
                continue
            if tensor in tensors:
                continue
            status = m.status.get(tensor)
            role = "parameter" if status == "param" else "input" if tensor in m.inputs else "constant"
            shape = m.shape(tensor) or ()
            tensors[tensor] = Tensor(name=tensor, shape=shape, dtype=m.dtype(tensor), role=role)  # type: ignore[arg-type]
    return edges


_NONZERO_NOTE = (
    "; NonZero's length depends on the input's values, so a trace of a loop over it (a per-expert MoE "
    "dispatch, `for expert in expert_mask.nonzero()`) holds only the iterations its example took: weights of "
    "the rest (an expert no example token reached) are not in the file (nor counted)"
)
"""Why a graph with ``NonZero`` may lack parameters: transformers' Switch Transformers, traced by TorchScript on
8 decoder tokens, holds 7 of its 8 experts (the decoder's expert 3 was never routed to: 16,384 of torch's
327,680 parameters absent)."""


def _import_warnings(m: _Model) -> tuple[str, ...]:
    """The stages' warnings, then baked sequence lengths and opaque op types."""
    warnings = list(m.warnings)
    if m.baked:
        listed = _limited(m.baked, 2)
        warnings.append(
            f"{len(m.baked)} Reshape node(s) change the element count at these dims, e.g. {listed}: "
            "the exporter baked sequence lengths into the graph; import at the lengths it was exported with"
        )
    for op_type, nodes in sorted(m.opaque.items()):
        listed = _limited(nodes, 3)
        warnings.append(
            f"{len(nodes)} node(s) of op type '{op_type}' ({listed}) are treated as opaque: replicated, never split"
            + (_NONZERO_NOTE if op_type == "NonZero" else "")
        )
    return tuple(warnings)


def _parameter_aliases(m: _Model) -> dict[str, str]:
    """Tied copies of parameters, and Identity views of a parameter, -> the parameter."""
    aliases: dict[str, str] = dict(m.aliases)
    for value, view in m.views.items():
        if view.origin in m.parameters and m.producer.get(value) and m.nodes[m.producer[value][0]].op_type == "Identity":
            aliases[value] = view.origin
    return aliases

