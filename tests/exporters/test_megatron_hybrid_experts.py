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
    assert megatron_masks(graph, spaces, dp=1, tp=2) is None  # tp > 1: not offered
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
