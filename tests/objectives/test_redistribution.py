"""Edge redistribution between two layouts, by hand; merged axes; node-level crossings."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.redistribution import _unique_rows, redistribution, redistribution_time_s, tile_extents
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, TensorAccess

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
DEVICE = Device(name="toy", peak_flops={"bf16": 1e14}, memory_bytes=10**10, memory_bandwidth_bytes_per_s=1e12)
BYTES = 2


def cluster(nodes: int, per_node: int) -> Cluster:
    return Cluster(device=DEVICE, nodes=nodes, devices_per_node=per_node, intra_link=NV, inter_link=IB)


def elementwise(name: str, dims: dict[str, int], axes) -> tuple[Op, TensorAccess]:
    access = TensorAccess(tensor="t", axes=axes)
    op = Op(name=name, kind="elementwise", op_type="Relu", flops=0.0, inputs=(access,), outputs=(access,),
            dims=tuple(IterDim(name=n, size=s) for n, s in dims.items()))
    return op, access


def edge(producer, consumer, shape, devices=2, per_node=None, *, fast=False):
    per_node = per_node or devices
    (op_u, acc_u), (op_v, acc_v) = producer, consumer
    options = ConfigOptions(devices=devices, devices_per_node=per_node)
    space_u, space_v = enumerate_configs(op_u, options), enumerate_configs(op_v, options)
    kwargs = dict(producer=op_u, producer_space=space_u, producer_access=acc_u, consumer=op_v,
                  consumer_space=space_v, consumer_access=acc_v, cluster=cluster(devices // per_node, per_node))
    if fast:
        return space_u, space_v, redistribution_time_s(shape, BYTES, **kwargs)
    return space_u, space_v, redistribution(shape, BYTES, **kwargs)


def seconds(elements: float, link: Link = NV) -> float:
    return elements * BYTES / link.bandwidth_bytes_per_s + link.latency_s if elements else 0.0


SQUARE = {"i": 8, "j": 8}
ROWS_COLS = (("i",), ("j",))


class TestHandCases:
    def test_rows_to_columns(self):
        # t[8, 8] split by rows (i=2) -> by columns (j=2): each device needs an 8x4 tile and holds a
        # 4x8 one; they share a 4x4 block, so 32 - 16 = 16 elements arrive, and 16 go back in backward.
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8))
        a, b = u.index_of({"i": 2}), v.index_of({"j": 2})
        assert moved.forward_elements[a, b] == 16 and moved.backward_elements[a, b] == 16
        assert moved.time_s[a, b] == pytest.approx(2 * seconds(16), rel=1e-12)

    def test_same_layout_is_free(self):
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8))
        for factors in ({}, {"i": 2}, {"j": 2}):
            a, b = u.index_of(factors), v.index_of(factors)
            assert moved.time_s[a, b] == 0.0

    def test_consumer_on_more_devices_needs_its_whole_tile(self):
        # Producer on one device, consumer split i=2: the second device holds nothing (32 elements
        # arrive); backward the producer's device holds half its tile's gradient (64 - 32).
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8))
        a, b = u.index_of({}), v.index_of({"i": 2})
        assert moved.forward_elements[a, b] == 32 and moved.backward_elements[a, b] == 32

    def test_gather_to_fewer_devices(self):
        # Producer i=2 -> consumer replicated on one device: it holds half, receives the other half;
        # backward the producer's second device holds nothing of the gradient: its whole 4x8 tile.
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8))
        a, b = u.index_of({"i": 2}), v.index_of({})
        assert moved.forward_elements[a, b] == 32 and moved.backward_elements[a, b] == 32


class TestMergedAxes:
    """Producer writes ``t[4, 64]`` with dims (m, n); the consumer reads axis 1 as heads x head_dim."""

    def setup(self):
        producer = elementwise("u", {"m": 4, "n": 64}, (("m",), ("n",)))
        consumer = elementwise("v", {"m": 4, "h": 4, "d": 16}, (("m",), ("h", "d")))
        return edge(producer, consumer, (4, 64))

    def test_contiguous_split_matches_a_heads_split(self):
        u, v, moved = self.setup()
        assert moved.time_s[u.index_of({"n": 2}), v.index_of({"h": 2})] == 0.0

    def test_head_dim_split_is_a_real_relayout(self):
        # n=2 holds heads {0,1} x all 16 dims; d=2 needs all 4 heads x 8 dims: overlap 2 x 8 of the
        # 4 x 8 needed per row, 4 rows: 128 - 64 = 64 elements each way.
        u, v, moved = self.setup()
        a, b = u.index_of({"n": 2}), v.index_of({"d": 2})
        assert moved.forward_elements[a, b] == 64 and moved.backward_elements[a, b] == 64

    def test_tiles_on_refined_sub_axes(self):
        producer, acc_u = elementwise("u", {"m": 4, "n": 64}, (("m",), ("n",)))
        consumer, acc_v = elementwise("v", {"m": 4, "h": 4, "d": 16}, (("m",), ("h", "d")))
        space = enumerate_configs(producer, ConfigOptions(devices=8, devices_per_node=8))
        tiles = tile_extents(space, producer, acc_u, (4, 64), other_op=consumer, other_access=acc_v)
        # columns: m, heads, head_dim. n=8 -> blocks of 8 elements: half a head.
        assert tiles[space.index_of({"n": 8})].tolist() == [4.0, 1.0, 8.0]
        assert tiles[space.index_of({"n": 2})].tolist() == [4.0, 2.0, 16.0]


class TestNodes:
    """Two nodes of two devices, t[8, 8]."""

    def test_different_node_placement_of_the_same_split_crosses_nodes(self):
        # Both split i=2, j=2; the producer puts i across nodes, the consumer j. The tile rule sees the
        # same 4x4 tiles, but a node holds the rows i in [0, 4) and needs the columns j in [0, 4):
        # half of each device's 16 elements is on the other node.
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8),
                           devices=4, per_node=2)
        a = u.index_of({"i": 2, "j": 2}, {"i": 2})
        b = v.index_of({"i": 2, "j": 2}, {"j": 2})
        assert moved.forward_inter_elements[a, b] == 8 and moved.forward_elements[a, b] == 8
        assert moved.time_s[a, b] == pytest.approx(2 * seconds(8, IB), rel=1e-12)
        same = v.index_of({"i": 2, "j": 2}, {"i": 2})
        assert moved.time_s[a, same] == 0.0

    def test_rows_to_columns_across_nodes(self):
        # i=4 (i across nodes) -> j=4 (j across nodes): tiles 2x8 -> 8x2, overlap 2x2: 12 elements
        # per device, of which the node holds i in [0, 4) x j in [0, 4) of the needed 8x4 node
        # tile: half, so 8 of the 16-element tile cross nodes and 12 - 8 = 4 stay inside.
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8),
                           devices=4, per_node=2)
        a, b = u.index_of({"i": 4}, {"i": 2}), v.index_of({"j": 4}, {"j": 2})
        assert moved.forward_elements[a, b] == 12 and moved.forward_inter_elements[a, b] == 8
        assert moved.time_s[a, b] == pytest.approx(2 * (seconds(4, NV) + seconds(8, IB)), rel=1e-12)
        assert moved.inter_s[a, b] == pytest.approx(2 * seconds(8, IB), rel=1e-12)

    def test_one_node_to_two_nodes(self):
        # Producer on node 0 only (i=2), consumer i=4 over both nodes: node 1's devices hold nothing.
        u, v, moved = edge(elementwise("u", SQUARE, ROWS_COLS), elementwise("v", SQUARE, ROWS_COLS), (8, 8),
                           devices=4, per_node=2)
        a, b = u.index_of({"i": 2}), v.index_of({"i": 4}, {"i": 2})
        assert moved.forward_inter_elements[a, b] == 16  # the whole 2x8 tile


class TestFastPath:
    @pytest.mark.parametrize("devices, per_node", [(4, 4), (8, 4), (16, 4)])
    def test_equals_the_term_by_term_result(self, devices, per_node):
        producer = elementwise("u", {"m": 16, "n": 64}, (("m",), ("n",)))
        consumer = elementwise("v", {"m": 16, "h": 4, "d": 16}, (("m",), ("h", "d")))
        _, _, full = edge(producer, consumer, (16, 64), devices, per_node)
        _, _, fast = edge(producer, consumer, (16, 64), devices, per_node, fast=True)
        np.testing.assert_allclose(fast, full.time_s, rtol=1e-12, atol=0)


class TestOddAccesses:
    @pytest.mark.parametrize(
        "producer_dims, producer_axis, consumer_dims, consumer_axis",
        [
            ({"a": 4, "b": 6}, ("a", "b"), {"c": 6, "d": 4}, ("c", "d")),  # 4x6 vs 6x4: no nesting
            ({"a": 1, "b": 24}, ("a", "b"), {"c": 24}, ("c",)),  # a size-1 outer dim
            ({"a": 24}, ("a",), {"c": 24, "d": 1}, ("c", "d")),  # a size-1 inner dim
            ({"a": 24}, ("a",), {"c": 24}, ()),  # the consumer never splits the axis
            ({"a": 2, "b": 12}, ("a", "b"), {"c": 4, "d": 6}, ("c", "d")),  # 2x12 vs 4x6: common 2x2x6
        ],
    )
    def test_fast_path_and_no_crash(self, producer_dims, producer_axis, consumer_dims, consumer_axis):
        producer = elementwise("u", {"m": 4, **producer_dims}, (("m",), producer_axis))
        consumer = elementwise("v", {"m": 4, **consumer_dims}, (("m",), consumer_axis))
        u, v, full = edge(producer, consumer, (4, 24), 8, 4)
        _, _, fast = edge(producer, consumer, (4, 24), 8, 4, fast=True)
        np.testing.assert_allclose(fast, full.time_s, rtol=1e-12, atol=0)
        assert np.all(full.forward_elements >= 0) and np.all(np.isfinite(full.time_s))
        # The same split on both sides (when it exists) moves nothing.
        assert full.time_s[u.index_of({}), v.index_of({})] == 0.0


def test_unique_rows_matches_numpy_unique_by_rows():
    rng = np.random.default_rng(7)
    for _ in range(200):
        table = rng.integers(0, int(rng.integers(1, 9)), size=(int(rng.integers(0, 40)), int(rng.integers(1, 5))))
        unique, inverse = _unique_rows(table)
        expected, expected_inverse = np.unique(table, axis=0, return_inverse=True)
        assert np.array_equal(unique, expected) and np.array_equal(inverse, expected_inverse.reshape(-1))
    wide = np.array([[2**40, 2**40, 1], [1, 2**40, 2**40], [2**40, 2**40, 1]])  # too wide to encode: numpy's
    unique, inverse = _unique_rows(wide)
    assert unique.tolist() == [[1, 2**40, 2**40], [2**40, 2**40, 1]] and inverse.tolist() == [1, 0, 1]
