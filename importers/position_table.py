r"""Learned absolute position tables, read from a model file: which tables they are and how many
tokens each can place.

A learned absolute position table (GPT-2's ``wpe``, BERT's ``position_embeddings``, OPT's and BART's
``embed_positions``) is an embedding whose row :math:`r` is looked up for the token at position
:math:`p = r - o`, :math:`o` the row of the first token. A table of :math:`R` rows therefore places at
most :math:`R - o` tokens: the lookup of a longer sequence reads past the table (PyTorch's
``nn.Embedding`` raises an index error), so a launcher that runs the user's own model cannot run it, and
one that builds the model from flags would train another (a longer table). That bound,
:attr:`PositionTable.max_tokens`, is what "the table's length" means here.

The rule (:func:`position_tables`). An embedding op (``kind == "embedding"``), or a ``GatherND`` of a
2-D parameter that addresses its rows (indices ``[..., 1]``: the dynamo exporter's ``weight[position_ids]``,
Whisper's decoder table, where TorchScript writes a ``Gather``), reads a learned absolute position table
when its indices are *positions*: values computed from the token positions alone, found by walking the
indices' producers in the file (:class:`_Walk`):

* a ``Range`` (``torch.arange``): first row its start;
* a ``CumSum`` of a mask (RoBERTa's ``create_position_ids_from_input_ids``, OPT's
  ``attention_mask.cumsum(1)``): first row 1 (0 when ``exclusive``);
* an integer constant counting up by one along its last axis, or one whose data is not in the file
  and whose name ends in ``position_ids`` (transformers' registered ``arange`` buffer): first row its
  first value (0);
* a graph input whose name says ``position`` (``position_ids``, ``cache_position``): first row 0;
* and, from positions: ``Add``/``Sub`` of a one-element constant (the offset: OPT's ``+ 2``,
  RoBERTa's ``+ padding_idx``), ``Mul`` by a mask (a value that is not positions: unpadded tokens
  keep theirs) or by the constant 1, ``Slice`` by a constant start (BERT's ``position_ids[:, :seq]``),
  and the views ``Cast``, ``Identity``, ``Unsqueeze``, ``Squeeze``, ``Reshape``, ``Expand``, ``Flatten``.

Anything else is not positions: token ids and token-type ids (a graph input, a constant of zeros, the
zero buffer RoBERTa gathers at positions), T5's and Swin's relative buckets (a ``Sub`` of two position
values, a constant that does not count up), so BERT's 2-row token-type table, T5's relative bias
tables, an encoder-decoder's decoder word lookup and DeBERTa's relative embeddings (not gathered) are
never taken. The table's width is not asked: the indices tell a position table from the others, and
RoFormer's frozen sinusoidal table, one head wide and looked up at ``arange`` positions, bounds the
sequence as a learned one does (transformers' ``RoFormerForMaskedLM`` raises ``IndexError`` one token
past ``max_position_embeddings``). A one-element constant whose data is not in the file (a graph-only
export saved with every initializer external) leaves the first row unread (``None``): the table's
rows are then the bound, the longest any first row allows, so only a sequence longer than the whole
table is refused.

:attr:`PositionTable.tokens` is the lookup's length in the graph at the bound dims (the last index
dim of the embedding op), or, where the indices slice a constant (BERT's registered ``position_ids``
buffer, ``[:, :seq]``, which shape inference cuts at the buffer's length), the sequence's: the bound size
of the last symbolic axis of the nearest graph input the indices are computed from; :attr:`PositionTable.dim`
the symbolic dim that binds it, read from the graph inputs the indices are computed from (``seq``; an
encoder-decoder's decoder table, ``tgt_seq``).
The answer is kept per reading of the file (:func:`importers.onnx_facts.per_reading`).
"""

from __future__ import annotations

import ast
import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import TensorProto, numpy_helper

from importers.onnx_facts import OnnxFacts, file_facts, per_reading
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph
from planner.core.memo import IdentityMemo

__all__ = ["PositionTable", "position_tables", "too_short", "shortfall", "refuse_past_table", "past_table_note"]

_VIEWS = frozenset({"Cast", "Identity", "Unsqueeze", "Squeeze", "Reshape", "Expand", "Flatten", "Tile"})
"""Ops whose output holds their first input's values, rearranged or broadcast."""

_LOOKUPS = frozenset({"Gather", "GatherND"})
"""Ops that look rows up: ``table[positions]`` is a ``Gather`` from the TorchScript exporter and a
``GatherND`` of the positions unsqueezed to ``[..., 1]`` from the dynamo one (Whisper's decoder table)."""

