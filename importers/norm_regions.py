r"""Coarsening stage 5: decomposed normalisations found and made one op each.

A reduction whose statistics flow back, elementwise, into the tensor it reduced (LayerNorm,
RMSNorm, L2 norm as Pow/ReduceMean/Add/Sqrt/Div/Mul chains; softmax as
ReduceMax/Sub/Exp/ReduceSum/Div) becomes one ``norm`` (``softmax``) op over its input's axes, 5
FLOPs per element, reported and profiled as ``LayerNormalization`` (``Softmax``)
(``_find_norm_regions``: a seed reduction, ``_norm_seed``, grown over the elementwise nodes between
it and its input, ``_grow_region``).
"""

from __future__ import annotations

from importers.coarse_model import _DEFAULT_DOMAINS, _Model

_NORM_REDUCES = frozenset({"ReduceMean", "ReduceSum", "ReduceMax", "ReduceL2", "ReduceSumSquare"})


# --------------------------------------------------------------------------------------------
# 5. Decomposed normalisations
# --------------------------------------------------------------------------------------------


def _act_inputs(m: _Model, index: int) -> list[str]:
    return [name for name in m.nodes[index].input if name and m.status.get(name) == "act"]


def _find_norm_regions(m: _Model) -> dict[int, tuple[list[int], str, str]]:
    """Regions of pointwise + reduce nodes that normalise one tensor: first node -> (nodes, seed, y)."""
    regions: dict[int, tuple[list[int], str, str]] = {}
    claimed: set[int] = set()
    compute = set(m.compute)
    for index in m.compute:
        node = m.nodes[index]
        if index in claimed or node.op_type not in _NORM_REDUCES or node.domain not in _DEFAULT_DOMAINS:
            continue
        if not node.input or m.status.get(node.input[0]) != "act":
            continue
        seed = _norm_seed(m, node.input[0], compute)
        found = _grow_region(m, seed, compute, claimed)
        if found is not None:
            nodes, y = found
            claimed.update(nodes)
            regions[min(i for i in nodes if i in compute)] = (nodes, seed, y)
    return regions


def _norm_seed(m: _Model, value: str, compute: set[int]) -> str:
    """Walk back from a reduction's input through single-use pointwise ops and views."""
    for _ in range(8):
        if len(m.consumers.get(value, ())) != 1 or value in m.outputs:
            return value
        source = m.producer.get(value)
        if source is None:
            return value
        index = source[0]
        if index in m.view_nodes:
            if not m.views[value].is_identity:
                return value
            value = m.nodes[index].input[0]
            continue
        rule = m.rules.get(index)
        acts = _act_inputs(m, index)
        if index in compute and rule is not None and rule.pointwise and len(acts) == 1 and m.shape(acts[0]) == m.shape(value):
            value = acts[0]
            continue
        return value
    return value


def _grow_region(m: _Model, seed: str, compute: set[int], claimed: set[int]) -> tuple[list[int], str] | None:
    seed_shape = m.shape(seed)
    if not seed_shape:
        return None
    rank = len(seed_shape)
    values = {seed}
    members: list[int] = []
    pending = [i for i, _ in m.consumers.get(seed, ())]
    visited: set[int] = set()
    while pending and len(members) < 48:
        index = min(pending)
        pending = [i for i in pending if i != index]
        if index in visited or index in claimed:
            continue
        node = m.nodes[index]
        inputs_act = [n for n in node.input if n and m.status.get(n) == "act"]
        if not inputs_act or not all(n in values for n in inputs_act):
            continue
        out = node.output[0] if node.output else ""
        out_shape = m.shape(out)
        ok = False
        if index in m.view_nodes:
            ok = m.views[out].is_identity and out_shape == m.shape(node.input[0])
        elif index in compute:
            rule = m.rules[index]
            if rule.pointwise and out_shape is not None and len(out_shape) == rank:
                ok = all(a == b or a == 1 for a, b in zip(out_shape, seed_shape))
            elif node.op_type in _NORM_REDUCES and node.domain in _DEFAULT_DOMAINS:
                ok = out_shape is not None and len(out_shape) == rank  # keepdims
        if not ok:
            continue
        visited.add(index)
        members.append(index)
        for o in node.output:
            if o:
                values.add(o)
                pending.extend(i for i, _ in m.consumers.get(o, ()))
    if not any(m.nodes[i].op_type in _NORM_REDUCES for i in members):
        return None
    members.sort()
    candidates = [
        m.nodes[i].output[0] for i in reversed(members) if i not in m.view_nodes and m.shape(m.nodes[i].output[0]) == seed_shape
    ]
    for y in candidates[:3]:
        kept = _ancestors_within(m, y, set(members))
        if len(kept) < 3 or not any(m.nodes[i].op_type in _NORM_REDUCES for i in kept):
            continue
        inside = set(kept)
        escapes = False
        for i in kept:
            for o in m.nodes[i].output:
                if not o or o == y:
                    continue
                if o in m.outputs or any(c not in inside for c, _ in m.consumers.get(o, ())):
                    escapes = True
        if not escapes:
            return sorted(kept), y
    return None


def _ancestors_within(m: _Model, value: str, members: set[int]) -> list[int]:
    result: set[int] = set()
    stack = [value]
    while stack:
        v = stack.pop()
        source = m.producer.get(v)
        if source is None or source[0] not in members or source[0] in result:
            continue
        result.add(source[0])
        stack.extend(n for n in m.nodes[source[0]].input if n and m.status.get(n) == "act")
    return sorted(result)
