"""A hybrid stack's MoE layers exported to Megatron-LM's ``pretrain_mamba.py`` (issue 25, h27e).

megatron-core 0.16.1's ``MambaStack`` builds ``E`` layers of ``--hybrid-override-pattern`` (``mamba_stack_spec``'s
``MoETransformerLayer``), from the MoE flags of the GPT family. Before, a hybrid file with MoE layers was refused
("the planner's hybrid export writes no MoE layer"); now the pattern keeps its ``E``s and the export writes the
experts, router, shared-expert and expert-parallel flags, each read from the graph.

File: ``tests/data/hybrid_moe_cases`` (``tests/exporters/make_hybrid_moe_cases.py``: transformers'
``NemotronHForCausalLM``, pattern ``ME*E-``, 4 squared-ReLU experts of FFN 32, top-2 by a sigmoid router with a
score bias, renormalised, beside a shared expert of FFN 48). Expected values come from ``counts.json`` (the config
and torch's own parameter counts), never from the planner. megatron-core's own code checks the export in
``tests/integration/test_megatron_hybrid_experts.py``.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters.megatron import export_megatron, megatron_masks
from exporters.megatron.mamba import hybrid_refusals, hybrid_stack
from exporters.validate import parse_megatron_args
from importers.hybrid import layer_parameters
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "hybrid_moe_cases"
RECORD = json.loads((CASES / "counts.json").read_text())
CONFIG, PATTERN = RECORD["config"], RECORD["pattern"]
FILES = sorted(RECORD["files"])
DIMS = {"batch": 2, "seq": 16}


def export(name: str, *, ep: int = 2, tp: int = 1) -> dict:
    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 2)
    masks = megatron_masks(graph, spaces, dp=2 // tp, tp=tp)
    if masks is None:
        raise UnsupportedExport("no masks")
    return export_megatron(make_input(graph, spaces, first_rows(masks), global_batch=16,
                                      settings=TrainingSettings(zero_stage=1, expert_parallel=ep)))


@pytest.mark.parametrize("name", FILES)
def test_the_moe_layers_are_read_as_megatron_core_builds_them(name: str):
    graph = load_graph(CASES / name, DIMS)
    stack = hybrid_stack(graph)
    assert stack.pattern == PATTERN and hybrid_refusals(stack, graph) == []
    experts = stack.experts
    assert (experts.num_experts, experts.top_k, experts.ffn, experts.shared_ffn, experts.shared_gate) == (
        CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"], CONFIG["moe_intermediate_size"],
        CONFIG["moe_shared_expert_intermediate_size"], False)
    assert experts.activation == experts.shared_activation == stack.mlp == "squared-relu"  # mlp_hidden_act relu2
    router = experts.router
    assert (router.score_function, router.expert_bias, router.groups, router.scaling) == (
        "sigmoid", True, CONFIG["n_group"], CONFIG["routed_scaling_factor"])


@pytest.mark.parametrize("name", FILES)
def test_megatron_cores_layers_hold_torchs_parameters(name: str):
    """Layer by layer as megatron-core 0.16.1 builds each kind (importers.hybrid.layer_parameters), plus the token
    table, the untied head and the final norm: torch's count of the transformers model."""
    stack = hybrid_stack(load_graph(CASES / name, DIMS))
    h, vocab = CONFIG["hidden_size"], CONFIG["vocab_size"]
    sizes = {"M": stack.mamba, "*": (stack.num_attention_heads, stack.num_query_groups, stack.kv_channels),
             "-": (stack.ffn_hidden_size, stack.mlp), "E": stack.experts}
    # E: norm h, router E x h, E experts' up and down (h x f each), the shared expert's up and down (h x s each)
    e, f, s = CONFIG["n_routed_experts"], CONFIG["moe_intermediate_size"], CONFIG["moe_shared_expert_intermediate_size"]
    assert layer_parameters("E", stack.experts, h) == h + e * h + e * 2 * h * f + 2 * h * s
    total = sum(layer_parameters(k, sizes[k], h) for k in stack.pattern) + 2 * vocab * h + h
    assert total == RECORD["files"][name]["param_count"]


@pytest.mark.parametrize("name", FILES)
def test_the_export_writes_the_e_layers_and_their_flags(name: str):
    out = export(name)
    args = parse_megatron_args(out["args"])
    assert out["script"] == "pretrain_mamba.py" and args["hybrid-override-pattern"] == PATTERN
    assert (args["num-experts"], args["moe-router-topk"], args["moe-ffn-hidden-size"]) == (
        CONFIG["n_routed_experts"], CONFIG["num_experts_per_tok"], CONFIG["moe_intermediate_size"])
    assert args["moe-shared-expert-intermediate-size"] == CONFIG["moe_shared_expert_intermediate_size"]
    assert "moe-shared-expert-gate" not in args and "moe-layer-freq" not in args  # the pattern says which layers
    assert args["moe-router-score-function"] == "sigmoid" and args["moe-router-enable-expert-bias"]
    assert "moe-router-topk-scaling-factor" not in args  # routed_scaling_factor 1.0
    assert args["expert-model-parallel-size"] == 2 and args["squared-relu"]
    assert args["ffn-hidden-size"] == CONFIG["intermediate_size"]  # the MLP layer's, the experts' apart
    assert any("e_score_correction_bias" in note for note in out["notes"])
    assert {k: out["model"][k] for k in ("num_experts", "moe_router_topk", "moe_ffn_hidden_size",
                                         "moe_shared_expert_intermediate_size")} == {
        "num_experts": CONFIG["n_routed_experts"], "moe_router_topk": CONFIG["num_experts_per_tok"],
        "moe_ffn_hidden_size": CONFIG["moe_intermediate_size"],
        "moe_shared_expert_intermediate_size": CONFIG["moe_shared_expert_intermediate_size"]}


