r"""DeepSpeed exporter: ``ds_config.json`` and the ``deepspeed`` launch line of a strategy.

Three patterns are expressible (reference §2, §6):

* ``tp = 1``: ZeRO data parallelism of any model; every op splits only its batch dims ``dp`` ways;
* ``tp > 1``: AutoTP training (``tensor_parallel.autotp_size``) on a transformer: the same
  column/row-parallel linears and head-split attention as Megatron-LM, but embeddings, LM head,
  norms and residual ops stay replicated over ``tp`` (AutoTP shards linear layers only) and there
  is no sequence parallelism. ``partition_config.layer_specs`` lists the linears by parameter-name
  regex (``column`` for QKV and FC1, ``row`` for the output projection and FC2, a ``shape`` for fused
  QKV or gate/up weights). AutoTP supports ZeRO stages 0-2 and ``torch.nn.Linear`` modules only.

* ``cp > 1``: DeepSpeed-Ulysses context parallelism (``sequence_parallel_size``, Arctic Long Sequence
  Training on a Hugging Face model; :mod:`exporters.deepspeed.ulysses`): the sequence split ``cp``
  ways, the attention core's heads over the same ranks; ZeRO 0-3, no AutoTP, pipeline or experts.
  ``seq_parallel_communication_data_type`` is written as the gradients are priced (bf16 under bf16-mixed):
  DeepSpeed 0.19.8 reduces every gradient in that key's dtype once ``sequence_parallel_size > 1``
  (``DeepSpeedEngine._configure_distributed_model``), and its default, fp32, would move twice the bytes.

Precision: ``bf16.enabled`` under ``bf16-mixed``; at ZeRO-1 also ``data_types.grad_accum_dtype: fp32`` (without
CPU offload), which selects ``BF16_Optimizer`` and its fp32 gradient accumulator, as priced
(:mod:`exporters.deepspeed.bf16_optimizer`).

Batch (``DeepSpeedConfig._batch_assertion``): ``train_batch_size = micro x accumulation x world``,
where world is the data-parallel size, except that config-only AutoTP counts every rank (measured,
reference §2.1), so with ``tp > 1`` the config's ``train_batch_size`` is ``tp`` times the samples a
step really takes; the export says so in ``notes``.

Pipelines (``pp > 1``, reference §2.1): ``deepspeed.pipe.PipelineModule`` over the layer list
``[embeddings, block x L, head]`` with ``num_stages = pp``; its ``PipelineEngine`` runs the 1F1B
``TrainSchedule`` with ``gradient_accumulation_steps`` micro-batches and checks
``train_batch_size = micro x micro-batches x dp``. Even stages are ``partition_method="type:BlockPipe"``
(the blocks balanced, embeddings on the first stage and the head on the last:
``deepspeed.runtime.utils.partition_balanced`` of the block indicator gives exactly the even split);
uneven ones list the planned ``parts`` (layer-list bounds per stage), which the generated
``PipelineModule`` subclass installs in place of DeepSpeed's partitioning. Full recomputation is
``activation_checkpoint_interval = 1`` over the blocks (``checkpointable_layers``). Refused: ZeRO-2/3
(``PipelineEngine`` asserts ZeRO < 2), the GPipe and interleaved schedules (``PipelineEngine`` has
only ``TrainSchedule``), ``tp > 1`` (AutoTP sets its own tensor-parallel groups; a pipeline needs
model code with its own tensor parallelism, as Megatron-DeepSpeed's) and idle stage devices.
"""

from __future__ import annotations

import itertools
import math
import re
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

import numpy as np

from exporters._common import WHOLE_PROJECTION_TP, attention_model, describe_config, launch_shape, launcher_degrees, samples_per_rank
from exporters._tp import AUTOTP_LINEARS, MaskResult, TpLayout, einsum_projection, layout_masks, pure_data_parallel_masks, tp_layout
from exporters.block_chain import chain_break, stacks
from importers.transformer import (
    MoeSummary, TransformerModel, analyze_transformer, moe_summary, refuse_past_table, weight_access,
)
from exporters.generic import PipelineSpec, PlanInput
from exporters.deepspeed.autoep import autoep_preset, expert_parallel_problem, moe_gate_problem, moe_layer_gate_matches
from exporters.deepspeed.zero3 import ZERO3_GATHER, zero3_gather_keys
from exporters.deepspeed.ulysses import ulysses_accepts, ulysses_masks, ulysses_setup
from exporters.deepspeed.validate import validate_deepspeed
from exporters.deepspeed.bf16_optimizer import ACCUMULATE_IN_FP32
from planner.core.configs import ConfigSpace
from planner.core.degrees import dominant_degrees
from exporters._fp8 import refuse_fp8
from planner.core.errors import UnsupportedExport
from planner.core.graph import Op, OpGraph
from planner.core.settings import TrainingSettings

__all__ = ["DEEPSPEED_VERSION", "deepspeed_masks", "layer_specs", "pipeline_parts", "deepspeed_moe", "export_deepspeed"]

DEEPSPEED_VERSION = "0.19.8"
"""The DeepSpeed release whose config rules the export follows."""

_MODULE_PATH = re.compile(r"^[A-Za-z_]\w*(\.\w+)+$")


