"""HSDP in the launch search: searched at a node's devices for the launchers that run it, pinned by
``--fix hsdp=N``, shown in the ZeRO column, exported and priced again from the saved plan."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters import export
from objectives.cluster import make_cluster
from planner.core.degrees import Pins, parse_fix
from planner.core.errors import InputError
from planner.launchable import plan_launchable_file, reprice_saved, row_plan_input
from planner.plan import PlanRequest
from planner.render import _zero_text

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama.onnx"  # 155.7M parameters (examples/models.json), 8 layers, hidden 1024
PARAMS = 155_730_944


def _frontier(pins: Pins):
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
    _, (found,) = plan_launchable_file(LLAMA, {"batch": 16, "seq": 128}, [request], launchers=["torchtitan"],
                                       collapse=0.0, pins=pins)
    return found


@pytest.fixture(scope="module")
def pinned():
    return _frontier(Pins(hsdp=8, pp=1, recompute="op"))


def test_pinned_rows_are_hybrid_and_say_so(pinned):
    assert pinned.rows
    for row in pinned.rows:
        # 16 data-parallel ranks as 2 replicas x a shard group of 8 (a node), ZeRO-3 (FSDP2)
        assert (row.cache.settings.dp_shard, row.degrees.dp, row.point.zero_stage) == (8, 16, 3)
        assert _zero_text(row) == "3 (hsdp 8)" and "(hsdp 8)" in row.summary
        assert row.targets == ("torchtitan",)


def test_states_by_hand_against_plain_fsdp(pinned):
    # dp=16, tp=1: every parameter's 16 bytes (bf16 + Adam) divided by 8 instead of 16, so the
    # hybrid row holds 16 P (1/8 - 1/16) = P more bytes of states, plus the 10% allowance on them
    # (objectives.memory.OTHER_FRACTION); activations are the same plan's
    plain = _frontier(Pins(dp=16, pp=1, recompute="op", zero=3))
    hybrid = next(r for r in pinned.rows if r.point.micro_batch == 1)
    flat = next(r for r in plain.rows if r.point.micro_batch == 1 and r.cache.settings.dp_shard is None)
    def states(row):
        m = row.point.memory
        return m.params_bytes + m.grads_bytes + m.optimizer_bytes

    assert states(hybrid) - states(flat) == pytest.approx(16 * PARAMS * (1 / 8 - 1 / 16), rel=1e-9)
    assert hybrid.point.memory.activations_bytes == flat.point.memory.activations_bytes
    assert hybrid.point.memory.allocator_bytes - flat.point.memory.allocator_bytes == pytest.approx(
        1.1 * 16 * PARAMS / 16, rel=1e-9)
    # and NCCL's buffers of one more group (the shard group and the replicas' where plain FSDP has one):
    # 32 channels x 9,633,792 bytes (objectives.nccl_memory)
    assert hybrid.point.memory.nccl_bytes - flat.point.memory.nccl_bytes == 32 * 9_633_792


def test_exported_and_repriced(pinned, tmp_path):
    row = pinned.rows[0]
    titan = export("torchtitan", row_plan_input(row))
    assert titan["degrees"]["dp_replicate"] == 2 and titan["degrees"]["dp_shard"] == 8
    overrides = titan["overrides"]
    assert overrides[overrides.index("--parallelism.data_parallel_shard_degree") + 1] == "8"
    assert overrides[overrides.index("--parallelism.data_parallel_replicate_degree") + 1] == "2"
    path = tmp_path / "plan.json"
    path.write_text(json.dumps(export("generic", row_plan_input(row))))
    again = reprice_saved(path, model=LLAMA)
    assert again.point.time_s == pytest.approx(row.time_s, rel=1e-9)
    assert again.point.memory_bytes == pytest.approx(row.memory_bytes, rel=1e-9)


def test_fix_hsdp_is_read_and_checked():
    assert parse_fix("hsdp=8,zero=3").pinned == {"zero": 3, "hsdp": 8}
    with pytest.raises(InputError, match="--fix hsdp"):
        parse_fix("hsdp=0")


def test_hsdp_pins_that_cannot_run_are_one_line_errors():
    with pytest.raises(InputError, match="ZeRO-0 shards none"):
        parse_fix("hsdp=8,zero=0")
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=16, devices_per_node=8))
    with pytest.raises(InputError, match="no listed launcher runs HSDP"):
        plan_launchable_file(ROOT / "tests" / "data" / "gpt2_tiny.onnx", {"batch": 16, "seq": 64}, [request],
                             launchers=["meshtf"], pins=Pins(hsdp=8))  # deepspeed runs hpZ (test_deepspeed_hpz)
