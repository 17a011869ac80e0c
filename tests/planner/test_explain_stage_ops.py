"""``planner explain`` of a table row shows each pipeline stage's ops, priced as the row was (issue 22
item 5, issue 25): the ops' entries plus the stage's redistribution, tied copies and host wait give the
stage's seconds, and their states with the stage's other states its parameters, gradients and optimizer
state; ``--top`` limits the rows; ``compare`` lists the ops whose split differs.

Oracles: each stage's forward, backward and per-step seconds and its states as the search priced them when
it wrote the plan (the saved file's ``pipeline.stages``, not the explain's own pricing); for a one-stage roofline plan
the row's step time itself (one stage, no host floor: ``micro-batches x (F + B) + G``); and, for
``compare``, the ops whose saved configuration (each dim's factor and inter-node part, the copies) differs
between the two files, read from the files.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
GPT2 = ["plan", DATA / "gpt2_tiny.onnx", "-n", "8", "-q"]
SMALL, LARGE = ["--dim", "batch=16", "--dim", "seq=128"], ["--dim", "batch=64", "--dim", "seq=256"]
GENERIC_ROOFLINE = ["--target", "generic", "--engine", "roofline"]
PLANS = {
    # two stages under Megatron-LM's fixed costs: the host-wait floor and the tied embedding's copies
    "pp2_recompute_floor": [*GPT2, *SMALL, "--fix", "pp=2,zero=1,recompute=full"],
    # one stage, ZeRO-3's gathers, full recomputation, mixed per-op splits (redistribution), no floor
    "pp1_zero3_recompute": [*GPT2, *LARGE, *GENERIC_ROOFLINE, "--fix", "pp=1,recompute=full,zero=3"],
    # two stages of mixed per-op splits, ZeRO-3
    "pp2_zero3": [*GPT2, *LARGE, *GENERIC_ROOFLINE, "--fix", "pp=2,zero=3"],
    # FSDP (DTensor's fully_shard): the units held whole at ZeRO-3's peak
    "pp1_fsdp_zero3": [*GPT2, *SMALL, "--target", "dtensor", "--fix", "zero=3"],
    # DeepSpeed's BF16_Optimizer keeps a gradient accumulator at ZeRO 0-1
    "pp1_deepspeed_zero1": [*GPT2, *SMALL, "--target", "deepspeed", "--fix", "zero=1"],
    # context parallelism over two stages (Megatron-LM's cp=2 x tp=2)
    "pp2_cp2": ["plan", DATA / "llama_tiny.onnx", "-n", "8", "-q", "--dim", "batch=4", "--dim", "seq=2048",
                "--target", "megatron", "--fix", "cp=2,pp=2,zero=1"],
}


@pytest.fixture(scope="module")
def plans(tmp_path_factory):
    """Each case's row 1 saved with ``--export generic``, its file and its ``explain --json``."""
    folder = tmp_path_factory.mktemp("stage_ops")
    out = {}
    for name, command in PLANS.items():
        path = folder / f"{name}.json"
        run_cli([*command, "--pick", 1, "--export", "generic", "-o", path])
        out[name] = (path, json.loads(path.read_text()), json.loads(run_cli(["explain", path, "--json"]).stdout))
    return out


def _stage_sums(stage: dict) -> tuple[float, float, float]:
    """Forward and backward per micro-batch and the per-step seconds, from the stage's op rows and other terms."""
    rows, terms = stage["op_rows"], stage["other_terms_s"]
    half = terms["redistribution"] / 2.0
    forward = sum(r["forward_s"] for r in rows) + half + terms["tied_copies_forward"] + terms["host_wait_forward"]
    backward = sum(r["backward_s"] for r in rows) + half + terms["tied_copies_backward"] + terms["host_wait_backward"]
    return forward, backward, sum(r["step_s"] for r in rows) + terms["tied_copies_step"] + terms["first_forward"]


