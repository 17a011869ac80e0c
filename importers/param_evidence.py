r"""Which initializers are parameters: the evidence a file gives beyond an initializer's use as a weight.

:func:`importers.coarsen.build_op_graph` first takes as parameters the float initializers read
where only weights sit (a MatMul's operand, an embedding table, a norm scale, a per-channel bias).
Exports change parameters on their way into a file, and :func:`weigh_parameter_evidence` settles
what that rule cannot (issue 15: exact counts, and no parameter dropped on a guess):

* **The export's own record** (proof). torch's dynamo exporter writes, in each initializer's
  ``value_info`` metadata, what ``torch.export``'s graph signature made of it
  (``pkg.torch.export.graph_signature.InputSpec.kind``): ``BUFFER`` initializers (Gemma's
  ``embed_scale``, BART's ``final_logits_bias``) are not parameters whatever their use, and
  ``PARAMETER`` ones are, however they are read (DeBERTa's ``rel_embeddings`` is normalised before
  the projections read it). Constants its optimizer made (``val_N``, or named after an FX node:
  ``unsqueeze``, ``permute_9``) carry no record.
* **Constants folded from no parameter are not parameters** (proof). The dynamo exporter's optimizer
  (onnxscript) records in a folded initializer's ``value_info`` metadata the values it was folded from
  (``pkg.onnxscript.optimizer.folded_from``): a transposed weight ``val_N`` names the parameter
  (``['encoder.layer.0.query.weight']``); DeBERTa's all-ones input mask of a static-shape export,
  ``unsqueeze`` [2, 16, 1] multiplying the embeddings, names only FX values (``['ones', 'val_0', ...]``).
  One whose sources, followed through the file's other records, name no parameter (recorded as one,
  or a module path: a name with a dot, the file not saying it is a buffer or a lifted constant) is
  dropped, with a warning naming it where the weight rule had taken it (a parameter of the root
  module, which has no dot, read only through a folded copy would be taken for a constant there).
* **A named table that is normalised before use** (DeBERTa's relative embeddings in a TorchScript
  export): a state-dict-named float initializer of rank >= 2 read as the data of a normalisation.
* **Position tables**: an anonymous float table (rank >= 2, two axes over 1) added to the
  activations along their last axis, directly (TorchScript folds ``weight[:seq]`` of a fixed-length
  encoder into an ``onnx::Add_N`` constant: Whisper's encoder positions) or after a Gather/Slice
  with constant indices (Whisper's decoder positions, ``val_N`` in a dynamo export). Counted, with a
  warning that a fixed sinusoidal table registered as a buffer would not be a parameter. A
  ``[heads, head_dim]`` table added to a projection just split into heads is a per-head attention
  bias (Funnel's ``r_w_bias``, folded with the scores' scale), counted and said to be one. Each kind
  is one warning line: the count, the parameters and the first names.
* **Attention biases and masks are not parameters**: a constant whose sum with the activations
  reaches a Softmax through elementwise or layout ops only, without a record saying it is a
  parameter. When it is an exporter-made constant of 1 KiB or more it may be a parameter *folded*
  with its indices (Swin's relative position bias tables gathered into per-window biases); its
  elements are reported, never counted: the table's own size is not in the file. A table that
  reaches the scores through a constant-index Gather (the same Swin table where the optimizer left
  it unfolded) is the parameter itself, and is counted, with a warning.
* **Rotary sin/cos tables are not parameters**: an exporter-made table (no record in a dynamo
  export: GPT-J's ``embed_positions``, a non-persistent buffer, is ``val_N`` there) gathered by
  position whose rows only ever multiply activations (split into sin and cos halves,
  repeated, then ``q * cos + rotate(q) * sin``): the weight rule takes it for an embedding table;
  it is dropped, with a warning naming it. An embedding's rows are added, normalised or projected,
  never only multiplied into activations.
* **Biases added to the output by an exporter-made constant** (BART's ``final_logits_bias``, a
  registered buffer, folded into ``onnx::Add_N`` by TorchScript; SigLIP's one-element ``logit_bias``, a
  parameter, added to the logits before their transpose) are counted with a warning that they may be
  non-trainable buffers: the file cannot tell.
* **Parameters folded out of the file** (:func:`lost_parameter_warnings`): an uncounted float constant whose
  ``folded_from`` record names values that may be parameters (as above) and that no initializer holds, nor any
  counted constant was folded from (DiffLlama's per-layer ``lambda_full`` scalar, computed from four
  ``lambda_*`` vectors of ``head_dim`` elements each): their elements are not counted, and no file records
  their sizes, so a warning names them. torch.export's lifted constants (``lifted_tensor_N``) are not parameters.
* **Convolutions fused with an eval-mode BatchNormalization** (TorchScript writes both the weight
  and the bias as ``onnx::Conv_N`` constants): counted as they are (weight and bias), with a warning
  that the BatchNorm's scale and shift (``2 C``) then appear as one bias (``C``), naming the elements the count
  then lacks (``C`` per Conv, the weight's output channels; ``2 C`` if the Conv had a bias of its own).

Every warning names the export options that keep the parameters (a training-mode export without
constant folding), so a user who needs the exact count knows how to get it.
"""

from __future__ import annotations

import ast
import math
import re
from dataclasses import dataclass
from typing import Callable, Mapping, Sequence

