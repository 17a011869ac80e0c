r"""Ops that read across the samples of the batch: what micro-batching and data parallelism change.

The planner splits the batch freely (data parallelism, micro-batches) because most of a network
computes each sample alone. Three kinds of op do not (:data:`~planner.core.graph.BatchCouplingKind`),
and :func:`batch_couplings` finds them:

* **similarity** (on the coarse ops): a MatMul whose output has two axes indexed by distinct batch
  dims, ``[batch, batch]``: CLIP's ``logits = text_emb @ image_emb^T`` before its contrastive
  cross entropy. Every sample's loss depends on the whole batch, so ``m`` micro-batches of ``B / m``
  train a different objective (fewer negatives) than one batch of ``B``: gradient accumulation does
  not reproduce it (GradCache, Gao et al. 2021, exists to avoid exactly that). Across data-parallel
  ranks the full matrix needs the embeddings all-gathered, as open_clip's ``gather_features``
  (``--gather-with-grad --local-loss``) does.
* **batch_norm**: every BatchNormalization, whatever its ``training_mode`` attribute: the file may
  be an inference export, but the model being planned is trained, and training normalises with the
  batch's statistics. Launchers compute them per data-parallel rank and micro-batch (DDP; only
  ``nn.SyncBatchNorm`` reduces them across ranks), which is what the op rule prices
  (:mod:`importers.op_rules.norm`: the batch dim splits with no collective).
* **indexed** (on the ONNX nodes, :func:`indexed_batch`): the dim the planner would scale as the
  batch is not a sample dim. A Gather/GatherElements/GatherND reads, or a ScatterElements/ScatterND
  writes, along an axis of that size with indices that come from a graph input which does not carry
  the dim: a graph neural network's nodes ``x[num_nodes, F]``, gathered and scattered by
  ``edge_index[2, num_edges]``. Splitting such a dim cuts one graph into pieces.

Not flagged: a ReduceMean/ReduceSum over the batch (the ordinary mean loss: gradient accumulation
and data parallelism reproduce it exactly), a MatMul that contracts the batch (rare in a forward
graph, and an einsum-dispatched MoE contracts its token dim the same way), and indexing by indices
computed from the samples themselves (an embedding lookup, an MoE dispatch, the last token's logits).
"""

from __future__ import annotations

import onnx

from planner.core.graph import BatchCoupling, Op, OpGraph

__all__ = ["batch_couplings", "indexed_batch"]

_GATHERS = frozenset({"Gather", "GatherElements", "GatherND"})
_SCATTERS = frozenset({"ScatterElements", "ScatterND", "Scatter"})
_SIZE_OPS = frozenset({"Shape", "Size", "Constant", "ConstantOfShape"})
"""Ops whose output holds sizes or constants, not data: neither a sample's value nor an index input's."""


def batch_couplings(graph: OpGraph) -> tuple[BatchCoupling, ...]:
    """The ``similarity`` and ``batch_norm`` ops of a coarse graph (module docstring), in graph order.

    Examples
    --------
    >>> from planner.core.graph import IterDim, TensorAccess
    >>> dims = (IterDim(name="m", size=8, is_batch=True), IterDim(name="n", size=8, is_batch=True),
    ...         IterDim(name="k", size=4, kind="reduction"))
    >>> op = Op(name="logits", kind="matmul", op_type="MatMul", dims=dims, flops=512.0,
    ...         inputs=(TensorAccess(tensor="a", axes=(("m",), ("k",))), TensorAccess(tensor="b", axes=(("n",), ("k",)))),
    ...         outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),))
    >>> [(c.op, c.kind) for c in batch_couplings(OpGraph(name="g", ops=(op,), tensors={}, edges=()))]
    [('logits', 'similarity')]
    """
    found: list[BatchCoupling] = []
    for op in graph.ops:
        if op.op_type == "BatchNormalization" or "BatchNormalization" in op.node_types:
            found.append(BatchCoupling(op=op.name, kind="batch_norm", reason="BatchNorm statistics over the batch"))
        elif op.kind == "matmul" and _batch_by_batch(op):
            found.append(BatchCoupling(
                op=op.name, kind="similarity",
                reason="batch x batch similarity, a contrastive loss's logits",
            ))  # fmt: skip
    return tuple(found)


def _batch_by_batch(op: Op) -> bool:
    """Whether two axes of one output are indexed by distinct batch dims (outer dim of each axis)."""
    batch = {d.name for d in op.dims if d.is_batch}
    for access in op.outputs:
        outer = {axis[0] for axis in access.axes if axis and axis[0] in batch}
        if len(outer) >= 2:
            return True
    return False


