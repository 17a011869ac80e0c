"""Importers: an ONNX file -> a coarse :class:`~planner.core.graph.OpGraph`.

``import_model(path, dims)`` runs the whole pipeline: :func:`importers.onnx_load.load_onnx` (graph
only, no weights) -> :func:`importers.shapes.resolve_shapes` (concrete shapes at the bound dims) ->
per-node op rules (:mod:`importers.op_rules`) and coarsening (:mod:`importers.coarsen`) ->
repeated blocks (:mod:`importers.blocks`).
"""

from __future__ import annotations

from dataclasses import replace
from pathlib import Path
from typing import Mapping

from planner.core.graph import OpGraph

__all__ = ["import_model"]


def import_model(path: str | Path, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Import an ONNX model as a coarse op graph at the given symbolic dim values.

    Parameters
    ----------
    path:
        The ``.onnx`` file (its external weight file may be absent: weights are never read).
    dims:
        Symbolic dim name -> size in elements, e.g. ``{"batch": 32, "seq": 1024}``.

    Returns
    -------
    OpGraph
        Coarse ops in topological order with iteration spaces, tensors, edges, repeated blocks,
        import warnings and provenance (file hash, raw node count and op-type histogram).

    Raises
    ------
    ModelError
        The file cannot be read as an ONNX model (one line, ending with the fix).
    UnboundDimError
        A symbolic dim has no value (names the ``--dim`` flag to pass).

    Examples
    --------
    >>> import tempfile, onnx
    >>> from onnx import helper, TensorProto as T
    >>> x = helper.make_tensor_value_info("x", T.FLOAT, ["batch", 16])
    >>> y = helper.make_tensor_value_info("y", T.FLOAT, ["batch", 32])
    >>> w = helper.make_tensor("fc.weight", T.FLOAT, [16, 32], [0.5] * 512)
    >>> nodes = [helper.make_node("MatMul", ["x", "fc.weight"], ["h"], name="fc"),
    ...          helper.make_node("Relu", ["h"], ["y"], name="relu")]
    >>> model = helper.make_model(helper.make_graph(nodes, "mlp", [x], [y], [w]),
    ...                           opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/mlp.onnx")
    ...     graph = import_model(d + "/mlp.onnx", {"batch": 8})
    >>> [(op.name, op.kind, [(d.name, d.size, d.is_batch) for d in op.dims]) for op in graph.ops]
    [('fc', 'matmul', [('m', 8, True), ('n', 32, False), ('k', 16, False)])]
    >>> graph.parameter_count, graph.forward_flops()
    (512, 8448.0)
    """
    from importers.blocks import find_blocks
    from importers.coarsen import build_op_graph
    from importers.onnx_load import load_onnx
    from importers.shapes import resolve_shapes

    path = Path(path)
    model, digest = load_onnx(path)
    shaped = resolve_shapes(model, dict(dims or {}))
    graph = build_op_graph(shaped, name=path.stem, source_sha256=digest, source_path=str(path))
    return replace(graph, blocks=find_blocks(graph))
