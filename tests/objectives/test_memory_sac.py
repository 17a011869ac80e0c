"""Op-level selective activation checkpointing (``recompute="op"``, torchtitan's
``selective_ac_option = "op"``): which outputs a block keeps, counted by hand from the tiny Llama's
shapes (tests/data/llama_tiny.onnx: 2 layers, hidden 64, 8 heads of 8, 4 KV heads, FFN 128),
never from the code under test."""

from __future__ import annotations

import pytest

from importers import import_model
from objectives.cluster import make_cluster
from objectives.graph_facts import _graph_facts, _sac_saved
from objectives.memory import op_sac_saved
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings

BATCH, SEQ, HIDDEN, HEADS, KV_DIM, FFN = 2, 16, 64, 8, 32, 128
TOKENS = BATCH * SEQ
BF16, LSE = 2, 4  # bytes: the training precision's activations, flash attention's fp32 log-sum-exp


@pytest.fixture(scope="module")
def graph():
    return import_model("tests/data/llama_tiny.onnx", {"batch": BATCH, "seq": SEQ})


def _activations(graph, recompute: str) -> list[float]:
    settings = TrainingSettings(engine="fused", attention="flash", recompute=recompute)  # type: ignore[arg-type]
    model = build_cost_model(graph, cluster=make_cluster("h100-sxm", devices=1), settings=settings,
                             config_options=ConfigOptions(devices=1, devices_per_node=1), price_edges=False)
    return [float(d.memory.activations_bytes[0]) for d in model.op_details]


def test_every_other_linear_and_the_attention_kernel_are_saved(graph):
    block = graph.blocks[0].instances[1]
    names = {graph.ops[i].name: flag for i, flag in zip(block, (_sac_saved(graph, _graph_facts(graph))[i] for i in block))}
    # torchtitan's policy: the 1st, 3rd, 5th and 7th mm of the block (wq, wv, w1, w2) and SDPA
    saved = sorted(n for n, flag in names.items() if flag)
    assert saved == sorted(["node_linear_7", "node_linear_9", "node_MatMul_417", "node_Softmax_419",
                            "node_scaled_dot_product_attention_1", "node_linear_11", "node_linear_13"])


def test_a_recomputed_layer_keeps_its_input_and_the_saved_outputs(graph):
    block = graph.blocks[0].instances[1]  # not the first layer (the re-run working set)
    kept = sum(_activations(graph, "op")[i] for i in block)
    # block input (h) + wq out (h) + wv out (kv) + attention out (h) + w1 out (ffn) + w2 out (h), bf16,
    # and one fp32 log-sum-exp per head and token
    per_token = (HIDDEN + HIDDEN + KV_DIM + HIDDEN + FFN + HIDDEN) * BF16 + HEADS * LSE
    assert kept == pytest.approx(TOKENS * per_token)  # 32 x 864 = 27,648 bytes


def test_op_mode_sits_between_full_and_none(graph):
    block = graph.blocks[0].instances[1]
    full, op, none = (sum(_activations(graph, r)[i] for i in block) for r in ("full", "op", "none"))
    assert full == pytest.approx(TOKENS * HIDDEN * BF16)  # the checkpoint only
    assert full < op < none


def test_the_rule_on_its_own():
    # a block of wq, wk, wv, the attention core's two products, wo, w1, w3, w2; a norm first
    linear = [False, True, True, True, False, False, True, True, True, True]
    roles = [None, None, None, None, "score", "value", None, None, None, None]
    assert op_sac_saved(linear, roles) == [False, True, False, True, True, True, False, True, False, True]


def test_unknown_mode_is_refused():
    with pytest.raises(InputError, match="none, selective, mlp, full or op"):
        TrainingSettings(recompute="layer")  # type: ignore[arg-type]
