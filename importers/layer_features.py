r"""What a transformer's layers compute beyond their sizes (:class:`LayerFeatures`), and the
structural tests that find each feature; :mod:`importers.transformer` applies them to the blocks it
recognised. Launchers that build the model from flags (Megatron-LM) must reproduce every feature or
refuse (issue 25: "exact or refused").

* The MLP activation, from the ops' ONNX node types (:func:`mlp_activation`), a ``Gelu`` node's form (its
  ``approximate`` attribute) read from the file (:func:`mlp_activation_of`, :mod:`importers.gelu_form`).
* A sandwich norm (Gemma-2): a norm on a sub-layer's output that feeds no matmul (:func:`sandwich_norm`).
* Post-LN (the original Transformer and BERT), ``y = norm(x + f(x))``: each sub-layer reads the residual
  stream itself, its residual add reads that same tensor, and a norm reads the sum; pre-LN (GPT-2, Llama)
  adds ``f(norm(x))`` to ``x`` itself (:func:`residual_after_norm`). What writes the first layer's input
  (BERT's embedding norm, ALBERT's and ELECTRA's embedding projection) does not decide it.
* The attention mask, causal or bidirectional, read by the importer from the ONNX nodes
  (:attr:`planner.core.graph.OpGraph.attention_masks`; :func:`attention_mask_of`).
* A position bias on the scores, ALiBi (BLOOM): :attr:`planner.core.graph.OpGraph.attention_biases`
  (:func:`alibi_of`).
* Parallel attention and MLP (GPT-J, GPT-NeoX, Falcon, Phi): ``x + attn(norm(x)) + mlp(norm(x))``,
  the MLP not downstream of the attention's output (:func:`parallel_sublayers`).
* QK-norm (Qwen3, Gemma-3 per head; OLMo-2 over the whole projection): :mod:`importers.qk_norm`,
  one kind for the stack (:func:`stack_qk_norm`).
* The scores' scale, read from the file's nodes (:func:`attention_scale_of`).
* OLMo-2's reordered norm, ``x + norm(f(x))``: output norms (:func:`sandwich_norm`) and no sub-layer
  input written by a norm (:func:`inputs_unnormalised`).
* Zero-centred norm scales, ``norm(x) * (1 + w)`` (Gemma's RMSNorm, NeMo's LayerNorm1P), read from the
  file's ``weight + 1`` (:mod:`importers.zero_centred`; :func:`zero_centred_norms`).
"""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Callable, Iterable, Literal

from importers.attention_scale import attention_scales
from importers.gelu_form import gelu_forms
from importers.qk_norm import QkNorm
from importers.zero_centred import norm_scale_offsets
from planner.core.graph import AttentionMask, OpGraph

__all__ = ["MlpActivation", "LayerFeatures", "mlp_activation", "mlp_activation_of", "squared_relu", "sandwich_norm", "residual_after_norm",
           "attention_mask_of", "alibi_of", "parallel_sublayers", "stack_qk_norm", "inputs_unnormalised",
           "attention_scale_of", "ZeroCentred", "zero_centred_norms"]

MlpActivation = Literal["silu", "scaled-sigmoid", "gelu-tanh", "gelu-erf", "gelu", "relu", "squared-relu", "other"]
"""An MLP's activation, from its ops' ONNX node types (:func:`mlp_activation`): ``silu`` is
``x * sigmoid(x)``, ``scaled-sigmoid`` ``x * sigmoid(a x)`` (quick-GELU), ``gelu-tanh`` GELU's tanh
approximation (Gemma's ``gelu_pytorch_tanh``, GPT-2's ``gelu_new``; a ``Tanh`` node, a ``Gelu`` with
``approximate="tanh"``, onnxruntime's ``FastGelu``), ``gelu-erf`` the exact GELU (an ``Erf``, a ``Gelu`` with
``approximate="none"``, ``BiasGelu``), ``gelu`` a ``Gelu`` whose form was not read (no file: the
exporters take it for erf), ``squared-relu`` ``relu(x)^2`` (Persimmon's and Nemotron-H's ``relu2``; Megatron-LM's
``--squared-relu``; :func:`squared_relu`), ``relu`` ReLU, ``other`` a nonlinearity none of these names (node types
of :data:`_OTHER_NONLINEAR` and none of :data:`_ACTIVATIONS`: Apertus' xIELU, ``Where(x > 0, a x^2 + b x,
a' (expm1(min(x, eps)) - x) + b x)``, h29g)."""

