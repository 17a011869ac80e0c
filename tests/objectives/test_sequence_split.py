"""Sequence parallelism priced as reduce-scatter + all-gather (``objectives.sequence_split``).

Megatron-LM's sequence-parallel boundary runs one reduce-scatter after a row-parallel linear layer and
one all-gather before a column-parallel one (and their mirrors in backward); a ring all-reduce is a
reduce-scatter plus an all-gather, so a sequence-parallel layer communicates what a tensor-parallel
one does (Korthikanti et al., MLSys 2023, section 4.2.2). Expected seconds below are the ring formulas
written out: ``T_RS = T_AG = (p-1)/p B / busbw + (p-1) alpha``, ``T_AR = 2 (p-1)/p B / busbw + 2 (p-1) alpha``.
"""

from __future__ import annotations

import numpy as np
import pytest

from objectives._common import element_bytes
from objectives.cluster import make_cluster
from objectives.fixed_costs import nccl_collective_time_s
from objectives.intra_op import CommTerm
from objectives.redistribution import redistribution_time_s
from objectives.sequence_split import scattered_boundary_s
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

P, HIDDEN, HEADS, BATCH, SEQ = 4, 256, 4, 2, 128


@pytest.fixture(scope="module")
def graph():
    return gpt2_like(layers=1, hidden=HIDDEN, heads=HEADS, vocab=512, positions=SEQ, batch=BATCH, seq=SEQ)


def _model(graph, settings: TrainingSettings):
    cluster = make_cluster("a100-80gb", devices=P)
    return build_cost_model(graph, cluster=cluster, settings=settings,
                            config_options=ConfigOptions(devices=P, devices_per_node=P))


@pytest.fixture(scope="module")
def roofline(graph):
    return _model(graph, TrainingSettings())


def _index(graph, name: str) -> int:
    return next(i for i, op in enumerate(graph.ops) if op.name == name)


def _config(model, op_index: int, replicas: int = 1, **splits: int) -> int:
    """The configuration splitting exactly ``splits``, held by ``replicas`` copies."""
    space = model.tables.configs[op_index]
    want = np.array([splits.get(name, 1) for name in space.dim_names])
    rows = np.flatnonzero(np.all(space.factors == want, axis=1) & (space.replica_counts == replicas))
    assert rows.size >= 1, (model.graph.ops[op_index].name, splits)
    return int(rows[0])


def _edge(model, u: int, v: int):
    return next(e for e in model.tables.edges if (e.u, e.v) == (u, v))


def _ring(model, num_bytes: float):
    """(T_RS = T_AG, T_AR) of ``num_bytes`` over ``P`` devices inside a node, by hand."""
    link = model.cluster.intra_link
    busbw = link.bandwidth_bytes_per_s * link.collective_efficiency
    half = (P - 1) / P * num_bytes / busbw + (P - 1) * link.latency_s
    return half, 2 * half


def _tensor_bytes(model, name: str) -> float:
    tensor = model.graph.tensors[name]
    return float(np.prod(tensor.shape)) * element_bytes(tensor, model.settings)


