"""Tests of objectives.torch_profile (op -> PyTorch call) and ``planner profile --provider torch-*``.

The mapping tests need no torch: shapes and FLOPs are computed by hand. The profiling tests run
torch on the CPU (``.venv-integration``: tests/integration/test_torch_cpu_profile.py, skipped where torch is missing);
they check counts and where each number comes from, never timing relations.
"""

from __future__ import annotations

import sys

import numpy as np
import pytest

from objectives.profile import ProfileDB, profile_graph
from objectives.torch_profile import TorchCall, call_signature, tensor_view, torch_call
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.graph import IterDim, Op, OpGraph, Tensor, TensorAccess


def _t(name, shape, role="activation", dtype="float32"):
    return Tensor(name=name, shape=shape, dtype=dtype, role=role)


def _a(tensor, *axes):
    return TensorAccess(tensor=tensor, axes=tuple(tuple(a) for a in axes))


def _linear() -> tuple[Op, dict[str, Tensor]]:
    """y[6, 10] = x[6, 8] @ w[8, 10] + bias[10] (a Gemm with its bias)."""
    tensors = {"x": _t("x", (6, 8), "input"), "w": _t("w", (8, 10), "parameter"),
               "bias": _t("bias", (10,), "parameter"), "y": _t("y", (6, 10))}
    op = Op(name="fc", kind="matmul", op_type="Gemm", flops=2.0 * 6 * 10 * 8 + 6 * 10,
            dims=(IterDim(name="m", size=6, is_batch=True), IterDim(name="n", size=10),
                  IterDim(name="k", size=8, kind="reduction")),
            inputs=(_a("x", ["m"], ["k"]), _a("w", ["k"], ["n"]), _a("bias", ["n"])),
            outputs=(_a("y", ["m"], ["n"]),))
    return op, tensors


def _graph() -> OpGraph:
    """fc (Gemm + bias) -> LayerNorm over its 10 features -> Softmax over them; a Conv nobody maps."""
    fc, tensors = _linear()
    tensors.update({"g": _t("g", (10,), "parameter"), "beta": _t("beta", (10,), "parameter"),
                    "z": _t("z", (6, 10)), "p": _t("p", (6, 10))})
    rows = (IterDim(name="r", size=6, is_batch=True), IterDim(name="c", size=10, kind="normalized"))
    norm = Op(name="ln", kind="norm", op_type="LayerNormalization", flops=0.0, dims=rows,
              inputs=(_a("y", ["r"], ["c"]), _a("g", ["c"]), _a("beta", ["c"])), outputs=(_a("z", ["r"], ["c"]),))
    soft = Op(name="sm", kind="softmax", op_type="Softmax", flops=0.0, dims=rows,
              inputs=(_a("z", ["r"], ["c"]),), outputs=(_a("p", ["r"], ["c"]),))
    conv = Op(name="conv", kind="conv", op_type="Conv", flops=1.0, dims=rows,
              inputs=(_a("p", ["r"], ["c"]),), outputs=(_a("p", ["r"], ["c"]),))
    return OpGraph(name="tiny", ops=(fc, norm, soft, conv), tensors=tensors, edges=())


# --------------------------------------------------------------------------------------------------
# The mapping (no torch).


