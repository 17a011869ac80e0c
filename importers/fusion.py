r"""Coarsening stage 6: nodes grouped into coarse ops by fusing pointwise chains.

``_group``: an elementwise node whose full-size activation inputs all come from one op, and whose
other activation inputs are smaller (broadcast masks, gates), joins that op (bias Add, GELU chains,
scale Mul + mask Add after a MatMul, IsNaN/Where after a Softmax). One that cannot (its input is a
view, like the query scaling after a head split) but has a single input and a single consumer joins
its consumer instead (a prologue); a softmax also takes one with smaller inputs besides (BLOOM's
TorchScript mask ``Add`` on a reshape of its ``baddbmm`` scores: ``_prologue_candidate``).
Elementwise ops joining two full-size activations (residual Adds) stay ops. A decomposed norm
(:mod:`importers.norm_regions`) is one group from the start.
"""

from __future__ import annotations

import math
from typing import Mapping

from onnx import helper

from importers.coarse_model import Axes, _Group, _Model
from importers.fold_views import _context, _origin, _transparent, _users
from importers.norm_regions import _NORM_REDUCES, _act_inputs, _find_norm_regions
from importers.op_rules import RuleResult, axes_of
from importers.op_rules.norm import FLOPS_PER_ELEMENT
from importers.op_rules.reduce import reduced_axes
from planner.core.graph import NodeSpec


# --------------------------------------------------------------------------------------------
# 6. Groups (coarse ops)
# --------------------------------------------------------------------------------------------


def _broadcast_into(shape: tuple[int, ...], out_shape: tuple[int, ...], out_axes: Axes) -> Axes:
    """Axes of an operand broadcast against an output whose axes are ``out_axes``."""
    offset = len(out_shape) - len(shape)
    axes = []
    for i, size in enumerate(shape):
        j = i + offset
        if 0 <= j < min(len(out_shape), len(out_axes)) and size == out_shape[j] and size > 1:
            axes.append(out_axes[j])
        else:
            axes.append(())
    return tuple(axes)


def _region_group(m: _Model, nodes: list[int], seed: str, y: str) -> _Group:
    seed_shape = m.shape(seed) or ()
    normalized: set[int] = set()
    has_exp = False
    for index in nodes:
        node = m.nodes[index]
        has_exp |= node.op_type == "Exp"
        if node.op_type in _NORM_REDUCES:
            ctx = _context(m, index)
            normalized |= reduced_axes(ctx)
    kind = "softmax" if has_exp else "norm"
    from importers.op_rules._base import DimBuilder  # local: only regions build dims here

    dims = DimBuilder()
    names = tuple(
        dims.add(f"d{i}", size, kind="normalized" if i in normalized else "parallel") for i, size in enumerate(seed_shape)
    )
    seed_axes = axes_of(*names)
    value_axes: dict[str, Axes] = {seed: seed_axes}
    extra: list[tuple[str, Axes]] = []
    for index in nodes:
        node = m.nodes[index]
        for o in node.output:
            if o:
                value_axes[o] = _broadcast_into(m.shape(o) or (), seed_shape, seed_axes)
        out_shape = m.shape(node.output[0]) or ()
        out_axes = value_axes.get(node.output[0], ())
        for name in node.input:
            if name and m.status.get(name) == "param":
                extra.append((name, _broadcast_into(m.shape(name) or (), out_shape, out_axes)))
    first = min(normalized) if normalized else len(seed_shape) - 1
    norm_shape = tuple(seed_shape[first:])
    scale = next((shape for name, _ in extra if (shape := m.shape(name)) is not None), norm_shape)
    spec_type = "Softmax" if kind == "softmax" else "LayerNormalization"
    attrs = (helper.make_attribute("axis", first - len(seed_shape)),)
    spec = NodeSpec(
        op_type=spec_type,
        attributes=tuple(a.SerializeToString() for a in attrs),
        input_shapes=(seed_shape,) if kind == "softmax" else (seed_shape, tuple(scale)),
        input_dtypes=(m.dtype(seed),) if kind == "softmax" else (m.dtype(seed), m.dtype(seed)),
        output_shapes=(seed_shape,),
        output_dtypes=(m.dtype(y),),
        opset=max(m.opset, 17),
        input_axes=(seed_axes,) if kind == "softmax" else (seed_axes, _broadcast_into(tuple(scale), seed_shape, seed_axes)),
        output_axes=(seed_axes,),
    )
    result = RuleResult(
        kind=kind,  # type: ignore[arg-type]
        dims=dims.build(),
        inputs=(),
        outputs=(),
        flops=float(FLOPS_PER_ELEMENT * math.prod(seed_shape)),
    )
    return _Group(
        main=min(i for i in nodes if i not in m.view_nodes),
        result=result,
        members=list(nodes),
        value_axes=value_axes,
        extra_inputs=[(seed, seed_axes)] + extra,
        flops=result.flops,
        kind=kind,
        spec_override=spec,
        seed=seed,
    )