class TestRowParallelToSequenceSplit:
    def test_reduce_scatter_plus_all_gather_by_hand(self, graph, roofline):
        """``attn.c_proj`` (its reduction dim split P ways: partial sums) into ``add_1`` split along the
        sequence: the op's all-reduce stays, the edge adds nothing, so the boundary costs
        ``T_RS + T_AG`` (= ``T_AR``) instead of ``T_AR`` plus the gradient's all-gather."""
        u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
        cu, cv = _config(roofline, u, k=P), _config(roofline, v, s=P)
        num_bytes = _tensor_bytes(roofline, "h.0.attn.c_proj.out")  # each device's whole partial-sum tile
        half, full = _ring(roofline, num_bytes)
        op_comm = roofline.op_details[u].comm_s[("partial_sum", "intra")][cu]
        assert op_comm == pytest.approx(full, rel=1e-12)
        assert _edge(roofline, u, v).time_s[cu, cv] == 0.0
        assert op_comm + _edge(roofline, u, v).time_s[cu, cv] == pytest.approx(half + half, rel=1e-12)

    def test_the_tile_rule_alone_charged_the_gradient_all_gather_on_top(self, graph, roofline):
        """Without the rule, the same cell is the tile rule's backward: (P-1)/P of the tensor received
        point to point at the link's rate, one message (what the tables priced before)."""
        u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
        cu, cv = _config(roofline, u, k=P), _config(roofline, v, s=P)
        producer, consumer = graph.ops[u], graph.ops[v]
        tensor = graph.tensors["h.0.attn.c_proj.out"]
        access_u = producer.outputs[0]
        access_v = next(a for a in consumer.inputs if a.tensor == tensor.name)
        table = redistribution_time_s(
            tensor.shape, element_bytes(tensor, roofline.settings), producer=producer,
            producer_space=roofline.tables.configs[u], producer_access=access_u, consumer=consumer,
            consumer_space=roofline.tables.configs[v], consumer_access=access_v, cluster=roofline.cluster,
        )
        link = roofline.cluster.intra_link
        num_bytes = _tensor_bytes(roofline, tensor.name)
        assert table[cu, cv] == pytest.approx((P - 1) / P * num_bytes / link.bandwidth_bytes_per_s + link.latency_s)

    def test_other_pairs_keep_the_tile_rule(self, graph, roofline):
        """Any ``1/P`` share is a reduce-scatter's (a local transpose makes the hidden split contiguous):
        0. A replicated consumer of the all-reduced output needs nothing more either. A consumer holding
        a ``1/2`` share on 2 devices x 2 copies is no reduce-scatter over the 4: it keeps the tile
        rule's gradient re-layout, ``(1 - 1/2)`` of the tensor at the link's rate."""
        u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
        table = _edge(roofline, u, v).time_s
        cu = _config(roofline, u, k=P)
        assert table[cu, _config(roofline, v, n=P)] == 0.0
        assert table[cu, _config(roofline, v, replicas=P)] == 0.0
        link = roofline.cluster.intra_link
        half_tensor = 0.5 * _tensor_bytes(roofline, "h.0.attn.c_proj.out")
        expected = half_tensor / link.bandwidth_bytes_per_s + link.latency_s
        assert table[cu, _config(roofline, v, replicas=2, s=2)] == pytest.approx(expected, rel=1e-12)


class TestSequenceSplitToColumnParallel:
    def test_all_gather_plus_reduce_scatter_by_hand(self, graph, roofline):
        """``ln_2`` split along the sequence into ``mlp.c_fc`` split on its output features: the consumer's
        input-gradient all-reduce stays in the op, the edge's forward all-gather is its other half."""
        u, v = _index(graph, "h.0.ln_2"), _index(graph, "h.0.mlp.c_fc")
        cu, cv = _config(roofline, u, s=P), _config(roofline, v, n=P)
        num_bytes = _tensor_bytes(roofline, "h.0.ln_2.out")
        half, full = _ring(roofline, num_bytes)
        op_comm = roofline.op_details[v].comm_s[("input_grad", "intra")][cv]
        assert op_comm == pytest.approx(full, rel=1e-12)
        assert _edge(roofline, u, v).time_s[cu, cv] == 0.0


class TestUnderNccl:
    def test_an_execution_model_pays_the_extra_call(self, graph):
        """Under an execution model collectives are NCCL-priced with a fixed setup per call: the edge
        carries ``RS + AG - AR`` of NCCL's model (two calls' setup against one), never below 0."""
        model = _model(graph, TrainingSettings(engine="fused", attention="flash"))
        u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
        cu, cv = _config(model, u, k=P), _config(model, v, s=P)
        num_bytes = _tensor_bytes(model, "h.0.attn.c_proj.out")
        link, setup = model.cluster.intra_link, model.cluster.device.collective_overhead_s
        rs, ag, ar = (float(nccl_collective_time_s(c, num_bytes, P, link)) + setup
                      for c in ("reduce_scatter", "all_gather", "all_reduce"))
        assert model.op_details[u].comm_s[("partial_sum", "intra")][cu] == pytest.approx(ar, rel=1e-12)
        assert _edge(model, u, v).time_s[cu, cv] == pytest.approx(max(0.0, rs + ag - ar), rel=1e-12)