class TestMapping:
    def test_linear_with_bias_split_on_n(self):
        op, tensors = _linear()
        call = torch_call(op, {"n": 2}, tensors=tensors)
        assert call == TorchCall(fn="matmul", shapes=((6, 8), (8, 5), (5,)), name="bias")
        assert call.flops == 2 * 6 * 5 * 8 + 6 * 5  # GEMM on the shard plus the bias add
        assert call.flops == op.flops / 2  # a split on n halves the op's FLOPs exactly

    def test_batched_product_and_elementwise(self):
        tensors = {"q": _t("q", (4, 16, 8)), "k": _t("k", (4, 8, 12)), "s": _t("s", (4, 16, 12)),
                   "u": _t("u", (4, 16, 12)), "v": _t("v", (12,), "parameter")}
        bmm = Op(name="qk", kind="matmul", op_type="MatMul", flops=2.0 * 4 * 16 * 12 * 8,
                 dims=(IterDim(name="b", size=4), IterDim(name="m", size=16), IterDim(name="n", size=12),
                       IterDim(name="d", size=8, kind="reduction")),
                 inputs=(_a("q", ["b"], ["m"], ["d"]), _a("k", ["b"], ["d"], ["n"])),
                 outputs=(_a("s", ["b"], ["m"], ["n"]),))
        call = torch_call(bmm, {"b": 2, "m": 2}, tensors=tensors)
        assert call.shapes == ((2, 8, 8), (2, 8, 12))  # batch 4/2, M 16/2, K 8, N 12
        assert call.flops == 2 * 2 * 8 * 12 * 8 == bmm.flops / 4
        add = Op(name="add", kind="elementwise", op_type="Add", flops=4.0 * 16 * 12,
                 dims=(IterDim(name="b", size=4), IterDim(name="m", size=16), IterDim(name="n", size=12)),
                 inputs=(_a("s", ["b"], ["m"], ["n"]), _a("v", ["n"])), outputs=(_a("u", ["b"], ["m"], ["n"]),))
        call = torch_call(add, {"m": 4}, tensors=tensors)
        assert call == TorchCall(fn="binary", shapes=((4, 4, 12), (12,)), name="add")
        assert call.flops == 4 * 4 * 12  # one add per output element

    def test_norm_softmax_and_unmapped(self):
        graph = _graph()
        tensors = tensor_view(graph)
        fc, norm, soft, conv = graph.ops
        assert torch_call(norm, {"r": 3}, tensors=tensors) == TorchCall(
            fn="layer_norm", shapes=((2, 10), (10,), (10,)), dim=1)
        assert torch_call(soft, {"r": 2}, tensors=tensors) == TorchCall(fn="softmax", shapes=((3, 10),), dim=1)
        assert torch_call(conv, {}, tensors=tensors) == "family conv has no torch mapping"

    def test_signature_follows_call_and_dtype(self):
        op, tensors = _linear()
        half = torch_call(op, {"n": 2}, tensors=tensors)
        assert call_signature(half, "float32") == call_signature(torch_call(op, {"n": 2}, tensors=tensors), "float32")
        assert len({call_signature(half, "float32"), call_signature(half, "bfloat16"),
                    call_signature(torch_call(op, {}, tensors=tensors), "float32")}) == 3


class TestWithoutTorch:
    def test_missing_torch_names_the_install_command(self, tmp_path, monkeypatch):
        monkeypatch.setitem(sys.modules, "torch", None)  # `import torch` now raises ImportError
        graph = _graph()
        spaces = [enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2)) for op in graph.ops]
        with ProfileDB(tmp_path / "p.db") as db, pytest.raises(InputError) as caught:
            profile_graph(graph, spaces, db, provider="torch-cpu")
        assert str(caught.value).startswith("PyTorch is not installed; `pip install torch==2.13.0`")
        assert "\n" not in str(caught.value)

    def test_unknown_provider_and_dtype(self, tmp_path):
        graph = _graph()
        spaces = [enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1)) for op in graph.ops]
        with ProfileDB(tmp_path / "p.db") as db:
            with pytest.raises(InputError, match="unknown provider 'tpu'; use one of: cpu, cuda, torch-cpu, torch-cuda"):
                profile_graph(graph, spaces, db, provider="tpu")
            with pytest.raises(InputError, match="dtype applies to torch providers only"):
                profile_graph(graph, spaces, db, provider="cpu", dtype="bfloat16")
            with pytest.raises(InputError, match="cannot time torch calls in 'int8'"):
                profile_graph(graph, spaces, db, provider="torch-cpu", dtype="int8")


# --------------------------------------------------------------------------------------------------
# Profiling with torch on the CPU.