def indexed_batch(model: onnx.ModelProto, shapes: dict, *, batch_dim: str, batch: int) -> tuple[BatchCoupling, ...]:
    """The nodes that index across ``batch_dim`` with indices from an input without it (module docstring).

    ``shapes``: value name -> concrete shape at ``batch_dim = batch``. A value is a *sample* value when
    it derives from a graph input that carries ``batch_dim``, a *free* one when it derives only from
    inputs that do not (``edge_index``); sizes (Shape, Constant...) are neither. A gather is flagged
    when it reads a sample value along an axis of ``batch`` elements by free indices, a scatter when it
    writes such an axis by free indices with sample data or updates. ``()`` at batch 1 (no size to
    tell the dim by).

    Examples
    --------
    >>> from onnx import helper, TensorProto as T
    >>> nodes = [helper.make_node("Gather", ["x", "edges"], ["msg"], name="gather_src", axis=0)]
    >>> g = helper.make_graph(nodes, "gnn", [helper.make_tensor_value_info("x", T.FLOAT, ["nodes", 4]),
    ...                                      helper.make_tensor_value_info("edges", T.INT64, ["num_edges"])],
    ...                       [helper.make_tensor_value_info("msg", T.FLOAT, ["num_edges", 4])])
    >>> shapes = {"x": (10, 4), "edges": (30,), "msg": (30, 4)}
    >>> [(c.op, c.kind, c.dim) for c in indexed_batch(helper.make_model(g), shapes, batch_dim="nodes", batch=10)]
    [('gather_src', 'indexed', 'nodes')]
    """
    if batch <= 1:
        return ()
    sample, free = _lineage(model, batch_dim)
    found: list[BatchCoupling] = []
    for index, node in enumerate(model.graph.node):
        inputs = list(node.input) + [""] * 3
        data, indices, updates = inputs[0], inputs[1], inputs[2]
        if node.op_type not in _GATHERS | _SCATTERS or indices not in free:
            continue
        if node.op_type in _GATHERS and data not in sample:
            continue
        if node.op_type in _SCATTERS and data not in sample and updates not in sample:
            continue
        if batch not in [shapes.get(data, ())[a] for a in _indexed_axes(node, shapes.get(indices, ()), len(shapes.get(data, ())))]:
            continue
        name = node.name or f"{node.op_type}_{index}"
        verb = "reads" if node.op_type in _GATHERS else "writes"
        found.append(BatchCoupling(
            op=name, kind="indexed", dim=batch_dim,
            reason=f"{node.op_type} {verb} across '{batch_dim}' by indices from {_root(model, indices, free)}",
        ))  # fmt: skip
    return tuple(found)


def _lineage(model: onnx.ModelProto, batch_dim: str) -> tuple[set[str], dict[str, str]]:
    """``(sample values, free values -> the input they come from)`` in one topological pass."""
    weights = {t.name for t in model.graph.initializer}
    sample: set[str] = set()
    free: dict[str, str] = {}
    for info in model.graph.input:
        if info.name in weights or not info.type.HasField("tensor_type"):
            continue
        params = [d.dim_param for d in info.type.tensor_type.shape.dim]
        if batch_dim in params:
            sample.add(info.name)
        else:
            free[info.name] = info.name
    for node in model.graph.node:
        if node.op_type in _SIZE_OPS:
            continue
        if any(name in sample for name in node.input):
            sample.update(o for o in node.output if o)
            continue
        root = next((free[name] for name in node.input if name in free), None)
        if root is not None:
            free.update((o, root) for o in node.output if o)
    return sample, free


def _indexed_axes(node: onnx.NodeProto, index_shape: tuple[int, ...], rank: int) -> list[int]:
    """The axes of ``node``'s data that its indices address."""
    attrs = {a.name: onnx.helper.get_attribute_value(a) for a in node.attribute}
    if node.op_type in ("GatherND", "ScatterND"):
        first = int(attrs.get("batch_dims", 0))
        depth = int(index_shape[-1]) if index_shape else 0
        return [a for a in range(first, first + depth) if a < rank]
    axis = int(attrs.get("axis", 0))
    axis = axis + rank if axis < 0 else axis
    return [axis] if 0 <= axis < rank else []


def _root(model: onnx.ModelProto, value: str, free: dict[str, str]) -> str:
    """The graph input a free value comes from, with its declared shape (``edge_index[2, num_edges]``)."""
    name = free.get(value, value)
    for info in model.graph.input:
        if info.name == name and info.type.HasField("tensor_type"):
            dims = [d.dim_param or str(d.dim_value) for d in info.type.tensor_type.shape.dim]
            return f"{name}[{', '.join(dims)}]"
    return name
