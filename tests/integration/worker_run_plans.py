"""torchrun worker: run several DTensor plans one after the other in one torchrun.

``torchrun --nproc-per-node 4 tests/integration/worker_run_plans.py JOBS.json``, where JOBS.json is a
list of ``{"plan": path, "config": path, "report": folder, "steps": n}`` and, first, at most one
``{"cli": [arguments]}``. Each plain job is :func:`planner.run.run_plan` with ``gather=True`` (rank 0
writes ``full.pt``), all in one gloo group.

A ``cli`` job is ``python -m planner.run ARGUMENTS`` itself, before the others: a child forked from this
worker once torch and transformers are imported runs the module as ``__main__`` the way ``-m`` does
(``runpy.run_module``), in this torchrun's environment, and makes and destroys the default process group
as a process of its own would. The plain jobs' group then takes its keys under a prefix of its own in
torchrun's store (a group made again under the default prefix would read the first one's keys and hang),
and this process never held the child's group (DTensor caches the meshes it has seen).

Starting torch and transformers once for all plans keeps the integration tests short on a 2-core machine:
a torchrun of 4 workers costs about 35 CPU s of start-up before its first step (h28b, 2026-12-02).
"""

from __future__ import annotations

import json
import os
import runpy
import sys
import traceback
from datetime import timedelta
from pathlib import Path


def _preload() -> None:
    """What every job imports anyway (torch, its DTensor and FSDP2 modules, transformers' causal LMs),
    imported once before a fork so the ``cli`` child does not import it again."""
    import torch.distributed.fsdp  # noqa: F401
    import torch.distributed.tensor.parallel  # noqa: F401
    from transformers import AutoConfig, AutoModelForCausalLM  # noqa: F401


def _run_cli(arguments: list[str]) -> None:
    """``python -m planner.run ARGUMENTS`` in a forked child; raises unless it exits 0."""
    sys.stdout.flush()
    sys.stderr.flush()
    child = os.fork()
    if child == 0:
        code = 1
        try:
            sys.argv = ["planner.run", *arguments]
            runpy.run_module("planner.run", run_name="__main__", alter_sys=True)
            code = 0
        except SystemExit as done:
            code = 0 if done.code is None else done.code if isinstance(done.code, int) else 1
        except BaseException:  # noqa: BLE001 - reported here, the exit code says it failed
            traceback.print_exc()
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os._exit(code)
    _, status = os.waitpid(child, 0)
    if os.waitstatus_to_exitcode(status):
        raise RuntimeError(f"python -m planner.run {' '.join(arguments)} exited {os.waitstatus_to_exitcode(status)}")


def _jobs_group() -> None:
    """The gloo group of the plain jobs, on the ``jobs/`` prefix of torchrun's store."""
    import torch.distributed as dist

    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                          timeout=timedelta(seconds=300))
    dist.init_process_group("gloo", store=dist.PrefixStore("jobs/", store), rank=int(os.environ["RANK"]),
                            world_size=int(os.environ["WORLD_SIZE"]))


def main(jobs_path: str) -> int:
    jobs = json.loads(Path(jobs_path).read_text())
    cli = [job["cli"] for job in jobs if "cli" in job]
    if len(cli) > 1:
        raise ValueError(f"{jobs_path}: {len(cli)} cli jobs; the default process group can be made only once")
    _preload()
    for arguments in cli:
        _run_cli(arguments)
    import torch.distributed as dist

    from planner.run import run_plan

    _jobs_group()
    try:
        for job in jobs:
            if "cli" not in job:
                plan = json.loads(Path(job["plan"]).read_text())
                run_plan(plan, job["config"], steps=job.get("steps", 2), report_dir=job["report"], gather=True)
                dist.barrier()
    finally:
        dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    raise SystemExit(main(sys.argv[1]))
