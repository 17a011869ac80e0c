"""``importers.moe_router``: what a routed-experts layer's router does beyond its TopKs, read from the graph
(issue 25). The files are transformers' ``DeepseekV3ForCausalLM`` (``tests/data/moe_cases``, configs in its
``counts.json``; ``tests/data/megatron_moe``) and Mixtral / Qwen3-MoE; every expected value is the config's."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from importers.moe import find_moe_layers
from importers.moe_router import RouterReading, router_reading
from planner.pricing import load_graph

ROOT = Path(__file__).resolve().parents[2]
MOE_CASES = ROOT / "tests" / "data" / "moe_cases"
CONFIGS = json.loads((MOE_CASES / "counts.json").read_text())["configs"]
DIMS = {"batch": 2, "seq": 16}


def _readings(path: Path, **changes) -> set[RouterReading]:
    graph = load_graph(path, DIMS)
    graph = dataclasses.replace(graph, **changes) if changes else graph
    return {router_reading(graph, layer) for layer in find_moe_layers(graph)}


@pytest.mark.parametrize("name", ["deepseek_v3_ts_consts.onnx", "deepseek_v3_ts_bare.onnx",
                                  "deepseek_v3_dynamo_consts.onnx", "deepseek_v3_wide_dynamo_consts.onnx"])
def test_deepseek_v3s_router_is_read_as_configured(name):
    config = CONFIGS[json.loads((MOE_CASES / "counts.json").read_text())["files"][name]["case"]]
    # both MoE layers route alike: one reading
    assert _readings(MOE_CASES / name) == {RouterReading(
        score_function="sigmoid", num_experts=config["n_routed_experts"], top_k=config["num_experts_per_tok"],
        groups=config["n_group"], topk_groups=config["topk_group"],
        group_score_k=2,  # transformers' DeepseekV3TopkRouter: .topk(2, dim=-1)[0].sum(dim=-1)
        expert_bias=True, weights_unbiased=True, scaling=config["routed_scaling_factor"])}


def test_a_stripped_scaling_factor_is_not_read():
    # the dynamo exporter keeps 2.5 as a one-element initializer: external (its data gone) in a bare file;
    # the TorchScript exporter's bare file keeps it as a Constant node (read above)
    (reading,) = _readings(MOE_CASES / "deepseek_v3_dynamo_bare.onnx")
    assert reading.scaling is None and reading.expert_bias and reading.group_score_k == 2


def test_without_its_file_a_multiplied_weight_is_not_read():
    # the coarse op after the choice holds a Mul: its constant is only in the file
    (reading,) = _readings(MOE_CASES / "deepseek_v3_ts_consts.onnx", source_path="")
    assert reading.scaling is None


@pytest.mark.parametrize("path", [ROOT / "tests" / "data" / "mixtral_tiny.onnx",
                                  ROOT / "tests" / "exporters" / "data" / "qwen3_moe_tiny.onnx"])
def test_a_softmax_top_k_router_has_no_groups_bias_or_scale(path):
    (reading,) = _readings(path)
    assert reading.score_function == "softmax" and (reading.groups, reading.group_score_k) == (1, None)
    assert not reading.expert_bias and reading.weights_unbiased and reading.scaling == 1.0


def test_a_bias_the_importer_folded_into_the_choice_is_read():
    # ERNIE-4.5-MoE (bench/unseen_archs.py --fixture ernie4_5_moe tests/data/ernie_router_cases):
    # topk(softmax(logits) + e_score_correction_bias),
    # the Add folded into the TopK's op; before, the bias went unread and Megatron-LM got a plain softmax router
    from exporters.megatron.moe import megatron_router_args
    from planner.core.errors import UnsupportedExport

    cases = ROOT / "tests" / "data" / "ernie_router_cases"
    config = json.loads((cases / "counts.json").read_text())["files"]["ernie4_5_moe_dynamo_bare.onnx"]["config"]
    graph = load_graph(cases / "ernie4_5_moe_dynamo_bare.onnx", DIMS)
    layers = find_moe_layers(graph)
    # moe_layer_start_index 1 to moe_layer_end_index 2 of 3 layers route
    assert len(layers) == config["moe_layer_end_index"] - config["moe_layer_start_index"] + 1 == 2
    for layer in layers:
        reading = router_reading(graph, layer)
        assert (reading.score_function, reading.num_experts, reading.top_k, reading.expert_bias) == (
            "softmax", config["moe_num_experts"], config["moe_k"], True)
        with pytest.raises(UnsupportedExport, match="softmax router adds a score bias"):
            megatron_router_args(reading, renormalized=True)
