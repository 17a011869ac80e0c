"""Each saved tensor charged once, in the dtype it is saved in (objectives.autocast, objectives.memory).

Every expected number is counted by hand from the tiny graphs below: elements x bytes.
"""

from __future__ import annotations

import numpy as np
import pytest

from objectives.autocast import stored_dtypes
from objectives.cluster import make_cluster
from objectives.execution import ExecutionModel
from objectives.memory import shared_saved_operands
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions
from planner.core.graph import IterDim, Op
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import GraphBuilder, _acc, linear

B, C, H, W = 4, 8, 6, 6
ACT = B * C * H * W  # elements of every activation of the conv graph
M, K, N = 16, 32, 8  # tokens, hidden, projection width


def _conv(g: GraphBuilder, name: str, x: str) -> str:
    """A 1x1 convolution ``C -> C`` (keeps the shape), no bias."""
    weight = g.tensor(f"{name}.weight", (C, C, 1, 1), role="parameter")
    out = g.tensor(f"{name}.out", (B, C, H, W))
    dims = (
        IterDim(name="b", size=B, is_batch=True), IterDim(name="co", size=C),
        IterDim(name="oh", size=H, kind="spatial"), IterDim(name="ow", size=W, kind="spatial"),
        IterDim(name="ci", size=C, kind="reduction"),
    )
    g.op(Op(name=name, kind="conv", op_type="Conv", dims=dims,
            inputs=(_acc(x, "b", "ci", "oh", "ow"), _acc(weight, "co", "ci")),
            outputs=(_acc(out, "b", "co", "oh", "ow"),), flops=2.0 * ACT * C))
    return out


def _pointwise(g: GraphBuilder, name: str, op_type: str, *inputs: str) -> str:
    out = g.tensor(f"{name}.out", (B, C, H, W))
    dims = tuple(IterDim(name=d, size=s, is_batch=d == "b") for d, s in zip("bchw", (B, C, H, W)))
    g.op(Op(name=name, kind="elementwise", op_type=op_type, dims=dims,
            inputs=tuple(_acc(x, "b", "c", "h", "w") for x in inputs),
            outputs=(_acc(out, "b", "c", "h", "w"),), flops=float(ACT)))
    return out


def conv_relu_conv():
    """``x -> conv1 -> Relu -> {conv2, conv3} -> Add``: the ReLU's output is read by two convolutions
    (a ResNet stage's first block: the main branch and the downsample read one tensor)."""
    g = GraphBuilder("conv_relu_conv")
    x = g.tensor("x", (B, C, H, W), role="input")
    r = _pointwise(g, "relu", "Relu", _conv(g, "conv1", x))
    _pointwise(g, "add", "Add", _conv(g, "conv2", r), _conv(g, "conv3", r))
    return g.build()


def _fp32_stream(g: GraphBuilder) -> tuple[str, tuple[IterDim, ...]]:
    """``x = a + b`` of two fp32 graph inputs (an fp32 residual stream), and its token dims."""
    a = g.tensor("a", (M, K), role="input")
    b = g.tensor("b", (M, K), role="input")
    x = g.tensor("x", (M, K))
    tokens = (IterDim(name="m", size=M, is_batch=True), IterDim(name="h", size=K))
    g.op(Op(name="stream", kind="elementwise", op_type="Add", dims=tokens, inputs=(_acc(a, "m", "h"), _acc(b, "m", "h")),
            outputs=(_acc(x, "m", "h"),), flops=float(M * K)))
    return x, tokens


def three_projections():
    """An fp32 stream ``x`` (the sum of two fp32 inputs) read by a norm, a product by itself (fp32,
    like the norm) and three projections (q, k, v: bf16 under autocast), then summed."""
    g = GraphBuilder("projections")
    x, tokens = _fp32_stream(g)
    normed = g.tensor("normed", (M, K))
    g.op(Op(name="norm", kind="norm", op_type="LayerNormalization", dims=tokens,
            inputs=(_acc(x, "m", "h"), _acc(g.tensor("norm.weight", (K,), role="parameter"), "h")),
            outputs=(_acc(normed, "m", "h"),), flops=float(5 * M * K)))
    square = g.tensor("square", (M, K))
    g.op(Op(name="square", kind="elementwise", op_type="Mul", dims=tokens, inputs=(_acc(x, "m", "h"), _acc(x, "m", "h")),
            outputs=(_acc(square, "m", "h"),), flops=float(M * K)))
    q, k, v = (linear(g, name, x, ("m", "k"), {"m": M}, N, bias=False, batch_dims=("m",)) for name in "qkv")
    # sums (which keep nothing) read every output, so no op under test writes a graph output
    _sum(g, "sum1", normed, square, K)
    _sum(g, "sum3", _sum(g, "sum2", q, k, N), v, N)
    return g.build()


