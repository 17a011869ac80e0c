"""The order the launchers' searches try pipeline sizes in (:func:`planner.launcher_options.pipeline_order`).

The order only matters when the time limit stops a search; these tests pin which size a large model
starts at, computed by hand from the bytes per parameter (bf16 weights and gradients 2 + 2 B, Adam's
fp32 master copy and moments 4 + 8 B) and the device's memory.
"""

from __future__ import annotations

from dataclasses import dataclass

from objectives.cluster import make_cluster
from planner.launcher_options import PIPELINE_START_STATE_SHARE, pipeline_order, states_exceed_a_device
from planner.plan import PlanRequest


@dataclass(frozen=True)
class _Model:
    """What the order reads of a graph: its parameter count."""

    parameter_count: int


def _request(devices: int, memory_limit_bytes: float | None = None) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices, devices_per_node=8),
                       memory_limit_bytes=memory_limit_bytes)


def test_a_model_that_fits_one_device_tries_the_fewest_stages_first():
    # 1B parameters x 16 B = 16 GB <= 84.4 GB (the a100-80gb preset: 85,100,068,864 B less the CUDA context)
    model = _Model(parameter_count=10**9)
    assert not states_exceed_a_device(model, _request(64))
    assert pipeline_order(model, _request(64)) == (1, 2, 4, 8, 16, 32, 64)


def test_a_large_model_starts_where_its_weights_fit_half_a_device_and_tries_fewer_stages_last():
    # 175e9 parameters on 1,024 A100s (84,433,436,672 B: 85,100,068,864 exposed less the 666,632,192 B CUDA
    # context): the optimizer's 12 B per parameter over every device is 175e9 x 12 / 1,024 = 2.05e9 B; weights
    # and gradients 175e9 x 4 B over pp x tp (tp = 8, a node): pp = 2: 43.75e9 + 2.05e9 > 42.2e9 (half the
    # device); pp = 4: 21.9e9 + 2.05e9 <= 42.2e9
    assert PIPELINE_START_STATE_SHARE == 0.5
    model = _Model(parameter_count=175 * 10**9)
    assert states_exceed_a_device(model, _request(1024))
    assert pipeline_order(model, _request(1024)) == (4, 8, 16, 32, 64, 128, 256, 512, 1024, 2, 1)


def test_the_start_follows_the_memory_limit_and_the_ranks_a_stage_has():
    model = _Model(parameter_count=175 * 10**9)
    # at a 60e9 B limit half is 30e9: pp = 4 takes 23.9e9 (as above), pp = 2 45.8e9: still 4 first;
    # at 20e9 (half 10e9): pp = 8 takes 10.9e9 + 2.05e9 > 10e9, pp = 16 5.5e9 + 2.05e9 <= 10e9
    assert pipeline_order(model, _request(1024, memory_limit_bytes=60e9))[0] == 4
    assert pipeline_order(model, _request(1024, memory_limit_bytes=20e9))[0] == 16
    # 16 devices: a stage of pp = 4 has 4 ranks (tp <= 4), the optimizer 175e9 x 12 / 16 = 131e9 B
    # alone exceeds half the device, so no size fits and the search starts at the most stages
    assert pipeline_order(model, _request(16)) == (16, 8, 4, 2, 1)