class _Grouping:
    """The state of stages 5-6 while the groups are formed (:func:`_group`): the groups so far,
    which group holds each node and produces each value, the deferred prologues."""

    __slots__ = ("m", "groups", "deps", "value_group", "node_group", "deferred", "chain_memo")

    def __init__(self, m: _Model) -> None:
        self.m = m
        self.groups: list[_Group] = []
        self.deps: list[set[int]] = []
        """Per group, the groups it reads from."""
        self.value_group: dict[str, int] = {}
        self.node_group: dict[int, int] = {}
        self.deferred: dict[str, int] = {}
        """Output value -> pointwise node waiting to be fused forward into its consumer."""
        self.chain_memo: dict[str, tuple[str, ...]] = {}

    def source_group(self, name: str) -> int | None:
        return self.value_group.get(_origin(self.m, name))

    def claim(self, gid: int, index: int) -> None:
        self.node_group[index] = gid
        self.groups[gid].members.append(index)
        if index in self.m.view_nodes:
            return
        for o in self.m.nodes[index].output:
            if o:
                self.value_group[o] = gid

    def read(self, gid: int, name: str, axes: Axes) -> None:
        """The group reads ``name`` with ``axes``: absorb a deferred prologue, else an extra input.

        A prologue's own inputs are read the same way, depth first in input order, with an explicit
        stack: a chain of 100,000 single-use pointwise nodes is one prologue chain, deeper than
        Python's recursion limit.
        """
        m, group, deferred = self.m, self.groups[gid], self.deferred
        stack: list[tuple[str, Axes]] = [(name, axes)]
        while stack:
            value, value_axes = stack.pop()
            if value not in deferred:
                group.extra_inputs.append((value, value_axes))
                other = self.source_group(value)
                if other is not None and other != gid:
                    self.deps[gid].add(other)
                continue
            index = deferred.pop(value)
            node = m.nodes[index]
            out_shape = m.shape(value) or ()
            group.value_axes[value] = value_axes
            self.claim(gid, index)
            group.flops += m.rules[index].flops
            group.fused_pointwise += 1
            reads = [
                (input_name, _broadcast_into(m.shape(input_name) or (), out_shape, value_axes))
                for input_name in node.input
                if input_name and m.status.get(input_name) in ("act", "param")
            ]
            stack.extend(reversed(reads))  # popped in input order, as recursion would visit them

    def new_group(self, index: int, result: RuleResult) -> int:
        """A group of its own for node ``index`` (absorbing the prologues it reads)."""
        m = self.m
        node = m.nodes[index]
        value_axes: dict[str, Axes] = {}
        for position, axes in result.outputs:
            if position < len(node.output) and node.output[position]:
                value_axes[node.output[position]] = axes
        gid = len(self.groups)
        self.groups.append(
            _Group(main=index, result=result, members=[], value_axes=value_axes, flops=result.flops, kind=result.kind)
        )
        self.deps.append(set())
        self.claim(gid, index)
        for position, axes in result.inputs:
            name = node.input[position] if position < len(node.input) else ""
            if name in self.deferred:
                self.read(gid, name, axes)  # only a deferred value, which read absorbs
            elif name and m.status.get(name) == "act":
                other = self.source_group(name)
                if other is not None and other != gid:
                    self.deps[gid].add(other)
        return gid

    def add_region(self, nodes: list[int], seed: str, y: str) -> None:
        """A norm region: one group of all its nodes, reading its seed."""
        group = _region_group(self.m, nodes, seed, y)
        members, group.members = group.members, []
        gid = len(self.groups)
        self.groups.append(group)
        self.deps.append(set())
        for member in members:
            self.claim(gid, member)
        seed_group = self.source_group(seed)
        if seed in self.deferred:  # cannot happen (the seed walk passes single-use pointwise ops)
            seed_group = None
        if seed_group is not None:
            self.deps[gid].add(seed_group)

    def fusion_target(self, index: int) -> tuple[int, str] | None:
        return _fusion_target(
            self.m, index, self.groups, self.value_group, self.deps, self.deferred, self.chain_memo, self.node_group
        )

    def fuse(self, index: int, gid: int, source: str) -> None:
        """Fuse pointwise node ``index`` backward into group ``gid``, extending its value ``source``."""
        m = self.m
        group = self.groups[gid]
        node = m.nodes[index]
        source_axes = group.value_axes[source]
        out_shape = m.shape(node.output[0]) or ()
        for o in node.output:
            if o:
                group.value_axes[o] = _broadcast_into(m.shape(o) or (), out_shape, source_axes)
        self.claim(gid, index)
        group.flops += m.rules[index].flops
        group.fused_pointwise += 1
        for name in node.input:
            if not name or m.status.get(name) == "const":
                continue
            origin = _transparent(m, name)
            if self.value_group.get(origin) == gid and origin in group.value_axes:
                continue
            self.read(gid, name, _broadcast_into(m.shape(name) or (), out_shape, source_axes))

    def flush_deferred(self) -> None:
        """Prologues whose consumer did not take them: ops of their own."""
        while self.deferred:
            value, index = min(self.deferred.items(), key=lambda item: item[1])
            del self.deferred[value]
            self.new_group(index, self.m.rules[index])

    def settle_deps(self) -> None:
        """Dependencies from the final membership (prologues may have been placed after their readers)."""
        m = self.m
        for gid, group in enumerate(self.groups):
            reads = [n for n, _ in group.extra_inputs]
            main = m.nodes[group.main]
            if group.spec_override is None:
                reads += [main.input[p] for p, _ in group.result.inputs if p < len(main.input)]
            self.deps[gid] = {
                g for g in (self.source_group(n) for n in reads if n and m.status.get(n) == "act") if g is not None and g != gid
            }