@pytest.mark.parametrize("name", sorted(PLANS))
def test_the_ops_add_up_to_each_stage_as_saved(plans, name):
    _, saved, explained = plans[name]
    section = saved["pipeline"]
    assert len(explained["stages"]) == section["pp"] == len(section["stages"])
    for stage, priced in zip(explained["stages"], section["stages"]):
        assert sorted(r["op"] for r in stage["op_rows"]) == sorted(saved["ops"][i]["name"] for i in priced["ops"])
        forward, backward, per_step = _stage_sums(stage)
        assert forward == pytest.approx(priced["forward_s"], rel=1e-9, abs=1e-15), (name, stage["index"])
        assert backward == pytest.approx(priced["backward_s"], rel=1e-9, abs=1e-15), (name, stage["index"])
        assert per_step == pytest.approx(priced["grad_sync_s"], rel=1e-9, abs=1e-15), (name, stage["index"])
        memory = priced["memory"]  # the ops' states and the stage's other states give its parameters, gradients, optimizer
        states = sum(r["states_bytes"] for r in stage["op_rows"]) + sum(stage["other_states_bytes"].values())
        assert states == pytest.approx(memory["params_bytes"] + memory["grads_bytes"] + memory["optimizer_bytes"],
                                       rel=1e-9), (name, stage["index"])
        for row in stage["op_rows"]:  # its per-step seconds are its passes times the micro-batches and its step
            assert row["per_step_s"] == pytest.approx(
                section["micro_batches"] * (row["forward_s"] + row["backward_s"]) + row["step_s"], rel=1e-12)


def test_the_cases_reach_the_terms_they_are_for(plans):
    """Each case exercises what it is named for, so the sums above check those terms."""
    def stages(name: str) -> list[dict]:
        return plans[name][2]["stages"]

    floored = stages("pp2_recompute_floor")
    assert all(s["other_terms_s"]["host_wait_forward"] > 0 for s in floored)  # the fixed-cost floor binds
    assert any(s["other_terms_s"]["tied_copies_step"] > 0 for s in floored)  # the tied embedding on both stages
    assert plans["pp2_recompute_floor"][2]["recompute"] == "full"
    for name in ("pp1_zero3_recompute", "pp2_zero3"):
        assert plans[name][2]["zero_stage"] == 3
        assert all(s["other_terms_s"]["host_wait_forward"] == 0 for s in stages(name))  # the roofline has no floor
        assert all(s["other_terms_s"]["redistribution"] > 0 for s in stages(name))  # mixed splits
    assert plans["pp1_zero3_recompute"][2]["recompute"] == "full"
    assert any(r["zero_comm_s"] > 0 for r in stages("pp1_zero3_recompute")[0]["op_rows"])  # ZeRO-3's gathers
    assert stages("pp2_zero3")[1]["other_terms_s"]["tied_copies_forward"] > 0  # the tied copy's ZeRO-3 gather
    assert plans["pp2_cp2"][2]["cp"] == 2 and plans["pp2_cp2"][2]["pp"] == 2
    assert any(s["other_states_bytes"]["tied_copies"] > 0 for s in floored)
    assert stages("pp1_fsdp_zero3")[0]["other_states_bytes"]["zero3_held_whole"] > 0
    assert stages("pp1_deepspeed_zero1")[0]["other_states_bytes"]["grad_accumulator"] > 0


def test_one_roofline_stage_adds_up_to_the_rows_step_time(plans):
    """One stage and no floor: the step is ``m x (F + B) + G``, so the ops' seconds per step, the
    redistribution and the tied copies give the row's step time."""
    _, saved, explained = plans["pp1_zero3_recompute"]
    (stage,) = explained["stages"]
    m, terms = explained["micro_batches"], stage["other_terms_s"]
    total = (sum(r["per_step_s"] for r in stage["op_rows"]) + m * terms["redistribution"]
             + m * (terms["tied_copies_forward"] + terms["tied_copies_backward"]) + terms["tied_copies_step"])
    assert total == pytest.approx(saved["objectives"]["time_s"], rel=1e-9)