def _sum(g: GraphBuilder, name: str, x: str, y: str, width: int) -> str:
    out = g.tensor(f"{name}.out", (M, width))
    dims = (IterDim(name="m", size=M, is_batch=True), IterDim(name="n", size=width))
    g.op(Op(name=name, kind="elementwise", op_type="Add", dims=dims, inputs=(_acc(x, "m", "n"), _acc(y, "m", "n")),
            outputs=(_acc(out, "m", "n"),), flops=float(M * width)))
    return out


def activations(graph, *, devices: int = 1, engine: str = "eager", precision: str = "bf16-mixed"):
    """Per op name, the ``(K,)`` saved-activation bytes of each configuration, and the model."""
    model = build_cost_model(
        graph, cluster=make_cluster("h100-sxm", devices=devices),
        settings=TrainingSettings(precision=precision, engine=engine, attention="explicit"),
        config_options=ConfigOptions(devices=devices, devices_per_node=devices),
    )
    return {op.name: d.memory.activations_bytes for op, d in zip(graph.ops, model.op_details)}, model


class TestStoredDtypes:
    def test_autocast_flow(self):
        stored = stored_dtypes(three_projections(), settings=TrainingSettings(),
                               execution=ExecutionModel(engine="eager"))
        # fp32 inputs add to an fp32 stream; the norm computes in fp32; the products write bf16
        assert [stored[t] for t in ("x", "normed", "square", "q.out")] == ["fp32", "fp32", "fp32", "bf16"]

    def test_relu_keeps_the_conv_dtype(self):
        stored = stored_dtypes(conv_relu_conv(), settings=TrainingSettings(), execution=ExecutionModel(engine="eager"))
        assert [stored[t] for t in ("x", "conv1.out", "relu.out", "add.out")] == ["fp32", "bf16", "bf16", "bf16"]

    @pytest.mark.parametrize("engine", ["fused", None])
    def test_no_autocast_is_the_training_precision(self, engine):
        execution = ExecutionModel(engine=engine) if engine else None
        stored = stored_dtypes(three_projections(), settings=TrainingSettings(), execution=execution)
        assert set(stored.values()) == {"bf16"}


class TestConvReluConv:
    """A bf16 tensor kept by a ReLU (its result) and two convolutions is charged once, to the first."""

    def test_one_device(self):
        saved, _ = activations(conv_relu_conv())
        assert saved["conv1"].tolist() == [ACT * 2]  # its bf16 copy of the fp32 image
        assert saved["relu"].tolist() == [ACT * 2]  # its result (threshold_backward reads it), bf16
        assert saved["conv2"].tolist() == [0.0]  # the same stored tensor: charged to the ReLU
        assert saved["conv3"].tolist() == [0.0]

    def test_sharded(self):
        """Per configuration: the ReLU its shard, conv2 and conv3 nothing, whatever their layout
        (module docstring of objectives.memory: a redistributed copy is the edge's, not conv3's)."""
        saved, model = activations(conv_relu_conv(), devices=2)
        names = [op.name for op in model.graph.ops]
        space = model.tables.configs[names.index("relu")]
        split = np.prod(space.factors, axis=1)
        assert saved["relu"].tolist() == pytest.approx((ACT / split * 2).tolist())
        for name in ("conv2", "conv3"):
            space = model.tables.configs[names.index(name)]
            assert space.size > 1
            assert saved[name].tolist() == [0.0] * space.size

    def test_additive(self):
        """The tables still sum to the graph's saved bytes: each tensor once (the image's bf16 copy,
        the ReLU's result), plus the graph output (the Add's) and its fp32 gradient, live when
        backward starts."""
        saved, _ = activations(conv_relu_conv())
        assert sum(float(a[0]) for a in saved.values()) == 2 * ACT * 2 + ACT * (2 + 4)


class TestThreeProjections:
    """An fp32 stream: the fp32 readers share it, each bf16 projection saves its own cast copy."""

    def test_autocast(self):
        saved, _ = activations(three_projections())
        assert saved["norm"].tolist() == [M * K * 4]  # x as stored, fp32
        assert saved["square"].tolist() == [0.0]  # the same fp32 tensor (Mul saves its operands as they are)
        for name in ("q", "k", "v"):
            assert saved[name].tolist() == [M * K * 2]  # one bf16 copy each: autocast does not cache it

    def test_without_autocast(self):
        """Fused engine (bf16 modules, no casts): one bf16 tensor, charged to its first reader."""
        saved, _ = activations(three_projections(), engine="fused")
        assert saved["norm"].tolist() == [M * K * 2]
        assert [saved[n].tolist() for n in ("square", "q", "k", "v")] == [[0.0]] * 4

    def test_fp32_training(self):
        saved, _ = activations(three_projections(), engine="eager", precision="fp32")
        assert saved["norm"].tolist() == [M * K * 4]
        assert [saved[n].tolist() for n in ("square", "q", "k", "v")] == [[0.0]] * 4


