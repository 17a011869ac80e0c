"""torchtitan's async TP priced as torch's micro-pipelined TP (``objectives.tp_overlap``, ``--fix tp_overlap=on
--target torchtitan``): the exposed time by hand from the chunk formula, which collectives the pass fuses, the
launcher rules and the export's flag."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.intra_op import intra_op_terms, term_time_s
from objectives.parameters import ParameterView
from objectives.tables import build_cost_model
from objectives.tp_overlap import LayerOverlap, is_tp_gemm, micro_pipelined_collectives, micro_pipelined_exposed_s
from planner.core.configs import ConfigOptions
from planner.core.errors import UnsupportedExport
from planner.core.graph import BlockGroup
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import GraphBuilder, gpt2_like, linear

KAPPA = 24.0 / 132.0  # OVERLAP_CONTENTION: 24 NCCL thread blocks on an H100's 132 SMs
ASYNC = dict(tp_comm_overlap=True, tp_overlap_method="micro-pipeline")


class TestFormula:
    def test_comm_longer_than_the_window(self):
        """6 ms of collective beside a 4 ms GEMM in 4 chunks: the rank's own chunk needs no copy, so the copies
        run beside 3 ms of GEMM; 3 ms outlast it and the 3 ms overlapped pay the contention."""
        got = micro_pipelined_exposed_s(np.array(6e-3), np.array(4e-3), np.array(4))
        assert float(got) == pytest.approx(3e-3 + KAPPA * 3e-3)

    def test_comm_hidden_under_a_long_gemm(self):
        """2 ms in 8 chunks beside 10 ms: the window 8.75 ms holds it, only the contention is left."""
        got = micro_pipelined_exposed_s(np.array([2e-3]), np.array([10e-3]), np.array([8]))
        assert got[0] == pytest.approx(KAPPA * 2e-3)

    def test_one_rank_has_no_pipeline(self):
        assert float(micro_pipelined_exposed_s(np.array(5.0), np.array(9.0), np.array(1))) == 5.0


def _gated_graph():
    """Two blocks of a gated MLP (``gate`` and ``up`` read the same input, ``down`` reads their product's
    stand-in) and a head outside the blocks: 7 linear layers."""
    g = GraphBuilder("gated")
    sizes = {"b": 2, "s": 64}
    x = g.tensor("x", (2, 64, 128), role="input")
    instances = []
    for layer in range(2):
        start = len(g.ops)
        gate = linear(g, f"l{layer}.gate", x, ("b", "s", "k"), sizes, 256)
        linear(g, f"l{layer}.up", x, ("b", "s", "k"), sizes, 256)
        x = linear(g, f"l{layer}.down", gate, ("b", "s", "k"), sizes, 128)
        instances.append(tuple(range(start, len(g.ops))))
    linear(g, "head", x, ("b", "s", "k"), sizes, 512)
    return g.build(blocks=(BlockGroup(name="l", instances=tuple(instances)),))


class TestWhatThePassFuses:
    def test_bf16(self):
        """The reduce-scatter of an input gradient is fused only when the layer alone reads its input (gate and
        up sum theirs first); the head is not compiled (outside the blocks); the all-gathers are fused."""
        fused = micro_pipelined_collectives(_gated_graph(), fp8=False)
        every = LayerOverlap(True, True, True, True)
        assert fused["l0.gate"] == fused["l1.up"] == LayerOverlap(True, True, True, False)
        assert fused["l0.down"] == fused["l1.down"] == every
        assert fused["head"] == LayerOverlap(False, False, False, False)

    def test_fp8_leaves_the_gathers(self):
        """Under FP8 the gathered tensor is cast before ``_scaled_mm``, so only the reduce-scatters are fused."""
        fused = micro_pipelined_collectives(_gated_graph(), fp8=True)
        assert fused["l0.gate"] == LayerOverlap(False, True, False, False)
        assert fused["l0.down"] == LayerOverlap(False, True, False, True)


LAYERS = 2


@pytest.fixture(scope="module")
def gpt():
    return gpt2_like(layers=LAYERS, hidden=256, heads=4, vocab=512, positions=128, batch=2, seq=128)


def _model(graph, **settings):
    return build_cost_model(graph, cluster=make_cluster("h100-sxm", devices=4),
                            settings=TrainingSettings(engine="fused", attention="flash", **settings),
                            config_options=ConfigOptions(devices=4, devices_per_node=4))


@pytest.fixture(scope="module")
def models(gpt):
    return _model(gpt), _model(gpt, **ASYNC), _model(gpt, fp8="rowwise", **ASYNC)


def _collective(op, space, tensors, settings, cluster, kind):
    """The tables' price of ``op``'s ``kind`` collective (NCCL's + one call's setup) and its group size."""
    terms = [t for t in intra_op_terms(op, space, tensors=tensors, settings=settings) if t.kind == kind]
    if not terms:
        return None, None
    comm = sum(term_time_s(t, cluster=cluster, nccl=True) for t in terms)
    return comm + cluster.device.collective_overhead_s * (comm > 0), np.max([t.intra_size * t.inter_size for t in terms], axis=0)


@pytest.mark.parametrize("fp8", [False, True])
def test_linear_layers_by_hand(gpt, models, fp8):
    """Each linear layer's all-reduce, priced with async TP, is its two halves: forward beside ``(n - 1) / n`` of the
    forward GEMM, backward beside ``(n - 1) / n`` of the data-gradient GEMM (half the backward), each where fused.
    ``partial_sum``: reduce-scatter forward, gradient all-gather backward; ``input_grad``: all-gather forward,
    reduce-scatter backward. bf16: every block layer fuses both (GPT-2's c_attn and c_fc alone read their inputs),
    the LM head neither; FP8: the reduce-scatters only."""
    off, bf16, f8 = models
    on = f8 if fp8 else bf16
    tensors, cluster, checked = ParameterView(gpt), on.cluster, 0
    in_blocks = {i for instance in gpt.blocks[0].instances for i in instance}
    for index, op in enumerate(gpt.ops):
        if not is_tp_gemm(op, tensors):
            continue
        detail, space = on.op_details[index], on.tables.configs[index]
        backward = detail.compute_s - detail.recompute_s - detail.forward_s - (detail.optimizer_s if detail.optimizer_s is not None else 0.0)
        for kind in ("partial_sum", "input_grad"):
            comm, n = _collective(op, space, tensors, on.settings, cluster, kind)
            if comm is None:
                continue
            scatter_pass = 0 if kind == "partial_sum" else 1  # which pass runs the reduce-scatter half
            hand = 0.0
            for position, window in enumerate((detail.forward_s, backward / 2)):
                fused = index in in_blocks and (not fp8 or position == scatter_pass)
                w = window * (n - 1) / n
                hand = hand + (np.maximum(0.0, comm / 2 - w) + KAPPA * np.minimum(comm / 2, w) if fused else comm / 2)
            assert np.allclose(detail.comm_s[(kind, "intra")], hand, rtol=1e-12, atol=0.0), (op.name, kind)
            checked += 1
    assert checked >= 2 * LAYERS * 2  # every block's four layers, both passes where they communicate


def test_off_unchanged_and_only_linear_layers_move(gpt, models):
    """Only linear layers' figures move; the LM head, outside the compiled blocks, keeps its price."""
    off, on, _ = models
    tensors = ParameterView(gpt)
    gemms = [i for i, op in enumerate(gpt.ops) if is_tp_gemm(op, tensors)]
    for index, op in enumerate(gpt.ops):
        if not is_tp_gemm(op, tensors) or index == gemms[-1]:
            assert np.array_equal(off.tables.node_time_s[index], on.tables.node_time_s[index]), op.name
    assert all(np.any(off.tables.node_time_s[i] > on.tables.node_time_s[i]) for i in gemms[:-1])


class TestLauncher:
    def test_torchtitan_runs_it_compiled_megatron_its_own(self):
        from exporters._target import Family
        from exporters.targets import TARGETS

        family = Family(label="dp=1 x tp=4 sp", dp=1, tp=4, sp=True, masks=())
        tt, mg = TARGETS["torchtitan"], TARGETS["megatron"]
        assert tt.runs_tp_overlap(family, TrainingSettings(**ASYNC))
        assert not tt.runs_tp_overlap(family, TrainingSettings(engine="eager", **ASYNC))  # no torch.compile
        assert not tt.runs_tp_overlap(family, TrainingSettings(tp_comm_overlap=True))  # Megatron-LM's userbuffers
        assert not mg.runs_tp_overlap(family, TrainingSettings(**ASYNC))
        assert not tt.runs_tp_overlap(Family(label="dp=1 x tp=4", dp=1, tp=4, sp=False, masks=()), TrainingSettings(**ASYNC))

    def test_export_flag_and_refusals(self):
        from exporters.torchtitan.export import torchtitan_async_tp_args
        from exporters.torchtitan.validate import torchtitan_violations

        assert torchtitan_async_tp_args(TrainingSettings(**ASYNC), tp=4, sequence_parallel=True) == [
            "--compile.enable_async_tensor_parallel"]
        assert torchtitan_async_tp_args(TrainingSettings(), tp=4, sequence_parallel=True) == []
        with pytest.raises(UnsupportedExport, match="userbuffers"):
            torchtitan_async_tp_args(TrainingSettings(tp_comm_overlap=True), tp=4, sequence_parallel=True)
        with pytest.raises(UnsupportedExport, match="no sequence parallelism"):
            torchtitan_async_tp_args(TrainingSettings(**ASYNC), tp=4, sequence_parallel=False)
        args = ["--parallelism.tensor_parallel_degree", "4", "--compile.enable_async_tensor_parallel"]
        assert "Async TP requires 'model' in --compile.components and --compile.enable" in torchtitan_violations(
            args, world_size=4)
        assert not torchtitan_violations([*args, "--compile.enable"], world_size=4)

    def test_settings_check_the_method(self):
        from planner.core.errors import InputError

        with pytest.raises(InputError, match="tp_overlap_method must be userbuffers or micro-pipeline"):
            TrainingSettings(tp_overlap_method="async")  # type: ignore[arg-type]


@pytest.mark.parametrize("extra, says", [
    (["--target", "deepspeed"], "add --target megatron or --target torchtitan"),
    (["--target", "torchtitan", "--engine", "eager"], "runs inside torch.compile'd blocks (--compile.enable); drop --engine eager"),
])
def test_the_pin_is_refused_in_one_line(extra, says):
    """``--fix tp_overlap=on`` where no launcher runs it as asked: exit 2, one line, before the model is read."""
    from tests.planner.cli_helpers import error_line, run_cli

    result = run_cli(["plan", "missing.onnx", "-n", 8, *extra, "--fix", "tp_overlap=on"], expected_exit_code=2)
    assert says in error_line(result)
