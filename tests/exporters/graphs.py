"""Hand-built op graphs for the exporter tests, following the importer's conventions.

The shapes mirror what ``importers.import_model`` produces for the dynamo exports of GPT-2 and Llama
(checked against examples/gpt2.onnx and examples/llama.onnx): Gemm ``m`` split into ``m_0`` (batch)
and ``m_1`` (sequence) with a merged ``[batch*seq, n]`` output, a fused QKV weight split by a
``Split`` op whose split axis is unsplittable, attention reading ``hidden`` as ``heads x head_dim``,
grouped-query attention as ``(groups, rep)`` head dims, the output projection reducing over
``(heads, head_dim)``.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from planner.core.cluster import Cluster, Device, Link
from planner.core.configs import ConfigOptions, ConfigSpace, enumerate_configs
from planner.core.graph import BlockGroup, Edge, IterDim, Op, OpGraph, Tensor, TensorAccess
from planner.core.settings import TrainingSettings
from planner.core.strategy import MemoryBreakdown, Strategy, TimeBreakdown

__all__ = [
    "Builder",
    "gpt_graph",
    "llama_graph",
    "cnn_graph",
    "spaces_for",
    "make_cluster",
    "make_input",
    "first_rows",
    "set_split",
    "pipeline_spec",
]


def _acc(tensor: str, *axes) -> TensorAccess:
    return TensorAccess(tensor=tensor, axes=tuple((a,) if isinstance(a, str) else tuple(a) for a in axes))


def _dim(name: str, size: int, kind: str = "parallel", *, batch: bool = False, splittable: bool = True) -> IterDim:
    return IterDim(name=name, size=size, kind=kind, is_batch=batch, splittable=splittable)


@dataclass
class Builder:
    """Collects tensors and ops; :meth:`build` wires edges from tensor producers."""

    name: str
    tensors: dict[str, Tensor] = field(default_factory=dict)
    ops: list[Op] = field(default_factory=list)

    def t(self, name: str, shape: tuple[int, ...], role: str = "activation") -> str:
        self.tensors[name] = Tensor(name=name, shape=tuple(shape), dtype="float32", role=role)
        return name

    def add(self, name: str, kind: str, op_type: str, dims, inputs, outputs, *, flops: float = 1.0, module: str | None = None) -> int:
        for access in outputs:
            old = self.tensors[access.tensor]
            self.tensors[access.tensor] = Tensor(name=old.name, shape=old.shape, dtype=old.dtype, role=old.role, producer=name)
        self.ops.append(
            Op(name=name, kind=kind, op_type=op_type, dims=tuple(dims), inputs=tuple(inputs), outputs=tuple(outputs), flops=flops, module_path=module, onnx_nodes=(name,))
        )
        return len(self.ops) - 1

    def build(self, blocks: tuple[BlockGroup, ...] = (), bindings: dict[str, int] | None = None) -> OpGraph:
        index = {op.name: i for i, op in enumerate(self.ops)}
        edges = []
        for v, op in enumerate(self.ops):
            for position, access in enumerate(op.inputs):
                producer = self.tensors[access.tensor].producer
                if producer is None:
                    continue
                u = index[producer]
                out = next(i for i, a in enumerate(self.ops[u].outputs) if a.tensor == access.tensor)
                edges.append(Edge(producer=u, consumer=v, tensor=access.tensor, producer_output=out, consumer_input=position))
        return OpGraph(
            name=self.name,
            ops=tuple(self.ops),
            tensors=dict(self.tensors),
            edges=tuple(edges),
            blocks=blocks,
            dim_bindings=dict(bindings or {}),
            source_sha256="ab" * 32,
        )


def _norm(g: Builder, name: str, x: str, B: int, S: int, H: int, module: str, *, bias: bool = True) -> str:
    out = g.t(f"{name}_out", (B, S, H))
    params = [_acc(g.t(f"{module}.weight", (H,), "parameter"), "d2")]
    if bias:
        params.append(_acc(g.t(f"{module}.bias", (H,), "parameter"), "d2"))
    g.add(
        name,
        "norm",
        "LayerNormalization",
        [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", H, "normalized")],
        [_acc(x, "d0", "d1", "d2"), *params],
        [_acc(out, "d0", "d1", "d2")],
        flops=5.0 * B * S * H,
        module=module,
    )
    return out


def _add(g: Builder, name: str, a: TensorAccess, b: TensorAccess, B: int, S: int, H: int, module: str) -> str:
    out = g.t(f"{name}_out", (B, S, H))
    g.add(name, "elementwise", "Add", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", H)], [a, b], [_acc(out, "d0", "d1", "d2")], flops=B * S * H, module=module)
    return out


def _gemm(g: Builder, name: str, x: str, B: int, S: int, K: int, N: int, weight: str, module: str, *, bias: bool, linear_layout: bool) -> str:
    """A Gemm on ``x[B, S, K]`` with a merged ``[B*S, N]`` output (GPT-2 dynamo style)."""
    out = g.t(f"{name}_out", (B * S, N))
    shape = (N, K) if linear_layout else (K, N)
    w = g.t(weight, shape, "parameter")
    inputs = [_acc(x, "m_0", "m_1", "k"), _acc(w, "n", "k") if linear_layout else _acc(w, "k", "n")]
    if bias:
        inputs.append(_acc(g.t(weight.replace("weight", "bias"), (N,), "parameter"), "n"))
    g.add(
        name,
        "matmul",
        "Gemm",
        [_dim("m_0", B, batch=True), _dim("m_1", S), _dim("n", N), _dim("k", K, "reduction")],
        inputs,
        [_acc(out, ("m_0", "m_1"), "n")],
        flops=2.0 * B * S * K * N,
        module=module,
    )
    return out


def gpt_graph(
    *,
    layers: int = 2,
    batch: int = 8,
    seq: int = 16,
    hidden: int = 64,
    heads: int = 4,
    ffn: int = 256,
    vocab: int = 96,
    positions: int = 32,
    linear_layout: bool = False,
    extra_linear: bool = False,
    head_dim: int | None = None,
    biases: str = "all",
) -> OpGraph:
    """A GPT-2 style model: learned positions, fused QKV, LayerNorm, GELU MLP, tied LM head.

    ``linear_layout``: weights stored ``[out, in]`` (``torch.nn.Linear``) instead of GPT-2's Conv1D
    ``[in, out]``. ``extra_linear``: a dense layer between the final norm and the LM head (like
    BERT's MLM transform), which Megatron's GPT model does not have. ``biases``: ``all`` linear
    layers, ``qkv`` projections only (Qwen2) or ``none``.
    """
    B, S, H, A, F, V, P = batch, seq, hidden, heads, ffn, vocab, positions
    hd = head_dim or H // A
    W = A * hd  # attention width (hidden unless head_dim says otherwise)
    g = Builder("gpt")
    wpe = g.t("transformer.wpe.weight", (P, H), "parameter")
    pos = g.t("pos", (1, S, H))
    g.add("pos_emb", "embedding", "Gather", [_dim("i1", S), _dim("d", H), _dim("v", P, "reduction")], [_acc(wpe, "v", "d")], [_acc(pos, (), "i1", "d")], flops=0.0, module="transformer.wpe")
    wte = g.t("lm_head.weight", (V, H), "parameter")
    ids = g.t("input_ids", (B, S), "input")
    x = g.t("h0", (B, S, H))
    g.add(
        "tok_emb",
        "embedding",
        "Gather",
        [_dim("i0", B, batch=True), _dim("i1", S), _dim("d", H), _dim("v", V, "reduction")],
        [_acc(wte, "v", "d"), _acc(ids, "i0", "i1"), _acc(pos, (), "i1", "d")],
        [_acc(x, "i0", "i1", "d")],
        flops=float(B * S * H),
        module="transformer.wte",
    )
    instances = []
    for layer in range(layers):
        p = f"transformer.h.{layer}"
        first = len(g.ops)
        a = _norm(g, f"ln1_{layer}", x, B, S, H, f"{p}.ln_1")
        qkv = _gemm(g, f"qkv_{layer}", a, B, S, H, 3 * W, f"{p}.attn.c_attn.weight", f"{p}.attn.c_attn", bias=biases != "none", linear_layout=linear_layout)
        q, k, v = (g.t(f"{n}_{layer}", (B, S, W)) for n in "qkv")
        g.add(
            f"split_{layer}",
            "slice",
            "Split",
            [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", 3 * W, splittable=False)],
            [_acc(qkv, ("d0", "d1"), "d2")],
            [_acc(q, "d0", "d1", ()), _acc(k, "d0", "d1", ()), _acc(v, "d0", "d1", ())],
            flops=0.0,
            module=f"{p}.attn",
        )
        scores = g.t(f"scores_{layer}", (B, A, S, S))
        g.add(
            f"score_{layer}",
            "matmul",
            "MatMul",
            [_dim("b0", B, batch=True), _dim("b1", A), _dim("m", S), _dim("n", S), _dim("k", hd, "reduction")],
            [_acc(q, "b0", "m", ("b1", "k")), _acc(k, "b0", "n", ("b1", "k"))],
            [_acc(scores, "b0", "b1", "m", "n")],
            flops=2.0 * B * A * S * S * hd,
            module=f"{p}.attn",
        )
        probs = g.t(f"probs_{layer}", (B, A, S, S))
        g.add(
            f"softmax_{layer}",
            "softmax",
            "Softmax",
            [_dim("d0", B, batch=True), _dim("d1", A), _dim("d2", S), _dim("d3", S, "normalized")],
            [_acc(scores, "d0", "d1", "d2", "d3")],
            [_acc(probs, "d0", "d1", "d2", "d3")],
            flops=5.0 * B * A * S * S,
            module=f"{p}.attn",
        )
        ctx = g.t(f"ctx_{layer}", (B, A, S, hd))
        g.add(
            f"value_{layer}",
            "matmul",
            "MatMul",
            [_dim("b0", B, batch=True), _dim("b1", A), _dim("m", S), _dim("n", hd), _dim("k", S, "reduction")],
            [_acc(probs, "b0", "b1", "m", "k"), _acc(v, "b0", "k", ("b1", "n"))],
            [_acc(ctx, "b0", "b1", "m", "n")],
            flops=2.0 * B * A * S * S * hd,
            module=f"{p}.attn",
        )
        proj = g.t(f"proj_{layer}", (B * S, H))
        wo = g.t(f"{p}.attn.c_proj.weight", (H, W) if linear_layout else (W, H), "parameter")
        g.add(
            f"out_{layer}",
            "matmul",
            "Gemm",
            [_dim("m_0", B, batch=True), _dim("m_1", S), _dim("n", H), _dim("k_0", A, "reduction"), _dim("k_1", hd, "reduction")],
            [
                _acc(ctx, "m_0", "k_0", "m_1", "k_1"),
                _acc(wo, "n", ("k_0", "k_1")) if linear_layout else _acc(wo, ("k_0", "k_1"), "n"),
                *([_acc(g.t(f"{p}.attn.c_proj.bias", (H,), "parameter"), "n")] if biases == "all" else []),
            ],
            [_acc(proj, ("m_0", "m_1"), "n")],
            flops=2.0 * B * S * W * H,
            module=f"{p}.attn.c_proj",
        )
        r1 = _add(g, f"add1_{layer}", _acc(proj, ("d0", "d1"), "d2"), _acc(x, "d0", "d1", "d2"), B, S, H, p)
        a2 = _norm(g, f"ln2_{layer}", r1, B, S, H, f"{p}.ln_2")
        f1 = _gemm(g, f"fc1_{layer}", a2, B, S, H, F, f"{p}.mlp.c_fc.weight", f"{p}.mlp.c_fc", bias=biases == "all", linear_layout=linear_layout)
        act = g.t(f"gelu_{layer}", (B, S, F))
        g.add(f"gelu_{layer}", "elementwise", "Gelu", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", F)], [_acc(f1, ("d0", "d1"), "d2")], [_acc(act, "d0", "d1", "d2")], flops=B * S * F, module=f"{p}.mlp.act")
        f2 = _gemm(g, f"fc2_{layer}", act, B, S, F, H, f"{p}.mlp.c_proj.weight", f"{p}.mlp.c_proj", bias=biases == "all", linear_layout=linear_layout)
        x = _add(g, f"add2_{layer}", _acc(r1, "d0", "d1", "d2"), _acc(f2, ("d0", "d1"), "d2"), B, S, H, p)
        instances.append(tuple(range(first, len(g.ops))))
    final = _norm(g, "ln_f", x, B, S, H, "transformer.ln_f")
    if extra_linear:
        dense = _gemm(g, "dense", final, B, S, H, H, "cls.transform.dense.weight", "cls.transform.dense", bias=True, linear_layout=linear_layout)
        final = g.t("dense_view", (B, S, H))
        g.add("dense_act", "elementwise", "Gelu", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", H)], [_acc(dense, ("d0", "d1"), "d2")], [_acc(final, "d0", "d1", "d2")], flops=B * S * H, module="cls.transform")
    logits = g.t("logits", (B, S, V))
    g.add(
        "lm_head",
        "matmul",
        "MatMul",
        [_dim("b0", B, batch=True), _dim("m", S), _dim("n", V), _dim("k", H, "reduction")],
        [_acc(final, "b0", "m", "k"), _acc(wte, "n", "k")],
        [_acc(logits, "b0", "m", "n")],
        flops=2.0 * B * S * H * V,
        module="lm_head",
    )
    return g.build((BlockGroup(name="transformer.h", instances=tuple(instances)),), {"batch": B, "seq": S})


def llama_graph(
    *,
    layers: int = 2,
    batch: int = 8,
    seq: int = 16,
    hidden: int = 128,
    heads: int = 8,
    kv_heads: int = 2,
    ffn: int = 192,
    vocab: int = 96,
    named_weights: bool = True,
    fused_qkv: bool = False,
) -> OpGraph:
    """A Llama style model: RMSNorm, separate (or fused) Q/K/V with grouped-query attention via
    ``(groups, rep)`` head dims, rotary glue ops, SwiGLU MLP, no biases, untied LM head.

    ``named_weights``: weights named by module path and stored ``[out, in]`` (``torch.nn.Linear``);
    otherwise anonymous pre-transposed ``val_N`` weights ``[in, out]`` as the dynamo exporter writes.
    """
    B, S, H, A, G, F, V = batch, seq, hidden, heads, kv_heads, ffn, vocab
    hd, rep = H // A, A // G
    g = Builder("llama")
    counter = iter(range(10_000))

    def linear(name: str, x: TensorAccess, K: int, N: int, module: str) -> str:
        out = g.t(f"{name}_out", (B, S, N))
        if named_weights:
            w = _acc(g.t(f"{module}.weight", (N, K), "parameter"), "n", "k")
        else:
            w = _acc(g.t(f"val_{next(counter)}", (K, N), "parameter"), "k", "n")
        g.add(
            name,
            "matmul",
            "MatMul",
            [_dim("b0", B, batch=True), _dim("m", S), _dim("n", N), _dim("k", K, "reduction")],
            [x, w],
            [_acc(out, "b0", "m", "n")],
            flops=2.0 * B * S * K * N,
            module=module,
        )
        return out

    emb = g.t("model.embed_tokens.weight", (V, H), "parameter")
    ids = g.t("input_ids", (B, S), "input")
    x = g.t("h0", (B, S, H))
    g.add("tok_emb", "embedding", "Gather", [_dim("i0", B, batch=True), _dim("i1", S), _dim("d", H), _dim("v", V, "reduction")], [_acc(emb, "v", "d"), _acc(ids, "i0", "i1")], [_acc(x, "i0", "i1", "d")], flops=0.0, module="model.embed_tokens")
    instances = []
    for layer in range(layers):
        p = f"model.layers.{layer}"
        first = len(g.ops)
        a = _norm(g, f"norm1_{layer}", x, B, S, H, f"{p}.input_layernorm", bias=False)
        xa = _acc(a, "b0", "m", "k")
        if fused_qkv:
            qkv = linear(f"qkv_{layer}", xa, H, (A + 2 * G) * hd, f"{p}.self_attn.qkv_proj")
            q, k, v = (g.t(f"{n}_{layer}", (B, S, w)) for n, w in (("q", A * hd), ("k", G * hd), ("v", G * hd)))
            g.add(
                f"split_{layer}", "slice", "Split",
                [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", (A + 2 * G) * hd, splittable=False)],
                [_acc(qkv, "d0", "d1", "d2")],
                [_acc(q, "d0", "d1", ()), _acc(k, "d0", "d1", ()), _acc(v, "d0", "d1", ())],
                flops=0.0, module=f"{p}.self_attn",
            )
        else:
            q = linear(f"q_{layer}", xa, H, A * hd, f"{p}.self_attn.q_proj")
            k = linear(f"k_{layer}", xa, H, G * hd, f"{p}.self_attn.k_proj")
            v = linear(f"v_{layer}", xa, H, G * hd, f"{p}.self_attn.v_proj")
        qr = g.t(f"qrot_{layer}", (B, A, S, hd))
        g.add(f"rope_q_{layer}", "elementwise", "Mul", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", A), _dim("d3", hd)], [_acc(q, "d0", "d1", ("d2", "d3"))], [_acc(qr, "d0", "d2", "d1", "d3")], flops=B * S * H, module=f"{p}.self_attn")
        kr = g.t(f"krot_{layer}", (B, G, S, hd))
        g.add(f"rope_k_{layer}", "elementwise", "Mul", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", G), _dim("d3", hd)], [_acc(k, "d0", "d1", ("d2", "d3"))], [_acc(kr, "d0", "d2", "d1", "d3")], flops=B * S * G * hd, module=f"{p}.self_attn")
        scores = g.t(f"scores_{layer}", (B, A, S, S))
        head = [_dim("b1_0", G), _dim("b1_1", rep)] if rep > 1 else [_dim("b1_0", G)]
        head_axis = ("b1_0", "b1_1") if rep > 1 else ("b1_0",)
        g.add(
            f"score_{layer}", "matmul", "MatMul",
            [_dim("b0", B, batch=True), *head, _dim("m", S), _dim("n", S), _dim("k", hd, "reduction")],
            [_acc(qr, "b0", head_axis, "m", "k"), _acc(kr, "b0", "b1_0", "n", "k")],
            [_acc(scores, "b0", head_axis, "m", "n")],
            flops=2.0 * B * A * S * S * hd, module=f"{p}.self_attn",
        )
        probs = g.t(f"probs_{layer}", (B, A, S, S))
        g.add(f"softmax_{layer}", "softmax", "Softmax", [_dim("d0", B, batch=True), _dim("d1", A), _dim("d2", S), _dim("d3", S, "normalized")], [_acc(scores, "d0", "d1", "d2", "d3")], [_acc(probs, "d0", "d1", "d2", "d3")], flops=5.0 * B * A * S * S, module=f"{p}.self_attn")
        ctx = g.t(f"ctx_{layer}", (B, A, S, hd))
        g.add(
            f"value_{layer}", "matmul", "MatMul",
            [_dim("b0", B, batch=True), *head, _dim("m", S), _dim("n", hd), _dim("k", S, "reduction")],
            [_acc(probs, "b0", head_axis, "m", "k"), _acc(v, "b0", "k", ("b1_0", "n"))],
            [_acc(ctx, "b0", head_axis, "m", "n")],
            flops=2.0 * B * A * S * S * hd, module=f"{p}.self_attn",
        )
        o = g.t(f"o_{layer}", (B, S, H))
        if named_weights:
            wo = _acc(g.t(f"{p}.self_attn.o_proj.weight", (H, H), "parameter"), "n", ("k_0", "k_1"))
        else:
            wo = _acc(g.t(f"val_{next(counter)}", (H, H), "parameter"), ("k_0", "k_1"), "n")
        g.add(
            f"o_proj_{layer}", "matmul", "MatMul",
            [_dim("b0", B, batch=True), _dim("m", S), _dim("n", H), _dim("k_0", A, "reduction"), _dim("k_1", hd, "reduction")],
            [_acc(ctx, "b0", "k_0", "m", "k_1"), wo],
            [_acc(o, "b0", "m", "n")],
            flops=2.0 * B * S * H * H, module=f"{p}.self_attn.o_proj",
        )
        r1 = _add(g, f"add1_{layer}", _acc(x, "d0", "d1", "d2"), _acc(o, "d0", "d1", "d2"), B, S, H, p)
        a2 = _norm(g, f"norm2_{layer}", r1, B, S, H, f"{p}.post_attention_layernorm", bias=False)
        xa2 = _acc(a2, "b0", "m", "k")
        gate = linear(f"gate_{layer}", xa2, H, F, f"{p}.mlp.gate_proj")
        up = linear(f"up_{layer}", xa2, H, F, f"{p}.mlp.up_proj")
        prod = g.t(f"mul_{layer}", (B, S, F))
        g.add(f"mul_{layer}", "elementwise", "Mul", [_dim("d0", B, batch=True), _dim("d1", S), _dim("d2", F)], [_acc(gate, "d0", "d1", "d2"), _acc(up, "d0", "d1", "d2")], [_acc(prod, "d0", "d1", "d2")], flops=B * S * F, module=f"{p}.mlp")
        down = linear(f"down_{layer}", _acc(prod, "b0", "m", "k"), F, H, f"{p}.mlp.down_proj")
        x = _add(g, f"add2_{layer}", _acc(r1, "d0", "d1", "d2"), _acc(down, "d0", "d1", "d2"), B, S, H, p)
        instances.append(tuple(range(first, len(g.ops))))
    final = _norm(g, "norm_f", x, B, S, H, "model.norm", bias=False)
    linear("lm_head", _acc(final, "b0", "m", "k"), H, V, "lm_head")
    return g.build((BlockGroup(name="model.layers", instances=tuple(instances)),), {"batch": B, "seq": S})


def cnn_graph(*, batch: int = 8) -> OpGraph:
    """A convolution, a ReLU and a fully connected layer: no attention."""
    B = batch
    g = Builder("cnn")
    img = g.t("image", (B, 3, 8, 8), "input")
    w = g.t("conv.weight", (16, 3, 3, 3), "parameter")
    y = g.t("conv_out", (B, 16, 8, 8))
    g.add(
        "conv", "conv", "Conv",
        [_dim("b", B, batch=True), _dim("co", 16), _dim("oh", 8, "spatial"), _dim("ow", 8, "spatial"), _dim("ci", 3, "reduction"), _dim("kh", 3, "reduction", splittable=False), _dim("kw", 3, "reduction", splittable=False)],
        [_acc(img, "b", "ci", (), ()), _acc(w, "co", "ci", "kh", "kw")],
        [_acc(y, "b", "co", "oh", "ow")],
        flops=2.0 * B * 16 * 64 * 27, module="conv",
    )
    r = g.t("relu_out", (B, 16, 8, 8))
    g.add("relu", "elementwise", "Relu", [_dim("d0", B, batch=True), _dim("d1", 16), _dim("d2", 8), _dim("d3", 8)], [_acc(y, "d0", "d1", "d2", "d3")], [_acc(r, "d0", "d1", "d2", "d3")], flops=B * 1024.0, module="relu")
    wf = g.t("fc.weight", (10, 1024), "parameter")
    out = g.t("logits", (B, 10))
    g.add("fc", "matmul", "Gemm", [_dim("m", B, batch=True), _dim("n", 10), _dim("k", 1024, "reduction")], [_acc(r, "m", (), (), ()), _acc(wf, "n", "k")], [_acc(out, "m", "n")], flops=2.0 * B * 10 * 1024, module="fc")
    return g.build((), {"batch": B})


def spaces_for(graph: OpGraph, devices: int, devices_per_node: int | None = None) -> tuple[ConfigSpace, ...]:
    """Every op's configurations on ``devices`` (``divides`` rule)."""
    options = ConfigOptions(devices=devices, devices_per_node=devices_per_node or devices)
    return tuple(enumerate_configs(op, options) for op in graph.ops)


def make_cluster(nodes: int = 1, devices_per_node: int = 8) -> Cluster:
    device = Device(name="test-gpu", peak_flops={"bf16": 1e15, "fp32": 6e13}, memory_bytes=80 * 2**30, memory_bandwidth_bytes_per_s=3e12)
    return Cluster(
        device=device,
        nodes=nodes,
        devices_per_node=devices_per_node,
        intra_link=Link(name="nvlink", bandwidth_bytes_per_s=4.5e11, latency_s=1e-6),
        inter_link=Link(name="ib", bandwidth_bytes_per_s=5e10, latency_s=5e-6),
    )


def make_input(graph, spaces, choice, *, cluster=None, settings=None, **kwargs):
    """A :class:`~exporters.generic.PlanInput` with made-up objective values and breakdowns."""
    from exporters.generic import PlanInput

    strategy = Strategy(
        choice=tuple(int(c) for c in choice),
        time_s=0.125,
        memory_bytes=3.5e9,
        splits={op.name: space.describe(row) for op, space, row in zip(graph.ops, spaces, choice) if space.describe(row)},
        time=TimeBreakdown(compute_s=0.1, intra_op_comm_s=0.01, redistribution_s=0.005, grad_sync_s=0.01),
        memory=MemoryBreakdown(params_bytes=1e9, grads_bytes=1e9, optimizer_bytes=1e9, activations_bytes=4e8, other_bytes=1e8),
    )
    return PlanInput(
        graph=graph,
        cluster=cluster or make_cluster(1, max(1, max(int(s.devices_used[r]) for s, r in zip(spaces, choice)))),
        settings=settings or TrainingSettings(),
        spaces=tuple(spaces),
        strategy=strategy,
        **kwargs,
    )


def first_rows(masks) -> tuple[int, ...]:
    """The first allowed configuration of every op."""
    return tuple(int(np.flatnonzero(mask)[0]) for mask in masks)


def set_split(graph: OpGraph, spaces, choice, op_name: str, factors: dict[str, int], inter: dict[str, int] | None = None) -> tuple[int, ...]:
    """``choice`` with op ``op_name`` switched to the configuration with ``factors``."""
    index = graph.op_index(op_name)
    new = list(choice)
    new[index] = spaces[index].index_of(factors, inter)
    return tuple(new)


def pipeline_spec(
    graph: OpGraph,
    layers_per_stage,
    *,
    devices_per_stage: int,
    micro_batch: int,
    micro_batches: int,
    schedule: str = "1f1b",
    chunks: int = 1,
    settings: TrainingSettings | None = None,
):
    """A :class:`~exporters.generic.PipelineSpec` cutting ``graph``'s blocks into ``layers_per_stage``.

    Ops before the first block go to the first stage, ops after the last block to the last (as
    ``planner.pipeline.layer_structure`` places them); made-up per-stage times and memory.
    """
    from exporters.generic import PipelineSpec, StageSpec

    settings = settings or TrainingSettings()
    starts = sorted(min(inst) for group in graph.blocks for inst in group.instances)
    position = np.searchsorted(np.array(starts), np.arange(len(graph.ops)), side="right") - 1
    last_op = max(max(inst) for group in graph.blocks for inst in group.instances)
    position[np.arange(len(graph.ops)) > last_op] = len(starts) - 1
    position = np.clip(position, 0, None)
    bounds = np.concatenate(([0], np.cumsum(layers_per_stage)))
    stage_of = np.clip(np.searchsorted(bounds, position, side="right") - 1, 0, len(layers_per_stage) - 1)
    stages = tuple(
        StageSpec(
            index=s,
            layers=(int(bounds[s]), int(bounds[s + 1])),
            ops=tuple(int(i) for i in np.flatnonzero(stage_of == s)),
            forward_s=0.01,
            backward_s=0.02,
            grad_sync_s=0.001,
            in_flight=float(len(layers_per_stage) - s),
            memory=MemoryBreakdown(params_bytes=1e9, grads_bytes=1e9, optimizer_bytes=2e9, activations_bytes=5e8, other_bytes=1e8),
        )
        for s in range(len(layers_per_stage))
    )
    return PipelineSpec(
        pp=len(layers_per_stage),
        devices_per_stage=devices_per_stage,
        schedule=schedule,
        chunks=chunks,
        micro_batch=micro_batch,
        micro_batches=micro_batches,
        global_batch=micro_batches * graph.dim_bindings["batch"],
        zero_stage=settings.zero_stage,
        recompute=settings.recompute,
        stages=stages,
        pipeline_s=0.5,
        bubble_s=0.1,
        p2p_s=0.002,
        bubble_fraction=0.2,
    )