import networkx as nx
import onnx
from onnx import helper

from importers.onnx_protos import _limited

__all__ = ["FOLDED_FROM_KEY", "SIGNATURE_KIND_KEY", "ParameterEvidence", "lost_parameter_warnings", "signature_kinds",
           "untrained_bias_warning", "weigh_parameter_evidence"]

SIGNATURE_KIND_KEY = "pkg.torch.export.graph_signature.InputSpec.kind"
"""``value_info`` metadata key where torch's dynamo exporter records an initializer's role."""
FOLDED_FROM_KEY = "pkg.onnxscript.optimizer.folded_from"
"""``value_info`` metadata key where the dynamo exporter's optimizer records what a folded value came from
(a Python list of value names, onnxscript 0.5+)."""

_FLOAT_TYPES = frozenset({onnx.TensorProto.FLOAT, onnx.TensorProto.FLOAT16, onnx.TensorProto.DOUBLE,
                          onnx.TensorProto.BFLOAT16})
# Ops through which a tensor stays the same values (layout only); followed from input 0.
_LAYOUT_OPS = frozenset({"Transpose", "Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze",
                         "Flatten", "Expand"})
# Ops between an attention bias and its Softmax (scores scaled, masked, reshaped per window).
_TO_SOFTMAX_OPS = _LAYOUT_OPS | {"Add", "Sub", "Mul", "Div", "Where"}
_SOFTMAX_HOPS = 6
_NORM_OPS = frozenset({"LayerNormalization", "SimplifiedLayerNormalization", "RMSNormalization",
                       "GroupNormalization", "InstanceNormalization"})
# Ops that read a table by position: (op type, input position of the table).
_INDEXING = frozenset({("Gather", 0), ("GatherND", 0), ("Slice", 0)})
# Ops that cut or join a rotary table's rows into its sin and cos halves (followed from input 0).
_ROW_SPLITS = frozenset({"Split", "Slice", "Concat", "Tile"})
_CONSTANT_ARITHMETIC = frozenset({"Add", "Sub", "Mul", "Div", "Where"})
_CONSTANT_HOPS = 4
_FOLDED_MIN_BYTES = 1024
_TS_CONSTANT = re.compile(r"^onnx::")
_TS_CONV_CONSTANT = re.compile(r"^onnx::Conv_")
_NAMED_LIMIT = 3


@dataclass(frozen=True, slots=True, kw_only=True)
class ParameterEvidence:
    """What the file says beyond the weight-use rule: initializers to add, to drop, and why."""

    added: frozenset[str]
    """Initializers that are parameters though no weight rule took them."""
    dropped: frozenset[str]
    """Initializers a weight rule took that are not parameters (buffers, attention biases)."""
    warnings: tuple[str, ...]
    """One line each: what was decided on less than proof, with the export option that decides it."""
    spoken: frozenset[str] = frozenset()
    """Exporter-made constants the warnings speak for, listed or not (rotary tables, attention biases folded
    with their index): :func:`lost_parameter_warnings` does not name them again."""


@dataclass(frozen=True, slots=True, kw_only=True)
class _Graph:
    """The graph facts the rules read (built once by the caller, shared with the weight rule)."""

    nodes: Sequence[onnx.NodeProto]
    consumers: Mapping[str, Sequence[tuple[int, int]]]
    status: Mapping[str, str]
    shapes: Mapping[str, tuple[int, ...]]
    outputs: frozenset[str]


def signature_kinds(graph: onnx.GraphProto) -> dict[str, str]:
    """Initializer name -> torch.export's kind for it (``PARAMETER``, ``BUFFER``, ...), when recorded.

    Examples
    --------
    >>> from onnx import helper
    >>> vi = helper.make_tensor_value_info("w", onnx.TensorProto.FLOAT, [2])
    >>> helper.set_metadata_props(vi, {SIGNATURE_KIND_KEY: "PARAMETER"})
    >>> signature_kinds(helper.make_graph([], "g", [], [], value_info=[vi]))
    {'w': 'PARAMETER'}
    """
    kinds: dict[str, str] = {}
    for info in (*graph.input, *graph.value_info):
        for prop in info.metadata_props:
            if prop.key == SIGNATURE_KIND_KEY:
                kinds[info.name] = prop.value
    return kinds


