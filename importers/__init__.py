"""Importers: an ONNX file -> a coarse :class:`~planner.core.graph.OpGraph`.

``import_model(path, dims)`` runs the whole pipeline: :func:`importers.onnx_load.load_onnx` (graph
only, no weights; files older than opset 13 converted by :func:`importers.legacy.modernize`, with
notes that become warnings) -> BatchNormalizations an inference export folded into convolutions
put back (:mod:`importers.batchnorm`) -> Ifs whose condition reads only shapes decided at the bound dims
(:mod:`importers.shape_if`) -> :func:`importers.shapes.resolve_shapes` (concrete shapes at the bound
dims; :mod:`importers.shape_facts` where a graph-only file's shape constants are gone) ->
per-node op rules (:mod:`importers.op_rules`) and coarsening (:mod:`importers.coarsen`, which
settles the parameters with :mod:`importers.param_evidence`: what the file proves, and the
warnings where it cannot) -> repeated blocks (:mod:`importers.blocks`).
"""

from __future__ import annotations

import hashlib
import os
import stat
import threading
from collections import Counter, OrderedDict
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Mapping

from planner.core.graph import OpGraph

if TYPE_CHECKING:
    import onnx

__all__ = ["CACHED_GRAPHS", "import_model", "batch_dim_name"]

CACHED_GRAPHS = 8
"""Op graphs :func:`import_model` keeps (least recently used dropped first), so a process that imports the
same file at the same dims again (``explain`` / ``compare`` of saved rows, each priced from its model; an
in-process caller planning one model several times) reads it once. A graph is frozen, and a few MB at most
for a graph-only file; the key is the file as it is on disk (:func:`_file_key`), so a rewritten file is
imported again."""

HASHED_BYTES = 64 << 20
"""Files up to this size are also keyed by their SHA-256 (~0.1 s at the bound), so a file rewritten in place
within the file system's timestamp granularity (a few ms) with the same size is still read again; a larger
one (inline weights) by its size, modification time and inode only."""

_GRAPHS: OrderedDict[tuple, OpGraph] = OrderedDict()
_GRAPHS_LOCK = threading.Lock()


def import_model(path: str | Path, dims: Mapping[str, int] | None = None) -> OpGraph:
    """Import an ONNX model as a coarse op graph at the given symbolic dim values (the same graph
    object again while the file is unchanged: :data:`CACHED_GRAPHS`).

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
    key = _file_key(Path(path), dims)
    with _GRAPHS_LOCK:
        graph = _GRAPHS.get(key) if key is not None else None
        if graph is not None:
            _GRAPHS.move_to_end(key)
            return graph
    graph = _import_model(Path(path), dims)
    if key is not None:
        with _GRAPHS_LOCK:
            _GRAPHS[key] = graph
            while len(_GRAPHS) > CACHED_GRAPHS:
                _GRAPHS.popitem(last=False)
    return graph


def _file_key(path: Path, dims: Mapping[str, int] | None) -> tuple | None:
    """What :func:`import_model`'s result depends on: the path as given (the graph's name and
    ``source_path``), the file it resolves to, its size, modification time (ns), inode and, up to
    :data:`HASHED_BYTES`, the SHA-256 of its bytes, its folder's modification time (an external-data
    file added or removed beside it: the importer reads small integer tensors from one that is there)
    and the dims. ``None`` (not cached) for anything but a readable regular file: a named pipe is read
    once, and a missing or unreadable file gets the import's own one-line error."""
    try:
        status = os.stat(path)
        if not stat.S_ISREG(status.st_mode):
            return None
        digest = hashlib.sha256(path.read_bytes()).hexdigest() if status.st_size <= HASHED_BYTES else ""
        resolved = os.path.realpath(path)
        folder = os.stat(os.path.dirname(resolved)).st_mtime_ns
    except (OSError, ValueError):
        return None
    bound = tuple(sorted((str(name), repr(size)) for name, size in dict(dims or {}).items()))
    return (str(path), resolved, status.st_size, status.st_mtime_ns, status.st_ino, digest, folder, bound)


