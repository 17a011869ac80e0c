"""MoE launch flags: Megatron-LM (--num-experts, --moe-router-topk, --expert-model-parallel-size) and
DeepSpeed-MoE (ep_size, num_experts, k), consistent with the planned point; none for a dense model."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from importers.transformer import MoeSummary, moe_summary
from exporters.deepspeed import deepspeed_moe
from exporters.megatron import megatron_moe_args
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.export import export_point, target_filter
from planner.plan import PlanRequest, load_graph, plan

DATA = Path(__file__).resolve().parents[1] / "data"
CONFIG = json.loads((DATA / "models.json").read_text())["mixtral_tiny"]["config"]


@pytest.fixture(scope="module")
def mixtral_plan():
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 8, "seq": 32})
    # what `plan --target deepspeed` searches: the strategies DeepSpeed runs, at every ep
    return plan(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=TrainingSettings()),
                target_filter=target_filter("deepspeed"))


def test_moe_summary_reads_the_routing_of_the_config():
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 2, "seq": 16})
    assert moe_summary(graph) == MoeSummary(layers=CONFIG["layers"], num_experts=CONFIG["num_local_experts"],
                                            top_k=CONFIG["num_experts_per_tok"])
    assert moe_summary(load_graph(DATA / "llama_tiny.onnx", {"batch": 2, "seq": 16})) is None


def test_megatron_flags_parse_and_match_the_degrees():
    moe = MoeSummary(layers=2, num_experts=8, top_k=2)
    parsed = parse_megatron_args(megatron_moe_args(moe, ep=4, dp=8, capacity_factor=1.25))
    assert parsed["num-experts"] == 8 and parsed["moe-router-topk"] == 2
    assert parsed["expert-model-parallel-size"] == 4
    assert parsed["moe-token-dispatcher-type"] == "alltoall"
    assert parsed["moe-expert-capacity-factor"] == "1.25"
    # dropless (capacity factor 1) sets no capacity; ep = 1 needs no all-to-all dispatcher
    plain = parse_megatron_args(megatron_moe_args(moe, ep=1, dp=8))
    assert plain["expert-model-parallel-size"] == 1
    assert "moe-expert-capacity-factor" not in plain and "moe-token-dispatcher-type" not in plain
    assert megatron_moe_args(None, ep=1) == []
    with pytest.raises(UnsupportedExport, match="divide"):
        megatron_moe_args(moe, ep=3, dp=6)
    with pytest.raises(UnsupportedExport, match="data-parallel"):
        megatron_moe_args(moe, ep=4, dp=2)
    with pytest.raises(UnsupportedExport, match="no routed experts"):
        megatron_moe_args(None, ep=2)


def test_deepspeed_export_of_an_ep_point_carries_its_degree():
    import numpy as np

    from exporters import PlanInput, export
    from exporters.deepspeed import deepspeed_masks
    from planner.plan import build_model

    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 16, "seq": 64})
    from exporters.deepspeed.zero_sync import zero_sync

    ep = 2
    # priced as DeepSpeed runs ZeRO-0 (its all-reduce after the backward): the export refuses a plan priced otherwise
    settings = TrainingSettings(expert_parallel=ep, zero_sync=zero_sync(zero_stage=0, precision="bf16-mixed"))
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=settings)
    model = build_model(graph, request)
    # DeepSpeed's dp=4 layout, priced with experts split ep ways
    masks = deepspeed_masks(graph, model.tables.configs, dp=4, tp=1)
    strategy = model.strategy([int(np.flatnonzero(m)[0]) for m in masks])
    assert np.isfinite(strategy.time_s)
    plan_out = export("deepspeed", PlanInput(graph=graph, cluster=request.cluster, settings=settings,
                                             spaces=model.tables.configs, strategy=strategy))
    dp = plan_out["degrees"]["dp"]
    # score_func and route_norm pinned to Mixtral's router (softmax, top-k renormalised), its AutoEP preset named
    assert plan_out["ds_config"]["expert_parallel"] == {"enabled": True, "autoep_size": ep, "top_k": CONFIG["num_experts_per_tok"],
                                                       "score_func": "softmax", "route_norm": True,
                                                       "preset_model": "mixtral"}
    assert plan_out["moe"] == {"num_experts": CONFIG["num_local_experts"], "ep_size": ep, "k": CONFIG["num_experts_per_tok"],
                               "capacity_factor": 1.0, "drop_tokens": False}
    assert dp % ep == 0 and CONFIG["num_local_experts"] % ep == 0


def test_deepspeed_ep1_point_and_dense_model_emit_no_expert_parallel_section(mixtral_plan):
    index = next(i for i, p in enumerate(mixtral_plan.points) if p.settings.expert_parallel == 1 and "deepspeed" in p.targets)
    out = export_point(mixtral_plan, index, "deepspeed")
    assert "expert_parallel" not in out["ds_config"] and out["moe"]["ep_size"] == 1
    dense = plan(load_graph(DATA / "llama_tiny.onnx", {"batch": 8, "seq": 16}),
                 PlanRequest(cluster=make_cluster("a100-80gb", devices=4)), target_filter=target_filter("deepspeed"))
    row = next(i for i, p in enumerate(dense.points) if "deepspeed" in p.targets)
    out = export_point(dense, row, "deepspeed")
    assert "expert_parallel" not in out["ds_config"] and out["moe"] is None
    assert deepspeed_moe(None, ep=1, dp=4) is None


def test_megatron_export_of_a_dense_model_has_no_moe_flags():
    dense = plan(load_graph(DATA / "llama_tiny.onnx", {"batch": 8, "seq": 16}),
                 PlanRequest(cluster=make_cluster("a100-80gb", devices=4)), target_filter=target_filter("megatron"))
    row = next(i for i, p in enumerate(dense.points) if "megatron" in p.targets)
    args = export_point(dense, row, "megatron")["args"]
    assert not any(a.startswith("--moe") or a in ("--num-experts", "--expert-model-parallel-size") for a in args)


def test_deepspeed_config_is_accepted_by_deepspeed():
    deepspeed_config = pytest.importorskip("deepspeed.runtime.config")
    section = deepspeed_moe(MoeSummary(layers=2, num_experts=8, top_k=2), ep=4, dp=8)["ds_config"]
    config = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 8, **section}
    parsed = deepspeed_config.DeepSpeedConfig(config)
    assert parsed.train_batch_size == 8


@pytest.mark.parametrize("target", ["meshtf", "dtensor"])
def test_targets_without_expert_parallelism_refuse_an_ep_point(target):
    import numpy as np

    from exporters import PlanInput, export
    from planner import families
    from planner.plan import build_model

    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 16, "seq": 64})
    for ep, refused in ((2, True), (1, False)):
        settings = TrainingSettings(expert_parallel=ep)
        request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4), settings=settings)
        model = build_model(graph, request)
        masks = families.data_parallel_masks(graph, model.tables.configs)
        strategy = model.strategy([int(np.flatnonzero(m)[0]) for m in masks])
        plan_input = PlanInput(graph=graph, cluster=request.cluster, settings=settings, spaces=model.tables.configs,
                               strategy=strategy)
        if refused:
            with pytest.raises(UnsupportedExport, match="ep=2"):
                export(target, plan_input)
        else:
            try:
                export(target, plan_input)
            except UnsupportedExport as refusal:
                assert "ep=" not in str(refusal)


def test_megatron_export_of_planned_points_carries_each_points_ep():
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 16, "seq": 64})
    result = plan(graph, PlanRequest(cluster=make_cluster("a100-80gb", devices=8)), target_filter=target_filter("megatron"))
    exported = 0
    for index, point in enumerate(result.points):
        if "megatron" not in point.targets:
            continue
        out = export_point(result, index, "megatron")
        parsed = parse_megatron_args(out["args"])
        ep = point.settings.expert_parallel
        assert parsed["expert-model-parallel-size"] == ep
        assert parsed["num-experts"] == CONFIG["num_local_experts"] and parsed["moe-router-topk"] == CONFIG["num_experts_per_tok"]
        assert out["degrees"]["dp"] % ep == 0
        assert ("moe-token-dispatcher-type" in parsed) == (ep > 1)
        exported += 1
    assert exported >= 2 and any(p.settings.expert_parallel > 1 for p in result.points if "megatron" in p.targets)