def weigh_parameter_evidence(
    *,
    graph: onnx.GraphProto,
    initializers: Mapping[str, onnx.TensorProto],
    parameters: frozenset[str],
    nodes: Sequence[onnx.NodeProto],
    consumers: Mapping[str, Sequence[tuple[int, int]]],
    status: Mapping[str, str],
    shapes: Mapping[str, tuple[int, ...]],
    is_named: Callable[[str], bool],
) -> ParameterEvidence:
    """Settle the parameters the weight-use rule left open (see the module docstring): the names to
    add and drop, and the warnings to show.

    Parameters
    ----------
    graph
        The model's graph (its ``value_info`` metadata and outputs are read).
    initializers
        Name -> initializer (values may be stripped: only names, dims and types are read).
    parameters
        What the weight-use rule took.
    nodes, consumers, status, shapes
        Nodes in topological order; value -> ``(node index, input position)`` readers; value ->
        ``"act"`` (computed from the inputs at run time) or ``"const"``; value -> shape (elements
        per axis), for the values whose shape is known.
    is_named
        Whether a name reads like a state-dict parameter name (not anonymous, not a buffer's).
    """
    facts = _Graph(nodes=nodes, consumers=consumers, status=status, shapes=shapes,
                   outputs=frozenset(o.name for o in graph.output))
    kinds = signature_kinds(graph)
    recorded = bool(kinds)

    def exporter_made(name: str) -> bool:
        # With a record, a name without one was made by the exporter's optimizer (a folded value).
        return not is_named(name) or (recorded and name not in kinds)

    added: set[str] = set()
    dropped: set[str] = set()
    warnings: list[str] = []
    folded: list[tuple[str, list[int]]] = []
    spoken: set[str] = set()
    tables: list[tuple[str, list[int]]] = []  # exporter-made position tables, counted
    head_biases: list[tuple[str, list[int]]] = []  # exporter-made per-head attention biases, counted
    unfed = _folded_from_no_parameter(graph, kinds)
    for name, tensor in initializers.items():
        if tensor.data_type not in _FLOAT_TYPES:
            continue
        dims = [int(d) for d in tensor.dims]
        kind = kinds.get(name)
        if kind == "BUFFER" or name in unfed:  # the exporter's records: a buffer, or folded from no parameter
            dropped.add(name)
            continue
        if kind == "PARAMETER":
            added.add(name)
            continue
        counted = name in parameters
        if not exporter_made(name):
            if not counted and len(dims) >= 2 and _normalised(facts, name):
                added.add(name)
            elif counted and len(dims) == 2 and dims[0] == 1 and _output_bias(facts, name):  # [1, V]: not a Linear's
                warnings.append(_output_buffer_warning(name, dims, made=False))
            continue
        if counted and _rotary_table(facts, name):
            dropped.add(name)
            spoken.add(name)
            warnings.append(_rotary_warning(name, dims))
            continue
        if _attention_bias(facts, name):
            if _read_by_position(facts, name, dims):
                # The table itself, gathered by a constant index (Swin's relative position bias
                # table where the optimizer did not fold it): a parameter, as torch counts it.
                added.add(name)
                warnings.append(
                    f"'{name}' {dims} is gathered by a constant index and added to attention scores, so "
                    f"it is counted as a relative position bias table ({math.prod(dims):,} parameters)"
                )
                continue
            if counted:
                dropped.add(name)
            # Small masks are not worth a word; one the weight rule had taken always is.
            if counted or math.prod(dims) * _itemsize(tensor) >= _FOLDED_MIN_BYTES:
                folded.append((name, dims))
                spoken.add(name)
            continue
        if not counted and _position_table(facts, name, dims):
            added.add(name)
            (head_biases if _per_head_bias(facts, name, dims) else tables).append((name, dims))
        elif _TS_CONSTANT.match(name) and _output_bias(facts, name) and (counted or dims):  # rank 0: a literal
            added.add(name)
            warnings.append(_output_buffer_warning(name, dims, made=True))
    warnings += _added_tables_warnings(tables, head_biases)
    warnings += [_folded_warning(folded)] if folded else []
    warnings += _unfed_warning(initializers, sorted(unfed & parameters), _folded_records(graph))
    warnings += _fused_conv_warning(_fused_convs(facts, initializers, parameters), initializers)
    warnings += _normed_conv_warnings(facts, initializers, parameters)
    warnings += _folded_norm_warnings(initializers, parameters, _folded_records(graph))
    return ParameterEvidence(added=frozenset(added - parameters), dropped=frozenset(dropped & parameters),
                             warnings=tuple(warnings), spoken=frozenset(spoken))


def _fused_conv_warning(fused: Sequence[str], initializers: Mapping[str, onnx.TensorProto]) -> list[str]:
    """The warning for Convs that read a weight and a bias the exporter made (none when ``fused`` is empty), with the
    elements the count then lacks: a BatchNorm's scale and shift (``2 C``) folded into one bias (``C``) leave out
    ``C`` per Conv, its output channels (the weight's first dim), when the Conv had no bias of its own (torchvision's
    and transformers' ResNets, EfficientNet, SegFormer's decode head: their counts fall short by exactly this sum), and
    ``2 C`` when it had one.

    >>> w = onnx.TensorProto(name="onnx::Conv_7", dims=[64, 32, 1, 1])
    >>> line = _fused_conv_warning(["onnx::Conv_7"], {"onnx::Conv_7": w})[0]
    >>> "the count is short by 64 elements (C per Conv, 128 if" in line
    True
    """
    if not fused:
        return []
    channels = sum(int(initializers[name].dims[0]) for name in fused)
    return [f"{len(fused)} Conv(s) read a weight and a bias the exporter made ('{fused[0]}', ...): each may "
            "be a Conv fused with an eval-mode BatchNormalization, whose scale and shift (2 C) the file "
            f"then holds as one bias (C); if so, the count is short by {channels:,} elements (C per Conv, "
            f"{2 * channels:,} if the Convs had biases of their own); export with training=TrainingMode.TRAINING, "
            "do_constant_folding=False to count them"]


def _itemsize(tensor: onnx.TensorProto) -> int:
    """Bytes per element (bfloat16 has no numpy type: 2)."""
    return 2 if tensor.data_type == onnx.TensorProto.BFLOAT16 else helper.tensor_dtype_to_np_dtype(tensor.data_type).itemsize