def _weight_name(graph: OpGraph, op: Op) -> tuple[str, bool]:
    """``(parameter name AutoTP will see, named in the graph)`` of a linear op."""
    access = weight_access(graph, op)
    assert access is not None
    name = access.tensor
    if _MODULE_PATH.match(name) and name.endswith("weight"):
        return name, True
    if op.module_path and _MODULE_PATH.match(op.module_path + ".weight"):
        return op.module_path + ".weight", False
    raise UnsupportedExport(
        f"linear {op.name} has neither a named weight nor a module path, and AutoTP matches layers by "
        "parameter name; export the model with torch's dynamo exporter (it keeps module paths)"
    )


def _projection_name(graph: OpGraph, op: Op) -> str:
    """The parameter name AutoTP sees for a position projection: its weight's, or its module path's
    (the exporters' copy of it is anonymous: ``val_N``, ``onnx::MatMul_N``)."""
    access = weight_access(graph, op)
    if access is not None and _MODULE_PATH.match(access.tensor) and access.tensor.endswith("weight"):
        return access.tensor
    if op.module_path and _MODULE_PATH.match(op.module_path + ".weight"):
        return op.module_path + ".weight"
    raise UnsupportedExport(
        f"position projection {op.name} has neither a named weight nor a module path, and AutoTP must split it "
        "with the attention's heads; export the model with torch's dynamo exporter (it keeps module paths)"
    )


PER_HEAD_WEIGHTS_TP = (
    "its queries and keys are normalised by one LayerNorm per head, each with its own weights (StableLM's "
    "StableLmLayerNormPerHead), which AutoTP keeps whole while each rank holds 1/tp of the heads: the module pairs "
    "its norms with the rank's heads in order, so every rank would use the first heads' weights; plan tp=1")
"""Why AutoTP runs no tp > 1 of a ``per-head-weights`` QK-norm (:mod:`importers.qk_norm`);
:func:`exporters.deepspeed.rules.per_head_weights_tp` drops the families with it, and this refuses a saved plan."""


def _autotp_problem(graph: OpGraph, model: TransformerModel, tp: int) -> str | None:
    """Why AutoTP cannot run ``model`` at ``tp`` (``None``: it can)."""
    if model.num_attention_heads % tp:
        return f"AutoTP size {tp} must divide the {model.num_attention_heads} attention heads"
    if model.num_query_groups % tp:
        return f"AutoTP splits K/V projections by columns: tp={tp} must divide the {model.num_query_groups} KV heads"
    if model.ffn_hidden_size % tp:
        return f"AutoTP size {tp} must divide the FFN size {model.ffn_hidden_size}"
    if model.features.qk_norm == "whole-projection":  # importers.qk_norm: the model's q_norm needs every head
        return WHOLE_PROJECTION_TP
    if model.features.qk_norm == "per-head-weights":  # AutoTP keeps the per-head norms whole: wrong heads' weights
        return PER_HEAD_WEIGHTS_TP
    if found := einsum_projection(graph, model):  # XLNet's q: a [d, n, d_head] Parameter
        return f"{found}; {AUTOTP_LINEARS}"
    for index, role in enumerate(model.roles):
        if role not in ("qkv", "out-proj", "fc1", "fc2"):
            continue
        op = graph.ops[index]
        name, named = _weight_name(graph, op)
        access = weight_access(graph, op)
        reductions = {d.name for d in op.dims if d.kind == "reduction"}
        if named and access is not None and access.axes and set(access.axes[0]) & reductions:
            return (
                f"weight {name} is stored [in, out] (a transformers Conv1D, as in GPT-2); DeepSpeed AutoTP "
                "training partitions torch.nn.Linear layers only"
            )
    return None


def _layout(graph: OpGraph, tp: int) -> TpLayout:
    if moe_summary(graph) is not None:
        # the planned experts are sharded by AutoEP (ep), never by AutoTP's name patterns, which
        # cannot tell one expert weight tensor's up and down projections apart
        raise UnsupportedExport(f"DeepSpeed AutoTP does not shard Mixture-of-Experts layers (tp={tp}); plan tp=1 with ep")
    model = attention_model(graph, f", so it is not a transformer: DeepSpeed's AutoTP shards attention and MLP "
                            f"projections and finds none to split tp={tp} ways; plan with --fix tp=1 (ZeRO data "
                            "parallelism runs it)")
    problem = _autotp_problem(graph, model, tp)
    if problem:
        raise UnsupportedExport(problem)
    return tp_layout(graph, model, target="deepspeed")


def _masks(
    graph: OpGraph, spaces: Sequence[ConfigSpace], *, dp: int, tp: int, devices_per_node: int | None
) -> tuple[MaskResult, TpLayout | None]:
    if tp == 1:
        return pure_data_parallel_masks(graph, spaces, dp=dp), None
    layout = _layout(graph, tp)
    return (
        layout_masks(graph, spaces, layout, dp=dp, tp=tp, sequence_parallel=False, devices_per_node=devices_per_node or dp * tp),
        layout,
    )


def deepspeed_masks(
    graph: OpGraph,
    spaces: Sequence[ConfigSpace],
    *,
    dp: int,
    tp: int,
    devices_per_node: int | None = None,
) -> list[np.ndarray] | None:
    """Per op, which configurations DeepSpeed runs at ``dp x tp`` (ZeRO data parallel x AutoTP).

    ``tp = 1`` accepts any model; ``tp > 1`` needs a transformer whose heads, KV heads and FFN size
    divide by ``tp``. ``devices_per_node`` constrains node placement as in
    :func:`exporters.megatron.megatron_masks`. Returns ``None`` when DeepSpeed cannot run the
    degrees on this model.
    """
    try:
        result, _ = _masks(graph, spaces, dp=dp, tp=tp, devices_per_node=devices_per_node)
    except UnsupportedExport:
        return None
    return result.masks


