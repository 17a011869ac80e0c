"""Granite-4.0-H's Megatron-LM refusal names what is missing (issue 25, h26d).

Round 2 of the unseen architectures (docs/VALIDATION.md) found ``--target megatron`` refusing Granite-4.0-H
(``GraniteMoeHybridForCausalLM``: Mamba-2 and attention layers, each followed by top-2 routed experts plus a
shared MLP) for "no residual stream (x + f(norm(x)) per layer) from the embedding": the stream reader stopped at
the sum of the routed experts and the shared MLP, an add of two branches before the layer's residual add.

What megatron-core 0.16.1 builds of it: ``MambaStack`` takes an ``E`` layer in ``--hybrid-override-pattern``
(``ssm/mamba_hybrid_layer_allocation.py`` ``Symbols.MOE``, ``ssm/mamba_block.py`` building
``submodules.moe_layer``), which ``mamba_stack_spec`` makes a ``MoETransformerLayer`` whose MoE holds
``shared_experts`` (``models/mamba/mamba_layer_specs.py``, ``models/gpt/moe_module_specs.py``). So the refusal
named the planner's hybrid export, which wrote no MoE flags (h27e: it writes them now, and the E layers are read
whole), and must name what the file computes otherwise than
MambaModel as exported: the attention scale (``attention_multiplier`` 1, not ``1/sqrt(16)``) and the norms'
epsilon (its rotary embeddings, once refused as not placed per layer, are read per layer since h28f).

File: ``tests/data/sparsemixer_cases/granitemoehybrid_dynamo_consts.onnx`` (``counts.json``: 2 layers
``["mamba", "attention"]``, hidden 64, 4 heads over 2 KV groups, Mamba-2 with 8 heads of 16 and state 16,
4 experts of FFN 64, top-2, a shared MLP of 128, rotary). Expected values come from that config and
transformers' defaults (``GraniteMoeHybridConfig``: ``attention_multiplier`` 1.0, ``mamba_d_conv`` 4).
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from exporters.megatron.mamba import _STACKS, hybrid_refusals, hybrid_stack
from importers.hybrid import MambaSizes, layer_parameters
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "data" / "sparsemixer_cases"
NAME = "granitemoehybrid_dynamo_consts.onnx"
CONFIG = json.loads((CASES / "counts.json").read_text())["files"][NAME]["config"]
DIMS = {"batch": 2, "seq": 16}


@pytest.fixture(scope="module")
def granite():
    return load_graph(CASES / NAME, DIMS)


def test_the_stack_reads_each_layer_as_a_mixer_then_an_moe_layer(granite):
    stack = hybrid_stack(granite)
    assert stack.pattern == "".join({"mamba": "M", "attention": "*"}[kind] + "E" for kind in CONFIG["layer_types"])
    heads, head_dim = CONFIG["mamba_n_heads"], CONFIG["mamba_d_head"]
    assert heads * head_dim == CONFIG["mamba_expand"] * CONFIG["hidden_size"]
    assert stack.mamba == MambaSizes(num_heads=heads, head_dim=head_dim, num_groups=CONFIG["mamba_n_groups"],
                                     state_dim=CONFIG["mamba_d_state"], conv_kernel=4)
    kv = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    assert (stack.num_attention_heads, stack.num_query_groups, stack.kv_channels) == (
        CONFIG["num_attention_heads"], CONFIG["num_key_value_heads"], kv)
    assert stack.attention_scale == 1.0  # attention_multiplier's default, not kv ** -0.5


def test_the_moe_layers_are_read_and_the_refusal_names_the_attention_scale(granite):
    """The E layers are read as megatron-core builds them (h27e: the hybrid export writes them,
    tests/exporters/test_megatron_hybrid_experts.py): no clause of theirs; Granite stays refused for its attention
    scale and its epsilon; its rotary embeddings (every attention layer, base 10,000) are MambaModel's (h28f:
    exporters/megatron/mamba_rotary.py), so no clause names them."""
    refusals = hybrid_refusals(hybrid_stack(granite), granite)
    assert not any("residual stream" in r or "(E)" in r for r in refusals)
    experts = hybrid_stack(granite).experts
    assert (experts.num_experts, experts.top_k, experts.ffn, experts.shared_ffn) == (
        CONFIG["num_local_experts"], CONFIG["num_experts_per_tok"], CONFIG["intermediate_size"],
        CONFIG["shared_intermediate_size"])
    assert experts.activation == experts.shared_activation == "swiglu"  # fused input_linear: gate and up
    kv = CONFIG["hidden_size"] // CONFIG["num_attention_heads"]
    assert [r for r in refusals if r.startswith(f"it scales the attention scores by 1, not 1/sqrt({kv})")]
    assert not [r for r in refusals if "rotary" in r]  # position_embedding_type rope, as MambaModel's


def test_the_export_refuses_in_one_line(granite):
    _STACKS.clear()
    spaces = spaces_for(granite, 2)
    with pytest.raises(UnsupportedExport) as info:
        export("megatron", make_input(granite, spaces, [0] * len(spaces)))
    reason = str(info.value)
    assert "\n" not in reason and "pretrain_mamba.py" in reason and "it scales the attention scores by 1" in reason
    assert "residual stream" not in reason


def _two_branch_file(path: Path, *, summed_into_stream: bool) -> None:
    """Token embedding ``e`` [b, s, 8], two linears of it ``a`` and ``b``, their sum ``a + b``; then the residual
    add ``e + (a + b)`` (``summed_into_stream``: Granite's MoE plus shared MLP) or ``e + a`` with ``a + b`` left
    beside the stream (a second output: no layer structure)."""
    import numpy as np
    import onnx
    from onnx import TensorProto, helper, numpy_helper

    rng = np.random.default_rng(0)
    inits = [numpy_helper.from_array(rng.normal(size=shape).astype(np.float32), name)
             for name, shape in (("table", (50, 8)), ("w1", (8, 8)), ("w2", (8, 8)))]
    nodes = [helper.make_node("Gather", ["table", "ids"], ["e"]),
             helper.make_node("MatMul", ["e", "w1"], ["a"]), helper.make_node("MatMul", ["e", "w2"], ["b"]),
             helper.make_node("Add", ["a", "b"], ["branches"]),
             helper.make_node("Add", ["e", "branches" if summed_into_stream else "a"], ["y"])]
    outputs = [helper.make_tensor_value_info("y", TensorProto.FLOAT, ["batch", "seq", 8])]
    if not summed_into_stream:
        outputs.append(helper.make_tensor_value_info("branches", TensorProto.FLOAT, ["batch", "seq", 8]))
    graph = helper.make_graph(nodes, "branches", [helper.make_tensor_value_info("ids", TensorProto.INT64,
                                                                               ["batch", "seq"])], outputs, inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


@pytest.mark.parametrize("summed_into_stream", [True, False])
def test_a_branch_sum_read_by_the_residual_add_keeps_the_stream(tmp_path: Path, summed_into_stream: bool):
    from importers import import_model
    from importers.hybrid import _residual_adds

    path = tmp_path / "branches.onnx"
    _two_branch_file(path, summed_into_stream=summed_into_stream)
    graph = import_model(path, {"batch": 2, "seq": 4})
    adds = [i for i, op in enumerate(graph.ops) if op.node_types == ("Add",)]
    residual = next(i for i in adds if "e" in {a.tensor for a in graph.ops[i].inputs})
    assert _residual_adds(graph, "e", (2, 4, 8)) == ([residual] if summed_into_stream else None)


# Granite-4.0-H without experts (tests/data/hybrid_cases, tests/exporters/make_hybrid_cases.py): the same stack
# read as M-*- with a SwiGLU MLP whose gate and up are one fused input_linear; with Granite's muP factors and its
# default rms_norm_eps 1e-6 it is refused for those, without them it is exported.
DENSE = ROOT / "tests" / "data" / "hybrid_cases"
DENSE_RECORD = json.loads((DENSE / "counts.json").read_text())["files"]
GRANITES = sorted(name for name in DENSE_RECORD if name.startswith("granite"))


@pytest.mark.parametrize("name", GRANITES)
def test_a_fused_gate_and_up_is_a_swiglu_mlp(name: str):
    config = DENSE_RECORD[name]["config"]
    stack = hybrid_stack(load_graph(DENSE / name, DIMS))
    assert stack.pattern == "".join({"mamba": "M", "attention": "*"}[kind] + "-" for kind in config["layer_types"])
    assert (stack.mlp, stack.ffn_hidden_size) == ("swiglu", config["shared_intermediate_size"])
    assert not stack.irregular and stack.attention_scale == config["attention_multiplier"]
    assert stack.rotary == (config["position_embedding_type"] == "rope")  # granite_h_rope (h28f)
    # every parameter is one megatron-core builds: its layers by kind, the table, the untied head and final norm
    h, vocab = config["hidden_size"], config["vocab_size"]
    layers = {"M": layer_parameters("M", stack.mamba, h), "-": layer_parameters("-", (stack.ffn_hidden_size, "swiglu"), h),
              "*": layer_parameters("*", (stack.num_attention_heads, stack.num_query_groups, stack.kv_channels), h)}
    assert sum(layers[k] for k in stack.pattern) + 2 * vocab * h + h == DENSE_RECORD[name]["param_count"]


def test_granites_factors_and_epsilon_are_refused():
    name = "granite_h_scaled_dynamo_consts.onnx"
    config = DENSE_RECORD[name]["config"]
    graph = load_graph(DENSE / name, DIMS)
    stack = hybrid_stack(graph)
    assert stack.stream_scales == ("embedding", "attention output", "logits")
    assert hybrid_refusals(stack, graph) == [
        "it scales the token embedding and a layer's output before its residual add and the logits by a constant "
        "(Granite's embedding_multiplier, residual_multiplier and logits_scaling), and megatron-core 0.16.1's "
        "MambaModel scales none of them",
        "its norms add epsilon 1e-06, and megatron-core 0.16.1's MambaMixer builds its gated RMSNorm with eps=1e-05, "
        "which no flag changes (the hybrid export writes no --norm-epsilon either)"]
    assert (config["embedding_multiplier"], config["residual_multiplier"], config["logits_scaling"]) != (1, 1, 1)
    assert "rms_norm_eps" not in config  # GraniteMoeHybridConfig's default, 1e-6


def test_a_plain_dense_granite_is_exported():
    from exporters.megatron import export_megatron, megatron_masks
    from exporters.validate import parse_megatron_args
    from planner.core.settings import TrainingSettings
    from tests.exporters.graphs import first_rows

    name = "granite_h_plain_dynamo_consts.onnx"
    config = DENSE_RECORD[name]["config"]
    graph = load_graph(DENSE / name, DIMS)
    assert hybrid_refusals(hybrid_stack(graph), graph) == []
    spaces = spaces_for(graph, 2)
    masks = megatron_masks(graph, spaces, dp=2, tp=1)
    out = export_megatron(make_input(graph, spaces, first_rows(masks), settings=TrainingSettings(zero_stage=1),
                                     global_batch=16))
    args = parse_megatron_args(out["args"])
    assert out["script"] == "pretrain_mamba.py" and args["hybrid-override-pattern"] == "M-*-"
    assert args["swiglu"] and args["ffn-hidden-size"] == config["shared_intermediate_size"]
    assert (args["mamba-num-heads"], args["mamba-head-dim"], args["mamba-num-groups"], args["mamba-state-dim"]) == (
        config["mamba_n_heads"], config["mamba_d_head"], config["mamba_n_groups"], config["mamba_d_state"])
    assert args["position-embedding-type"] == "none" and args["untie-embeddings-and-output-weights"]


def test_a_parallel_hybrid_layer_is_named():
    """Falcon-H1 sums a Mamba-2 mixer's and attention's outputs on one norm's input before the residual add: one layer
    of both kinds, which megatron-core's MambaStack (one mixer per layer: M or *) does not build."""
    name = "falcon_h1_parallel_dynamo_consts.onnx"
    config = DENSE_RECORD[name]["config"]
    graph = load_graph(DENSE / name, DIMS)
    stack = hybrid_stack(graph)
    assert stack.pattern == "M-" * config["num_hidden_layers"]
    refusals = hybrid_refusals(stack, graph)
    assert refusals[0] == ("layers 0 and 2 (M): it runs a Mamba mixer and attention side by side on one input, their "
                           "outputs summed (a parallel hybrid layer, as Falcon-H1's), and megatron-core's MambaStack "
                           "runs one mixer per layer")
    assert not any("residual stream" in r or "conv(s) and" in r for r in refusals)