_INTEGER_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64, TensorProto.INT16, TensorProto.INT8,
                            TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64})

_MAX_HOPS = 64
"""Producers walked back from a lookup's indices (transformers' position ids: at most about 10)."""

_POSITION_INPUT = re.compile(r"pos", re.IGNORECASE)
"""A graph input whose name says position (``position_ids``, ``cache_position``, ``pos_ids``)."""


@dataclass(frozen=True, slots=True, kw_only=True)
class PositionTable:
    """A learned absolute position table and the lookup that reads it (module docstring)."""

    op: int
    """The embedding op (index in ``graph.ops``)."""
    table: str
    """The table's tensor (a parameter)."""
    rows: int
    """The table's rows."""
    first_row: int | None
    """The row of the first token (0: GPT-2, BERT; 2: OPT, RoBERTa); ``None``: a constant the file does
    not hold (counted as 0)."""
    tokens: int
    """Positions the model reads per sequence, at the graph's bound dims: the lookup's length, or the
    sequence's where the lookup slices a buffer of fixed length (BERT's ``position_ids[:, :seq]``, which
    shape inference cuts at the buffer's length while the model itself fails past it)."""
    dim: str
    """The symbolic dim binding :attr:`tokens` (``seq``), as ``--dim`` takes it."""
    module: str = ""
    """The module that looks the table up, where the dynamo exporter records it and :attr:`table` is a name it
    made (``val_182``: ``model.decoder.embed_positions``); ``""`` otherwise."""

    @property
    def named(self) -> str:
        """The table's name for messages: the tensor, with its module when the tensor's name is the exporter's."""
        return f"{self.table} of {self.module}" if self.module else self.table

    @property
    def max_tokens(self) -> int:
        """The longest sequence the table places: its rows less the first token's row."""
        return self.rows - (self.first_row or 0)

    @property
    def fits(self) -> bool:
        """The lookup stays inside the table."""
        return self.tokens <= self.max_tokens


def position_tables(graph: OpGraph) -> tuple[PositionTable, ...]:
    """The learned absolute position tables of ``graph`` (module docstring), in op order; none when the
    graph has no readable source file.

    Examples
    --------
    >>> from onnx import TensorProto as T, helper
    >>> nodes = [helper.make_node("Range", ["zero", "n", "one"], ["pos"]),
    ...          helper.make_node("Add", ["pos", "two"], ["rows"]),  # OPT's offset
    ...          helper.make_node("Gather", ["table", "rows"], ["out"], name="lookup")]
    >>> consts = [helper.make_tensor(n, T.INT64, [], [v]) for n, v in (("zero", 0), ("one", 1), ("two", 2))]
    >>> table = helper.make_tensor("table", T.FLOAT, [10, 4], [0.0] * 40)
    >>> graph = helper.make_graph(nodes, "g", [helper.make_tensor_value_info("n", T.INT64, [])],
    ...                           [helper.make_tensor_value_info("out", T.FLOAT, [None, 4])], [table, *consts])
    >>> _gather_positions(OnnxFacts(model=helper.make_model(graph)))["lookup"].first_row
    2
    """
    return _TABLES.get((graph,), lambda: _tables(graph))


_TABLES: IdentityMemo[tuple[PositionTable, ...]] = IdentityMemo(size=64)
"""Per graph: every launcher's families of every stage ask again."""


def _tables(graph: OpGraph) -> tuple[PositionTable, ...]:
    """:func:`position_tables`, computed."""
    if not graph.source_path:
        return ()
    try:
        found = _file_positions(graph.source_path, getattr(graph, "source_sha256", ""))
    except Exception:  # noqa: BLE001 - a file gone or changed since the import: nothing is read
        return ()
    tables = []
    for index, op in enumerate(graph.ops):
        reading = next((found[n] for n in op.onnx_nodes if n in found), None) if _looks_rows_up(op) else None
        shape = graph.tensors[op.inputs[0].tensor].shape if op.inputs else ()
        tokens = _lookup_length(op)
        if reading is None or len(shape) != 2 or tokens is None:
            continue
        if reading.sliced:  # the slice's end is the sequence's length, cut at the buffer's in the graph
            tokens = max(tokens, _input_length(graph, reading.inputs) or 0)
        tables.append(PositionTable(op=index, table=op.inputs[0].tensor, rows=shape[0], first_row=reading.first_row,
                                    tokens=tokens, dim=_dim_name(graph, reading.inputs, tokens),
                                    module="" if "." in op.inputs[0].tensor else reading.module))
    return tuple(tables)