class TestSharedSavedOperands:
    def test_recomputed_owner_passes_the_charge_on(self):
        """The first op that *keeps* the tensor pays: a recomputed op that drops it does not."""
        graph = conv_relu_conv()
        conv2, conv3 = graph.ops[2], graph.ops[3]
        dtypes = [(("bf16", "fp32"), ("bf16",))] * 2
        assert shared_saved_operands([conv2, conv3], kept=[([], []), ([0], [])], dtypes=dtypes,
                                     autocast=True) == [(), ()]
        assert shared_saved_operands([conv2, conv3], kept=[([0], []), ([0], [])], dtypes=dtypes,
                                     autocast=True) == [(), (("in", 0),)]


def bn_relu_conv(node_types: tuple[str, ...] = ("BatchNormalization", "Relu")):
    """``x -> conv1 -> BatchNorm+ReLU (one coarse op, as the importer folds it) -> conv2 -> Add``:
    the ReLU's result is the op's output and conv2's saved input, one tensor."""
    g = GraphBuilder("bn_relu_conv")
    x = g.tensor("x", (B, C, H, W), role="input")
    y = _conv(g, "conv1", x)
    out = g.tensor("bn.out", (B, C, H, W))
    dims = tuple(IterDim(name=d, size=s, is_batch=d == "b") for d, s in zip("bchw", (B, C, H, W)))
    g.op(Op(name="bn", kind="norm", op_type="BatchNormalization", dims=dims,
            inputs=(_acc(y, "b", "c", "h", "w"), _acc(g.tensor("bn.scale", (C,), role="parameter"), "c")),
            outputs=(_acc(out, "b", "c", "h", "w"),), flops=float(5 * ACT), fused_pointwise=1,
            onnx_nodes=("bn", "relu"),
            node_types=node_types))
    _pointwise(g, "add", "Add", _conv(g, "conv2", out), out)
    return g.build()


class TestFoldedRelu:
    """A ReLU folded after a BatchNorm keeps its result: the op's output, shared with the next conv."""

    @pytest.mark.parametrize("engine", ["eager", "fused"])
    def test_result_shared(self, engine):
        saved, _ = activations(bn_relu_conv(), engine=engine)
        # eager: the norm's bf16 input (conv1's output) and the ReLU's bf16 result, no allowance
        # (the folded ReLU's tensor is that result); fused: the same two tensors, all bf16
        assert saved["bn"].tolist() == [ACT * 2 + ACT * 2]
        assert saved["conv2"].tolist() == [0.0]

    def test_unrecorded_types_keep_the_allowance(self):
        """Without the folded nodes' types the folded node is anonymous: half a tensor at the
        training precision (EAGER_SAVED_PER_NODE), not shared."""
        saved, _ = activations(bn_relu_conv(node_types=()))
        assert saved["bn"].tolist() == [ACT * 2 + 0.5 * ACT * 2]
        assert saved["conv2"].tolist() == [ACT * 2]


RMS_NODES = ("Pow", "ReduceMean", "Add", "Sqrt", "Reciprocal", "Mul", "Mul")  # HF LlamaRMSNorm, exported
SILU_NODES = ("MatMul", "Sigmoid", "Mul")  # torch.onnx's silu: Mul(x, Sigmoid(x))
GELU_TANH_NODES = ("MatMul", "Mul", "Pow", "Mul", "Add", "Mul", "Tanh", "Add", "Mul")  # GPT-2's gelu_new, by hand


def rms_norm_then_mlp(activation: tuple[str, ...] = SILU_NODES):
    """An fp32 stream ``x`` -> an RMSNorm written out of 7 nodes (weight included) -> ``up``, a
    product with an activation chain folded after it -> a sum (so no op under test writes a graph
    output)."""
    g = GraphBuilder("rms_mlp")
    x, tokens = _fp32_stream(g)
    normed = g.tensor("normed", (M, K))
    g.op(Op(name="rms", kind="norm", op_type="LayerNormalization", dims=tokens,
            inputs=(_acc(x, "m", "h"), _acc(g.tensor("rms.weight", (K,), role="parameter"), "h")),
            outputs=(_acc(normed, "m", "h"),), flops=float(6 * M * K), fused_pointwise=len(RMS_NODES) - 1,
            onnx_nodes=tuple(f"rms{i}" for i in range(len(RMS_NODES))), node_types=RMS_NODES))
    up = g.tensor("up.out", (M, N))
    dims = (IterDim(name="m", size=M, is_batch=True), IterDim(name="n", size=N), IterDim(name="k", size=K, kind="reduction"))
    g.op(Op(name="up", kind="matmul", op_type="MatMul", dims=dims,
            inputs=(_acc(normed, "m", "k"), _acc(g.tensor("up.weight", (K, N), role="parameter"), "k", "n")),
            outputs=(_acc(up, "m", "n"),), flops=2.0 * M * N * K, fused_pointwise=len(activation) - 1,
            onnx_nodes=tuple(f"up{i}" for i in range(len(activation))), node_types=activation))
    _sum(g, "sum", up, up, N)
    return g.build()