def _pattern(name: str) -> str:
    """A regex for a parameter name with every numeric path component (the layer index) generalised.

    Examples
    --------
    >>> _pattern("model.layers.0.self_attn.q_proj.weight")
    '^model\\\\.layers\\\\.\\\\d+\\\\.self_attn\\\\.q_proj\\\\.weight$'
    """
    parts = [r"\d+" if part.isdigit() else re.escape(part) for part in name.split(".")]
    return "^" + r"\.".join(parts) + "$"


def layer_specs(graph: OpGraph, model: TransformerModel) -> list[dict[str, Any]]:
    """AutoTP ``partition_config.layer_specs`` for the model's linears, checked for overlaps.

    Column: QKV, FC1 and DeBERTa's own position projections (``pos_key_proj``, ``pos_query_proj``;
    ``shape`` ``[3, -1]`` or ``[[q, kv, kv], -1]`` for one fused QKV weight, ``[2, -1]`` for fused
    K/V or gate/up weights); row: the output projection and FC2.

    Raises
    ------
    UnsupportedExport
        When two linears that must be laid out differently get the same name pattern.
    """
    ops = graph.ops
    kinds: dict[str, str] = {}
    shapes: dict[str, list[Any]] = {}
    names_by_pattern: dict[str, set[str]] = {}
    heads, groups, hd = model.num_attention_heads, model.num_query_groups, model.head_dim
    for block in model.attention:
        fused = set(block.q_proj) & set(block.k_proj)
        # MLA's kv_b_proj holds each head's (nope, v) columns together: a column split is a head split
        fused_kv = (set(block.k_proj) & set(block.v_proj)) - fused if block.mla is None else set()
        for index in (*block.q_proj, *block.k_proj, *block.v_proj):
            if model.roles[index] == "latent-proj":  # MLA's down-projections: replicated (checked below)
                continue
            name, _ = _weight_name(graph, ops[index])
            if index in fused:
                shapes[_pattern(name)] = [3, -1] if groups == heads else [[heads * hd, groups * hd, groups * hd], -1]
            elif index in fused_kv:
                shapes[_pattern(name)] = [2, -1]
            _claim(kinds, names_by_pattern, name, "column", ops[index])
        qk_weights = {access.tensor for i in (*block.q_proj, *block.k_proj) if (access := weight_access(graph, ops[i]))}
        for index in block.position_proj:
            # DeBERTa's own position projections (share_att_key=False) produce the attention's heads:
            # AutoTP divides the module's num_attention_heads (auto_tp.py, update_mp_params), so a
            # whole pos_key_proj would not reshape into them (measured: bmm size mismatch at tp=2)
            access = weight_access(graph, ops[index])
            if access is None or access.tensor not in qk_weights:  # (share_att_key: query_proj's own weight)
                _claim(kinds, names_by_pattern, _projection_name(graph, ops[index]), "column", ops[index])
        for index in block.out_proj:
            _claim(kinds, names_by_pattern, _weight_name(graph, ops[index])[0], "row", ops[index])
    for block in model.mlps:
        for index in block.fc1:
            name, _ = _weight_name(graph, ops[index])
            if block.gated and len(block.fc1) == 1:
                shapes[_pattern(name)] = [2, -1]
            _claim(kinds, names_by_pattern, name, "column", ops[index])
        _claim(kinds, names_by_pattern, _weight_name(graph, ops[block.fc2])[0], "row", ops[block.fc2])
    # Every other linear stays replicated: no pattern may match it. AutoTP leaves a Linear no spec
    # matches as it is (deepspeed 0.19.8 module_inject/auto_tp.py, _replace_with_config: "With
    # partition_config, rely only on explicit specs and skip unmatched layers"), and a spec matches by
    # re.match on the parameter name (autotp_config.py, TPLayerSpec.matches); so a pattern that would
    # reach a replicated linear keeps the layer indices that tell them apart (a Swin's stage 1 MLPs).
    replicated = {_weight_name(graph, ops[i])[0]: role for i, role in enumerate(model.roles)
                  if role in ("lm-head", "linear", "latent-proj")}
    for pattern in [p for p in kinds if any(re.match(p, name) for name in replicated)]:
        kind, shape = kinds.pop(pattern), shapes.pop(pattern, None)
        for name in names_by_pattern[pattern]:
            narrow = _narrowed(name, replicated)
            kinds[narrow] = kind
            if shape is not None:
                shapes[narrow] = shape
    specs: list[dict[str, Any]] = []
    for kind in ("column", "row"):
        plain = sorted(p for p, k in kinds.items() if k == kind and p not in shapes)
        if plain:
            specs.append({"patterns": plain, "partition_type": kind})
    for pattern in sorted(shapes):
        specs.append({"patterns": [pattern], "partition_type": "column", "shape": shapes[pattern], "partition_dim": 0})
    return specs