class TestAcrossNodes:
    def test_hierarchical_all_reduce_is_cheaper_by_the_ring_latencies(self):
        """8 devices per node x 2 nodes: NCCL's reduce-scatter and all-gather are one ring of 16 (15
        inter-node latencies each, ``objectives.collectives``), the all-reduce hierarchical (ring inside
        the node, tree across): same bytes, so the boundary's extra is the latencies' difference."""
        cluster = make_cluster("a100-80gb", devices=16)
        intra, inter = cluster.intra_link, cluster.inter_link
        a, e, num_bytes = 8, 2, 64e6
        term = CommTerm(kind="partial_sum", collective="all_reduce", tensor="y", num_bytes=np.array([num_bytes]),
                        intra_size=np.array([a]), inter_size=np.array([e]))
        bw_a = intra.bandwidth_bytes_per_s * intra.collective_efficiency
        bw_e = inter.bandwidth_bytes_per_s * inter.collective_efficiency
        bytes_s = (e - 1) / e * num_bytes / a / bw_e + (a - 1) / a * num_bytes / bw_a
        ring_16 = bytes_s + (a * e - 1) * inter.latency_s  # T_RS = T_AG across nodes
        hierarchical = 2 * ((a - 1) / a * num_bytes / bw_a + (a - 1) * intra.latency_s) + min(
            2 * (e - 1) / e * num_bytes / a / bw_e + 2 * (e - 1) * inter.latency_s,  # ring of 2 nodes
            2 * (e - 1) / e * num_bytes / a / bw_e + 2 * 1 * inter.latency_s,  # tree: ceil(log2 2) = 1 hop
        )
        flat = 2 * (a * e - 1) / (a * e) * num_bytes / bw_e + 2 * np.ceil(np.log2(a * e)) * inter.latency_s
        expected = max(0.0, 2 * ring_16 - min(hierarchical, flat))
        got = float(scattered_boundary_s(term, cluster=cluster, nccl=False)[0])
        assert got == pytest.approx(expected, rel=1e-9)
        assert got > 0.0

    def test_one_node_ring_is_exactly_zero(self):
        cluster = make_cluster("a100-80gb", devices=8)
        term = CommTerm(kind="partial_sum", collective="all_reduce", tensor="y",
                        num_bytes=np.array([1e3, 12e6, 1e9]), intra_size=np.array([2, 4, 8]),
                        inter_size=np.array([1, 1, 1]))
        assert scattered_boundary_s(term, cluster=cluster, nccl=False).tolist() == [0.0, 0.0, 0.0]


def test_tp_overlap_still_overlaps_the_edges_next_to_linear_layers(graph):
    """``--fix tp_overlap=on``: every edge into or out of a linear layer that costs anything is overlapped
    (the sequence-parallel pairs' remainder included), and no other edge changes."""
    from objectives.parameters import ParameterView
    from objectives.tp_overlap import bulk_exposed_s, is_tp_gemm

    off = _model(graph, TrainingSettings(engine="fused", attention="flash"))
    on = _model(graph, TrainingSettings(engine="fused", attention="flash", tp_comm_overlap=True))
    gemm = [is_tp_gemm(op, ParameterView(graph)) for op in graph.ops]
    changed = {(a.u, a.v) for a, b in zip(off.tables.edges, on.tables.edges) if not np.array_equal(a.time_s, b.time_s)}
    expected = {(e.u, e.v) for e in off.tables.edges if (gemm[e.u] or gemm[e.v]) and e.time_s.any()}
    assert changed == expected and expected
    u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
    cu, cv = _config(on, u, k=P), _config(on, v, s=P)
    detail = on.op_details[u]
    backward = detail.compute_s - detail.recompute_s - detail.forward_s - detail.optimizer_s
    remainder = _edge(off, u, v).time_s[cu, cv]
    assert remainder > 0.0
    assert _edge(on, u, v).time_s[cu, cv] == pytest.approx(float(bulk_exposed_s(remainder, backward[cu])), rel=1e-12)
