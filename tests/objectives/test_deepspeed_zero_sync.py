"""DeepSpeed's ZeRO-1/2 synchronisation as a launcher time rule (``Target.zero_sync``,
``exporters.deepspeed.zero_sync``): its gradient buckets all-reduced (the bf16 ZeRO-1 ``BF16_Optimizer`` after the
backward, unhidden) and the updated parameters all-gathered after the optimizer step, unhidden; Megatron-LM's rows
unchanged. Every expected number is a ring's bytes over bandwidth plus its latencies, by hand, on the 2-layer GPT
replicated over one node of 8 A100s, against Megatron-LM's row of the same plan."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed import TARGET as DEEPSPEED
from exporters.deepspeed.zero_sync import BUCKET_ELEMENTS, zero_sync
from objectives.cluster import make_cluster
from objectives.parameters import parameter_ownership
from planner.core.settings import TrainingSettings, ZeroSync
from planner.pipeline import PipelineCostCache, evaluate_pipeline, graph_loader, target_rules
from tests.objectives.test_fsdp_memory import _replicated  # every op data-parallel: each parameter whole

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"  # 2 layers, hidden 64, 172,288 parameters
KAPPA = 24 / 132  # objectives.intra_op.OVERLAP_CONTENTION: the overlapped part's share that still costs
RANKS = 8
MEGATRON_BUCKET = 40_000_000  # Megatron-Core's max(40M, 1M x dp) parameters at dp = 8
# Megatron-LM's bucket written as a fixed rule: at dp = 8 the same bucket, the same collectives and overlaps, but the
# parameter gather left after the step as DeepSpeed leaves it
GATHER_EXPOSED = ZeroSync(bucket_elements=MEGATRON_BUCKET, gather_overlaps_forward=False)


@pytest.fixture(scope="module")
def cache():
    settings = TrainingSettings(engine="fused", attention="flash")  # DeepSpeed's and Megatron-LM's execution model
    return PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=make_cluster("a100-80gb", devices=RANKS),
                             settings=settings)


def _plan(cache, zero: int) -> dict:
    choice = _replicated(cache.model(RANKS, RANKS, zero, "none"), RANKS)
    return dict(pp=1, batch=RANKS, zero_stage=zero, recompute="none", choice=choice, bounds=(0, 2), global_batch=RANKS)


def _exposed(comm: float, window: float) -> float:
    """What stays on the critical path of ``comm`` seconds beside ``window`` seconds of compute."""
    return max(0.0, comm - window) + KAPPA * min(comm, window)


def _ops_by_hand(cache, choice) -> list[dict]:
    """Per op that synchronises parameters: its gradient tensors' bytes (bf16, 2 B per element; each whole on
    every rank, reduced over the 8 ranks that split the op's batch), its forward and backward compute at the plan's choice (the windows), and the ring times on the
    node's link: all-reduce 2 (n-1)/n B/bw + 2 (n-1) alpha, reduce-scatter and all-gather half of each."""
    model = cache.model(RANKS, RANKS, 0, "none")
    link = cache.cluster.intra_link
    bandwidth, alpha = link.collective_bandwidth_bytes_per_s, link.latency_s
    ops = []
    for index, positions in enumerate(parameter_ownership(model.graph)):
        op = model.graph.ops[index]
        sizes = [2.0 * float(np.prod(model.graph.tensors[op.inputs[p].tensor].shape)) for p in positions]
        if not sizes or not any(d.is_batch for d in op.dims):
            continue  # the position table's lookup has no batch dim: not split, its gradient on no group
        detail, c = model.op_details[index], int(choice[index])
        forward = float(detail.forward_s[c])
        backward = float(detail.compute_s[c] - detail.recompute_s[c] - detail.optimizer_s[c]) - forward
        ring = sum(sizes) * (RANKS - 1) / RANKS / bandwidth  # one pass of every tensor around the ring
        ops.append(dict(bytes=sum(sizes), tensors=len(sizes), forward=forward, backward=backward, ring=ring,
                        hop=(RANKS - 1) * alpha))
    return ops