def _through_layout(facts: _Graph, name: str) -> list[tuple[int, int, str]]:
    """``(node, input position, value read)`` for every reader of ``name`` past its layout ops."""
    found: list[tuple[int, int, str]] = []
    stack, seen = [name], {name}
    while stack:
        value = stack.pop()
        for index, position in facts.consumers.get(value, ()):
            node = facts.nodes[index]
            if node.op_type in _LAYOUT_OPS and position == 0:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
            else:
                found.append((index, position, value))
    return found


def _runtime_partner(facts: _Graph, index: int, position: int) -> bool:
    node = facts.nodes[index]
    return any(facts.status.get(i) == "act" for p, i in enumerate(node.input) if i and p != position)


def _normalised(facts: _Graph, name: str) -> bool:
    """Read as the data (input 0) of a normalisation: a table normalised before use."""
    return any(facts.nodes[i].op_type in _NORM_OPS and p == 0 for i, p, _ in _through_layout(facts, name))


def _reaches_softmax(facts: _Graph, value: str) -> bool:
    frontier, seen = [value], {value}
    for _ in range(_SOFTMAX_HOPS):
        following: list[str] = []
        for current in frontier:
            for index, _position in facts.consumers.get(current, ()):
                node = facts.nodes[index]
                if node.op_type == "Softmax":
                    return True
                if node.op_type in _TO_SOFTMAX_OPS:
                    following.extend(o for o in node.output if o and o not in seen)
        seen.update(following)
        frontier = following
    return False


def _additions(facts: _Graph, name: str) -> list[tuple[int, int, str, bool]]:
    """Adds joining ``name`` to a runtime value: ``(node, position, value read, read by position)``.

    Followed through layout ops, constant-index Gathers/Slices (a table read by position: the last
    flag), arithmetic with other constants only (Swin adds its shift mask to the bias before the
    scores), and a Concat of constants or a Resize (DINOv2's position table, cut by TorchScript into
    its class row and its patch grid, the grid interpolated to the image and the two joined again).
    """
    found = []
    frontier, seen = [(name, False)], {name}
    for _ in range(_CONSTANT_HOPS):
        following: list[tuple[str, bool]] = []
        for value, indexed in frontier:
            for index, position, read in _through_layout(facts, value):
                node = facts.nodes[index]
                runtime = _runtime_partner(facts, index, position)
                if node.op_type == "Add" and runtime:
                    found.append((index, position, read, indexed))
                elif not runtime and ((node.op_type, position) in _INDEXING or node.op_type in _CONSTANT_ARITHMETIC
                                      or node.op_type == "Concat" or (node.op_type, position) == ("Resize", 0)):
                    by_position = indexed or (node.op_type, position) in _INDEXING
                    following.extend((o, by_position) for o in node.output if o and o not in seen)
        seen.update(o for o, _ in following)
        frontier = following
    return found


def _rotary_table(facts: _Graph, name: str) -> bool:
    """Gathered by position, and the rows reach only Muls with an activation (sin/cos).

    The positions may be constants once the dims are bound (``arange(seq)``), as a learned position
    table's are; what tells the two apart is the use: a position table's rows are added.

    The rows are followed through layout ops, Split, Slice and Concat (the sin and cos halves,
    repeated per pair of channels).
    """
    gathers = _through_layout(facts, name)
    if not gathers or any((facts.nodes[i].op_type, p) not in _INDEXING or facts.nodes[i].op_type == "Slice"
                          for i, p, _ in gathers):
        return False
    frontier = [o for i, _, _ in gathers for o in facts.nodes[i].output if o]
    seen, muls = set(frontier), 0
    while frontier:
        value = frontier.pop()
        for index, position in facts.consumers.get(value, ()):
            node = facts.nodes[index]
            if node.op_type == "Mul" and _runtime_partner(facts, index, position):
                muls += 1
            elif (node.op_type in _LAYOUT_OPS or node.op_type in _ROW_SPLITS) and position == 0:
                following = [o for o in node.output if o and o not in seen]
                seen.update(following)
                frontier += following
            else:
                return False
    return muls > 0


def _rotary_warning(name: str, dims: list[int]) -> str:
    return (f"'{name}' {dims}, a constant the exporter made, is gathered by position and its rows only "
            f"multiply activations (a rotary sin/cos table, as GPT-J's embed_positions buffer), so it is "
            f"not counted ({math.prod(dims):,} elements)")


def _attention_bias(facts: _Graph, name: str) -> bool:
    """Added to activations whose sum reaches a Softmax: a mask or an attention bias."""
    additions = _additions(facts, name)
    return bool(additions) and all(_reaches_softmax(facts, facts.nodes[i].output[0]) for i, *_ in additions)


def _read_by_position(facts: _Graph, name: str, dims: list[int]) -> bool:
    """A table of two axes or more that reaches every sum through a constant-index Gather/Slice."""
    additions = _additions(facts, name)
    return sum(1 for d in dims if d > 1) >= 2 and bool(additions) and all(a[3] for a in additions)


