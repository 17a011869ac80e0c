r"""Coarsening stages 1-2: value classes and the trainable parameters of a shaped ONNX graph.

1. **Classify values** (``_classify``, ``_finish_status``): every value is ``const`` (depends only
   on constants, non-trainable initializers and ``Shape`` outputs: the shape-computation subgraphs,
   dropped), ``param`` (a trainable initializer, or a layout view or part of one) or ``act``
   (computed at run time from the graph inputs or parameters).
2. **Parameters** (``_find_parameters``): a float initializer is trainable when its use says so (a
   MatMul/Gemm/Conv weight, an embedding table, a norm scale or bias, a per-channel bias added to an
   activation, an RNN weight), looking through Transpose/Cast/Identity/Reshape/Expand and through
   Slice/Split/Concat of it; buffers the exporter named like buffers (``inv_freq``, ``*_cached``,
   ``running_mean``, masks, position ids: :func:`is_parameter_name`) and scalars are not. Tied weights
   are one initializer used by two ops, an ``Identity`` of it, or the TorchScript exporter's
   transposed copy of a tied embedding table (``_find_tied_copies``); aliases go to
   ``parameter_aliases``. (A BatchNormalization the exporter folded into a Conv is an op again before
   this stage: :mod:`importers.batchnorm`.) What the file says beyond a weight's use (torch.export's
   recorded buffers and parameters, position tables, attention biases, folded constants) is settled
   by :mod:`importers.param_evidence`.
"""

from __future__ import annotations

import math
import re

import numpy as np
import onnx
from onnx import numpy_helper

from importers.coarse_model import _DEFAULT_DOMAINS, _FLOAT_DTYPES, _Model, _np_dtype, _tensor_numel
from importers.param_evidence import weigh_parameter_evidence

__all__ = ["is_parameter_name"]


# Where an initializer is read as a weight. "strong": only a trainable weight sits there;
# "weak": a bias or scale added to / multiplied with an activation (constants sit there too).
_STRONG_WEIGHT_POSITIONS: dict[str, tuple[int, ...] | None] = {
    "MatMul": (0, 1),
    "Gemm": (0, 1, 2),
    "Conv": (1, 2),
    "ConvTranspose": (1, 2),
    "Gather": (0,),
    "LayerNormalization": (1, 2),
    "RMSNormalization": (1,),
    "SimplifiedLayerNormalization": (1,),
    "SkipLayerNormalization": (2, 3, 4),
    "SkipSimplifiedLayerNormalization": (2, 3),
    "BatchNormalization": (1, 2),
    "GroupNormalization": (1, 2),
    "InstanceNormalization": (1, 2),
    "Einsum": None,
    "LSTM": (1, 2, 3),
    "GRU": (1, 2, 3),
    "RNN": (1, 2, 3),
    "PRelu": (1,),
    "GatherND": (0,),
    "GatherElements": (0,),
}
_WEAK_WEIGHT_POSITIONS: dict[str, tuple[int, ...] | None] = {
    "Add": (0, 1),
    "Sub": (0, 1),
    "Mul": (0, 1),
    "Concat": None,
    "Where": (1, 2),
}
# Layout ops through which an initializer stays "the same weight" (no cost: a layout choice).
_PARAM_LAYOUT_OPS = frozenset({"Transpose", "Cast", "CastLike", "Identity", "Reshape", "Squeeze", "Unsqueeze", "Flatten", "Expand"})
# Ops that take parts of a weight (a fused q/k/v projection sliced per head group, LSTM gates):
# followed when deciding whether an initializer is trainable.
_PARAM_PART_OPS = frozenset({"Slice", "Split", "Concat"})

_BUFFER_NAME = re.compile(
    r"(inv_freq|_cached|(^|[._])(cos|sin)([._]|$)|rotary|(^|[._])(causal_)?mask|position_ids|token_type_ids"
    r"|running_mean|running_var|num_batches_tracked|masked_bias|(^|[._])freqs|(^|[._])buffer)",
    re.IGNORECASE,
)
_ANONYMOUS_NAME = re.compile(
    r"^(val_\d+|_val_|onnx::|_tensor_constant|_frozen_param|const_|Constant|/|_v_\d+|scalar_tensor|arg\d|tensor_\d)"
)
_SHAPE_OPS = frozenset({"Shape", "Size"})