def _group(m: _Model) -> list[_Group]:
    """Stages 5-6: norm regions and pointwise fusion; groups returned in topological order.

    Elementwise nodes fuse *backward* into the op producing their full-size input. One that cannot
    (its input is a view, e.g. the query scaling after a head split) but has a single activation
    input and a single consumer is *deferred* and fused *forward* into its consumer as a prologue.
    """
    regions = _find_norm_regions(m)
    in_region = {i for nodes, _, _ in regions.values() for i in nodes}
    compute = set(m.compute)
    state = _Grouping(m)
    for index in m.compute:
        if index in state.node_group:
            continue
        if index in regions:
            state.add_region(*regions[index])
            continue
        if index in in_region:
            continue
        result = m.rules[index]
        target = state.fusion_target(index) if result.pointwise else None
        if target is not None:
            state.fuse(index, *target)
        elif result.pointwise and _prologue_candidate(m, index, compute):
            state.deferred[m.nodes[index].output[0]] = index
        else:
            state.new_group(index, result)
    state.flush_deferred()
    state.settle_deps()
    return [state.groups[g] for g in _topological_groups(state.groups, state.deps)]


def _prologue_candidate(m: _Model, index: int, compute: set[int]) -> bool:
    """A pointwise node with one full-size activation input and one consumer, which is an op (not a
    view). Only a ``Softmax`` takes one with more activation inputs, each smaller (broadcast: a mask,
    a bias), as a fused scale-mask-softmax kernel does (megatron-core 0.16.1's
    ``FusedScaleMaskSoftmax``, ``megatron/core/fusions/fused_softmax.py``): BLOOM's TorchScript export
    adds its ``[b, 1, s, s]`` causal mask, computed from the ``attention_mask`` input, to a
    ``[b h, s, s] -> [b, h, s, s]`` reshape of the ``baddbmm`` scores, which no op can extend backward
    (the view splits the product's batch axis). Other consumers (a convolution after a
    squeeze-excitation gate, a norm after a position-embedding add) keep such a node as an op, as
    before."""
    node = m.nodes[index]
    outputs = [o for o in node.output if o]
    if not outputs:
        return False
    out_shape = m.shape(outputs[0])
    acts = _act_inputs(m, index)
    full = [name for name in acts if m.shape(name) == out_shape]
    if len(full) != 1:
        return False
    used = [o for o in outputs if m.consumers.get(o) or o in m.outputs]
    if used != [outputs[0]] or outputs[0] in m.outputs:
        return False
    users = m.consumers.get(outputs[0], [])
    if len({i for i, _ in users}) != 1 or users[0][0] not in compute:
        return False
    others = [name for name in acts if name != full[0]]
    if not others:
        return True
    smaller = out_shape is not None and all(
        (shape := m.shape(name)) is not None and math.prod(shape) < math.prod(out_shape) for name in others
    )
    return smaller and m.nodes[users[0][0]].op_type == "Softmax"