def _position_table(facts: _Graph, name: str, dims: list[int]) -> bool:
    """A table of two axes or more added along the activations' last axis, shared by the samples.

    Either read by position (a Gather or Slice with constant indices) or broadcast by the sum over
    an axis of the activations (right-aligned), as a position table is over the batch; a constant of
    the activations' full shape added as it is (a mask) is not one.
    """
    if sum(1 for d in dims if d > 1) < 2:
        return False
    additions = _additions(facts, name)
    if not additions:
        return False
    for index, _position, read, by_position in additions:
        out = facts.shapes.get(facts.nodes[index].output[0])
        shape = facts.shapes.get(read, tuple(dims) if read == name else None)
        if not out or not shape or out[-1] != shape[-1]:
            return False
        aligned = (1,) * (len(out) - len(shape)) + tuple(shape)
        if not by_position and (len(aligned) != len(out) or 1 not in aligned):
            return False
    return True


def _per_head_bias(facts: _Graph, name: str, dims: list[int]) -> bool:
    """A ``[heads, head_dim]`` table added to a projection just split into heads: each Add's other
    operand comes, through Muls and Divs by constants (the scores' 1/sqrt(head_dim) scale), from a
    Reshape whose last two axes are the table's and whose input's last axis is their product. Funnel's
    ``r_w_bias`` (``q_head * scale + r_w_bias * scale`` before the scores), which TorchScript folds
    with the scale into an anonymous constant; a position table is added before any split into heads."""
    additions = _additions(facts, name)
    if len(dims) != 2 or not additions:
        return False
    producers = {output: index for index, node in enumerate(facts.nodes) for output in node.output}
    for index, position, _read, by_position in additions:
        node = facts.nodes[index]
        if by_position or len(node.input) != 2:
            return False
        value = node.input[1 - position]
        for _ in range(_CONSTANT_HOPS):
            source = facts.nodes[producers[value]] if value in producers else None
            if source is None or source.op_type not in ("Reshape", "Mul", "Div"):
                return False
            if source.op_type == "Reshape":
                break
            runtime = [v for v in source.input if facts.status.get(v) == "act"]
            if len(runtime) != 1:
                return False
            value = runtime[0]
        else:
            return False
        split, whole = facts.shapes.get(source.output[0]), facts.shapes.get(source.input[0])
        if not split or not whole or list(split[-2:]) != dims or whole[-1] != dims[0] * dims[1]:
            return False
    return True


def _added_tables_warnings(tables: Sequence[tuple[str, list[int]]],
                           head_biases: Sequence[tuple[str, list[int]]]) -> list[str]:
    """One warning for the exporter-made position tables counted, one for the per-head attention
    biases (:func:`_per_head_bias`): a count, the parameters, and the first names."""
    warnings = []
    if tables:
        what = ("is added to the activations by position, so it is counted as a position-embedding table"
                if len(tables) == 1 else f"({len(tables)} tables) are added to the activations by position, so "
                "they are counted as position-embedding tables")
        warnings.append(f"{_first_names(tables)} {what} ({_elements(tables):,} parameters); a fixed (sinusoidal) "
                        "table registered as a buffer would not be a parameter")
    if head_biases:
        what = "is" if len(head_biases) == 1 else f"({len(head_biases)} tables) are"
        warnings.append(f"{_first_names(head_biases)} {what} [heads, head_dim], added to a projection split into "
                        "heads: per-head attention biases (Funnel's r_w_bias, r_r_bias and r_s_bias, which TorchScript "
                        f"folds with the scores' scale), not position tables; counted as parameters ({_elements(head_biases):,} parameters)")
    return warnings


def _first_names(named: Sequence[tuple[str, list[int]]], shown: int = 3) -> str:
    """``'a' [4, 32], 'b' [4, 32], 'c' [4, 32], ...``: the first ``shown`` names and their dims."""
    return ", ".join(f"'{name}' {dims}" for name, dims in named[:shown]) + (", ..." if len(named) > shown else "")


def _elements(named: Sequence[tuple[str, list[int]]]) -> int:
    return sum(math.prod(dims) for _name, dims in named)


def _output_buffer_warning(name: str, dims: list[int], *, made: bool) -> str:
    """The warning on a counted tensor added to a graph output that may be a buffer: BART's, Marian's and
    Pegasus' ``final_logits_bias`` (``[1, V]`` zeros transformers never trains), which TorchScript writes as an
    initializer like a parameter, under its own name or, folded, as ``onnx::Add_N`` (``made``). A learned
    ``nn.Linear`` bias is ``[V]``, so only a ``[1, V]`` named one is warned."""
    what = "a constant the exporter made and added to the output" if made else "a named [1, N] tensor added to the output"
    return (f"'{name}' {dims}, {what}, may be a non-trainable buffer (BART's, Marian's and Pegasus' final_logits_bias "
            f"is one; SigLIP's logit_bias is a parameter); it is counted ({math.prod(dims):,} parameters): if it is a "
            "buffer, the true count is that much lower (export with dynamo, which records buffers, to decide)")


def _output_bias(facts: _Graph, name: str) -> bool:
    """Only ever added to a runtime value, and the sum is a graph output, directly or through layout ops (SigLIP's
    ``logits_per_image + logit_bias``, transposed into ``logits_per_text``): a bias or offset of the output (BART's
    ``final_logits_bias``, SigLIP's one-element ``logit_bias``), a parameter or a buffer. An uncounted exporter-made
    one is counted when it has a rank (a module's tensor; a rank-0 constant may be a literal of the code)."""
    uses = _through_layout(facts, name)
    return bool(uses) and all(
        facts.nodes[i].op_type == "Add" and _runtime_partner(facts, i, p)
        and _is_output_by_layout(facts, facts.nodes[i].output[0])
        for i, p, _ in uses
    )


