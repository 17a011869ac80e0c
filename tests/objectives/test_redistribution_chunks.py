"""``redistribution_time_s`` assembled in chunks from its column-expanded grids (issue 22, fourteenth round): every
cell to the bit the one the whole-table path gives (``redistribution(...)``, whose directions are priced on whole
``(K_u, K_v)`` arrays by ``_direction_s``), at chunks of one row, of several rows with a short last one, and of the
whole table; across nodes and on one node; for the whole table and for chosen rows and columns."""

from __future__ import annotations

import numpy as np
import pytest

import objectives.redistribution as redistribution_module
from objectives.redistribution import redistribution, redistribution_time_s
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, TensorAccess

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
DEVICE = Device(name="toy", peak_flops={"bf16": 1e14}, memory_bytes=10**10, memory_bandwidth_bytes_per_s=1e12)
BYTES = 2


def _edge(devices: int, per_node: int) -> dict:
    """A (16, 64) tensor written split over rows and columns, read with its columns as (heads, head dim)."""
    write = TensorAccess(tensor="t", axes=(("m",), ("n",)))
    read = TensorAccess(tensor="t", axes=(("m",), ("h", "d")))
    producer = Op(name="u", kind="elementwise", op_type="Relu", flops=0.0, inputs=(write,), outputs=(write,),
                  dims=(IterDim(name="m", size=16), IterDim(name="n", size=64)))
    consumer = Op(name="v", kind="elementwise", op_type="Relu", flops=0.0, inputs=(read,), outputs=(read,),
                  dims=(IterDim(name="m", size=16), IterDim(name="h", size=4), IterDim(name="d", size=16)))
    options = ConfigOptions(devices=devices, devices_per_node=per_node)
    return dict(producer=producer, producer_space=enumerate_configs(producer, options), producer_access=write,
                consumer=consumer, consumer_space=enumerate_configs(consumer, options), consumer_access=read,
                cluster=Cluster(device=DEVICE, nodes=devices // per_node, devices_per_node=per_node,
                                intra_link=NV, inter_link=IB))


def _same_bits(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype == np.float64 and a.shape == b.shape and np.array_equal(a.view(np.int64), b.view(np.int64))


@pytest.mark.parametrize("cells", [1, 50, 1 << 30])
@pytest.mark.parametrize("devices, per_node", [(8, 4), (16, 4)])
def test_across_nodes_every_cell_as_the_whole_table_path(monkeypatch, cells, devices, per_node):
    kwargs = _edge(devices, per_node)
    whole = redistribution((16, 64), BYTES, **kwargs)
    assert whole.forward_inter_elements.any()  # the crossing branch
    monkeypatch.setattr(redistribution_module, "_CHUNK_CELLS", cells)
    fast = redistribution_time_s((16, 64), BYTES, **kwargs)
    assert _same_bits(fast, whole.forward_s + whole.backward_s)
    rng = np.random.default_rng(devices + cells % 97)
    rows = np.sort(rng.choice(fast.shape[0], size=5, replace=False))
    cols = np.sort(rng.choice(fast.shape[1], size=7, replace=False))
    part = redistribution_time_s((16, 64), BYTES, rows=rows, cols=cols, **kwargs)
    assert _same_bits(part, fast[np.ix_(rows, cols)])


@pytest.mark.parametrize("cells", [1, 50, 1 << 30])
def test_one_node_as_the_one_link_sum(monkeypatch, cells):
    # nothing crosses nodes: each cell is (forward + backward elements) x bytes / bandwidth, plus one latency per
    # direction that moves anything, summed in that order (the one-link branch)
    kwargs = _edge(4, 4)
    whole = redistribution((16, 64), BYTES, **kwargs)
    assert not whole.forward_inter_elements.any() and not whole.backward_inter_elements.any()
    forward, backward = whole.forward_elements, whole.backward_elements
    expected = (forward + backward) * (BYTES / NV.bandwidth_bytes_per_s)
    expected += ((forward > 0.0).astype(np.float64) + (backward > 0.0)) * NV.latency_s
    monkeypatch.setattr(redistribution_module, "_CHUNK_CELLS", cells)
    assert _same_bits(redistribution_time_s((16, 64), BYTES, **kwargs), expected)
    # one cell by hand: rows split 2 ways -> (heads) split 2 ways: each device holds 8 x 64, needs 16 x 32,
    # shares 8 x 32: 256 elements arrive forward and 256 go back
    u = kwargs["producer_space"].index_of({"m": 2})
    v = kwargs["consumer_space"].index_of({"h": 2})
    seconds = 2 * (256 * BYTES / NV.bandwidth_bytes_per_s + NV.latency_s)
    assert redistribution_time_s((16, 64), BYTES, **kwargs)[u, v] == pytest.approx(seconds, rel=1e-12)


@pytest.mark.parametrize("direction", ["forward", "backward"])
def test_scatter_ratio_columns_expanded_once_as_each_block(direction):
    # ScatterRatios.columns: the same cells as block() at any rows of the given columns (whole or chosen)
    from objectives.redistribution import edge_scatter_ratios

    kwargs = _edge(16, 4)
    ratios = edge_scatter_ratios((16, 64), **kwargs)
    rng = np.random.default_rng(3)
    k_u, k_v = ratios.shape
    for cols in (slice(None), np.sort(rng.choice(k_v, size=9, replace=False))):
        block_of = ratios.columns(direction, cols)
        for rows in (slice(0, 7), np.sort(rng.choice(k_u, size=11, replace=False)), np.arange(k_u)):
            expected = ratios.block(direction, rows, cols)
            assert _same_bits(block_of(rows), expected)
    assert ratios.block(direction, slice(None), slice(None)).any()  # some pair scatters: not all zeros compared