def _narrowed(name: str, replicated: Mapping[str, str]) -> str:
    """The most general pattern of ``name`` (:func:`_pattern`, some numeric components kept literal)
    that matches none of the ``replicated`` parameter names.

    Raises
    ------
    UnsupportedExport
        When ``name`` itself is one of them (one weight both split and replicated).

    Examples
    --------
    >>> _narrowed("m.layers.0.blocks.1.fc1.weight", {"m.layers.1.blocks.0.fc1.weight": "linear"})
    '^m\\\\.layers\\\\.0\\\\.blocks\\\\.\\\\d+\\\\.fc1\\\\.weight$'
    """
    parts = name.split(".")
    numeric = [i for i, part in enumerate(parts) if part.isdigit()]
    # fewest literal indices first: all generalised, then one kept, ..., then the exact name
    for keep in (set(kept) for size in range(len(numeric) + 1) for kept in itertools.combinations(numeric, size)):
        pattern = "^" + r"\.".join(r"\d+" if i in numeric and i not in keep else re.escape(p) for i, p in enumerate(parts)) + "$"
        hit = next((other for other in replicated if re.match(pattern, other)), None)
        if hit is None:
            return pattern
    raise UnsupportedExport(
        f"AutoTP would shard {name}, which the plan also keeps replicated ({replicated[name]}); rename the modules apart"
    )


def _claim(kinds: dict[str, str], names: dict[str, set[str]], name: str, kind: str, op: Op) -> None:
    pattern = _pattern(name)
    previous = kinds.setdefault(pattern, kind)
    names.setdefault(pattern, set()).add(name)
    if previous != kind:
        raise UnsupportedExport(
            f"linear {op.name} ({name}) needs a {kind}-parallel layout but shares the name pattern {pattern} with "
            f"a {previous}-parallel linear; AutoTP cannot tell them apart"
        )


def pipeline_parts(layers_per_stage: Sequence[int]) -> list[int]:
    """``PipelineModule.parts`` of a stage split: bounds in the layer list ``[embeddings, block x L, head]``.

    Stage ``s`` runs ``layers[parts[s]:parts[s + 1]]``: the first stage also the embeddings, the
    last the head.

    Examples
    --------
    >>> pipeline_parts([3, 4, 4, 1])
    [0, 4, 8, 12, 14]
    """
    counts = [int(n) for n in layers_per_stage]
    bounds = np.concatenate(([0], 1 + np.cumsum(counts[:-1]), [sum(counts) + 2])) if len(counts) > 1 else [0, sum(counts) + 2]
    return [int(b) for b in bounds]


def _check_pipeline(pipeline: PipelineSpec) -> None:
    if pipeline.zero_stage >= 2:
        raise UnsupportedExport(
            f"DeepSpeed's PipelineEngine asserts ZeRO stage < 2 (\"ZeRO-2 and ZeRO-3 are incompatible with pipeline "
            f"parallelism\"), and the plan uses ZeRO-{pipeline.zero_stage} with pp={pipeline.pp}; plan with --zero 0 or 1"
        )
    if pipeline.schedule != "1f1b":
        raise UnsupportedExport(
            f"DeepSpeed's PipelineEngine runs one schedule, TrainSchedule (1F1B); it has no {pipeline.schedule} "
            "schedule; plan with --schedule 1f1b"
        )


def _pipeline_module_code(layers_per_stage: Sequence[int], *, interval: int, group: str, tied: bool) -> tuple[str, str]:
    """The ``PipelineModule`` construction for a stage split: ``(partition_method, python code)``."""
    counts = list(layers_per_stage)
    pp, total = len(counts), sum(counts)
    even = len(set(counts)) == 1
    lines = [
        "import deepspeed",
        "from deepspeed.pipe import LayerSpec, PipelineModule",
        "",
        "# EmbeddingPipe: the ops before the first block (embeddings); BlockPipe(i): block i",
        f"# ({group} in the ONNX graph); HeadPipe: the ops after the last block (final norm, LM head).",
        "# Each takes the previous one's output and returns its own; loss_fn(outputs, labels) -> loss.",
    ]
    if tied:
        lines.append("# The LM head shares the token embedding: declare both with TiedLayerSpec('embed', ...).")
    lines.append(
        f"layers = [LayerSpec(EmbeddingPipe), *[LayerSpec(BlockPipe, i) for i in range({total})], LayerSpec(HeadPipe)]"
    )
    method = "type:BlockPipe" if even else "parts"
    cls = "PipelineModule"
    if not even:
        cls = "PlannedPipelineModule"
        lines += [
            "",
            "",
            "class PlannedPipelineModule(PipelineModule):",
            '    """The planned stages: stage s runs layers[PARTS[s]:PARTS[s + 1]]."""',
            "",
            f"    PARTS = {pipeline_parts(counts)}",
            "",
            "    def _partition_layers(self, method=\"uniform\"):  # DeepSpeed 0.19.8's hook; no public option takes parts",
            "        self.parts = list(self.PARTS)",
            "        stage = self._topo.get_coord(self.global_rank).pipe",
            "        self._set_bounds(start=self.parts[stage], stop=self.parts[stage + 1])",
            "",
            "",
        ]
    lines += [f"model = {cls}(", "    layers=layers,", f"    num_stages={pp},", "    loss_fn=loss_fn,"]
    if even:
        lines.append(f'    partition_method="{method}",  # {counts[0]} blocks per stage')
    if interval:
        lines += [f"    activation_checkpoint_interval={interval},", '    checkpointable_layers=["BlockPipe"],']
    lines += [
        ")",
        "engine, _, _, _ = deepspeed.initialize(",
        "    model=model, model_parameters=[p for p in model.parameters() if p.requires_grad], config=\"ds_config.json\"",
        ")",
        "loss = engine.train_batch(data_iter=train_iter)  # one step: gradient_accumulation_steps micro-batches",
    ]
    return method, "\n".join(lines) + "\n"


