"""Hand-built op graphs for cost-model and search tests (no importer needed).

Every builder returns an :class:`~planner.core.graph.OpGraph` whose ops follow the importer's
conventions (DESIGN.md §3): MatMul dims ``b``/``m``, ``n``, ``k`` (reduction); Conv dims ``b``,
``co``, ``oh``, ``ow`` (spatial, with halo and stride), ``ci``/``kh``/``kw`` (reductions, the kernel
ones unsplittable); normalised axes ``normalized``; an embedding's table rows ``v`` a reduction.
Views are folded into access maps (attention reads ``hidden`` as ``heads x head_dim``).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from planner.core.graph import BlockGroup, Edge, IterDim, Op, OpGraph, Tensor, TensorAccess

__all__ = [
    "GraphBuilder",
    "mlp_chain",
    "single_matmul",
    "conv_graph",
    "gpt2_like",
    "GPT2_SMALL_PARAMS",
]

GPT2_SMALL_PARAMS = 124_439_808
"""Parameters of GPT-2 small (tied embeddings counted once)."""


@dataclass
class GraphBuilder:
    """Collects tensors and ops; :meth:`build` wires the edges from tensor producers."""

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)
    aliases: dict[str, str] = field(default_factory=dict)

    def tensor(self, name: str, shape: tuple[int, ...], role: str = "activation", dtype: str = "float32") -> str:
        self.tensors[name] = Tensor(name=name, shape=tuple(shape), dtype=dtype, role=role)
        return name

    def op(self, op: Op) -> int:
        for access in op.outputs:
            tensor = self.tensors[access.tensor]
            self.tensors[access.tensor] = Tensor(
                name=tensor.name, shape=tensor.shape, dtype=tensor.dtype, role=tensor.role, producer=op.name
            )
        self.ops.append(op)
        return len(self.ops) - 1

    def build(self, blocks: tuple[BlockGroup, ...] = ()) -> OpGraph:
        index = {op.name: i for i, op in enumerate(self.ops)}
        edges = []
        for v, op in enumerate(self.ops):
            for position, access in enumerate(op.inputs):
                tensor = self.tensors.get(access.tensor)
                if tensor is None or tensor.producer is None:
                    continue
                u = index[tensor.producer]
                out = next(i for i, a in enumerate(self.ops[u].outputs) if a.tensor == access.tensor)
                edges.append(Edge(producer=u, consumer=v, tensor=access.tensor, producer_output=out, consumer_input=position))
        return OpGraph(
            name=self.name,
            ops=tuple(self.ops),
            tensors=dict(self.tensors),
            edges=tuple(edges),
            blocks=blocks,
            parameter_aliases=dict(self.aliases),
        )


def _acc(tensor: str, *axes) -> TensorAccess:
    return TensorAccess(tensor=tensor, axes=tuple(tuple([a]) if isinstance(a, str) else tuple(a) for a in axes))


def linear(
    g: GraphBuilder,
    name: str,
    x: str,
    x_dims: tuple[str, ...],
    sizes: dict[str, int],
    n: int,
    *,
    out: str | None = None,
    weight: str | None = None,
    bias: bool = True,
    pointwise: int = 0,
    batch_dims: tuple[str, ...] = ("b",),
) -> str:
    """``out[x_dims..., n] = x[x_dims..., k] @ W[k, n] (+ bias)``; returns the output tensor name."""
    k = g.tensors[x].shape[-1]
    lead = x_dims[:-1]
    dims = tuple(IterDim(name=d, size=sizes[d], is_batch=d in batch_dims) for d in lead) + (
        IterDim(name="n", size=n),
        IterDim(name="k", size=k, kind="reduction"),
    )
    w = weight or g.tensor(f"{name}.weight", (k, n), role="parameter")
    inputs = [_acc(x, *lead, "k"), _acc(w, "k", "n")]
    if bias:
        inputs.append(_acc(g.tensor(f"{name}.bias", (n,), role="parameter"), "n"))
    out = out or g.tensor(f"{name}.out", tuple(sizes[d] for d in lead) + (n,))
    tokens = 1
    for d in lead:
        tokens *= sizes[d]
    flops = 2.0 * tokens * n * k + (tokens * n if bias else 0) + pointwise * tokens * n
    g.op(
        Op(
            name=name, kind="matmul", op_type="MatMul", dims=dims, inputs=tuple(inputs),
            outputs=(_acc(out, *lead, "n"),), flops=flops, fused_pointwise=pointwise,
        )
    )
    return out


def single_matmul(m: int = 64, n: int = 32, k: int = 16, *, param: bool = True, x_role: str = "input") -> OpGraph:
    """One MatMul ``y[m, n] = x[m, k] @ w[k, n]`` (``m`` is the batch dim), no bias.

    ``x_role="activation"`` makes ``x`` an activation (with a gradient) that no op produces.
    """
    g = GraphBuilder("matmul")
    g.tensor("x", (m, k), role=x_role)
    g.tensor("w", (k, n), role="parameter" if param else "input")
    g.tensor("y", (m, n))
    g.op(
        Op(
            name="mm", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="m", size=m, is_batch=True), IterDim(name="n", size=n),
                  IterDim(name="k", size=k, kind="reduction")),
            inputs=(_acc("x", "m", "k"), _acc("w", "k", "n")), outputs=(_acc("y", "m", "n"),),
            flops=2.0 * m * n * k,
        )
    )
    return g.build()


def mlp_chain(batch: int = 16, widths: tuple[int, ...] = (32, 64, 16, 8), *, relu: bool = True) -> OpGraph:
    """Fully connected layers ``widths[0] -> widths[1] -> ...`` without biases (PaSE's FC layers).

    Every layer but the last has a fused ReLU (``fused_pointwise=1``) when ``relu``. Ops are ``fc0``,
    ``fc1``...; dims ``m`` (batch), ``n``, ``k``.
    """
    g = GraphBuilder("mlp")
    x = g.tensor("x", (batch, widths[0]), role="input")
    for i, width in enumerate(widths[1:]):
        last = i == len(widths) - 2
        pw = 1 if relu and not last else 0
        x = linear(g, f"fc{i}", x, ("m", "k"), {"m": batch}, width, bias=False, pointwise=pw, batch_dims=("m",))
    return g.build()


def conv_graph(
    b: int = 8, ci: int = 16, co: int = 32, h: int = 32, w: int = 32, *, kernel: int = 3, stride: int = 1, pad: int = 1
) -> OpGraph:
    """One Conv ``y[b, co, oh, ow] = conv(x[b, ci, h, w], w[co, ci, kernel, kernel])`` on a graph input."""
    oh = (h + 2 * pad - kernel) // stride + 1
    ow = (w + 2 * pad - kernel) // stride + 1
    g = GraphBuilder("conv")
    g.tensor("x", (b, ci, h, w), role="input")
    g.tensor("conv.weight", (co, ci, kernel, kernel), role="parameter")
    g.tensor("y", (b, co, oh, ow))
    dims = (
        IterDim(name="b", size=b, is_batch=True),
        IterDim(name="co", size=co),
        IterDim(name="oh", size=oh, kind="spatial", halo=kernel - 1, stride=stride),
        IterDim(name="ow", size=ow, kind="spatial", halo=kernel - 1, stride=stride),
        IterDim(name="ci", size=ci, kind="reduction"),
        IterDim(name="kh", size=kernel, kind="reduction", splittable=False),
        IterDim(name="kw", size=kernel, kind="reduction", splittable=False),
    )
    g.op(
        Op(
            name="conv", kind="conv", op_type="Conv", dims=dims,
            inputs=(_acc("x", "b", "ci", "oh", "ow"), _acc("conv.weight", "co", "ci", "kh", "kw")),
            outputs=(_acc("y", "b", "co", "oh", "ow"),),
            flops=2.0 * b * co * oh * ow * ci * kernel * kernel,
        )
    )
    return g.build()


def _norm(g: GraphBuilder, name: str, x: str, sizes: dict[str, int], hidden: int) -> str:
    out = g.tensor(f"{name}.out", g.tensors[x].shape)
    scale = g.tensor(f"{name}.weight", (hidden,), role="parameter")
    shift = g.tensor(f"{name}.bias", (hidden,), role="parameter")
    dims = (
        IterDim(name="b", size=sizes["b"], is_batch=True),
        IterDim(name="s", size=sizes["s"]),
        IterDim(name="h", size=hidden, kind="normalized"),
    )
    tokens = sizes["b"] * sizes["s"]
    g.op(
        Op(
            name=name, kind="norm", op_type="LayerNormalization", dims=dims,
            inputs=(_acc(x, "b", "s", "h"), _acc(scale, "h"), _acc(shift, "h")),
            outputs=(_acc(out, "b", "s", "h"),), flops=5.0 * tokens * hidden, backward_flops_factor=1.0,
        )
    )
    return out


def _add(g: GraphBuilder, name: str, x: str, y: str, sizes: dict[str, int], hidden: int) -> str:
    out = g.tensor(f"{name}.out", g.tensors[x].shape)
    dims = (
        IterDim(name="b", size=sizes["b"], is_batch=True),
        IterDim(name="s", size=sizes["s"]),
        IterDim(name="n", size=hidden),
    )
    g.op(
        Op(
            name=name, kind="elementwise", op_type="Add", dims=dims,
            inputs=(_acc(x, "b", "s", "n"), _acc(y, "b", "s", "n")), outputs=(_acc(out, "b", "s", "n"),),
            flops=float(sizes["b"] * sizes["s"] * hidden), backward_flops_factor=1.0,
        )
    )
    return out


def _block(g: GraphBuilder, prefix: str, x: str, sizes: dict[str, int], hidden: int, heads: int, ffn: int) -> tuple[str, list[int]]:
    start = len(g.ops)
    b, s = sizes["b"], sizes["s"]
    hd = hidden // heads
    ln1 = _norm(g, f"{prefix}.ln_1", x, sizes, hidden)
    # QKV projection with three outputs; the "which of q/k/v" dim t is never split.
    wqkv = g.tensor(f"{prefix}.attn.c_attn.weight", (hidden, 3 * hidden), role="parameter")
    bqkv = g.tensor(f"{prefix}.attn.c_attn.bias", (3 * hidden,), role="parameter")
    q, k, v = (g.tensor(f"{prefix}.attn.{n}", (b, s, hidden)) for n in "qkv")
    g.op(
        Op(
            name=f"{prefix}.attn.c_attn", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="s", size=s),
                  IterDim(name="t", size=3, splittable=False), IterDim(name="n", size=hidden),
                  IterDim(name="k", size=hidden, kind="reduction")),
            inputs=(_acc(ln1, "b", "s", "k"), _acc(wqkv, "k", ("t", "n")), _acc(bqkv, ("t", "n"))),
            outputs=tuple(_acc(t, "b", "s", "n") for t in (q, k, v)),
            flops=2.0 * b * s * 3 * hidden * hidden + b * s * 3 * hidden,
        )
    )
    scores = g.tensor(f"{prefix}.attn.scores", (b, heads, s, s))
    g.op(
        Op(
            name=f"{prefix}.attn.qk", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="h", size=heads),
                  IterDim(name="s", size=s), IterDim(name="t", size=s),
                  IterDim(name="d", size=hd, kind="reduction")),
            inputs=(_acc(q, "b", "s", ("h", "d")), _acc(k, "b", "t", ("h", "d"))),
            outputs=(_acc(scores, "b", "h", "s", "t"),),
            flops=2.0 * b * heads * s * s * hd + 2.0 * b * heads * s * s, fused_pointwise=2,
        )
    )
    probs = g.tensor(f"{prefix}.attn.probs", (b, heads, s, s))
    g.op(
        Op(
            name=f"{prefix}.attn.softmax", kind="softmax", op_type="Softmax",
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="h", size=heads),
                  IterDim(name="s", size=s), IterDim(name="t", size=s, kind="normalized")),
            inputs=(_acc(scores, "b", "h", "s", "t"),), outputs=(_acc(probs, "b", "h", "s", "t"),),
            flops=5.0 * b * heads * s * s, backward_flops_factor=1.0,
        )
    )
    ctx = g.tensor(f"{prefix}.attn.ctx", (b, s, hidden))
    g.op(
        Op(
            name=f"{prefix}.attn.av", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="b", size=b, is_batch=True), IterDim(name="h", size=heads),
                  IterDim(name="s", size=s), IterDim(name="d", size=hd),
                  IterDim(name="t", size=s, kind="reduction")),
            inputs=(_acc(probs, "b", "h", "s", "t"), _acc(v, "b", "t", ("h", "d"))),
            outputs=(_acc(ctx, "b", "s", ("h", "d")),),
            flops=2.0 * b * heads * s * s * hd,
        )
    )
    proj = linear(g, f"{prefix}.attn.c_proj", ctx, ("b", "s", "k"), sizes, hidden)
    r1 = _add(g, f"{prefix}.add_1", x, proj, sizes, hidden)
    ln2 = _norm(g, f"{prefix}.ln_2", r1, sizes, hidden)
    fc = linear(g, f"{prefix}.mlp.c_fc", ln2, ("b", "s", "k"), sizes, ffn, pointwise=1)
    fc2 = linear(g, f"{prefix}.mlp.c_proj", fc, ("b", "s", "k"), sizes, hidden)
    out = _add(g, f"{prefix}.add_2", r1, fc2, sizes, hidden)
    return out, list(range(start, len(g.ops)))


def gpt2_like(
    *,
    layers: int = 12,
    hidden: int = 768,
    heads: int = 12,
    vocab: int = 50257,
    positions: int = 1024,
    batch: int = 8,
    seq: int = 1024,
    tie: str = "shared",
) -> OpGraph:
    """A GPT-2-shaped op graph: embeddings, ``layers`` transformer blocks, final norm, tied LM head.

    With the defaults its parameters are exactly GPT-2 small's (:data:`GPT2_SMALL_PARAMS`).

    Parameters
    ----------
    tie:
        ``"shared"``: the LM head reads ``wte`` itself; ``"alias"``: it reads ``lm_head.weight``,
        an alias of ``wte`` in ``parameter_aliases`` (no tensor of its own).
    """
    g = GraphBuilder("gpt2-like")
    sizes = {"b": batch, "s": seq}
    ids = g.tensor("input_ids", (batch, seq), role="input", dtype="int64")
    wte = g.tensor("wte", (vocab, hidden), role="parameter")
    wpe = g.tensor("wpe", (positions, hidden), role="parameter")
    tok = g.tensor("tok_emb", (batch, seq, hidden))
    g.op(
        Op(
            name="wte_lookup", kind="embedding", op_type="Gather",
            dims=(IterDim(name="b", size=batch, is_batch=True), IterDim(name="s", size=seq),
                  IterDim(name="d", size=hidden), IterDim(name="v", size=vocab, kind="reduction")),
            inputs=(_acc(ids, "b", "s"), _acc(wte, "v", "d")), outputs=(_acc(tok, "b", "s", "d"),),
            flops=0.0, backward_flops_factor=1.0,
        )
    )
    pos = g.tensor("pos_emb", (seq, hidden))
    g.op(
        Op(
            name="wpe_lookup", kind="embedding", op_type="Gather",
            dims=(IterDim(name="s", size=seq), IterDim(name="d", size=hidden),
                  IterDim(name="p", size=positions, kind="reduction")),
            inputs=(_acc(wpe, "p", "d"),), outputs=(_acc(pos, "s", "d"),),
            flops=0.0, backward_flops_factor=1.0,
        )
    )
    x = g.tensor("emb", (batch, seq, hidden))
    g.op(
        Op(
            name="emb_add", kind="elementwise", op_type="Add",
            dims=(IterDim(name="b", size=batch, is_batch=True), IterDim(name="s", size=seq),
                  IterDim(name="n", size=hidden)),
            inputs=(_acc(tok, "b", "s", "n"), _acc(pos, "s", "n")), outputs=(_acc(x, "b", "s", "n"),),
            flops=float(batch * seq * hidden), backward_flops_factor=1.0,
        )
    )
    instances = []
    for layer in range(layers):
        x, ops = _block(g, f"h.{layer}", x, sizes, hidden, heads, 4 * hidden)
        instances.append(tuple(ops))
    x = _norm(g, "ln_f", x, sizes, hidden)
    head = wte
    if tie == "alias":
        head = "lm_head.weight"
        g.aliases[head] = wte
    logits = g.tensor("logits", (batch, seq, vocab))
    g.op(
        Op(
            name="lm_head", kind="matmul", op_type="MatMul",
            dims=(IterDim(name="b", size=batch, is_batch=True), IterDim(name="s", size=seq),
                  IterDim(name="n", size=vocab), IterDim(name="k", size=hidden, kind="reduction")),
            inputs=(_acc(x, "b", "s", "k"), _acc(head, "n", "k")), outputs=(_acc(logits, "b", "s", "n"),),
            flops=2.0 * batch * seq * vocab * hidden,
        )
    )
    blocks = (BlockGroup(name="h", instances=tuple(instances)),) if layers > 1 else ()
    return g.build(blocks=blocks)
