r"""Shapes that only the graph's structure determines (graph-only files whose shape constants are gone).

When every initializer of a file is external and its data file is absent, the small integer tensors
that Reshape, Slice and Squeeze read are gone too, and ONNX inference stops at the first Reshape. The
dynamo exporter declares most shapes in ``value_info``, but not all: the ``K^T`` of an attention
(``Reshape -> Transpose -> Reshape`` of the keys) and the input of a second LSTM layer are declared
``[?, ?, ?]``. :func:`solve_shapes` recovers such shapes from facts that hold for *any* values of the
missing constants, and nothing else:

* **element counts**: a Reshape keeps the element count; its output rank is the length of its
  shape input (whose own shape is known);
* **op semantics**: unary ops keep the shape, Transpose permutes it, broadcasting binary ops give
  each output dim as the maximum of operand dims that are 1 or equal, MatMul ties ``A[-1]`` to
  ``B[-2]`` and the output's last two dims to ``A[-2]`` and ``B[-1]``, an RNN's input is
  ``[seq, batch, W[2]]`` and its outputs ``[seq, directions, batch, hidden]``;
* **reshape groupings**: where a Reshape lowers the rank of a fully known tensor, its output is one
  of the ways to merge adjacent dims; two such candidate lists meeting at a Transpose usually leave
  one shape (``[4B, S, 16]`` for keys of ``[B, 4, S, 16]``).

Each dim holds the set of values still possible (``None``: anything); facts narrow the sets until
nothing changes, and only dims narrowed to one value are reported. Ambiguity (two consistent
answers) leaves a dim unknown: nothing is guessed. Bounded: a fixed number of passes over the
nodes, and enumerations of candidate combinations capped at ``_MAX_COMBOS``.
"""

from __future__ import annotations

import itertools
import math
from typing import Mapping, Sequence

import onnx

__all__ = ["solve_shapes"]

_MAX_COMBOS = 4096
_MAX_PASSES = 8
_DEFAULT_DOMAINS = ("", "ai.onnx")
_SAME_SHAPE = frozenset(
    {
        "Abs", "Acos", "Asin", "Atan", "Cast", "CastLike", "Ceil", "Cos", "Cosh", "Dropout", "Elu",
        "Erf", "Exp", "Floor", "Gelu", "HardSigmoid", "HardSwish", "Identity", "IsInf", "IsNaN",
        "LayerNormalization", "LeakyRelu", "Log", "LogSoftmax", "Mish", "Neg", "Not", "Reciprocal",
        "Relu", "Round", "Selu", "Sigmoid", "Sign", "Sin", "Sinh", "Softmax", "Softplus", "Softsign",
        "Sqrt", "Tan", "Tanh", "ThresholdedRelu", "Celu", "Clip", "SimplifiedLayerNormalization",
        "RMSNormalization", "InstanceNormalization", "BatchNormalization", "GroupNormalization",
    }
)
_BROADCAST = frozenset(
    {"Add", "Sub", "Mul", "Div", "Pow", "Max", "Min", "Mod", "And", "Or", "Xor", "Equal", "Less",
     "LessOrEqual", "Greater", "GreaterOrEqual", "Where", "PRelu", "BitShift", "Sum", "Mean"}
)
_RNN = frozenset({"LSTM", "GRU", "RNN"})

Dims = list  # list[set[int] | None]


