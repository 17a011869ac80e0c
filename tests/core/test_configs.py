"""Configuration enumeration (planner.core.configs) against a brute-force oracle."""

from __future__ import annotations

import itertools
import math

import pytest

from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op


def _op(*sizes: int) -> Op:
    dims = tuple(IterDim(name=f"d{i}", size=s) for i, s in enumerate(sizes))
    return Op(name="op", kind="elementwise", op_type="Add", inputs=(), outputs=(), flops=0.0, dims=dims)


def test_a_scalar_op_has_one_replicated_configuration():
    # an op over a 0-d tensor (a loss scalar, a custom op's scalar output) has no dim to split
    space = enumerate_configs(_op(), ConfigOptions(devices=8, devices_per_node=8))
    assert space.size == 1 and space.factors.shape == (1, 0) and space.inter_factors.shape == (1, 0)


@pytest.mark.parametrize("sizes", [(6, 4), (12,), (1, 8, 3), (7, 5)])
@pytest.mark.parametrize("devices, per_node", [(8, 8), (12, 4), (6, 6)])
def test_single_level_rows_are_every_divisor_combination_dividing_the_devices(sizes, devices, per_node):
    # oracle: each dim split by a divisor of its size, the product divides the devices and either
    # fits in one node or fills whole nodes
    options = ConfigOptions(devices=devices, devices_per_node=per_node)
    space = enumerate_configs(_op(*sizes), options)
    expected = {
        combo
        for combo in itertools.product(*(range(1, s + 1) for s in sizes))
        if all(s % f == 0 for s, f in zip(sizes, combo))
        and devices % math.prod(combo) == 0
        and (math.prod(combo) <= per_node or math.prod(combo) % per_node == 0)
    }
    assert {tuple(int(f) for f in row) for row in space.factors} == expected
    assert tuple(space.factors[0]) == (1,) * len(sizes)