def _is_output_by_layout(facts: _Graph, value: str) -> bool:
    """``value`` is a graph output, or layout ops alone turn it into one (and it is read nowhere else)."""
    if value in facts.outputs:
        return True
    readers = facts.consumers.get(value, ())
    return bool(readers) and all(facts.nodes[i].op_type in _LAYOUT_OPS and p == 0
                                 and _is_output_by_layout(facts, facts.nodes[i].output[0]) for i, p in readers)


def _fused_convs(facts: _Graph, initializers: Mapping[str, onnx.TensorProto], parameters: frozenset[str]) -> list[str]:
    """Names of Conv weights that are TorchScript-made constants read with a TorchScript-made bias."""
    found = []
    for node in facts.nodes:
        if node.op_type != "Conv" or len(node.input) < 3:
            continue
        weight, bias = node.input[1], node.input[2]
        if (weight in parameters and bias in initializers and _TS_CONV_CONSTANT.match(weight)
                and _TS_CONV_CONSTANT.match(bias)):
            found.append(weight)
    return found


def _normed_conv_warnings(facts: _Graph, initializers: Mapping[str, onnx.TensorProto],
                          parameters: frozenset[str]) -> list[str]:
    """Warnings for Convs whose weight the TorchScript exporter made (``onnx::Conv_N``) while their bias is the
    module's own, state-dict named: the weight was computed from the module's parameters at export, as
    ``torch.nn.utils.weight_norm``'s ``g * v / ||v||`` (Wav2Vec2's positional conv, ``weight_g`` and ``weight_v``),
    which leaves ``v``'s shape in the file and ``g`` (one element per kernel tap for ``dim=2``, per output
    channel for ``dim=0``) out of the count. A Conv fused with a BatchNormalization has both made by the
    exporter (:func:`_fused_convs`). A depthwise conv (``group`` = output channels) is left out: the exporter
    also writes Mamba-2's causal conv weight so (``tests/data/mamba2_cases``, counted exactly), and a weight
    norm there would go unwarned."""
    out = []
    for node in facts.nodes:
        if node.op_type != "Conv" or len(node.input) < 3:
            continue
        weight, bias = node.input[1], node.input[2]
        group = next((a.i for a in node.attribute if a.name == "group"), 1)
        depthwise = weight in initializers and group > 1 and group == int(initializers[weight].dims[0])
        if weight in parameters and _TS_CONV_CONSTANT.match(weight) and bias in parameters and "." in bias \
                and not _TS_CONSTANT.match(bias) and not depthwise:
            dims = [int(d) for d in initializers[weight].dims]
            module = bias.rsplit(".", 1)[0]
            out.append(
                f"Conv weight '{weight}' {dims} was computed by the exporter while its bias '{bias}' is the module's "
                f"own: it may be a weight norm's g * v / ||v|| (Wav2Vec2's positional conv), counted as v "
                f"({math.prod(dims):,}); its magnitude g ('{module}.weight_g', or '{module}.parametrizations.weight.original0' "
                f"in torch's newer weight_norm) is then not in the file nor the count "
                f"({dims[-1]} elements for weight_norm(dim=2), {dims[0]} for dim=0); export with dynamo to count it"
            )
    return out


def _folded_from_no_parameter(graph: onnx.GraphProto, kinds: Mapping[str, str]) -> frozenset[str]:
    """Values whose :data:`FOLDED_FROM_KEY` record names no parameter, followed through the records of
    the values it names (module docstring): a name recorded as a ``PARAMETER``, or unrecorded with a
    dot (a module path), may be one; an unreadable record may be anything."""
    sources = _folded_records(graph)
    # name -> each value it was folded from; a record reaches "may be a parameter" through any chain of
    # records (one graph walk: records naming records many times over cost no more than once each)
    follows = nx.DiGraph()
    follows.add_nodes_from(sources)
    for name, names in sources.items():
        for source in names if names is not None else [_ANY_SOURCE]:
            if source in sources:
                follows.add_edge(name, source)
            elif source is _ANY_SOURCE or kinds.get(source, "PARAMETER" if "." in source else "") == "PARAMETER":
                follows.add_edge(name, _ANY_SOURCE)
    reaching = nx.ancestors(follows, _ANY_SOURCE) if _ANY_SOURCE in follows else set()
    return frozenset(name for name in sources if name not in reaching)


_LIFTED = re.compile(r"(?:^|\.)(?:lifted_tensor_|_tensor_constant)\d+$")
"""torch.export's names of the tensor constants it lifts out of a forward (``lifted_tensor_N``: torch 2.13's
``torch/_export/passes/lift_constants_pass.py``; FX's ``_tensor_constantN``): constants, never parameters,
whatever module path they carry."""


_ROTARY_BUFFER = ".inv_freq"
"""transformers' rotary frequencies, a buffer in every family (``self.inv_freq = nn.Buffer(inv_freq,
persistent=False)``: transformers 5.24's ``models/llama/modeling_llama.py:87``, ``dinov3_vit``'s ``:172``), so a
table folded from it alone (DINOv3's 2-D ``cos`` / ``sin``) lost no parameter."""


