"""torchrun worker: run several DTensor plans one after the other in one process group.

``torchrun --nproc-per-node 4 tests/integration/worker_run_plans.py JOBS.json``, where JOBS.json is a
list of ``{"plan": path, "config": path, "report": folder, "steps": n}``. Each job is
:func:`planner.run.run_plan` with ``gather=True`` (rank 0 writes ``full.pt``). Starting torch once
for all plans keeps the integration tests short on a 2-core machine.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path


def main(jobs_path: str) -> int:
    import torch.distributed as dist

    from planner.run import run_plan

    dist.init_process_group("gloo")
    try:
        for job in json.loads(Path(jobs_path).read_text()):
            plan = json.loads(Path(job["plan"]).read_text())
            run_plan(plan, job["config"], steps=job.get("steps", 2), report_dir=job["report"], gather=True)
            dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
