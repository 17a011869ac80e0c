r"""PyTorch DTensor exporter: a device mesh, a per-module tensor-parallel plan and FSDP2, as JSON.

The plan is written in the vocabulary of ``torch.distributed.tensor.parallel`` (torch 2.13) and
``torch.distributed.fsdp.fully_shard`` (torchtitan style, reference §4 and §6); ``python -m
planner.run`` (:mod:`planner.run`) applies it to a Hugging Face decoder and trains.

What is expressible
    A 2-D mesh ``("dp", "tp")``, ``tp`` innermost (``init_device_mesh`` is row-major, so the
    ``tp`` ranks are consecutive, as in Megatron-LM), and one tensor-parallel pattern on ``tp``:

    * QKV and FC1 linears ``colwise`` (their weight's output dim split; a fused QKV or gate/up
      weight is ``packed``: each of its parts is split, rank ``r`` holding the ``r``-th slice of
      every part), the output projection and FC2 ``rowwise`` (reduction dim split), attention on
      the local heads;
    * the token embedding replicated or vocabulary-parallel (``rowwise`` on ``nn.Embedding``), the
      LM head replicated or ``colwise`` with its logits gathered (``output_layouts`` Replicate);
      with tied weights both or neither, since they share one tensor;
    * norms replicated over ``tp`` or, with sequence parallelism, ``sequence_parallel`` together
      with every residual op; the residual stream is then a ``Shard(1)`` DTensor
      (``use_local_output: false``), the colwise linears gather it (``input_layouts`` Shard(1)),
      the rowwise ones reduce-scatter into it (``output_layouts`` Shard(1));
    * every op splits its batch dims ``dp`` ways. ZeRO-0: parameters replicated over ``dp`` and
      gradients all-reduced (DDP); ZeRO-3: ``fully_shard`` on ``dp`` per transformer block and at
      the root (FSDP2); HSDP (``TrainingSettings.dp_shard``, ``--fix hsdp=N``): the same groups on a
      ``("dp_replicate", "dp_shard")`` mesh of ``dp / N x N`` (:func:`_fsdp_section`).

    These are the per-op configurations of :func:`dtensor_masks`, built on the Megatron rules of
    :mod:`exporters._tp`. A strategy is exported only when every op's configuration is in the mask
    of its family; otherwise :class:`~planner.core.errors.UnsupportedExport` names the op, its split
    and the split the plan needs. Refused as well: ZeRO-1/2 (FSDP2 shards parameters, gradients and
    optimizer state together), selective recomputation (torchtitan's selective AC recomputes other
    ops than the planner's attention core), KV heads not divisible by ``tp`` (a colwise K/V
    projection would cut a head), ``tp > 1`` on disentangled attention (DeBERTa's module views its
    shards by the full head count), models whose sharded modules have no module path, and pipeline
    plans with ``pp > 1`` (:mod:`planner.run` builds no pipeline stages).

Module names
    The FQNs are the ops' module paths (``Op.module_path``, from the dynamo exporter's metadata),
    with every numeric component (the layer index) generalised to ``*`` when all layers agree;
    ``parallelize_module`` matches them token by token with ``fnmatch``.

Parameters
    ``params`` lists every parameter under its torch name, its global shape in the orientation the
    launcher holds (``nn.Linear``: ``[out, in]``; a transformers ``Conv1D``, stored ``[in, out]``, is
    converted to ``nn.Linear``), its placement on each mesh dim and the local shape on rank 0.
"""

from __future__ import annotations

import math
import re
import shlex
from dataclasses import dataclass, replace
from typing import Any, Sequence

import numpy as np

from exporters._common import (
    WHOLE_PROJECTION_TP, describe_config, dominant_factor, head_copy_note, launcher_degrees, samples_per_rank,
    torchrun_nodes,
)
from exporters._tp import (
    DTENSOR_LINEARS, MaskResult, OpRule, TpLayout, einsum_projection, interned_rules, layout_masks, pure_data_parallel_masks, tp_layout,
)
from importers.transformer import (
    TransformerModel,
    analyze_transformer,
    embedding_rows_dim,
    is_parameter,
    moe_summary,
    output_side_dims,
    refuse_past_table,
    weight_access,
)
from exporters.dtensor.tables import (
    TABLE_STYLES,
    read_table_style,
    refuses_settings,
    table_label,
    table_masks,
    table_ops,
    table_plan,
    table_problem,
)
from exporters.generic import PlanInput
from exporters._moe_layout import layer_norm_epsilons
from importers.rotary import rotary_frequencies, rotated_layers
from planner.core.configs import ConfigSpace, divisors
from exporters._fp8 import refuse_fp8
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph
from planner.core.layout import axis_factors
from planner.core.strategy import Strategy

__all__ = [
    "TORCH_VERSION",
    "DtensorFamily",
    "dtensor_families",
    "dtensor_masks",
    "export_dtensor",
    "generalise_fqn",
]

TORCH_VERSION = "2.13.0"
"""The torch release whose ``parallelize_module`` / ``fully_shard`` the plan follows."""

_COLWISE = frozenset({"qkv", "fc1"})
_ROWWISE = frozenset({"out-proj", "fc2"})
_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.\w+)*$")
_SHARD_SEQ = ["shard", 1]
_REPLICATE = ["replicate"]


