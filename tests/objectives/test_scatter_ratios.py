"""``objectives.redistribution.scatter_ratios`` assembles its two ``(K_u, K_v)`` tables in row chunks (issue 22,
eighth round: the whole-table temporaries were most of a 3,072-device plan's system time). Checked with chunks of
3 rows against its definition read off the term-by-term re-layout (:func:`redistribution`): where the consumer's
tile needs nothing moved forward (no tile-rule and no node-crossing elements) and both ops hold the tensor on as
many devices, the producer's tile volume over the consumer's; the mirror backward; 0 elsewhere."""

from __future__ import annotations

import numpy as np
import pytest

import objectives.redistribution as redistribution_module
from objectives.redistribution import redistribution, scatter_ratios
from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op, TensorAccess

NV = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=2e-6)
IB = Link(name="ib", bandwidth_bytes_per_s=10e9, latency_s=5e-6)
DEVICE = Device(name="toy", peak_flops={"bf16": 1e14}, memory_bytes=10**10, memory_bandwidth_bytes_per_s=1e12)


def _elementwise(name: str, dims: dict[str, int], axes) -> tuple[Op, TensorAccess]:
    access = TensorAccess(tensor="t", axes=axes)
    op = Op(name=name, kind="elementwise", op_type="Relu", flops=0.0, inputs=(access,), outputs=(access,),
            dims=tuple(IterDim(name=n, size=s) for n, s in dims.items()))
    return op, access


@pytest.mark.parametrize("devices, per_node", [(8, 8), (16, 4)])
def test_chunked_ratios_equal_their_definition(monkeypatch, devices, per_node):
    monkeypatch.setattr(redistribution_module, "_CHUNK_ROWS", 3)  # many chunks, the last one short
    shape = (16, 64)
    (op_u, acc_u), (op_v, acc_v) = (_elementwise("u", {"m": 16, "n": 64}, (("m",), ("n",))),
                                    _elementwise("v", {"m": 16, "h": 4, "d": 16}, (("m",), ("h", "d"))))
    options = ConfigOptions(devices=devices, devices_per_node=per_node)
    space_u, space_v = enumerate_configs(op_u, options), enumerate_configs(op_v, options)
    cluster = Cluster(device=DEVICE, nodes=devices // per_node, devices_per_node=per_node, intra_link=NV, inter_link=IB)
    edge = dict(producer=op_u, producer_space=space_u, producer_access=acc_u, consumer=op_v, consumer_space=space_v,
                consumer_access=acc_v, cluster=cluster)
    forward, backward = scatter_ratios(shape, **edge)
    moved = redistribution(shape, 2, **edge)
    # every dim of both ops indexes the tensor: a tile is the tensor over the split factors
    volume_u = np.prod(shape) / np.prod(space_u.factors, axis=1)
    volume_v = np.prod(shape) / np.prod(space_v.factors, axis=1)
    same = (np.prod(space_u.factors, axis=1) * space_u.replica_counts)[:, None] == (
        np.prod(space_v.factors, axis=1) * space_v.replica_counts)[None, :]
    expected_f = np.where(same & (moved.forward_elements == 0), volume_u[:, None] / volume_v[None, :], 0.0)
    expected_b = np.where(same & (moved.backward_elements == 0), volume_v[None, :] / volume_u[:, None], 0.0)
    assert forward.shape == (space_u.size, space_v.size) and space_u.size > 3
    np.testing.assert_array_equal(forward, expected_f)
    np.testing.assert_array_equal(backward, expected_b)
    # both outcomes on pairs that run on as many devices: the tile rule decides, not the device counts
    assert (forward[same] > 0).any() and (forward[same] == 0).any() and (backward[same] > 0).any()
