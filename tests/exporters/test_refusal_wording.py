"""Launcher refusals say what the graph has (issue 25, task H7: a new-user sweep's finding 7, items a, b, c, i, j).

* OLMo-2 normalises the outputs of its sub-layers only (``x + norm(f(x))``): torchtitan said "sandwich norms".
* Gemma-2 soft-caps its logits (``cap * tanh(x / cap)``) and scales its embedding: both launchers said the logits
  were scaled by a factor. The file's last four nodes are the LM head's MatMul, then Div, Tanh, Mul.
* OLMoE's 9 norms are Megatron-LM's count with --qk-layernorm (2 L + 1 + 2 L at L = 2): the file's norm weights
  are named q_norm, k_norm, input_layernorm and post_attention_layernorm per layer, and model.norm. Its refusal is
  the whole-projection QK-norm, said once; neither launcher adds a norm-count clause.
* A settings refusal of a model the launcher does not train at all gives the model's reason, not advice to plan
  with ``--target`` that would refuse it (Nemotron under torchtitan).
* A hybrid Mamba stack with rotary embeddings names the channels and base its frequencies read.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import numpy_helper

from exporters import export
from exporters.megatron.families import family_refusals as megatron_refusals
from exporters.megatron.mamba import hybrid_refusals
from exporters.torchtitan.families import torchtitan_arch
from importers.hybrid import analyze_hybrid
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
EXPORTERS = ROOT / "tests" / "exporters" / "data"
DIMS = {"batch": 2, "seq": 16}


def _torchtitan_reason(graph) -> str:
    with pytest.raises(UnsupportedExport) as refused:
        torchtitan_arch(graph)
    return refused.value.reason


def test_olmo2_reordered_norm_is_not_called_sandwich():
    graph = load_graph(EXPORTERS / "olmo2_tiny.onnx", DIMS)
    reason = _torchtitan_reason(graph)
    assert ("it normalises the outputs of attention and the MLP and not their inputs (x + norm(f(x)), OLMo-2's "
            "reordered norm), the family's layers normalise the inputs (pre-norm)") in reason
    assert "sandwich" not in reason


def test_gemma2_logits_are_capped_not_scaled():
    path = EXPORTERS / "gemma2_tiny.onnx"
    nodes = onnx.load(str(path), load_external_data=False).graph.node
    assert [n.op_type for n in nodes[-4:]] == ["MatMul", "Div", "Tanh", "Mul"]  # the LM head, then cap * tanh(x / cap)
    graph = load_graph(path, DIMS)
    reason = _torchtitan_reason(graph)
    assert ("it soft-caps its attention scores and its final logits (cap * tanh(x / cap), Gemma-2), the family has no "
            "soft-cap") in reason
    assert "it scales the embedding by a factor (Granite's multipliers, Gemma's embedding normaliser)" in reason
    assert "the logits by a factor" not in reason
    assert ("it normalises the output of attention and the MLP before the residual add (sandwich norms, Gemma-2 and -3)"
            in reason)
    clauses = megatron_refusals(analyze_transformer(graph), "gpt", graph)
    assert any(c.startswith("it scales the embedding by a factor") for c in clauses)
    assert any("soft-caps the final logits" in c for c in clauses)


def test_olmoe_norm_count_follows_from_its_qk_norm():
    path = ROOT / "tests" / "data" / "moe_sweep_cases" / "olmoe_ts_bare.onnx"
    norms = [i.name for i in onnx.load(str(path), load_external_data=False).graph.initializer if "norm" in i.name]
    layers = 2
    assert len(norms) == 2 * layers + 1 + 2 * layers == 9  # Megatron-LM's GPT with --qk-layernorm has as many
    graph = load_graph(path, DIMS)
    plan = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))
    with pytest.raises(UnsupportedExport) as refused:
        export("megatron", plan)
    reason = refused.value.reason
    assert "normalises its queries and keys over the whole projection" in reason
    assert "norms where" not in reason
    assert "norms where" not in _torchtitan_reason(graph)


def test_a_model_torchtitan_does_not_train_is_refused_for_that_first():
    graph = load_graph(ROOT / "tests" / "data" / "param_cases" / "nemotron_ts_bare.onnx", DIMS)
    plan = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))
    saved = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, sequence_shard_saved=True))
    with pytest.raises(UnsupportedExport) as refused:
        export("torchtitan", saved)
    reason = refused.value.reason
    assert reason.startswith("torchtitan's llama3 family would train a different model: it normalises with LayerNorm")
    assert "--target torchtitan" not in reason
    # a model torchtitan trains keeps the settings' reason and its advice
    llama = load_graph(ROOT / "tests" / "data" / "llama_tiny.onnx", DIMS)
    plan = make_input(llama, spaces_for(llama, 1), [0] * len(llama.ops))
    saved = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, sequence_shard_saved=True))
    with pytest.raises(UnsupportedExport, match="keeps the gathered sequence-parallel input.*plan with --target torchtitan"):
        export("torchtitan", saved)


def test_picking_a_row_names_no_target_that_would_refuse():
    """``--pick N --export torchtitan`` of a model torchtitan does not train (the frontier's ``refused``, its
    "not listed" line) ends at the model's reason, with no "`--target torchtitan` lists the plans it runs"."""
    from planner.launchable import LaunchFrontier, Row, export_row

    graph = load_graph(ROOT / "tests" / "data" / "param_cases" / "nemotron_ts_bare.onnx", DIMS)
    plan = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))
    saved = dataclasses.replace(plan, settings=dataclasses.replace(plan.settings, sequence_shard_saved=True))
    row = Row(point=None, cache=None, degrees=None, targets=("megatron",), plan_input=saved)
    frontier = LaunchFrontier(cluster=saved.cluster, rows=(row,), chosen=0, memory_limit_bytes=1e12, global_batch=2,
                              launchers=("megatron",), refused=(("torchtitan", "torchtitan's llama3 family ..."),))
    with pytest.raises(UnsupportedExport) as refused:
        export_row(frontier, 0, "torchtitan")
    # the row is Megatron-LM's: said first (sweep H4, finding 7e), then the model's reason
    assert refused.value.reason.startswith("the table lists row 1 for megatron, not torchtitan: torchtitan's llama3 "
                                           "family would train a different model")
    assert not refused.value.nearest_summary
    listed = dataclasses.replace(frontier, refused=())  # a launcher that trains the model keeps the hint
    with pytest.raises(UnsupportedExport) as refused:
        export_row(listed, 0, "torchtitan")
    assert "--target torchtitan" in refused.value.nearest_summary


