"""Exported DTensor table plans run on gloo: 2 CPU processes, checked against one process (issue 25).

``tests/data/dlrm_embedding/dlrm_emb_small.onnx`` (``make_dlrm_embedding.py``: DLRM with ``nn.Embedding``
tables of 48 / 32 / 16 rows of 8, 20 indices per sample) is planned on 2 devices with the search
restricted to one table family (rowwise, colwise), and the exported plan is applied by torch itself
(``worker_dtensor_tables.py``: ``parallelize_module`` on ``mesh["dp"]`` with ``RowwiseParallel`` /
``ColwiseParallel`` built from the plan's JSON) to the same model built in torch. Checked against the
model in one process on the whole batch:

* each rank's logits are the whole batch's rows of that rank (the tables' outputs reached the batch
  shards the data-parallel ops read);
* every gradient after the plan's sync (DDP's mean for plain tensors, ``gradient_scale`` for the table
  shards), the table shards gathered with ``full_tensor()``;
* each rank's table shard shape and placement are the plan's ``local_shape`` and ``placements``.

``planner.run`` itself builds Hugging Face models only, so it is not the launcher here.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys

import pytest

torch = pytest.importorskip("torch")

from exporters.dtensor import dtensor_masks, export_dtensor  # noqa: E402
from objectives.cluster import make_cluster  # noqa: E402
from planner.core.settings import TrainingSettings  # noqa: E402
from planner.export import plan_input  # noqa: E402
from planner.plan import PlanRequest, load_graph, plan  # noqa: E402
from tests.integration.plans import ROOT  # noqa: E402

pytestmark = pytest.mark.integration

WORLD = 2
BATCH = 8
"""Global batch: 4 samples per rank."""
STYLES = ("rowwise", "colwise")
ONNX = ROOT / "tests" / "data" / "dlrm_embedding" / "dlrm_emb_small.onnx"
TIMEOUT_S = 300


def _plan(style: str) -> dict:
    graph = load_graph(ONNX, {"batch": BATCH})
    request = PlanRequest(
        cluster=make_cluster("h100-sxm", devices=WORLD),
        settings=TrainingSettings(precision="fp32", optimizer="adam"),
        method="dp",
    )

    def family(graph, spaces, cluster, settings):
        masks = dtensor_masks(graph, spaces, dp=WORLD, tp=1, tables=style, devices_per_node=cluster.devices_per_node)
        assert masks is not None, style
        return [masks]

    return export_dtensor(plan_input(plan(graph, request, target_filter=family, with_targets=False), 0))


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    root = tmp_path_factory.mktemp("tables")
    plans, jobs = {}, []
    for style in STYLES:
        plans[style] = _plan(style)
        path = root / f"{style}.plan.json"
        path.write_text(json.dumps(plans[style]))
        jobs.append({"plan": str(path), "report": str(root / style)})
    (root / "jobs.json").write_text(json.dumps(jobs))
    command = [
        sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(WORLD), "--master-addr", "127.0.0.1",
        "--master-port", str(_free_port()), str(ROOT / "tests" / "integration" / "worker_dtensor_tables.py"), str(root / "jobs.json"),
    ]
    env = {**os.environ, "PYTHONPATH": str(ROOT) + os.pathsep + os.environ.get("PYTHONPATH", ""), "OMP_NUM_THREADS": "1"}
    done = subprocess.run(command, cwd=ROOT, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    assert done.returncode == 0, done.stderr[-6000:]
    return {
        style: (plans[style], [json.loads((root / style / f"rank{r}.json").read_text()) for r in range(WORLD)],
                torch.load(root / style / "full.pt"))
        for style in STYLES
    }


@pytest.fixture(scope="module")
def reference():
    sys.path.insert(0, str(ROOT / "tests" / "integration"))
    from make_dlrm_embedding import build_small, step_batch

    model = build_small()
    dense, indices = step_batch(BATCH)
    logits = model(dense, *indices)
    logits.square().mean().backward()
    return logits.detach().flatten(), {n: p.grad.clone() for n, p in model.named_parameters()}


@pytest.mark.parametrize("style", STYLES)
def test_each_rank_computes_its_batch_rows(runs, reference, style):
    _, reports, _ = runs[style]
    per_rank = BATCH // WORLD
    for rank, report in enumerate(reports):
        want = reference[0][rank * per_rank:(rank + 1) * per_rank]
        torch.testing.assert_close(torch.tensor(report["logits"]), want, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("style", STYLES)
def test_gradients_after_the_plans_sync_equal_one_process(runs, reference, style):
    _, _, grads = runs[style]
    assert set(grads) == set(reference[1])
    for name, want in reference[1].items():
        torch.testing.assert_close(grads[name], want, rtol=1e-5, atol=1e-6, msg=name)


@pytest.mark.parametrize("style", STYLES)
def test_table_shards_are_the_plans(runs, style):
    plan, reports, _ = runs[style]
    placement = {"rowwise": "shard(0)", "colwise": "shard(1)"}[style]
    rows, width = (48, 32, 16), 8
    for report in reports:
        assert set(report["shards"]) == {f"tables.{t}.weight" for t in range(3)}
        for t, (name, shard) in enumerate(sorted(report["shards"].items())):
            # by hand: half the rows (rowwise) or half the width (colwise) of each table on each rank
            want = [rows[t] // 2, width] if style == "rowwise" else [rows[t], width // 2]
            assert shard["local_shape"] == plan["params"][name]["local_shape"] == want
            assert shard["placements"] == [placement] == [plan["params"][name]["placements"]["dp"]]
