"""MoE pricing (objectives.moe): routed tokens, capacity factor, expert parallelism; memory vs a hand count."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from importers import import_model
from importers.moe import find_moe_layers
from objectives.cluster import make_cluster
from objectives.moe import expert_degrees, price_moe
from planner import families
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.plan import PlanRequest, build_model, load_graph, plan
from tests.importers.test_moe import batched_moe

DATA = Path(__file__).resolve().parents[1] / "data"
MIB = 2**20


def _request(devices: int, **settings) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), settings=TrainingSettings(**settings))


def test_memory_of_mixtral_is_within_20_percent_of_a_hand_count():
    """Mixtral-tiny at batch 16 x 512 on one device, bf16 + Adam, flash attention, fused kernels."""
    config = json.loads((DATA / "models.json").read_text())["mixtral_tiny"]
    c = config["config"]
    b, s, h, heads, kv, hd = 16, 512, c["hidden"], c["heads"], c["kv_heads"], c["head_dim"]
    layers, experts, top_k, ffn, vocab = c["layers"], c["num_local_experts"], c["num_experts_per_tok"], c["intermediate"], c["vocab"]
    n, routed, bf16, fp32 = b * s, b * s * top_k, 2, 4
    # what autograd keeps per layer (bytes): two norm inputs, the qkv input (shared by q, k, v),
    # flash attention's q, k, v, output and fp32 log-sum-exp, the router's input and probabilities,
    # and for the experts only the routed tokens: their inputs, the gate+up output (SiLU and the
    # product need both halves), the down projection's input and the weighted outputs.
    per_layer = (
        2 * n * h * bf16
        + n * h * bf16
        + (n * h + 2 * n * kv * hd + n * h) * bf16 + b * heads * s * fp32
        + n * h * bf16 + n * experts * bf16
        + routed * h * bf16 + routed * 2 * ffn * bf16 + routed * ffn * bf16 + routed * h * bf16
    )
    # final norm and LM head inputs; the logits and their fp32 gradient are live as backward starts
    head = 2 * n * h * bf16 + n * vocab * (bf16 + fp32)
    hand = config["param_count"] * 16 + layers * per_layer + head
    settings = dict(attention="flash", engine="fused")
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": b, "seq": s})
    model = build_model(graph, _request(1, **settings))
    memory = model.tables.evaluate([0] * len(graph.ops))[1]
    print(f"planner {memory / MIB:.2f} MiB, hand count {hand / MIB:.2f} MiB")
    assert abs(memory - hand) / hand < 0.20, (memory / MIB, hand / MIB)
    # the raw export (expert weights gathered per token, priced as activations) is far off the count
    from objectives.tables import build_cost_model

    raw = import_model(DATA / "mixtral_tiny.onnx", {"batch": b, "seq": s})
    raw_plain = build_cost_model(raw, cluster=model.cluster, settings=model.settings, config_options=model.config_options)
    assert raw_plain.tables.evaluate([0] * len(raw.ops))[1] > 5 * hand


def test_dense_batched_experts_are_priced_by_routed_tokens(tmp_path):
    """Every token through every expert in the export; priced as tokens x top-k / E per expert."""
    experts, top_k = 4, 2
    graph = import_model(batched_moe(tmp_path / "b.onnx", hidden=64, ffn=256, experts=experts, top_k=top_k), {"batch": 4096})
    (layer,) = find_moe_layers(graph)
    request = _request(1)
    from objectives.tables import build_cost_model
    from planner.pricing import _config_options

    plain = build_cost_model(graph, cluster=request.cluster, settings=request.settings, config_options=_config_options(request))
    priced = build_model(graph, request)
    for index in layer.expert_matmuls:
        before, after = plain.op_details[index], priced.op_details[index]
        # 4096 x 2 / 4 = 2048 rows per expert: whole 128-row tiles, one device: no imbalance; the
        # layer's token permutation is charged to its first product (moe_s["permute"])
        permute = after.moe_s.get("permute", np.zeros(1))[0]
        assert after.compute_s[0] - permute == pytest.approx(before.compute_s[0] * top_k / experts)
        assert after.memory.activations_bytes[0] == pytest.approx(before.memory.activations_bytes[0] * top_k / experts)
        # parameters are the experts' own, whatever the routing
        assert after.memory.params_bytes[0] == before.memory.params_bytes[0]
    untouched = [i for i in range(len(graph.ops)) if i not in layer.expert_ops]
    for index in untouched:
        assert priced.op_details[index].time_s[0] == plain.op_details[index].time_s[0]


def test_capacity_factor_drops_the_tokens_over_capacity():
    """--capacity-factor 1.25: each expert keeps min(load, 1.25 x mean); the expert products compute the
    kept rows only (Megatron without padding), here T = 4 x 64 = 256 tokens, k = 2, E = 4."""
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 4, "seq": 64})
    layers = find_moe_layers(graph)
    dropless = build_model(graph, _request(1))
    capped = build_model(graph, _request(1, capacity_factor=1.25))
    # load ~ B(256, 1/2): mu = 128, sigma = 8, capacity 160, z = 4: L(4) = phi(4) - 4 (1 - Phi(4))
    loss = 1.3383e-4 - 4 * 3.1671e-5
    kept = 1 - 8 * loss / 128
    # the ops between and after the products compute the kept rows; the products' padded row tiles
    # (128 rows per expert either way) hide the drop there
    others = [i for i in layers[0].expert_ops if i not in layers[0].expert_matmuls]
    assert others
    for index in others:
        assert capped.op_details[index].compute_s[0] == pytest.approx(kept * dropless.op_details[index].compute_s[0], rel=1e-6)
    assert any("dropped" in note for note in capped.notes)
    with pytest.raises(InputError, match="--capacity-factor"):
        TrainingSettings(capacity_factor=0.0)
    with pytest.raises(InputError, match="--capacity-factor"):
        price_moe(dropless, layers, capacity_factor=-1.0)


def test_expert_parallelism_divides_expert_states_and_pays_all_to_all():
    devices, ep, b, s = 8, 4, 16, 64
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": b, "seq": s})
    layers = find_moe_layers(graph)
    one = build_model(graph, _request(devices))
    split = build_model(graph, _request(devices, expert_parallel=ep))
    masks = families.data_parallel_masks(graph, one.tables.configs)
    choice = [int(np.flatnonzero(m)[0]) for m in masks]
    a, e = one.evaluate(choice), split.evaluate(choice)
    expert_params = sum(graph.tensors[p].num_elements for layer in layers for p in layer.expert_parameters)
    assert expert_params == 2 * 4 * (256 * 64 + 64 * 128)
    # bf16 weight + bf16 grad + 12 bytes of fp32 master and Adam moments, each / ep, plus the 10% allowance
    assert a.memory_bytes - e.memory_bytes == pytest.approx(expert_params * 16 * (1 - 1 / ep) * 1.10)
    # 4 all-to-alls per layer (dispatch, combine; forward and backward) of the routed tokens held by
    # one of the 8 data-parallel ranks, among ep = 4 ranks in one node: (ep - 1) chunks of B / ep
    link = one.cluster.intra_link
    # The busiest of the 4 ranks receives more than the mean T_r k = 128 x 2 rows: its load has
    # variance ep T_r k (1/ep)(1 - 1/ep)(E - k)/(E - 1) = 4 x 128 x 2 x 1/4 x 3/4 x 2/3 = 128, and the
    # largest of 4 normals is 1.0294 sigma above the mean (Tippett 1925)
    imbalance = 1 + 1.0294 * 128**0.5 / 256
    per_device = b * s * 2 * 64 * 2 / devices * imbalance
    a2a = (ep - 1) * (per_device / ep / link.collective_bandwidth_bytes_per_s + link.latency_s)
    assert e.comm_by_kind_s["all_to_all"] == pytest.approx(len(layers) * 4 * a2a, rel=1e-5)
    assert "all_to_all" not in a.comm_by_kind_s or a.comm_by_kind_s["all_to_all"] == 0
    # a configuration whose token split ep does not divide cannot run under ep
    replicated = [0] * len(graph.ops)
    assert split.tables.evaluate(replicated)[0] == float("inf")


def test_ep_degrees_and_bad_ep():
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 2, "seq": 16})
    layers = find_moe_layers(graph)
    assert expert_degrees(layers, 8) == [1, 2, 4]
    assert expert_degrees(layers, 6) == [1, 2]
    with pytest.raises(InputError, match="ep=3"):
        build_model(graph, _request(6, expert_parallel=3))


def test_plan_puts_expert_parallelism_on_the_frontier():
    # enough tokens that splitting pays: at 16 x 128 the tiny model is fastest on one device (idle
    # configurations kept beside copies), and then no ep row is on the frontier, rightly
    graph = load_graph(DATA / "mixtral_tiny.onnx", {"batch": 64, "seq": 512})
    result = plan(graph, _request(8), with_targets=False)
    degrees = {(p.settings.expert_parallel if p.settings else 1) for p in result.points}
    assert degrees - {1}, [p.summary for p in result.points]
    for point in result.points:
        ep = point.settings.expert_parallel
        assert (f"ep={ep}" in point.summary) == (ep > 1)
    # the union is one Pareto set: no listed point is dominated by another
    values = [(p.strategy.time_s, p.strategy.memory_bytes) for p in result.points]
    for t, m in values:
        assert not any(t2 <= t and m2 <= m and (t2, m2) != (t, m) for t2, m2 in values)
    # each point re-prices to its own numbers under its own ep
    for point in result.points[:3]:
        request = dataclasses.replace(result.request, settings=point.settings)
        assert build_model(graph, request).tables.evaluate(point.strategy.choice)[0] == pytest.approx(point.strategy.time_s)


def test_a_dense_model_is_one_search_without_ep():
    graph = load_graph(DATA / "llama_tiny.onnx", {"batch": 8, "seq": 16})
    result = plan(graph, _request(4), with_targets=False)
    assert all("ep=" not in p.summary for p in result.points)
    assert all(p.settings is None for p in result.points)