def _table_ops(text: str, stage: int) -> list[str]:
    """The first cells of stage ``stage``'s per-op table rows in ``explain``'s text."""
    block = text.split(f"Stage {stage} by op", 1)[1].split("Stage ", 1)[0]
    return [m.group(1).strip() for m in re.finditer(r"^│ ([^│]+?) +│", block, flags=re.MULTILINE)]


def test_top_limits_the_rows_and_all_lists_every_op(plans):
    path, _, explained = plans["pp2_recompute_floor"]
    limited = run_cli(["explain", path, "--top", 2]).stdout
    everything = run_cli(["explain", path, "--all"]).stdout
    for stage in explained["stages"]:
        names = [r["op"] for r in stage["op_rows"]]
        shown = [cell for cell in _table_ops(limited, stage["index"]) if cell in names]
        assert 2 <= len(shown) <= 4  # the top 2 by time and the top 2 by memory
        assert f"the other {len(names) - len(shown)} ops" in _table_ops(limited, stage["index"])
        assert sorted(c for c in _table_ops(everything, stage["index"]) if c in names) == sorted(names)
        assert not any(c.startswith("the other") for c in _table_ops(everything, stage["index"]))


def _layouts(saved: dict) -> dict[str, tuple]:
    """Each op's saved configuration: its dims' factors and inter-node parts, and its copies."""
    return {op["name"]: (tuple((d["name"], d["factor"], d["inter"]) for d in op["dims"]),
                         op.get("replicas", {}).get("count", 1)) for op in saved["ops"]}  # fmt: skip


def test_compare_lists_the_ops_whose_split_differs(plans):
    (path_a, saved_a, _), (path_b, saved_b, _) = plans["pp1_zero3_recompute"], plans["pp2_zero3"]
    a, b = _layouts(saved_a), _layouts(saved_b)
    differ = {name for name in a.keys() | b.keys() if a.get(name) != b.get(name)}
    assert differ  # the two plans split some op differently
    compared = json.loads(run_cli(["compare", path_a, path_b, "--json"]).stdout)
    assert {r["op"] for r in compared["ops_that_differ"]} == differ
    deltas = [abs(r["per_step_delta_s"]) for r in compared["ops_that_differ"]]
    assert deltas == sorted(deltas, reverse=True)
    text = run_cli(["compare", path_a, path_b, "--top", 1]).stdout
    assert f"Ops whose split differs ({len(differ)}; top 1" in text
    assert compared["ops_that_differ"][0]["op"] in text.split("Ops whose split differs", 1)[1]


# Fixed costs (issue 23 item 1): each op's kernel launches and collectives' latency, split out of its
# priced seconds. Oracles: the op rows' forward + backward and communication by kind as the plan prices
# them; the launch formula max(n kappa, n h - work) with the device's defaults (docs/COST_MODEL.md, 5 us and
# 30 us); NCCL's tuning model (src/graph/tuning.cc: baseLat, NVLink hwLat, protocol shares) by hand.
EXECUTION_PLANS = ("pp2_recompute_floor", "pp1_fsdp_zero3", "pp1_deepspeed_zero1", "pp2_cp2")


