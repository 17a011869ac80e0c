""":func:`planner.search.pipeline.widest_split` (each distinct space's ``devices_used`` read once) against the
formula it replaced, op by op: the most devices any op's picked configuration splits over. The points share
their spaces among ops as a stack of layers does, and the ops of one space pick different rows, so a memo
that kept one pick per space (the first, or the last) gives another answer on most of them."""

from __future__ import annotations

from types import SimpleNamespace

import numpy as np
import pytest

from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op
from planner.search.pipeline import widest_split


def _op(sizes: tuple[int, ...]) -> Op:
    dims = tuple(IterDim(name=f"d{i}", size=s, is_batch=i == 0) for i, s in enumerate(sizes))
    return Op(name="op", kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=1.0, dims=dims)


def _spaces(devices: int) -> list:
    """A few real configuration spaces (:func:`enumerate_configs`) of ops of different shapes."""
    options = ConfigOptions(devices=devices, devices_per_node=min(devices, 8), replicate=True)
    shapes = [(64, 128), (32, 256, 512), (16,), (8, 64, 96), (4, 4)]
    return [enumerate_configs(_op(shape), options) for shape in shapes]


def _oracle(point) -> int:
    """The formula before the nineteenth round: every op's ``devices_used`` row, one by one."""
    return max((int(space.devices_used[pick]) for space, pick in zip(point.spaces, point.choice)), default=1)


@pytest.mark.parametrize("seed", range(40))
def test_widest_split_is_the_op_by_op_maximum(seed: int):
    rng = np.random.default_rng(seed)
    spaces = _spaces(int(rng.choice([8, 16, 64])))
    ops = int(rng.integers(1, 60))
    shared = [spaces[int(rng.integers(len(spaces)))] for _ in range(ops)]  # layers share their spaces
    choice = tuple(int(rng.integers(space.size)) for space in shared)
    point = SimpleNamespace(spaces=tuple(shared), choice=choice)
    assert widest_split(point) == _oracle(point)


def test_the_widest_pick_may_be_any_op_of_a_shared_space():
    """One space, three ops: the widest split is the middle op's pick (neither the first's nor the last's)."""
    space = _spaces(16)[1]
    used = space.devices_used
    narrow, wide = int(np.argmin(used)), int(np.argmax(used))
    assert used[wide] > used[narrow]
    point = SimpleNamespace(spaces=(space, space, space), choice=(narrow, wide, narrow))
    assert widest_split(point) == int(used[wide]) == _oracle(point)
    assert widest_split(SimpleNamespace(spaces=(), choice=())) == 1
