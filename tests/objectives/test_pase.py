"""PaSE's cost function against values computed by hand from the paper's formulas."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.pase import PaseParams, all_reduce_flops, pase_config_mask, pase_config_options, pase_node_cost
from objectives.tables import build_cost_model
from planner.core.configs import enumerate_configs
from planner.core.graph import IterDim, Op, Tensor, TensorAccess
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import conv_graph, mlp_chain

R = 10_000 / (16 / 8)  # reference defaults: 10 TFLOP/s, 16 GB/s, 8-byte words -> r = 5000


def ar(words: float, q: int) -> float:
    """AR(words, q) = r * 2(q - 1) * words / q."""
    return R * 2 * (q - 1) * words / q


def pase_model(graph, devices=4, cutoff=4):
    return build_cost_model(
        graph, cluster=make_cluster("v100-32gb", devices=devices), settings=TrainingSettings(),
        config_options=pase_config_options(devices, cutoff=cutoff), cost_model="pase",
    )


def test_r_and_all_reduce():
    assert PaseParams().r == R == 5000.0
    assert all_reduce_flops(100.0, 1, R) == 0.0
    assert all_reduce_flops(100.0, 4, R) == pytest.approx(ar(100, 4))


class TestMLP:
    """x[16, 32] -> fc0 (+ReLU) -> [16, 64] -> fc1 (+ReLU) -> [16, 16] -> fc2 -> [16, 8], p = 4.

    A layer with per-device sizes m, n, k (split f_m, f_n, f_k) and pw fused pointwise ops costs
    3mnk + 3 pw mn + AR(mn, f_k) + AR(mk, f_n) + AR(nk, f_m); an edge 2 r max(0, prod(tgt) - I).
    """

    def choice(self, model, splits):
        return [space.index_of(s) for space, s in zip(model.tables.configs, splits)]

    def test_mixed_strategy(self):
        model = pase_model(mlp_chain())
        splits = [{"m": 4}, {"k": 4}, {"n": 2}]
        # fc0 (m=4): m, n, k = 4, 64, 32; pw = 1
        fc0 = 3 * 4 * 64 * 32 + 3 * 1 * 4 * 64 + ar(64 * 32, 4)  # = 25,344 + 15,360,000
        # fc1 (k=4): 16, 16, 16; pw = 1; forward partial sums of the 16x16 output
        fc1 = 3 * 16 * 16 * 16 + 3 * 1 * 16 * 16 + ar(16 * 16, 4)  # = 13,056 + 1,920,000
        # fc2 (n=2): 16, 4, 16; pw = 0; input-gradient all-reduce of the 16x16 input
        fc2 = 3 * 16 * 4 * 16 + ar(16 * 16, 2)  # = 3,072 + 1,280,000
        # fc0 -> fc1: h0[16, 64] held as (4, 64) tiles on 4 tiles, needed as (16, 16) on 4 tiles:
        # I = 4 * 16, so 256 - 64 = 192 words, twice (forward and backward).
        e0 = 2 * R * (16 * 16 - 4 * 16)  # = 1,920,000
        # fc1 -> fc2: h1[16, 16] whole on both sides (k and n are not axes of it): free.
        e1 = 0.0
        expected = fc0 + fc1 + fc2 + e0 + e1
        assert expected == 20_521_472
        choice = self.choice(model, splits)
        assert model.tables.evaluate(choice)[0] == pytest.approx(expected, rel=1e-12)
        evaluation = model.evaluate(choice)
        assert evaluation.time_unit == "flop-equivalents"
        assert evaluation.time.redistribution_s == pytest.approx(e0, rel=1e-12)
        assert evaluation.time_s == pytest.approx(expected, rel=1e-12)

    def test_data_parallel(self):
        model = pase_model(mlp_chain())
        fc0 = 3 * 4 * 64 * 32 + 3 * 4 * 64 + ar(64 * 32, 4)
        fc1 = 3 * 4 * 16 * 64 + 3 * 4 * 16 + ar(16 * 64, 4)
        fc2 = 3 * 4 * 8 * 16 + ar(8 * 16, 4)
        expected = fc0 + fc1 + fc2  # equal (4, .) tiles everywhere: edges free
        assert expected == 24_039_360
        choice = self.choice(model, [{"m": 4}] * 3)
        assert model.tables.evaluate(choice)[0] == pytest.approx(expected, rel=1e-12)

    def test_cutoff_limits_the_splits(self):
        model = pase_model(mlp_chain(), cutoff=4)
        fc2 = model.tables.configs[2]  # m=16, n=8, k=16: n may split only 2 ways (8/4 >= 4)
        assert set(fc2.factors[:, 1].tolist()) == {1, 2}
        assert int(fc2.devices_used.max()) <= 4
        assert model.config_options.product_rule == "at_most"


class TestConvAndPool:
    def test_conv_is_a_gemm_without_spatial_splits(self):
        graph = conv_graph(b=8, ci=16, co=32, h=32, w=32, kernel=3, stride=1, pad=1)
        model = pase_model(graph)
        space = model.tables.configs[0]
        assert np.all(space.factors[:, 2:4] == 1)  # oh, ow never split
        row = space.index_of({"b": 2, "co": 2})
        # m = b oh ow = 4 * 32 * 32, n = co = 16, k = ci kh kw = 16 * 9 per device
        m, n, k = 4 * 32 * 32, 16, 16 * 9
        expected = 3 * m * n * k + ar(m * k, 2) + ar(n * k, 2)
        assert expected == 2_988_951_552
        assert model.tables.node_time_s[0][row] == pytest.approx(expected, rel=1e-12)

    def test_pooling_halo(self):
        # 2x2 max pool, stride 2: x[4, 8, 16, 16] -> y[4, 8, 8, 8]; split oh = 2. Output per device:
        # 4*8*4*8 = 1024; halo: r * (b/fb)(c/fc) * [(H/fh + R)(W/fw) - (H/fh)(W/fw)] with R = 2.
        dims = (IterDim(name="b", size=4), IterDim(name="c", size=8),
                IterDim(name="oh", size=8, kind="spatial", halo=1, stride=2),
                IterDim(name="ow", size=8, kind="spatial", halo=1, stride=2))
        op = Op(name="pool", kind="pool", op_type="MaxPool", dims=dims, flops=0.0,
                inputs=(TensorAccess(tensor="x", axes=(("b",), ("c",), ("oh",), ("ow",))),),
                outputs=(TensorAccess(tensor="y", axes=(("b",), ("c",), ("oh",), ("ow",))),))
        tensors = {"x": Tensor(name="x", shape=(4, 8, 16, 16), dtype="float32", role="activation"),
                   "y": Tensor(name="y", shape=(4, 8, 8, 8), dtype="float32", role="activation")}
        space = enumerate_configs(op, pase_config_options(4, cutoff=1))
        assert pase_config_mask(op, space).all()
        cost = pase_node_cost(op, space, tensors=tensors, params=PaseParams())
        row = space.index_of({"oh": 2})
        expected = 1024 + R * 4 * 8 * ((8 + 2) * 16 - 8 * 16)
        assert cost.total[row] == pytest.approx(expected, rel=1e-12)
        assert cost.total[space.index_of({"b": 4})] == pytest.approx(4 * 8 * 8 * 2, rel=1e-12)


class TestFlattenContiguity:
    def test_only_contiguous_splits(self):
        dims = (IterDim(name="b", size=4), IterDim(name="c", size=8), IterDim(name="h", size=8))
        op = Op(name="flat", kind="data_movement", op_type="Flatten", dims=dims, flops=0.0, inputs=(), outputs=())
        space = enumerate_configs(op, pase_config_options(8, cutoff=1))
        keep = pase_config_mask(op, space)
        allowed = {tuple(f) for f in space.factors[keep].tolist()}
        assert (2, 1, 1) in allowed and (4, 2, 1) in allowed  # b fully split, then c partly
        assert (2, 2, 1) not in allowed and (1, 2, 1) not in allowed  # a split after a partial one
