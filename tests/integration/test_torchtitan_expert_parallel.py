"""torchtitan 0.3.0 accepts the planner's expert-parallel rows as exported (issues 24 item 6, 25).

Every torchtitan row of ``qwen3_moe_tiny.onnx`` (2 MoE layers of 4 experts, FFN 64, hidden 128) planned on
8 devices of one node with ``--fix ep=2`` and ``ep=4`` (ZeRO-3, as torchtitan's expert parallelism needs)
(and ``ep=2`` with a 2-stage pipeline) is exported; torchtitan's own ``ConfigManager.parse_args`` reads the module and overrides, its
``ParallelDims`` takes the degrees at the world size, and ``ParallelDims.build_mesh`` runs in a fake
8-process world (``torch.testing._internal.distributed.fake_pg``: groups without collectives). The mesh
it builds is held to what the planner priced (``exporters/torchtitan/experts.py``): the ``ep`` mesh has
``ep`` ranks, rank 0's being the ``ep`` consecutive ranks ``0 .. ep - 1`` (the innermost data-parallel
ones at ``tp = 1``), and the experts' FSDP mesh ``efsdp`` has ``dp x cp / ep`` ranks, so each rank holds
``E / ep`` experts in ``dp cp / ep`` shards: ``1 / (dp cp)`` of the expert states, as ZeRO-3 priced.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest
from tests.integration.test_torchtitan_export import _parse  # torchtitan's ConfigManager on the written module

pytestmark = pytest.mark.integration

QWEN3_MOE = Path(__file__).resolve().parents[2] / "tests" / "exporters" / "data" / "qwen3_moe_tiny.onnx"
DEVICES = 8


def _rows(ep: int, pp: int | None) -> list:
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=DEVICES))
    _, (found,) = plan_launchable_file(QWEN3_MOE, {"batch": 16, "seq": 64}, [request], launchers=["torchtitan"],
                                       pins=Pins(ep=ep, zero=3, pp=pp), collapse=0.0)
    return [row for row in found.rows if "torchtitan" in row.targets]


@pytest.mark.parametrize(("ep", "pp"), [(2, None), (4, None), (2, 2)])
def test_every_expert_parallel_row_builds_torchtitans_mesh(ep, pp, tmp_path):
    pytest.importorskip("torchtitan")
    import torch.distributed as dist
    from torch.testing._internal.distributed import fake_pg
    from torchtitan.distributed import ParallelDims

    rows = _rows(ep, pp)
    assert rows  # the ep rows torchtitan runs are listed for it
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=DEVICES)
    try:
        for row in rows:
            out = export("torchtitan", row_plan_input(row))
            config = _parse(out, tmp_path)
            p = config.parallelism
            assert p.expert_parallel_degree == ep and config.training.disable_cuda_graphs
            assert (p.tensor_parallel_degree, p.data_parallel_replicate_degree) == (1, 1)
            assert p.pipeline_parallel_degree == (pp or 1)
            dims = ParallelDims.from_config(p, out["world_size"])  # torchtitan's own degree checks
            dims.build_mesh()  # the sparse mesh (pp, dp_replicate, efsdp, ep) tiles the world
            dp_cp = out["degrees"]["dp"] * out["degrees"]["cp"]
            assert dims.get_optional_mesh("ep").size() == ep
            assert dims.get_optional_mesh("efsdp").size() == dp_cp // ep
            assert dist.get_process_group_ranks(dims.get_mesh("ep").get_group()) == list(range(ep))
    finally:
        dist.destroy_process_group()