@dataclass(frozen=True, slots=True, kw_only=True)
class DtensorFamily:
    """One family of DTensor-expressible strategies (a mesh and the tensor-parallel options)."""

    dp: int
    tp: int
    sequence_parallel: bool = False
    vocab_parallel_embedding: bool = False
    """The token embedding is ``rowwise`` (table rows split ``tp`` ways) instead of replicated."""
    vocab_parallel_head: bool = False
    """The LM head is ``colwise`` (vocabulary split ``tp`` ways) instead of replicated."""
    tables: str = ""
    """``rowwise`` / ``colwise``: every embedding table sharded that way over the ``dp`` ranks, the
    rest data-parallel (:mod:`exporters.dtensor.tables`); ``""``: tables as the rest of the plan says."""

    @property
    def label(self) -> str:
        """E.g. ``"dp=2 x tp=2 sp vocab-embedding vocab-head"``, ``"dp=8 rowwise tables"``."""
        if self.tables:
            return f"dp={self.dp} {table_label(self.tables)}"
        text = f"dp={self.dp} x tp={self.tp}"
        for flag, name in (
            (self.sequence_parallel, "sp"),
            (self.vocab_parallel_embedding, "vocab-embedding"),
            (self.vocab_parallel_head, "vocab-head"),
        ):
            if flag:
                text += f" {name}"
        return text


def generalise_fqn(path: str) -> str:
    """A module path with every numeric component replaced by ``*``.

    Examples
    --------
    >>> generalise_fqn("model.layers.11.self_attn.q_proj")
    'model.layers.*.self_attn.q_proj'
    """
    return ".".join("*" if part.isdigit() else part for part in path.split("."))


# ----------------------------------------------------------------------------------------------
# Families and masks


def _model(graph: OpGraph) -> TransformerModel:
    model = analyze_transformer(graph)
    if model.irregular:
        raise UnsupportedExport(
            "a DTensor plan applies one tensor-parallel pattern to a uniform stack of layers; this model is not "
            "one: " + "; ".join(model.irregular)
        )
    return model


def _tied(graph: OpGraph, model: TransformerModel) -> bool:
    """Whether the token embedding and the LM head share their weight."""
    if model.token_embedding is None or model.lm_head is None:
        return False
    return model.tied_embeddings


_LAYOUTS: dict[tuple[int, int, bool, bool], tuple[OpGraph, TransformerModel, TpLayout]] = {}
_LAYOUTS_SIZE = 64


def _family_layout(graph: OpGraph, model: TransformerModel, family: DtensorFamily) -> TpLayout:
    """Megatron's rules (vocabulary-parallel, sequence-parallel capable) with the embedding, LM
    head and ops after the head laid out as the family says; kept per graph, model and the two
    flags it reads (a pipeline search asks again for every family of every stage; the entry holds
    its graph and model, so their ids stay theirs)."""
    key = (id(graph), id(model), family.vocab_parallel_embedding, family.vocab_parallel_head)
    hit = _LAYOUTS.get(key)
    if hit is not None and hit[0] is graph and hit[1] is model:
        return hit[2]
    layout = _built_family_layout(graph, model, family)
    _LAYOUTS[key] = (graph, model, layout)
    while len(_LAYOUTS) > _LAYOUTS_SIZE:
        del _LAYOUTS[next(iter(_LAYOUTS))]
    return layout


def _built_family_layout(graph: OpGraph, model: TransformerModel, family: DtensorFamily) -> TpLayout:
    """:func:`_family_layout`, built."""
    base = tp_layout(graph, model, target="megatron")
    rules: list[OpRule] = []
    for rule in base.rules:
        if rule.role == "embedding":
            rule = replace(rule, fallback_replicated=False, required=True) if family.vocab_parallel_embedding else OpRule(role="embedding")
        elif rule.role == "lm-head":
            rule = replace(rule, fallback_replicated=False, required=True) if family.vocab_parallel_head else OpRule(role="lm-head")
        elif rule.role == "head-glue":
            rule = OpRule(role="head-glue")  # the logits are gathered (no loss_parallel)
        rules.append(rule)
    return TpLayout(target="megatron", model=model, rules=interned_rules(rules))


PER_HEAD_WEIGHTS_TP = (
    "its queries and keys are normalised by one LayerNorm per head, each with its own weights (StableLM's "
    "StableLmLayerNormPerHead), which a DTensor plan replicates while the colwise Q/K projections leave each rank 1/tp "
    "of the heads: the module pairs its norms with the rank's heads in order, so every rank would use the first "
    "heads' weights; plan tp=1")
"""Why a DTensor plan runs no tp > 1 of a ``per-head-weights`` QK-norm (:mod:`importers.qk_norm`);
:func:`exporters.dtensor.rules.per_head_weights_tp` drops the families with it, and this refuses a saved plan."""


def _degree_problem(model: TransformerModel, tp: int) -> str | None:
    if tp == 1:
        return None
    if model.num_attention_heads % tp:
        return f"{model.num_attention_heads} attention heads are not divisible by tp={tp}"
    if model.num_query_groups % tp:
        return (
            f"{model.num_query_groups} KV heads are not divisible by tp={tp}: a colwise K/V projection would cut "
            "a head (DTensor does not replicate KV heads as Megatron-LM does)"
        )
    if model.ffn_hidden_size % tp:
        return f"FFN size {model.ffn_hidden_size} is not divisible by tp={tp}"
    if any(block.position_scores for block in model.attention):  # importers.attention_terms
        # transformers 5.x DisentangledSelfAttention.transpose_for_scores views q/k/v as (num_attention_heads, -1):
        # on a colwise shard that splits every head's dims, where Llama's and BERT's views (-1, head_dim) keep heads
        return (f"tp={tp}: its disentangled attention (DeBERTa) reshapes the queries, keys and values by its full head "
                "count, which parallelize_module does not divide, so a colwise shard would split each head's dims")
    if model.features.qk_norm == "whole-projection":  # importers.qk_norm: the model's q_norm needs every head
        return WHOLE_PROJECTION_TP
    if model.features.qk_norm == "per-head-weights":  # the replicated per-head norms would meet the wrong heads
        return PER_HEAD_WEIGHTS_TP
    return None