def deepspeed_moe(moe: MoeSummary | None, *, ep: int, dp: int, capacity_factor: float = 1.0) -> dict[str, Any] | None:
    """DeepSpeed-MoE's settings for a routed-experts model, ``None`` for a dense one.

    ``layer``: the arguments of ``deepspeed.moe.layer.MoE(hidden_size, expert, num_experts, ep_size,
    k, capacity_factor, drop_tokens)`` for model code that builds its experts with it (dropless:
    ``drop_tokens`` false at capacity factor 1), ``None`` where its gate is not the model's router
    (:func:`~exporters.deepspeed.autoep.moe_layer_gate_matches`); ``ds_config``: the AutoEP section
    (``expert_parallel: {enabled, autoep_size, top_k, score_func, route_norm}``, the last two pinned
    to the graph's routing, deepspeed 0.19.8 ``module_inject/auto_ep_config.py:59,71``) that shards a
    Hugging Face MoE model's experts ``ep`` ways, present when ``ep > 1``. At ``ep = 1`` DeepSpeed
    trains the model's own MoE blocks, whatever its router.

    Raises :class:`UnsupportedExport` when ``ep > 1`` and the router is not a softmax, or ``ep`` does
    not divide the experts and the data-parallel size.

    Examples
    --------
    >>> deepspeed_moe(MoeSummary(layers=2, num_experts=8, top_k=2), ep=4, dp=8)["ds_config"]
    {'expert_parallel': {'enabled': True, 'autoep_size': 4, 'top_k': 2, 'score_func': 'softmax', 'route_norm': True}}
    """
    if moe is None:
        if ep > 1:
            raise UnsupportedExport(f"ep={ep} needs a Mixture-of-Experts model; this one has no routed experts")
        return None
    problem = moe_gate_problem(moe) if ep > 1 else None
    if problem:
        raise UnsupportedExport(problem)
    if moe.num_experts % ep or dp % ep:
        raise UnsupportedExport(
            f"DeepSpeed-MoE needs ep_size ({ep}) to divide the {moe.num_experts} experts and the data-parallel size "
            f"({dp}); pick another point"
        )
    layer = {"num_experts": moe.num_experts, "ep_size": ep, "k": moe.top_k, "capacity_factor": capacity_factor,
             "drop_tokens": capacity_factor != 1.0} if moe_layer_gate_matches(moe) else None
    section = {"expert_parallel": {"enabled": True, "autoep_size": ep, "top_k": moe.top_k, "score_func": "softmax",
                                   "route_norm": moe.renormalized}} if ep > 1 else {}
    return {"layer": layer, "ds_config": section}


def _moe_note(moe: dict[str, Any], ep: int) -> str:
    """The export's note on how DeepSpeed runs the experts (``moe``: :func:`deepspeed_moe`'s answer)."""
    if moe["layer"] is not None:
        return f"MoE: build the experts with deepspeed.moe.layer.MoE({moe['layer']}) or let AutoEP shard them"
    if ep > 1:
        return ("MoE: let AutoEP shard the model's own MoE blocks (expert_parallel pins score_func and route_norm to "
                "its router); deepspeed.moe.layer.MoE's gate renormalises the top-k and would train another router")
    return "MoE: DeepSpeed trains the model's own MoE blocks as exported, every expert on every rank (ep=1)"


@dataclass(frozen=True, slots=True, kw_only=True)
class _Launch:
    """The shape of a DeepSpeed run, read from a strategy and checked (:func:`_launch`)."""

    pipeline: PipelineSpec | None
    """``None`` unless the plan pipelines (``pp > 1``)."""
    layout: TpLayout | None
    """The AutoTP layout (``None`` at ``tp = 1``)."""
    tied: bool
    """The LM head shares the embedding's weight (a pipeline ties them across stages)."""
    dp: int
    tp: int
    pp: int
    world: int
    """Processes: ``dp x cp x tp x pp``."""
    nnodes: int
    per_node: int
    """Processes per node (``--num_gpus``)."""
    per_gpu: int
    """Samples per data-parallel rank per micro-batch (``train_micro_batch_size_per_gpu``)."""
    accumulation: int
    """Micro-batches per step (``gradient_accumulation_steps``)."""
    cp: int = 1
    """DeepSpeed-Ulysses sequence-parallel ranks (``sequence_parallel_size``; 1: none)."""

    @property
    def batch_ranks(self) -> int:
        """The ranks DeepSpeedConfig checks the batch against (all of them with AutoTP, reference §2.1;
        the data-parallel ones, ``world / cp``, under Ulysses)."""
        return self.dp * self.tp


def _check_choice(plan_input: PlanInput, result: MaskResult, layout: TpLayout | None, *, dp: int, tp: int) -> None:
    """Refuse the first op whose configuration is not the pattern's at ``dp x tp``, naming the expected one."""
    graph, choice = plan_input.graph, plan_input.strategy.choice
    assert result.masks is not None
    for index, (mask, row) in enumerate(zip(result.masks, choice)):
        if not mask[row]:
            op, space = graph.ops[index], plan_input.spaces[index]
            role = layout.rules[index].role if layout else "op"
            expected = describe_config(op, space, int(np.flatnonzero(mask)[0]))
            what = f"ZeRO data parallelism (dp={dp})" if tp == 1 else f"AutoTP at dp={dp} x tp={tp}"
            raise UnsupportedExport(
                f"op {op.name} ({role}) is split {describe_config(op, space, row)}; DeepSpeed {what} splits it {expected}"
            )