class _State:
    def __init__(self) -> None:
        self.dims: dict[str, Dims] = {}
        self.numel: dict[str, int] = {}
        self.shapes: dict[str, set[tuple[int, ...]]] = {}
        self.changed = False

    def rank(self, name: str) -> int | None:
        dims = self.dims.get(name)
        return None if dims is None else len(dims)

    def set_rank(self, name: str, rank: int) -> None:
        if name and name not in self.dims and rank >= 0:
            self.dims[name] = [None] * rank
            self.changed = True

    def narrow(self, name: str, axis: int, values: set[int] | None) -> None:
        """Intersect a dim's possible values with ``values`` (``None``: no information)."""
        dims = self.dims.get(name)
        if values is None or dims is None or not -len(dims) <= axis < len(dims):
            return
        current = dims[axis]
        new = set(values) if current is None else current & values
        if new != current and new:  # an empty set means contradictory facts: keep what we had
            dims[axis] = new
            self.changed = True

    def get(self, name: str, axis: int) -> set[int] | None:
        dims = self.dims.get(name)
        if dims is None or not -len(dims) <= axis < len(dims):
            return None
        return dims[axis]

    def known(self, name: str) -> tuple[int, ...] | None:
        dims = self.dims.get(name)
        if dims is None or any(d is None or len(d) != 1 for d in dims):
            return None
        return tuple(next(iter(d)) for d in dims)

    def set_numel(self, name: str, value: int | None) -> None:
        if name and value is not None and name not in self.numel:
            self.numel[name] = value
            self.changed = True

    def candidates(self, name: str, shapes: set[tuple[int, ...]]) -> None:
        """Intersect a value's possible full shapes with ``shapes``."""
        rank = self.rank(name)
        shapes = {s for s in shapes if rank is None or len(s) == rank}
        current = self.shapes.get(name)
        new = shapes if current is None else current & shapes
        if new and new != current:
            self.shapes[name] = new
            self.changed = True
            if rank is None:
                self.set_rank(name, len(next(iter(new))))
            for axis in range(len(next(iter(new)))):
                self.narrow(name, axis, {s[axis] for s in new})


def solve_shapes(
    graph: onnx.GraphProto,
    order: Sequence[int],
    known: Mapping[str, tuple[int, ...]],
    partial: Mapping[str, tuple[int | None, ...]],
) -> dict[str, tuple[int, ...]]:
    """Shapes of values that the graph's facts determine (see the module docstring).

    Parameters
    ----------
    graph:
        The model's graph.
    order:
        Node indices in topological order.
    known:
        Concrete shapes already found (inputs, initializers, inferred or folded values).
    partial:
        Declared shapes with ``None`` for unknown dims (``value_info`` under the dim bindings).

    Returns
    -------
    dict
        Value name -> shape, for values not in ``known`` whose every dim is determined.

    Examples
    --------
    A ``[2, 4, 6, 8]`` tensor merged to rank 3 by a Reshape whose target was stripped, transposed,
    and reshaped back to ``[2, 4, 8, 6]``: the middle is ``[8, 6, 8]`` (other merges do not meet).

    >>> from onnx import helper
    >>> nodes = [helper.make_node("Reshape", ["k", "s1"], ["a"]),
    ...          helper.make_node("Transpose", ["a"], ["b"], perm=[0, 2, 1]),
    ...          helper.make_node("Reshape", ["b", "s2"], ["c"])]
    >>> g = helper.make_graph(nodes, "g", [], [])
    >>> solve_shapes(g, [0, 1, 2], {"k": (2, 4, 6, 8), "s1": (3,), "s2": (4,), "c": (2, 4, 8, 6)}, {})
    {'a': (8, 6, 8), 'b': (8, 8, 6)}
    """
    state = _State()
    for name, shape in known.items():
        state.dims[name] = [{int(d)} for d in shape]
        state.numel[name] = math.prod(shape)
    for name, shape in partial.items():
        if name in known:
            continue
        state.dims[name] = [None if d is None else {int(d)} for d in shape]
    nodes = [graph.node[i] for i in order]
    for _ in range(_MAX_PASSES):
        state.changed = False
        for node in itertools.chain(nodes, reversed(nodes)):
            if node.domain in _DEFAULT_DOMAINS:
                _apply(node, state)
        for name in list(state.dims):
            _numel_fact(state, name)
        if not state.changed:
            break
    found = {}
    for name in state.dims:
        if name in known:
            continue
        shape = state.known(name)
        if shape is not None:
            found[name] = shape
    return found


def _apply(node: onnx.NodeProto, state: _State) -> None:
    op = node.op_type
    ins = list(node.input)
    outs = list(node.output)
    if not outs or not outs[0]:
        return
    if op in _SAME_SHAPE and ins and ins[0]:
        _same(state, ins[0], outs[0])
    elif op in _BROADCAST:
        operands = [n for n in (ins[1:] if op == "Where" else ins) if n]
        if op == "Where" and ins and ins[0]:
            operands.append(ins[0])
        _broadcast(state, operands, outs[0])
    elif op == "Transpose" and ins and ins[0]:
        _transpose(state, node, ins[0], outs[0])
    elif op == "MatMul" and len(ins) >= 2:
        _matmul(state, ins[0], ins[1], outs[0])
    elif op == "Reshape" and len(ins) >= 2:
        _reshape(state, ins[0], ins[1], outs[0])
    elif op in _RNN and len(ins) >= 3:
        _rnn(state, node, ins, outs)


