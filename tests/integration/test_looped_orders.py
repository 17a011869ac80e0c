"""The chunk passes a looped schedule's rank holds at its peak, replayed from the runtimes' own orders: torch 2.13's
``ScheduleInterleaved1F1B``, ``ScheduleInterleavedZeroBubble`` and ``ScheduleZBVZeroBubble``
(``_calculate_single_rank_operations``) and Megatron-Core 0.16.1's ``forward_backward_pipelining_with_interleaving``
(its warm-up count and ``get_schedule_table``). What ``objectives.after_layers`` and ``objectives.pipeline_buffers``
price: the model's last chunk holds one micro-batch at every peak of its rank, the first chunk ``min(2S, M)`` at rank
0's, and (interleaved 1F1B) the rank ``min(2(S - r - 1) + (v - 1) S + 1, M v)`` chunk passes, the planner's count."""

from __future__ import annotations

import pytest

from objectives.pipeline_buffers import first_chunk_in_flight
from objectives.schedules import in_flight_micro_batches

GRID = [(stages, chunks, stages * rounds) for stages in (2, 3, 4, 8) for chunks in (2, 3, 4) for rounds in (1, 2, 4)]


def _peak(actions, chunk_of, starts, ends) -> tuple[int, dict[int, int]]:
    """The most chunk passes held (forwards run, their full or input backward not yet) and, at those peaks, the most
    each chunk held."""
    live: dict[int, int] = {}
    best, at = -1, {}
    for action in actions:
        chunk = chunk_of(action)
        if starts(action):
            live[chunk] = live.get(chunk, 0) + 1
            total = sum(live.values())
            if total >= best:
                at = {} if total > best else at
                best = total
                for c, n in live.items():
                    at[c] = max(at.get(c, 0), n)
        elif ends(action):
            live[chunk] -= 1
    return best, at


def _torch_orders(cls, stages: int, chunks: int, micro_batches: int) -> dict[int, list]:
    """``cls``'s own per-rank order, its sizes set as its ``__init__`` sets them from real stages."""
    schedule = object.__new__(cls)
    schedule.pp_group_size, schedule.n_local_stages, schedule._n_microbatches = stages, chunks, micro_batches
    schedule.num_stages = stages * chunks
    schedule.number_of_rounds = max(1, micro_batches // stages)
    schedule.microbatches_per_round = micro_batches // schedule.number_of_rounds
    return {r: [a for a in schedule._calculate_single_rank_operations(r) if a is not None] for r in range(stages)}


@pytest.mark.integration
@pytest.mark.parametrize("name", ["ScheduleInterleaved1F1B", "ScheduleInterleavedZeroBubble"])
def test_torch_looped_orders(name):
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    kind = schedules._ComputationType
    ends = (kind.FULL_BACKWARD, kind.BACKWARD_INPUT)
    for stages, chunks, micro_batches in GRID:
        orders = _torch_orders(getattr(schedules, name), stages, chunks, micro_batches)
        peaks = [_peak(orders[r], lambda a: a.stage_index // stages, lambda a: a.computation_type == kind.FORWARD,
                       lambda a: a.computation_type in ends) for r in range(stages)]
        assert peaks[-1][1][chunks - 1] == 1, (stages, chunks, micro_batches)
        assert peaks[0][1][0] == first_chunk_in_flight(stages, micro_batches), (stages, chunks, micro_batches)
        if name == "ScheduleInterleaved1F1B":
            held = in_flight_micro_batches("interleaved", stages=stages, micro_batches=micro_batches, chunks=chunks)
            assert [best for best, _ in peaks] == pytest.approx((held * chunks).tolist())


@pytest.mark.integration
def test_torch_zbv_last_stage():
    schedules = pytest.importorskip("torch.distributed.pipelining.schedules")
    kind = schedules._ComputationType
    for stages, micro_batches in ((2, 4), (4, 8), (4, 16), (8, 16), (8, 32)):
        rank0 = _torch_orders(schedules.ScheduleZBVZeroBubble, stages, 2, micro_batches)[0]
        _, at = _peak(rank0, lambda a: a.stage_index, lambda a: a.computation_type == kind.FORWARD,
                      lambda a: a.computation_type in (kind.FULL_BACKWARD, kind.BACKWARD_INPUT))
        assert at[2 * stages - 1] == 1  # rank 0's second chunk is the model's last


@pytest.mark.integration
def test_megatron_interleaved_order():
    pytest.importorskip("torch")
    core = pytest.importorskip("megatron.core.pipeline_parallel.schedules")
    for stages, chunks, micro_batches in GRID:
        table = [chunk for _, chunk in core.get_schedule_table(micro_batches, chunks, stages)]
        total = micro_batches * chunks
        peaks = []
        for rank in range(stages):
            # forward_backward_pipelining_with_interleaving: its warm-up count (get_pp_rank_microbatches), then one
            # forward and one backward a step; a backward's chunk is num_model_chunks - 1 less the table's
            warm = min((stages - rank - 1) * 2 + (chunks - 1) * stages, total)
            steps = [("F", table[k]) for k in range(warm)]
            for k in range(total - warm):
                steps += [("F", table[warm + k]), ("B", chunks - 1 - table[k])]
            steps += [("B", chunks - 1 - table[k]) for k in range(total - warm, total)]
            peaks.append(_peak(steps, lambda s: s[1], lambda s: s[0] == "F", lambda s: s[0] == "B"))
        assert peaks[-1][1][chunks - 1] == 1
        assert peaks[0][1][0] == first_chunk_in_flight(stages, micro_batches)
        held = in_flight_micro_batches("interleaved", stages=stages, micro_batches=micro_batches, chunks=chunks)
        assert [best for best, _ in peaks] == pytest.approx((held * chunks).tolist())