def _check_chain(graph: OpGraph) -> None:
    """Refuse a pipeline of blocks that are not one chain: ``PipelineModule.forward`` runs each stage's
    layers as ``inputs = layer(inputs)`` (deepspeed 0.19.8 ``runtime/pipe/module.py``), so each block
    gets only what the one before it returned (:mod:`exporters.block_chain`)."""
    reason = chain_break(graph)
    if reason is not None:
        raise UnsupportedExport(
            f"DeepSpeed's PipelineModule runs its layers as one chain, each taking the previous one's output, and "
            f"this model's blocks are not one chain ({stacks(graph)}): {reason}; plan with --fix pp=1"
        )


def _launch(plan_input: PlanInput) -> _Launch:
    """The degrees, processes and batch of ``plan_input``, or :class:`UnsupportedExport` at the first rule
    DeepSpeed breaks (pipeline settings, AutoTP's limits, the pattern, whole nodes, the batch split)."""
    graph, cluster, settings = plan_input.graph, plan_input.cluster, plan_input.settings
    pipeline = plan_input.pipeline if plan_input.pipeline is not None and plan_input.pipeline.pp > 1 else None
    if pipeline is not None:
        _check_pipeline(pipeline)
    tied = False
    roles: Sequence[str] | None = None
    try:
        analysed = analyze_transformer(graph)
        roles, tied = analysed.roles, analysed.tied_embeddings
    except UnsupportedExport:
        pass  # not a transformer: only tp = 1 can be exported
    dp, tp = launcher_degrees(graph, plan_input.spaces, plan_input.strategy.choice, roles)
    if pipeline is not None and tp > 1:
        raise UnsupportedExport(
            f"a DeepSpeed pipeline with tp={tp} needs model code with its own tensor parallelism (Megatron-DeepSpeed's "
            "mpu); AutoTP sets up its own tensor-parallel groups and is not combined with a PipelineModule; export "
            "with --target megatron"
        )
    cp = _ulysses_degree(plan_input, dp=dp, ranks=tp) if pipeline is None and roles is not None and tp > 1 else 1
    if cp == 1 and tp > 1 and roles is not None:  # a model without attention has no context to split
        _refuse_ring_context(plan_input)
    if cp > 1:
        tp, layout = 1, None
    else:
        if tp > 1 and settings.zero_stage == 3:
            raise UnsupportedExport("DeepSpeed AutoTP works with ZeRO stages 0-2 only; plan with --zero 2 or tp=1")
        result, layout = _masks(graph, plan_input.spaces, dp=dp, tp=tp, devices_per_node=cluster.devices_per_node)
        if result.masks is None:
            raise UnsupportedExport(f"DeepSpeed cannot run dp={dp} x tp={tp} on this model: {result.reason}")
        _check_choice(plan_input, result, layout, dp=dp, tp=tp)
    pp = 1
    if pipeline is not None:
        if dp != pipeline.devices_per_stage:
            raise UnsupportedExport(
                f"the plan runs dp={dp} on stages of {pipeline.devices_per_stage} devices, leaving some idle; "
                "DeepSpeed's pipeline topology gives every stage its data-parallel ranks"
            )
        if not graph.blocks:
            raise UnsupportedExport("a DeepSpeed pipeline needs the model's repeated blocks, and this graph has none")
        _check_chain(graph)
        pp = pipeline.pp
    world = dp * cp * tp * pp
    nnodes, per_node = launch_shape(world, cluster.devices_per_node)
    if nnodes * per_node != world:
        raise UnsupportedExport(f"{world} processes do not fill whole nodes of {cluster.devices_per_node} devices")
    return _Launch(
        pipeline=pipeline, layout=layout, tied=tied, dp=dp, tp=tp, pp=pp, world=world, nnodes=nnodes,
        per_node=per_node, per_gpu=samples_per_rank(plan_input, dp), accumulation=plan_input.grad_accum, cp=cp,
    )


def _refuse_ring_context(plan_input: PlanInput) -> None:
    """Refuse a plan whose non-batch split is the sequence's outside the Ulysses pattern (Megatron-LM's and
    torchtitan's context parallelism: each rank's attention exchanges keys and values), named by what its
    ops of the most FLOPs split (:func:`planner.core.degrees.dominant_degrees`), so AutoTP's limits are
    never quoted for a tensor-parallel degree the plan does not have."""
    named = dominant_degrees(plan_input.graph, plan_input.spaces, plan_input.strategy.choice)
    if named is None or named[0][2] == 1:
        return
    _, tp, cp, _ = named[0]
    beside = f" beside tp={tp}" if tp > 1 else ""
    raise UnsupportedExport(
        f"the plan splits the sequence cp={cp} ways{beside} with each rank's attention exchanging keys and values "
        "(Megatron-LM's and torchtitan's context parallelism); DeepSpeed runs context parallelism only as Ulysses "
        "(each attention split by heads): export this row with --export megatron or torchtitan, or plan with "
        "--target deepspeed"
    )


def _ulysses_degree(plan_input: PlanInput, *, dp: int, ranks: int) -> int:
    """``ranks`` when the plan's ``ranks``-way non-batch split is DeepSpeed-Ulysses' (every op's
    sequence split, the attention core's heads: :mod:`exporters.deepspeed.ulysses`), else 1 (AutoTP's
    or no pattern, which the AutoTP check then names)."""
    try:
        result = ulysses_masks(plan_input.graph, plan_input.spaces, dp=dp, cp=ranks,
                               devices_per_node=plan_input.cluster.devices_per_node)
    except UnsupportedExport:
        return 1
    if result.masks is None or not ulysses_accepts(result.masks, plan_input.strategy.choice):
        return 1
    if plan_input.settings.expert_parallel > 1:
        raise UnsupportedExport("DeepSpeed-Ulysses is not combined with expert parallelism here; plan cp=1 or ep=1")
    return ranks


