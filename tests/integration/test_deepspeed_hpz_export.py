"""ZeRO++'s hpZ rows (``--fix hsdp=8 --target deepspeed``: DeepSpeed's analogue of HSDP) exported and read back by
deepspeed 0.19.8's own ``DeepSpeedConfig``.

A one-rank gloo world cannot build an hpZ group of 8 (``utils/groups.py`` asserts the group divides the world), so the
config object is the oracle: every row of a small model's frontier on 2 nodes x 8 devices is ZeRO-3 with
``zero_hpz_partition_size`` 8, which DeepSpeed parses into ``zero_config`` beside the stage and the gather bounds the
row was priced with, at the row's batch and world size.
"""

from __future__ import annotations

import json
from pathlib import Path
from types import SimpleNamespace

import pytest

from exporters import export
from exporters.deepspeed.zero3 import ZERO3_GATHER
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from planner.repriced import reprice_saved

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_every_hpz_row_is_a_config_deepspeed_accepts(monkeypatch, tmp_path):
    pytest.importorskip("torch")
    pytest.importorskip("deepspeed")
    import deepspeed.runtime.config as ds_runtime_config

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
    _, (found,) = plan_launchable_file(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"batch": 64, "seq": 128}, [request],
                                       launchers=["deepspeed"], pins=Pins(hsdp=8), collapse=0.0)
    rows = [row for row in found.rows if "deepspeed" in row.targets]
    assert rows and all((row.point.zero_stage, row.cache.settings.hpz_partition) == (3, 8) for row in rows)
    for row in rows:
        out = export("deepspeed", row_plan_input(row))
        world = out["world_size"]
        # no process group: DeepSpeedConfig checks the batch against `world` ranks (test_deepspeed_config.py)
        monkeypatch.setattr(ds_runtime_config, "dist", SimpleNamespace(get_rank=lambda *a, **k: 0,
                                                                       get_world_size=lambda *a, w=world, **k: w))
        config = ds_runtime_config.DeepSpeedConfig(out["ds_config"])
        zero = config.zero_config
        assert (config.zero_optimization_stage, zero.zero_hpz_partition_size) == (3, 8)
        assert world % zero.zero_hpz_partition_size == 0 and world > zero.zero_hpz_partition_size  # groups.py's rule
        assert (zero.prefetch_bucket_size, zero.max_live_parameters, zero.max_reuse_distance,
                zero.param_persistence_threshold) == (ZERO3_GATHER.prefetch_bucket, ZERO3_GATHER.max_live,
                                                      ZERO3_GATHER.max_reuse_distance, ZERO3_GATHER.persistence_threshold)
        assert config.train_batch_size == row.point.micro_batch * row.point.micro_batches * row.degrees.dp
    # a saved row keeps its group: priced again from the generic plan, the same seconds and bytes
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(export("generic", row_plan_input(rows[0]))))
    again = reprice_saved(path, model=ROOT / "tests" / "data" / "gpt2_tiny.onnx")
    assert (again.point.time_s, again.point.memory_bytes) == pytest.approx((rows[0].time_s, rows[0].memory_bytes),
                                                                           rel=1e-9)
    assert again.hybrid == "hpz 8"  # planner explain's header and JSON name the group
