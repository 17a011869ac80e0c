"""torchrun worker of ``test_dtensor_tables.py``: applies exported DTensor table plans to the small DLRM.

``python -m torch.distributed.run --nproc-per-node N worker_dtensor_tables.py jobs.json``; every job is
``{"plan": path, "report": folder}``. Per job, each rank builds ``make_dlrm_embedding.build_small()``
(seed 0), checks every parameter against the plan's ``params`` shapes, applies the plan's
``table_plan`` with ``parallelize_module`` on ``mesh["dp"]`` (styles parsed by ``planner.run._style``,
the JSON vocabulary the exporter writes), runs one forward and backward of the step's batch (its own
slice of the dense features, the whole batch's indices for the tables: the plan's input layouts),
syncs the gradients as the plan's notes say (DDP's mean for plain tensors, ``gradient_scale`` for the
table shards) and writes ``rank{r}.json`` (its logits, local shard shapes and placements); rank 0
writes ``full.pt`` with every whole gradient (``full_tensor()`` for the table shards).
"""

from __future__ import annotations

import json
import os
import sys
from pathlib import Path

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import DTensor
from torch.distributed.tensor.parallel import parallelize_module

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))
sys.path.insert(0, str(ROOT / "tests" / "integration"))
from make_dlrm_embedding import build_small, step_batch  # noqa: E402

from planner.run import _style  # noqa: E402  (the exporter's JSON styles, as planner.run reads them)


def run_job(plan: dict, report: Path, rank: int, world: int) -> None:
    mesh = init_device_mesh("cpu", tuple(plan["mesh"]["shape"]), mesh_dim_names=tuple(plan["mesh"]["dim_names"]))
    model = build_small()
    for name, param in model.named_parameters():
        assert list(param.shape) == plan["params"][name]["shape"], name
    section = plan["table_plan"]
    parallelize_module(model, mesh[section["mesh_dim"]], {fqn: _style(spec) for fqn, spec in section["modules"].items()})
    dense, indices = step_batch(plan["batch"]["global_batch"])
    per_rank = plan["batch"]["micro_batch_per_rank"]
    mine = slice(rank * per_rank, (rank + 1) * per_rank)
    logits = model(dense[mine], *indices)
    loss = logits.square().mean()  # any loss of the local batch, averaged as data parallelism does
    loss.backward()
    group = mesh[plan["data_parallel"]["mesh_dim"]].get_group()
    for param in model.parameters():
        if isinstance(param.grad, DTensor):
            param.grad.mul_(section["gradient_scale"])
        else:
            dist.all_reduce(param.grad, group=group)
            param.grad.div_(plan["data_parallel"]["size"])
    shards = {
        name: {"local_shape": list(p.to_local().shape), "placements": [f"shard({x.dim})" if x.is_shard() else str(x) for x in p.placements]}
        for name, p in model.named_parameters() if isinstance(p, DTensor)
    }
    report.mkdir(parents=True, exist_ok=True)
    (report / f"rank{rank}.json").write_text(json.dumps({"logits": logits.detach().flatten().tolist(), "shards": shards}))
    grads = {n: (p.grad.full_tensor() if isinstance(p.grad, DTensor) else p.grad) for n, p in model.named_parameters()}
    if rank == 0:
        torch.save({n: g.detach().clone() for n, g in grads.items()}, report / "full.pt")


def main() -> int:
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    for job in json.loads(Path(sys.argv[1]).read_text()):
        run_job(json.loads(Path(job["plan"]).read_text()), Path(job["report"]), rank, world)
        dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    raise SystemExit(main())
