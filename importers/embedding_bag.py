r"""``nn.EmbeddingBag`` as one op: the ONNX ``Loop`` both torch exporters write for it, recognised.

Neither torch exporter has an ONNX form of ``torch.nn.functional.embedding_bag`` with offsets, so
both write a ``Loop`` over the bags (torch 2.x, ``torch/onnx/_internal/torchscript_exporter/
symbolic_opset10.py``'s ``embedding_bag`` and onnxscript's ``aten_embedding_bag``), which the
loader would refuse as control flow. The loop is a fixed pattern, rewritten here, before the loader's
control-flow check, into one node ``EmbeddingBagSum`` / ``EmbeddingBagMean`` / ``EmbeddingBagMax`` of
the domain :data:`DOMAIN` with torch's inputs ``(table [V, D], indices [nnz], offsets [B])``: bag
``b`` is ``indices[offsets[b]:offsets[b + 1]]`` (the last one ends at ``nnz``) and the output is
``[B, D]``. The node reads the offsets themselves, so the batch axis they carry reaches the bags.

* **TorchScript** (``dynamo=False``): ``Loop(M = B, cond)`` with no carried state and one scan output;
  its body gathers ``offsets'[i]`` and ``offsets'[1:][i]`` (``offsets' = Concat(offsets, [nnz])``),
  slices the indices, ``Gather(table, slice)`` and reduces axis 0 (``ReduceSum`` / ``ReduceMean`` /
  ``ReduceMax``).
* **torch.export** (``dynamo=True``): ``Gather(table, indices)`` times the per-sample weights (the
  exporter's ones when none are passed) outside the loop; the loop (``SequenceEmpty`` carried,
  ``ConcatFromSequence(axis=0)`` after it) slices the gathered rows between ``offsets'[i]`` and
  ``offsets'[i + 1]`` and reduces them (inside ``If`` branches for empty and last bags).

Both are matched by structure, not by names or constant values: a graph-only file keeps neither
(``tests/data/dlrm_cases``). Only what the pattern proves is rewritten; anything else (per-sample
weights passed by the caller, ``include_last_offset=True``, another loop) is left as it is and refused
by the loader.

The node is a call of a model-local function (``model.functions``) whose body computes the same
values with standard ops (a membership matrix ``[B, nnz]`` times the gathered rows), so ONNX's own
shape inference gives its output shape and onnx's reference evaluator runs it; the op rule
(:func:`importers.op_rules.gather.embedding_bag_rule`) prices it as the lookup it is, not as that
matrix product.
"""

from __future__ import annotations

from dataclasses import dataclass

import onnx
from onnx import AttributeProto, TensorProto, helper

__all__ = ["DOMAIN", "EMBEDDING_BAG_OPS", "recognise_embedding_bags"]

DOMAIN = "planner.importers"
"""Domain of the nodes (and model-local functions) this module writes."""

EMBEDDING_BAG_OPS = {"sum": "EmbeddingBagSum", "mean": "EmbeddingBagMean", "max": "EmbeddingBagMax"}
"""``nn.EmbeddingBag``'s ``mode`` -> op type of the node that stands for it."""

_FUNCTION_OPSET = 18
_MIN_OPSET = 13
_FLOAT_TYPES = frozenset({TensorProto.FLOAT, TensorProto.FLOAT16, TensorProto.BFLOAT16, TensorProto.DOUBLE})
_INT_TYPES = frozenset({TensorProto.INT32, TensorProto.INT64})
_PASS_THROUGH = frozenset({"Identity", "Cast"})


@dataclass(frozen=True, slots=True)
class _Bag:
    """One recognised EmbeddingBag: what the new node reads and writes, and what it replaces."""

    loop: int
    """Index of the Loop node."""
    mode: str
    table: str
    indices: str
    offsets: str
    """torch's offsets (``B`` entries), which the loop's ``offsets' = Concat(offsets, [nnz])`` extends."""
    output: str
    replaced: frozenset[int]
    """Nodes the new node stands for (the Loop and, for torch.export, the lookup before it and the
    ConcatFromSequence after it)."""


