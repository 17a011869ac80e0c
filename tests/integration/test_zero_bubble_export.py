"""Zero-bubble pipeline rows (issue 24 item 5; Qi et al., "Zero Bubble Pipeline Parallelism", ICLR
2024) accepted by torchtitan 0.3.0's own code: every torchtitan row of the Llama example planned with
``--schedule zbv --chunks 2`` (and ``zb-h1 --chunks 2``) under ``--engine eager`` is exported, read by
``ConfigManager.parse_args``, names a torch schedule class (``ScheduleZBVZeroBubble``,
``ScheduleInterleavedZeroBubble``), leaves torch.compile off, and torchtitan's own stage placement
(``_get_pp_rank_to_stage_indices_mapping``: a V for ZBV) gives each rank the layers the plan priced."""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.integration.test_torchtitan_export import _parse

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama.onnx"


@pytest.mark.parametrize(("schedule", "name"), [("zbv", "ZBVZeroBubble"), ("zb-h1", "InterleavedZeroBubble")])
def test_zero_bubble_rows_are_accepted_by_torchtitan(schedule, name, tmp_path):
    pytest.importorskip("torchtitan")
    from torch.distributed.pipelining.schedules import get_schedule_class
    from torchtitan.distributed.pipeline_parallel import _get_pp_rank_to_stage_indices_mapping

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(LLAMA, {"batch": 16, "seq": 128}, [request], launchers=["torchtitan"],
                                       schedule=schedule, chunks=2, engine="eager", pipeline_sizes=(2,))
    rows = [row for row in found.rows if "torchtitan" in row.targets and row.point.pp > 1]
    assert rows
    for row in rows:
        out = export("torchtitan", row_plan_input(row))
        config = _parse(out, tmp_path)
        pp = config.parallelism.pipeline_parallel_degree
        assert config.parallelism.pipeline_parallel_schedule == name and get_schedule_class(name).__name__.endswith(name)
        assert not config.compile.enable
        parts = config.parallelism.module_fqns_per_model_part
        per_rank = [sum(name_.startswith("layers.") for stage in _get_pp_rank_to_stage_indices_mapping(r, pp, name, len(parts))
                        for name_ in parts[stage]) for r in range(pp)]
        assert per_rank == [s.layers[1] - s.layers[0] for s in row.point.stages]