def _import_model(path: Path, dims: Mapping[str, int] | None) -> OpGraph:
    """:func:`import_model` itself, uncached."""
    from importers.attention_masks import attention_biases, attention_masks, bias_past_table
    from importers.batch_coupling import batch_couplings, indexed_batch
    from importers.batchnorm import restore_folded_batchnorms
    from importers.blocks import find_blocks
    from importers.coarsen import build_op_graph
    from importers.expert_loop import expert_loop_note, traced_loops, with_rows
    from importers.frozen_positions import frozen_table_note
    from importers.onnx_facts import forget, remember
    from importers.onnx_load import load_onnx
    from importers.position_table import past_table_note
    from importers.shapes import RESHAPE_MISMATCH, resolve_shapes
    from importers.sliding_window import (UNREAD_BAND_NOTE, UNREAD_WINDOW_NOTE, band_unread_in, softmax_bands,
                                          softmax_windows, window_unread_in)
    from importers.unrolled_loop import unrolled_loop_error

    from importers.onnx_load import printable
    from planner.core.errors import ModelError, PlannerError

    notes: list[str] = []
    model, digest = load_onnx(path, notes)
    remember(path, digest, model)  # the readers of the file's nodes (importers.onnx_facts) share this parse
    file_op_types = Counter(node.op_type for node in model.graph.node)  # the file's, before restoring
    if window_unread_in(model):  # the mask is windowed, by how much the file does not say
        notes.append(UNREAD_WINDOW_NOTE)
    if band_unread_in(model):  # a two-sided window, by how much the file does not say: priced over every key
        notes.append(UNREAD_BAND_NOTE)
    restored = restore_folded_batchnorms(model)
    if restored:
        forget(path)  # no longer the file's graph: a reader loads the file again
        notes.append(
            f"{restored} BatchNormalization layer(s) the exporter folded into the preceding Conv/Gemm were "
            "restored as ops: training runs them (their time, memory and scale/shift parameters are counted)"
        )
    bindings = _bindings_with_ifs_decided(path, model, dims)
    shaped = resolve_shapes(model, bindings)
    loops, rows = traced_loops(shaped.model, shaped.shapes, shaped.dtypes)  # traced MoE loops (importers.expert_loop)
    note = expert_loop_note(loops)  # their exact parameter count
    notes += [note] if note else []
    if rows:  # their iterations at balanced routing's rows
        shaped = resolve_shapes(with_rows(model, rows), bindings)
    unrolled = unrolled_loop_error(shaped.model, shaped.shapes, shaped.dtypes, shaped.constants, shaped.dim_bindings)
    if unrolled:  # a loop traced at another length: the file does not compute at these dims (importers.unrolled_loop)
        raise ModelError(printable(f"{path.name}: {unrolled}"))
    past_bias = bias_past_table(shaped.model, shaped.shapes, shaped.dim_bindings)
    if past_bias:  # a constant position-bias table narrower than the keys: the model cannot run that long
        raise ModelError(printable(f"{path.name}: {past_bias}"))
    try:
        graph = build_op_graph(shaped, name=path.stem, source_sha256=digest, source_path=str(path))
    except PlannerError as exc:
        # A Reshape that changed the element count is the likelier cause of a later misfit: name it.
        cause = next((w for w in shaped.warnings if RESHAPE_MISMATCH in w), None)
        text = f"{exc}; first cause: {cause.split(RESHAPE_MISMATCH)[0]}{RESHAPE_MISMATCH}" if cause else str(exc)
        # Node names in a hostile file may hold newlines or control characters: keep it one line.
        exc.args = (printable(text),)
        raise
    # the sequence runs past a learned position table; a table shaped and used as those libraries freeze
    notes += [note for note in (past_table_note(graph), frozen_table_note(graph)) if note]
    batch_dim = _batch_dim_of(model)
    batch = shaped.dim_bindings.get(batch_dim, 0) if batch_dim is not None else 0
    indexed = indexed_batch(model, dict(shaped.shapes), batch_dim=batch_dim, batch=batch) if batch_dim else ()
    return replace(
        graph, blocks=find_blocks(graph), warnings=tuple(notes) + tuple(graph.warnings),
        raw_node_count=sum(file_op_types.values()), raw_op_types=dict(file_op_types),
        batch_coupled=batch_couplings(graph) + indexed, attention_masks=attention_masks(shaped.model, shaped.shapes),
        attention_biases=attention_biases(shaped.model, shaped.shapes),
        attention_windows=softmax_windows(shaped.model), attention_bands=softmax_bands(shaped.model),
    )