@pytest.mark.parametrize("name", EXECUTION_PLANS)
def test_fixed_costs_add_up_to_each_op_stage_and_step(plans, name):
    from planner.core.cluster import Device

    kappa, host = Device.__dataclass_fields__["kernel_overhead_s"].default, Device.__dataclass_fields__["host_dispatch_s"].default
    setup = Device.__dataclass_fields__["collective_overhead_s"].default
    _, saved, explained = plans[name]
    most = {"kernel_launches": 0.0, "collective_latency": 0.0}
    for stage in explained["stages"]:
        rows = stage["op_rows"]
        for r in rows:
            work, launch, kernels = r["work_s"], r["launch_s"], r["kernels"]
            for p in ("forward", "backward"):  # each pass: max(work + n kappa, n h) - work
                assert launch[p] == pytest.approx(max(kernels[p] * kappa, kernels[p] * host - work[p]), abs=1e-15)
            passes = sum(work.values()) + sum(launch.values())
            by_kind: dict[str, float] = {}
            for c in r["collectives"]:
                by_kind[c["kind"]] = by_kind.get(c["kind"], 0.0) + c["seconds"] + c["setup_s"]
                assert c["setup_s"] in (0.0, setup) and 0.0 < c["latency_s"] < c["seconds"]
            assert by_kind == pytest.approx(r["comm_s"], rel=1e-9), r["op"]
            assert passes + sum(by_kind.values()) + r["zero_comm_s"] == pytest.approx(
                r["forward_s"] + r["backward_s"], rel=1e-9, abs=1e-15), r["op"]
        sums = stage["fixed_per_micro_batch_s"]
        assert sums["kernel_launches"] == pytest.approx(sum(sum(r["launch_s"].values()) for r in rows), rel=1e-12)
        assert sums["collective_latency"] == pytest.approx(
            sum(c["latency_s"] + c["setup_s"] for r in rows for c in r["collectives"]), rel=1e-12, abs=1e-18)
        for key in most:
            most[key] = max(most[key], sums[key])
    m = saved["pipeline"]["global_batch"] // saved["batch"]["micro_batch"]
    for key, value in most.items():  # a step's line: the stage with the most, times the micro-batches
        assert explained["fixed_costs_s"][key] == pytest.approx(m * value, rel=1e-12, abs=1e-18)
    assert any(r["collectives"] for s in explained["stages"] for r in s["op_rows"]) == (name != "pp1_deepspeed_zero1")


def test_a_collectives_latency_is_nccls_tuning_formula(plans):
    _, saved, explained = plans["pp2_recompute_floor"]  # tp=4 in one node: all-reduces priced by NCCL's tuner
    link = saved["cluster"]["intra_link"]
    bus = link["bandwidth_bytes_per_s"] * link["collective_efficiency"]
    base = {("ring", "LL"): 3.6, ("ring", "LL128"): 10.0, ("ring", "Simple"): 8.4,
            ("tree", "LL"): 4.4, ("tree", "LL128"): 4.4, ("tree", "Simple"): 0.0}
    hop = {("ring", "LL"): 0.47, ("ring", "LL128"): 1.9, ("ring", "Simple"): 3.4,
           ("tree", "LL"): 0.52, ("tree", "LL128"): 1.2, ("tree", "Simple"): 28.0}
    share = {("ring", "LL"): 1 / 4, ("ring", "LL128"): 0.92, ("ring", "Simple"): 1.0,
             ("tree", "LL"): 0.9 / 3.8, ("tree", "LL128"): 0.9 * 7 / 9, ("tree", "Simple"): 0.9}
    checked = 0
    for r in (r for s in explained["stages"] for r in s["op_rows"]):
        for c in r["collectives"]:
            assert (c["collective"], c["model"], c["nodes"]) == ("all_reduce", "nccl", 1)
            b, n = c["bytes"], c["devices"]
            latency = {pair: (base[pair] + 2 * (n - 1) * hop[pair]) * 1e-6 for pair in base}
            moved = {pair: b * 2 * (n - 1) / n / (bus * share[pair]) if pair[0] == "ring"
                     else b / (min(bus * 0.9, 110e9) * share[pair] / 0.9 * 0.5) for pair in base}
            best = min(base, key=lambda pair: latency[pair] + moved[pair])
            assert (c["algorithm"], c["protocol"]) == best
            assert c["latency_s"] == pytest.approx(c["count"] * latency[best], rel=1e-12)
            assert c["seconds"] == pytest.approx(c["count"] * (latency[best] + moved[best]), rel=1e-12)
            checked += 1
    assert checked >= 2  # 262,144 B over 4 GPUs: ring LL, 3.6 + 6 x 0.47 = 6.42 us of latency