def recognise_embedding_bags(model: onnx.ModelProto) -> int:
    """Rewrite every EmbeddingBag ``Loop`` of ``model``'s main graph into one node (in place).

    Returns
    -------
    int
        How many loops were rewritten. Nodes that only fed the replaced ones (the trip count, the
        exporter's ones for the per-sample weights) are removed with them, and so are initializers
        nothing reads any more.

    Examples
    --------
    >>> m = onnx.ModelProto()
    >>> recognise_embedding_bags(m)
    0
    """
    graph = model.graph
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=0)
    # the functions' bodies need opset 13 (Squeeze's axes as an input); older files keep the loop
    if opset < _MIN_OPSET or not any(node.op_type == "Loop" for node in graph.node):
        return 0
    index = _GraphIndex(graph)
    bags = [bag for i, node in enumerate(graph.node) if node.op_type == "Loop" and (bag := _safe_match(index, i)) is not None]
    if not bags:
        return 0
    replaced: set[int] = set()
    new_nodes: dict[int, onnx.NodeProto] = {}
    for bag in bags:
        if replaced & bag.replaced:
            continue
        replaced |= bag.replaced
        loop = graph.node[bag.loop]
        node = helper.make_node(
            EMBEDDING_BAG_OPS[bag.mode], [bag.table, bag.indices, bag.offsets], [bag.output],
            name=loop.name or f"embedding_bag_{bag.loop}", domain=DOMAIN,
        )
        node.metadata_props.extend(loop.metadata_props)
        new_nodes[bag.loop] = node
    kept = [new_nodes.get(i, node) for i, node in enumerate(graph.node) if i not in replaced or i in new_nodes]
    del graph.node[:]
    graph.node.extend(kept)
    _prune_dead(graph)
    _add_functions(model, {EMBEDDING_BAG_OPS[b.mode] for b in bags})
    return len(new_nodes)


class _GraphIndex:
    """Producers and consumers of the main graph's values (subgraph reads included)."""

    def __init__(self, graph: onnx.GraphProto) -> None:
        self.graph = graph
        self.producer = {o: i for i, node in enumerate(graph.node) for o in node.output if o}
        self.consumers: dict[str, list[int]] = {}
        for i, node in enumerate(graph.node):
            for name in set(node.input) | _outer_reads(node):
                self.consumers.setdefault(name, []).append(i)
        self.initializers = {t.name: t for t in graph.initializer}
        self.outputs = {o.name for o in graph.output}

    def node_of(self, name: str) -> onnx.NodeProto | None:
        index = self.producer.get(name)
        return None if index is None else self.graph.node[index]

    def only_consumer(self, name: str) -> int | None:
        """The one node reading ``name``, when exactly one does and it is not a graph output."""
        readers = self.consumers.get(name, [])
        return readers[0] if len(readers) == 1 and name not in self.outputs else None


def _subgraphs(node: onnx.NodeProto) -> list[onnx.GraphProto]:
    graphs = []
    for attr in node.attribute:
        if attr.type == AttributeProto.GRAPH:
            graphs.append(attr.g)
        elif attr.type == AttributeProto.GRAPHS:
            graphs.extend(attr.graphs)
    return graphs


def _all_body_nodes(graph: onnx.GraphProto) -> list[onnx.NodeProto]:
    """Nodes of ``graph`` and of every subgraph nested in it."""
    nodes = []
    for node in graph.node:
        nodes.append(node)
        for sub in _subgraphs(node):
            nodes.extend(_all_body_nodes(sub))
    return nodes


def _outer_reads(node: onnx.NodeProto) -> set[str]:
    """Names the node's subgraphs read from the enclosing scope (ONNX's implicit inputs)."""
    reads: set[str] = set()
    for sub in _subgraphs(node):
        local = {v.name for v in sub.input} | {t.name for t in sub.initializer}
        for inner in _all_body_nodes(sub):
            local.update(inner.output)
            for s in _subgraphs(inner):
                local.update(v.name for v in s.input)
                local.update(t.name for t in s.initializer)
        for inner in _all_body_nodes(sub):
            reads.update(n for n in inner.input if n and n not in local)
        reads.update(o.name for o in sub.output if o.name not in local)
    return reads


def _mode(body: onnx.GraphProto) -> str | None:
    """``sum`` / ``mean`` / ``max`` from the reductions of the body (mean's last bag may be a sum
    divided by the count: any ``ReduceMean`` makes it a mean); ``None`` without a reduction."""
    kinds = {n.op_type for n in _all_body_nodes(body)}
    for op_type, mode in (("ReduceMax", "max"), ("ReduceMean", "mean"), ("ReduceSum", "sum")):
        if op_type in kinds:
            return mode
    return None


