"""DeepSpeed lists and exports ``ep > 1`` only where its AutoEP would shard the experts as planned (issue 25,
task H9; sweep H7's findings E and G). DeepSpeed 0.19.8's AutoEP finds a block by name
(``model.layers.N.mlp`` with a ``gate`` router, every preset in ``module_inject/auto_ep_presets``), so
Jamba (``feed_forward.router``) and Granite-MoE (``block_sparse_moe.router``) train with every expert on every
rank: no ``ep > 1`` row, and the export refuses it in one line. At ``ep = 1`` DeepSpeed trains the model as
exported, so Granite-MoE (its top-k-then-softmax router read since 060238c) trains at ep = 1. OLMoE and Qwen2-MoE keep
their ``ep > 1`` rows, with the preset named and the router's normalisation pinned.

Files: ``tests/data/moe_sweep_cases`` (``tests/importers/make_moe_sweep_cases.py``); the real AutoEP's
detection on the same configs: ``tests/integration/test_deepspeed_autoep_detect.py``."""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np
import pytest

from exporters import PlanInput, export
from exporters.deepspeed import deepspeed_masks
from exporters.deepspeed.autoep import autoep_preset, expert_parallel_problem, router_paths
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from exporters.deepspeed.zero_sync import zero_sync
from planner.core.settings import TrainingSettings
from planner.export import target_filter
from planner.plan import PlanRequest, build_model, load_graph, plan

ROOT = Path(__file__).resolve().parents[2]
CASES_DIR = ROOT / "tests" / "data" / "moe_sweep_cases"
sys.path.insert(0, str(ROOT / "tests" / "importers"))
from make_moe_sweep_cases import CASES  # noqa: E402  (the configs the files were built from)

DIMS = {"batch": 8, "seq": 16}  # seq 16: the files were traced at 16 tokens (Jamba's scan is unrolled)


def _graph(name: str):
    return load_graph(CASES_DIR / f"{name}_ts_bare.onnx", DIMS)


def _config(name: str) -> dict:
    return CASES[name][2]


def test_router_paths_are_read_from_the_node_names():
    # Jamba: expert_layer_offset 1, period 2 of 2 layers -> one MoE layer, layer 1
    assert router_paths(_graph("jamba")) == ["model.layers.1.feed_forward.router"]
    assert router_paths(_graph("granitemoe")) == [f"model.layers.{i}.block_sparse_moe.router" for i in range(2)]
    assert router_paths(_graph("olmoe")) == [f"model.layers.{i}.mlp.gate" for i in range(2)]


@pytest.mark.parametrize("name, router", [("jamba", "model.layers.1.feed_forward.router"),
                                          ("granitemoe", "model.layers.0.block_sparse_moe.router")])
def test_blocks_autoep_does_not_find_refuse_ep(name, router):
    problem = expert_parallel_problem(_graph(name))
    assert problem is not None and "\n" not in problem
    assert router in problem and "plan ep=1" in problem


def test_blocks_autoep_finds_keep_ep_with_their_preset():
    # OLMoE: no shared expert -> mixtral; Qwen2-MoE: shared_expert + shared_expert_gate -> qwen3_moe
    olmoe, qwen = _graph("olmoe"), _graph("qwen2moe")
    assert expert_parallel_problem(olmoe) is None and autoep_preset(olmoe) == "mixtral"
    assert expert_parallel_problem(qwen) is None and autoep_preset(qwen) == "qwen3_moe"
    mixtral = load_graph(ROOT / "tests" / "data" / "mixtral_tiny.onnx", DIMS)
    assert expert_parallel_problem(mixtral) is None and autoep_preset(mixtral) == "mixtral"


def _deepspeed_plan(name: str):
    return plan(_graph(name), PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=TrainingSettings()),
                target_filter=target_filter("deepspeed"))


@pytest.mark.slow
@pytest.mark.parametrize("name, ep_rows", [("jamba", False), ("granitemoe", False), ("olmoe", True)])
def test_deepspeed_rows(name, ep_rows):
    points = [p for p in _deepspeed_plan(name).points if "deepspeed" in p.targets]
    # every file has ep = 1 rows (Granite-MoE had none: its unread router refused the whole model)
    assert any(p.settings.expert_parallel == 1 for p in points)
    assert any(p.settings.expert_parallel > 1 for p in points) == ep_rows


def _export(name: str, ep: int):
    """The DeepSpeed export of the dp=4 layout of ``name`` planned with experts split ``ep`` ways."""
    graph = _graph(name)
    # priced as DeepSpeed runs ZeRO-0 (its all-reduce after the backward): the export refuses a plan priced otherwise
    settings = TrainingSettings(expert_parallel=ep, zero_sync=zero_sync(zero_stage=0, precision="bf16-mixed"))
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=settings)
    model = build_model(graph, request)
    masks = deepspeed_masks(graph, model.tables.configs, dp=4, tp=1)
    strategy = model.strategy([int(np.flatnonzero(m)[0]) for m in masks])
    return export("deepspeed", PlanInput(graph=graph, cluster=request.cluster, settings=settings,
                                         spaces=model.tables.configs, strategy=strategy))


def test_export_refuses_ep_for_jamba_and_runs_it_at_ep1():
    with pytest.raises(UnsupportedExport, match=r"model\.layers\.1\.feed_forward\.router"):
        _export("jamba", 2)
    out = _export("jamba", 1)
    assert "expert_parallel" not in out["ds_config"]
    # JambaTopKRouter keeps the raw top-2 softmax probabilities; deepspeed.moe.layer.MoE's top2gating
    # divides them by their sum, so no MoE(...) layer is suggested
    assert out["moe"] is None
    assert any("as exported" in note for note in out["notes"])


def test_export_runs_granitemoe_at_ep1():
    out = _export("granitemoe", 1)
    assert out["degrees"]["dp"] == 4 and "expert_parallel" not in out["ds_config"]


@pytest.mark.parametrize("name, preset", [("olmoe", "mixtral"), ("qwen2moe", "qwen3_moe")])
def test_export_pins_preset_and_routing(name, preset):
    out = _export(name, 2)
    config = _config(name)
    # both configs leave norm_topk_prob at transformers' default, False: the top-2 are not renormalised
    assert out["ds_config"]["expert_parallel"] == {
        "enabled": True, "autoep_size": 2, "top_k": config["num_experts_per_tok"], "score_func": "softmax",
        "route_norm": False, "preset_model": preset}
    assert out["moe"] is None
    assert any("route_norm" in note for note in out["notes"])


def test_a_shared_expert_computed_before_the_router_is_not_dropped():
    # ERNIE-4.5-MoE (tests/data/ernie_router_cases, moe_num_shared_experts 1) runs mlp.shared_experts before
    # mlp.gate, outside the routed layer's span: read as no shared expert, ep > 1 was exported as AutoEP's mixtral
    # preset, whose replacement block has no shared expert (auto_ep_presets/mixtral.py); its shared experts are
    # named shared_experts, which neither softmax preset the export names keeps, so ep > 1 is refused
    graph = load_graph(ROOT / "tests" / "data" / "ernie_router_cases" / "ernie4_5_moe_dynamo_bare.onnx", DIMS)
    assert autoep_preset(graph) is None
    problem = expert_parallel_problem(graph)
    assert problem is not None and "model.layers.1.mlp.shared_experts." in problem and "plan ep=1" in problem
