"""Issue 25: BLOOM's attention is an attention core in both exports (importers/fusion.py,
``_prologue_candidate``), so the flash execution model prices it without its s x s scores.

BLOOM scores with ALiBi, ``baddbmm(alibi, q, k^T, beta=1, alpha=1/sqrt(d))`` on ``[b h, s, d]``
views, then adds the causal mask on a ``[b, h, s, s]`` view of the scores (transformers 5.24
``models/bloom/modeling_bloom.py``, ``BloomAttention.forward``). The TorchScript export computes that
mask from the ``attention_mask`` input, so the mask ``Add`` has two activation inputs and, its scores
being a view that splits the product's batch axis, joined no op: it stood between the product and
the softmax as an op of its own and no core was found (the dynamo export, whose mask is built from
constants, already joined the softmax). Now the ``Add`` is the softmax's prologue there too.

Fixtures: the zoo's ``bloom_*`` files (``tests/zoo/make_zoo.py``: ``BloomForCausalLM`` of 2 layers,
hidden 64, 4 heads, both exporters, graph-only with and without small constants), at batch 8 and
512 tokens.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from objectives.attention import find_attention_cores
from objectives.cluster import make_cluster
from objectives.execution import execution_of
from objectives.memory import saved_activation_bytes
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from planner.plan import load_graph

ZOO = Path(__file__).resolve().parents[1] / "zoo"
CONFIG = json.loads((ZOO / "zoo.json").read_text())["files"]["bloom_ts_consts.onnx"]["config"]
LAYERS, HIDDEN, HEADS = CONFIG["n_layer"], CONFIG["hidden_size"], CONFIG["n_head"]  # 2, 64, 4
BATCH, SEQ = 8, 512
DIMS = {"batch": BATCH, "seq": SEQ}
STYLES = ["ts_consts", "ts_bare", "dynamo_consts", "dynamo_bare"]


def _graph(style: str):
    return load_graph(ZOO / f"bloom_{style}.onnx", DIMS)


def _model(graph, attention: str):
    return build_cost_model(
        graph, cluster=make_cluster("h100-sxm", devices=1),
        settings=TrainingSettings(engine="fused", attention=attention),
        config_options=ConfigOptions(devices=1, devices_per_node=1),
    )


@pytest.mark.parametrize("style", STYLES)
def test_one_causal_alibi_core_per_layer(style):
    graph = _graph(style)
    cores = find_attention_cores(graph)
    assert len(cores) == LAYERS
    for core in cores:
        # b h = 8 x 4 score matrices of 512 x 512, head dim 64 / 4 = 16 for Q, K and V
        assert (core.batch_heads, core.seq_q, core.seq_k) == (BATCH * HEADS, SEQ, SEQ)
        assert (core.head_dim, core.value_dim) == (HIDDEN // HEADS, HIDDEN // HEADS)
        assert core.mask == "causal"
        softmax = graph.ops[core.softmax]
        assert any(graph.attention_biases.get(n) == "alibi" for n in softmax.onnx_nodes)


def test_torchscript_mask_add_joins_the_softmax():
    """The mask ``Add`` (scores view + ``[b, 1, s, s]`` mask) is the softmax's prologue: the softmax
    reads the ``baddbmm`` product's output itself, and the mask as a second input."""
    graph = _graph("ts_consts")
    cores = find_attention_cores(graph)
    assert len(cores) == LAYERS
    for layer, core in enumerate(cores):
        softmax = graph.ops[core.softmax]
        assert f"/transformer/h.{layer}/self_attention/Add_1" in softmax.onnx_nodes
        assert softmax.inputs[0].tensor == graph.ops[core.score].outputs[0].tensor
        assert graph.tensors[softmax.inputs[1].tensor].shape == (BATCH, 1, SEQ, SEQ)
        assert core.between == ()


def test_flash_core_keeps_q_k_v_alibi_and_the_log_sum_exp():
    """By hand, bf16 (2 bytes), per layer: the score product keeps Q and K (8 x 512 x 64 x 2 =
    524,288 bytes each) and the TorchScript export's ALiBi tensor it adds (``[b h, 1, s]``: 8 x 4 x 512
    x 2 = 32,768): 1,081,344; the softmax nothing; the value product V (524,288) and one fp32
    log-sum-exp per query row (8 x 4 x 512 x 4 = 65,536): 589,824. Explicit scores keep the
    probabilities instead: 8 x 4 x 512 x 512 x 2 = 16,777,216 bytes on the softmax."""
    graph = _graph("ts_consts")
    cores = find_attention_cores(graph)
    assert len(cores) == LAYERS
    expected = {
        "flash": {"score": 1_081_344, "softmax": 0, "value": 589_824},
        "explicit": {"softmax": 16_777_216},
    }
    for attention, by_role in expected.items():
        settings = TrainingSettings(engine="fused", attention=attention)
        model = _model(graph, attention)
        for core in cores:
            for role, nbytes in by_role.items():
                index = getattr(core, role)
                saved = saved_activation_bytes(graph.ops[index], model.tables.configs[index], tensors=graph.tensors,
                                               settings=settings, execution=execution_of(settings), role=role)
                assert float(saved[0]) == nbytes, (attention, role)


def test_both_exports_price_the_same_flash_step():
    """The same model from either exporter keeps the same activations under flash, but for the one
    ALiBi tensor the TorchScript export computes from ``attention_mask`` (both layers read it: kept
    once, 8 x 4 x 512 x 2 = 32,768 bytes); the dynamo export builds it from constants. Before the
    fix the TorchScript file kept its scores under flash too: flash and explicit priced alike."""
    rows = {}
    for style in ("ts_consts", "dynamo_consts"):
        graph = _graph(style)
        zero = [0] * len(graph.ops)
        rows[style] = {a: _model(graph, a).evaluate(zero).memory.activations_bytes for a in ("flash", "explicit")}
    assert rows["ts_consts"]["flash"] - rows["dynamo_consts"]["flash"] == BATCH * HEADS * SEQ * 2
    # explicit keeps each layer's bf16 probabilities that flash does not, less flash's fp32 log-sum-exp
    scores, lse = LAYERS * BATCH * HEADS * SEQ * SEQ * 2, LAYERS * BATCH * HEADS * SEQ * 4
    assert rows["ts_consts"]["explicit"] - rows["ts_consts"]["flash"] >= scores - lse


@pytest.mark.parametrize(("name", "node"), [
    # squeeze-excitation: x * gate[b, c, 1, 1], read by the projection convolution
    ("efficientnet_ts_consts", "/efficientnet/encoder/blocks.0/squeeze_excite/Mul"),
    # BART's decoder: embeddings + positions[1, s, d], read by the embedding LayerNorm
    ("bart_ts_consts", "/model/decoder/Add_1"),
])
def test_only_a_softmax_takes_a_prologue_with_a_broadcast_operand(name, node):
    """A node with a full-size input and a smaller one that cannot join its producer stays an op of
    its own when its consumer is not a softmax (the grouping before issue 25's change)."""
    graph = load_graph(ZOO / f"{name}.onnx", {"batch": 2, "seq": 128, "tgt_seq": 64})
    owner = [op for op in graph.ops if node in op.onnx_nodes]
    assert [(op.name, op.kind) for op in owner] == [(node, "elementwise")]