def _is_float_table(index: _GraphIndex, name: str) -> bool:
    tensor = index.initializers.get(name)
    return tensor is not None and tensor.data_type in _FLOAT_TYPES and len(tensor.dims) == 2


def _safe_match(index: _GraphIndex, loop_index: int) -> _Bag | None:
    """:func:`_match`, ``None`` for a node too malformed to read (a hostile file's Loop must reach
    the loader's one-line refusal, not fail here)."""
    try:
        return _match(index, loop_index)
    except (IndexError, KeyError, AttributeError, ValueError):
        return None


def _match(index: _GraphIndex, loop_index: int) -> _Bag | None:
    """The EmbeddingBag a Loop node computes, or ``None`` when it is not one."""
    loop = index.graph.node[loop_index]
    bodies = _subgraphs(loop)
    if len(bodies) != 1:
        return None
    body = bodies[0]
    mode = _mode(body)
    if mode is None:
        return None
    if len(loop.input) == 2 and len(loop.output) == 1:
        return _match_scripted(index, loop_index, body, mode)
    if len(loop.input) == 4 and len(loop.output) == 2:
        return _match_exported(index, loop_index, body, mode)
    return None


def _match_scripted(index: _GraphIndex, loop_index: int, body: onnx.GraphProto, mode: str) -> _Bag | None:
    """TorchScript's form: the body gathers the table rows of ``indices[offsets'[i]:ends[i]]``."""
    loop = index.graph.node[loop_index]
    if not body.input:
        return None
    iteration = body.input[0].name
    produced = {o: n for n in body.node for o in n.output}
    reduce = [n for n in body.node if n.op_type in ("ReduceSum", "ReduceMean", "ReduceMax")]
    if len(reduce) != 1 or len(body.output) != 2 or body.output[1].name != reduce[0].output[0]:
        return None
    gather = produced.get(reduce[0].input[0])
    if gather is None or gather.op_type != "Gather" or not _is_float_table(index, gather.input[0]):
        return None
    cut = produced.get(gather.input[1])
    if cut is None or cut.op_type != "Slice" or len(cut.input) < 3 or cut.input[0] in produced:
        return None
    start = _through(produced, cut.input[1], ("Unsqueeze", "Cast"))
    if start is None or start.op_type != "Gather" or start.input[1] != iteration or start.input[0] in produced:
        return None
    extended = start.input[0]
    end = _through(produced, cut.input[2], ("Unsqueeze", "Cast"))
    ends = index.node_of(end.input[0]) if end is not None and end.op_type == "Gather" else None
    # the ends are offsets'[1:]: a Slice of the same array
    if ends is None or ends.op_type != "Slice" or ends.input[0] != extended or end.input[1] != iteration:
        return None
    offsets = _offsets_of(index, extended)
    if offsets is None:
        return None
    return _Bag(loop=loop_index, mode=mode, table=gather.input[0], indices=cut.input[0], offsets=offsets,
                output=loop.output[0], replaced=frozenset({loop_index}))


def _through(produced: dict[str, onnx.NodeProto], name: str, skip: tuple[str, ...]) -> onnx.NodeProto | None:
    """The node producing ``name``, looking through ``skip`` ops (an Unsqueeze of the gathered start)."""
    node = produced.get(name)
    while node is not None and node.op_type in skip:
        node = produced.get(node.input[0])
    return node