def too_short(tables: tuple[PositionTable, ...]) -> PositionTable | None:
    """The first table the graph's sequence runs past, ``None`` when every lookup fits."""
    return next((t for t in tables if not t.fits), None)


def shortfall(table: PositionTable, consequence: str = "") -> str:
    """The clause a launcher refuses ``table`` with, naming its rows and the fix; ``consequence`` (", and
    ...") says what the launcher would do besides.

    >>> table = PositionTable(op=0, table="wpe", rows=1024, first_row=0, tokens=2048, dim="seq")
    >>> shortfall(table)
    'its learned position table has 1024 rows and the sequence is 2048 tokens, so the model cannot run that long (its position lookup reads past the table); plan with --dim seq=1024 or less, or re-export the model with a longer table'
    """
    offset = f", from row {table.first_row}," if table.first_row else ""
    return (f"its learned position table has {table.rows} rows and the sequence is {table.tokens} tokens, so the "
            f"model cannot run that long (its position lookup{offset} reads past the table){consequence}; plan with "
            f"--dim {table.dim}={table.max_tokens} or less, or re-export the model with a longer table")


def refuse_past_table(graph: OpGraph, launcher: str) -> None:
    """Raise the one-line refusal of a launcher that trains the model as exported (DeepSpeed, PyTorch
    DTensor) when the graph's sequence runs past a learned position table.

    Raises
    ------
    UnsupportedExport
        ``"<launcher> trains the model as exported, and its learned position table has ..."``
        (:func:`shortfall`).
    """
    table = too_short(position_tables(graph))
    if table is not None:
        raise UnsupportedExport(f"{launcher} trains the model as exported, and {shortfall(table)}")


def past_table_note(graph: OpGraph) -> str | None:
    """The importer's warning when the bound sequence runs past a learned position table (read now, not
    kept: the import's graph is replaced by its final one), ``None`` when every lookup fits. The plan is
    priced as the model re-exported with a longer table would be; the launchers that train the model as
    exported or build it from flags refuse it."""
    table = too_short(_tables(graph))
    if table is None:
        return None
    return (f"the sequence ({table.dim}={table.tokens}) runs past the learned position table {table.named} "
            f"({table.rows} rows, {table.max_tokens} tokens): the model as exported cannot run it, and the plan is "
            f"priced as if re-exported with a longer table (DeepSpeed, DTensor, Megatron-LM and Mesh-TF refuse it); plan with "
            f"--dim {table.dim}={table.max_tokens} or less to train the file's model")


# ----------------------------------------------------------------------------------------------
# The file's lookups


@dataclass(frozen=True, slots=True)
class _Reading:
    first_row: int | None
    """Row of the first token (``None``: unread)."""
    inputs: tuple[str, ...] = ()
    """Graph inputs the indices are computed from (directly or through their shapes)."""
    sliced: bool = False
    """The indices slice a constant (transformers' registered ``position_ids`` buffer)."""
    module: str = ""
    """The lookup's module, from the dynamo exporter's node metadata (:func:`_module_of`)."""


_NOT = object()
""":meth:`_Walk.positions`' answer for a value that is not positions."""


@per_reading
def _file_positions(facts: OnnxFacts) -> dict[str, _Reading]:
    """:func:`_gather_positions` of one reading of a file."""
    return _gather_positions(facts)


def _gather_positions(facts: OnnxFacts) -> dict[str, _Reading]:
    """``{node name: reading}`` of the file's ``Gather`` nodes (axis 0) and ``GatherND`` nodes (no batch
    dims) of a 2-D initializer (through ``Cast``/``Identity``) whose indices are positions."""
    walk = _Walk(facts)
    found = {}
    for node in facts.nodes:
        if (node.op_type not in _LOOKUPS or len(node.input) < 2 or any(a.name in ("axis", "batch_dims") and a.i
                                                                        for a in node.attribute)
                or len(getattr(walk.table(node.input[0]), "dims", ())) != 2):
            continue
        first = walk.positions(node.input[1])
        if first is not _NOT:
            found[node.name] = _Reading(first, _reached_inputs(facts, node.input[1], walk.inputs),
                                        sliced=walk.slices_constant(node.input[1]), module=_module_of(node))
    return found


