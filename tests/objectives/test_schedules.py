"""Pipeline schedules: closed forms against the schedules' definitions and an event simulation."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.schedules import (
    boundary_crosses_node,
    bubble_fraction,
    check_schedule,
    in_flight_micro_batches,
    p2p_time_s,
    pipeline_time_lower_bound_s,
    pipeline_time_s,
    simulate,
    stage_orders,
)
from planner.core.cluster import Cluster, Device, Link
from planner.core.errors import InputError

SIZES = [(1, 1), (1, 5), (2, 1), (2, 4), (3, 2), (4, 4), (4, 8), (5, 3), (8, 32)]


class TestBubbleFraction:
    @pytest.mark.parametrize("stages, micro_batches", SIZES)
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_closed_form(self, schedule, stages, micro_batches):
        expected = (stages - 1) / (micro_batches + stages - 1)
        assert bubble_fraction(schedule, stages=stages, micro_batches=micro_batches) == pytest.approx(expected)

    @pytest.mark.parametrize("stages, micro_batches, chunks", [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 4)])
    def test_interleaved_closed_form(self, stages, micro_batches, chunks):
        # Megatron-LM (SC'21, Sec. 2.2.2): the bubble shrinks by the chunk count v: (p-1)/(v m) of the
        # ideal time, i.e. an idle fraction (p-1) / (v m + p - 1).
        expected = (stages - 1) / (chunks * micro_batches + stages - 1)
        got = bubble_fraction("interleaved", stages=stages, micro_batches=micro_batches, chunks=chunks)
        assert got == pytest.approx(expected)

    @pytest.mark.parametrize("stages, micro_batches", SIZES)
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_simulated_idle_share_of_equal_stages(self, schedule, stages, micro_batches):
        timeline = simulate(
            schedule, forward_s=[1.0] * stages, backward_s=[2.0] * stages, micro_batches=micro_batches
        )
        assert timeline.makespan_s == pytest.approx((micro_batches + stages - 1) * 3.0)
        assert timeline.bubble_fraction == pytest.approx((stages - 1) / (micro_batches + stages - 1))

    @pytest.mark.parametrize("stages, micro_batches, chunks", [(2, 4, 2), (4, 8, 2), (4, 4, 3), (3, 6, 2)])
    def test_simulated_interleaved_idle_share(self, stages, micro_batches, chunks):
        timeline = simulate(
            "interleaved", forward_s=[1.0] * stages, backward_s=[2.0] * stages, micro_batches=micro_batches,
            chunks=chunks,
        )
        assert timeline.bubble_fraction == pytest.approx(
            (stages - 1) / (chunks * micro_batches + stages - 1)
        )


class TestInFlight:
    def test_definitions(self):
        # GPipe keeps every micro-batch until the backward phase; 1F1B stage s keeps at most S - s.
        assert in_flight_micro_batches("gpipe", stages=4, micro_batches=6).tolist() == [6, 6, 6, 6]
        assert in_flight_micro_batches("1f1b", stages=4, micro_batches=6).tolist() == [4, 3, 2, 1]
        assert in_flight_micro_batches("1f1b", stages=4, micro_batches=2).tolist() == [2, 2, 2, 1]
        # Interleaved, p=4, v=2: Megatron's warm-up 2(p-s-1) + (v-1)p chunk forwards, plus one, each
        # half a stage: stage 0 holds (6 + 4 + 1) / 2 = 5.5 = p + (p-1)/v micro-batches (SC'21).
        got = in_flight_micro_batches("interleaved", stages=4, micro_batches=8, chunks=2)
        assert got.tolist() == [5.5, 4.5, 3.5, 2.5]
        assert got[0] == pytest.approx(4 + 3 / 2)

    @pytest.mark.parametrize("stages, micro_batches", SIZES)
    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_match_the_simulated_peak(self, schedule, stages, micro_batches):
        timeline = simulate(schedule, forward_s=[1.0] * stages, backward_s=[1.5] * stages, micro_batches=micro_batches)
        expected = in_flight_micro_batches(schedule, stages=stages, micro_batches=micro_batches)
        assert timeline.peak_in_flight.tolist() == expected.tolist()

    @pytest.mark.parametrize("stages, micro_batches, chunks", [(2, 2, 2), (2, 4, 2), (4, 8, 2), (3, 3, 3), (4, 4, 4)])
    def test_interleaved_match_the_simulated_peak(self, stages, micro_batches, chunks):
        timeline = simulate(
            "interleaved", forward_s=[1.0] * stages, backward_s=[1.5] * stages, micro_batches=micro_batches,
            chunks=chunks,
        )
        expected = in_flight_micro_batches("interleaved", stages=stages, micro_batches=micro_batches, chunks=chunks)
        assert timeline.peak_in_flight.tolist() == pytest.approx(expected.tolist())


class TestOrders:
    @pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2)])
    def test_every_item_runs_once_per_stage(self, schedule, chunks):
        stages, m = 3, 6
        for s, order in enumerate(stage_orders(schedule, stages=stages, micro_batches=m, chunks=chunks)):
            items = {(w.kind, w.virtual_stage, w.micro_batch) for w in order}
            assert len(items) == len(order) == 2 * m * chunks
            assert {w.virtual_stage % stages for w in order} == {s}

    def test_1f1b_alternates_after_warm_up(self):
        orders = stage_orders("1f1b", stages=3, micro_batches=4)
        text = [[f"{w.kind}{w.micro_batch}" for w in order] for order in orders]
        assert text[0] == ["F0", "F1", "F2", "B0", "F3", "B1", "B2", "B3"]
        assert text[2] == ["F0", "B0", "F1", "B1", "F2", "B2", "F3", "B3"]


class TestPipelineTime:
    @pytest.mark.parametrize("seed", range(12))
    def test_gpipe_equals_the_simulation(self, seed):
        rng = np.random.default_rng(seed)
        stages, m = int(rng.integers(1, 6)), int(rng.integers(1, 9))
        f = rng.uniform(0.5, 1.5, stages)
        b = f * rng.uniform(1.0, 3.0, stages)
        c = rng.uniform(0.0, 0.3, stages - 1)
        closed = float(pipeline_time_s("gpipe", forward_s=f, backward_s=b, p2p_s=c, micro_batches=m))
        assert closed == pytest.approx(simulate("gpipe", forward_s=f, backward_s=b, p2p_s=c, micro_batches=m).makespan_s)

    @pytest.mark.parametrize("seed", range(12))
    @pytest.mark.parametrize("schedule", ["1f1b", "interleaved"])
    def test_bounds_the_simulation(self, schedule, seed):
        rng = np.random.default_rng(seed)
        stages = int(rng.integers(1, 6))
        chunks = 2 if schedule == "interleaved" else 1
        m = stages * int(rng.integers(1, 4)) if schedule == "interleaved" else int(rng.integers(1, 9))
        f = rng.uniform(0.5, 1.5, stages)
        b = f * rng.uniform(1.0, 3.0, stages)
        c = rng.uniform(0.0, 0.3, stages - 1) if seed % 2 else np.zeros(stages - 1)
        closed = float(pipeline_time_s(schedule, forward_s=f, backward_s=b, p2p_s=c, micro_batches=m, chunks=chunks))
        simulated = simulate(schedule, forward_s=f, backward_s=b, p2p_s=c, micro_batches=m, chunks=chunks).makespan_s
        assert simulated <= closed * (1 + 1e-12)

    def test_1f1b_by_hand(self):
        # 3 stages of 1 + 2 s, 2 transfers of 0.5 s, 4 micro-batches:
        # sum t = 9, 2 sum c = 2, (m-1)(max t + 2 max c) = 3 * 4
        got = pipeline_time_s("1f1b", forward_s=[1.0] * 3, backward_s=[2.0] * 3, p2p_s=[0.5, 0.5], micro_batches=4)
        assert float(got) == pytest.approx(9 + 2 + 12)

    def test_broadcasts_over_leading_axes(self):
        f = np.array([[1.0, 1.0], [2.0, 1.0]])
        got = pipeline_time_s("1f1b", forward_s=f, backward_s=2 * f, micro_batches=3)
        assert got.tolist() == pytest.approx([3 * 4, 9 + 2 * 6])


class TestLowerBound:
    @pytest.mark.parametrize("schedule, chunks", [("gpipe", 1), ("1f1b", 1), ("interleaved", 2), ("interleaved", 3)])
    @pytest.mark.parametrize("seed", range(40))
    def test_never_above_the_closed_form(self, schedule, chunks, seed):
        # Any stages with at least the work, the bottleneck and the transfers the bound is given.
        rng = np.random.default_rng(seed)
        stages = int(rng.integers(1, 7))
        m = stages * int(rng.integers(1, 5))
        f, b = rng.uniform(0.0, 3.0, stages), rng.uniform(0.0, 3.0, stages)
        c = rng.uniform(0.0, 0.5, stages - 1)
        floor = c * rng.uniform(0.0, 1.0, stages - 1)
        t = f + b
        closed = float(pipeline_time_s(schedule, forward_s=f, backward_s=b, p2p_s=c, micro_batches=m, chunks=chunks))
        work = float(t.sum()) * rng.uniform(0.5, 1.0)
        bottleneck = max(float(t.max()) * rng.uniform(0.5, 1.0), work / stages)
        bound = pipeline_time_lower_bound_s(
            schedule, work_s=work, bottleneck_s=bottleneck, p2p_s=floor, stages=stages, micro_batches=m, chunks=chunks
        )
        assert bound <= closed * (1 + 1e-12)
        plain = pipeline_time_lower_bound_s(schedule, work_s=work, p2p_s=floor, stages=stages, micro_batches=m,
                                            chunks=chunks)
        assert plain <= bound * (1 + 1e-12)  # the bottleneck only tightens it

    @pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
    def test_reached_by_its_stages(self, schedule):
        # stages (B, r, r), b = 0: the bound is the closed form of exactly those stages
        bound = pipeline_time_lower_bound_s(schedule, work_s=9.0, bottleneck_s=5.0, p2p_s=[0.1, 0.2], stages=3,
                                            micro_batches=6)
        closed = pipeline_time_s(schedule, forward_s=[5.0, 2.0, 2.0], backward_s=[0.0] * 3, p2p_s=[0.1, 0.2],
                                 micro_batches=6)
        assert bound == pytest.approx(float(closed))
        # by hand (1F1B): sum t + 2 sum c + (m - 1)(max t + 2 max c) = 9 + 0.6 + 5 * 5.4
        if schedule == "1f1b":
            assert bound == pytest.approx(9.0 + 0.6 + 5 * 5.4)


class TestPlacement:
    def test_boundary_crossing(self):
        assert boundary_crosses_node(stages=4, devices_per_stage=8, devices_per_node=8).tolist() == [True] * 3
        assert boundary_crosses_node(stages=4, devices_per_stage=2, devices_per_node=4).tolist() == [False, True, False]
        assert boundary_crosses_node(stages=2, devices_per_stage=4, devices_per_node=8).tolist() == [False]

    def test_p2p_on_the_crossed_link(self):
        device = Device(name="d", peak_flops={"bf16": 1e12}, memory_bytes=10**9, memory_bandwidth_bytes_per_s=1e11)
        cluster = Cluster(
            device=device, nodes=2, devices_per_node=2,
            intra_link=Link(name="nv", bandwidth_bytes_per_s=1e10, latency_s=1e-6),
            inter_link=Link(name="ib", bandwidth_bytes_per_s=1e9, latency_s=1e-5),
        )
        got = p2p_time_s(2e6, crosses_node=np.array([False, True]), cluster=cluster)
        assert got.tolist() == pytest.approx([2e6 / 1e10 + 1e-6, 2e6 / 1e9 + 1e-5])


class TestChecks:
    def test_interleaved_needs_a_multiple_of_the_stages(self):
        with pytest.raises(InputError, match="multiple of the pipeline size"):
            check_schedule("interleaved", stages=4, micro_batches=6, chunks=2)

    def test_unknown_schedule(self):
        with pytest.raises(InputError, match="unknown pipeline schedule"):
            bubble_fraction("zb-h2", stages=2, micro_batches=2)  # ZB-H2 (2p-1 micro-batches) is run by no launcher

    def test_chunks_only_with_interleaving(self):
        with pytest.raises(InputError, match="interleaved"):
            in_flight_micro_batches("1f1b", stages=2, micro_batches=2, chunks=2)


class TestZeroBubble:
    """ZB-H1 and ZB-V (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024), by hand from the
    paper's table 2: 1F1B's bubble (p-1)(T_F + T_B + T_W), ZB-H1's (p-1)(T_F + T_B - T_W), both with
    1F1B's peak activations; ZB-V's zero at T_F = T_B = T_W."""

    @pytest.mark.parametrize("stages, micro_batches", [(2, 4), (4, 8), (8, 32)])
    def test_zb_h1_bubble_is_a_third_of_1f1b(self, stages, micro_batches):
        p, m, T = stages, micro_batches, 1.0  # T_F = T_B = T_W = T
        ideal = m * 3 * T
        one_f_one_b = (p - 1) * (T + T + T)
        zb_h1 = (p - 1) * (T + T - T)
        assert zb_h1 == pytest.approx(one_f_one_b / 3)
        assert bubble_fraction("zb-h1", stages=p, micro_batches=m) == pytest.approx(zb_h1 / (ideal + zb_h1))
        # the step time: a backward of 2T (B + W), W = half of it by default
        time = float(pipeline_time_s("zb-h1", forward_s=[T] * p, backward_s=[2 * T] * p, micro_batches=m))
        assert time == pytest.approx(ideal + zb_h1)
        assert bubble_fraction("zbv", stages=p, micro_batches=m, chunks=2) == 0.0
        assert float(pipeline_time_s("zbv", forward_s=[T] * p, backward_s=[2 * T] * p, micro_batches=m,
                                     chunks=2)) == pytest.approx(ideal)

    def test_unequal_passes_by_hand(self):
        # T_F = 2, T_B = 3, T_W = 1 on 4 stages, 8 micro-batches: ZB-H1's bubble 3 x (2 + 3 - 1) = 12
        f, b, w, p, m = 2.0, 4.0, 1.0, 4, 8
        time = float(pipeline_time_s("zb-h1", forward_s=[f] * p, backward_s=[b] * p, weight_s=[w] * p, micro_batches=m))
        assert time == pytest.approx(m * (f + b) + (p - 1) * (f + (b - w) - w))
        # with 2 chunks (torch's InterleavedZeroBubble) the bubble is divided by v, as interleaving divides 1F1B's
        time = float(pipeline_time_s("zb-h1", forward_s=[f] * p, backward_s=[b] * p, weight_s=[w] * p,
                                     micro_batches=m, chunks=2))
        assert time == pytest.approx(m * (f + b) + (p - 1) * (f + (b - w) - w) / 2)
        # ZB-V: ZB-H2's (p-1)(T_F + T_B - 2 T_W) on a chunk's halves: 3 x (1 + 1.5 - 1) = 4.5
        time = float(pipeline_time_s("zbv", forward_s=[f] * p, backward_s=[b] * p, weight_s=[w] * p,
                                     micro_batches=m, chunks=2))
        assert time == pytest.approx(m * (f + b) + (p - 1) * (f / 2 + (b - w) / 2 - 2 * w / 2))
        # without a B/W split ZB-V is interleaved 1F1B at v = 2 and ZB-H1 is 1F1B
        for schedule, chunks, same in (("zbv", 2, "interleaved"), ("zb-h1", 1, "1f1b")):
            kwargs = dict(forward_s=[f, 1.5, f, 1.0], backward_s=[b, 3.0, b, 2.0], p2p_s=0.1, micro_batches=m)
            assert float(pipeline_time_s(schedule, weight_s=[0.0] * p, chunks=chunks, **kwargs)) == pytest.approx(
                float(pipeline_time_s(same, chunks=chunks, **kwargs)))

    def test_too_few_micro_batches_get_no_w_credit(self):
        # one micro-batch on 4 stages: its chain of passes is the step, no W pass fills a bubble
        kwargs = dict(forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=1)
        assert float(pipeline_time_s("zb-h1", **kwargs)) == float(pipeline_time_s("1f1b", **kwargs)) == 12.0
        # ZB-V fills from 2S - 1 = 7 micro-batches (torch lays its timetable out for max(2S - 1, m))
        kwargs = dict(forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=4, chunks=2)
        assert float(pipeline_time_s("zbv", **kwargs)) == float(pipeline_time_s("interleaved", **kwargs)) == (4 + 3 / 2) * 3
        assert float(pipeline_time_s("zbv", forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=7, chunks=2)) == 7 * 3
        assert bubble_fraction("zbv", stages=4, micro_batches=4, chunks=2) == bubble_fraction(
            "interleaved", stages=4, micro_batches=4, chunks=2)
        assert bubble_fraction("zb-h1", stages=4, micro_batches=2) == bubble_fraction("1f1b", stages=4, micro_batches=2)

    def test_activations_as_1f1b(self):
        assert in_flight_micro_batches("zb-h1", stages=4, micro_batches=8).tolist() == [4, 3, 2, 1]
        assert in_flight_micro_batches("zbv", stages=4, micro_batches=8, chunks=2).tolist() == [4, 4, 4, 4]
        assert in_flight_micro_batches("zbv", stages=4, micro_batches=3, chunks=2).tolist() == [3, 3, 3, 3]

    def test_lower_bound_is_below_the_closed_forms(self):
        rng = np.random.default_rng(0)
        for _ in range(50):
            p, m = int(rng.integers(1, 6)), int(rng.integers(1, 4)) * 5
            f, b = rng.uniform(0.1, 2.0, p), rng.uniform(0.1, 4.0, p)
            for schedule, chunks in (("zb-h1", 1), ("zbv", 2)):
                time = float(pipeline_time_s(schedule, forward_s=f, backward_s=b, micro_batches=m, chunks=chunks))
                bound = pipeline_time_lower_bound_s(schedule, work_s=float((f + b).sum()), bottleneck_s=float((f + b).max()),
                                                    stages=p, micro_batches=m, chunks=chunks)
                assert bound <= time * (1 + 1e-12)

    def test_checks(self):
        with pytest.raises(InputError, match="exactly two model chunks"):
            check_schedule("zbv", stages=4, micro_batches=8, chunks=3)
        with pytest.raises(InputError, match="multiple of the pipeline size"):
            check_schedule("zb-h1", stages=4, micro_batches=6, chunks=2)
        check_schedule("zb-h1", stages=4, micro_batches=6)
        with pytest.raises(InputError, match="closed form only"):
            stage_orders("zbv", stages=2, micro_batches=4, chunks=2)