def _match_exported(index: _GraphIndex, loop_index: int, body: onnx.GraphProto, mode: str) -> _Bag | None:
    """torch.export's form: the body slices rows gathered before the loop between two offsets."""
    graph = index.graph
    loop = graph.node[loop_index]
    # two carried values (the sequence of pooled rows, from SequenceEmpty, and the bag counter), in
    # either order; only the sequence is read after the loop
    slots = [k for k in (0, 1) if (n := index.node_of(loop.input[2 + k])) is not None and n.op_type == "SequenceEmpty"]
    if len(slots) != 1 or index.consumers.get(loop.output[1 - slots[0]]):
        return None
    concat_index = index.only_consumer(loop.output[slots[0]])
    if concat_index is None:
        return None
    concat = graph.node[concat_index]
    if concat.op_type != "ConcatFromSequence" or _int_attr(concat, "axis", 0) != 0 or _int_attr(concat, "new_axis", 0):
        return None
    reads = _outer_reads(loop)
    sliced = {n.input[0] for n in _all_body_nodes(body) if n.op_type == "Slice" and n.input[0] in reads}
    rows = [s for s in sliced if s in index.producer and _float_rows(index, s)]
    offsets = [s for s in sliced if s not in rows]
    if len(rows) != 1 or len(offsets) != 1 or (offsets := [_offsets_of(index, offsets[0])])[0] is None:
        return None
    lookup = _lookup_of(index, rows[0])
    if lookup is None:
        return None
    gather_index, chain = lookup
    gather = graph.node[gather_index]
    replaced = {loop_index, concat_index, gather_index, *chain}
    # the gathered rows must feed nothing but this bag (the exporter's dead Identity aside)
    for i in replaced - {loop_index, concat_index}:
        for out in graph.node[i].output:
            for reader in index.consumers.get(out, []):
                if reader not in replaced and any(o in index.consumers or o in index.outputs for o in graph.node[reader].output):
                    return None
    return _Bag(loop=loop_index, mode=mode, table=gather.input[0], indices=gather.input[1], offsets=offsets[0],
                output=concat.output[0], replaced=frozenset(replaced))


def _offsets_of(index: _GraphIndex, extended: str) -> str | None:
    """torch's offsets when ``extended`` is ``Concat(offsets, [nnz])`` (``nnz`` read from a Shape:
    ``include_last_offset=False``, the default), else ``None``."""
    node = index.node_of(extended)
    if node is None or node.op_type != "Concat" or len(node.input) != 2:
        return None
    tail = index.node_of(node.input[1])
    while tail is not None and tail.op_type in ("Unsqueeze", "Gather", "Reshape", "Cast", "Identity"):
        tail = index.node_of(tail.input[0])
    return node.input[0] if tail is not None and tail.op_type in ("Shape", "Size") else None


def _int_attr(node: onnx.NodeProto, name: str, default: int) -> int:
    for attr in node.attribute:
        if attr.name == name:
            return int(attr.i)
    return default


def _float_rows(index: _GraphIndex, name: str) -> bool:
    """Whether ``name`` traces back (through Identity/Cast/Mul) to a Gather of a float table."""
    return _lookup_of(index, name) is not None


def _lookup_of(index: _GraphIndex, name: str) -> tuple[int, list[int]] | None:
    """``(Gather node, the nodes between it and name)`` for the rows a bag reduces, or ``None``.

    A ``Mul`` on the way is the per-sample weights: accepted only when its other operand comes from
    constants and shapes alone (the exporter's ones for ``per_sample_weights=None``); a caller's
    weights would change the values, which this op does not model.
    """
    chain: list[int] = []
    while True:
        i = index.producer.get(name)
        if i is None:
            return None
        node = index.graph.node[i]
        if node.op_type == "Gather" and _is_float_table(index, node.input[0]) and _int_attr(node, "axis", 0) == 0:
            return i, chain
        if node.op_type in _PASS_THROUGH:
            chain.append(i)
            name = node.input[0]
            continue
        if node.op_type == "Mul" and len(node.input) == 2:
            lookup = [p for p in node.input if _reaches_gather(index, p)]
            if len(lookup) != 1:
                return None
            other = node.input[1] if lookup[0] == node.input[0] else node.input[0]
            if not _constant_only(index, other):
                return None
            chain.append(i)
            name = lookup[0]
            continue
        return None


def _reaches_gather(index: _GraphIndex, name: str) -> bool:
    node = index.node_of(name)
    while node is not None and node.op_type in _PASS_THROUGH:
        node = index.node_of(node.input[0])
    return node is not None and node.op_type == "Gather" and _is_float_table(index, node.input[0])


def _constant_only(index: _GraphIndex, name: str, depth: int = 0) -> bool:
    """Whether ``name`` depends on no graph input except through its shape (``Shape``/``Size``)."""
    if depth > 16:
        return False
    if name in index.initializers:
        return True
    node = index.node_of(name)
    if node is None:
        return False  # a graph input
    if node.op_type in ("Shape", "Size", "Constant"):
        return True
    return all(not n or _constant_only(index, n, depth + 1) for n in node.input)


