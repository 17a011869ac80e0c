"""Tensor-parallel communication overlapped with the GEMMs (``objectives.tp_overlap``, ``--fix tp_overlap=on``)."""

from __future__ import annotations

import json

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.intra_op import OVERLAP_CONTENTION, intra_op_terms, term_time_s
from objectives.parameters import ParameterView
from objectives.tables import build_cost_model
from objectives.tp_overlap import bulk_exposed_s, chunked_exposed_s, is_tp_gemm
from planner.core.configs import ConfigOptions
from planner.core.degrees import parse_fix
from planner.core.errors import InputError, UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

KAPPA = 24.0 / 132.0  # OVERLAP_CONTENTION's source: 24 NCCL thread blocks on an H100's 132 SMs


class TestFormula:
    def test_one_layer_by_hand(self):
        """A 4 ms GEMM beside 6 ms of all-gather in 4 chunks (tp 4): the first 1.5 ms chunk is exposed, the
        other 4.5 ms run beside the GEMM (0.5 ms outlasts it) and the 4 ms overlapped pay the contention."""
        gemm, comm, chunks = 4e-3, 6e-3, 4
        expected = 1.5e-3 + 0.5e-3 + KAPPA * 4e-3
        assert OVERLAP_CONTENTION == KAPPA
        assert float(chunked_exposed_s(np.array(comm), np.array(gemm), np.array(chunks))) == pytest.approx(expected)

    def test_short_comm_under_a_long_gemm(self):
        """2 ms in 8 chunks under a 10 ms GEMM: 0.25 ms exposed + kappa x 1.75 ms."""
        got = chunked_exposed_s(np.array([2e-3]), np.array([10e-3]), np.array([8]))
        assert got[0] == pytest.approx(0.25e-3 + KAPPA * 1.75e-3)

    def test_bulk_beside_half_the_backward(self):
        """Backward 6 ms (dgrad 3 + wgrad 3), a 5 ms reduce-scatter beside one GEMM: 2 ms + kappa x 3 ms."""
        assert float(bulk_exposed_s(np.array(5e-3), np.array(6e-3))) == pytest.approx(2e-3 + KAPPA * 3e-3)

    def test_never_more_than_the_collective(self):
        comm = np.linspace(0.0, 1.0, 11)
        for chunks in (1, 2, 8):
            assert np.all(chunked_exposed_s(comm, np.full(11, 0.3), np.full(11, chunks)) <= comm + 1e-15)
        assert np.all(bulk_exposed_s(comm, np.full(11, 0.6)) <= comm + 1e-15)


LAYERS, HIDDEN, HEADS, BATCH, SEQ, VOCAB = 2, 256, 4, 2, 128, 512


@pytest.fixture(scope="module")
def graph():
    return gpt2_like(layers=LAYERS, hidden=HIDDEN, heads=HEADS, vocab=VOCAB, positions=SEQ, batch=BATCH, seq=SEQ)


def _model(graph, **settings):
    cluster = make_cluster("h100-sxm", devices=4)
    return build_cost_model(graph, cluster=cluster, settings=TrainingSettings(**settings),
                            config_options=ConfigOptions(devices=4, devices_per_node=4))


@pytest.fixture(scope="module")
def models(graph):
    on = dict(engine="fused", attention="flash")
    return _model(graph, **on), _model(graph, tp_comm_overlap=True, **on)