def _megatron_sync(op: dict) -> float:
    """Megatron-LM: reduce-scatter beside backward, all-gather beside forward, latency per 40M-parameter bucket."""
    share = min(1.0, op["bytes"] / (MEGATRON_BUCKET * 2))
    each = op["ring"] + share * op["tensors"] * op["hop"]
    return _exposed(each, op["backward"]) + _exposed(each, op["forward"])


def _deepspeed_zero1_sync(op: dict) -> float:
    """DeepSpeed bf16 ZeRO-1 (BF16_Optimizer): all-reduce after backward and all-gather after the step, both whole,
    latency per 5e8-element bucket."""
    share = min(1.0, op["bytes"] / (BUCKET_ELEMENTS * 2))
    return 2 * op["ring"] + op["ring"] + share * op["tensors"] * (2 * op["hop"] + op["hop"])


class TestTheRule:
    """DeepSpeed 0.19.8's source (checked against the package: tests/integration/test_deepspeed_zero_sync.py)."""

    def test_which_optimizer_syncs_how(self):
        bf16_zero1 = zero_sync(zero_stage=1, precision="bf16-mixed")
        assert bf16_zero1 == ZeroSync(bucket_elements=500_000_000, reduction="all_reduce",
                                      reduction_overlaps_backward=False, gather_overlaps_forward=False)
        # DeepSpeedZeroOptimizer (ZeRO-2; ZeRO-1 offloaded or in fp32): overlap_comm as the export writes it
        for stage, precision, offload in ((2, "bf16-mixed", "none"), (1, "fp32", "none"), (1, "bf16-mixed", "optimizer")):
            rule = zero_sync(zero_stage=stage, precision=precision, offload=offload)
            assert rule.reduction == "all_reduce" and rule.reduction_overlaps_backward and not rule.gather_overlaps_forward
        assert zero_sync(zero_stage=3, precision="fp32") is None  # ZeRO-0: tests/objectives/test_deepspeed_zero0_sync.py

    def test_handed_per_plan(self):
        assert DEEPSPEED.zero_sync is zero_sync and target_rules("deepspeed").zero_sync is zero_sync
        assert target_rules("megatron").zero_sync is None and target_rules("torchtitan").zero_sync is None

    def test_bad_rule(self):
        from planner.core.errors import InputError

        with pytest.raises(InputError, match="bucket_elements"):
            ZeroSync(bucket_elements=0)
        with pytest.raises(InputError, match="reduction"):
            ZeroSync(bucket_elements=1, reduction="broadcast")  # type: ignore[arg-type]


class TestOneOpByHand:
    def test_terms_and_windows(self):
        """One 8M-parameter weight over 8 ranks on a 100 GB/s link: DeepSpeed all-reduces 16 MB and gathers 16 MB,
        neither hidden; Megatron-LM reduce-scatters and hides both."""
        from objectives.intra_op import CommTerm, bucketed_grad_sync_s, grad_bucket_bytes, overlapped_zero_sync_s, zero_sync_split
        from planner.core.cluster import Link

        link = Link(name="nv", bandwidth_bytes_per_s=100e9, latency_s=1e-5)
        cluster = dataclasses.replace(make_cluster("a100-80gb", devices=8), intra_link=link, inter_link=link)
        settings = TrainingSettings(zero_stage=1, zero_sync=zero_sync(zero_stage=1, precision="bf16-mixed"))
        nbytes = 16e6
        common = dict(kind="grad_sync", tensor="w", intra_size=np.array([8]), inter_size=np.array([1]),
                      num_bytes=np.array([nbytes]))
        terms = [CommTerm(collective="all_reduce", **common), CommTerm(collective="all_gather", **common)]
        bucket = grad_bucket_bytes(terms, settings)
        assert bucket == 500_000_000 * 2
        split = zero_sync_split(terms, cluster=cluster, size=1, bucket_bytes=bucket)
        ring, share = 7 / 8 * nbytes / (100e9 * link.collective_efficiency), nbytes / 1e9
        window = np.array([1.0])  # a second of compute would hide either
        reductions, gathers = overlapped_zero_sync_s(split, forward_s=window, backward_s=window, rule=settings.zero_sync)
        assert reductions["intra"][0] == pytest.approx(2 * ring + 14 * 1e-5 * share)
        assert gathers["intra"][0] == pytest.approx(ring + 7 * 1e-5 * share)
        hidden = overlapped_zero_sync_s(split, forward_s=window, backward_s=window)  # Megatron-LM's windows
        assert hidden[1]["intra"][0] == pytest.approx(KAPPA * (ring + 7 * 1e-5 * share))
        whole = bucketed_grad_sync_s(terms, cluster=cluster, size=1, bucket_bytes=bucket)
        assert whole["intra"][0] == pytest.approx(3 * ring + 21 * 1e-5 * share)

    def test_the_terms_follow_the_rule(self):
        from objectives.intra_op import _zero_terms

        shard, group = np.array([1e6]), np.array([8])
        megatron = _zero_terms("w", shard, group, np.array([1]), settings=TrainingSettings(zero_stage=2), recomputed=False)
        deepspeed = _zero_terms("w", shard, group, np.array([1]), recomputed=False,
                                settings=TrainingSettings(zero_stage=2, zero_sync=zero_sync(zero_stage=2, precision="bf16-mixed")))
        assert [t.collective for t in megatron] == ["reduce_scatter", "all_gather"]
        assert [t.collective for t in deepspeed] == ["all_reduce", "all_gather"]
        assert deepspeed[0].num_bytes[0] == megatron[0].num_bytes[0] == 2e6  # the bf16 gradient shard either way