def test_tp_and_an_ep_that_does_not_divide_are_refused_in_one_line():
    name = FILES[0]
    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 2)
    assert megatron_masks(graph, spaces, dp=1, tp=2) is None  # tp > 1 without --sequence-parallel: not offered
    with pytest.raises(UnsupportedExport) as info:
        export(name, ep=3)
    assert "\n" not in str(info.value) and "--expert-model-parallel-size (3)" in str(info.value)


def _two_stages(graph, first_layers: int):
    """A pp=2 plan at dp=1, tp=1 per stage, the first stage the stack's first ``first_layers`` layers (cut after their
    residual add, read independently here: the adds of the residual stream, each reading the previous one's output)."""
    from exporters.generic import PipelineSpec, StageSpec
    from tests.exporters.graphs import make_cluster

    ops = graph.ops
    stream = next(op for op in ops if op.kind == "embedding").outputs[0].tensor
    adds = []
    for index, op in enumerate(ops):
        if op.node_types == ("Add",) and stream in {a.tensor for a in op.inputs} and len(op.inputs) == 2:
            adds.append(index)
            stream = op.outputs[0].tensor
    assert len(adds) == len(PATTERN)  # one residual add per layer; each E layer's routed + shared sum is not one
    cut = adds[first_layers - 1]
    stages = (StageSpec(index=0, layers=(0, 1), ops=tuple(range(cut + 1))),
              StageSpec(index=1, layers=(1, 2), ops=tuple(range(cut + 1, len(ops)))))
    spec = PipelineSpec(pp=2, devices_per_stage=1, schedule="1f1b", chunks=1, micro_batch=4, micro_batches=4,
                        global_batch=16, zero_stage=1, recompute="none", stages=stages)
    spaces = spaces_for(graph, 1)
    masks = megatron_masks(graph, spaces, dp=1, tp=1, devices_per_node=1)
    return make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(zero_stage=1), micro_batch=4,
                      global_batch=16, pipeline=spec, cluster=make_cluster(1, 2))


def test_pipeline_stages_count_the_moe_layers_once():
    """MambaStack places whole layers per stage; an E layer's sum of its routed and shared experts (an add of the
    stream's shape) is inside the layer, not a layer's end: ME | *E- is 2 then 3 layers."""
    graph = load_graph(CASES / FILES[0], DIMS)
    out = export_megatron(_two_stages(graph, 2))
    args = parse_megatron_args(out["args"])
    assert out["pipeline"]["layers_per_stage"] == [2, 3] and args["pipeline-model-parallel-size"] == 2
    assert (args["decoder-first-pipeline-num-layers"], args["decoder-last-pipeline-num-layers"]) == (2, 3)
    assert args["hybrid-override-pattern"] == PATTERN and args["num-experts"] == CONFIG["n_routed_experts"]


# tp > 1 (h28f): megatron-core trains MoE layers with tensor parallelism only under --sequence-parallel; the router's
# weight is whole on every rank and routes the rank's sequence shard, the experts split their width over the expert
# tensor-parallel size (tp by default). The ops are found here from the file's parameter shapes and op types, never
# from the planner's MoE reader.

def _megatron_tp_masks(graph, spaces, *, dp=2, tp=2, sequence_parallel=True):
    return megatron_masks(graph, spaces, dp=dp, tp=tp, sequence_parallel=sequence_parallel)


def _ops_with_parameter_shape(graph, shape: set[int], rank: int) -> list[int]:
    """Matmuls reading a parameter of ``rank`` axes whose sizes are ``shape`` (as a set)."""
    found = []
    for index, op in enumerate(graph.ops):
        for access in op.inputs:
            tensor = graph.tensors[access.tensor]
            if op.kind == "matmul" and tensor.role == "parameter" and len(tensor.shape) == rank and set(tensor.shape) == shape:
                found.append(index)
    return found


def _factors(spaces, index: int, mask) -> list[dict[str, int]]:
    space = spaces[index]
    return [dict(zip(space.dim_names, map(int, space.factors[row]))) for row in np.flatnonzero(mask)]


