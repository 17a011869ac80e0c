"""DeepSpeed's rows of ``planner plan`` are priced under its own ZeRO-3 rule (one sub-module gathered at a
time, ``objectives.memory.deepspeed_gathered_peak``), with no cost cache of their own: the launcher's
``Target.zero3_gather`` reaches the pricing per search (``TargetRules.zero3_gather``), each point
carries it (``PipelinePoint.zero3_gather``) to its plan file, and ``planner explain`` prices the file
alike. Bytes by hand on gpt2_tiny; the every-launcher frontier's DeepSpeed rows equal the
``--target deepspeed`` ones (the pruning bounds, shared by the launchers' searches over one cache, leave
the ZeRO-3 unsharded term out, so they hold under either rule)."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import pytest

from exporters.deepspeed.zero3 import ZERO3_GATHER
from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from planner.launchable import export_row, plan_launchable_file, reprice_saved
from planner.plan import PlanRequest
from tests.objectives.test_deepspeed_memory import TINY, TINY_GATHER
from tests.planner.cli_helpers import run_cli

# gpt2_tiny (tests/objectives/test_deepspeed_memory.py): its sub-modules hold 164,096 elements, the
# embedding 64,000 + five norms x 128 + two blocks x (12,480 + 4,160 + 16,640 + 16,448); the position
# table (128 x 64 = 8,192 elements) gathers nothing and is held whole. On 8 data-parallel ranks at
# ZeRO-3, bf16, each device holds 2 x 164,096 / 8 = 41,024 B of sharded parameters + the position
# table's 16,384 B (and as many bytes of gradients)
WHOLE = 164_096
SHARDED = 2 * WHOLE // 8 + 2 * 8_192  # 57,408 B


def test_a_deepspeed_zero3_row_is_priced_and_explained_under_its_rule(tmp_path: Path):
    # DeepSpeed 0.19.8's defaults (ZERO3_GATHER): every sub-module is under the persistence threshold
    # (1e5 elements), so all of them stay whole (2 x 164,096 = 328,192 B) and none is gathered on the
    # fly (no running gradient); the reduce bucket is 5e8 elements in bf16, 1e9 B. The FSDP2 rule
    # would have held a block or two, not the whole model and a 1 GB bucket
    plan = tmp_path / "plan.json"
    table = run_cli(["plan", TINY, "--dim", "seq=128", "--dim", "batch=8", "-n", "8", "--target", "deepspeed",
                     "--fix", "zero=3,dp=8", "--pick", "1", "-o", plan, "--json", "-q"])
    row = json.loads(table.stdout)["rows"][0]
    assert (row["zero_stage"], row["dp"], row["targets"]) == (3, 8, ["deepspeed"])
    assert row["memory_breakdown_bytes"]["params"] == SHARDED + 2 * WHOLE == 385_600
    assert row["memory_breakdown_bytes"]["grads"] == SHARDED + 2 * ZERO3_GATHER.reduce_bucket == 1_000_057_408
    saved = json.loads(plan.read_text())
    assert saved["training"]["zero3_gather"] == dataclasses.asdict(ZERO3_GATHER)  # what it was priced with
    again = json.loads(run_cli(["explain", plan, "--json"]).stdout)
    assert again["memory_per_device_bytes"] == pytest.approx(row["memory_per_device_bytes"], rel=1e-12)
    assert again["memory_breakdown_bytes"] == pytest.approx(row["memory_breakdown_bytes"], rel=1e-12)


def _frontier(launchers):
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=8))
    _, (found,) = plan_launchable_file(TINY, {"batch": 8, "seq": 128}, [request], launchers=launchers, collapse=0.0)
    return found


@pytest.fixture(scope="module")
def frontiers():
    # bounds under which DeepSpeed's ZeRO-3 rows reach the every-launcher frontier on gpt2_tiny (its
    # defaults' 1 GB bucket puts them far behind the other launchers' rows there), and Megatron-LM's rows
    # priced with the gathered input (its kept sequence shard, Target.sequence_shard_saved, makes its
    # dp=2 x tp=4 sp rows dominate every DeepSpeed ZeRO-3 row here: tests/planner/test_launcher_shard_rule.py)
    with pytest.MonkeyPatch.context() as patch:
        patch.setitem(TARGETS, "deepspeed", dataclasses.replace(TARGETS["deepspeed"], zero3_gather=TINY_GATHER))
        patch.setitem(TARGETS, "megatron", dataclasses.replace(TARGETS["megatron"], sequence_shard_saved=False))
        yield _frontier(["deepspeed"]), _frontier(None)


def _plan(row) -> tuple:
    point = row.point
    return (point.pp, point.micro_batch_samples, point.zero_stage, point.recompute, point.choice,
            tuple(s.layers for s in point.stages))


def test_every_launchers_deepspeed_rows_are_the_targets_own(frontiers):
    alone, every = frontiers
    own = [row for row in alone.rows if row.point.zero_stage == 3 and row.degrees.dp == 8]
    assert own and all(row.targets == ("deepspeed",) for row in own)
    for row in own:
        # test_deepspeed_memory.TestGpt2Tiny's bytes under TINY_GATHER: 129,280 B of parameters whole
        # (the embedding + the five persistent norms), 130,000 B of gradients (the embedding's + the bucket)
        assert row.point.memory.params_bytes == pytest.approx(SHARDED + 129_280, rel=1e-12)
        assert row.point.memory.grads_bytes == pytest.approx(SHARDED + 130_000, rel=1e-12)
    by_plan = {_plan(row): row for row in alone.rows}
    listed = [row for row in every.rows if "deepspeed" in row.targets and row.point.zero_stage == 3]
    assert listed  # the fastest DeepSpeed ZeRO-3 row is on the union's frontier
    for row in listed:
        twin = by_plan[_plan(row)]
        assert (row.time_s, row.memory_bytes) == (twin.time_s, twin.memory_bytes)
    # no DeepSpeed ZeRO-3 row the union does not dominate was pruned from it by another launcher's bound
    for row in own:
        beaten = any(other.time_s <= row.time_s and other.memory_bytes <= row.memory_bytes
                     and (other.time_s, other.memory_bytes) != (row.time_s, row.memory_bytes) for other in every.rows)
        assert beaten or _plan(row) in {_plan(r) for r in listed}, row.summary


def test_every_row_prices_again_under_its_launchers_rule(frontiers, tmp_path: Path):
    # the FSDP2 launchers' ZeRO-3 rows keep the per-block rule and no longer name DeepSpeed (which
    # would hold other bytes); each row's plan file prices again to its own bytes
    _, every = frontiers
    # the FSDP2 launchers' own frontier too: on gpt2_tiny their dp x tp ZeRO-3 rows hold a second NCCL group
    # (objectives.nccl_memory), which DeepSpeed's dp=8 rows now dominate on the every-launcher frontier
    fsdp = _frontier(["megatron", "torchtitan"])
    assert any(row.point.zero_stage == 3 and "deepspeed" not in row.targets for row in (*every.rows, *fsdp.rows))
    for frontier in (every, fsdp):
        for index, row in enumerate(frontier.rows):
            assert (row.point.zero3_gather is not None) == (row.point.zero_stage == 3 and "deepspeed" in row.targets)
            path = tmp_path / f"{id(frontier)}-{index}.json"
            path.write_text(json.dumps(export_row(frontier, index, "generic")))
            again = reprice_saved(path, model=TINY)
            assert again.point.memory_bytes == pytest.approx(row.memory_bytes, rel=1e-12), row.summary
            assert again.point.time_s == pytest.approx(row.time_s, rel=1e-12), row.summary
