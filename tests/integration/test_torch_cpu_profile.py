"""The torch CPU profile provider (tests/objectives/test_torch_profile.py) against torch itself: its calls run, are
timed and are read back by the cost model."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.compute import op_compute_time_s
from objectives.profile import ProfileDB, open_measured, profile_graph
from objectives.torch_profile import call_signature, tensor_view, torch_call
from planner.core.cluster import Device
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from tests.objectives.test_torch_profile import _graph


@pytest.mark.integration
class TestTorchCpuProfile:
    @pytest.fixture(autouse=True)
    def _torch(self):
        pytest.importorskip("torch")

    def test_profile_times_forward_and_backward_and_the_cost_model_uses_both(self, tmp_path):
        graph = _graph()
        tensors = tensor_view(graph)
        spaces = [enumerate_configs(op, ConfigOptions(devices=2, devices_per_node=2)) for op in graph.ops]
        calls = {}  # the distinct calls, found independently of the profiler
        for op, space in zip(graph.ops[:3], spaces):
            for row in range(space.size):
                call = torch_call(op, space.describe(row), tensors=tensors)
                calls[call_signature(call, "float32")] = call
        conv_configs = len({tuple(r) for r in spaces[3].factors.tolist()})
        with ProfileDB(tmp_path / "p.db") as db:
            report = profile_graph(graph, spaces, db, provider="torch-cpu", repeats=3, warmup=1)
            assert (report.shards, report.measured, report.failed, report.cached) == (len(calls), len(calls), 0, 0)
            assert report.unprofilable_by_type == {"Conv": conv_configs}
            assert report.dtype == "float32" and "torch-cpu float32 on" in report.summary()
            rows = {r.signature: r for r in db.rows()}
            assert set(rows) == set(calls)
            for row in rows.values():
                assert row.provider == "torch-cpu" and row.measured_dtypes == "float32" and row.method == "wall"
                assert row.repeats >= 1 and row.median_s > 0 and row.backward_median_s > 0
            again = profile_graph(graph, spaces, db, provider="torch-cpu", repeats=1, warmup=0)
            assert (again.measured, again.cached) == (0, len(calls))
            measured = db.lookup_fn("torch-cpu", report.device_name, tensors=tensors, dtype="float32")

        fc, space = graph.ops[0], spaces[0]
        device = Device(name="gpu", memory_bytes=2**34, peak_flops={"fp32": 1e13, "bf16": 1e14},
                        memory_bandwidth_bytes_per_s=1e12)
        times = op_compute_time_s(fc, space, tensors=tensors, device=device, settings=TrainingSettings(),
                                  measured=measured)
        assert (times.measured, times.fallbacks) == (space.size, 0)
        for row in range(space.size):
            stored = rows[call_signature(torch_call(fc, space.describe(row), tensors=tensors), "float32")]
            assert measured(fc, space.describe(row)) == (stored.median_s, stored.backward_median_s)
            assert times.forward_s[row] == stored.median_s
            assert times.backward_s[row] == stored.backward_median_s  # measured, not rho * forward
        roofline = op_compute_time_s(graph.ops[3], spaces[3], tensors=tensors, device=device,
                                     settings=TrainingSettings(), measured=measured)
        assert roofline.measured == 0 and np.all(roofline.backward_s > 0)  # the conv keeps the roofline

    def test_open_measured_reads_the_torch_rows_and_names_the_cpu(self, tmp_path):
        graph = _graph()
        spaces = [enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1)) for op in graph.ops]
        with ProfileDB(tmp_path / "p.db") as db:
            report = profile_graph(graph, spaces, db, provider="torch-cpu", repeats=1, warmup=0)
        found = open_measured(tmp_path / "p.db", graph, cluster_device="a100-80gb", precision="fp32")
        assert (found.source.provider, found.source.dtypes, found.source.timings) == ("torch-cpu", "float32", 3)
        assert found.notes == (
            f"timings measured on {report.device_name} (provider torch-cpu), not on the cluster's a100-80gb: "
            "compute times are that device's",
        )
        forward, backward = found.fn(graph.ops[1], {})
        assert forward > 0 and backward > 0

    def test_torch_cuda_without_a_gpu_is_refused(self, tmp_path):
        import torch

        if torch.cuda.is_available():
            pytest.skip("this machine has a GPU")
        graph = _graph()
        spaces = [enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1)) for op in graph.ops]
        with ProfileDB(tmp_path / "p.db") as db, pytest.raises(InputError, match="sees no CUDA GPU here; use --provider torch-cpu"):
            profile_graph(graph, spaces, db, provider="torch-cuda")

    def test_cli_profile_with_torch_cpu(self, tmp_path):
        from tests.planner.cli_helpers import run_cli

        db = tmp_path / "p.db"
        result = run_cli(["profile", "tests/data/gpt2_tiny.onnx", "--dim", "batch=1", "--dim", "seq=8",
                          "--devices", "1", "--provider", "torch-cpu", "--repeats", "1", "--max-shards", "3",
                          "--profile-db", db, "--quiet"])
        assert "3 measured" in result.stdout and "torch-cpu float32 on" in result.stdout
        with ProfileDB(db) as opened:
            rows = opened.rows()
        assert len(rows) == 3 and all(r.provider == "torch-cpu" and r.backward_median_s > 0 for r in rows)
