"""Smoke tests of bench/cost_model.py's pure functions (the measured-vs-roofline table's arithmetic).

Nothing here times anything: the calibration benchmarks and the profile database are not run.
"""

from __future__ import annotations

import importlib.util
import math
import sys
from pathlib import Path

import numpy as np
import pytest
import yaml

from objectives.cluster import load_cluster
from objectives.compute import FAMILY_EFFICIENCY, MEMORY_BANDWIDTH_EFFICIENCY
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.graph import IterDim, NodeSpec, Op, OpGraph, Tensor, TensorAccess
from planner.core.settings import TrainingSettings

_PATH = Path(__file__).resolve().parents[2] / "bench" / "cost_model.py"


@pytest.fixture(scope="module")
def bench():
    spec = importlib.util.spec_from_file_location("bench_cost_model", _PATH)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses resolve their module by name
    spec.loader.exec_module(module)
    return module


def _pair(bench, kind, measured_s, roofline_s, *, fused=0, op_type="X", configs=1, spread=0.0):
    return bench.ShardPair(
        kind=kind, op_type=op_type, fused_pointwise=fused, signature=f"{kind}{measured_s}{roofline_s}",
        description="", measured_s=measured_s, spread_s=spread, roofline_s=roofline_s,
        compute_bound=False, configs=configs,
    )


class TestRates:
    def test_gemm_flops_and_copy_bytes(self, bench):
        assert bench.gemm_flops(2048) == 2 * 2048**3
        assert bench.copy_bytes(2**28) == 2**29

    def test_median_rate_by_wall_and_by_cpu_time(self, bench):
        # 6 units of work; wall times 1, 3, 2 s: median 2 s -> 3 units/s
        assert bench.median_rate(6.0, [1.0, 3.0, 2.0]) == 3.0
        # 4 CPU-seconds over 2 threads is 2 s with both running -> 3 units/s
        assert bench.median_rate(6.0, [4.0, 4.0, 9.0], parallel=2) == 3.0

    def test_median_rate_rejects_empty_or_zero(self, bench):
        with pytest.raises(ValueError):
            bench.median_rate(1.0, [])
        with pytest.raises(ValueError):
            bench.median_rate(1.0, [0.0])


class TestHostCpuDocument:
    def test_round_trips_through_the_cluster_loader(self, bench, tmp_path):
        document = bench.host_cpu_document(
            name="host-cpu: test", peak_fp32_flops_per_s=2.5e11, memory_bandwidth_bytes_per_s=4e10,
            memory_bytes=24 * 10**9, source="unit test",
        )
        path = tmp_path / "cpu.yaml"
        path.write_text(yaml.safe_dump(document), encoding="utf-8")
        cluster = load_cluster(path)
        assert cluster.devices == 1
        assert cluster.device.peak_flops == {"fp32": 2.5e11}
        assert cluster.device.memory_bandwidth_bytes_per_s == 4e10
        assert cluster.device.memory_bytes == 24 * 10**9

    def test_shipped_file_loads(self, bench):
        cluster = load_cluster(bench.HOST_CPU_FILE)
        assert cluster.device.peak_flops["fp32"] > 0