class _Walk:
    """The indices' producers walked back (module docstring), each value answered once."""

    def __init__(self, facts: OnnxFacts) -> None:
        self.facts = facts
        self.inputs = {i.name for i in facts.model.graph.input}
        self.initializers = {t.name: t for t in facts.initializers}
        self.answers: dict[str, object] = {}

    def table(self, value: str) -> onnx.TensorProto | None:
        """The initializer ``value`` is, or is a ``Cast``/``Identity`` of."""
        for _ in range(_MAX_HOPS):
            node = self.facts.producer.get(value)
            if node is None or node.op_type not in ("Cast", "Identity"):
                return self.initializers.get(value) if node is None else None
            value = node.input[0]
        return None

    def slices_constant(self, value: str) -> bool:
        """Whether the positions ``value`` holds are a ``Slice`` of a constant (a buffer of fixed length),
        followed back through the same nodes as :meth:`positions`."""
        for _ in range(_MAX_HOPS):
            node = self.facts.producer.get(value)
            if node is None or not node.input:
                return False
            if node.op_type == "Slice":
                data = self.facts.producer.get(node.input[0])
                return self.table(node.input[0]) is not None or (data is not None and data.op_type == "Constant")
            if node.op_type in ("Add", "Sub", "Mul") and len(node.input) == 2:
                value = next((a for a in node.input if self.positions(a) is not _NOT), node.input[0])
            else:
                value = node.input[0]
        return False

    def positions(self, value: str, hops: int = _MAX_HOPS) -> object:
        """The first token's row if ``value`` holds positions (``None``: unread), else :data:`_NOT`."""
        if value not in self.answers:
            self.answers[value] = self._positions(value, hops) if hops > 0 else _NOT
        return self.answers[value]

    def _positions(self, value: str, hops: int) -> object:
        facts, node = self.facts, self.facts.producer.get(value)
        if node is None:
            if value in self.inputs:
                return 0 if _POSITION_INPUT.search(value) else _NOT
            return _constant_positions(self.initializers.get(value), value)
        kind, args = node.op_type, list(node.input)
        if kind == "Constant":
            return _counting(next((a.t for a in node.attribute if a.name == "value"), None))
        if kind == "Range":
            return _NOT if _scalar(facts, args[2]) not in (None, 1) else _scalar(facts, args[0])
        if kind == "CumSum":
            attrs = {a.name: a.i for a in node.attribute}
            return _NOT if attrs.get("reverse") else (0 if attrs.get("exclusive") else 1)
        if kind in _VIEWS:
            return self.positions(args[0], hops - 1)
        if kind == "Slice":  # transformers slice the last axis: position_ids[:, start:start + seq]
            first = self.positions(args[0], hops - 1)
            steps = _scalar(facts, args[4]) if len(args) > 4 and args[4] else 1
            return _NOT if first is _NOT or steps not in (None, 1) else _plus(first, _scalar(facts, args[1]))
        if kind in ("Add", "Sub", "Mul") and len(args) == 2:
            return self._arithmetic(kind, args, hops)
        return _NOT

    def _arithmetic(self, kind: str, args: list[str], hops: int) -> object:
        """Positions plus or minus a one-element constant, or times a mask or 1."""
        sides = [self.positions(a, hops - 1) for a in args]
        if (sides[0] is _NOT) == (sides[1] is _NOT) or (kind == "Sub" and sides[0] is _NOT):
            return _NOT  # neither is positions, or both (T5's relative distances: memory - context)
        first, other = (sides[0], args[1]) if sides[0] is not _NOT else (sides[1], args[0])
        scalar = self.facts.scalars.get(other)
        if kind == "Mul":  # by a mask: unpadded tokens keep their positions; by a constant: only 1 does
            factor = scalar.value if scalar is not None else 1.0
            return first if factor == 1.0 else None if factor is None else _NOT
        if scalar is None:
            return _NOT
        shift = _scalar(self.facts, other)
        return _plus(first, None if shift is None else (-shift if kind == "Sub" else shift))


_NAME_SCOPES = "pkg.torch.onnx.name_scopes"
"""Node metadata where torch's dynamo exporter writes the module path (a list, the node itself last)."""


def _module_of(node: onnx.NodeProto) -> str:
    """The module a dynamo-exported node belongs to (``model.decoder.embed_positions``), ``""`` unrecorded.

    >>> node = onnx.helper.make_node("GatherND", ["w", "i"], ["o"])
    >>> _ = node.metadata_props.add(key=_NAME_SCOPES, value="['', 'model', 'model.decoder.embed_positions', 'index']")
    >>> _module_of(node)
    'model.decoder.embed_positions'
    """
    for prop in node.metadata_props:
        if prop.key == _NAME_SCOPES:
            try:
                scopes = ast.literal_eval(prop.value)
            except (ValueError, SyntaxError):
                return ""
            return str(scopes[-2]) if isinstance(scopes, list) and len(scopes) > 1 else ""
    return ""