def is_parameter_name(name: str) -> bool:
    """Whether an initializer's name reads like a trainable parameter (not a buffer, not anonymous).

    Examples
    --------
    >>> is_parameter_name("transformer.h.0.attn.c_attn.weight"), is_parameter_name("val_12")
    (True, False)
    >>> is_parameter_name("model.rotary_emb.inv_freq"), is_parameter_name("onnx::MatMul_1234")
    (False, False)
    """
    return not _BUFFER_NAME.search(name) and not _ANONYMOUS_NAME.match(name)


def _is_buffer_name(name: str) -> bool:
    return bool(_BUFFER_NAME.search(name))


# --------------------------------------------------------------------------------------------
# 1-2. Value classes and parameters
# --------------------------------------------------------------------------------------------


def _classify(m: _Model) -> None:
    """Runtime dependence (``act``) of every value; initializers are decided by ``_find_parameters``."""
    status = m.status
    for name in m.inputs:
        status[name] = "act"
    for index, node in enumerate(m.nodes):
        outputs = [o for o in node.output if o]
        if node.op_type in _SHAPE_OPS or node.op_type == "Constant":
            kind = "const"
        elif outputs and all(o in m.constants for o in outputs):
            kind = "const"
        elif any(status.get(i) == "act" for i in node.input if i):
            kind = "act"
        else:
            kind = "const"
        for o in outputs:
            status[o] = kind


def _weight_uses(m: _Model, name: str) -> list[tuple[int, int]]:
    """(node, input position) where an initializer is read, looking through layout ops of it."""
    uses: list[tuple[int, int]] = []
    stack = [name]
    seen = {name}
    while stack:
        value = stack.pop()
        for index, position in m.consumers.get(value, ()):
            node = m.nodes[index]
            part = node.op_type in _PARAM_PART_OPS
            if part:
                uses.append((index, position))  # a Concat with an activation is itself a use
            if (node.op_type in _PARAM_LAYOUT_OPS and position == 0) or part:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
            else:
                uses.append((index, position))
    return uses


def _role(table: dict[str, tuple[int, ...] | None], node: onnx.NodeProto, position: int) -> bool:
    if node.domain not in _DEFAULT_DOMAINS and node.domain != "com.microsoft":
        return False
    if node.op_type not in table:
        return False
    positions = table[node.op_type]
    return positions is None or position in positions


def _find_parameters(m: _Model) -> None:
    """Decide which float initializers are trainable parameters (see module docstring)."""
    for name, tensor in m.initializers.items():
        dtype = _np_dtype(tensor.data_type)
        if dtype not in _FLOAT_DTYPES or _is_buffer_name(name):
            continue
        numel = _tensor_numel(tensor)
        named = is_parameter_name(name)
        if numel <= 1 and not _scalar_slope(m, name) and (not named or name in m.constants):
            continue  # a scalar constant (scale, epsilon, fill value)
        trainable = False
        for index, position in _weight_uses(m, name):
            node = m.nodes[index]
            runtime = any(m.status.get(i) == "act" for p, i in enumerate(node.input) if i and p != position)
            if _role(_STRONG_WEIGHT_POSITIONS, node, position):
                if runtime or named:
                    trainable = True
                    break
            elif _role(_WEAK_WEIGHT_POSITIONS, node, position) and runtime:
                shape = [int(d) for d in tensor.dims]
                # A named weight is trainable; an anonymous one only when it is a per-channel vector
                # (a bias or scale): constants with a runtime role (masks) span several axes.
                if named or sum(1 for d in shape if d > 1) == 1:
                    trainable = True
                    break
        if trainable:
            m.parameters.add(name)
    # What the file says beyond a weight's use: the exporter's record, position tables, buffers.
    evidence = weigh_parameter_evidence(
        graph=m.graph, initializers=m.initializers, parameters=frozenset(m.parameters), nodes=m.nodes,
        consumers=m.consumers, status=m.status, shapes=m.shapes, is_named=is_parameter_name,
    )
    m.parameters = (m.parameters | evidence.added) - evidence.dropped
    m.warnings.extend(evidence.warnings)
    _find_tied_copies(m)


def _scalar_slope(m: _Model, name: str) -> bool:
    """A one-element initializer that is a PRelu slope: ``nn.PReLU()`` learns one shared slope."""
    return any(m.nodes[i].op_type == "PRelu" and p == 1 for i, p in _weight_uses(m, name))


_TORCHSCRIPT_FOLDED = re.compile(r"^onnx::")


