"""An op's fixed costs split out of its priced seconds (objectives/fixed_cost_parts.py, issue 23 item 1).

Oracles: the cost model's own per-op arrays (``OpCostDetail``: the forward seconds, the compute of both
passes with the recomputed forward and the optimizer step, the communication by kind and link level);
the launch formula ``max(n kappa, n h - work)`` with the device's 5 us and 30 us; kernels counted by hand
from the ops' ONNX nodes; a measured shard's launches left inside its measured time.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.fixed_cost_parts import op_fixed_costs
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from planner.plan import load_graph

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
DEVICES = 4


@pytest.fixture(scope="module")
def graph():
    return load_graph(TINY, {"batch": 4, "seq": 128})


def _model(graph, cost_model="roofline", measured=None, **settings):
    return build_cost_model(graph, cluster=make_cluster("a100-80gb", devices=DEVICES),
                            settings=TrainingSettings(**settings), cost_model=cost_model, measured=measured,
                            config_options=ConfigOptions(devices=DEVICES, devices_per_node=DEVICES))  # fmt: skip


@pytest.fixture(scope="module")
def eager(graph):
    return _model(graph, engine="eager", attention="explicit", recompute="full")


def _picks(model, index):
    """The first and the last configuration of op ``index`` (replicated and most split, in enumeration order)."""
    return sorted({0, model.tables.configs[index].size - 1})


def test_the_parts_add_up_to_each_ops_priced_arrays(eager):
    checked = 0
    for index, detail in enumerate(eager.op_details):
        for pick in _picks(eager, index):
            fixed = op_fixed_costs(eager, index, pick)
            forward = fixed.work_forward_s + fixed.launch_forward_s
            backward = fixed.work_backward_s + fixed.launch_backward_s
            assert forward == pytest.approx(float(detail.forward_s[pick]), rel=1e-12, abs=1e-18)
            again = forward if fixed.recomputed else 0.0
            optimizer = float(detail.optimizer_s[pick])
            assert forward + backward + again + optimizer == pytest.approx(float(detail.compute_s[pick]), rel=1e-12)
            assert fixed.recomputed == (float(detail.recompute_s[pick]) > 0.0)
            by_kind: dict[str, float] = {}
            for c in fixed.collectives:
                by_kind[c.kind] = by_kind.get(c.kind, 0.0) + c.seconds + c.setup_s
            priced: dict[str, float] = {}
            for (kind, _level), seconds in detail.comm_s.items():
                if float(seconds[pick]) > 0.0:
                    priced[kind] = priced.get(kind, 0.0) + float(seconds[pick])
            assert by_kind == pytest.approx(priced, rel=1e-12), eager.graph.ops[index].name
            checked += len(fixed.collectives)
    assert checked > 0  # the split configurations all-reduce partial sums and input gradients


def test_launches_by_hand(eager):
    """Eager LayerNorm: one kernel forward, two backward (input and parameter gradients), plus its two
    parameters' bf16 gradient casts (EAGER_PARAMETER_KERNELS); each pass max(n x 5 us, n x 30 us - work)."""
    norm = next(i for i, op in enumerate(eager.graph.ops) if op.kind == "norm")
    fixed = op_fixed_costs(eager, norm, 0)
    assert eager.graph.ops[norm].node_types[:1] == ("LayerNormalization",)
    assert (fixed.kernels_forward, fixed.kernels_backward) == (1, 4)
    assert fixed.launch_forward_s == pytest.approx(max(5e-6, 30e-6 - fixed.work_forward_s), rel=1e-12)
    assert fixed.launch_backward_s == pytest.approx(max(4 * 5e-6, 4 * 30e-6 - fixed.work_backward_s), rel=1e-12)
    assert fixed.recomputed and fixed.launch_s == pytest.approx(2 * fixed.launch_forward_s + fixed.launch_backward_s)
    # host-bound at this size: of each pass's launch, all but n x 5 us is the GPU waiting for the host, what a
    # CUDA graph's replay would remove (the forward twice: it is recomputed)
    assert fixed.launch_forward_s > 5e-6 and fixed.launch_backward_s > 4 * 5e-6
    assert fixed.host_bound_s == pytest.approx(2 * (fixed.launch_forward_s - 5e-6) + fixed.launch_backward_s - 4 * 5e-6,
                                               rel=1e-12)


def test_no_execution_model_no_parts(graph):
    assert op_fixed_costs(_model(graph), 0, 0) is None


def test_a_measured_shard_keeps_its_launches_inside(graph):
    model = _model(graph, cost_model="measured", measured=lambda op, factors: 1e-3, engine="fused", attention="flash")
    fixed = op_fixed_costs(model, 0, 0)
    assert float(model.op_details[0].forward_s[0]) == 1e-3
    assert fixed.launch_forward_s is None and fixed.launch_backward_s is None and fixed.launch_s == 0.0
    assert fixed.priced_apart == "measured"
    assert fixed.kernels_forward >= 1


def test_an_moe_layers_ops_are_priced_apart():
    """objectives.moe prices an expert op's rows routed to it (and its all-to-alls): not the launch formula,
    so its kernels are counted and its launches and collectives are not split out."""
    from importers.moe import find_moe_layers
    from objectives.moe import price_moe

    graph = load_graph(TINY.with_name("mixtral_tiny.onnx"), {"batch": 2, "seq": 64})
    model = _model(graph, engine="fused", attention="flash")
    priced = price_moe(model, find_moe_layers(graph))
    experts = [i for i, detail in enumerate(priced.op_details) if detail.moe_s is not None]
    others = [i for i, detail in enumerate(priced.op_details) if detail.moe_s is None]
    assert experts and others
    apart = op_fixed_costs(priced, experts[0], 0)
    assert apart.priced_apart == "moe" and apart.launch_forward_s is None and apart.collectives == ()
    assert apart.kernels_forward + apart.kernels_backward >= 1
    assert op_fixed_costs(priced, others[0], 0).priced_apart is None