def _family_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    family: DtensorFamily,
    *,
    devices_per_node: int | None,
) -> tuple[MaskResult, TpLayout | None]:
    if family.tables:
        if family.tp != 1:
            return MaskResult(masks=None, reason="a table family shards the tables over the dp ranks (tp = 1)"), None
        return table_masks(graph, spaces, dp=family.dp, style=family.tables), None
    if family.tp == 1 and not (family.sequence_parallel or family.vocab_parallel_embedding or family.vocab_parallel_head):
        try:
            model = analyze_transformer(graph)
        except UnsupportedExport:
            return pure_data_parallel_masks(graph, spaces, dp=family.dp), None
        layout = _family_layout(graph, model, family)
        return pure_data_parallel_masks(graph, spaces, dp=family.dp), layout
    model = _model(graph)
    problem = _degree_problem(model, family.tp)
    if family.tp > 1 and (found := einsum_projection(graph, model)):  # parallelize_module's styles take nn.Linear
        problem = f"tp={family.tp}: {found}; {DTENSOR_LINEARS}"
    if problem:
        return MaskResult(masks=None, reason=problem), None
    if _tied(graph, model) and family.vocab_parallel_embedding != family.vocab_parallel_head:
        return MaskResult(masks=None, reason="the tied embedding and LM head share one weight, so both or neither are vocabulary-parallel"), None
    if family.vocab_parallel_embedding and model.token_embedding is None:
        return MaskResult(masks=None, reason="the model has no token embedding"), None
    if family.vocab_parallel_head and model.lm_head is None:
        return MaskResult(masks=None, reason="the model has no LM head"), None
    layout = _family_layout(graph, model, family)
    result = layout_masks(
        graph,
        spaces,
        layout,
        dp=family.dp,
        tp=family.tp,
        sequence_parallel=family.sequence_parallel,
        devices_per_node=devices_per_node or family.dp * family.tp,
    )
    return result, layout


def dtensor_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    *,
    dp: int,
    tp: int,
    sequence_parallel: bool = False,
    vocab_parallel_embedding: bool = False,
    vocab_parallel_head: bool = False,
    devices_per_node: int | None = None,
    tables: str = "",
) -> list[np.ndarray] | None:
    """Per op, which configurations a DTensor plan on a ``dp x tp`` mesh runs (module docstring).

    Parameters
    ----------
    graph, spaces:
        The op graph and each op's configurations.
    dp, tp:
        Sizes of the ``dp`` and ``tp`` mesh dims (``dp * tp`` processes).
    sequence_parallel:
        Norms and residual ops split along the sequence (``SequenceParallel``).
    vocab_parallel_embedding, vocab_parallel_head:
        The token embedding / LM head split along the vocabulary instead of replicated.
    tables:
        ``rowwise`` / ``colwise``: every embedding table sharded over the ``dp`` ranks, the rest
        data-parallel (:mod:`exporters.dtensor.tables`; ``tp`` must be 1).
    devices_per_node:
        When given, configurations on all ``dp * tp`` devices must place the ``tp`` ranks innermost
        (the mesh's rank order); ``None``: placement is not constrained.

    Returns
    -------
    list of numpy.ndarray or None
        One boolean array per op; ``None`` when the family cannot run this model (heads or KV heads
        not divisible by ``tp``, a vocabulary that does not divide, a batch that does not divide...).
    """
    family = DtensorFamily(
        dp=dp,
        tp=tp,
        sequence_parallel=sequence_parallel,
        vocab_parallel_embedding=vocab_parallel_embedding,
        vocab_parallel_head=vocab_parallel_head,
        tables=tables,
    )
    try:
        result, _ = _family_masks(graph, spaces, family, devices_per_node=devices_per_node)
    except UnsupportedExport:
        return None
    return result.masks


def dtensor_families(graph: OpGraph, *, devices: int) -> list[DtensorFamily]:
    """Every family worth searching on at most ``devices`` devices (``dp * tp`` divides ``devices``).

    With ``tp > 1``: with and without sequence parallelism, and each choice of vocabulary-parallel
    embedding / LM head (one choice for both when they are tied). Families the model cannot run are
    included; :func:`dtensor_masks` returns ``None`` for them. A model that is not a transformer and
    has embedding tables DTensor can shard gets the table families (:mod:`exporters.dtensor.tables`)
    at every ``dp > 1``.
    """
    styles: tuple[str, ...] = ()
    try:
        model = analyze_transformer(graph)
        tied = _tied(graph, model)
        has_embedding, has_head = model.token_embedding is not None, model.lm_head is not None
    except UnsupportedExport:
        model = None
        styles = TABLE_STYLES if table_problem(graph, table_ops(graph)) is None else ()
    if model is not None and moe_summary(graph) is not None:
        model = None  # one parallel style per module cannot shard an experts' weight tensor: tp = 1 only
    families: list[DtensorFamily] = []
    for world in divisors(devices):
        for tp in divisors(world):
            dp = world // tp
            if tp == 1 or model is None:
                if tp == 1:
                    families.append(DtensorFamily(dp=dp, tp=1))
                    families.extend(DtensorFamily(dp=dp, tp=1, tables=style) for style in styles if dp > 1)
                continue
            embeddings = (False, True) if has_embedding else (False,)
            heads = (False, True) if has_head else (False,)
            # MLA (importers.mla): its down-projections have no plan entry (replicated) and would read the
            # norms' sequence-sharded DTensors; torchtitan's DeepSeek plan wraps them in PrepareModuleInput /
            # NoParallel, which this plan's styles do not write, so no sequence parallelism
            for sp in (False, True) if all(a.mla is None for a in model.attention) else (False,):
                for emb in embeddings:
                    for head in heads:
                        if tied and emb != head:
                            continue
                        families.append(
                            DtensorFamily(dp=dp, tp=tp, sequence_parallel=sp, vocab_parallel_embedding=emb, vocab_parallel_head=head)
                        )
    return families


