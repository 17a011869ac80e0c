r"""Graph-level facts the cost tables are built from: which ops price alike, who owns what, what is recomputed.

Read once per graph (:func:`_graph_facts`, cached by identity) by :mod:`objectives.tables`:

* sharing keys: ops whose cost cannot differ (same :meth:`Op.signature`, same operand shapes,
  dtypes and roles, same ownership and recompute role) get one key (:func:`_node_key`,
  :func:`_operand_key`), so they share one set of arrays;
* tied parameters (``OpGraph.parameter_aliases``, or one parameter read by several ops) are
  accounted - memory and gradient sync - once, by the first op that reads them;
* recomputation (``TrainingSettings.recompute``, :func:`_recompute_flags`): ``selective``
  recomputes the attention core (softmax ops, not a softmax cross-entropy loss, and matmuls without
  parameters, as Megatron's ``--recompute-granularity selective``), ``full`` every op of
  the repeated blocks (``OpGraph.blocks``), ``op`` (torchtitan's op-level selective checkpointing,
  :func:`_sac_saved`) every op of the repeated blocks except the outputs its policy caches (every
  other linear layer, the attention kernel); the first instance of each repeated block is charged as
  not recomputed under an execution model (:func:`_first_instance`: the working set of re-running
  one region);
* saved tensors shared between ops (:func:`_saved_sharing`, :func:`objectives.memory.shared_saved_operands`).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass, field
from typing import Any, Mapping

from objectives._common import CROSS_ENTROPY_LOSSES, is_parameter_name
from objectives.attention import FlashShape, attention_roles
from objectives.autocast import autocast_applies, operand_dtypes, stored_dtypes
from objectives.execution import execution_of
from objectives.graph_memo import graph_memo
from objectives.memory import fp8_saved_input, kept_operands, op_sac_saved, shared_saved_operands
from objectives.parameters import ParameterView, parameter_ownership
from planner.core.graph import Op, OpGraph
from planner.core.settings import TrainingSettings

__all__ = ["EdgePart", "captured_ops", "op_settings", "recomputed_share"]


@dataclass(frozen=True, slots=True, kw_only=True)
class EdgePart:
    """One tensor of an op pair: enough to re-price it for a single configuration pair."""

    tensor: str
    producer: int
    consumer: int
    producer_output: int
    consumer_input: int


def _node_key(op: Op) -> tuple:
    node = op.node
    if node is None:
        return ("no-node", op.name)
    return (
        node.op_type,
        node.domain,
        node.attributes,
        node.input_shapes,
        node.input_dtypes,
        node.output_shapes,
        node.output_dtypes,
        tuple(sorted(node.constant_inputs.items())),
        node.opset,
        getattr(node, "input_axes", ()),
        getattr(node, "output_axes", ()),
    )


def _permutable_axes(graph: OpGraph, op: Op, access) -> frozenset[int]:
    """Axes of a matmul's output that only its parameters index (a linear layer's output features).

    Permuting the weight's columns permutes those features, so a launcher lays them out as its
    consumers want (Megatron packs a fused QKV weight so that each rank's block holds its heads' q,
    k and v): redistribution compares only tile sizes on them.
    """
    if op.kind != "matmul":
        return frozenset()
    parameter_dims: set[str] = set()
    activation_dims: set[str] = set()
    for operand in op.inputs:
        dims = {d for axis in operand.axes for d in axis}
        if is_parameter_name(graph.tensors, graph.parameter_aliases, operand.tensor):
            parameter_dims |= dims
        else:
            activation_dims |= dims
    return frozenset(
        axis
        for axis, dims in enumerate(access.axes)
        if dims and all(d in parameter_dims and d not in activation_dims for d in dims)
    )


def _has_parameter(graph: OpGraph, op: Op) -> bool:
    return any(is_parameter_name(graph.tensors, graph.parameter_aliases, a.tensor) for a in op.inputs)


def _block_instances(graph: OpGraph) -> list[int]:
    """Per op, the index of the repeated-block instance it belongs to (-1: none)."""
    instance_of = [-1] * len(graph.ops)
    number = 0
    for group in graph.blocks:
        for instance in group.instances:
            for index in instance:
                instance_of[index] = number
            number += 1
    return instance_of


def _external_inputs(
    graph: OpGraph, op: Op, index: int, recomputed: list[bool], instance_of: list[int], op_index: Mapping[str, int]
) -> tuple[int, ...]:
    """Input positions produced outside the op's recomputed region (its checkpoints).

    A region is the recomputed ops of one block instance (or, outside blocks, all of them): a
    tensor from another instance, from a non-recomputed op, or a graph input is a checkpoint.
    """
    out = []
    for position, access in enumerate(op.inputs):
        tensor = graph.tensors.get(access.tensor)
        producer = tensor.producer if tensor is not None else None
        source = op_index.get(producer, -1) if producer is not None else -1
        if source < 0 or not recomputed[source] or instance_of[source] != instance_of[index]:
            out.append(position)
    return tuple(out)


def _operand_key(tensors: Mapping, op: Op) -> tuple:
    def describe(name: str) -> tuple:
        tensor = tensors.get(name)
        if tensor is None:
            return ("missing",)
        return (tensor.shape, tensor.dtype, tensor.role)

    return (tuple(describe(a.tensor) for a in op.inputs), tuple(describe(a.tensor) for a in op.outputs))


@dataclass(frozen=True, slots=True, kw_only=True, eq=False)
class _GraphFacts:
    """What :func:`build_cost_model` derives from the graph alone (not the cluster or settings).

    A pipeline search builds ~100 cost models of a handful of graphs (every stage size, micro-batch
    and recompute mode): this is worked out once per graph (:func:`_graph_facts`).
    """

    owned: tuple[tuple[int, ...], ...]
    instance_of: tuple[int, ...]
    op_index: Mapping[str, int]
    op_class: tuple[int, ...]
    """Per op, an id equal for ops of equal ``(signature, operand shapes/dtypes/roles, owned inputs)``:
    the graph part of the key that decides which ops share cost arrays."""
    node_class: tuple[int, ...]
    """Per op, an id of its ONNX node description (``measured`` ops share only on equal nodes)."""
    selective: tuple[bool, ...]
    """The ops ``recompute="selective"`` recomputes (attention core)."""
    edges: tuple[tuple, ...]
    """``(u, v, tensor, producer access, consumer access, part, pair)`` of each edge between two ops."""
    flash_shapes: tuple[FlashShape | None, ...] = ()
    """Per op, its attention core as a fused kernel sees it (:attr:`objectives.attention.AttentionCore.flash_shape`)
    for the core's two products; ``None`` elsewhere."""
    memo: dict = field(default_factory=dict)
    """Filled on first use: ``recompute`` mode -> per-op checkpoint input positions, and the
    :class:`_BuildPlan` of each (cost model, recompute, precision)."""