_NORM_MAGNITUDE = re.compile(r"^(?P<module>.+?)\.(?:parametrizations\.weight\.original0|weight_g)$")
"""A weight norm's magnitude ``g``: ``torch.nn.utils.parametrizations.weight_norm``'s ``original0`` (its direction
``v`` is ``original1``), or the older ``torch.nn.utils.weight_norm``'s ``weight_g`` (``weight_v``)."""


def _folded_norm_warnings(initializers: Mapping[str, onnx.TensorProto], parameters: frozenset[str],
                          records: Mapping[str, list[str] | None]) -> list[str]:
    """Warnings for counted constants the dynamo exporter's optimiser folded from a weight norm's ``g`` (and
    ``v``), ``g * v / ||v||``, as one ``Mul`` output (a small Conv's whole weight norm): the constant has ``v``'s
    shape and is counted as ``v``; ``g`` has one element per slice along the norm's ``dim`` (the output channels
    at torch's default ``dim=0``, the kernel taps at Wav2Vec2's ``dim=2``), which no file records, so the count
    is short by ``dims[dim]`` elements."""
    out = []
    for name in sorted(parameters & set(records)):
        magnitudes = [m for m in (_NORM_MAGNITUDE.match(n) for n in records[name] or ()) if m]
        if not magnitudes or name not in initializers:
            continue
        dims = [int(d) for d in initializers[name].dims]
        per_dim = ", ".join(f"{size} at dim={axis}" for axis, size in enumerate(dims))
        out.append(
            f"'{name}' {dims} was folded by the exporter from a weight norm g * v / ||v|| ('{magnitudes[0].group(0)}' "
            f"is g): counted as v ({math.prod(dims):,}), so the parameter count is short by g's elements, one per "
            f"slice along the norm's dim, which the file does not record ({per_dim}; torch's default is dim=0); "
            "export with torch.onnx.export(..., optimize=False) to keep g and v apart")
    return out


def lost_parameter_warnings(graph: onnx.GraphProto, initializers: Mapping[str, onnx.TensorProto],
                            counted: frozenset[str], said: Sequence[str], spoken: frozenset[str] | set[str]
                            ) -> list[str]:
    """One warning naming the parameters the dynamo exporter folded out of the file into constants that are not
    counted (:func:`_lost_sources`), none when there are none; ``counted``: the file's parameters, decided.
    Constants another warning speaks for (``spoken``: :attr:`ParameterEvidence.spoken`, the untrained router
    biases; or named in ``said``, the warnings so far, as a Swin-v2 position MLP's folded product) are not named
    again."""
    lost = _lost_sources(initializers, counted, _folded_records(graph), signature_kinds(graph))
    return _lost_source_warning({name: sources for name, sources in lost.items() if name not in spoken
                                 and not any(f"'{name}'" in warning for warning in said)})


def untrained_bias_warning(graph: onnx.GraphProto, untrained: Sequence[tuple[str, int]]) -> list[str]:
    """One warning for the biases or scales no gradient reaches (``untrained``: ``(initializer, elements)``, an MoE
    router's score bias that only chooses experts), which are not counted; none when there are none.

    Whether torch counts such a tensor depends on how the model declares it, which only a dynamo export's record of
    the initializer itself says (a recorded one is settled before this: ``PARAMETER`` counted, ``BUFFER`` not). 31
    routers of transformers 5.24 hold ``e_score_correction_bias`` as a buffer (``nn.Buffer``: DeepSeek-V3, GLM-4-MoE,
    dots1, ...), which ``model.parameters()`` leaves out, and three as ``nn.Parameter(..., requires_grad=False)``
    (ERNIE-4.5-MoE, ERNIE-4.5-VL-MoE, Laguna), which it counts (found by reading each ``modeling_*.py``). A TorchScript
    file names the tensor but records neither; a dynamo file whose optimizer folded it (ERNIE's
    ``e_score_correction_bias.squeeze()`` into ``squeeze``) names it only in the folded constant's
    :data:`FOLDED_FROM_KEY` record, so the warning names those sources and by how much torch's count is higher when
    they are parameters.

    Examples
    --------
    >>> line, = untrained_bias_warning(onnx.GraphProto(), [("gate.e_score_correction_bias", 4)])
    >>> "(gate.e_score_correction_bias; 4 elements)" in line, "the true count is 4 higher" in line
    (True, True)
    """
    if not untrained:
        return []
    records = _folded_records(graph)
    names = [f"{name} from {records[name]}" if records.get(name) else name for name, _ in untrained]
    total = sum(numel for _, numel in untrained)
    return [f"{len(untrained)} bias or scale tensors ({_limited(names, _NAMED_LIMIT)}; {total:,} elements) reach the "
            "outputs only through index or comparison results (an MoE router's expert choice), so no gradient trains "
            "them: not counted as parameters, as torch does not count a buffer (DeepSeek-V3's "
            "e_score_correction_bias); where the model declares them nn.Parameter(requires_grad=False) "
            f"(ERNIE-4.5-MoE's), the true count is {total:,} higher: the file does not record which (export with "
            "torch.onnx.export(..., dynamo=True, optimize=False) to decide)"]