def _prune_dead(graph: onnx.GraphProto) -> None:
    """Remove nodes whose outputs nothing reads (to a fixed point), and initializers nothing reads.

    Run only after a rewrite, so what the replaced loops alone read (their trip counts, the
    exporter's ones) goes with them.
    """
    outputs = {o.name for o in graph.output}
    while True:
        read: set[str] = set(outputs)
        for node in graph.node:
            read.update(node.input)
            read.update(_outer_reads(node))
        dead = [i for i, node in enumerate(graph.node) if not any(o and o in read for o in node.output)]
        if not dead:
            break
        for i in reversed(dead):
            del graph.node[i]
    read = set(outputs)
    for node in graph.node:
        read.update(node.input)
        read.update(_outer_reads(node))
    kept = [t for t in graph.initializer if t.name in read]
    if len(kept) != len(graph.initializer):
        inputs = [v for v in graph.input if v.name in read or v.name not in {t.name for t in graph.initializer}]
        del graph.initializer[:]
        graph.initializer.extend(kept)
        del graph.input[:]
        graph.input.extend(inputs)


def _add_functions(model: onnx.ModelProto, op_types: set[str]) -> None:
    """The model-local functions defining the new ops, and their domain's opset import.

    A function's body is written at the model's own default opset (ONNX requires the two to
    agree), which the loader has brought to at least 13.
    """
    if not any(o.domain == DOMAIN for o in model.opset_import):
        model.opset_import.append(helper.make_opsetid(DOMAIN, 1))
    opset = max((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), default=_FUNCTION_OPSET)
    have = {(f.domain, f.name) for f in model.functions}
    for op_type in sorted(op_types):
        if (DOMAIN, op_type) not in have:
            model.functions.append(_function(op_type, opset))


def _function(op_type: str, opset: int) -> onnx.FunctionProto:
    """The body of one op: bag membership ``[B, nnz]`` (``offsets[b] <= j < ends[b]``, ``ends`` the
    next offset, ``nnz`` for the last bag)
    then a sum (a product with the gathered rows), a mean (that sum over the bag's size, 0 for an
    empty bag as torch gives) or a max (0 for an empty bag)."""
    common = """
        rows = Gather <axis = 0> (table, indices)
        zero = Constant <value = int64 {0}> ()
        one = Constant <value = int64 {1}> ()
        first = Constant <value = int64[1] {0}> ()
        second = Constant <value = int64[1] {1}> ()
        end = Constant <value = int64[1] {9223372036854775807}> ()
        count_1d = Shape (indices)
        count = Squeeze (count_1d, first)
        positions = Range (zero, count, one)
        starts_1d = Cast <to = 7> (offsets)
        later = Slice (starts_1d, second, end)
        ends_1d = Concat <axis = 0> (later, count_1d)
        starts = Unsqueeze (starts_1d, second)
        ends = Unsqueeze (ends_1d, second)
        after = GreaterOrEqual (positions, starts)
        before = Less (positions, ends)
        member = And (after, before)
        weights = CastLike (member, table)
    """
    tails = {
        "EmbeddingBagSum": "out = MatMul (weights, rows)",
        "EmbeddingBagMean": """
            total = MatMul (weights, rows)
            size = ReduceSum <keepdims = 1> (weights, second)
            unit = CastLike (one, table)
            divisor = Max (size, unit)
            out = Div (total, divisor)
        """,
        "EmbeddingBagMax": """
            third = Constant <value = int64[1] {2}> ()
            mask = Unsqueeze (member, third)
            spread = Unsqueeze (rows, first)
            lowest = Constant <value = float {-inf}> ()
            floor = CastLike (lowest, table)
            picked = Where (mask, spread, floor)
            best = {reduce_max}
            size = ReduceSum <keepdims = 1> (weights, second)
            nothing = Constant <value = float {0}> ()
            zero_f = CastLike (nothing, table)
            filled = Greater (size, zero_f)
            out = Where (filled, best, zero_f)
        """,
    }
    # ReduceMax takes its axes as an input from opset 18 on, as an attribute before
    reduce_max = ("ReduceMax <keepdims = 0> (picked, second)" if opset >= 18
                  else "ReduceMax <keepdims = 0, axes = [1]> (picked)")
    text = (
        f'<domain: "{DOMAIN}", opset_import: ["": {opset}]>\n'
        f"{op_type} (table, indices, offsets) => (out) {{\n{common}\n"
        f"{tails[op_type].replace('{reduce_max}', reduce_max)}\n}}"
    )
    return onnx.parser.parse_function(text)
