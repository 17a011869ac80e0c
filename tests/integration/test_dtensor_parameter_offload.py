"""Parameter offload in the DTensor plan, run for real: ``python -m planner.run``'s ``apply_plan`` passes
``offload_policy=CPUOffloadPolicy()`` to every ``fully_shard`` of an exported ``offload=parameters`` plan
(torch 2.13 FSDP2, 2 CPU processes, gloo), and training under it gives the losses and parameters of the
same plan without offload (offload moves where the shards live, not what is computed)."""

from __future__ import annotations

import dataclasses
import json

import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("transformers")

from exporters.dtensor import export_dtensor  # noqa: E402
from planner.export import plan_input  # noqa: E402
from tests.integration.configs import CONFIGS  # noqa: E402
from tests.integration.plans import ROOT, Case, make_plan  # noqa: E402
from tests.integration.test_dtensor_run import _free_port  # noqa: E402

pytestmark = pytest.mark.integration

CASE = Case(model="gpt2_tiny", dp=2, tp=1, zero=3)


def test_offloaded_plan_trains_as_the_plain_one(tmp_path):
    import os
    import subprocess
    import sys

    plain, result = make_plan(CASE)
    chosen = plan_input(result, 0)
    offloaded = export_dtensor(dataclasses.replace(chosen, settings=dataclasses.replace(chosen.settings, offload="parameters")))
    assert offloaded["fsdp"]["offload_policy"] == "cpu" and "offload_policy" not in plain["fsdp"]
    config = tmp_path / "config.json"
    config.write_text(json.dumps(CONFIGS[CASE.model]))
    jobs = []
    for name, document in (("plain", plain), ("offloaded", offloaded)):
        (tmp_path / f"{name}.plan.json").write_text(json.dumps(document))
        jobs.append({"plan": str(tmp_path / f"{name}.plan.json"), "config": str(config), "report": str(tmp_path / name), "steps": 2})
    (tmp_path / "jobs.json").write_text(json.dumps(jobs))
    command = [sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-addr", "127.0.0.1",
               "--master-port", str(_free_port()), str(ROOT / "tests" / "integration" / "worker_run_plans.py"),
               str(tmp_path / "jobs.json")]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", "")}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=400)
    assert done.returncode == 0, done.stderr[-4000:]
    reports = {name: [json.loads((tmp_path / name / f"rank{r}.json").read_text()) for r in range(2)] for name in ("plain", "offloaded")}
    assert {r["offload_policy"] for r in reports["offloaded"]} == {"CPUOffloadPolicy"}
    assert {r["offload_policy"] for r in reports["plain"]} == {"OffloadPolicy"}  # FSDP2's default: no offload
    for a, b in zip(reports["plain"], reports["offloaded"]):
        assert b["mean_losses"] == pytest.approx(a["mean_losses"], rel=1e-6)
    full = {name: torch.load(tmp_path / name / "full.pt") for name in ("plain", "offloaded")}
    for key, value in full["plain"]["params"].items():
        torch.testing.assert_close(full["offloaded"]["params"][key], value, rtol=1e-6, atol=1e-7)