class TestRowsByHand:
    def test_deepspeed_zero1_row_against_megatrons(self, cache):
        """The same ZeRO-1 plan: DeepSpeed's row is Megatron-LM's plus, per op, its whole all-reduce and all-gather
        less Megatron-LM's overlapped reduce-scatter and all-gather (a one-stage step adds the per-step syncs)."""
        plan = _plan(cache, 1)
        megatron = evaluate_pipeline(cache, **plan)
        deepspeed = evaluate_pipeline(cache, **plan, zero_sync=DEEPSPEED.zero_sync)
        ops = _ops_by_hand(cache, plan["choice"])
        assert len(ops) == 14  # wte, 2 x (ln_1, c_attn, c_proj, ln_2, c_fc, c_proj), ln_f
        assert sum(op["bytes"] for op in ops) == 2 * (172_288 - 128 * 64)  # all but the position table
        expected = sum(_deepspeed_zero1_sync(op) - _megatron_sync(op) for op in ops)
        assert deepspeed.time_s - megatron.time_s == pytest.approx(expected, rel=1e-9)
        assert deepspeed.time_s > megatron.time_s
        assert deepspeed.zero_sync == zero_sync(zero_stage=1, precision="bf16-mixed") and megatron.zero_sync is None
        assert deepspeed.memory_bytes == megatron.memory_bytes  # a time rule only

    def test_slower_by_exactly_the_exposed_gather(self, cache):
        """Megatron-LM's own bucket and reductions with the gather after the step: slower by the gather's hidden
        part alone, per op its whole time less what stayed exposed beside the forward."""
        plan = _plan(cache, 1)
        megatron = evaluate_pipeline(cache, **plan)
        assert evaluate_pipeline(cache, **plan, zero_sync=ZeroSync(bucket_elements=MEGATRON_BUCKET)).time_s == megatron.time_s
        exposed = evaluate_pipeline(cache, **plan, zero_sync=GATHER_EXPOSED)
        gathers = [op["ring"] + min(1.0, op["bytes"] / (MEGATRON_BUCKET * 2)) * op["tensors"] * op["hop"]
                   for op in _ops_by_hand(cache, plan["choice"])]
        forwards = [op["forward"] for op in _ops_by_hand(cache, plan["choice"])]
        hidden = sum(g - _exposed(g, f) for g, f in zip(gathers, forwards))
        assert hidden > 0.0
        assert exposed.time_s - megatron.time_s == pytest.approx(hidden, rel=1e-9)

    def test_no_rule_at_zero3(self, cache):
        plan = _plan(cache, 3)
        point = evaluate_pipeline(cache, **plan, zero_sync=DEEPSPEED.zero_sync)
        assert point.time_s == evaluate_pipeline(cache, **plan).time_s and point.zero_sync is None