class TestTables:
    def test_off_is_todays_price_bit_for_bit(self, graph, models):
        """Off (the default) and on without an execution model price every op and edge exactly as before."""
        off, _ = models
        explicit = _model(graph, engine="fused", attention="flash", tp_comm_overlap=False)
        plain, plain_on = _model(graph), _model(graph, tp_comm_overlap=True)
        for a, b in ((off, explicit), (plain, plain_on)):
            for x, y in zip(a.tables.node_time_s, b.tables.node_time_s):
                assert np.array_equal(x, y)
            for x, y in zip(a.tables.edges, b.tables.edges):
                assert np.array_equal(x.time_s, y.time_s)

    def test_a_row_parallel_gemm_by_hand(self, graph, models):
        """A linear layer's partial-sum all-reduce, priced on, is the chunked formula of its own collective
        (NCCL's price + the call's setup), its forward and its group size; its compute is untouched."""
        off, on = models
        tensors = ParameterView(graph)
        cluster = on.cluster
        checked = 0
        for index, op in enumerate(graph.ops):
            if not is_tp_gemm(op, tensors):
                continue
            space, d_off, d_on = on.tables.configs[index], off.op_details[index], on.op_details[index]
            assert np.array_equal(d_off.compute_s, d_on.compute_s)
            terms = [t for t in intra_op_terms(op, space, tensors=tensors, settings=on.settings) if t.kind == "partial_sum"]
            if not terms:
                continue
            # the tables' price: the terms summed, one call's setup where any moves (objectives.tables)
            comm = sum(term_time_s(t, cluster=cluster, nccl=True) for t in terms)
            comm = comm + cluster.device.collective_overhead_s * (comm > 0)
            n = np.max([t.intra_size * t.inter_size for t in terms], axis=0)
            rest = comm * (n - 1) / n
            hand = comm / n + np.maximum(0.0, rest - d_on.forward_s) + KAPPA * np.minimum(rest, d_on.forward_s)
            assert np.allclose(d_on.comm_s[("partial_sum", "intra")], hand, rtol=1e-12, atol=0.0)
            assert np.allclose(d_off.comm_s[("partial_sum", "intra")], comm, rtol=1e-12, atol=0.0)
            checked += 1
        assert checked >= LAYERS  # every block's row-parallel projections

    def test_only_linear_layers_change(self, graph, models):
        off, on = models
        tensors = ParameterView(graph)
        for index, op in enumerate(graph.ops):
            if not is_tp_gemm(op, tensors):
                assert np.array_equal(off.tables.node_time_s[index], on.tables.node_time_s[index]), op.name


class TestKnob:
    def test_fix_reads_it(self):
        assert parse_fix("tp_overlap=on").tp_overlap == "on"
        with pytest.raises(InputError, match="tp_overlap must be on or off"):
            parse_fix("tp_overlap=yes")

    def test_setting_is_a_bool(self):
        with pytest.raises(InputError, match="tp_comm_overlap must be true or false"):
            TrainingSettings(tp_comm_overlap="on")  # type: ignore[arg-type]

    def test_megatron_flag(self):
        from exporters.megatron.export import megatron_tp_overlap_args
        from exporters.megatron.validate import megatron_violations, parse_megatron_args

        assert megatron_tp_overlap_args(True, tp=2, sequence_parallel=True) == ["--tp-comm-overlap"]
        assert megatron_tp_overlap_args(False, tp=2, sequence_parallel=True) == []
        with pytest.raises(UnsupportedExport, match="needs --sequence-parallel"):
            megatron_tp_overlap_args(True, tp=2, sequence_parallel=False)
        args = ["--tensor-model-parallel-size", "2", "--tp-comm-overlap"]
        assert "--tp-comm-overlap needs --sequence-parallel" in megatron_violations(parse_megatron_args(args), world_size=2)

    def test_estimate_needs_sequence_parallelism(self, graph):
        from planner.estimate import estimate

        cluster = make_cluster("h100-sxm", devices=4)
        settings = TrainingSettings(engine="fused", attention="flash", tp_comm_overlap=True)
        refused = estimate(graph, cluster=cluster, tp=4, pp=1, micro_batch=BATCH, global_batch=BATCH, settings=settings)
        assert not refused.valid and refused.reason == (
            "tensor-parallel communication overlap needs sequence parallelism; add --sequence-parallel")


def test_megatron_rows_split_the_sequence_and_export_the_flag(tmp_path):
    """``--fix tp_overlap=on`` under Megatron-LM: every row with ``tp > 1`` is sequence parallel (the other
    families are not run) and writes ``--tp-comm-overlap``; DeepSpeed runs no such row; the saved plan
    keeps the knob and reprices to the same step."""
    from pathlib import Path

    from exporters import export
    from exporters.validate import parse_megatron_args
    from planner.launchable import plan_launchable_file, reprice_saved, row_plan_input
    from planner.plan import PlanRequest

    path = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=4), settings=TrainingSettings(tp_comm_overlap=True))
    _, (found,) = plan_launchable_file(path, {"batch": 8, "seq": 64}, [request], launchers=("megatron",))
    rows = [row for row in found.rows if row.degrees.tp > 1]
    assert rows
    for row in rows:
        assert "deepspeed" not in row.targets and row.layout.endswith(" sp")
        args = parse_megatron_args(export("megatron", row_plan_input(row))["args"])
        assert args.get("sequence-parallel") and args.get("tp-comm-overlap")
    # the saved plan keeps the knob (plan.schema.json: training.tp_comm_overlap) and prices the same again
    document = export("generic", row_plan_input(rows[0]))
    assert document["training"]["tp_comm_overlap"] is True
    saved = tmp_path / "plan.json"
    saved.write_text(json.dumps(document))
    again = reprice_saved(saved, model=path)
    assert again.point.time_s == pytest.approx(rows[0].time_s, rel=1e-9)
