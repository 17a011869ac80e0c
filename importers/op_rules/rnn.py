r"""Recurrent layers: LSTM, GRU, RNN.

``X[seq, batch, input]`` (``layout=0``; ``[batch, seq, input]`` for ``layout=1``) with weights
``W[dirs, G*h, input]``, ``R[dirs, G*h, h]``, ``B[dirs, 2*G*h]`` (``G`` = 4 gates for LSTM, 3 for
GRU, 1 for RNN). Dims: ``t`` (time: the recurrence, never split), ``dir`` (directions, independent),
``b`` (batch), ``gate`` (never split), ``h`` (hidden units), and two reductions: ``i`` (the input
features of ``W``) and ``hr`` (the previous hidden state read by ``R``; splitting ``h`` means every
step all-gathers the state, which the ``hr`` reduction prices as a partial-sum all-reduce).

FLOPs per time step, direction and sample: ``2 G h (input + h)`` for the two gate GEMMs plus
``4 G h`` for biases, activations and the cell update. Backward: 2x forward.
"""

from __future__ import annotations

from importers.op_rules._base import DimBuilder, NodeContext, RuleResult, axes_of

__all__ = ["rnn_rule", "GATES"]

GATES = {"LSTM": 4, "GRU": 3, "RNN": 1}


def rnn_rule(ctx: NodeContext) -> RuleResult:
    """LSTM / GRU / RNN (see module docstring).

    Examples
    --------
    >>> ctx = NodeContext(name="l", op_type="LSTM", attrs={"hidden_size": 32},
    ...                   input_shapes=((10, 4, 16), (1, 128, 16), (1, 128, 32), (1, 256)),
    ...                   output_shapes=((10, 1, 4, 32), (1, 4, 32), (1, 4, 32)))
    >>> r = rnn_rule(ctx)
    >>> [(d.name, d.splittable) for d in r.dims]
    [('t', False), ('b', True), ('gate', False), ('h', True), ('i', True), ('hr', True)]
    >>> r.flops == 10 * 4 * (2 * 4 * 32 * (16 + 32) + 4 * 4 * 32)
    True
    """
    x = ctx.shape(0) or ()
    w = ctx.shape(1) or ()
    gates = GATES.get(ctx.op_type, 1)
    layout = int(ctx.attr("layout", 0))
    seq, batch = (x[1], x[0]) if layout else (x[0], x[1])
    features = x[2] if len(x) > 2 else 1
    directions = w[0] if w else 1
    hidden = int(ctx.attr("hidden_size", (w[1] // gates) if len(w) > 1 else 1))
    dims = DimBuilder()
    t = dims.add("t", seq, splittable=False)
    d = dims.add("dir", directions)
    b = dims.add("b", batch)
    g = dims.add("gate", gates, splittable=False)
    h = dims.add("h", hidden)
    i = dims.add("i", features, kind="reduction")
    hr = dims.add("hr", hidden, kind="reduction")
    x_axes = axes_of(b, t, i) if layout else axes_of(t, b, i)
    inputs = [(0, x_axes), (1, axes_of(d, (g, h), i)), (2, axes_of(d, (g, h), hr))]
    if ctx.shape(3) is not None:
        inputs.append((3, axes_of(d, None)))
    state = axes_of(b, d, h) if layout else axes_of(d, b, h)
    for position in (5, 6):
        if ctx.shape(position) is not None:
            inputs.append((position, state))
    y_axes = axes_of(b, t, d, h) if layout else axes_of(t, d, b, h)
    outputs = []
    for j, shape in enumerate(ctx.output_shapes):
        if shape is not None:
            outputs.append((j, y_axes if j == 0 else state))
    flops = float(seq * directions * batch * (2 * gates * hidden * (features + hidden) + 4 * gates * hidden))
    return RuleResult(
        kind="rnn",
        dims=dims.build(),
        inputs=tuple(inputs),
        outputs=tuple(outputs),
        flops=flops,
        backward_flops_factor=2.0,
    )