ZeroCentred = Literal["none", "all", "mixed", "other"]
"""How the norms with a weight scale (:func:`zero_centred_norms`): ``all`` by ``1 + w`` (zero-centred),
``none`` by ``w``, ``mixed`` some each way, ``other`` some by ``w + c`` with ``c`` not 1 or not in the file."""


@dataclass(frozen=True, slots=True, kw_only=True)
class LayerFeatures:
    """What the layers compute beyond their sizes, read from the ops' ONNX node types and edges.

    Launchers that build the model from flags (Megatron-LM) must reproduce each of these or refuse.
    """

    mlp_activation: MlpActivation | None = None
    """The MLPs' activation (``None``: not recorded, as in hand-built graphs, or none found)."""
    attention_softcap: bool = False
    """A ``tanh`` between the attention scores and the softmax: ``cap * tanh(s / cap)`` (Gemma-2)."""
    logit_softcap: bool = False
    """A ``tanh`` on the LM head's logits (Gemma-2's final-logit soft-capping)."""
    post_attention_norm: bool = False
    """A norm on the attention output before the residual add (Gemma-2's sandwich norms)."""
    post_mlp_norm: bool = False
    """A norm on the MLP output before the residual add."""
    attention_mask: AttentionMask = "unknown"
    """Every attention's mask (:data:`~planner.core.graph.AttentionMask`): ``causal`` or
    ``bidirectional`` when the importer proved it for every layer, else ``unknown``."""
    post_layernorm: bool = False
    """Post-LN: the residual adds the sub-layers' *normalised* input, ``norm(x + f(x))`` (BERT), not
    ``x + f(norm(x))`` (pre-LN, GPT-2 and its descendants)."""
    alibi: bool = False
    """ALiBi: some attention adds per-head slopes times key positions to its scores (BLOOM, MPT)."""
    parallel_residual: bool = False
    """Some layer's MLP reads the layer's input, not the attention's output: both sub-layers run in
    parallel on ``x`` and add to it together (GPT-J, GPT-NeoX, Falcon, Phi)."""
    qk_norm: QkNorm = "none"
    """Every attention's QK-norm (:data:`importers.qk_norm.QkNorm`): ``per-head`` (Qwen3, Gemma-3),
    ``whole-projection`` (OLMo-2), ``none``; attention blocks that differ read ``whole-projection``
    unless none has one, so that a launcher's per-head flag is never applied to a mixed stack."""
    reordered_norm: bool = False
    """Norms on the sub-layers' outputs and none on their inputs, ``x + norm(f(x))`` (OLMo-2's
    "reordered norm"): neither pre-LN nor Gemma-2's sandwich."""
    attention_scale: float | None = None
    """The constant every attention's scores are scaled by, read from the file's ONNX nodes
    (:mod:`importers.attention_scale`; Gemma's ``query_pre_attn_scalar ** -0.5``); ``None``: not read
    (no file, the scale applied elsewhere, or layers that differ)."""
    stream_scales: tuple[str, ...] = ()
    """Where a factor scales the residual stream or the logits (:func:`stream_scales`): ``"embedding"``,
    ``"attention output"``, ``"logits"`` (Granite's embedding, residual and logits multipliers,
    Gemma's embedding normaliser, a LayerScale)."""
    zero_centred_norms: ZeroCentred = "none"
    """Whether the norms scale by ``1 + w`` (:data:`ZeroCentred`; Gemma's RMSNorm and NeMo's LayerNorm1P:
    ``all``), read from the file's ``weight + 1`` (:func:`zero_centred_norms`); ``none`` without a file."""


