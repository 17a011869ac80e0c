"""Collectives against hand-computed alpha-beta numbers; hierarchical vs flat."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.collectives import (
    all_gather_time_s,
    all_reduce_time_s,
    all_to_all_time_s,
    collective_time_s,
    point_to_point_time_s,
    reduce_scatter_time_s,
    ring_all_reduce_time_s,
)
from planner.core.cluster import Link

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
SLOW_INTRA = Link(name="pcie-slow", bandwidth_bytes_per_s=1e9, latency_s=5e-6)


def levels(intra: int, inter: int, intra_link: Link = NV, inter_link: Link = IB) -> dict:
    return dict(intra_size=intra, inter_size=inter, intra_link=intra_link, inter_link=inter_link)


class TestRingAllReduce:
    def test_hand_numbers(self):
        # 8 devices, 1 GB, NVLink 100 GB/s, 2 us: 2 * 7/8 * 1e9 / 100e9 + 2 * 7 * 2e-6
        assert ring_all_reduce_time_s(1e9, 8, NV) == pytest.approx(0.0175 + 28e-6, rel=1e-12)

    def test_one_device_is_free(self):
        assert ring_all_reduce_time_s(1e9, 1, NV) == 0.0
        assert all_reduce_time_s(1e9, **levels(1, 1)) == 0.0


class TestAllReduce:
    def test_inside_a_node_uses_the_intra_link(self):
        t = all_reduce_time_s(4e9, **levels(4, 1))
        assert t == pytest.approx(2 * 3 / 4 * 4e9 / 100e9 + 2 * 3 * 2e-6, rel=1e-12)

    def test_spanning_nodes_hierarchical_by_hand(self):
        # a=8 per node, e=2 nodes, B = 8 GB.
        # reduce-scatter in node: 7/8 * 8e9 / 100e9 + 7 * 2e-6       = 0.07 + 14e-6
        # all-reduce across nodes on B/8 = 1e9: 2 * 1/2 * 1e9 / 10e9 + 2 * 5e-6 = 0.1 + 10e-6
        # all-gather in node: same as the reduce-scatter             = 0.07 + 14e-6
        hierarchical = 0.07 + 14e-6 + 0.1 + 10e-6 + 0.07 + 14e-6
        flat = 2 * 15 / 16 * 8e9 / 10e9 + 2 * 15 * 5e-6
        assert hierarchical < flat
        assert all_reduce_time_s(8e9, **levels(8, 2)) == pytest.approx(hierarchical, rel=1e-12)

    def test_flat_wins_when_the_node_link_is_slow(self):
        # With a 1 GB/s intra link the hierarchical in-node steps cost 2 * 7/8 * 8 s: the flat
        # all-reduce over the inter link (10 GB/s) is cheaper and is taken, as a tree (4 hops, not 15)
        flat = 2 * 15 / 16 * 8e9 / 10e9 + 2 * 4 * 5e-6
        hierarchical = 2 * (7 / 8 * 8e9 / 1e9 + 7 * 5e-6) + (1e9 / 10e9 + 2 * 5e-6)
        assert flat < hierarchical
        t = all_reduce_time_s(8e9, intra_size=8, inter_size=2, intra_link=SLOW_INTRA, inter_link=IB)
        assert t == pytest.approx(flat, rel=1e-12)

    def test_one_device_per_node_is_a_tree_across_nodes(self):
        # NCCL's double binary tree: the ring's bandwidth term, 2 x log2(4) latencies instead of 2 x 3
        t = all_reduce_time_s(1e9, **levels(1, 4))
        assert t == pytest.approx(2 * 3 / 4 * 1e9 / 10e9 + 2 * 2 * 5e-6, rel=1e-12)

    def test_vectorised_over_group_shapes(self):
        nbytes = np.array([1e9, 1e9, 8e9, 8e9])
        intra = np.array([1, 4, 8, 8])
        inter = np.array([1, 1, 2, 1])
        t = all_reduce_time_s(nbytes, intra_size=intra, inter_size=inter, intra_link=NV, inter_link=IB)
        expected = [all_reduce_time_s(b, **levels(a, e)) for b, a, e in zip(nbytes, intra, inter)]
        np.testing.assert_allclose(t, expected, rtol=1e-12)
        assert t[0] == 0.0

    def test_keeping_the_group_in_a_node_is_cheaper(self):
        inside = all_reduce_time_s(1e9, **levels(8, 1))
        across = all_reduce_time_s(1e9, **levels(4, 2))
        assert inside < across


class TestGatherScatter:
    def test_all_gather_in_node(self):
        t = all_gather_time_s(4e9, **levels(4, 1))
        assert t == pytest.approx(3 / 4 * 4e9 / 100e9 + 3 * 2e-6, rel=1e-12)

    def test_all_gather_across_nodes_by_hand(self):
        # NCCL's one ring over 16 devices: the bytes cross nodes as B/a per device (1/2 * 1 GB at
        # 10 GB/s) and move inside the node as B (7/8 * 8 GB at 100 GB/s); 15 steps, each waiting
        # for an inter-node hop (5 us)
        expected = 0.5 * 1e9 / 10e9 + 7 / 8 * 8e9 / 100e9 + 15 * 5e-6
        assert all_gather_time_s(8e9, **levels(8, 2)) == pytest.approx(expected, rel=1e-12)

    def test_all_gather_latency_grows_with_the_ring(self):
        # no tree for all-gather: an empty buffer over 128 nodes of 8 pays 1,023 inter-node hops
        assert all_gather_time_s(0.0, **levels(8, 128)) == pytest.approx(1023 * 5e-6, rel=1e-12)

    def test_reduce_scatter_mirrors_all_gather(self):
        for a, e in ((4, 1), (8, 2), (2, 4)):
            assert reduce_scatter_time_s(3e9, **levels(a, e)) == pytest.approx(
                all_gather_time_s(3e9, **levels(a, e)), rel=1e-12
            )

    def test_reduce_scatter_plus_all_gather_is_an_all_reduce_in_a_node(self):
        rs_ag = reduce_scatter_time_s(2e9, **levels(8, 1)) + all_gather_time_s(2e9, **levels(8, 1))
        assert rs_ag == pytest.approx(all_reduce_time_s(2e9, **levels(8, 1)), rel=1e-12)


class TestAllToAllAndP2P:
    def test_all_to_all_by_hand(self):
        # n = 8 (4 per node, 2 nodes), B = 8 GB: 1 GB per peer; 3 peers in node, 4 across.
        expected = 3 * (1e9 / 100e9 + 2e-6) + 4 * (1e9 / 10e9 + 5e-6)
        assert all_to_all_time_s(8e9, **levels(4, 2)) == pytest.approx(expected, rel=1e-12)

    def test_point_to_point(self):
        t = point_to_point_time_s([1e9, 1e9, 0.0], crosses_node=[False, True, True], intra_link=NV,
                                  inter_link=IB, messages=2)
        np.testing.assert_allclose(t, [0.01 + 4e-6, 0.1 + 10e-6, 0.0], rtol=1e-12)

    def test_dispatch(self):
        assert collective_time_s("all_reduce", 1e9, **levels(8, 2)) == all_reduce_time_s(1e9, **levels(8, 2))
        assert collective_time_s("p2p", 1e9, **levels(1, 2)) == pytest.approx(0.1 + 5e-6)
        with pytest.raises(ValueError):
            collective_time_s("broadcast", 1.0, **levels(1, 1))