class TestEagerFoldedNodes:
    """What autograd keeps for an exporter's decomposed chains under eager, by rule, not allowance."""

    def test_rms_norm(self):
        """The fp32 input (pow and the first mul read it) and the fp32 normalised tensor the weight's
        gradient reads; the statistics are one per row, left out."""
        saved, _ = activations(rms_norm_then_mlp())
        assert saved["rms"].tolist() == [M * K * 4 + M * K * 4]

    def test_silu_is_one_op(self):
        """nn.SiLU saves its input, the product's bf16 pre-activation; the product its bf16 copy
        of the fp32 normalised tensor."""
        saved, _ = activations(rms_norm_then_mlp())
        assert saved["up"].tolist() == [M * K * 2 + M * N * 2]

    def test_hand_written_gelu_keeps_the_allowance(self):
        """gelu_new written out in Python runs node by node: half a tensor per folded node."""
        saved, _ = activations(rms_norm_then_mlp(GELU_TANH_NODES))
        folded = len(GELU_TANH_NODES) - 1
        assert saved["up"].tolist() == [M * K * 2 + M * N * 2 + 0.5 * folded * M * N * 2]

    def test_fused_engine_keeps_no_folded_tensors(self):
        """Without eager (fused kernels, no autocast) neither rule applies: the norm keeps its bf16
        input, the product its bf16 input (the norm's output) and its pre-activation."""
        saved, _ = activations(rms_norm_then_mlp(), engine="fused")
        assert saved["rms"].tolist() == [M * K * 2]
        assert saved["up"].tolist() == [M * K * 2 + M * N * 2]


def conv_pool():
    """``x -> conv1 -> 2x2 MaxPool (stride 2) -> Add``: the pool keeps its input and its argmax."""
    g = GraphBuilder("conv_pool")
    y = _conv(g, "conv1", g.tensor("x", (B, C, H, W), role="input"))
    pooled = g.tensor("pool.out", (B, C, H // 2, W // 2))
    dims = (IterDim(name="b", size=B, is_batch=True), IterDim(name="c", size=C),
            IterDim(name="oh", size=H // 2, kind="spatial", halo=1, stride=2),
            IterDim(name="ow", size=W // 2, kind="spatial", halo=1, stride=2))
    g.op(Op(name="pool", kind="pool", op_type="MaxPool", dims=dims, flops=float(ACT),
            inputs=(_acc(y, "b", "c", "oh", "ow"),), outputs=(_acc(pooled, "b", "c", "oh", "ow"),)))
    out = g.tensor("add.out", (B, C, H // 2, W // 2))
    g.op(Op(name="add", kind="elementwise", op_type="Add", dims=dims[:2] + tuple(
        IterDim(name=d.name, size=d.size, kind="spatial") for d in dims[2:]),
        inputs=(_acc(pooled, "b", "c", "oh", "ow"), _acc(pooled, "b", "c", "oh", "ow")),
        outputs=(_acc(out, "b", "c", "oh", "ow"),), flops=float(ACT // 4)))
    return g.build()


class TestMaxPoolIndices:
    def test_eager_keeps_int64_indices(self):
        """Eager: conv1's bf16 output (its input) and one int64 index per output element."""
        saved, _ = activations(conv_pool())
        assert saved["pool"].tolist() == [ACT * 2 + ACT // 4 * 8]

    def test_fused_keeps_the_input(self):
        saved, _ = activations(conv_pool(), engine="fused")
        assert saved["pool"].tolist() == [ACT * 2]


def test_sharing_is_worked_out_once_per_setting():
    """A stage model built again for the same recomputation and execution model (every ZeRO stage and
    micro-batch of a pipeline search) reads the sharing kept in the graph's facts: the same object."""
    from objectives.graph_facts import _graph_facts, _recompute_flags, _saved_sharing

    graph = three_projections()
    facts = _graph_facts(graph)
    settings = TrainingSettings(engine="fused", attention="flash")
    flags = _recompute_flags(graph, facts, "none")
    first = _saved_sharing(graph, facts, settings, "roofline", *flags)
    assert _saved_sharing(graph, facts, settings, "roofline", *flags) is first
    eager = _saved_sharing(graph, facts, TrainingSettings(engine="eager", attention="flash"), "roofline", *flags)
    assert eager is not first