@pytest.mark.parametrize("name", FILES)
def test_tp_without_sequence_parallel_is_refused_with_megatron_cores_reason(name: str):
    from exporters.megatron.mamba import hybrid_mask_result

    graph = load_graph(CASES / name, DIMS)
    result = hybrid_mask_result(graph, spaces_for(graph, 2), hybrid_stack(graph), dp=1, tp=2, sequence_parallel=False)
    # megatron-core 0.16.1 transformer/moe/moe_layer.py, MoELayer.forward's ValueError, word for word
    assert result.masks is None and "\n" not in result.reason
    assert "performance may degrade if MoE and tensor parallelism are enabled without also enabling sequence " \
           "parallelism" in result.reason and "--sequence-parallel" in result.reason


@pytest.mark.parametrize("name", FILES)
def test_tp_with_sequence_parallel_lays_out_the_router_and_experts_as_megatron_core(name: str):
    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 4)
    masks = _megatron_tp_masks(graph, spaces)
    assert masks is not None
    h, e, f = CONFIG["hidden_size"], CONFIG["n_routed_experts"], CONFIG["moe_intermediate_size"]
    routers = _ops_with_parameter_shape(graph, {e, h}, 2)
    assert len(routers) == CONFIG["layers_block_type"].count("moe")
    for index in routers:  # TopKRouter: [E, hidden] whole on each rank, on its sequence shard (2 of 16 tokens x 2)
        op = graph.ops[index]
        seq, experts_dim = op.inputs[0].axes[1][0], op.outputs[0].axes[1][0]
        assert all(c[seq] == 2 and c[experts_dim] == 1 for c in _factors(spaces, index, masks[index]))
    ups = [i for i in _ops_with_parameter_shape(graph, {e, f, h}, 3) if graph.ops[i].outputs[0].axes[1]
           and graph.ops[i].dim(graph.ops[i].outputs[0].axes[1][0]).size == f]
    assert len(ups) == len(routers)
    for index in ups:  # the experts' fc1: column parallel over the expert tp size (2), the tokens gathered
        width = graph.ops[index].outputs[0].axes[1][0]
        assert all(c[width] == 2 for c in _factors(spaces, index, masks[index]))
    topks = [i for i, op in enumerate(graph.ops) if "TopK" in op.node_types]
    assert topks
    for index in topks:  # the routing runs on dp x tp = 4 shards of the flattened tokens
        op, space = graph.ops[index], spaces[index]
        batch = [space.dim_names.index(d.name) for d in op.dims if d.is_batch]
        assert all(int(np.prod(space.factors[row, batch])) == 4 for row in np.flatnonzero(masks[index]))


@pytest.mark.parametrize("name", FILES)
def test_tp_with_sequence_parallel_exports_the_e_layers(name: str):
    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 4)
    masks = _megatron_tp_masks(graph, spaces)
    out = export_megatron(make_input(graph, spaces, first_rows(masks), global_batch=16,
                                     settings=TrainingSettings(zero_stage=1, expert_parallel=2)))
    args = parse_megatron_args(out["args"])
    assert (args["tensor-model-parallel-size"], args["sequence-parallel"], args["expert-model-parallel-size"]) == (2, True, 2)
    assert args["hybrid-override-pattern"] == PATTERN and args["num-experts"] == CONFIG["n_routed_experts"]
    assert "expert-tensor-parallel-size" not in args  # megatron-core's default: the tp size


@pytest.mark.parametrize("name", FILES)
def test_a_plan_that_splits_the_routers_experts_over_tp_is_refused(name: str):
    """The planner's search may split the router's expert dim tp ways (a column-parallel router): megatron-core keeps
    the router whole, so the export names the op and Megatron's split."""
    from tests.exporters.graphs import set_split

    graph = load_graph(CASES / name, DIMS)
    spaces = spaces_for(graph, 4)
    choice = first_rows(_megatron_tp_masks(graph, spaces))
    h, e = CONFIG["hidden_size"], CONFIG["n_routed_experts"]
    router = graph.ops[_ops_with_parameter_shape(graph, {e, h}, 2)[0]]
    batch = next(d.name for d in router.dims if d.is_batch)
    choice = set_split(graph, spaces, choice, router.name, {batch: 2, router.outputs[0].axes[1][0]: 2})
    with pytest.raises(UnsupportedExport) as info:
        export_megatron(make_input(graph, spaces, choice, global_batch=16,
                                   settings=TrainingSettings(zero_stage=1, expert_parallel=2)))
    assert router.name in str(info.value) and "\n" not in str(info.value)


def test_an_expert_width_tp_does_not_divide_is_refused_in_one_line():
    from dataclasses import replace

    from exporters.megatron.mamba_moe import moe_tp_refusal

    stack = hybrid_stack(load_graph(CASES / FILES[0], DIMS))
    assert moe_tp_refusal(stack, 2, True) is None and moe_tp_refusal(stack, 1, False) is None
    narrow = replace(stack, experts=replace(stack.experts, ffn=30))  # 30 = 2 x 15: tp=4 does not divide it
    assert moe_tp_refusal(narrow, 2, True) is None
    assert "--moe-ffn-hidden-size (30)" in moe_tp_refusal(narrow, 4, True)
    shared = replace(stack, experts=replace(stack.experts, shared_ffn=50))
    assert "--moe-shared-expert-intermediate-size (50)" in moe_tp_refusal(shared, 4, True)