def _topological_groups(groups: list[_Group], deps: list[set[int]]) -> list[int]:
    """Group ids in dependency order, ties broken by the main node's position (file order)."""
    import heapq

    users: list[list[int]] = [[] for _ in groups]
    indegree = [0] * len(groups)
    for gid, sources in enumerate(deps):
        for source in sources:
            users[source].append(gid)
            indegree[gid] += 1
    ready = [(groups[g].main, g) for g in range(len(groups)) if indegree[g] == 0]
    heapq.heapify(ready)
    order: list[int] = []
    while ready:
        _, gid = heapq.heappop(ready)
        order.append(gid)
        for user in users[gid]:
            indegree[user] -= 1
            if indegree[user] == 0:
                heapq.heappush(ready, (groups[user].main, user))
    if len(order) < len(groups):  # cannot happen (fusion refuses cycles); keep every op regardless
        placed = set(order)
        order += [g for g in range(len(groups)) if g not in placed]
    return order


def _depends_on(deps: list[set[int]], start: int, target: int) -> bool:
    stack, seen = [start], {start}
    while stack:
        gid = stack.pop()
        if gid == target:
            return True
        for source in deps[gid]:
            if source not in seen:
                seen.add(source)
                stack.append(source)
    return False


def _fusion_target(
    m: _Model,
    index: int,
    groups: list[_Group],
    value_group: dict[str, int],
    deps: list[set[int]],
    deferred: Mapping[str, int],
    chain_memo: dict[str, tuple[str, ...]],
    node_group: Mapping[int, int],
) -> tuple[int, str] | None:
    """The group an elementwise node fuses into, with the full-size input it extends."""
    node = m.nodes[index]
    out_shape = m.shape(node.output[0]) if node.output else None
    if out_shape is None:
        return None
    out_numel = math.prod(out_shape)
    gid: int | None = None
    source: str | None = None
    others: list[str] = []
    chains: list[str] = []
    for name in node.input:
        if not name or m.status.get(name) != "act":
            continue
        if name in deferred:
            chains.append(name)
            continue  # a prologue chain: absorbed along with this node
        origin = _transparent(m, name)
        g = value_group.get(origin) if origin not in m.views else None
        shape = m.shape(origin)
        if g is not None and shape == out_shape and origin in groups[g].value_axes:
            if gid is not None and gid != g:
                return None
            gid, source = g, source or origin
        elif shape is not None and math.prod(shape) < out_numel:
            others.append(name)  # a broadcast operand (mask, gate): read as an extra input
        else:
            return None  # a second full-size activation: a residual join stays its own op
    if gid is None or source is None:
        return None
    for name in chains:
        others.extend(_chain_sources(m, name, deferred, chain_memo))
    group = groups[gid]
    if group.kind == "opaque":
        return None
    for name in others:
        other = value_group.get(_origin(m, name))
        if other is not None and other != gid and _depends_on(deps, other, gid):
            return None  # fusing would make the op read its own descendant
    for name in node.input:
        origin = _transparent(m, name) if name else ""
        if not name or value_group.get(origin) != gid:
            continue
        for user in _users(m, origin):
            # node_group, not set(group.members): a set per call is quadratic in a long fused chain
            if user == index or node_group.get(user) == gid:
                continue
            rule = m.rules.get(user)
            if rule is None or not rule.pointwise:
                return None
    return gid, source


def _chain_sources(m: _Model, value: str, deferred: Mapping[str, int], memo: dict[str, tuple[str, ...]]) -> tuple[str, ...]:
    """Activation inputs read by the deferred prologue chain that ends at ``value``.

    ``memo`` keeps each deferred value's answer: a chain's sources never change while it is
    deferred (every member has one consumer, the next member), and without it asking at each link
    of an n-node chain walks it n times (a 20,000-node Relu chain took minutes).
    """
    path: list[str] = []
    stack = [value]
    found: list[str] = []
    while stack:
        current = stack.pop()
        if current in memo:
            found.extend(memo[current])
            continue
        path.append(current)
        for name in _act_inputs(m, deferred[current]):
            (stack if name in deferred else found).append(name)
    result = tuple(found)
    if len(path) == 1 or all(len(_act_inputs(m, deferred[v])) == 1 for v in path):
        # A linear chain (prologues have one activation input): every link has the same sources.
        for current in path:
            memo[current] = result
    return result
