"""Eager bf16 as each launcher runs it (``Target.autocast_zero``): torchtitan 0.3.0 runs bf16 modules under FSDP2's
``MixedPrecisionPolicy`` and never ``torch.autocast``; the DTensor plan autocasts at ZeRO 0-2 only (``planner.run``).
Its search prices them so, its rows say so, and its export refuses a plan priced the other way (issue 23).

Oracles: the search's torchtitan row (llama_tiny, 4 devices, dp=4, ZeRO-3, mb=2, ``--engine eager``) against
``planner.estimate`` of the same configuration with ``autocast`` set by hand; and the two estimates' difference
against the cast kernels counted by hand on a device whose memory traffic costs nothing (so the only seconds that
autocast changes are its kernels' launches, ``kernel_overhead_s`` each inside torchtitan's CUDA graph): llama_tiny
has 2 layers of 7 linear weights and an untied LM head, 15 weights a product reads (one cast each in forward), and 2
x 2 + 1 norm weights and the embedding table, 21 parameters in all (one gradient cast each in backward): 36 kernels
per micro-batch, one micro-batch per step.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from exporters import export
from exporters.generic import plan_from_dict
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.core.errors import InputError, UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from planner.launcher_options import launcher_autocast, launcher_execution
from planner.pipeline import PipelineOptions, graph_loader, pipeline_search
from planner.plan import PlanRequest

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"
CAST_KERNELS = 15 + 21
"""Per micro-batch under autocast (module docstring): 15 weight casts in forward, 21 gradient casts in backward."""


@pytest.fixture(scope="module")
def setup():
    loader = graph_loader(LLAMA, {"seq": 32})
    cluster = make_cluster("a100-80gb", devices=4)
    free = dataclasses.replace(cluster.device, memory_bandwidth_bytes_per_s=1e30)  # traffic costs nothing
    request = PlanRequest(cluster=dataclasses.replace(cluster, device=free))
    execution = launcher_execution("torchtitan", loader(8), "eager", None, request.cluster.device)
    from planner.launchable import launch_frontier

    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=8), launchers=("torchtitan",),
                               engine="eager", pins=Pins(dp=4, zero=3, mb=2, recompute="none"), headroom=False,
                               collapse=0.0)
    row = next(r for r in frontier.rows if r.point.pp == 1 and r.degrees.dp == 4 and r.point.zero_stage == 3)
    return loader, request, execution, row


def _estimate(setup, autocast: bool):
    loader, request, execution, _ = setup
    settings = TrainingSettings(engine="eager", attention=execution.attention, autocast=autocast)
    return estimate(loader, cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, zero=3,
                    settings=settings, cuda_graphs=True)  # torchtitan replays one-stage plans as a CUDA graph


def test_the_search_prices_torchtitans_eager_rows_without_autocast(setup):
    row = setup[3]
    assert row.cache.settings.autocast is False and row.cache.settings.cuda_graphs
    without, under = _estimate(setup, False), _estimate(setup, True)
    assert without.valid and under.valid
    assert row.time_s == pytest.approx(without.point.time_s, rel=1e-12)
    assert row.memory_bytes == pytest.approx(without.point.memory_bytes, rel=1e-12)
    kernel_s = setup[1].cluster.device.kernel_overhead_s
    assert kernel_s > 0
    assert under.point.time_s - row.time_s == pytest.approx(CAST_KERNELS * kernel_s, rel=1e-6)


def test_the_row_exports_to_torchtitan_and_says_what_was_priced(setup):
    from planner.launchable import row_plan_input

    row = setup[3]
    assert "torchtitan" in row.targets
    plan_input = row_plan_input(row)
    assert plan_input.settings.autocast is False
    export("torchtitan", plan_input)  # no refusal: priced as it runs
    document = export("generic", plan_input)
    assert document["training"]["autocast"] is False
    assert plan_from_dict(document).settings().autocast is False  # a saved plan re-prices as it was priced
    priced_under = dataclasses.replace(plan_input, settings=dataclasses.replace(plan_input.settings, autocast=True))
    with pytest.raises(UnsupportedExport, match="under torch.autocast"):
        export("torchtitan", priced_under)


def test_dtensor_autocasts_below_zero_3_only():
    dtensor, titan = TARGETS["dtensor"], TARGETS["torchtitan"]
    eager = TrainingSettings(engine="eager", attention="flash")
    assert [dtensor.priced_autocast(eager, zero) for zero in (0, 1, 2, 3)] == [True, True, True, False]
    assert not any(titan.priced_autocast(eager, zero) for zero in (0, 1, 2, 3))
    fused = TrainingSettings(engine="fused", attention="flex")
    assert titan.priced_settings(fused, cuda_graphs=False) is fused  # compiled: no autocast term to price
    assert titan.priced_settings(eager, cuda_graphs=False).autocast is False
    assert dtensor.runs_settings(dataclasses.replace(eager, zero_stage=3, autocast=False))
    assert not dtensor.runs_settings(dataclasses.replace(eager, zero_stage=3))
    assert not dtensor.runs_settings(dataclasses.replace(eager, zero_stage=0, autocast=False))
    execution = launcher_execution("dtensor", None, None, None)
    parts = launcher_autocast(PipelineOptions(global_batch=8), "dtensor", execution=execution, precision="bf16-mixed")
    assert [(cast, options.zero_stages) for cast, options in parts] == [(None, (0, 1, 2)), (False, (3,))]
    assert launcher_autocast(PipelineOptions(global_batch=8), "dtensor", execution=execution, precision="fp32")[0][0] is None


def test_pipeline_search_for_dtensor_parts_the_stages(setup):
    loader, request, *_ = setup
    eager = TrainingSettings(engine="eager", attention="flash")
    with pytest.raises(InputError, match="search those stages apart"):
        pipeline_search(loader, cluster=request.cluster, options=PipelineOptions(global_batch=8, pipeline_sizes=(1,)),
                        settings=eager, target="dtensor")
    three = PipelineOptions(global_batch=8, pipeline_sizes=(1,), zero_stages=(3,), recompute=("none",))
    assert pipeline_search(loader, cluster=request.cluster, options=three, settings=eager,
                           target="dtensor").cache.settings.autocast is False



@pytest.mark.parametrize("zero, autocast", [(0, True), (3, False)])
def test_estimate_with_the_dtensor_target_casts_as_the_plan_runs_at_its_zero_stage(setup, zero, autocast):
    """``planner estimate --target dtensor --engine eager``: priced with autocast at ZeRO-0 and without at ZeRO-3, as
    ``planner.run`` runs the exported plan (an ``fsdp`` section at ZeRO-3 only); the oracle is the estimate with
    ``autocast`` set by hand. Before the fix (h27g, of c12540c) the estimate read the stage from the settings' default
    ZeRO-0 and priced ZeRO-3 with autocast's casts."""
    loader, request, *_ = setup
    eager = TrainingSettings(engine="eager", attention="flash")
    configuration = dict(cluster=request.cluster, tp=1, pp=1, micro_batch=2, global_batch=8, zero=zero)
    targeted = estimate(loader, settings=eager, target="dtensor", **configuration)
    by_hand = estimate(loader, settings=dataclasses.replace(eager, autocast=autocast), **configuration)
    other = estimate(loader, settings=dataclasses.replace(eager, autocast=not autocast), **configuration)
    assert targeted.valid and by_hand.valid and other.valid
    assert targeted.point.time_s == pytest.approx(by_hand.point.time_s, rel=1e-12)
    assert targeted.point.memory_bytes == pytest.approx(by_hand.point.memory_bytes, rel=1e-12)
    assert abs(other.point.time_s - by_hand.point.time_s) > 1e-6  # autocast's casts: the two pricings differ


@pytest.mark.parametrize("name", ["megatron", "deepspeed"])
def test_megatron_and_deepspeed_train_bf16_modules_without_autocast(name):
    """megatron-core 0.16.1's ``Float16Module`` holds ``module.bfloat16()`` and DeepSpeed 0.19.8 casts the module's
    parameters to bf16 (its ``torch_autocast`` section off by default): under ``--engine eager`` neither is priced with
    autocast's casts at any ZeRO stage, and a plan priced with them is not their row."""
    target, eager = TARGETS[name], TrainingSettings(engine="eager", attention="flash")
    assert not any(target.priced_autocast(eager, zero) for zero in (0, 1, 2, 3))
    assert target.priced_settings(eager, cuda_graphs=False).autocast is False
    assert all(target.runs_autocast(dataclasses.replace(eager, zero_stage=zero, autocast=False)) for zero in range(4))
    assert not any(target.runs_autocast(dataclasses.replace(eager, zero_stage=zero)) for zero in range(4))