def _checkpointing(settings: TrainingSettings, pipeline: PipelineSpec | None) -> tuple[dict[str, Any], str]:
    """The ``activation_checkpointing`` section of a recomputing plan, and the note on what to wrap."""
    section = {
        "partition_activations": False,
        "cpu_checkpointing": False,
        "contiguous_memory_optimization": False,
        "synchronize_checkpoint_boundary": False,
        "profile": False,
    }
    what = "each layer (transformer block)" if settings.recompute == "full" else "the attention core (scores, softmax, values)"
    if pipeline is not None and settings.recompute == "full":
        return section, "the PipelineModule checkpoints every block (activation_checkpoint_interval=1)"
    return section, f"activation checkpointing only configures deepspeed.checkpointing.checkpoint: wrap {what} with it"


@dataclass(frozen=True, slots=True, kw_only=True)
class _PipelineSections:
    """What a pipelined plan adds to the export (:func:`_pipeline_sections`)."""

    config: dict[str, Any]
    """``ds_config["pipeline"]``: stages and checkpoint interval."""
    entry: dict[str, Any]
    """The export's ``pipeline`` entry, with the ``PipelineModule`` code."""
    note: str
    """How to build and train the pipeline, and which ranks run each stage."""


def _pipeline_sections(plan_input: PlanInput, launch: _Launch) -> _PipelineSections:
    """The ``ds_config`` section, export entry and note of a pipelined plan."""
    pipeline = launch.pipeline
    assert pipeline is not None
    interval = 1 if plan_input.settings.recompute == "full" else 0
    blocks = plan_input.graph.blocks
    # one chain of several groups (e.g. dense then MoE layers): block i is the i-th in graph order
    group = f"{blocks[0].name or 'layers'}.i" if len(blocks) == 1 else f"the i-th of {stacks(plan_input.graph)}"
    method, code = _pipeline_module_code(pipeline.layers_per_stage, interval=interval, group=group, tied=launch.tied)
    section = {"stages": launch.pp, "activation_checkpoint_interval": interval}
    entry = {
        "num_stages": launch.pp,
        "partition_method": method,
        "parts": pipeline_parts(pipeline.layers_per_stage),
        "layers_per_stage": list(pipeline.layers_per_stage),
        "activation_checkpoint_interval": interval,
        "schedule": "1f1b",
        "micro_batches": launch.accumulation,
        "code": code,
    }
    dp = launch.dp
    note = (
        "build the model as a deepspeed.pipe.PipelineModule (pipeline.code) and train with engine.train_batch(); "
        f"stage s runs on ranks [s x {dp}, (s + 1) x {dp}) (PipeDataParallelTopology puts pipe outermost)"
    )
    return _PipelineSections(config=section, entry=entry, note=note)


def _base_config(settings: TrainingSettings, launch: _Launch) -> dict[str, Any]:
    """The ``ds_config`` of the batch, ZeRO (offload, overlap, ZeRO-3's gather bounds) and precision,
    as the plan was priced; the parallel sections are added by :func:`export_deepspeed`."""
    per_gpu, accumulation = launch.per_gpu, launch.accumulation
    config: dict[str, Any] = {
        # Config-only AutoTP checks the batch against every rank (reference §2.1).
        "train_batch_size": per_gpu * accumulation * launch.batch_ranks,
        "train_micro_batch_size_per_gpu": per_gpu,
        "gradient_accumulation_steps": accumulation,
        "zero_optimization": {"stage": settings.zero_stage},
    }
    if settings.zero_stage >= 1:
        # ZeRO-Offload as priced (objectives.offload): the optimizer state and step on the CPU, the
        # copies from pinned buffers (pin_memory), which run at the host link's rate
        config["zero_optimization"]["offload_optimizer"] = (
            {"device": "cpu", "pin_memory": True} if settings.offload in ("optimizer", "parameters") else {"device": "none"})
        # as priced (settings.overlap, objectives.pipeline_arrays); DeepSpeed's default is off below ZeRO-3
        config["zero_optimization"]["overlap_comm"] = settings.overlap
    if settings.zero_stage == 3:
        # parameter offload as priced (objectives.offload): the partitions in pinned host memory, fetched
        # before each all-gather (deepspeed 0.19.8 DeepSpeedZeroOffloadParamConfig)
        config["zero_optimization"]["offload_param"] = (
            {"device": "cpu", "pin_memory": True} if settings.offload == "parameters" else {"device": "none"})
        # the gather bounds the plan's memory was priced with (objectives.memory.deepspeed_gathered_peak),
        # written so the run holds what was priced even where DeepSpeed's defaults change
        config["zero_optimization"].update(zero3_gather_keys(settings.zero3_gather or ZERO3_GATHER))
        if settings.hpz_partition is not None and math.gcd(launch.world, settings.hpz_partition) > 1:
            # ZeRO++'s hpZ as priced (objectives.intra_op.hpz_group): the secondary copy over that many consecutive
            # ranks, which must divide the world (0.19.8 utils/groups.py _create_zero_param_parallel_group)
            config["zero_optimization"]["zero_hpz_partition_size"] = math.gcd(launch.world, settings.hpz_partition)
    if settings.precision == "bf16-mixed":
        config["bf16"] = {"enabled": True}
        if settings.zero_stage == ACCUMULATE_IN_FP32 and settings.offload == "none":
            # fp32 gradient accumulation selects BF16_Optimizer, whose fp32 accumulator the memory was priced
            # with (bf16_optimizer.grad_accumulator; Megatron-DeepSpeed's bf16 ZeRO-1 path)
            config["data_types"] = {"grad_accum_dtype": "fp32"}
    return config