def test_a_rotary_hybrid_names_what_its_frequencies_read(tmp_path):
    source = EXPORTERS / "nemotron_h_tiny_ts_consts.onnx"
    model = onnx.load(str(source), load_external_data=False)
    stack = analyze_hybrid(load_graph(source, DIMS))
    pairs = stack.kv_channels // 4  # a quarter of each head's channel pairs: half its channels rotate
    inv_freq = (10000.0 ** (-np.arange(0, 2 * pairs, 2) / (2 * pairs))).astype(np.float32)
    model.graph.initializer.append(numpy_helper.from_array(inv_freq, "rotary_emb.inv_freq"))
    path = tmp_path / "rotary_hybrid.onnx"
    onnx.save(model, str(path))
    graph = load_graph(path, DIMS)
    (clause,) = hybrid_refusals(dataclasses.replace(analyze_hybrid(graph), rotary=True), graph)
    # since 1a5e1a5 (h28f) the hybrid export reads rotary per attention layer: this stack's one attention layer
    # rotates neither queries nor keys (the table is added, not applied), so the clause names that layer, not the
    # frequencies, and says what MambaModel builds
    assert "of its 1 attention layers (counting from 0) 0 neither its queries nor its keys rotate(s)" in clause
    assert "MambaModel hands one RotaryEmbedding to every attention layer (queries and keys) or to none" in clause
    assert "--position-embedding-type rope or none" in clause