_ACTIVATIONS: tuple[tuple[str, MlpActivation], ...] = (
    ("Tanh", "gelu-tanh"), ("Erf", "gelu-erf"), ("Gelu", "gelu"), ("FastGelu", "gelu-tanh"), ("BiasGelu", "gelu-erf"),
    ("QuickGelu", "scaled-sigmoid"), ("Sigmoid", "silu"), ("Relu", "relu"),
)
"""Node type -> activation, the first found wins. A ``Gelu`` node's form is an attribute, not its type
(:mod:`importers.gelu_form`): by type alone it is ``gelu``; onnxruntime's contrib ``FastGelu`` is the tanh
approximation, ``BiasGelu`` erf GELU and ``QuickGelu`` ``x sigmoid(1.702 x)`` (its ``alpha``; onnxruntime
``docs/ContribOperators.md``)."""


_OTHER_NONLINEAR = frozenset({"Exp", "Log", "Softplus", "Softsign", "Elu", "Selu", "Celu", "LeakyRelu", "PRelu",
                               "ThresholdedRelu", "Mish", "HardSigmoid", "HardSwish"})
"""ONNX node types that make an MLP's activation nonlinear when none of :data:`_ACTIVATIONS` is there: the activation
is then ``other`` (read, but none a launcher names), not ``None`` (none found)."""


def mlp_activation(types: tuple[str, ...]) -> MlpActivation | None:
    """The activation among an MLP's node types (its ``fc1`` ops' and glue's, main nodes included).

    >>> mlp_activation(("MatMul", "Sigmoid", "Mul", "Mul")), mlp_activation(("MatMul", "Mul", "Sigmoid", "Mul"))
    ('silu', 'scaled-sigmoid')
    >>> mlp_activation(("MatMul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul", "Mul"))
    'gelu-tanh'
    >>> mlp_activation(("MatMul", "Greater", "Mul", "Add", "Min", "Exp", "Sub", "Where")), mlp_activation(("MatMul",))
    ('other', None)
    """
    for node_type, activation in _ACTIVATIONS:
        if node_type in types:
            at = types.index(node_type)
            # x * sigmoid(a x): a Mul after the op's matmul and before the Sigmoid (quick-GELU)
            after_matmul = types[1:at] if types[0] in ("MatMul", "Gemm", "Split") else types[:at]
            return "scaled-sigmoid" if activation == "silu" and "Mul" in after_matmul else activation
    return "other" if _OTHER_NONLINEAR.intersection(types) else None


def squared_relu(types: tuple[str, ...]) -> bool:
    """Whether one op's node types square a ReLU: a ``Relu`` followed at once by ``Pow`` or ``Mul`` (transformers'
    ``relu2``, ``torch.square(relu(x))``, exports as ``Mul(r, r)`` or ``Pow(r, 2)``; Megatron-LM's ``--squared-relu``
    is ``torch.pow(F.relu(x), 2)``, megatron-core 0.16.1 ``core/activations.py:9-11``). One op, not an MLP's
    ops in a row: a gated ReLU's ``Mul`` of gate and up is an op of its own (two matmuls write it). The rule
    reads types, not the exponent or the ``Mul``'s second input, so a ReLU scaled in the same op reads as squared.

    >>> squared_relu(("MatMul", "Add", "Relu", "Mul")), squared_relu(("MatMul", "Relu")), squared_relu(("Relu", "Add"))
    (True, False, False)
    """
    at = types.index("Relu") if "Relu" in types else -1
    return at >= 0 and types[at + 1:at + 2] in (("Pow",), ("Mul",))


def mlp_activation_of(graph: OpGraph, indices: Iterable[int]) -> MlpActivation | None:
    """:func:`mlp_activation` of the node types of the ops ``indices`` (in that order), a ``Gelu`` told by
    its form in the graph's file (:func:`importers.gelu_form.gelu_forms`): ``approximate="tanh"`` ->
    ``gelu-tanh``, ``"none"`` -> ``gelu-erf``. ``gelu`` (form not read) without a file, for a ``Gelu``
    of an unknown domain, or when the ops' GELU nodes differ.

    >>> from types import SimpleNamespace as N
    >>> ops = (N(node_types=("MatMul", "Add"), onnx_nodes=("mm", "add")), N(node_types=("Gelu",), onnx_nodes=("g",)))
    >>> mlp_activation_of(N(ops=ops, source_path=""), [0, 1])
    'gelu'
    """
    ops = [graph.ops[i] for i in indices]
    found = mlp_activation(tuple(t for op in ops for t in op.node_types))
    if found == "relu" and any(squared_relu(op.node_types) for op in ops):
        return "squared-relu"
    path = graph.source_path
    if found != "gelu" or not path or not Path(path).is_file():
        return found
    forms = gelu_forms(str(path), getattr(graph, "source_sha256", ""))
    read = {forms[n] for op in ops for n in op.onnx_nodes or (op.name,) if n in forms}
    return read.pop() if len(read) == 1 else found