def _find_tied_copies(m: _Model) -> None:
    """TorchScript's constant-folded transposed copy of a tied embedding table (an LM head).

    The TorchScript exporter folds ``Transpose(weight)`` into a new initializer (``onnx::MatMul_N``)
    even when the weight is also read elsewhere, so a tied output projection (BERT's and GPT-2's LM
    head share the word embeddings) appears twice. The copy is taken for the table when it is the
    table transposed, the table is the only named Gather table of that shape, and the copy's MatMul
    produces a graph output (the logits), and the file holds both weights and they are equal
    (transposed). Without values (a graph-only file) the copy is counted, with a warning that it may be
    tied: an untied LM head of that shape looks the same, and a parameter is never dropped on a guess.
    The dynamo exporter keeps a shared weight shared; its
    anonymous ``val_N`` copies are untied weights and are left alone.
    """
    tables: dict[tuple[int, ...], list[str]] = {}
    for name in m.parameters:
        shape = tuple(int(d) for d in m.initializers[name].dims)
        if len(shape) == 2 and is_parameter_name(name):
            if any(m.nodes[i].op_type == "Gather" and p == 0 for i, p in _weight_uses(m, name)):
                tables.setdefault(shape, []).append(name)
    for name in sorted(m.parameters):
        if not _TORCHSCRIPT_FOLDED.match(name):
            continue
        shape = tuple(int(d) for d in m.initializers[name].dims)
        candidates = tables.get(tuple(reversed(shape)), []) if len(shape) == 2 and shape[0] != shape[1] else []
        uses = _weight_uses(m, name)
        if len(candidates) != 1 or not uses or not all(m.nodes[i].op_type in ("MatMul", "Gemm") for i, _ in uses):
            continue
        if all(_reaches_output(m, m.nodes[i].output[0]) for i, _ in uses):
            copy, table = _inline_values(m.initializers[name]), _inline_values(m.initializers[candidates[0]])
            if copy is None or table is None:
                # No values to compare (a graph-only file): an untied head of that shape (an LSTM
                # LM's decoder) looks the same, so count it and say it may be the tied copy.
                m.warnings.append(
                    f"'{name}' {list(shape)} may be a transposed copy of the tied embedding "
                    f"'{candidates[0]}' (the TorchScript exporter duplicates tied weights), but the "
                    f"file has no values to prove it; it is counted ({math.prod(shape):,} parameters): "
                    "if the model ties them, the true count is that much lower (export with the "
                    "weights, or with dynamo, to decide)"
                )
                continue
            if not np.array_equal(copy, table.T):
                continue  # the weights are in the file and differ: an untied output projection
            m.aliases[name] = candidates[0]
            m.parameters.discard(name)
            m.warnings.append(
                f"'{name}' {list(shape)} is taken as the transposed copy of the tied embedding "
                f"'{candidates[0]}' (the TorchScript exporter duplicates tied weights); it is counted once"
            )


def _inline_values(tensor: onnx.TensorProto) -> np.ndarray | None:
    """An initializer's values when the file holds them inline (``None``: external or stripped)."""
    if tensor.data_location == onnx.TensorProto.EXTERNAL:
        return None
    try:
        values = numpy_helper.to_array(tensor)
    except (ValueError, TypeError):
        return None
    return values if values.size == math.prod(tensor.dims) and values.size > 0 else None


def _reaches_output(m: _Model, value: str, hops: int = 4) -> bool:
    """Whether ``value`` is a graph output or flows to one through a few single-use nodes."""
    for _ in range(hops + 1):
        if value in m.outputs:
            return True
        users = m.consumers.get(value, [])
        if len(users) != 1:
            return False
        value = m.nodes[users[0][0]].output[0] if m.nodes[users[0][0]].output else ""
    return False


def _finish_status(m: _Model) -> None:
    """Final class of every value: initializers resolved, nodes reading parameters computed."""
    status = m.status
    for name in m.initializers:
        status[name] = "param" if name in m.parameters or name in m.aliases else "const"
    for name in m.inputs:
        status[name] = "act"
    for node in m.nodes:
        outputs = [o for o in node.output if o]
        if node.op_type in _SHAPE_OPS or node.op_type == "Constant" or (outputs and all(o in m.constants for o in outputs)):
            kind = "const"
        elif any(status.get(i) in ("act", "param") for i in node.input if i):
            kind = "act"
        else:
            kind = "const"
        for o in outputs:
            status[o] = kind