def export_deepspeed(plan_input: PlanInput) -> dict[str, Any]:
    """The DeepSpeed launch plan of a strategy, or :class:`UnsupportedExport` with the reason.

    Returns
    -------
    dict
        ``target``, ``world_size``, ``nnodes``, ``nproc_per_node``, ``degrees``, ``ds_config``,
        ``command``, ``batch``, ``ulysses`` (``None`` without context parallelism; else
        ``sequence_parallel_size`` and ``code``: the ALST setup), ``pipeline`` (``None`` without one; else ``num_stages``,
        ``partition_method``, ``parts``, ``layers_per_stage``, ``activation_checkpoint_interval``,
        ``code``: the ``PipelineModule`` construction) and ``notes``.
    """
    graph, settings = plan_input.graph, plan_input.settings
    refuse_fp8(plan_input.settings, "deepspeed")
    refuse_past_table(graph, "DeepSpeed")
    launch = _launch(plan_input)
    dp, tp, pp, world, per_gpu, accumulation = (
        launch.dp, launch.tp, launch.pp, launch.world, launch.per_gpu, launch.accumulation
    )
    config = _base_config(settings, launch)
    notes = [
        "pass ds_config.json to deepspeed.initialize(config=...) in your training script, with a "
        f"{'torch.optim.SGD' if settings.optimizer == 'sgd' else 'torch.optim.AdamW'} optimizer (as planned)"
    ]
    # the transformer AutoTP or Ulysses runs (None for ZeRO data parallelism of any model)
    model = launch.layout.model if launch.layout else analyze_transformer(graph) if launch.cp > 1 else None
    if settings.recompute != "none":
        config["activation_checkpointing"], note = _checkpointing(settings, launch.pipeline)
        notes.append(note)
    pipeline_out = None
    if launch.pipeline is not None:
        sections = _pipeline_sections(plan_input, launch)
        config["pipeline"], pipeline_out = sections.config, sections.entry
        notes.append(sections.note)
    ulysses_out = None
    if launch.cp > 1 and model is not None:
        config["sequence_parallel_size"] = launch.cp
        # DeepSpeedEngine swaps communication_data_type for this key whenever sequence_parallel_size > 1, and its
        # default is fp32: twice the gradient-reduction bytes priced. Written as the run without Ulysses reduces
        # (the engine's communication_data_type default: the mixed-precision dtype), so it runs as priced.
        config["seq_parallel_communication_data_type"] = "bf16" if settings.precision == "bf16-mixed" else "fp32"
        code, note = ulysses_setup(model, cp=launch.cp, micro_batch=per_gpu)
        ulysses_out = {"sequence_parallel_size": launch.cp, "code": code}
        notes.append(note)
    if tp > 1 and model is not None:
        config["tensor_parallel"] = {
            "autotp_size": tp,
            "partition_config": {"use_default_specs": False, "layer_specs": layer_specs(graph, model)},
        }
        notes.append(
            f"with AutoTP, train_batch_size counts all {world} ranks; a step takes {per_gpu * accumulation * dp} samples"
        )
    if settings.expert_parallel > 1 and (problem := expert_parallel_problem(graph)):
        raise UnsupportedExport(problem)
    moe = deepspeed_moe(moe_summary(graph), ep=settings.expert_parallel, dp=dp, capacity_factor=settings.capacity_factor)
    if moe is not None:
        config.update(moe["ds_config"])
        if "expert_parallel" in config:  # the preset AutoEP would otherwise guess (autoep.autoep_preset)
            config["expert_parallel"]["preset_model"] = autoep_preset(graph)
        notes.append(_moe_note(moe, settings.expert_parallel))
    validate_deepspeed(
        config,
        world_size=world,
        pipeline_stages=pp,
        num_attention_heads=model.num_attention_heads if model else None,
        num_kv_heads=model.num_query_groups if model else None,
    )
    launcher = ["deepspeed"]
    if launch.nnodes > 1:
        launcher += ["--hostfile", "hostfile", "--num_nodes", str(launch.nnodes)]
    launcher += ["--num_gpus", str(launch.per_node), "train.py", "--deepspeed", "--deepspeed_config", "ds_config.json"]
    return {
        "target": "deepspeed",
        "deepspeed_version": DEEPSPEED_VERSION,
        "world_size": world,
        "nnodes": launch.nnodes,
        "nproc_per_node": launch.per_node,
        "degrees": {"dp": dp, "cp": launch.cp, "tp": tp, "pp": pp},
        "ds_config": config,
        "ulysses": ulysses_out,
        "moe": None if moe is None else moe["layer"],
        "pipeline": pipeline_out,
        "command": " ".join(launcher),
        "batch": {
            "micro_batch_per_gpu": per_gpu,
            "gradient_accumulation_steps": accumulation,
            "samples_per_step": per_gpu * accumulation * dp,
        },
        "time_s": float(plan_input.strategy.time_s),
        "memory_bytes": float(plan_input.strategy.memory_bytes),
        "notes": notes,
    }