def _bindings_with_ifs_decided(path: Path, model: "onnx.ModelProto", dims: Mapping[str, int] | None) -> dict[str, int]:
    """The dim bindings to resolve ``model`` at, its Ifs whose condition reads only shapes (TorchScript's
    squeeze of an axis of unknown size) replaced by the branch they take there (:mod:`importers.shape_if`)."""
    from importers.legacy import default_dims
    from importers.onnx_facts import forget
    from importers.onnx_load import printable
    from importers.shape_if import decide_shape_ifs
    from planner.core.errors import ModelError

    # A converted file's batch of 1, made rebindable, keeps that 1 unless --dim sets it.
    bindings = default_dims(model) | dict(dims or {})
    try:
        if decide_shape_ifs(model, bindings):
            forget(path)  # no longer the file's graph: a reader loads the file again
    except ModelError as exc:
        exc.args = (printable(f"{path.name}: {exc}"),)
        raise
    return bindings


def batch_dim_name(path: str | Path) -> str | None:
    """The symbolic dim that sets the batch size of the model's inputs, or ``None`` when it is fixed.

    The same rule the importer marks batch dims by: a dim named like a batch (``batch``,
    ``batch_size``, ``N_batch``...), else the dim on axis 0 of the first input that has a named one
    there. ``None`` when no input has a named dim there (a batch written into the file as a number,
    or an unnamed dynamic axis), so the batch cannot be varied by ``--dim``.

    Examples
    --------
    >>> import tempfile, onnx
    >>> from onnx import helper, TensorProto as T
    >>> x = helper.make_tensor_value_info("x", T.FLOAT, ["N", 16])
    >>> y = helper.make_tensor_value_info("y", T.FLOAT, ["N", 16])
    >>> model = helper.make_model(helper.make_graph([helper.make_node("Relu", ["x"], ["y"])], "g", [x], [y]),
    ...                           opset_imports=[helper.make_opsetid("", 18)])
    >>> with tempfile.TemporaryDirectory() as d:
    ...     onnx.save(model, d + "/m.onnx")
    ...     batch_dim_name(d + "/m.onnx")
    'N'
    """
    from importers.onnx_facts import file_facts

    return _batch_dim_of(file_facts(path).model)


def _batch_dim_of(model: "onnx.ModelProto") -> str | None:
    """:func:`batch_dim_name` of a loaded model."""
    import re

    weights = {t.name for t in model.graph.initializer}
    shapes = [
        list(vi.type.tensor_type.shape.dim)
        for vi in model.graph.input
        if vi.name not in weights and vi.type.HasField("tensor_type") and vi.type.tensor_type.HasField("shape")
    ]
    for dims in shapes:
        for dim in dims:
            if dim.dim_param and re.search(r"batch", dim.dim_param, re.IGNORECASE) and re.fullmatch(r"\w+", dim.dim_param):
                return dim.dim_param
    for dims in shapes:
        if dims and dims[0].dim_param and re.fullmatch(r"\w+", dims[0].dim_param):
            return dims[0].dim_param
    return None