def sandwich_norm(graph: OpGraph, fwd: Callable[[int], Iterable[int]], sources: Iterable[int]) -> bool:
    """Whether a norm reads one of ``sources`` and feeds no matmul (a norm applied to a sub-layer's
    output before the residual add: a sandwich norm, not the next sub-layer's input norm)."""
    ops = graph.ops
    for source in sources:
        for consumer in fwd(source):
            if ops[consumer].kind == "norm" and not any(ops[c].kind in ("matmul", "norm") for c in fwd(consumer)):
                return True
    return False


_ELEMENTWISE_HOPS = 3  # residual add after the sub-layer's last linear: fused into it, or 1-2 ops on


def residual_after_norm(
    graph: OpGraph, fwd: Callable[[int], Iterable[int]], blocks: Iterable[tuple[str, int | None, Iterable[int]]]
) -> bool:
    """Whether every sub-layer is post-LN; ``blocks``: per sub-layer, its input tensor, the op that
    writes it and its last linears (attention's output projection, the MLP's ``fc2``).

    The rule follows the residual stream. A sub-layer is post-LN when its residual add (the last linear
    itself, when the exporter fused the add into it, or an elementwise op at most
    :data:`_ELEMENTWISE_HOPS` on) reads the sub-layer's own input, so no norm stands between the stream
    and the sub-layer, and a norm reads that sum (at most :data:`_ELEMENTWISE_HOPS` elementwise ops on):
    ``norm(x + f(x))``. Pre-LN's add reads the norm's input, not the sub-layer's, ``x + f(norm(x))``;
    OLMo-2's reordered norm, ``x + norm(f(x))``, reaches its add through a norm, not elementwise ops; a
    model without norms normalises no sum. None of these asks what writes the input, so the first
    layer's input may be an embedding norm's output (BERT) or a linear's, ALBERT's and ELECTRA's
    projection of their narrower embeddings after the embedding norm (issue 25: that projection read
    the stack as pre-LN). A sub-layer whose input is a plain ``Add`` (DETR's ``x + pos`` that the queries and
    keys read, the values reading ``x``) may have either operand as the stream its residual add reads; where
    ``x`` is a constant (DETR's first decoder layer: zero queries) the sub-layer decides nothing.
    No sub-layers, or one that is not post-LN: ``False``.

    >>> from types import SimpleNamespace as N
    >>> def op(kind, *reads): return N(kind=kind, inputs=[N(tensor=t) for t in reads])
    >>> # post-LN: proj 0 reads "x"; fc2 1 -> add 2 (reads "x") -> norm 3
    >>> post = N(ops=[op("matmul", "e"), op("matmul", "h"), op("elementwise", "f", "x"), op("norm", "s")])
    >>> edges = {1: [2], 2: [3]}
    >>> residual_after_norm(post, lambda i: edges.get(i, []), [("x", 0, (1,))])
    True
    >>> # pre-LN: the sub-layer reads "n" = norm 0 ("x"); its add reads "x"
    >>> pre = N(ops=[op("norm", "x"), op("matmul", "h"), op("elementwise", "f", "x"), op("norm", "s")])
    >>> residual_after_norm(pre, lambda i: edges.get(i, []), [("n", 0, (1,))])
    False
    >>> # DETR: the queries read "q" = add 0 ("x" + "p"); the residual add 2 reads "x", norm 3 the sum
    >>> detr = N(ops=[op("elementwise", "x", "p"), op("matmul", "h"), op("elementwise", "f", "x"), op("norm", "s")])
    >>> detr.ops[0].node_types = ("Add",)
    >>> residual_after_norm(detr, lambda i: edges.get(i, []), [("q", 0, (1,))])
    True
    >>> # pre-LN with positions: "q" = norm_out "n" + "p", the residual add reads "x" (the norm's input)
    >>> pre_pos = N(ops=[op("elementwise", "n", "p"), op("matmul", "h"), op("elementwise", "f", "x"), op("norm", "s")])
    >>> pre_pos.ops[0].node_types = ("Add",)
    >>> residual_after_norm(pre_pos, lambda i: edges.get(i, []), [("q", 0, (1,))])
    False
    """
    ops, seen_any = graph.ops, False
    for tensor, writer, lasts in blocks:
        # DETR adds positions to the queries and keys only (q = k = x + pos, v = x): the stream is the add's operand
        added = writer is not None and ops[writer].kind == "elementwise" and ops[writer].node_types == ("Add",)
        if added and len(ops[writer].inputs) == 1:  # type: ignore[index]
            continue  # x + pos with x a constant (DETR's decoder starts from zero queries): no stream to read here
        inputs = {tensor} | ({a.tensor for a in ops[writer].inputs} if added else set())  # type: ignore[index]
        frontier, add = list(lasts), None
        for _ in range(_ELEMENTWISE_HOPS + 1):
            add = next((i for i in frontier if any(a.tensor in inputs for a in ops[i].inputs)), None)
            if add is not None:
                break
            frontier = [c for i in frontier for c in fwd(i) if ops[c].kind == "elementwise"]
        if add is None or not _sum_normalised(graph, fwd, add):
            return False
        seen_any = True
    return seen_any


