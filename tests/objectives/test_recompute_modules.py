"""Megatron-LM's selective recomputation of the MLP (``recompute="mlp"``: ``--recompute-granularity
selective --recompute-modules mlp``): which ops it recomputes, the activations it frees and the forward
it runs again, against Korthikanti et al. 2022 (table 2's per-layer terms) computed by hand."""

from __future__ import annotations

from pathlib import Path

import pytest

from objectives.graph_facts import _graph_facts, _mlp_ops
from planner.launcher_options import DEFAULT_RECOMPUTE, launcher_recompute
from planner.core.degrees import Pins
from planner.pipeline import PipelineOptions
from tests.objectives.graphs import gpt2_like
from tests.objectives.test_memory import build

DATA = Path(__file__).resolve().parents[1] / "data"


def test_mlp_recompute_frees_the_mlp_activations_by_hand():
    # Korthikanti et al. 2022, "Reducing Activation Recomputation in Large Transformer Models", table 2:
    # the MLP keeps 2sbh (fc1's input) + 8sbh (the GeLU's input, 4h wide) + 8sbh (fc2's input) + sbh
    # (the dropout mask, outside Megatron's MLP module) bytes at 2-byte activations; recomputing the
    # module keeps its input as the checkpoint, so it frees 16sbh per layer (no dropout in this graph)
    layers, batch, seq, hidden = 2, 4, 64, 64
    graph = gpt2_like(layers=layers, hidden=hidden, heads=4, vocab=256, positions=64, batch=batch, seq=seq)
    plain, mlp = build(graph), build(graph, recompute="mlp")
    choice = [0] * len(graph.ops)
    a, b = plain.evaluate(choice), mlp.evaluate(choice)
    assert a.memory.activations_bytes - b.memory.activations_bytes == 16 * seq * batch * hidden * layers
    rows = {row.name: row for row in b.ops}
    for layer in range(layers):
        # fc1 keeps its input (2sbh, the checkpoint), fc2 nothing; the pre-activation (8sbh) is dropped
        assert rows[f"h.{layer}.mlp.c_fc"].memory.activations_bytes == 2 * seq * batch * hidden
        assert rows[f"h.{layer}.mlp.c_proj"].memory.activations_bytes == 0
    # the recomputation is the two linear layers' forward again, nothing else
    recomputed = {row.name for row in b.ops if float(mlp.op_details[row.index].recompute_s[0]) > 0}
    assert recomputed == {f"h.{i}.mlp.{name}" for i in range(layers) for name in ("c_fc", "c_proj")}
    extra = sum(float(mlp.op_details[row.index].recompute_s[0]) for row in b.ops)
    forward = sum(float(plain.op_details[row.index].forward_s[0]) for row in a.ops if row.name in recomputed)
    assert extra == pytest.approx(forward)


def test_mlp_ops_of_a_gated_mlp_and_of_experts():
    from planner.plan import load_graph

    llama = load_graph(str(DATA / "llama_tiny.onnx"), {"batch": 2, "seq": 16})
    flags = _mlp_ops(llama, _graph_facts(llama))
    for instance in llama.blocks[0].instances:
        marked = [llama.ops[i] for i in instance if flags[i]]
        # gate and up projections, the SiLU-gated product, the down projection: no attention op
        assert [op.kind for op in marked] == ["matmul", "matmul", "elementwise", "matmul"]
        assert all(op.kind != "norm" for op in marked)
    # Megatron's mlp module skips MoE layers (TransformerLayer: recompute_mlp only if not is_moe_layer)
    mixtral = load_graph(str(DATA / "mixtral_tiny.onnx"), {"batch": 2, "seq": 16})
    assert not any(_mlp_ops(mixtral, _graph_facts(mixtral)))


def test_megatron_searches_the_mlp_mode():
    options = PipelineOptions(global_batch=8)
    assert options.recompute == DEFAULT_RECOMPUTE
    assert launcher_recompute(options, "megatron", Pins()).recompute == ("none", "selective", "mlp", "full")
    assert launcher_recompute(options, "torchtitan", Pins()).recompute == ("none", "op", "full")
    assert launcher_recompute(options, "torchtitan", Pins(recompute="mlp")) is None


def test_megatron_validator_knows_the_module_rules():
    """megatron-core 0.16.1's TransformerConfig.__post_init__ on --recompute-modules, as the validator says them."""
    from exporters.validate import megatron_violations

    base = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "128",
            "--max-position-embeddings", "128", "--micro-batch-size", "1", "--bf16", "--recompute-granularity", "selective"]
    assert megatron_violations(base + ["--recompute-modules", "mlp"], world_size=1) == []
    assert megatron_violations(base + ["--recompute-modules", "moe_act"], world_size=1) == [
        "moe_act in --recompute-modules is only supported with --moe-grouped-gemm"]
    assert megatron_violations(base + ["--recompute-modules", "mla_up_proj"], world_size=1) == [
        "mla_up_proj in --recompute-modules is only supported with --multi-latent-attention"]
    assert megatron_violations(base + ["--recompute-modules", "layernorm", "--fp8-format", "hybrid"], world_size=1) == [
        "Delayed scaling does not support moe_act and layernorm recompute for fp8."]