def _classes(keys) -> tuple[int, ...]:
    """Dense ids of hashable keys, equal ids for equal keys."""
    ids: dict = {}
    return tuple(ids.setdefault(key, len(ids)) for key in keys)


def _graph_facts(graph: OpGraph) -> _GraphFacts:
    kept = graph_memo(graph)
    if "facts" in kept:
        return kept["facts"]
    tensors = ParameterView(graph)
    owned = tuple(parameter_ownership(graph))
    edges = []
    for edge in graph.edges:
        if edge.producer == edge.consumer:
            continue
        tensor = tensors.get(edge.tensor)
        if tensor is None:
            continue
        u, v = edge.producer, edge.consumer
        part = EdgePart(
            tensor=edge.tensor, producer=u, consumer=v,
            producer_output=edge.producer_output, consumer_input=edge.consumer_input,
        )
        edges.append((
            u, v, tensor, graph.ops[u].outputs[edge.producer_output], graph.ops[v].inputs[edge.consumer_input], part,
            (u, v) if u < v else (v, u),
        ))
    found = attention_roles(graph)
    # a causal and a bidirectional core of equal shapes (T5's decoder and encoder) price apart
    work = tuple(found[i][1].flash_shape if i in found and found[i][0] in ("score", "value") else None
                 for i in range(len(graph.ops)))
    facts = _GraphFacts(
        owned=owned,
        instance_of=tuple(_block_instances(graph)),
        op_index={op.name: i for i, op in enumerate(graph.ops)},
        op_class=_classes(
            (op.signature(), _operand_key(tensors, op), owned[i], work[i]) for i, op in enumerate(graph.ops)
        ),
        node_class=_classes(_node_key(op) for op in graph.ops),
        selective=tuple(
            (op.kind == "softmax" and op.op_type not in CROSS_ENTROPY_LOSSES)
            or (op.kind == "matmul" and not _has_parameter(graph, op))
            for op in graph.ops
        ),
        edges=tuple(edges),
        flash_shapes=work,
    )
    facts.memo["roles"] = tuple(found[i][0] if i in found else None for i in range(len(graph.ops)))
    kept["facts"] = facts
    return facts