# ----------------------------------------------------------------------------------------------
# Reading a strategy


def _factor(space: ConfigSpace, row: int, dims: Sequence[str]) -> int:
    total = 1
    for dim in dims:
        if dim in space.dim_names:
            total *= int(space.factors[row, space.dim_names.index(dim)])
    return total


def _read_family(plan_input: PlanInput, model: TransformerModel | None) -> DtensorFamily:
    """The family a strategy claims: dominant degrees, and sequence / vocabulary splits read off
    the norms, the embedding and the LM head."""
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    if model is None:
        dp = dominant_factor(graph, spaces, choice, batch=True)
        return DtensorFamily(dp=dp, tp=1, tables=read_table_style(graph, spaces, choice))
    dp, tp = launcher_degrees(graph, spaces, choice, model.roles)
    if tp == 1:
        return DtensorFamily(dp=dp, tp=1)
    layout = tp_layout(graph, model, target="megatron")
    split, whole = [], []
    for index, rule in enumerate(layout.rules):
        if rule.sequence is None or not rule.sequence_required:
            continue
        (split if _factor(spaces[index], choice[index], (rule.sequence,)) > 1 else whole).append(graph.ops[index].name)
    if split and whole:
        raise UnsupportedExport(
            f"op {split[0]} is split along the sequence but op {whole[0]} is not; DTensor sequence parallelism "
            "(SequenceParallel) splits every norm and residual op"
        )
    embedding = False
    if model.token_embedding is not None:
        index = model.token_embedding
        rows = embedding_rows_dim(graph, graph.ops[index])
        embedding = rows is not None and _factor(spaces[index], choice[index], (rows,)) > 1
    head = False
    if model.lm_head is not None:
        index = model.lm_head
        head = _factor(spaces[index], choice[index], output_side_dims(graph, graph.ops[index])) > 1
    return DtensorFamily(dp=dp, tp=tp, sequence_parallel=bool(split), vocab_parallel_embedding=embedding, vocab_parallel_head=head)


def _check_choice(plan_input: PlanInput, result: MaskResult, layout: TpLayout | None, family: DtensorFamily) -> None:
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    assert result.masks is not None
    for index, (mask, row) in enumerate(zip(result.masks, choice)):
        if mask[row]:
            continue
        op, space = graph.ops[index], spaces[index]
        role = layout.rules[index].role if layout is not None else op.kind
        expected = describe_config(op, space, int(np.flatnonzero(mask)[0]))
        raise UnsupportedExport(
            f"op {op.name} ({role}) is split {describe_config(op, space, row)}; a DTensor plan on {family.label} "
            f"splits it {expected}"
        )


# ----------------------------------------------------------------------------------------------
# The plan


def _module(op: Op, what: str) -> str:
    if not op.module_path or not _MODULE_PATH.match(op.module_path):
        raise UnsupportedExport(
            f"op {op.name} ({what}) has no module path, and a DTensor plan names modules; export the model with "
            "torch's dynamo exporter (torch.onnx.export(..., dynamo=True) keeps module paths)"
        )
    return op.module_path


def _colwise(*, sequence_parallel: bool, packed: list[int] | None = None, gather: bool = False) -> dict[str, Any]:
    style: dict[str, Any] = {
        "style": "colwise",
        "input_layouts": [_SHARD_SEQ if sequence_parallel else _REPLICATE],
        "output_layouts": [_REPLICATE if gather else ["shard", -1]],
        "use_local_output": True,
    }
    if packed:
        style["packed"] = packed
    return style


def _rowwise(*, sequence_parallel: bool, embedding: bool = False) -> dict[str, Any]:
    return {
        "style": "rowwise",
        "input_layouts": [_REPLICATE if embedding else ["shard", -1]],
        "output_layouts": [_SHARD_SEQ if sequence_parallel else _REPLICATE],
        "use_local_output": not sequence_parallel,
    }


