"""Every row of a configuration space, in order, against a row-by-row oracle (h32a, issue 22).

``planner.core.configs._enumerate_factors`` builds its tables from per-combination blocks kept across ops and
options (``_combination_rows``); the oracle below lists the rows one at a time from the rules the module docstring
gives (a combination's redundant copies innermost, and outermost too for an op without a batch dim, before its idle
placements; inter-node parts that fill whole nodes; the ``dp x cp x tp`` widening of a named sequence dim), with
``itertools`` and none of the module's helpers, and the two must agree to the element and in order, on random ops
and options, the memos cleared before each space."""

from __future__ import annotations

import itertools
import math
import random

import numpy as np
import pytest

from planner.core import configs
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, Op


def _divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


def _fills(combo: tuple[int, ...], per_node: int) -> list[tuple[int, ...]]:
    """Inter-node parts of ``combo`` on nodes of ``per_node`` devices, in product order."""
    total = math.prod(combo)
    if total <= per_node:
        return [(1,) * len(combo)]
    if total % per_node:
        return []
    return [e for e in itertools.product(*(_divisors(f) for f in combo)) if math.prod(e) == total // per_node]


def _dim_choices(dim: IterDim, options: ConfigOptions) -> list[int]:
    if not dim.splittable or dim.size <= 1:
        return [1]
    exact = [e for e in _divisors(dim.size) if e == 1 or (e <= options.devices and dim.size // e >= options.min_tile)]
    if not options.pad or dim.is_batch:
        return exact
    padded = [e for e in _divisors(options.devices) if dim.size % e and dim.size >= 1024
              and -(-dim.size // e) * e - dim.size <= 0.01 * dim.size and dim.size // e >= options.min_tile]
    return sorted(set(exact) | set(padded))


def _oracle(op: Op, options: ConfigOptions, replicate: bool) -> tuple[list, list, list]:
    per_node = min(options.devices, options.devices_per_node)
    sequence = [not d.is_batch and d.kind == "parallel" and d.splittable and (op.name, d.name) in options.context_dims
                for d in op.dims] if options.context_dims and options.max_split_dims == 2 else []
    wide = any(sequence) and any(d.is_batch for d in op.dims)
    replicate = replicate and options.product_rule == "divides"
    outermost = not any(d.is_batch for d in op.dims)
    factors, inter, copies = [], [], []
    for combo in itertools.product(*(_dim_choices(d, options) for d in op.dims)):
        total = math.prod(combo)
        split = [f > 1 for f in combo]
        if total > options.devices or (options.product_rule == "divides" and options.devices % total):
            continue
        three = wide and sum(split) == 3 and any(s and d.is_batch for s, d in zip(split, op.dims)) \
            and sum(s and q for s, q in zip(split, sequence)) == 1
        if options.max_split_dims is not None and sum(split) > options.max_split_dims and not three:
            continue
        rows = []
        if replicate and total < options.devices:
            count = options.devices // total
            placed = _fills((*combo, count), per_node)
            if placed:
                ends = {min(e[-1] for e in placed), max(e[-1] for e in placed) if outermost else min(e[-1] for e in placed)}
                rows += [(e[:-1], (count, e[-1])) for e in placed if e[-1] in ends]
        rows += [(e, (1, 1)) for e in _fills(combo, per_node)]
        for e, c in rows:
            if three:  # the third dim inside a node, no copies across nodes
                others = [i for i, d in enumerate(op.dims) if not d.is_batch and not sequence[i]]
                if any(e[i] > 1 for i in others) or (replicate and c[1] > 1):
                    continue
            factors.append(combo)
            inter.append(e)
            copies.append(c)
    return factors, inter, copies


def _random_op(rng: random.Random) -> Op:
    dims = []
    for i in range(rng.randint(0, 4)):
        dims.append(IterDim(name=f"d{i}", size=rng.choice([1, 2, 3, 4, 6, 8, 12, 16, 24, 64, 1030, 2048]),
                            is_batch=i == 0 and rng.random() < 0.6, splittable=rng.random() < 0.9,
                            kind=rng.choice(["parallel", "parallel", "reduction"])))
    kind = rng.choice(["elementwise", "matmul", "norm"])
    return Op(name=f"op{rng.randint(0, 3)}", kind=kind, op_type="X", inputs=(), outputs=(), flops=0.0, dims=tuple(dims))


@pytest.mark.parametrize("seed", range(60))
def test_the_rows_are_the_oracles_in_order(seed: int):
    rng = random.Random(seed)
    for _ in range(12):
        op = _random_op(rng)
        devices = rng.choice([1, 2, 4, 8, 16, 32, 64, 128, 96])
        per_node = rng.choice([4, 8]) if devices % 8 == 0 else devices
        named = frozenset((f"op{k}", f"d{j}") for k in range(4) for j in range(4) if rng.random() < 0.5)
        options = ConfigOptions(devices=devices, devices_per_node=per_node, product_rule=rng.choice(["divides", "at_most"]),
                                max_split_dims=rng.choice([None, 1, 2, 2]), pad=rng.random() < 0.3,
                                replicate=rng.random() < 0.7, context_dims=named if rng.random() < 0.6 else frozenset(),
                                min_tile=rng.choice([1, 1, 2]))
        configs._ENUMERATED.clear()
        space = enumerate_configs(op, options)
        factors, inter, copies = _oracle(op, options, options.replicate and op.kind not in configs.HEAVY_KINDS)
        n = len(op.dims)
        assert space.factors.tolist() == np.array(factors, dtype=np.int64).reshape(len(factors), n).tolist()
        assert space.inter_factors.tolist() == np.array(inter, dtype=np.int64).reshape(len(inter), n).tolist()
        if space.replicas is not None:
            assert list(zip(space.replicas.tolist(), space.inter_replicas.tolist())) == copies
        else:
            assert all(c == (1, 1) for c in copies)
        assert not space.factors.flags.writeable and not space.inter_factors.flags.writeable
