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
   transposed copy of a tied embedding table (``_find_tied_copies``), or the dynamo exporter's
   per-call ``val_N`` copies of the weight of a ``Linear`` called more than once (ALBERT's shared
   layers: ``_find_module_copies``); aliases go to
   ``parameter_aliases``. A tie stays counted once, but a vector (one axis over 1, so never a tied
   embedding) read by the norms or per-channel ops of two modules or more is named in one warning
   with ``(modules - 1) x elements``, what the count gains if they are separate weights, since the
   TorchScript exporter (and the dynamo exporter's optimizer) merges equal initializers and a freshly initialised model's norm scales are
   all ones (``_warn_shared_vectors``). (A BatchNormalization the exporter folded into a Conv is an op
   again before this stage: :mod:`importers.batchnorm`.) What the file says beyond a weight's use (torch.export's
   recorded buffers and parameters, position tables, attention biases, folded constants) is settled
   by :mod:`importers.param_evidence`.

   Issue 25's exporter forms: an affine function of a weight and a scalar (``weight + 1`` of
   LayerNorm1P and Gemma's RMSNorm, ``1 - p``) is the weight (``affine_of_weight``; folded as a view
   by :mod:`importers.fold_views`); a weight's values tiled to the batch or added to zeros (DETR's
   object queries, ``_Flow``) are read per sample, so the table and the projections reading it count;
   a constant the exporter folded from a parameter the file also holds is an alias of it
   (``_find_derived_constants``: proven by the values, or read from a lerp ``x p + y (1 - p)`` with
   a warning).

   A learned table may be transformed by learned weights before it meets the activations: DeBERTa-v2
   with ``share_att_key=False`` projects ``LayerNorm(rel_embeddings)`` by each layer's own
   ``pos_key_proj`` and ``pos_query_proj``, which read no graph input. An initializer read as a weight
   by an op whose other operand is computed from parameters alone, and from which a gradient reaches
   an output, is a parameter too (``_trained_through_parameters``, after the file's evidence); a
   constant computed from no parameter (a rotary table from ``inv_freq``, a causal mask, positions from
   ``Range``) is not, so what reads it stays a constant. A Linear applied to a constant table is
   trained too (``_linears_on_constants``): Swin-v2's continuous position bias MLP maps a constant
   coordinate table to the bias added to the scores; TorchScript keeps ``table @ W + b`` with ``b``
   under its module path, so an Add of a named ``.bias`` and a MatMul/Gemm of an initializer counts
   both, and the layers after it read a parameter-fed value. Dynamo computes ``table @ W.T`` at export
   time, so ``W`` is not in the file: a warning gives the shortfall per input feature
   (``_warn_folded_linear_weights``). A weight read through ``Clip`` with constant bounds (Swin-v2's
   ``clamp(logit_scale)``) is still the weight, and an anonymous weight of two axes over 1 read through
   ``Exp`` before an activation meets it (Mamba's ``-exp(A_log)``, TorchScript's ``onnx::Exp_N``) is a
   learned log-scale, not a mask (``_exponentiated``), as is an exponentiated anonymous scalar
   (SigLIP's ``logit_scale.exp()``). A weight is followed through rows of it at constant indices
   (Zamba's ``-exp(A_log)[head]``) and, when named, through reductions of it and arithmetic with other
   values of weights alone (``_computed_from_weights``: a training export's weight norm ``g * v / ||v||``).

   A bias or scale (a weak use: added to or multiplied with an activation) from which no gradient
   reaches an output is not trained by backpropagation, whatever its name: DeepSeek-V3's
   ``e_score_correction_bias`` is added to the router's scores that only choose experts (TopK
   indices), so the TorchScript exporter's copy of that buffer is not counted (``_gradient_carriers``:
   the values a gradient flows back to, through every input of every op but the index outputs of
   TopK/ArgMax, comparisons, and the condition of a Where or the indices of a Gather or Scatter). Where the model declares such a vector
   ``nn.Parameter(requires_grad=False)`` (ERNIE-4.5-MoE's) torch counts it, and a file without torch.export's
   record of it cannot say which: the warning names it and the difference (:func:`importers.param_evidence.
   untrained_bias_warning`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np
import onnx
from onnx import numpy_helper

from importers.embedding_bag import DOMAIN as BAG_DOMAIN
from importers.coarse_model import _DEFAULT_DOMAINS, _FLOAT_DTYPES, _Model, _np_dtype, _tensor_numel
from importers.onnx_protos import _limited
from importers.param_evidence import (lost_parameter_warnings, signature_kinds, untrained_bias_warning,
                                      weigh_parameter_evidence)

__all__ = ["affine_of_weight", "is_parameter_name"]


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
# Arithmetic that, with a scalar constant, gives a value that is still the same weight (an affine
# function of it): LayerNorm1P's and Gemma's ``weight + 1``, RWKV's ``1 - time_mix``.
_AFFINE_OPS = frozenset({"Add", "Sub", "Mul", "Div"})
# Functions of one tensor: a weight passed through one is still only that weight's values.
_UNARY_OPS = frozenset({"Neg", "Exp", "Log", "Abs", "Sqrt", "Reciprocal", "Sigmoid", "Tanh", "Softplus", "Relu"})
# Reductions of one tensor (a weight norm's ``||v||``, TorchScript's ReduceL2 of ``_weight_norm``) and
# arithmetic of two: of weights alone, their outputs are weights' values (:func:`_computed_from_weights`).
_REDUCE_OPS = frozenset({"ReduceL2", "ReduceSumSquare", "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin"})
_VALUE_OPS = frozenset({"Add", "Sub", "Mul", "Div", "Pow"})

_BUFFER_NAME = re.compile(
    r"(inv_freq|_cached|(^|[._])(cos|sin)([._]|$)|rotary|(^|[._])(causal_)?mask|position_ids|token_type_ids"
    r"|running_mean|running_var|num_batches_tracked|masked_bias|(^|[._])freqs|(^|[._])buffer)",
    re.IGNORECASE,
)
_ANONYMOUS_NAME = re.compile(
    r"^(val_\d+|_val_|onnx::|_tensor_constant|_frozen_param|const_|Constant|/|_v_\d+|scalar_tensor|arg\d|tensor_\d)"
)
_SHAPE_OPS = frozenset({"Shape", "Size"})


def affine_of_weight(m: _Model, index: int, position: int) -> bool:
    """Whether node ``index`` reading a weight at ``position`` computes an affine function of it alone.

    An Add/Sub/Mul/Div whose other operand is a scalar constant (one element, not computed at run
    time) and whose output has the weight's shape: ``weight + 1`` (LayerNorm1P, Gemma's RMSNorm),
    ``1 - time_mix`` (RWKV). Its output is the same parameter, read through a view: it costs
    nothing per token and splits as the weight does, so it is not an op of its own.
    """
    node = m.nodes[index]
    if node.op_type not in _AFFINE_OPS or node.domain not in _DEFAULT_DOMAINS or len(node.input) != 2:
        return False
    other = node.input[1 - position]
    if not other or m.status.get(other) in ("act", "param") or other in m.parameters:
        return False
    other_shape = m.shape(other)
    weight_shape, out_shape = m.shape(node.input[position]), m.shape(node.output[0]) if node.output else None
    return other_shape is not None and math.prod(other_shape) == 1 and weight_shape is not None and out_shape == weight_shape


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


@dataclass(frozen=True, slots=True)
class _Flow:
    """Values that are not computed from the inputs' data, split by where they come from."""

    dynamic: frozenset[str]
    """Computed from a runtime value's shape (``Shape``/``Size`` of an activation): a learned
    table tiled to the batch (DETR's object queries) or zeros of the batch's shape."""
    derived: frozenset[str]
    """Float initializers of more than one element and what is computed from them without the
    inputs' data: where a weight may flow."""


def _flow(m: _Model) -> _Flow:
    """The :class:`_Flow` of the graph (one pass in topological order; ``_classify`` first)."""
    dynamic: set[str] = set()
    derived = {n for n, t in m.initializers.items() if _np_dtype(t.data_type) in _FLOAT_DTYPES and _tensor_numel(t) > 1}
    for node in m.nodes:
        outputs = [o for o in node.output if o]
        if not outputs or m.status.get(outputs[0]) == "act":
            continue
        inputs = [i for i in node.input if i]
        if (node.op_type in _SHAPE_OPS and any(m.status.get(i) == "act" for i in inputs)) or any(i in dynamic for i in inputs):
            dynamic.update(outputs)
        if node.op_type not in _SHAPE_OPS and any(i in derived for i in inputs):
            derived.update(outputs)
    return _Flow(dynamic=frozenset(dynamic), derived=frozenset(derived))


def _passes_weight(m: _Model, index: int, position: int, flow: _Flow | None, computed: bool = False) -> bool:
    """Whether node ``index``'s output is still the weight it reads at ``position`` (followed).

    Layout ops and parts of a weight always; an affine function of it and a scalar
    (:func:`affine_of_weight`). With ``flow``, also what carries a weight's values to where it is
    used without the inputs' data: a Tile of it (to the batch), rows of it at constant indices
    (Zamba's ``A[head]``), a unary function of it (RWKV's ``-exp(time_decay)``), and a sum with a
    constant no weight flows into (DETR's ``zeros + query_pos``: the learned table is still a
    parameter). With ``computed`` (a named weight: :func:`_weight_verdict`), also a weight computed
    from it and other weights' values (:func:`_computed_from_weights`).
    """
    node = m.nodes[index]
    if (node.op_type in _PARAM_LAYOUT_OPS and position == 0) or node.op_type in _PARAM_PART_OPS:
        return True
    if affine_of_weight(m, index, position):
        return True
    if flow is None or node.domain not in _DEFAULT_DOMAINS:
        return False
    if node.op_type == "Tile" and position == 0:
        return True
    if node.op_type == "Gather" and position == 0:
        return len(node.input) > 1 and _fixed(m, node.input[1], flow)
    if node.op_type in _UNARY_OPS and len(node.input) == 1:
        return True
    if computed and _computed_from_weights(m, index, position, flow):
        return True
    if node.op_type == "Clip" and position == 0:  # Swin-v2's clamp(logit_scale, max=log(100))
        return all(m.status.get(i) != "act" and i not in flow.derived for i in node.input[1:] if i)
    if node.op_type in ("Add", "Sub") and len(node.input) == 2:
        other = node.input[1 - position]
        return bool(other) and m.status.get(other) != "act" and other not in flow.derived
    return False


def _computed_from_weights(m: _Model, index: int, position: int, flow: _Flow) -> bool:
    """Whether node ``index`` computes, from the weight it reads at ``position``, a value of weights alone.

    A weight norm, ``g * v / ||v||`` (torch's ``weight_norm`` parametrization, which a training-mode
    export computes in the graph: TorchScript's ReduceL2 / Div / Mul before Wav2Vec2's positional Conv):
    a reduction of the weight, or arithmetic with another value computed from weights (never the
    inputs' data nor their shapes), or a power of it by a constant. Not a product with positions
    computed from the batch's shape (ALiBi's slopes), which are no weight's values.
    """
    node = m.nodes[index]
    if node.op_type in _REDUCE_OPS:
        return position == 0
    if node.op_type not in _VALUE_OPS or len(node.input) != 2 or not node.input[1 - position]:
        return False
    other = node.input[1 - position]
    return _fixed(m, other, flow) and (other in flow.derived or (node.op_type == "Pow" and position == 0))


def _fixed(m: _Model, value: str, flow: _Flow) -> bool:
    """Whether ``value`` is computed neither from the inputs' data nor from their shapes."""
    return m.status.get(value) != "act" and value not in flow.dynamic


def _weight_uses(m: _Model, name: str, flow: _Flow | None = None, computed: bool = False) -> list[tuple[int, int]]:
    """(node, input position) where an initializer is read, looking through what keeps it the
    weight (:func:`_passes_weight`, with ``computed``)."""
    uses: list[tuple[int, int]] = []
    stack = [name]
    seen = {name}
    while stack:
        value = stack.pop()
        for index, position in m.consumers.get(value, ()):
            node = m.nodes[index]
            passes = _passes_weight(m, index, position, flow, computed)
            if node.op_type in _PARAM_PART_OPS or (passes and node.op_type == "Gather"):
                uses.append((index, position))  # a Concat with an activation, a table's row, is itself a use
            if passes:
                for out in node.output:
                    if out and out not in seen:
                        seen.add(out)
                        stack.append(out)
            elif node.op_type not in _PARAM_PART_OPS:
                uses.append((index, position))
    return uses


def _role(table: dict[str, tuple[int, ...] | None], node: onnx.NodeProto, position: int) -> bool:
    if node.domain == BAG_DOMAIN:
        return table is _STRONG_WEIGHT_POSITIONS and position == 0  # an embedding bag's table
    if node.domain not in _DEFAULT_DOMAINS and node.domain != "com.microsoft":
        return False
    if node.op_type not in table:
        return False
    positions = table[node.op_type]
    return positions is None or position in positions


# Outputs through which no gradient flows back: indices, booleans, rounding (a constant almost
# everywhere). ``None``: every output of the op.
_NO_GRADIENT_OUTPUTS: dict[str, tuple[int, ...] | None] = {
    "TopK": (1,), "ArgMax": None, "ArgMin": None, "NonZero": None, "Shape": None, "Size": None,
    "Equal": None, "Greater": None, "GreaterOrEqual": None, "Less": None, "LessOrEqual": None,
    "Not": None, "And": None, "Or": None, "Xor": None, "IsNaN": None, "IsInf": None,
    "Sign": None, "Floor": None, "Ceil": None, "Round": None,
}
# Inputs that select rather than carry values: a gradient never flows back into them.
_NO_GRADIENT_INPUTS: dict[str, tuple[int, ...]] = {
    "Where": (0,), "Gather": (1,), "GatherElements": (1,), "GatherND": (1,), "ScatterElements": (1,),
    "ScatterND": (1,), "OneHot": (0, 1),
}


def _gradient_carriers(m: _Model) -> frozenset[str]:
    """Values from which a gradient can flow back from a graph output (one reverse pass in
    topological order). Ops of other domains and unknown ops pass gradients through every input."""
    carriers = set(m.outputs)
    for node in reversed(m.nodes):
        blocked_out = _NO_GRADIENT_OUTPUTS.get(node.op_type, ()) if node.domain in _DEFAULT_DOMAINS else ()
        if not any(o in carriers and (blocked_out is not None and p not in blocked_out)
                   for p, o in enumerate(node.output) if o):
            continue
        blocked_in = (_NO_GRADIENT_INPUTS.get(node.op_type, ()) if node.domain in _DEFAULT_DOMAINS
                      else (1, 2) if node.domain == BAG_DOMAIN else ())  # a bag's indices and offsets
        carriers.update(i for p, i in enumerate(node.input) if i and p not in blocked_in)
    return frozenset(carriers)


def _find_parameters(m: _Model) -> None:
    """Decide which float initializers are trainable parameters (see module docstring)."""
    flow = _flow(m)
    carriers = _gradient_carriers(m)
    untrained: list[tuple[str, int]] = []
    for name, tensor in m.initializers.items():
        verdict = _weight_verdict(m, name, flow, carriers, fed=frozenset())
        if verdict == "trainable":
            m.parameters.add(name)
        elif verdict == "untrained":
            untrained.append((name, _tensor_numel(tensor)))
    # What the file says beyond a weight's use: the exporter's record, position tables, buffers.
    evidence = weigh_parameter_evidence(
        graph=m.graph, initializers=m.initializers, parameters=frozenset(m.parameters), nodes=m.nodes,
        consumers=m.consumers, status=m.status, shapes=m.shapes, is_named=is_parameter_name,
    )
    m.parameters = (m.parameters | evidence.added) - evidence.dropped
    buffers = frozenset(n for n, kind in signature_kinds(m.graph).items() if kind == "BUFFER")
    m.parameters |= _trained_through_parameters(m, flow, carriers, evidence.dropped | buffers)
    m.warnings.extend(evidence.warnings)
    # said only where the use alone decided it (torch.export's record of buffers says it already)
    kinds = signature_kinds(m.graph)
    untrained = [(name, numel) for name, numel in dict(untrained).items()
                 if name not in m.parameters and kinds.get(name) != "BUFFER"]
    m.warnings.extend(untrained_bias_warning(m.graph, untrained))
    _find_derived_constants(m)
    _find_tied_copies(m)
    _find_module_copies(m)
    _warn_shared_vectors(m)
    _warn_folded_linear_weights(m)
    _warn_frozen_norms(m)
    m.warnings.extend(lost_parameter_warnings(m.graph, m.initializers, frozenset(m.parameters), tuple(m.warnings),
                                              evidence.spoken | {name for name, _ in untrained}))


def _weight_verdict(m: _Model, name: str, flow: _Flow, carriers: frozenset[str], fed: frozenset[str]) -> str | None:
    """How initializer ``name``'s uses classify it: ``"trainable"``, ``"untrained"`` (a bias or scale
    from which no gradient reaches an output) or ``None`` (not a weight by its use).

    ``fed``: values computed from parameters without the inputs' data (:func:`_parameter_fed`), read
    as run-time operands, where a weight's gradient must also reach an output; empty on the first
    pass, which reads only what is computed from the inputs as run time.
    """
    tensor = m.initializers[name]
    if _np_dtype(tensor.data_type) not in _FLOAT_DTYPES or _is_buffer_name(name):
        return None
    numel = _tensor_numel(tensor)
    named = is_parameter_name(name)
    if (numel <= 1 and not _scalar_slope(m, name) and (not named or name in m.constants)
            and not _exponentiated(m, name, flow)):  # CLIP's and SigLIP's logit_scale.exp()
        return None  # a scalar constant (scale, epsilon, fill value)
    verdict = None
    for index, position in _weight_uses(m, name, flow, computed=named):
        node = m.nodes[index]
        partners = [i for p, i in enumerate(node.input) if i and p != position]
        carries = any(o in carriers for o in node.output if o)
        if fed and not (carries and any(i in fed for i in partners)):
            continue
        # A weight's values brought to the batch's shape (DETR's object queries, tiled) are
        # read per sample, as an activation is; positions computed from the batch's shape
        # alone (ALiBi's) are not, so a constant scaling them stays a constant.
        runtime = bool(fed) or any(m.status.get(i) == "act" or (i in flow.dynamic and i in flow.derived)
                                   for i in partners)
        if _role(_STRONG_WEIGHT_POSITIONS, node, position):
            # Only a weight multiplies a batch-shaped operand in a MatMul (DETR's first value
            # projection reads the zero queries).
            if runtime or named or any(i in flow.dynamic for i in [node.input[position], *partners]):
                return "trainable"
        elif _role(_WEAK_WEIGHT_POSITIONS, node, position) and runtime:
            if not carries:
                verdict = "untrained"  # e.g. a bias on scores that only choose (TopK indices)
                continue
            # A named weight is trainable; an anonymous one only when it is a per-channel vector
            # (a bias or scale): constants with a runtime role (masks) span several axes.
            # Exponentiated before that use: a learned log-scale (Mamba's ``-exp(A_log)``, which the
            # TorchScript exporter keeps as ``onnx::Exp_N``); no mask or table is exponentiated there.
            if named or sum(1 for d in tensor.dims if d > 1) == 1 or _exponentiated(m, name, flow):
                return "trainable"
    return verdict


def _exponentiated(m: _Model, name: str, flow: _Flow) -> bool:
    """Whether an ``Exp`` reads initializer ``name`` or what keeps it the weight (:func:`_passes_weight`)."""
    stack, seen = [name], {name}
    while stack:
        for index, position in m.consumers.get(stack.pop(), ()):
            node = m.nodes[index]
            if node.op_type == "Exp" and node.domain in _DEFAULT_DOMAINS:
                return True
            if _passes_weight(m, index, position, flow):
                fresh = [o for o in node.output if o and o not in seen]
                seen.update(fresh)
                stack.extend(fresh)
    return False


def _parameter_fed(m: _Model, parameters: set[str]) -> frozenset[str]:
    """Values computed from ``parameters`` without the inputs' data, through ops a gradient flows
    back through (one pass in topological order): DeBERTa's ``LayerNorm(rel_embeddings)`` and its
    projections. Shape computations and index or comparison results are not."""
    fed = set(parameters)
    for node in m.nodes:
        outputs = [o for o in node.output if o]
        if not outputs or node.op_type in _SHAPE_OPS or m.status.get(outputs[0]) == "act":
            continue
        default = node.domain in _DEFAULT_DOMAINS
        blocked_in = _NO_GRADIENT_INPUTS.get(node.op_type, ()) if default else ()
        if not any(i in fed for p, i in enumerate(node.input) if i and p not in blocked_in):
            continue
        blocked_out = _NO_GRADIENT_OUTPUTS.get(node.op_type, ()) if default else ()
        if blocked_out is not None:
            fed.update(o for p, o in enumerate(node.output) if o and p not in blocked_out)
    return frozenset(fed - parameters)


def _trained_through_parameters(m: _Model, flow: _Flow, carriers: frozenset[str], dropped: frozenset[str]) -> set[str]:
    """Weights that transform a learned table before it meets the activations: parameters too.

    DeBERTa-v2 with ``share_att_key=False`` projects its relative-position table by each layer's own
    ``pos_key_proj`` and ``pos_query_proj``: ``LayerNorm(rel_embeddings) @ W + b`` reads no graph input,
    so the exporter's ``val_N`` / ``onnx::MatMul_N`` copies of ``W`` (and TorchScript's ``b``) have
    no run-time partner, yet backpropagation trains them, as it trains the table. An initializer read
    as a weight (:func:`_weight_verdict`) by an op whose other operand is computed from parameters
    alone, and whose output a gradient flows back from, is one; repeated until nothing is added (a
    bias after its projection). A precomputed constant (a rotary table from ``inv_freq``, a causal
    mask, positions from ``Range``) is computed from no parameter, so what reads it stays a constant,
    and what the file's evidence dropped or recorded as a buffer (rotary tables, attention biases) stays out.
    """
    added = _linears_on_constants(m, carriers, dropped)
    while True:
        fed = _parameter_fed(m, m.parameters | added)
        found = {name for name in m.initializers
                 if name not in m.parameters and name not in added and name not in dropped
                 and _weight_verdict(m, name, flow, carriers, fed) == "trainable"}
        if not found:
            return added
        added |= found


def _linears_on_constants(m: _Model, carriers: frozenset[str], dropped: frozenset[str]) -> set[str]:
    """The weight and bias of a ``Linear`` applied to a constant table: ``table @ W + b``.

    Swin-v2's continuous position bias maps a constant log-spaced coordinate table through a 2-layer
    MLP to the bias added to the attention scores (transformers ``Swinv2SelfAttention``); no operand
    is computed from the inputs, yet backpropagation trains the MLP. The TorchScript exporter keeps
    ``b`` under its module path (``...continuous_position_bias_mlp.0.bias``) and ``W`` as
    ``onnx::MatMul_N``: an Add of a named ``.bias`` and a MatMul/Gemm of a float initializer, whose
    output a gradient flows back from, is such a Linear, and both are parameters (the layers after
    it read a parameter-fed value: :func:`_trained_through_parameters`). A constant fold (a rotary
    table, a mask) is no MatMul plus a named ``.bias``, and what the file's evidence dropped stays out.
    """
    found: set[str] = set()
    for node in m.nodes:
        if node.op_type != "Add" or node.domain not in _DEFAULT_DOMAINS or len(node.input) != 2:
            continue
        if node.output[0] not in carriers or m.status.get(node.output[0]) == "act":
            continue
        for position, bias in enumerate(node.input):
            if bias not in m.initializers or bias in dropped or not bias.endswith(".bias") or not is_parameter_name(bias):
                continue
            producer = m.producer.get(node.input[1 - position])
            matmul = m.nodes[producer[0]] if producer is not None else None
            if matmul is None or matmul.op_type not in ("MatMul", "Gemm") or matmul.domain not in _DEFAULT_DOMAINS:
                continue
            weight = matmul.input[1]  # x @ W (TorchScript's transposed copy) or Gemm(x, W)
            if (weight in m.initializers and weight not in dropped
                    and _np_dtype(m.initializers[weight].data_type) in _FLOAT_DTYPES):
                found.update((bias, weight))
    return found


def _find_derived_constants(m: _Model) -> None:
    """Constants the exporter folded from a parameter that is in the file too (RWKV's ``1 - time_mix``).

    An exporter-made initializer (an anonymous name, or one torch.export's record does not list)
    counted as a parameter is taken for an affine function of a named parameter of its shape that
    the file also holds, and not counted (an alias of it), when the file proves it (both have
    values and ``d == a p + b`` element for element, ``a != 0``) or, without values, when the two
    are a lerp: each multiplies an activation and one Add sums the products (``x p + y (1 - p)``).
    The second is a reading of the structure, so it is said in one warning, with the elements.
    """
    kinds = signature_kinds(m.graph)

    def exporter_made(name: str) -> bool:
        return not is_parameter_name(name) or (bool(kinds) and name not in kinds)

    named: dict[tuple[int, ...], list[str]] = {}
    for name in sorted(m.parameters):
        if not exporter_made(name):
            named.setdefault(tuple(int(d) for d in m.initializers[name].dims), []).append(name)
    unproven: list[tuple[str, str, list[int]]] = []
    for name in sorted(m.parameters):
        dims = tuple(int(d) for d in m.initializers[name].dims)
        if not exporter_made(name) or math.prod(dims) <= 1:
            continue
        for source in named.get(dims, ()):
            proof = _affine_values(m.initializers[name], m.initializers[source])
            if proof is False or (proof is None and not _lerp_partners(m, name, source)):
                continue
            m.parameters.discard(name)
            m.aliases[name] = source
            if proof is None:
                unproven.append((name, source, list(dims)))
            break
    if unproven:
        total = sum(math.prod(dims) for _, _, dims in unproven)
        listed = _limited([f"'{d}' {dims} from '{p}'" for d, p, dims in unproven], _LISTED_SHARED)
        m.warnings.append(
            f"{total:,} elements of constants the exporter made ({listed}) are each mixed with a "
            "parameter of their shape as x*p + y*q, so they are taken as folded from it (q = 1 - p, RWKV's "
            "time mix) and not counted; the file has no values to prove it: if they are parameters of "
            f"their own, the true count is {total:,} higher (export with the weights to decide)"
        )


def _affine_values(derived: onnx.TensorProto, source: onnx.TensorProto) -> bool | None:
    """Whether ``derived == a * source + b`` (``a != 0``) element for element; ``None``: no values."""
    d, p = _inline_values(derived), _inline_values(source)
    if d is None or p is None:
        return None
    d, p = d.astype(np.float64).reshape(-1), p.astype(np.float64).reshape(-1)
    if np.ptp(p) == 0:
        return False  # a constant source: any constant is affine in it, which proves nothing
    a = float(np.cov(p, d, bias=True)[0, 1] / np.var(p))
    b = float(d.mean() - a * p.mean())
    scale = max(float(np.abs(d).max()), 1.0)
    return a != 0 and bool(np.allclose(d, a * p + b, rtol=1e-5, atol=1e-6 * scale))


def _lerp_partners(m: _Model, derived: str, source: str) -> bool:
    """Both multiply an activation, and one Add sums the two products (``x p + y q``)."""
    def products(name: str) -> set[str]:
        found = set()
        for index, position in _weight_uses(m, name):
            node = m.nodes[index]
            if node.op_type != "Mul" or len(node.input) != 2 or m.status.get(node.input[1 - position]) != "act":
                return set()
            found.add(node.output[0])
        return found

    mine, theirs = products(derived), products(source)
    for value in mine:
        for index, _ in m.consumers.get(value, ()):
            node = m.nodes[index]
            if node.op_type == "Add" and any(i in theirs for i in node.input):
                return True
    return False


def _scalar_slope(m: _Model, name: str) -> bool:
    """A one-element initializer that is a PRelu slope (``nn.PReLU()`` learns one shared slope) or the
    bias of ``nn.Linear(n, 1)`` (DLRM's and every binary classifier's, reward and value heads' last
    layer): a Gemm's, or added to a MatMul by a weight of one output column (the form a 3-D input
    exports, ELECTRA's discriminator head)."""
    for i, p in _weight_uses(m, name):
        node = m.nodes[i]
        if node.op_type in ("PRelu", "Gemm") and p == (1 if node.op_type == "PRelu" else 2):
            return True
        if node.op_type == "Add" and len(node.input) == 2 and _one_column_matmul(m, node.input[1 - p]):
            return True
    return False


def _one_column_matmul(m: _Model, value: str) -> bool:
    """Whether ``value`` is a MatMul's output whose right operand is an initializer of last dim 1."""
    producer = m.producer.get(value)
    if producer is None or m.nodes[producer[0]].op_type != "MatMul":
        return False
    weight = m.initializers.get(m.nodes[producer[0]].input[1])
    return weight is not None and len(weight.dims) >= 2 and int(weight.dims[-1]) == 1


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
    The dynamo exporter keeps a shared weight shared, except the transposed weight of a ``Linear``
    called more than once (:func:`_find_module_copies`) and the folded transpose of a tied head whose table it
    named after the output layer (:func:`_find_dynamo_head_copies`); its other anonymous ``val_N`` copies are
    untied weights and are left alone.
    """
    tables = _gathered_tables(m)
    _find_dynamo_head_copies(m, tables)
    for name in sorted(m.parameters):
        if not _TORCHSCRIPT_FOLDED.match(name):
            continue
        shape = tuple(int(d) for d in m.initializers[name].dims)
        candidates = tables.get(tuple(reversed(shape)), []) if len(shape) == 2 and shape[0] != shape[1] else []
        if not candidates and len(shape) == 2:
            _warn_concatenated_copy(m, name, shape, tables)
        if len(candidates) != 1 or not _head_weight(m, name):
            continue
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


_DYNAMO_FOLDED = re.compile(r"^val_\d+$")
_OUTPUT_MODULES = frozenset({"lm_head", "decoder", "proj_out", "output", "output_layer", "embed_out", "head"})
"""The module names of an output projection (transformers' ``lm_head``, BERT's and ModernBERT's ``decoder``,
Whisper's ``proj_out``, GPT-NeoX's ``embed_out``, Megatron's ``output_layer``)."""


def _find_dynamo_head_copies(m: _Model, tables: dict[tuple[int, ...], list[str]]) -> None:
    """The dynamo exporter's folded transposed copy (``val_N``) of a tied LM head whose shared table it named after
    the head: torch.export names a tied parameter once, and where that name is the output layer's (MPT's
    ``model.lm_head.weight``, ModernBERT's ``model.decoder.weight``) and the ``Gather`` reads it, the head's
    ``MatMul`` reads the table's transpose, which the exporter may fold into a new constant. An untied head's
    table is named after the embedding (``embed_tokens``, ``wte``) and is left alone. Without values the copy
    stays counted with a warning (as :func:`_find_tied_copies` does for TorchScript); with them, an equal copy is
    an alias."""
    for name in sorted(m.parameters):
        shape = tuple(int(d) for d in m.initializers[name].dims)
        if not _DYNAMO_FOLDED.match(name) or len(shape) != 2 or shape[0] == shape[1]:
            continue
        candidates = tables.get(tuple(reversed(shape)), [])
        module = candidates[0].split(".")[-2] if len(candidates) == 1 and "." in candidates[0] else ""
        if module not in _OUTPUT_MODULES or not _head_weight(m, name):
            continue
        copy, table = _inline_values(m.initializers[name]), _inline_values(m.initializers[candidates[0]])
        if copy is not None and table is not None:
            if np.array_equal(copy, table.T):
                m.aliases[name] = candidates[0]
                m.parameters.discard(name)
            continue
        m.warnings.append(
            f"'{name}' {list(shape)} may be a transposed copy of the tied embedding '{candidates[0]}' (the dynamo "
            "exporter named the shared table after the output layer and folded the head's transpose into a new "
            f"constant), but the file has no values to prove it; it is counted ({math.prod(shape):,} parameters): "
            "if the model ties them, the true count is that much lower (export with the weights to decide)")


def _warn_frozen_norms(m: _Model) -> None:
    """Warn when a Conv's output is scaled then shifted per channel by ``[1, C, 1, 1]`` constants the TorchScript
    exporter made (``onnx::Mul_N``, ``onnx::Add_N``): a frozen BatchNorm's ``x * scale + shift``, folded from its
    weight, bias and running statistics, all buffers (transformers' ``DetrFrozenBatchNorm2d``, torchvision's
    ``FrozenBatchNorm2d``). A learned per-channel affine written with reshaped parameters folds the same way, so
    they stay counted; the warning says by how much the count is too high if they are buffers."""
    found: list[str] = []
    for node in m.nodes:
        if node.op_type != "Conv":
            continue
        chain, value = [], node.output[0]
        for op_type in ("Mul", "Add"):
            users = m.consumers.get(value, [])
            step = m.nodes[users[0][0]] if len(users) == 1 else None
            other = step.input[1 - users[0][1]] if step is not None and step.op_type == op_type else ""
            dims = [int(d) for d in m.initializers[other].dims] if other in m.initializers else []
            if not (_TORCHSCRIPT_FOLDED.match(other) and len(dims) == 4 and dims[0] == dims[2] == dims[3] == 1):
                break  # not [1, C, 1, 1]
            chain.append(other)
            value = step.output[0]
        if len(chain) == 2:
            found += [name for name in chain if name in m.parameters and name not in found]
    if found:
        counted = sum(math.prod(int(d) for d in m.initializers[name].dims) for name in found)
        m.warnings.append(
            f"{len(found)} per-channel scale and shift constant(s) the exporter made after Convs "
            f"({_limited(found, 2)}) match a frozen BatchNorm folded from its buffers (DETR's backbone, "
            f"torchvision's FrozenBatchNorm2d); they are counted ({counted:,} parameters): if the model freezes "
            "those norms, the true count is that much lower")


def _gathered_tables(m: _Model) -> dict[tuple[int, ...], list[str]]:
    """Shape -> the named 2-D parameters read as a ``Gather``'s table (embedding tables) of that shape."""
    tables: dict[tuple[int, ...], list[str]] = {}
    for name in m.parameters:
        shape = tuple(int(d) for d in m.initializers[name].dims)
        if len(shape) == 2 and is_parameter_name(name):
            if any(m.nodes[i].op_type == "Gather" and p == 0 for i, p in _weight_uses(m, name)):
                tables.setdefault(shape, []).append(name)
    return tables


def _token_table(m: _Model, name: str) -> bool:
    """Whether some ``Gather`` reads table ``name`` at a graph input's indices (token ids, through a ``Cast``
    at most), not at computed positions (Whisper's ``embed_positions``)."""
    def from_input(value: str) -> bool:
        if value in m.inputs:
            return True
        index = m.producer.get(value, (None,))[0]
        return index is not None and m.nodes[index].op_type == "Cast" and m.nodes[index].input[0] in m.inputs

    return any(m.nodes[i].op_type == "Gather" and p == 0 and len(m.nodes[i].input) > 1 and from_input(m.nodes[i].input[1])
               for i, p in _weight_uses(m, name))


def _head_weight(m: _Model, name: str) -> bool:
    """Whether ``name`` is read only as a MatMul/Gemm weight whose products reach a graph output (logits)."""
    uses = _weight_uses(m, name)
    return bool(uses) and all(m.nodes[i].op_type in ("MatMul", "Gemm") and _reaches_output(m, m.nodes[i].output[0])
                              for i, _ in uses)


def _warn_concatenated_copy(m: _Model, name: str, shape: tuple[int, ...], tables: dict[tuple[int, ...], list[str]]) -> None:
    """Warn when TorchScript's folded head weight ``name`` ``[H, V]`` may hold a tied table ``[V, E]``
    (``E < H``), transposed, in its first or last ``E`` rows: MobileBERT's LM head multiplies by
    ``cat([decoder.weight.t(), dense.weight], 0)`` (transformers' ``MobileBertLMPredictionHead``), which the
    exporter folds into one initializer. The copy stays counted (a part of an initializer is not an alias);
    the warning says by how much the count is then too high, and whether the file's values prove it. Only a
    token table (:func:`_token_table`) is taken; without values an untied head wider than the token table looks
    the same, so the guess is said only for a graph with attention (a ``Softmax``: MobileBERT), not for a
    recurrent LM whose decoder reads a wider state than its embedding (the zoo's LSTM LM)."""
    rows, vocab = shape
    found = [(t, s[1]) for s, names in tables.items() for t in names if s[0] == vocab and s[1] < rows
             and _token_table(m, t)]
    if len(found) != 1 or not _head_weight(m, name):
        return
    table, width = found[0]
    copy, values = _inline_values(m.initializers[name]), _inline_values(m.initializers[table])
    if copy is not None and values is not None:
        if not (np.array_equal(copy[:width], values.T) or np.array_equal(copy[-width:], values.T)):
            return  # the values are in the file and differ: no tie
        said = "holds"
    elif any(node.op_type == "Softmax" for node in m.nodes):
        said = "may hold (the file has no values to prove it)"
    else:
        return  # a recurrent LM's decoder is often wider than its embedding: no guess without attention
    m.warnings.append(
        f"'{name}' {list(shape)} {said}, in {width} of its rows, a transposed copy of the tied embedding '{table}' "
        f"{[vocab, width]} concatenated with another weight (MobileBERT's LM head multiplies by "
        f"cat([decoder.weight.t(), dense.weight], 0), which the TorchScript exporter folds into one constant); it "
        f"is counted whole ({math.prod(shape):,} parameters): if the model ties them, the true count is "
        f"{vocab * width:,} lower (export with dynamo, which keeps the two weights, to count them exactly)"
    )


_NAMESPACE_KEY = "namespace"
"""Node metadata where torch's dynamo exporter writes ``scope: class`` for each module, the node last."""
# Modules that hold exactly one matrix: two exporter-made weights of one shape read in one call of
# such a module each are one parameter (torch 2.13's ``linear``; transformers' GPT-2 ``Conv1D``).
_ONE_WEIGHT_MODULES = frozenset({"torch.nn.modules.linear.Linear", "transformers.pytorch_utils.Conv1D"})


def _module_class(m: _Model, index: int) -> str | None:
    """The class of the innermost module a node belongs to (dynamo's ``namespace``), else None."""
    for prop in m.nodes[index].metadata_props:
        if prop.key == _NAMESPACE_KEY and "/" in prop.value:
            return prop.value.rsplit("/", 2)[-2].rsplit(": ", 1)[-1]
    return None


def _find_module_copies(m: _Model) -> None:
    """Exporter-made weights read by one ``nn.Linear`` called more than once are one parameter.

    A module called again (ALBERT's cross-layer sharing: one layer applied ``num_hidden_layers``
    times) reads one weight, but torch 2.13's dynamo exporter folds the ``Transpose`` of each call
    into its own ``val_N`` constant, so the file holds one anonymous copy per call. The file names
    the module of each call (``name_scopes``) and its class (``namespace``); a ``Linear`` (or
    ``Conv1D``) holds one matrix, so copies of one shape read in one such module are the same
    parameter: the first is kept, and the ops read it in place of the others (same axes), which
    leave the count, with one warning. Copies whose values the file holds and which differ are left alone.
    """
    kinds = signature_kinds(m.graph)
    groups: dict[tuple[str, tuple[int, ...], int], list[str]] = {}
    for name in sorted(m.parameters, key=lambda n: min((i for i, _ in _weight_uses(m, n)), default=0)):
        if is_parameter_name(name) and (not kinds or name in kinds):
            continue  # named by the model: the exporter kept it shared
        uses = _weight_uses(m, name)
        scopes = {_scope(m, i) for i, _ in uses if any(p.key == _NAME_SCOPES_KEY for p in m.nodes[i].metadata_props)}
        if (len(uses) != 1 or len(scopes) != 1 or m.nodes[uses[0][0]].op_type not in ("MatMul", "Gemm")
                or _module_class(m, uses[0][0]) not in _ONE_WEIGHT_MODULES):
            continue
        tensor = m.initializers[name]
        groups.setdefault((scopes.pop(), tuple(int(d) for d in tensor.dims), uses[0][1]), []).append(name)
    copies: list[tuple[str, str, int]] = []  # (copy, kept, elements)
    for (_scope_name, dims, _position), names in groups.items():
        kept = names[0]
        for name in names[1:]:
            values, first = _inline_values(m.initializers[name]), _inline_values(m.initializers[kept])
            if values is not None and first is not None and not np.array_equal(values, first):
                continue
            m.shared_copies[name] = kept
            m.parameters.discard(name)
            copies.append((name, kept, math.prod(dims)))
    if copies:
        listed = _limited([f"'{c}' of '{k}'" for c, k, _ in copies], _LISTED_SHARED)
        m.warnings.append(
            f"{len(copies)} weight(s) the exporter made are copies read by a Linear module called more than "
            f"once (a layer shared across depth, as ALBERT's, or a projection of two tensors, as DeBERTa's of its "
            f"position table): {listed}; each is counted once "
            f"({sum(n for *_, n in copies):,} elements not counted again)"
        )


# Ops that read a vector parameter as a weight of their own matrix: cross-layer sharing of these
# (ALBERT, universal transformers) makes a shared norm plausible too.
_MATRIX_READERS = frozenset({"MatMul", "Gemm", "Conv", "ConvTranspose", "Einsum"})
_LISTED_SHARED = 3  # names a warning lists, as importers.param_evidence's _NAMED_LIMIT
_NAME_SCOPES_KEY = "pkg.torch.onnx.name_scopes"
"""Node metadata where torch's dynamo exporter writes the module path (a list, the node last)."""


def _scope(m: _Model, index: int) -> str | None:
    """The module a node belongs to, ``None`` when the file does not say.

    The dynamo exporter records the module path in ``pkg.torch.onnx.name_scopes`` (the last entry is
    the node itself); the TorchScript exporter names nodes ``/model/layers.0/input_layernorm/Mul_1``
    (the module is the name without its last component).
    """
    node = m.nodes[index]
    for prop in node.metadata_props:
        if prop.key == _NAME_SCOPES_KEY:
            return prop.value.rsplit(",", 1)[0]
    return node.name.rsplit("/", 1)[0] if "/" in node.name else None


def _warn_folded_linear_weights(m: _Model) -> None:
    """One warning for each ``Linear`` whose weight the exporter folded into a constant input.

    A Linear applied to a constant table (Swin-v2's continuous position bias MLP) is ``table @ W.T + b``:
    the dynamo exporter computes ``table @ W.T`` at export time, so the file holds the product (an
    exporter-made ``val_N`` of the table's shape with ``out_features`` last) and the bias, not ``W``.
    Found by the Add of dynamo's ``linear`` (``namespace`` names ``torch.nn.modules.linear.Linear``)
    whose operands are a counted bias and an initializer that is no parameter; ``in_features`` is not
    in the file, so the warning gives the shortfall per input feature.
    """
    short: list[tuple[str, str, list[int]]] = []
    for index, node in enumerate(m.nodes):
        if node.op_type != "Add" or len(node.input) != 2 or _module_class(m, index) not in _ONE_WEIGHT_MODULES:
            continue
        bias, folded = (node.input if node.input[0] in m.parameters else node.input[::-1])
        if bias in m.parameters and folded in m.initializers and folded not in m.parameters and folded not in m.aliases:
            short.append((bias, folded, [int(d) for d in m.initializers[folded].dims]))
    if short:
        listed = _limited([f"'{b}' with '{f}' {dims}" for b, f, dims in short], _LISTED_SHARED)
        per_feature = sum(math.prod(m.initializers[b].dims) for b, _, _ in short)
        m.warnings.append(
            f"{len(short)} Linear module(s) read a constant input whose product with the weight the exporter "
            f"computed at export time (a table through an MLP, as Swin-v2's continuous position bias): {listed}; "
            f"those weights are not in the file and not counted, so the true count is higher by {per_feature:,} "
            f"x in_features (export with TorchScript, which keeps them, to count them)"
        )


def _modules(m: _Model, name: str, ops: frozenset[str] | None = None) -> set[str]:
    """The modules of the nodes that read parameter ``name`` (those of op types ``ops`` only)."""
    found = {_scope(m, i) for i, _ in _weight_uses(m, name) if ops is None or m.nodes[i].op_type in ops}
    return {s for s in found if s is not None}


def _warn_shared_vectors(m: _Model) -> None:
    """One warning when a vector parameter is read by norms or per-channel ops of several modules.

    The TorchScript exporter merges initializers of equal values into one, read through ``Identity``
    copies; a freshly initialised model's norm scales are all ones (biases zeros), so a graph-only
    export of a model built from a config holds one scale for every norm, which reads exactly as a
    tie. A real tie is kept (the count does not change), but norms almost never share weights across
    layers, so a 1-D parameter (one axis over 1) read in two modules or more (:func:`_scope`: a node
    whose module the file does not name is not counted) is named with the elements the count would
    gain if the modules hold weights of their own: ``(modules - 1) x elements``. Not said when the
    file holds the values and they are not all equal (no exporter merges differing tensors: a real
    tie), nor when the graph shares a matrix across modules too (ALBERT's cross-layer sharing). An
    embedding tied to the LM head is a matrix: never named.
    """
    matrices = [n for n in m.parameters if sum(1 for d in m.initializers[n].dims if d > 1) >= 2]
    if any(len(_modules(m, name, _MATRIX_READERS)) > 1 for name in matrices):
        return
    shared: list[tuple[str, int, int]] = []  # (name, modules reading it, elements)
    for name in sorted(m.parameters):
        dims = [int(d) for d in m.initializers[name].dims]
        if sum(1 for d in dims if d > 1) != 1:
            continue
        modules = _modules(m, name)
        values = _inline_values(m.initializers[name]) if len(modules) > 1 else None
        if len(modules) > 1 and (values is None or np.ptp(values) == 0):
            shared.append((name, len(modules), math.prod(dims)))
    if not shared:
        return
    rise = sum((readers - 1) * numel for _, readers, numel in shared)
    listed = _limited([f"'{name}' [{numel}] by {readers} modules" for name, readers, numel in shared], _LISTED_SHARED)
    m.warnings.append(
        f"{len(shared)} vector parameter(s) are each read as the norm scale, bias or per-channel weight of "
        f"several modules ({listed}) and counted once, as tied weights; norms are rarely tied across "
        f"layers: if they are separate weights the true count is {rise:,} higher (the TorchScript exporter "
        "and the dynamo exporter's optimizer (onnx_ir's DeduplicateInitializersPass) merge equal initializers, as a "
        "freshly initialised model's ones are; export trained or randomised weights to count exactly)"
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
        status[name] = "param" if name in m.parameters or name in m.aliases or name in m.shared_copies else "const"
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