def _same(state: _State, a: str, b: str) -> None:
    for src, dst in ((a, b), (b, a)):
        rank = state.rank(src)
        if rank is None:
            continue
        state.set_rank(dst, rank)
        if state.rank(dst) != rank:
            continue
        for axis in range(rank):
            state.narrow(dst, axis, state.get(src, axis))
        state.set_numel(dst, state.numel.get(src))
        if src in state.shapes:
            state.candidates(dst, state.shapes[src])


def _broadcast(state: _State, operands: list[str], out: str) -> None:
    ranks = [state.rank(n) for n in operands]
    if any(r is None for r in ranks) or not operands:
        return
    rank = max(ranks)  # type: ignore[type-var]
    state.set_rank(out, rank)
    if state.rank(out) != rank:
        return
    for axis in range(1, rank + 1):  # from the right
        sets = [state.get(n, -axis) if r >= axis else {1} for n, r in zip(operands, ranks)]
        if all(s is not None for s in sets) and math.prod(len(s) for s in sets) <= _MAX_COMBOS:  # type: ignore[arg-type]
            results = {max(combo) for combo in itertools.product(*sets) if _broadcastable(combo)}  # type: ignore[arg-type]
            state.narrow(out, -axis, results)
        target = state.get(out, -axis)
        if target is None:
            continue
        for j, (name, r) in enumerate(zip(operands, ranks)):
            if r < axis:
                continue
            state.narrow(name, -axis, target | {1})
            others = [s for k, s in enumerate(sets) if k != j]
            if all(s == {1} for s in others):
                state.narrow(name, -axis, target)


def _broadcastable(combo: tuple[int, ...]) -> bool:
    big = {d for d in combo if d != 1}
    return len(big) <= 1


def _transpose(state: _State, node: onnx.NodeProto, a: str, b: str) -> None:
    perm = None
    for attribute in node.attribute:
        if attribute.name == "perm":
            perm = list(attribute.ints)
    rank = state.rank(a) if state.rank(a) is not None else state.rank(b)
    if rank is None:
        return
    if perm is None:
        perm = list(reversed(range(rank)))
    if sorted(perm) != list(range(rank)):
        return
    state.set_rank(a, rank)
    state.set_rank(b, rank)
    if state.rank(a) != rank or state.rank(b) != rank:
        return
    for i, p in enumerate(perm):
        state.narrow(b, i, state.get(a, p))
        state.narrow(a, p, state.get(b, i))
    state.set_numel(b, state.numel.get(a))
    state.set_numel(a, state.numel.get(b))
    if a in state.shapes:
        state.candidates(b, {tuple(s[p] for p in perm) for s in state.shapes[a]})
    if b in state.shapes:
        inverse = [perm.index(i) for i in range(rank)]
        state.candidates(a, {tuple(s[q] for q in inverse) for s in state.shapes[b]})


def _matmul(state: _State, a: str, b: str, y: str) -> None:
    ra, rb = state.rank(a), state.rank(b)
    if ra is None or rb is None or ra < 2 or rb < 2:
        return
    rank = max(ra, rb)
    state.set_rank(y, rank)
    if state.rank(y) != rank:
        return
    for (n1, x1), (n2, x2) in (((a, -1), (b, -2)), ((y, -2), (a, -2)), ((y, -1), (b, -1))):
        state.narrow(n1, x1, state.get(n2, x2))
        state.narrow(n2, x2, state.get(n1, x1))
    # Batch dims broadcast like an elementwise op; a numel that leaves exactly the other operand's
    # batch (every dim > 1, so each of ours is 1 or equal) means equal batch dims.
    for axis in range(3, rank + 1):
        sets = [state.get(n, -axis) if r >= axis else {1} for n, r in ((a, ra), (b, rb))]
        if all(s is not None for s in sets):
            state.narrow(y, -axis, {max(c) for c in itertools.product(*sets) if _broadcastable(c)})  # type: ignore[arg-type]
        target = state.get(y, -axis)
        if target is not None:
            for name, r in ((a, ra), (b, rb)):
                if r >= axis:
                    state.narrow(name, -axis, target | {1})
    for x, other, rx, ro in ((a, b, ra, rb), (b, a, rb, ra)):
        numel = state.numel.get(x)
        core = [state.get(x, -1), state.get(x, -2)]
        batch_other = [state.get(other, -axis) for axis in range(3, ro + 1)]
        if numel is None or rx != ro or any(c is None or len(c) != 1 for c in core):
            continue
        if any(s is None or len(s) != 1 or next(iter(s)) == 1 for s in batch_other):
            continue
        rest = numel // math.prod(next(iter(c)) for c in core)  # type: ignore[arg-type]
        if rest == math.prod(next(iter(s)) for s in batch_other):  # type: ignore[arg-type]
            for axis in range(3, rx + 1):
                state.narrow(x, -axis, state.get(other, -axis))


