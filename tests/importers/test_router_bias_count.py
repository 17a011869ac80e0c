"""Router score biases no gradient reaches: counted as torch counts them, or the difference named (issue 25, h27i).

A per-expert vector added to the router's scores before the TopK only chooses experts, so no gradient trains it.
transformers 5.24 holds DeepSeek-V3's ``e_score_correction_bias`` (and 30 other routers') as a buffer, which
``model.parameters()`` leaves out, and ERNIE-4.5-MoE's (and ERNIE-4.5-VL-MoE's, Laguna's) as
``nn.Parameter(..., requires_grad=False)``, which it counts. A dynamo export records which for an initializer it keeps
(``PARAMETER`` / ``BUFFER``); a TorchScript file, or a dynamo file whose optimizer folded the vector (ERNIE's
``e_score_correction_bias.squeeze()`` became ``squeeze``), does not. Those are left out, as a buffer is, and the
warning says by how much torch's count is higher where the model declares them parameters, naming the folded
constants' sources (ERNIE's read ``squeeze, squeeze_3`` and said nothing of torch's count before).

Files: ``tests/data/shared_first_cases`` (``make_shared_first_cases.py``'s ``qwen2moe_bias``: Qwen2-MoE with a ``[4]``
``nn.Parameter`` without gradient added before the TopK; ``cohere2moe``: a tied LM head) and
``tests/data/ernie_router_cases`` (ERNIE-4.5-MoE, dynamo). Expected counts are torch's, from each ``counts.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers import import_model

DATA = Path(__file__).resolve().parents[1] / "data"
SHARED = json.loads((DATA / "shared_first_cases" / "counts.json").read_text())
ERNIE = json.loads((DATA / "ernie_router_cases" / "counts.json").read_text())["files"]["ernie4_5_moe_dynamo_bare.onnx"]
DIMS = {"batch": 2, "seq": 16}


def _bias_warning(graph) -> str:
    (line,) = [w for w in graph.warnings if "reach the outputs only through index" in w]
    return line


@pytest.mark.parametrize("name", ["qwen2moe_bias_dynamo_bare.onnx", "qwen2moe_bias_dynamo_consts.onnx"])
def test_a_recorded_parameter_is_counted(name: str) -> None:
    graph = import_model(DATA / "shared_first_cases" / name, DIMS)
    assert graph.parameter_count == SHARED["files"][name]["param_count"] == 144_584
    assert not any("reach the outputs only through index" in w for w in graph.warnings)


def test_a_torchscript_bias_is_left_out_and_torchs_difference_named() -> None:
    name = "qwen2moe_bias_ts_bare.onnx"
    graph = import_model(DATA / "shared_first_cases" / name, DIMS)
    bias = SHARED["config"]["num_hidden_layers"] * SHARED["config"]["num_experts"]  # one [E] vector per layer: 8
    assert graph.parameter_count + bias == SHARED["files"][name]["param_count"] == 144_584
    line = _bias_warning(graph)
    assert all(f"model.model.layers.{i}.mlp.gate.score_shift" in line for i in range(2))
    assert f"nn.Parameter(requires_grad=False) (ERNIE-4.5-MoE's), the true count is {bias:,} higher" in line


def test_a_folded_bias_is_named_by_its_source() -> None:
    config = ERNIE["config"]
    moe_layers = range(config["moe_layer_start_index"], config["moe_layer_end_index"] + 1)
    bias = len(moe_layers) * config["moe_num_experts"]  # e_score_correction_bias [1, E] per MoE layer: 8
    graph = import_model(DATA / "ernie_router_cases" / "ernie4_5_moe_dynamo_bare.onnx", DIMS)
    assert graph.parameter_count + bias == ERNIE["param_count"] == 249_288
    line = _bias_warning(graph)
    assert all(f"'model.layers.{i}.mlp.gate.moe_statics.e_score_correction_bias'" in line for i in moe_layers)
    assert f"the true count is {bias:,} higher" in line


def test_a_tied_head_torchscript_copied_is_named_with_its_size() -> None:
    """Cohere2-MoE ties its LM head; the TorchScript exporter writes ``embed_tokens.weight`` transposed as
    ``onnx::MatMul_N``, and a graph-only file has no values to prove the copy (an untied head, as the plain Qwen2-MoE
    file's, looks the same): counted, and the warning names exactly what torch's count lacks."""
    name = "cohere2moe_ts_bare.onnx"
    config = SHARED["cohere_config"]
    graph = import_model(DATA / "shared_first_cases" / name, DIMS)
    head = config["vocab_size"] * config["hidden_size"]
    assert graph.parameter_count - head == SHARED["files"][name]["param_count"] == 103_104
    assert any(f"tied embedding 'model.model.embed_tokens.weight'" in w and f"({head:,} parameters)" in w
               for w in graph.warnings)
