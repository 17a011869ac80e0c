"""Issue 25, round 4 of unseen architectures: where the QK-norm sits relative to the rotary embedding (h29j).

transformers 5.24's ``HunYuanMoEV1Attention.forward`` rotates the queries and keys (``apply_rotary_pos_emb``) and then
applies ``query_layernorm`` / ``key_layernorm``; ``Qwen3Attention.forward`` normalises (``q_norm`` / ``k_norm``) and
then rotates. megatron-core 0.16.1 applies ``q_layernorm`` / ``k_layernorm`` in ``get_query_key_value_tensors``
(``transformer/attention.py:1478-1481``) before ``forward`` rotates (line 1097), and torchtitan 0.3.0's
``GQAttention.forward`` calls ``q_norm`` / ``k_norm`` before ``self.rope`` (``models/common/attention.py:989-993``):
both are Qwen3's order. A per-head RMSNorm does not commute with the rotation of channel pairs unless its weights are
equal within each pair (checked below with numpy), so HunYuan exported with ``--qk-layernorm`` (or as torchtitan's
qwen3) trains another model: both exports now refuse it, naming the layers and the order.

Fixtures: ``tests/data/hunyuan_cases`` (``bench/unseen_archs.py --fixture hunyuan_v1_moe tests/data/hunyuan_cases``:
dynamo, graph-only; 2 layers,
hidden 64, 4 heads of 16 channels, 2 KV heads, top-2 of 4 experts plus a shared MLP) and
``tests/exporters/data/qwen3_tiny.onnx`` (TorchScript, ``tests/integration/make_qk_norm_fixtures.py``).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest

from exporters.megatron.families import family_refusals, megatron_family
from exporters.torchtitan.families import family_refusals as torchtitan_refusals
from importers.rotary import qk_norm_places, rotated_layers
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import llama_graph

ROOT = Path(__file__).resolve().parents[1]
HUNYUAN = ROOT / "data" / "hunyuan_cases" / "hunyuan_v1_moe_dynamo_bare.onnx"
RECORD = json.loads((HUNYUAN.parent / "counts.json").read_text())["files"][HUNYUAN.name]
QWEN3 = ROOT / "exporters" / "data" / "qwen3_tiny.onnx"
LAYER_CLAUSE = "in layers 0, 1 (counting from 0) it normalises its queries and keys after the rotary embedding"


@pytest.fixture(scope="module")
def hunyuan():
    graph = load_graph(HUNYUAN, {"batch": 2, "seq": 16})
    return graph, analyze_transformer(graph)


@pytest.fixture(scope="module")
def qwen3():
    graph = load_graph(QWEN3, {"batch": 4, "seq": 16})
    return graph, analyze_transformer(graph)


def test_hunyuan_reads_norm_after_rotary(hunyuan):
    graph, model = hunyuan
    layers = RECORD["config"]["num_hidden_layers"]
    assert model.features.qk_norm == "per-head" and not model.irregular
    assert rotated_layers(graph, model.attention) == ("both",) * layers
    assert qk_norm_places(graph, model.attention) == ("after-rotary",) * layers


def test_qwen3_reads_norm_before_rotary(qwen3):
    graph, model = qwen3
    assert model.features.qk_norm == "per-head"
    assert qk_norm_places(graph, model.attention) == ("before-rotary",) * model.num_layers


def test_no_qk_norm_reads_none():
    graph = llama_graph()
    model = analyze_transformer(graph)
    assert qk_norm_places(graph, model.attention) == ("none",) * model.num_layers


def test_megatron_refuses_hunyuan_naming_layers_and_order(hunyuan):
    graph, model = hunyuan
    clauses = [c for c in family_refusals(model, "gpt", graph) if "rotary embedding" in c]
    assert clauses == [LAYER_CLAUSE + " (RoPE, then QK-norm, as HunYuan-V1) and Megatron-LM's --qk-layernorm "
                       "normalises them before rotating (QK-norm, then RoPE)"]
    with pytest.raises(UnsupportedExport) as refused:
        megatron_family(graph, model)
    message = str(refused.value)
    assert "\n" not in message and LAYER_CLAUSE in message


def test_megatron_accepts_qwen3_order(qwen3):
    graph, model = qwen3
    assert megatron_family(graph, model).family == "gpt"
    assert not [c for c in family_refusals(model, "gpt", graph) if "rotary embedding" in c]


def test_torchtitan_qwen3_family_refuses_only_the_late_norm(hunyuan, qwen3):
    assert [c for c in torchtitan_refusals(hunyuan[1], "qwen3", hunyuan[0]) if LAYER_CLAUSE in c]
    assert not [c for c in torchtitan_refusals(qwen3[1], "qwen3", qwen3[0]) if "rotary embedding" in c]


def _rms_norm(x: np.ndarray, weight: np.ndarray) -> np.ndarray:
    return x / np.sqrt(np.mean(x * x, axis=-1, keepdims=True) + 1e-6) * weight


def _rotate(x: np.ndarray, angles: np.ndarray) -> np.ndarray:
    """rotate_half's rotary embedding (channel i paired with i + d/2) by ``angles`` (d/2 values)."""
    half = x.shape[-1] // 2
    cos, sin = np.cos(np.concatenate([angles, angles])), np.sin(np.concatenate([angles, angles]))
    return x * cos + np.concatenate([-x[..., half:], x[..., :half]], axis=-1) * sin


def test_the_two_orders_differ_unless_paired_weights_are_equal():
    rng = np.random.default_rng(0)
    x, angles = rng.normal(size=(3, 16)), rng.uniform(0, np.pi, size=8)
    weight = rng.normal(size=16)
    assert not np.allclose(_rms_norm(_rotate(x, angles), weight), _rotate(_rms_norm(x, weight), angles))
    paired = np.concatenate([weight[:8], weight[:8]])  # rotations keep the RMS: equal weights per pair commute
    np.testing.assert_allclose(_rms_norm(_rotate(x, angles), paired), _rotate(_rms_norm(x, paired), angles))