def _lost_sources(initializers: Mapping[str, onnx.TensorProto], counted: frozenset[str],
                  records: Mapping[str, list[str] | None], kinds: Mapping[str, str]) -> dict[str, list[str]]:
    """Uncounted constants the exporter folded -> the values that may be parameters they were folded from
    and that the file does not hold (DiffLlama's ``lambda_full``: ``exp(sum(lambda_q1 * lambda_k1)) - exp(sum(
    lambda_q2 * lambda_k2)) + lambda_init``, one scalar ``add_N`` per layer whose record names the four
    ``...self_attn.lambda_*`` vectors, which no initializer keeps). A source may be a parameter as
    :func:`_folded_from_no_parameter` reads one: recorded a ``PARAMETER``, or unrecorded with a dot; records
    naming records are followed."""
    def sources(name: str) -> set[str]:
        found: set[str] = set()
        seen, stack = {name}, [name]
        while stack:
            for source in records.get(stack.pop()) or ():
                if source not in seen:
                    seen.add(source)
                    (stack.append if source in records else found.add)(source)
        return found

    # a source a counted constant was folded from is in the file (a transposed weight ``val_N``)
    held = set(initializers).union(*(sources(name) for name in set(records) & counted))
    lost: dict[str, list[str]] = {}
    for name in sorted(n for n in set(records) & set(initializers) - counted
                       if initializers[n].data_type in _FLOAT_TYPES):  # an index table is no folded weight
        found = sorted(s for s in sources(name) - held if not _LIFTED.search(s) and not s.endswith(_ROTARY_BUFFER)
                       and kinds.get(s, "PARAMETER" if "." in s else "") == "PARAMETER")
        if found:
            lost[name] = found
    return lost


def _lost_source_warning(lost: Mapping[str, list[str]]) -> list[str]:
    """The warning for :func:`_lost_sources`: the parameters are not counted, and no file records their sizes."""
    if not lost:
        return []
    sources = sorted({s for names in lost.values() for s in names})
    listed = _limited([f"'{name}'" for name in lost], _NAMED_LIMIT)
    return [f"{len(lost)} constant(s) the exporter folded ({listed}) were computed from {len(sources)} value(s) that "
            f"may be parameters and that the file does not hold ({_limited([repr(s) for s in sources], _NAMED_LIMIT)}, "
            f"per its {FOLDED_FROM_KEY} records): their elements are not counted, and no file records their sizes; "
            "export with torch.onnx.export(..., optimize=False) to count them"]


def _folded_records(graph: onnx.GraphProto) -> dict[str, list[str] | None]:
    """Value -> the names its :data:`FOLDED_FROM_KEY` record gives (``None``: unreadable)."""
    sources: dict[str, list[str] | None] = {}
    for info in graph.value_info:
        for prop in info.metadata_props:
            if prop.key == FOLDED_FROM_KEY:
                try:
                    names = ast.literal_eval(prop.value)
                except (ValueError, SyntaxError):
                    names = None
                ok = isinstance(names, list) and all(isinstance(n, str) for n in names)
                sources[info.name] = names if ok else None
    return sources


_ANY_SOURCE = object()
"""The node standing for any value that may be a parameter (:func:`_folded_from_no_parameter`)."""


_FX_VALUE = re.compile(r"^val_\d+$")
"""onnxscript's names of the values it made (``val_N``): never a module's parameter."""


def _unfed_warning(initializers: Mapping[str, onnx.TensorProto], names: Sequence[str],
                   records: Mapping[str, list[str] | None]) -> list[str]:
    """The warning for initializers the weight rule took that the exporter folded from no parameter,
    each with the sources its record (``records``) names. A source without a dot that the file does not
    record may be a parameter of the root module (CLIP's ``logit_scale``) as well as an FX value
    (``ones``): the record does not tell them apart, so the warning names it and what the count loses
    if it is one (module docstring)."""
    if not names:
        return []

    listed = _limited([f"'{n}' {[int(d) for d in initializers[n].dims]}" for n in names], _NAMED_LIMIT)
    sources = _limited([f"'{n}' from {records.get(n)}" for n in names], _NAMED_LIMIT)
    total = sum(math.prod(int(d) for d in initializers[n].dims) for n in names)
    roots = sorted({s for n in names for s in records.get(n) or () if "." not in s and not _FX_VALUE.match(s)
                    and s not in records})
    maybe = (f"; if {_limited([repr(r) for r in roots], _NAMED_LIMIT)} is a parameter of the root module (a name "
             f"without a dot, which the record does not tell from an FX value), the true count is up to {total:,} "
             "higher") if roots else ""
    return [f"{len(names)} constant(s) read as a weight ({listed}; {total:,} elements) were folded by the "
            f"exporter from values its {FOLDED_FROM_KEY} record does not show to be parameters ({sources}: a mask or "
            f"a fixed table): not counted{maybe}"]


def _folded_warning(folded: list[tuple[str, list[int]]]) -> str:
    total = sum(math.prod(dims) for _, dims in folded)
    named = _limited([f"'{name}' {dims}" for name, dims in folded], _NAMED_LIMIT)
    return (
        f"{total:,} elements of constants the exporter made ({named}) are added to attention "
        "scores and may be folded parameters (an eval-mode export folds a relative position bias "
        "table with its index); they are not counted, and the tables they came from are not in the "
        "file: export with training=TrainingMode.TRAINING, do_constant_folding=False to count them"
    )
