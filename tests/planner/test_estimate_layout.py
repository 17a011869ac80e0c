"""A Megatron layout priced by `estimate` moves no data Megatron never moves (issue 14, defects 1 and 3).

Megatron-LM keeps norms and residual adds replicated on every tensor-parallel rank, splits the fused
QKV per head on each rank, and pads GPT-2's 50,257-row vocabulary so the LM head is column-parallel:
between its ops no tensor is re-laid out, so the cost model must price 0 s of redistribution.
"""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from planner.estimate import estimate
from planner.pipeline import PipelineCostCache, graph_loader


@pytest.fixture(scope="module")
def priced():
    cluster = make_cluster("a100-80gb", devices=16, devices_per_node=8)  # 2 nodes: dp crosses them
    at = graph_loader("examples/gpt2.onnx", {"seq": 128})
    result = estimate(at, cluster=cluster, tp=4, pp=1, micro_batch=1, global_batch=8)
    cache = PipelineCostCache(at, cluster=cluster, settings=None, cost_model="roofline")
    model = cache.model(16, 4, 0, "none")
    return result, model, model.evaluate(np.array(result.point.choice))


def test_no_redistribution_between_megatron_ops(priced):
    result, _, evaluation = priced
    assert result.valid
    assert evaluation.time.redistribution_s == 0.0
    assert evaluation.comm_by_kind_s["redistribution"] == 0.0


def test_lm_head_is_split_over_tp_by_padding(priced):
    _, model, evaluation = priced
    graph = model.graph
    head = max((row for row in evaluation.ops if row.kind == "matmul"), key=lambda row: graph.ops[row.index].flops)
    vocab = [d for d in graph.ops[head.index].dims if d.size == 50257]
    assert vocab, "the LM head has the 50,257-row vocabulary dim"
    assert head.splits.get(vocab[0].name) == 4


def test_norms_run_on_every_rank(priced):
    _, model, evaluation = priced
    norms = [row for row in evaluation.ops if row.kind == "norm"]
    assert norms
    # dp=4 x tp=4: each norm splits its batch 4 ways and runs as 4 copies, on all 16 ranks
    for row in norms:
        assert row.devices == 16
        assert int(np.prod(list(row.splits.values()) or [1])) == 4


@pytest.mark.parametrize("dp", [3, 9, 15])
def test_a_data_parallel_size_that_is_no_power_of_two(dp):
    """tp=4 x dp on nodes of 4: the norms' dp-way batch split no longer has to fill nodes by itself
    (it was refused: "Megatron-LM's layout has no configuration at dp x tp")."""
    cluster = make_cluster("a100-80gb", devices=4 * dp, devices_per_node=4)
    at = graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 64})
    result = estimate(at, cluster=cluster, tp=4, pp=1, micro_batch=1, global_batch=2 * dp)
    assert result.valid, result.reason
    assert result.point.dp == dp and result.point.tp == 4


def test_the_optimizer_step_runs_once_per_step_not_per_micro_batch():
    """Under an execution model each op's compute includes its optimizer step; a pipeline of m
    micro-batches must pay it once: T(m) = m (f + b) + tail, tail >= the ops' optimizer steps."""
    from planner.core.settings import TrainingSettings

    cluster = make_cluster("a100-80gb", devices=2)
    settings = TrainingSettings(engine="fused", attention="flash")
    at = graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 64})
    one, four = (
        estimate(at, cluster=cluster, tp=2, pp=1, micro_batch=2, global_batch=2 * m, settings=settings)
        for m in (1, 4)
    )
    stage = one.point.stages[0]
    per_micro_batch = stage.forward_s + stage.backward_s
    assert four.time_s - one.time_s == pytest.approx(3 * per_micro_batch, rel=1e-9)
    cache = PipelineCostCache(at, cluster=cluster, settings=settings, cost_model="roofline")
    model = cache.model(2, 2, 0, "none")
    optimizer = sum(float(d.optimizer_s[c]) for d, c in zip(model.op_details, one.point.choice))
    assert optimizer > 0
    assert one.time_s - per_micro_batch >= optimizer * (1 - 1e-9)


def test_zero3_gathers_are_prefetched_beside_forward():
    """Under an execution model the ZeRO-0 gradient all-reduce is partly hidden under backward, and
    ZeRO-3's parameter gather before forward (the first of the two all-gathers ``grad_sync_terms``
    prices, bucketed) is prefetched beside the op's forward compute: it leaves
    ``max(0, gather - forward) + 24/132 x min(gather, forward)`` on the critical path."""
    from objectives.intra_op import bucketed_grad_sync_s, grad_sync_terms, term_time_s
    from objectives.parameters import ParameterView, parameter_ownership
    from planner.core.settings import TrainingSettings

    cluster = make_cluster("a100-80gb", devices=16, devices_per_node=8)
    settings = TrainingSettings(engine="fused", attention="flash")
    at = graph_loader("tests/data/gpt2_tiny.onnx", {"seq": 64})
    cache = PipelineCostCache(at, cluster=cluster, settings=settings, cost_model="roofline")
    model = cache.model(16, 16, 0, "none")
    zero0, zero3 = cache.arrays(16, 16, 0, "none"), cache.arrays(16, 16, 3, "none")
    owned, tensors = parameter_ownership(model.graph), ParameterView(model.graph)
    zero3_settings = TrainingSettings(engine="fused", attention="flash", zero_stage=3)
    hidden_somewhere = False
    for key, index in zip(zero0.key, range(len(model.graph.ops))):
        detail = model.op_details[index]
        if detail.grad_sync_unhidden_s is None or not detail.grad_sync_unhidden_s:
            continue
        hidden_somewhere |= bool((sum(detail.grad_sync_s.values()) < sum(detail.grad_sync_unhidden_s.values())).any())
        op, space = model.graph.ops[index], model.tables.configs[index]
        terms = grad_sync_terms(op, space, tensors=tensors, settings=zero3_settings, owned_inputs=owned[index])
        bucketed = sum(bucketed_grad_sync_s(terms, cluster=cluster, size=space.size).values())
        seconds = {t.collective: term_time_s(t, cluster=cluster) for t in terms}
        whole = seconds["reduce_scatter"] + seconds["all_gather"]
        before_forward = np.divide(0.5 * seconds["all_gather"], whole, out=np.zeros(space.size), where=whole > 0)
        position = zero0.key.index(key)
        extra = zero3.forward_s[position] - zero0.forward_s[position]
        gather = before_forward * bucketed
        exposed = np.maximum(gather - detail.forward_s, 0.0) + 24 / 132 * np.minimum(gather, detail.forward_s)
        np.testing.assert_allclose(extra, exposed, rtol=1e-9, atol=1e-15)
    assert hidden_somewhere
