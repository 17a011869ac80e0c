"""Megatron-Core's ``overlap_p2p_comm`` in the interleaved schedule (issue 23, h29h): the steady state's sends and
receives are posted without waiting and waited before the chunk that needs them, one pass of the other direction
later (Megatron-Core 0.16.1 ``forward_backward_pipelining_with_interleaving``: ``pp_post_forward`` /
``pp_pre_forward``), so each costs only what it takes beyond that pass; the warm-up and flush transfers stay waited.

Oracles: the closed form worked by hand (the stages' forward and backward seconds and the transfer given), and the
estimate's own stage times and transfer of a 4-layer GPT with the rule's arithmetic done here, not by the code under
test; the search's lower bound checked against the priced makespan it must not exceed.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from objectives.calibration import read_step_rows
from objectives.cluster import make_cluster
from objectives.schedules import pipeline_time_lower_bound_s, pipeline_time_s
from planner.calibrate import row_settings
from planner.core.errors import InputError
from planner.core.settings import TrainingSettings
from planner.estimate import estimate
from tests.objectives.graphs import gpt2_like

REPO = Path(__file__).resolve().parents[2]
STAGES = dict(forward_s=[1.0] * 4, backward_s=[2.0] * 4, micro_batches=8, chunks=2)  # chunk: 0.5 s F, 1 s B


def test_transfers_hidden_under_the_other_chunks_pass_by_hand():
    # (m + (S-1)/v)(f + b) = 9.5 x 3 = 28.5; warm-up and flush 2v sum c = 4 x 3 x 0.25 = 3;
    # steady: waited 2v(m-1) c = 28 x 0.25 = 7, overlapped 0 (0.25 s under a 0.5 s and a 1 s pass)
    waited = float(pipeline_time_s("interleaved", p2p_s=0.25, **STAGES))
    hidden = float(pipeline_time_s("interleaved", p2p_s=0.25, p2p_overlapped=True, **STAGES))
    assert (waited, hidden) == pytest.approx((28.5 + 3 + 7, 28.5 + 3))


def test_a_transfer_longer_than_a_pass_costs_the_excess_by_hand():
    # c = 0.75: the forward's send hides under the 1 s backward chunk (0 left), the backward's under the
    # 0.5 s forward chunk (0.25 left): v (m - 1) x 0.25 = 3.5; warm-up and flush 4 x 3 x 0.75 = 9
    hidden = float(pipeline_time_s("interleaved", p2p_s=0.75, p2p_overlapped=True, **STAGES))
    assert hidden == pytest.approx(28.5 + 9 + 3.5)
    assert float(pipeline_time_s("interleaved", p2p_s=0.75, **STAGES)) == pytest.approx(28.5 + 9 + 21)


@pytest.mark.parametrize("schedule", ["gpipe", "1f1b"])
def test_schedules_megatron_does_not_overlap_ignore_it(schedule):
    kwargs = dict(forward_s=[1.0, 1.5, 1.0], backward_s=[2.0, 2.5, 2.0], p2p_s=[0.3, 0.4], micro_batches=6)
    assert float(pipeline_time_s(schedule, p2p_overlapped=True, **kwargs)) == float(pipeline_time_s(schedule, **kwargs))


def test_the_search_bound_stays_below_the_overlapped_price():
    rng = np.random.default_rng(23)
    for _ in range(200):
        stages, chunks = int(rng.integers(2, 6)), int(rng.integers(2, 4))
        m = stages * int(rng.integers(1, 4))
        f, b = rng.uniform(0.1, 2.0, stages), rng.uniform(0.1, 4.0, stages)
        c = rng.uniform(0.0, 3.0, stages - 1)
        priced = float(pipeline_time_s("interleaved", forward_s=f, backward_s=b, p2p_s=c, micro_batches=m,
                                       chunks=chunks, p2p_overlapped=True))
        bound = pipeline_time_lower_bound_s("interleaved", work_s=float((f + b).sum()),
                                            bottleneck_s=float((f + b).max()), p2p_s=c, stages=stages,
                                            micro_batches=m, chunks=chunks, p2p_overlapped=True)
        assert bound <= priced * (1 + 1e-12)


def test_estimate_hides_the_steady_state_transfers():
    # a 4-layer GPT on pp 2 x v 2 (one layer a chunk), tp 2 on 8 A100s, 4 micro-batches; one boundary
    graph = gpt2_like(layers=4, hidden=32, heads=4, vocab=100, positions=16, batch=2, seq=16)
    cluster = make_cluster("a100-80gb", devices=8)
    priced = {}
    for overlap in (False, True):
        e = estimate(graph, cluster=cluster, tp=2, pp=2, micro_batch=1, global_batch=8, schedule="interleaved",
                     chunks=2, settings=TrainingSettings(p2p_overlap=overlap))
        assert e.valid, e.reason
        priced[overlap] = e.point
    point, m, v = priced[False], 4, 2
    f = max(s.forward_s for s in point.stages)
    b = max(s.backward_s for s in point.stages)
    c = point.time.p2p_s
    assert c > 0
    steady_waited = v * (m - 1) * 2 * c
    steady_hidden = v * (m - 1) * (max(c - b / v, 0.0) + max(c - f / v, 0.0))
    expected = point.time.pipeline_s - steady_waited + steady_hidden
    assert priced[True].time.pipeline_s == pytest.approx(expected, rel=1e-12)
    assert [s.forward_s for s in priced[True].stages] == [s.forward_s for s in point.stages]


def test_rows_carry_the_knob_to_the_settings():
    rows = {r.id: r for r in read_step_rows(REPO / "bench" / "fidelity" / "runs_h100_fp8_cp.jsonl",
                                            models_dir=REPO / "examples")}
    bridge = rows["megatronbridge2509-h100-llama3-70b-g64"]
    assert bridge.overlap_p2p_comm and row_settings(bridge).p2p_overlap
    titan = rows["torchtitan-t5-405b-g512-interleaved-1f1b"]  # torchtitan's schedules: no such knob
    assert not titan.overlap_p2p_comm and not row_settings(titan).p2p_overlap


def test_a_non_boolean_setting_is_refused():
    with pytest.raises(InputError, match="p2p_overlap must be true or false"):
        TrainingSettings(p2p_overlap="yes")  # type: ignore[arg-type]