def _sum_normalised(graph: OpGraph, fwd: Callable[[int], Iterable[int]], add: int) -> bool:
    """Whether a norm reads ``add``'s output, or an elementwise op's at most :data:`_ELEMENTWISE_HOPS` on."""
    frontier = [add]
    for _ in range(_ELEMENTWISE_HOPS + 1):
        after = [c for i in frontier for c in fwd(i)]
        if any(graph.ops[c].kind == "norm" for c in after):
            return True
        frontier = [c for c in after if graph.ops[c].kind == "elementwise"]
    return False


def attention_mask_of(graph: OpGraph, softmaxes: Iterable[int]) -> AttentionMask:
    """The mask every one of ``softmaxes`` (attention softmax ops) has in
    :attr:`~planner.core.graph.OpGraph.attention_masks` (by any ONNX node the op stands for);
    ``unknown`` when one is not recorded or they differ."""
    kinds: set[str] = set()
    for index in softmaxes:
        op = graph.ops[index]
        names = op.onnx_nodes or (op.name,)
        kinds.add(next((graph.attention_masks[n] for n in names if n in graph.attention_masks), "unknown"))
    return kinds.pop() if len(kinds) == 1 else "unknown"  # type: ignore[return-value]



def alibi_of(graph: OpGraph, softmaxes: Iterable[int]) -> bool:
    """Whether any of ``softmaxes`` (attention softmax ops) has an ALiBi bias in
    :attr:`~planner.core.graph.OpGraph.attention_biases` (by any ONNX node the op stands for)."""
    for index in softmaxes:
        op = graph.ops[index]
        if any(graph.attention_biases.get(n) == "alibi" for n in op.onnx_nodes or (op.name,)):
            return True
    return False


def parallel_sublayers(fwd: Callable[[int], Iterable[int]], layers: Iterable[tuple[Iterable[int], int]]) -> bool:
    """Whether some layer's MLP is not downstream of its attention; ``layers``: per layer, the attention's
    output projections and the first linear of the MLP that follows them (ops in topological order, so
    the walk forward from the projections stops past that linear's index).

    >>> chain = {0: [1], 1: [2], 2: [3]}.get  # out_proj 0 -> add 1 -> norm 2 -> fc1 3: sequential
    >>> parallel_sublayers(lambda i: chain(i, []), [((0,), 3)])
    False
    >>> parallel = {0: [4], 2: [3], 3: [4]}.get  # fc1 3 reads norm 2 of the input; both meet at add 4
    >>> parallel_sublayers(lambda i: parallel(i, []), [((0,), 3)])
    True
    """
    for outs, fc1 in layers:
        stack, seen = list(outs), set()
        while stack:
            index = stack.pop()
            if index == fc1:
                break
            if index in seen or index > fc1:
                continue
            seen.add(index)
            stack += list(fwd(index))
        else:
            return True
    return False