def _reshape(state: _State, data: str, target: str, out: str) -> None:
    length = state.known(target)
    if length is not None and len(length) == 1:
        state.set_rank(out, length[0])
    state.set_numel(out, state.numel.get(data))
    state.set_numel(data, state.numel.get(out))
    for src, dst in ((data, out), (out, data)):
        shape = state.known(src)
        rank = state.rank(dst)
        if shape is not None and rank is not None and 0 < rank < len(shape):
            state.candidates(dst, set(_groupings(shape, rank)))


def _groupings(shape: tuple[int, ...], rank: int):
    """Every way to merge adjacent dims of ``shape`` into ``rank`` dims."""
    for cuts in itertools.combinations(range(1, len(shape)), rank - 1):
        bounds = (0,) + cuts + (len(shape),)
        yield tuple(math.prod(shape[bounds[i] : bounds[i + 1]]) for i in range(rank))


def _rnn(state: _State, node: onnx.NodeProto, ins: list[str], outs: list[str]) -> None:
    hidden = None
    for attribute in node.attribute:
        if attribute.name == "hidden_size":
            hidden = int(attribute.i)
    x, w = ins[0], ins[1]
    state.set_rank(x, 3)
    if state.rank(x) != 3 or state.rank(w) != 3:
        return
    state.narrow(x, 2, state.get(w, 2))
    directions = state.get(w, 0)
    for h in ins[5:7]:
        if h and state.rank(h) == 3:
            state.narrow(x, 1, state.get(h, 1))
    y = outs[0] if outs else ""
    if y:
        state.set_rank(y, 4)
        if state.rank(y) == 4:
            for (n1, x1), (n2, x2) in (((y, 0), (x, 0)), ((y, 2), (x, 1))):
                state.narrow(n1, x1, state.get(n2, x2))
                state.narrow(n2, x2, state.get(n1, x1))
            state.narrow(y, 1, directions)
            state.narrow(y, 3, {hidden} if hidden else None)
    for state_out in outs[1:3]:
        if state_out:
            state.set_rank(state_out, 3)
            if state.rank(state_out) == 3:
                state.narrow(state_out, 0, directions)
                state.narrow(state_out, 1, state.get(x, 1))
                state.narrow(state_out, 2, {hidden} if hidden else None)


def _numel_fact(state: _State, name: str) -> None:
    """A value of known element count: the combinations of its dims' values that multiply to it."""
    numel = state.numel.get(name)
    dims = state.dims.get(name)
    if numel is None or not dims:
        return
    unknown = [i for i, d in enumerate(dims) if d is None]
    if len(unknown) > 1:
        return
    finite = [i for i, d in enumerate(dims) if d is not None]
    if math.prod(len(dims[i]) for i in finite) > _MAX_COMBOS:
        return
    allowed: list[set[int]] = [set() for _ in dims]
    for combo in itertools.product(*(sorted(dims[i]) for i in finite)):
        product = math.prod(combo)
        values = dict(zip(finite, combo))
        if unknown:
            if product == 0 or numel % product:
                continue
            values[unknown[0]] = numel // product
        elif product != numel:
            continue
        for i, v in values.items():
            allowed[i].add(v)
    if all(allowed):
        for i, values in enumerate(allowed):
            state.narrow(name, i, values)