class TestSummarize:
    def test_ratio_statistics_match_numpy(self, bench):
        measured = [1.0, 2.0, 3.0, 4.0, 10.0]
        pairs = [_pair(bench, "matmul", m, 2.0, configs=3) for m in measured]
        pairs.append(_pair(bench, "matmul", math.nan, 2.0))  # unmeasured: counted apart
        [stats] = bench.summarize(pairs)
        ratios = np.array(measured) / 2.0
        assert stats.family == "matmul"
        assert (stats.shards, stats.unmeasured, stats.configs) == (5, 1, 15)
        assert stats.median_ratio == pytest.approx(1.5)
        assert stats.p10_ratio == pytest.approx(np.percentile(ratios, 10))
        assert stats.p90_ratio == pytest.approx(np.percentile(ratios, 90))
        assert (stats.min_ratio, stats.max_ratio) == (0.5, 5.0)
        assert stats.median_measured_s == 3.0 and stats.median_roofline_s == 2.0

    def test_groups_sorted_and_unmeasured_family_is_nan(self, bench):
        pairs = [_pair(bench, "norm", 1.0, 4.0), _pair(bench, "elementwise", math.nan, 1.0)]
        stats = bench.summarize(pairs)
        assert [s.family for s in stats] == ["elementwise", "norm"]
        assert stats[0].shards == 0 and math.isnan(stats[0].median_ratio)
        assert stats[1].median_ratio == 0.25

    def test_zero_roofline_left_out_of_ratios(self, bench):
        [stats] = bench.summarize([_pair(bench, "slice", 1.0, 0.0), _pair(bench, "slice", 3.0, 1.0)])
        assert stats.shards == 1 and stats.median_ratio == 3.0

    def test_group_by_fused(self, bench):
        pairs = [_pair(bench, "elementwise", 1.0, 1.0, fused=7), _pair(bench, "elementwise", 2.0, 1.0)]
        assert [s.family for s in bench.summarize(pairs, group_by="kind+fused")] == [
            "elementwise", "elementwise +7 fused"
        ]

    def test_markdown_table_shape(self, bench):
        text = bench.markdown_table(bench.summarize([_pair(bench, "norm", 3e-6, 1e-6, spread=3e-7)]))
        lines = text.splitlines()
        assert len(lines) == 3
        assert all(line.count("|") == lines[0].count("|") for line in lines)
        assert lines[2].startswith("| norm | 1 | 0 | 1 | 3 | 3-3 | 3-3 | 3 | 1 | 0% | 10% |")


def _matmul_graph() -> OpGraph:
    m, n, k = 64, 32, 16
    op = Op(
        name="mm", kind="matmul", op_type="MatMul", flops=2.0 * m * n * k,
        dims=(IterDim(name="m", size=m), IterDim(name="n", size=n), IterDim(name="k", size=k, kind="reduction")),
        inputs=(TensorAccess(tensor="a", axes=(("m",), ("k",))), TensorAccess(tensor="b", axes=(("k",), ("n",)))),
        outputs=(TensorAccess(tensor="y", axes=(("m",), ("n",))),),
        node=NodeSpec(op_type="MatMul", input_shapes=((m, k), (k, n)), input_dtypes=("float32", "float32"),
                      output_shapes=((m, n),), output_dtypes=("float32",)),
    )
    tensors = {
        "a": Tensor(name="a", shape=(m, k), dtype="float32", role="input"),
        "b": Tensor(name="b", shape=(k, n), dtype="float32", role="parameter"),
        "y": Tensor(name="y", shape=(m, n), dtype="float32", role="activation", producer="mm"),
    }
    return OpGraph(name="mm", ops=(op,), tensors=tensors, edges=())


class TestCollectPairs:
    def test_roofline_by_hand_and_lookup_by_signature(self, bench):
        from objectives.onnx_build import shard_spec

        graph = _matmul_graph()
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2))
        # one made-up timing for the unsplit shard only
        whole = shard_spec(op, {}).key
        device = Device(name="cpu", peak_flops={"fp32": 1e9}, memory_bytes=2**30,
                        memory_bandwidth_bytes_per_s=1e9)
        pairs, unrebuildable = bench.collect_pairs(
            graph, [space], timings={whole: (5e-5, 1e-6)}, device=device, settings=TrainingSettings(precision="fp32")
        )
        assert unrebuildable == {}
        distinct_rows = len(np.unique(space.factors, axis=0))
        assert len(pairs) == distinct_rows
        [unsplit] = [p for p in pairs if p.signature == whole]
        flop_s = 2 * 64 * 32 * 16 / (1e9 * FAMILY_EFFICIENCY["matmul"])
        byte_s = (64 * 16 + 16 * 32 + 64 * 32) * 4 / (1e9 * MEMORY_BANDWIDTH_EFFICIENCY)
        expected = max(flop_s, byte_s) + device.kernel_latency_s  # one forward kernel
        assert unsplit.roofline_s == pytest.approx(expected)
        assert unsplit.compute_bound == (flop_s >= byte_s)
        assert unsplit.measured_s == 5e-5 and unsplit.ratio == pytest.approx(5e-5 / expected)
        assert all(math.isnan(p.measured_s) for p in pairs if p.signature != whole)