def _plus(first: object, shift: int | None) -> object:
    """``first + shift``, unread when either is."""
    return None if first is None or shift is None else first + shift


def _scalar(facts: OnnxFacts, value: str) -> int | None:
    """A one-element integer constant's value (``None``: not in the file, or not a whole number)."""
    scalar = facts.scalars.get(value)
    if scalar is None or scalar.value is None or scalar.value != int(scalar.value):
        return None
    return int(scalar.value)


def _constant_positions(tensor: onnx.TensorProto | None, name: str) -> object:
    """An initializer that counts up by one along its last axis (its first value), or one whose data is
    not in the file named ``*position_ids`` (transformers' ``arange`` buffer: 0); else :data:`_NOT`."""
    if tensor is None:
        return _NOT
    if tensor.data_location == TensorProto.EXTERNAL or tensor.external_data:
        return 0 if tensor.data_type in _INTEGER_TYPES and name.endswith("position_ids") else _NOT
    return _counting(tensor)


def _counting(tensor: onnx.TensorProto | None) -> object:
    """The first value of an integer tensor of two or more values that count up by one along its last
    axis (and agree across the others), else :data:`_NOT`."""
    if tensor is None or tensor.data_type not in _INTEGER_TYPES or not tensor.dims or tensor.dims[-1] < 2:
        return _NOT
    values = numpy_helper.to_array(tensor).reshape(-1, tensor.dims[-1])
    start = int(values[0, 0])
    return start if np.array_equal(values, np.broadcast_to(np.arange(start, start + values.shape[1]), values.shape)) else _NOT


def _reached_inputs(facts: OnnxFacts, value: str, inputs: set[str]) -> tuple[str, ...]:
    """The graph inputs ``value`` is computed from (through ``Shape`` too), nearest first."""
    found, queue, seen = [], [value], set()
    while queue and len(seen) < 4 * _MAX_HOPS:
        name = queue.pop(0)
        if name in seen:
            continue
        seen.add(name)
        if name in inputs:
            found.append(name)
        node = facts.producer.get(name)
        queue += [i for i in node.input if i] if node is not None else []
    return tuple(found)


# ----------------------------------------------------------------------------------------------
# The graph's side


def _looks_rows_up(op: Op) -> bool:
    """An embedding op, or a ``GatherND`` that addresses the table's rows only: its second axis passes
    through to the output (indices ``[..., 1]``; a depth of 2 would pick single elements)."""
    if op.kind == "embedding":
        return True
    table = op.inputs[0].axes if op.inputs else ()
    return "GatherND" in op.node_types and len(table) == 2 and not table[0] and bool(table[1])


def _lookup_length(op: Op) -> int | None:
    """The size of the embedding op's last index dim: its output's dims that do not index the table."""
    if not op.inputs or not op.outputs:
        return None
    table = {d for axis in op.inputs[0].axes for d in axis}
    index = [d for axis in op.outputs[0].axes for d in axis if d not in table]
    return op.dim(index[-1]).size if index else None


def _declared_dims(graph: OpGraph) -> dict[str, list[str]]:
    """Graph input name -> its axes' symbolic names (``""`` for a number), from the file."""
    try:
        facts = file_facts(graph.source_path, getattr(graph, "source_sha256", ""))
    except Exception:  # noqa: BLE001 - the file was read a moment ago (position_tables)
        return {}
    return {i.name: [d.dim_param for d in i.type.tensor_type.shape.dim] for i in facts.model.graph.input}


def _input_length(graph: OpGraph, inputs: tuple[str, ...]) -> int | None:
    """The bound size of the last symbolic axis of the nearest of ``inputs`` that has one (``input_ids[batch,
    seq]``: ``seq``'s), ``None`` when none is bound."""
    declared = _declared_dims(graph)
    for name in inputs:
        bound = [graph.dim_bindings[p] for p in declared.get(name, []) if p and p in graph.dim_bindings]
        if bound:
            return bound[-1]
    return None


def _dim_name(graph: OpGraph, inputs: tuple[str, ...], tokens: int) -> str:
    """The symbolic dim of size ``tokens`` on the graph inputs the indices come from (the last such axis of
    the nearest input: ``input_ids[batch, seq]`` gives ``seq`` even when the batch is as large), else one
    bound to ``tokens``, else ``seq``."""
    declared = _declared_dims(graph)
    for name in inputs:
        names = [p for p in declared.get(name, []) if p and graph.dim_bindings.get(p) == tokens]
        if names:
            return names[-1]
    return next((n for n, v in graph.dim_bindings.items() if v == tokens and n != "batch"), "seq")