def stack_qk_norm(kinds: Iterable[QkNorm]) -> QkNorm:
    """One QK-norm kind for the attention blocks' ``kinds``: theirs when they agree, ``none`` without
    blocks, else ``whole-projection`` (a mixed stack no launcher's one flag reproduces).

    >>> stack_qk_norm(["per-head"] * 4), stack_qk_norm(["per-head", "none"]), stack_qk_norm([])
    ('per-head', 'whole-projection', 'none')
    """
    found = set(kinds)
    if len(found) > 1:
        return "whole-projection"
    return found.pop() if found else "none"


def inputs_unnormalised(graph: OpGraph, writers: Iterable[int | None]) -> bool:
    """Whether no sub-layer input is a norm's output; ``writers``: per sub-layer, the op writing its
    input (:func:`residual_after_norm`'s blocks). With output norms, OLMo-2's reordered norm.

    >>> from types import SimpleNamespace as N
    >>> g = N(ops=(N(kind="norm"), N(kind="elementwise")))
    >>> inputs_unnormalised(g, [1, 1]), inputs_unnormalised(g, [1, 0]), inputs_unnormalised(g, [])
    (True, False, False)
    """
    found = list(writers)
    return bool(found) and all(w is None or graph.ops[w].kind != "norm" for w in found)


def attention_scale_of(graph: OpGraph, softmaxes: Iterable[int]) -> float | None:
    """The scale :func:`importers.attention_scale.attention_scales` reads for every one of ``softmaxes``
    (attention softmax ops, by any ONNX node each stands for) in the graph's file; ``None`` without a
    file, when one is not read, or when they differ."""
    path = graph.source_path
    if not path or not Path(path).is_file():
        return None
    scales = attention_scales(str(path), getattr(graph, "source_sha256", ""))
    found: set[float | None] = set()
    for index in softmaxes:
        op = graph.ops[index]
        found.add(next((scales[n] for n in op.onnx_nodes or (op.name,) if n in scales), None))
    return found.pop() if len(found) == 1 else None


_SCALING = frozenset({"Mul", "Div"})


def stream_scales(graph: OpGraph, out_projections: Iterable[int], head: Iterable[int]) -> tuple[str, ...]:
    """Where a ``Mul`` or ``Div`` runs on the output of a token embedding, of an attention's output
    projection (before the residual add) or of the LM head: the op's node types, in graph order, have
    one after the ``Gather`` / product that the op is (an epilogue, not an input's prologue). Granite
    scales all three by constants; a pre-LN GPT layer (Megatron-LM's) scales none."""

    def scaled(index: int) -> bool:
        types = graph.ops[index].node_types
        first = next((k for k, t in enumerate(types) if t in ("Gather", "MatMul", "Gemm")), None)
        return first is not None and bool(_SCALING & set(types[first + 1:]))

    found = {"embedding": any(scaled(i) for i, op in enumerate(graph.ops) if op.kind == "embedding"),
             "attention output": any(scaled(i) for i in out_projections),
             "logits": any(scaled(i) for i in head)}
    return tuple(name for name, on in found.items() if on)


def zero_centred_norms(graph: OpGraph) -> ZeroCentred:
    """:data:`ZeroCentred` of the graph's norm ops with a weight (the stack's, the final norm, QK-norms), from
    the ``weight + c`` each reads in the file (:func:`importers.zero_centred.norm_scale_offsets`)."""
    return _zero_centred_kind(norm_scale_offsets(graph, (i for i, op in enumerate(graph.ops) if op.kind == "norm")))


def _zero_centred_kind(offsets: list[float | None]) -> ZeroCentred:
    """One :data:`ZeroCentred` for the norms' offsets (``None``: a plain scale; ``nan``: not in the file).

    >>> _zero_centred_kind([1.0, 1.0]), _zero_centred_kind([None, None]), _zero_centred_kind([])
    ('all', 'none', 'none')
    >>> _zero_centred_kind([1.0, None]), _zero_centred_kind([1.0, float("nan")]), _zero_centred_kind([None, 2.0])
    ('mixed', 'other', 'other')
    """
    if any(c is not None and c != 1 for c in offsets):  # nan != 1: an offset the file does not hold
        return "other"
    ones = sum(c is not None for c in offsets)
    return "none" if not ones else "all" if ones == len(offsets) else "mixed"
