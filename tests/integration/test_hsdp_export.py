"""HSDP rows (``--fix hsdp=8``) exported to Megatron-LM and accepted by megatron-core 0.16.1's own code.

Megatron-LM runs ZeRO-1 with a shard group as a partial distributed optimizer
(``--num-distributed-optimizer-instances``): every exported row builds a ``DistributedDataParallelConfig``
with that many instances, and ``parallel_state.initialize_model_parallel`` in a fake 16-process world
(``torch.testing._internal.distributed.fake_pg``: groups without collectives) puts rank 0's
intra-instance (shard) group on the first node's 8 ranks, as the planner priced it (torchtitan's and
DTensor's HSDP rows are checked in ``test_torchtitan_export.py`` and ``test_dtensor_run.py``).
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters import export
from exporters.validate import parse_megatron_args
from objectives.cluster import make_cluster
from planner.core.degrees import Pins
from planner.launchable import plan_launchable_file, row_plan_input
from planner.plan import PlanRequest

pytestmark = pytest.mark.integration

ROOT = Path(__file__).resolve().parents[2]


def test_megatron_partial_distributed_optimizer_rows():
    pytest.importorskip("torch")
    pytest.importorskip("megatron.core")
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.distributed import DistributedDataParallelConfig
    from torch.testing._internal.distributed import fake_pg

    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
    _, (found,) = plan_launchable_file(ROOT / "examples" / "llama.onnx", {"batch": 32, "seq": 1024}, [request],
                                       launchers=["megatron"], pins=Pins(hsdp=8, pp=1), collapse=0.0)
    rows = [row for row in found.rows if "megatron" in row.targets]
    assert rows and all((row.point.zero_stage, row.cache.settings.dp_shard) == (1, 8) for row in rows)
    dist.init_process_group("fake", store=fake_pg.FakeStore(), rank=0, world_size=16)
    try:
        for row in rows:
            args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
            instances = args["num-distributed-optimizer-instances"]
            assert instances == row.degrees.dp // 8 and args["use-distributed-optimizer"]
            DistributedDataParallelConfig(use_distributed_optimizer=True, overlap_grad_reduce=True,
                                          num_distributed_optimizer_instances=instances)
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=args.get("tensor-model-parallel-size", 1),
                num_distributed_optimizer_instances=instances, create_gloo_process_groups=False,
            )
            try:
                shard = parallel_state.get_data_parallel_group(with_context_parallel=True, partial_data_parallel=True)
                ranks = dist.get_process_group_ranks(shard)
                # rank 0's shard group: the dp ranks of the first node (tp innermost)
                assert len(ranks) == 8 and max(ranks) < 8 * args.get("tensor-model-parallel-size", 1)
            finally:
                parallel_state.destroy_model_parallel()
    finally:
        dist.destroy_process_group()