class TestCarried:
    def test_the_search_the_listing_and_the_export(self, cache):
        """DeepSpeed's search prices its ZeRO-1/2 rows under its rule and records it; a ZeRO-2 row priced by
        Megatron-LM's search is not DeepSpeed's (listing and export), nor DeepSpeed's Megatron-LM's."""
        from exporters import export, runnable_targets
        from exporters.targets import runnable_plan_targets
        from planner.core.errors import UnsupportedExport
        from planner.pipeline import PipelineOptions, pipeline_search, point_plan_input

        options = PipelineOptions(global_batch=8, pipeline_sizes=(1,), zero_stages=(2,), recompute=("none",))
        ours = pipeline_search(cache, cluster=cache.cluster, options=options, target="deepspeed").points
        theirs = pipeline_search(cache, cluster=cache.cluster, options=options, target="megatron").points
        assert ours and theirs
        rule = zero_sync(zero_stage=2, precision="bf16-mixed")
        # a plan on one data-parallel rank moves no ZeRO state: no rule recorded (Megatron-LM's None), still DeepSpeed's
        assert all(p.zero_sync == (rule if p.dp > 1 else None) for p in ours) and all(p.zero_sync is None for p in theirs)
        alone = [point_plan_input(p, cache) for p in ours if p.dp == 1]
        assert alone and all("deepspeed" in runnable_plan_targets([a])[0] for a in alone)
        assert not any(DEEPSPEED.unpriced_sync(a.settings, 1) for a in alone)
        mine = point_plan_input(next(p for p in ours if p.dp > 1), cache)
        other = point_plan_input(next(p for p in theirs if p.dp > 1), cache)
        assert mine.settings.zero_sync == rule and other.settings.zero_sync is None
        assert "deepspeed" in runnable_plan_targets([mine])[0] and "megatron" not in runnable_plan_targets([mine])[0]
        assert "deepspeed" not in runnable_plan_targets([other])[0] and "deepspeed" not in runnable_targets(other)
        # DeepSpeed's own layout priced under Megatron-LM's rule (its exporter takes the layout: the refusal is the rule's;
        # on Megatron-LM's own rows, at tp > 1, AutoTP's refusal of GPT-2's Conv1D comes first)
        priced_otherwise = dataclasses.replace(mine, settings=dataclasses.replace(mine.settings, zero_sync=None))
        with pytest.raises(UnsupportedExport, match="synchronises ZeRO-2's sharded optimizer otherwise"):
            export("deepspeed", priced_otherwise)
        # the same plan with the rule priced is DeepSpeed's: its export writes the overlap it was priced with
        config = export("deepspeed", mine)["ds_config"]
        assert config["zero_optimization"]["overlap_comm"] is True and config["zero_optimization"]["stage"] == 2

    def test_the_public_form_and_the_estimate_rows(self):
        from exporters.generic import _training_section
        from objectives.calibration import StepRow
        from planner.calibrate import row_settings

        settings = TrainingSettings(zero_stage=1, zero_sync=zero_sync(zero_stage=1, precision="bf16-mixed"))
        section = _training_section(settings)
        assert section["zero_sync"] == dataclasses.asdict(settings.zero_sync)
        assert "zero_sync" not in _training_section(TrainingSettings(zero_stage=1))
        fields = {f.name for f in dataclasses.fields(StepRow)}
        base = dict(id="r", model={}, device="a100-80gb", devices=8, devices_per_node=8, tp=1, pp=1, dp=8,
                    micro_batch=1, global_batch=8, recompute="none", step_s=1.0)
        row = StepRow(**{k: v for k, v in base.items() if k in fields}, zero=1, launcher="deepspeed")  # BLOOM's kind
        assert row_settings(row).zero_sync == settings.zero_sync
        assert row_settings(dataclasses.replace(row, launcher="megatron")).zero_sync is None
        assert row_settings(dataclasses.replace(row, zero=3)).zero_sync is None