def _packed_parts(graph: OpGraph, model: TransformerModel, index: int, role: str) -> list[int] | None:
    """Widths of the parts of a fused weight (``[q, k, v]`` or ``[gate, up]``), ``None`` if not fused."""
    op = graph.ops[index]
    width = 1
    for dim in output_side_dims(graph, op):
        width *= op.dim(dim).size
    hd = model.head_dim
    if role == "qkv":
        for block in model.attention:
            if index in block.q_proj and index in block.k_proj:
                q, kv = model.num_attention_heads * hd, model.num_query_groups * hd
                return [q, kv, kv] if q + 2 * kv == width else None
            if index in block.k_proj and index in block.v_proj and block.mla is None:  # MLA's kv_b: per head
                return [width // 2, width // 2]
        return None
    for block in model.mlps:
        if index in block.fc1 and block.gated and len(block.fc1) == 1:
            return [width // 2, width // 2]
    return None


def _tp_plan(graph: OpGraph, model: TransformerModel, family: DtensorFamily) -> dict[str, dict[str, Any]]:
    """FQN -> style of every module the plan parallelizes (exact names, before generalising)."""
    sp = family.sequence_parallel
    plan: dict[str, dict[str, Any]] = {}

    def put(fqn: str, style: dict[str, Any], op: Op) -> None:
        previous = plan.setdefault(fqn, style)
        if previous != style:
            raise UnsupportedExport(
                f"module {fqn} needs two layouts ({previous['style']} and {style['style']}, op {op.name}); a DTensor "
                "plan gives each module one style"
            )

    for index, role in enumerate(model.roles):
        op = graph.ops[index]
        if role in _COLWISE:
            put(_module(op, role), _colwise(sequence_parallel=sp, packed=_packed_parts(graph, model, index, role)), op)
        elif role in _ROWWISE:
            put(_module(op, role), _rowwise(sequence_parallel=sp), op)
        elif role == "embedding":
            if family.vocab_parallel_embedding:
                put(_module(op, role), _rowwise(sequence_parallel=sp, embedding=True), op)
            elif sp:
                put(_module(op, role), _to_sequence_shards(), op)
        elif role == "position-embedding" and sp:
            put(_module(op, role), _to_sequence_shards(), op)
        elif role == "norm" and sp:
            put(_module(op, role), {"style": "sequence_parallel", "sequence_dim": 1, "use_local_output": False}, op)
        elif role == "lm-head":
            if family.vocab_parallel_head:
                put(_module(op, role), _colwise(sequence_parallel=sp, gather=True), op)
            elif sp:
                put(
                    _module(op, role),
                    {
                        "style": "prepare_input",
                        "input_layouts": [_SHARD_SEQ],
                        "desired_input_layouts": [_REPLICATE],
                        "use_local_output": True,
                    },
                    op,
                )
    return plan


def _to_sequence_shards() -> dict[str, Any]:
    """A replicated module's output turned into the sequence-sharded residual stream (a local slice)."""
    return {
        "style": "prepare_output",
        "output_layouts": [_REPLICATE],
        "desired_output_layouts": [_SHARD_SEQ],
        "use_local_output": False,
    }


def _generalise(plan: dict[str, dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Replace layer indices by ``*`` where every module of a pattern has the same style."""
    groups: dict[str, list[str]] = {}
    for fqn in plan:
        groups.setdefault(generalise_fqn(fqn), []).append(fqn)
    result: dict[str, dict[str, Any]] = {}
    for pattern, members in groups.items():
        styles = [plan[m] for m in members]
        if pattern != members[0] and all(s == styles[0] for s in styles):
            result[pattern] = styles[0]
        else:
            for member in members:
                result[member] = plan[member]
    return result


def _block_patterns(graph: OpGraph, model: TransformerModel | None) -> list[str]:
    """FSDP2 units: the transformer blocks, ``prefix.*`` up to the layer index."""
    patterns: list[str] = []
    paths = []
    if model is not None:
        paths = [graph.ops[block.score].module_path for block in model.attention]
    else:
        paths = [op.module_path for op in graph.ops]
    for path in paths:
        if not path:
            continue
        parts = path.split(".")
        for position, part in enumerate(parts):
            if part.isdigit():
                pattern = ".".join(parts[:position] + ["*"])
                if pattern not in patterns:
                    patterns.append(pattern)
                break
    return patterns


def _param_entries(
    plan_input: PlanInput,
    family: DtensorFamily,
    *,
    fsdp: bool,
    shard: int,
) -> dict[str, dict[str, Any]]:
    """Every parameter: torch name, global and rank-0 local shape, placements, aliases (``shard``: the
    ranks FSDP2 shards it over, :func:`fsdp_shard_group`)."""
    graph, spaces, choice = plan_input.graph, plan_input.spaces, plan_input.strategy.choice
    tables = frozenset(table_ops(graph)) if family.tables else frozenset()
    entries: dict[str, dict[str, Any]] = {}
    owner_factors: dict[str, tuple[int, ...]] = {}
    for index, op in enumerate(graph.ops):
        factors = dict(zip(spaces[index].dim_names, spaces[index].factors[choice[index]].tolist()))
        weight = weight_access(graph, op)
        param_inputs = [a for a in op.inputs if is_parameter(graph, a.tensor)]
        for access in param_inputs:
            canonical = graph.parameter_aliases.get(access.tensor, access.tensor)
            tensor = graph.tensors[canonical]
            split = axis_factors(access, factors)
            named = bool(_MODULE_PATH.match(canonical)) and "." in canonical
            reductions = {d.name for d in op.dims if d.kind == "reduction"}
            transposed = False
            if access is weight and len(tensor.shape) == 2 and access.axes and set(access.axes[0]) & reductions:
                transposed = True  # stored [in, out]: a Conv1D, or a weight pre-transposed by the exporter
            if named:
                name = canonical
            elif _MODULE_PATH.match(canonical) and not op.module_path:
                raise UnsupportedExport(
                    f"parameter {canonical} belongs to the model's root module (its name has no module path), and a "
                    "DTensor plan shards submodules; hold it in a submodule (e.g. an nn.Linear) or export the "
                    "generic plan"
                )
            else:
                module = _module(op, "a parameter without a name")
                leaf = "weight" if access is weight or access is param_inputs[0] else "bias"
                name = f"{module}.{leaf}"
            reader_is_module = access is weight or op.kind == "embedding"
            alias = f"{op.module_path}.weight" if op.module_path and reader_is_module else None
            if canonical in owner_factors:
                if owner_factors[canonical] != split:
                    raise UnsupportedExport(
                        f"parameter {canonical} is split {owner_factors[canonical]} by one op and {split} by op {op.name}; "
                        "a tied weight has one layout in a DTensor plan"
                    )
                entry = entries[canonical]
                if alias and alias != entry["name"] and alias not in entry["aliases"]:
                    entry["aliases"].append(alias)
                continue
            owner_factors[canonical] = split
            shape = list(tensor.shape)
            if transposed:
                shape, split = shape[::-1], split[::-1]
            tp_dims = [axis for axis, f in enumerate(split) if f > 1]
            # a table family shards the tables over the dp ranks (tables.py), everything else over tp
            mesh_dim, degree = ("dp", family.dp) if family.tables and index in tables else ("tp", family.tp)
            if len(tp_dims) > 1 or any(f not in (1, degree) for f in split):
                raise UnsupportedExport(f"parameter {name} is split {split}; DTensor shards a parameter on one dim of the {mesh_dim} mesh")
            local = [size // f for size, f in zip(shape, split)]
            dp_placement = "replicate"
            if mesh_dim == "dp":
                dp_placement, tp_dims = (f"shard({tp_dims[0]})" if tp_dims else "replicate"), []
            elif fsdp and shard > 1 and local:
                local[0] = -(-local[0] // shard)
                dp_placement = "shard(0)"
            entries[canonical] = {
                "name": name,
                "aliases": [alias] if alias and alias != name else [],
                "shape": shape,
                "local_shape": local,
                "placements": {"dp": dp_placement, "tp": f"shard({tp_dims[0]})" if tp_dims else "replicate"},
                "from_conv1d": transposed and named,
            }
    return {entry["name"]: entry for entry in entries.values()}


def fsdp_shard_group(dp: int, settings: Any) -> int:
    """Ranks FSDP2 shards each parameter over: all ``dp`` ranks, or under HSDP
    (``TrainingSettings.dp_shard``) ``gcd(dp, dp_shard)``, the rest holding replicas.

    >>> from planner.core.settings import TrainingSettings
    >>> fsdp_shard_group(4, TrainingSettings(zero_stage=3)), fsdp_shard_group(4, TrainingSettings(zero_stage=3, dp_shard=2))
    (4, 2)
    """
    return dp if settings.dp_shard is None else math.gcd(dp, settings.dp_shard)


def _fsdp_section(blocks: list[str], zero_stage: int, dp: int, shard: int, *, offload: str = "none",
                  reshard: str = "default") -> dict[str, Any] | None:
    """``fully_shard(block, mesh=...)`` per transformer block and at the root: on ``mesh["dp"]``, or
    under HSDP (``shard < dp``) on the 2-D ``("dp_replicate", "dp_shard")`` mesh the launcher unflattens
    ``dp`` into (``DeviceMesh._unflatten``, as torchtitan's ``ParallelDims.build_mesh``), which FSDP2
    runs as HSDP: sharded on the inner dim, replicated on the outer (``fully_shard``'s docstring).
    Parameter offload (``objectives.offload``): ``offload_policy: cpu``, ``fully_shard(...,
    offload_policy=CPUOffloadPolicy())`` on every call, as torchtitan's ``apply_fsdp_to_decoder`` does.
    ``reshard`` (``TrainingSettings.reshard_after_forward``): ``never`` writes ``reshard_after_forward: false``
    for every call (each block and the root kept whole from forward to backward, as priced); ``always`` and
    ``default`` write ``true``."""
    if zero_stage != 3:
        return None
    section: dict[str, Any] = {"mesh_dims": ["dp"], "reshard_after_forward": reshard != "never", "modules": blocks,
                               "root": True}
    if offload == "parameters":
        section["offload_policy"] = "cpu"
    if shard < dp:
        section.update(mesh_dims=["dp_replicate", "dp_shard"], mesh_shape=[dp // shard, shard])
    return section


def _check_settings(plan_input: PlanInput) -> None:
    """Refuse the settings a 2-D (dp, tp) DTensor mesh cannot run: pipelines, expert parallelism,
    ZeRO-1/2 and the planner's selective recomputation."""
    settings = plan_input.settings
    if plan_input.pipeline is not None and plan_input.pipeline.pp > 1:
        raise UnsupportedExport(
            f"the DTensor plan is a 2-D (dp, tp) mesh and python -m planner.run builds no pipeline stages "
            f"(torch.distributed.pipelining is not wired in), and the plan has pp={plan_input.pipeline.pp}; plan "
            "with --pp 1 or export with --target megatron"
        )
    if settings.expert_parallel > 1:
        raise UnsupportedExport(
            f"the DTensor plan is a 2-D (dp, tp) mesh with no expert-parallel axis (the plan splits experts "
            f"ep={settings.expert_parallel} ways); pick an ep=1 row or export with --target megatron or deepspeed"
        )
    if settings.zero_stage in (1, 2):
        raise UnsupportedExport(
            f"ZeRO-{settings.zero_stage} has no FSDP2 equivalent: fully_shard shards parameters, gradients and "
            "optimizer state together; plan with --zero 3 (FSDP2) or --zero 0 (replicated, DDP)"
        )
    if settings.recompute == "selective":
        raise UnsupportedExport(
            "the planner's selective recomputation (attention core) is not torchtitan's selective activation "
            "checkpointing (which recomputes other ops); plan with --recompute full or none"
        )


def _command(nnodes: int, per_node: int) -> str:
    """The torchrun line of ``python -m planner.run`` (the rendezvous of a multi-node run left to the shell)."""
    launcher = ["torchrun", "--nproc-per-node", str(per_node)]
    if nnodes > 1:
        launcher += ["--nnodes", str(nnodes), "--node-rank", "$NODE_RANK", "--master-addr", "$MASTER_ADDR", "--master-port", "29500"]
    launcher += ["-m", "planner.run", "plan.json", "--config", "config.json"]
    return " ".join(part if part.startswith("$") else shlex.quote(part) for part in launcher)


def _notes(tp_plan: dict[str, dict[str, Any]], params: dict[str, Any], *, fsdp: bool, dp: int) -> list[str]:
    """What the user provides (the model's config) and how the launcher applies the plan."""
    notes = [
        "config.json is the Hugging Face config of the model the plan was made for (config.to_json_file); "
        "planner.run checks every parameter's shape against `params` before it parallelizes",
        "the mesh is init_device_mesh(device_type, mesh.shape, mesh_dim_names=mesh.dim_names); tp_plan goes to "
        "parallelize_module(model, mesh['tp'], ...), fsdp to fully_shard(..., mesh=mesh['dp'])",
    ]
    if any(style.get("packed") for style in tp_plan.values()):
        notes.append(
            "packed colwise modules hold fused parts ([q, k, v] or [gate, up]); the launcher reorders their output "
            "rows rank-major before sharding, so each rank holds its slice of every part (Megatron's fused layout)"
        )
    if any(entry["from_conv1d"] for entry in params.values()):
        notes.append("transformers Conv1D modules (weights [in, out]) are converted to nn.Linear before parallelizing")
    if not fsdp and dp > 1:
        notes.append("ZeRO-0: parameters are replicated over dp and gradients all-reduced (averaged) after backward, as DDP does")
    return notes


_TABLE_NOTES = [
    "table_plan goes to parallelize_module(model, mesh['dp'], table_plan['modules']) (each style as in tp_plan: "
    "RowwiseParallel/ColwiseParallel on nn.Embedding, input_layouts Replicate: every rank is fed the whole step's "
    "indices of each table and its own slice of the other inputs); python -m planner.run builds Hugging Face models "
    "only, so a model of your own applies the plan in its training script",
    "after backward, the gradients of parameters that are not DTensors are all-reduced over dp and averaged (DDP); a "
    "table shard's gradient already sums every rank's loss and is multiplied by table_plan['gradient_scale'] (1 / dp)",
]


def _model_section(model: TransformerModel | None, graph: OpGraph) -> dict[str, Any] | None:
    """The transformer's sizes the launcher checks the Hugging Face config against (``None``: not a transformer),
    the numbers a config holds that no parameter shows (the rotary base, the norms' epsilon, read from the
    file; ``None`` where it does not hold them), and :func:`_beyond_sizes`: what the model computes that a
    config derived from sizes alone would not (``planner.run.config_from_plan`` refuses those)."""
    if model is None:
        return None
    rotary = rotary_frequencies(graph.source_path, getattr(graph, "source_sha256", "")) if graph.source_path else None
    epsilons = layer_norm_epsilons(graph)
    return {
        "num_layers": model.num_layers,
        "hidden_size": model.hidden_size,
        "num_attention_heads": model.num_attention_heads,
        "num_key_value_heads": model.num_query_groups,
        "head_dim": model.head_dim,
        "ffn_hidden_size": model.ffn_hidden_size,
        "vocab_size": model.vocab_size,
        "seq_length": model.seq_length,
        "tied_embeddings": model.tied_embeddings,
        "rope_theta": rotary.base if rotary is not None and rotary.geometric else None,
        "norm_eps": epsilons[0] if epsilons is not None and len(epsilons) == 1 else None,
        "beyond_sizes": _beyond_sizes(model, graph, rotary),
    }


def _beyond_sizes(model: TransformerModel, graph: OpGraph, rotary: Any) -> list[str]:
    """What the model computes that no parameter's name or shape shows and a Llama/Qwen2-style config of its
    sizes would not: scaled rotary frequencies, rotary positions on some channels (a partial rotary) or some layers only (SmolLM3's
    NoPE), sliding windows, zero-centred norms, another attention scale,
    soft-capping, norms after the sub-layers, parallel sub-layers."""
    features = model.features
    found = []
    if rotary is not None and not rotary.geometric:
        found.append("rotary frequencies that are not one geometric series (a scaled RoPE)")
    if rotary is not None and 2 * rotary.pairs < model.head_dim:  # a derived config rotates every channel
        found.append(f"rotary positions on {2 * rotary.pairs} of each head's {model.head_dim} channels (a partial rotary)")
    turns = rotated_layers(graph, model.attention) if rotary is not None else ()
    if len(set(turns)) > 1:  # a derived config rotates every layer or none
        found.append(f"rotary positions on some layers only ({sum(t != 'none' for t in turns)} of {len(turns)})")
    windows = sorted({w for w in graph.attention_windows.values() if w is not None and w < model.seq_length})
    if windows:  # a window as wide as the sequence masks nothing the causal mask does not
        found.append(f"sliding-window attention ({', '.join(map(str, windows))} tokens, narrower than the sequence)")
    if features.zero_centred_norms != "none":
        found.append("norms that scale by (1 + weight)")
    scale = features.attention_scale
    if scale is not None and abs(scale * model.head_dim ** 0.5 - 1) > 1e-3:
        found.append(f"attention scores scaled by {scale:.6g}, not 1/sqrt({model.head_dim})")
    if features.attention_softcap or features.logit_softcap:
        found.append("soft-capped scores or logits")
    if features.post_attention_norm or features.post_mlp_norm or features.post_layernorm:
        found.append("norms after the attention or MLP")
    if features.parallel_residual:
        found.append("attention and MLP in parallel")
    return found


def _predicted(strategy: Strategy) -> dict[str, Any]:
    """The planner's step time and memory per device, with the memory's parts when it has them."""
    memory = strategy.memory
    return {
        "time_s": float(strategy.time_s),
        "memory_bytes": float(strategy.memory_bytes),
        "memory": None
        if memory is None
        else {
            "params_bytes": float(memory.params_bytes),
            "grads_bytes": float(memory.grads_bytes),
            "optimizer_bytes": float(memory.optimizer_bytes),
            "activations_bytes": float(memory.activations_bytes),
            "other_bytes": float(memory.other_bytes),
        },
    }


def export_dtensor(plan_input: PlanInput) -> dict[str, Any]:
    """The DTensor plan of a strategy, or :class:`UnsupportedExport` with the reason.

    Returns
    -------
    dict
        ``target``, ``torch_version``, ``world_size``, ``nnodes``, ``nproc_per_node``, ``mesh``
        (``shape``, ``dim_names``), ``degrees``, ``tp_plan`` (FQN -> style), ``fsdp`` (or ``None``),
        ``data_parallel``, ``activation_checkpoint``, ``params``, ``model``, ``batch``,
        ``training``, ``predicted`` (the planner's per-device memory and step time), ``command``
        and ``notes``.

    Raises
    ------
    UnsupportedExport
        When the strategy is not a DTensor pattern (module docstring).

    Examples
    --------
    The module names are the ops' module paths with the layer index generalised:

    >>> generalise_fqn("transformer.h.0.attn.c_attn")
    'transformer.h.*.attn.c_attn'
    """
    graph, cluster, settings = plan_input.graph, plan_input.cluster, plan_input.settings
    refuse_fp8(settings, "dtensor")
    refuse_past_table(graph, "A DTensor plan")
    _check_settings(plan_input)
    try:
        model: TransformerModel | None = analyze_transformer(graph)
    except UnsupportedExport:
        model = None
    family = _read_family(plan_input, model)
    result, layout = _family_masks(graph, plan_input.spaces, family, devices_per_node=cluster.devices_per_node)
    if result.masks is None:
        raise UnsupportedExport(f"a DTensor plan cannot run {family.label} on this model: {result.reason}")
    _check_choice(plan_input, result, layout, family)
    if family.tables and refuses_settings(settings.zero_stage):
        raise UnsupportedExport(
            f"a DTensor plan with {table_label(family.tables)} runs ZeRO-0 only: FSDP2's fully_shard at the root would "
            "take the tables, already sharded over the dp mesh dim; plan with --zero 0"
        )
    world = family.dp * family.tp
    nnodes, per_node = torchrun_nodes(world, cluster.devices_per_node)
    micro = plan_input.samples_per_pass
    per_rank = samples_per_rank(plan_input, family.dp)
    fsdp = settings.zero_stage == 3
    tp_plan = _generalise(_tp_plan(graph, model, family)) if model is not None and family.tp > 1 else {}
    blocks = _block_patterns(graph, model)
    shard = fsdp_shard_group(family.dp, settings) if fsdp else 1
    params = _param_entries(plan_input, family, fsdp=fsdp, shard=shard)
    return {
        "target": "dtensor",
        "format_version": 1,
        "torch_version": TORCH_VERSION,
        "world_size": world,
        "nnodes": nnodes,
        "nproc_per_node": per_node,
        "mesh": {"shape": [family.dp, family.tp], "dim_names": ["dp", "tp"]},
        "degrees": {
            "dp": family.dp,
            "tp": family.tp,
            "pp": 1,
            "sequence_parallel": family.sequence_parallel,
            "vocab_parallel_embedding": family.vocab_parallel_embedding,
            "vocab_parallel_head": family.vocab_parallel_head,
            "tables": family.tables or None,
        },
        "tp_plan": tp_plan,
        "table_plan": table_plan(graph, table_ops(graph), family.tables, dp=family.dp, module_of=_module) if family.tables else None,
        "fsdp": _fsdp_section(blocks, settings.zero_stage, family.dp, shard, offload=settings.offload,
                              reshard=settings.reshard_after_forward),
        "data_parallel": {
            "mesh_dim": "dp",
            "size": family.dp,
            "gradient_sync": ("hsdp_reduce_scatter_all_reduce" if fsdp and shard < family.dp else "fsdp_reduce_scatter" if fsdp
                              else "all_reduce_mean" if family.dp > 1 else "none"),
        },
        "activation_checkpoint": {"mode": settings.recompute, "modules": blocks if settings.recompute == "full" else []},
        "params": params,
        "model": _model_section(model, graph),
        "batch": {
            "micro_batch": micro,
            "micro_batch_per_rank": per_rank,
            "global_batch": plan_input.samples_per_step,
            "grad_accum": plan_input.grad_accum,
            "seq_length": model.seq_length if model is not None else None,
        },
        "training": {
            "precision": settings.precision,
            "optimizer": settings.optimizer,
            "zero_stage": settings.zero_stage,
            "recompute": settings.recompute,
        },
        "predicted": _predicted(plan_input.strategy),
        "command": _command(nnodes, per_node),
        "notes": _notes(tp_plan, params, fsdp=fsdp, dp=family.dp) + (_TABLE_NOTES if family.tables else [])
        + head_copy_note(graph, model, "plan its dynamo export: this plan (model.tied_embeddings false) and the "
                         "config planner.run writes from it give the head a weight of its own"),
    }
