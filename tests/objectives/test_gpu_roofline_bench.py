"""Tests of bench/gpu_roofline.py and the op -> PyTorch mapping it takes from objectives.torch_profile.

Shapes are checked against hand-computed shards; the matmul mapping is checked against the
importer's own FLOP count (2 Bt M N K) on the bundled tiny models. The one torch test (forward
output shapes on CPU) is skipped where torch is not installed.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import pytest

from objectives.cluster import get_device
from planner.core.configs import ConfigOptions
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

_ROOT = Path(__file__).resolve().parents[2]
_PATH = _ROOT / "bench" / "gpu_roofline.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_gpu_roofline", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _t(name, shape, role="activation", dtype="float32"):
    return Tensor(name=name, shape=shape, dtype=dtype, role=role)


def _a(tensor, *axes):
    return TensorAccess(tensor=tensor, axes=tuple(tuple(a) for a in axes))


def test_gemm_with_folded_batch_and_bias(bench):
    # GPT-2's c_attn: X[b, s, 768] @ W[768, 2304] + bias, output [b*s, 2304] (m_0 x m_1 folded)
    tensors = {
        "x": _t("x", (4, 32, 48)), "w": _t("w", (48, 96), "parameter"), "bias": _t("bias", (96,), "parameter"),
        "y": _t("y", (128, 96)),
    }
    op = Op(name="gemm", kind="matmul", op_type="Gemm", flops=2.0 * 128 * 96 * 48,
            dims=(IterDim(name="m_0", size=4, is_batch=True), IterDim(name="m_1", size=32),
                  IterDim(name="n", size=96), IterDim(name="k", size=48, kind="reduction")),
            inputs=(_a("x", ["m_0"], ["m_1"], ["k"]), _a("w", ["k"], ["n"]), _a("bias", ["n"])),
            outputs=(_a("y", ["m_0", "m_1"], ["n"]),))
    call = bench.torch_call(op, {"n": 4, "m_0": 2}, tensors=tensors)
    assert call.fn == "matmul" and call.name == "bias"
    assert call.shapes == ((64, 48), (48, 24), (24,))  # M = 2*32, N = 96/4; no batch: plain GEMM
    m, k = call.shapes[0]
    assert 2 * m * k * call.shapes[1][1] == op.flops / 8


def test_grouped_query_attention_scores_fold_group_into_m(bench):
    # Q[b, kv*g, s, d] . K[b, kv, s, d]: dims in both operands are batch, the group dim is M
    tensors = {"q": _t("q", (2, 8, 16, 4)), "k": _t("k", (2, 2, 16, 4)), "s": _t("s", (2, 8, 16, 16))}
    dims = (IterDim(name="b0", size=2), IterDim(name="h0", size=2), IterDim(name="h1", size=4),
            IterDim(name="m", size=16), IterDim(name="n", size=16), IterDim(name="k", size=4, kind="reduction"))
    op = Op(name="qk", kind="matmul", op_type="MatMul", flops=2.0 * 2 * 8 * 16 * 16 * 4, dims=dims,
            inputs=(_a("q", ["b0"], ["h0", "h1"], ["m"], ["k"]), _a("k", ["b0"], ["h0"], ["n"], ["k"])),
            outputs=(_a("s", ["b0"], ["h0", "h1"], ["m"], ["n"]),))
    call = bench.torch_call(op, {"h0": 2}, tensors=tensors)
    assert call.shapes == ((2, 64, 4), (2, 4, 16))  # batch b0 * h0/2 = 2, M = h1 * m = 64
    assert call.name == ""


def test_norm_softmax_embedding_slice_concat(bench):
    tensors = {
        "x": _t("x", (4, 8, 32)), "g": _t("g", (32,), "parameter"), "b": _t("b", (32,), "parameter"),
        "y": _t("y", (4, 8, 32)), "table": _t("table", (100, 32), "parameter"),
        "ids": _t("ids", (4, 8), "input", "int64"), "parts": _t("parts", (4, 8, 16)),
    }
    norm_dims = (IterDim(name="d0", size=4), IterDim(name="d1", size=8), IterDim(name="d2", size=32, kind="normalized"))
    xyz = (["d0"], ["d1"], ["d2"])
    layer = Op(name="ln", kind="norm", op_type="LayerNormalization", flops=0.0, dims=norm_dims,
               inputs=(_a("x", *xyz), _a("g", ["d2"]), _a("b", ["d2"])), outputs=(_a("y", *xyz),))
    assert bench.torch_call(layer, {"d2": 2}, tensors=tensors) == bench.TorchCall(
        fn="layer_norm", shapes=((4, 8, 16), (16,), (16,)), dim=2)
    rms = Op(name="rms", kind="norm", op_type="LayerNormalization", flops=0.0, dims=norm_dims,
             inputs=(_a("x", *xyz), _a("g", ["d2"])), outputs=(_a("y", *xyz),))
    assert bench.torch_call(rms, {"d0": 4}, tensors=tensors).fn == "rms_norm"
    softmax = Op(name="sm", kind="softmax", op_type="Softmax", flops=0.0, dims=norm_dims,
                 inputs=(_a("x", *xyz),), outputs=(_a("y", *xyz),))
    assert bench.torch_call(softmax, {"d1": 2}, tensors=tensors) == bench.TorchCall(
        fn="softmax", shapes=((4, 4, 32),), dim=2)
    lookup = Op(name="emb", kind="embedding", op_type="Gather", flops=0.0,
                dims=(IterDim(name="i0", size=4), IterDim(name="i1", size=8), IterDim(name="d", size=32),
                      IterDim(name="v", size=100, kind="reduction")),
                inputs=(_a("table", ["v"], ["d"]), _a("ids", ["i0"], ["i1"])),
                outputs=(_a("y", ["i0"], ["i1"], ["d"]),))
    # vocabulary-parallel: a quarter of the rows, every index
    assert bench.torch_call(lookup, {"v": 4}, tensors=tensors).shapes == ((25, 32), (4, 8))
    split = Op(name="split", kind="slice", op_type="Split", flops=0.0, dims=norm_dims[:2] + (IterDim(name="d2", size=32),),
               inputs=(_a("x", *xyz),), outputs=(_a("parts", ["d0"], ["d1"], []), _a("parts", ["d0"], ["d1"], [])))
    assert bench.torch_call(split, {"d0": 2}, tensors=tensors) == bench.TorchCall(
        fn="slice", shapes=((2, 8, 32),), widths=(16, 16))
    cat = Op(name="cat", kind="concat", op_type="Concat", flops=0.0, dims=split.dims,
             inputs=(_a("parts", ["d0"], ["d1"], []), _a("parts", ["d0"], ["d1"], []), _a("x", *xyz)),
             outputs=(_a("y", *xyz),))
    assert bench.torch_call(cat, {"d1": 8}, tensors=tensors) == bench.TorchCall(
        fn="concat", shapes=((4, 1, 16), (4, 1, 16)), dim=2)
    conv = Op(name="conv", kind="conv", op_type="Conv", flops=1.0, dims=norm_dims, inputs=(), outputs=())
    assert isinstance(bench.torch_call(conv, {}, tensors=tensors), str)


@pytest.mark.parametrize("model", ["gpt2_tiny", "llama_tiny"])
def test_matmul_shards_carry_the_importers_flops(bench, model):
    from planner.plan import load_graph

    graph = load_graph(_ROOT / "tests" / "data" / f"{model}.onnx", {"batch": 2, "seq": 8})
    options = ConfigOptions(devices=4, devices_per_node=4, max_split_dims=2)
    rows, skipped = bench.shard_rows(graph, options, device=get_device("h100-sxm"), settings=TrainingSettings())
    matmuls = [(row, call) for row, call in rows if row.kind == "matmul" and row.fused_pointwise == 0]
    assert matmuls and not skipped.get("matmul")
    for row, call in matmuls:
        a, b = call.shapes[0], call.shapes[1]
        batch = a[0] if len(a) == 3 else 1
        gemm = 2 * batch * a[-2] * a[-1] * b[-1]  # every split here divides evenly
        if call.name == "bias":  # Gemm's bias: one FLOP per output element, shared by k-splits
            assert gemm < row.flops <= gemm + batch * a[-2] * b[-1], row.call
        else:
            assert gemm == pytest.approx(row.flops, rel=1e-9), row.call


def test_forward_runs_at_the_mapped_shapes_on_cpu(bench):
    torch = pytest.importorskip("torch")
    calls = [
        bench.TorchCall(fn="matmul", shapes=((2, 3, 4), (2, 4, 5))),
        bench.TorchCall(fn="binary", shapes=((3, 4), (4,)), name="add"),
        bench.TorchCall(fn="rms_norm", shapes=((3, 4), (4,)), dim=1),
        bench.TorchCall(fn="embedding", shapes=((10, 4), (2, 3))),
        bench.TorchCall(fn="slice", shapes=((3, 6),), widths=(2, 4)),
    ]
    expected = [[(2, 3, 5)], [(3, 4)], [(3, 4)], [(2, 3, 4)], [(3, 2), (3, 4)]]
    for call, shapes in zip(calls, expected):
        forward, backward = bench.build_call(call, "cpu", "bfloat16")
        assert [tuple(t.shape) for t in forward()] == shapes
        grads = backward()
        assert len(grads) == (1 if call.fn == "embedding" else len(call.shapes))
        assert all(g.dtype == torch.bfloat16 for g in grads)
    assert math.isfinite(bench.time_call(forward, device="cpu", warmup=1, repeats=2))


def test_the_bench_uses_the_librarys_mapping(bench):
    import objectives.torch_profile as library

    assert bench.torch_call is library.torch_call and bench.TorchCall is library.TorchCall
    assert bench.build_call is library.build_call