def _roles(graph: OpGraph, facts: _GraphFacts) -> tuple[str | None, ...]:
    """Per op, its part in an attention core (``objectives.attention``), ``None`` outside one."""
    if "roles" not in facts.memo:
        found = attention_roles(graph)
        facts.memo["roles"] = tuple(found[i][0] if i in found else None for i in range(len(graph.ops)))
    return facts.memo["roles"]


def captured_ops(graph: OpGraph, settings: Any) -> tuple[bool, ...]:
    """Per op, whether it runs inside a captured CUDA graph (``TrainingSettings.cuda_graphs``): every op under the
    ``step`` scope (torchtitan's whole forward and backward), the ops of the repeated blocks under ``layers``
    (``OpGraph.blocks``: Megatron-LM's per-layer Transformer Engine graphs; the embedding, final norm, head and loss are
    launched kernel by kernel), none without graphs. Kept per graph."""
    if not settings.cuda_graphs:
        return (False,) * len(graph.ops)
    if settings.cuda_graph_scope == "step":
        return (True,) * len(graph.ops)
    facts = _graph_facts(graph)
    if "captured layers" not in facts.memo:
        inside = {i for group in graph.blocks for instance in group.instances for i in instance}
        facts.memo["captured layers"] = tuple(i in inside for i in range(len(graph.ops)))
    return facts.memo["captured layers"]


def op_settings(graph: OpGraph, settings: Any, index: int) -> Any:
    """``settings`` as op ``index`` is priced: ``cuda_graphs`` as :func:`captured_ops` says for it (one of two
    settings objects per ``settings``, kept)."""
    captured = captured_ops(graph, settings)[index]
    if captured == settings.cuda_graphs:
        return settings
    facts = _graph_facts(graph)
    key = ("launched settings", settings)
    if key not in facts.memo:
        facts.memo[key] = dataclasses.replace(settings, cuda_graphs=False)
    return facts.memo[key]


def _graph_outputs(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether it writes a tensor no op reads (a graph output: the logits)."""
    if "outputs" not in facts.memo:
        read = {e.tensor for e in graph.edges}
        facts.memo["outputs"] = tuple(any(a.tensor not in read for a in op.outputs) for op in graph.ops)
    return facts.memo["outputs"]


def _first_instance(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether it is in the first instance of a repeated block: under an execution model its
    activations stand for the working set of re-running one recomputed region (objectives.memory)."""
    if "first" not in facts.memo:
        first = {index for group in graph.blocks if group.instances for index in group.instances[0]}
        facts.memo["first"] = tuple(i in first for i in range(len(graph.ops)))
    return facts.memo["first"]


def _sac_saved(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether op-level selective checkpointing caches its output
    (:func:`objectives.memory.op_sac_saved`, applied to each repeated-block instance); ops outside
    the repeated blocks are not checkpointed (``False``)."""
    if "sac" not in facts.memo:
        saved = [False] * len(graph.ops)
        roles = _roles(graph, facts)
        for group in graph.blocks:
            for instance in group.instances:
                flags = op_sac_saved([graph.ops[i].kind == "matmul" and _has_parameter(graph, graph.ops[i])
                                      for i in instance], [roles[i] for i in instance])
                for i, flag in zip(instance, flags):
                    saved[i] = flag
        facts.memo["sac"] = tuple(saved)
    return facts.memo["sac"]


def _mlp_ops(graph: OpGraph, facts: _GraphFacts) -> tuple[bool, ...]:
    """Per op, whether it is in a dense MLP of a repeated block: what Megatron-LM's
    ``--recompute-modules mlp`` checkpoints (``TransformerLayer.recompute_mlp``, megatron-core 0.16.1:
    ``self.mlp`` under ``tensor_parallel.checkpoint``, its input the pre-MLP norm's output, which stays
    saved as the checkpoint; a MoE layer is not recomputed by it, ``not self.is_moe_layer``).

    Found by data flow inside each block instance: the MLP's linear layers are the parameter matmuls
    whose paths through non-linear, non-norm ops reach no attention-core op forward (the q/k/v
    projections) or backward (the output projection); its other ops lie on a path between two of them
    (the activation, a gated unit's product). An instance with a router's ``TopK`` (a routed-experts
    layer) has none."""
    if "mlp ops" in facts.memo:  # not "mlp": facts.memo[recompute] holds each mode's checkpoint inputs
        return facts.memo["mlp ops"]
    roles = _roles(graph, facts)
    linear = [op.kind == "matmul" and _has_parameter(graph, op) for op in graph.ops]
    barrier = [linear[i] or op.kind == "norm" or roles[i] is not None for i, op in enumerate(graph.ops)]
    after: list[list[int]] = [[] for _ in graph.ops]
    before: list[list[int]] = [[] for _ in graph.ops]
    for edge in graph.edges:
        if edge.producer != edge.consumer:
            after[edge.producer].append(edge.consumer)
            before[edge.consumer].append(edge.producer)
    # a router's TopK marks a routed-experts layer (importers.moe finds it the same way)
    routed = {i for i, op in enumerate(graph.ops) if op.op_type == "TopK"}
    flags = [False] * len(graph.ops)

    def reach(starts, links, inside) -> set[int]:
        """Ops of the instance reached from ``starts`` along ``links``, through non-barrier ops (a
        barrier reached is included, not passed)."""
        seen, stack = set(), list(starts)
        while stack:
            for j in links[stack.pop()]:
                if j in inside and j not in seen:
                    seen.add(j)
                    if not barrier[j]:
                        stack.append(j)
        return seen

    for group in graph.blocks:
        for instance in group.instances:
            inside = set(instance)
            if inside & routed:
                continue
            mlp = [i for i in instance if linear[i] and not any(
                roles[j] is not None for j in reach([i], after, inside) | reach([i], before, inside))]
            between = reach(mlp, after, inside) & reach(mlp, before, inside)
            for i in [*mlp, *(j for j in between if not barrier[j])]:
                flags[i] = True
    facts.memo["mlp ops"] = tuple(flags)
    return facts.memo["mlp ops"]


def _recompute_flags(graph: OpGraph, facts: _GraphFacts, recompute: str) -> tuple[tuple[bool, ...], tuple]:
    """Per op, whether ``recompute`` recomputes it, and its checkpoint inputs (``()`` if not recomputed)."""
    if recompute == "selective":
        recomputed = facts.selective
    elif recompute == "mlp":
        recomputed = _mlp_ops(graph, facts)
    elif recompute == "full":
        recomputed = tuple(instance >= 0 for instance in facts.instance_of)
    elif recompute == "op":
        saved = _sac_saved(graph, facts)
        recomputed = tuple(instance >= 0 and not keep for instance, keep in zip(facts.instance_of, saved))
    else:
        recomputed = (False,) * len(graph.ops)
    if recompute not in facts.memo:
        instance_of = list(facts.instance_of)
        facts.memo[recompute] = tuple(
            _external_inputs(graph, op, i, list(recomputed), instance_of, facts.op_index) if recomputed[i] else ()
            for i, op in enumerate(graph.ops)
        )
    return recomputed, facts.memo[recompute]


def recomputed_share(graph: OpGraph, recompute: str) -> float:
    """The share of the repeated blocks' ops that ``recompute`` runs again in backward (0 without
    recomputation or blocks, 1 for ``full``): the host replays that share of a layer's kernel launches
    (:func:`objectives.fixed_costs.host_floor_s`)."""
    facts = _graph_facts(graph)
    inside = [instance >= 0 for instance in facts.instance_of]
    if recompute == "none" or not any(inside):
        return 0.0
    recomputed, _ = _recompute_flags(graph, facts, recompute)
    return sum(r and i for r, i in zip(recomputed, inside)) / sum(inside)


def _gated_products(graph: OpGraph, facts: _GraphFacts, kept, shared) -> list:
    """Under Megatron-Core's fused SwiGLU (``settings.fused_swiglu``) a gated unit's product (a ``Mul``
    reading a linear layer whose activation is fused after it) keeps the activation's input, which
    that layer already keeps as its pre-activation, not the activation's output: the backward
    recomputes the activation (megatron-core 0.16.1 ``fusions/fused_bias_swiglu.py``,
    ``SwiGLUFunction``: ``ctx.save_for_backward(input)`` on fc1's output, ``swiglu_back`` recomputes
    the SiLU). That input is marked charged elsewhere (objectives.memory.shared_saved_operands)."""
    marked = list(shared)
    for index, op in enumerate(graph.ops):
        if op.kind != "elementwise" or op.op_type != "Mul":
            continue
        extra = set()
        for position in kept[index][0]:
            tensor = graph.tensors.get(op.inputs[position].tensor)
            producer = facts.op_index.get(tensor.producer, -1) if tensor is not None and tensor.producer else -1
            if producer >= 0 and graph.ops[producer].kind == "matmul" and kept[producer][1]:
                extra.add(("in", position))
        if extra:
            marked[index] = tuple(sorted(set(marked[index]) | extra))
    return marked


def _saved_sharing(
    graph: OpGraph, facts: _GraphFacts, settings: TrainingSettings, cost_model: str, recomputed, externals
) -> tuple[tuple, ...]:
    """Per op, ``(stored dtypes of its operands, saved operands another op charges)``
    (:func:`objectives.memory.shared_saved_operands`) under the build's recomputation and execution
    model: each saved tensor is charged once, to the first op that keeps it. Cached per setting."""
    execution = execution_of(settings) if cost_model != "pase" else None
    key = ("saved", settings.recompute, settings.precision, settings.autocast, settings.fp8, settings.fused_swiglu, execution,
           cost_model == "pase")
    if key in facts.memo:
        return facts.memo[key]
    if cost_model == "pase":  # PaSE's cost keeps no activations
        result = ((None, (), False),) * len(graph.ops)
    else:
        stored = stored_dtypes(graph, settings=settings, execution=execution)
        dtypes = [operand_dtypes(op, stored) for op in graph.ops]
        roles, first, tensors = _roles(graph, facts), _first_instance(graph, facts), ParameterView(graph)
        sac = _sac_saved(graph, facts) if settings.recompute == "op" else (False,) * len(graph.ops)
        kept, by_class = [], {}
        for index, op in enumerate(graph.ops):
            # the first instance's ops keep the working set (charged as not recomputed: _price_groups)
            again = recomputed[index] and not (execution is not None and first[index])
            # what an op keeps is read from its class's key (family, operand layouts, shapes, dtypes
            # and roles) and these flags: a layer's ops are worked out once, not once per layer
            op_key = (facts.op_class[index], again, externals[index], roles[index], sac[index])
            if op_key not in by_class:
                inputs, outputs, _ = kept_operands(op, tensors, settings=settings, recomputed=again,
                                                   external_inputs=externals[index], execution=execution,
                                                   role=roles[index], sac_saved=sac[index])
                by_class[op_key] = (inputs, outputs)
            kept.append(by_class[op_key])
        outputs = _graph_outputs(graph, facts)  # Transformer Engine's FP8 linears keep an FP8 input copy
        fp8 = [fp8_saved_input(op, graph.tensors, settings, graph_output=outputs[i]) for i, op in enumerate(graph.ops)]
        shared = shared_saved_operands(graph.ops, kept=kept, dtypes=dtypes,
                                       autocast=autocast_applies(settings, execution), sac_saved=sac, fp8_inputs=fp8)
        if execution is not None and settings.fused_swiglu:
            shared = _gated_products(graph, facts, kept, shared)
        result = tuple(zip(dtypes, shared, sac))
    facts.memo[key] = result
    return result
