"""Memory per device: parameter states with Adam / ZeRO 0-3, saved activations, recomputation."""

from __future__ import annotations

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.memory import (
    OTHER_FRACTION,
    op_memory_bytes,
    replication_degree,
    saved_activation_bytes,
    state_bytes_per_parameter,
)
from objectives.tables import build_cost_model
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import GPT2_SMALL_PARAMS, gpt2_like, single_matmul

DEVICES = 8
WPE = 1024 * 768  # the position table: its lookup has no batch dim, so data parallelism replicates it


@pytest.fixture(scope="module")
def gpt2():
    return gpt2_like(seq=128, batch=8)


def build(graph, **settings):
    cluster = make_cluster("a100-80gb", devices=DEVICES)
    return build_cost_model(
        graph, cluster=cluster, settings=TrainingSettings(**settings),
        config_options=ConfigOptions(devices=DEVICES, devices_per_node=DEVICES),
    )


def data_parallel_choice(model) -> list[int]:
    choice = []
    for op, space in zip(model.graph.ops, model.tables.configs):
        batch = [d.name for d in op.dims if d.is_batch]
        choice.append(space.index_of({batch[0]: DEVICES}) if batch else 0)
    return choice


def states(evaluation) -> float:
    m = evaluation.memory
    return m.params_bytes + m.grads_bytes + m.optimizer_bytes


class TestBytesPerParameter:
    @pytest.mark.parametrize(
        "precision, optimizer, expected",
        [("bf16-mixed", "adam", (2, 2, 12)), ("fp32", "adam", (4, 4, 8)),
         ("bf16-mixed", "sgd", (2, 2, 8)), ("fp32", "sgd", (4, 4, 4))],
    )
    def test_table(self, precision, optimizer, expected):
        per = state_bytes_per_parameter(TrainingSettings(precision=precision, optimizer=optimizer))
        assert (per.param, per.grad, per.optimizer) == expected


class TestStaticMemoryGPT2:
    def test_parameter_count(self, gpt2):
        assert gpt2.parameter_count == GPT2_SMALL_PARAMS

    def test_replicated_is_16_bytes_per_parameter_at_every_zero_stage(self, gpt2):
        for stage in range(4):
            model = build(gpt2, zero_stage=stage)
            evaluation = model.evaluate([0] * len(gpt2.ops))
            assert states(evaluation) == pytest.approx(16 * GPT2_SMALL_PARAMS, rel=1e-12)

    @pytest.mark.parametrize("stage", [0, 1, 2, 3])
    def test_data_parallel_zero_formulas(self, gpt2, stage):
        # Adam + bf16 mixed: 2 (param) + 2 (grad) + 12 (optimizer) bytes per parameter. Under data
        # parallelism over 8 devices every parameter but wpe has replication degree 8; ZeRO stage 1
        # divides the 12 optimizer bytes by it, stage 2 also the 2 gradient bytes, stage 3 all 16.
        model = build(gpt2, zero_stage=stage)
        evaluation = model.evaluate(data_parallel_choice(model))
        replicated = GPT2_SMALL_PARAMS - WPE
        divided = {0: 0, 1: 12, 2: 14, 3: 16}[stage]
        expected = (16 - divided) * GPT2_SMALL_PARAMS + divided * (replicated / DEVICES + WPE)
        assert states(evaluation) == pytest.approx(expected, rel=1e-12)
        per = evaluation.memory
        assert per.optimizer_bytes == pytest.approx(12 * (replicated / DEVICES + WPE) if stage else 12 * GPT2_SMALL_PARAMS)

    def test_tied_weights_counted_once(self, gpt2):
        alias = gpt2_like(seq=128, batch=8, tie="alias")
        a = build(gpt2).evaluate([0] * len(gpt2.ops))
        b = build(alias).evaluate([0] * len(alias.ops))
        assert states(a) == states(b) == pytest.approx(16 * GPT2_SMALL_PARAMS)
        assert a.time_s == pytest.approx(b.time_s, rel=1e-12)

    def test_other_is_a_fixed_fraction(self, gpt2):
        evaluation = build(gpt2).evaluate([0] * len(gpt2.ops))
        m = evaluation.memory
        rest = m.params_bytes + m.grads_bytes + m.optimizer_bytes + m.activations_bytes
        assert m.other_bytes == pytest.approx(OTHER_FRACTION * rest, rel=1e-12)


class TestShards:
    def test_tensor_parallel_matmul_by_hand(self):
        graph = single_matmul(64, 32, 16)
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=4, devices_per_node=4))
        settings = TrainingSettings(zero_stage=1)
        memory = op_memory_bytes(op, space, tensors=graph.tensors, settings=settings)
        row_n = space.index_of({"n": 4})  # w split 4 ways, not replicated
        row_m = space.index_of({"m": 4})  # w whole, replicated 4 ways
        assert replication_degree(op, space, op.inputs[1])[[row_n, row_m]].tolist() == [1, 4]
        assert memory.params_bytes[row_n] == 16 * 8 * 2 and memory.optimizer_bytes[row_n] == 16 * 8 * 12
        assert memory.params_bytes[row_m] == 16 * 32 * 2
        assert memory.optimizer_bytes[row_m] == 16 * 32 * 12 / 4  # ZeRO 1 over the 4 replicas
        # Saved for backward: the input x shard (bf16): m=4 -> 16 x 16; n=4 -> x whole 64 x 16.
        assert memory.activations_bytes[row_m] == 16 * 16 * 2
        assert memory.activations_bytes[row_n] == 64 * 16 * 2


class TestRecompute:
    def test_selective_drops_the_attention_core(self):
        graph = gpt2_like(layers=2, hidden=64, heads=4, vocab=256, positions=64, batch=4, seq=64)
        plain = build(graph)
        selective = build(graph, recompute="selective")
        choice = [0] * len(graph.ops)
        a, b = plain.evaluate(choice), selective.evaluate(choice)
        assert b.memory.activations_bytes < a.memory.activations_bytes
        assert b.time.compute_s > a.time.compute_s
        by_name = {row.name: row for row in b.ops}
        # softmax output and the scores/probs inputs of the core matmuls are dropped; q, k, v stay.
        assert by_name["h.0.attn.softmax"].memory.activations_bytes == 0
        qkv_bytes = 4 * 64 * 64 * 2
        assert by_name["h.0.attn.qk"].memory.activations_bytes == 2 * qkv_bytes
        assert by_name["h.0.attn.av"].memory.activations_bytes == qkv_bytes

    def test_full_keeps_only_each_layer_input(self):
        layers, batch, seq, hidden = 3, 2, 32, 64
        graph = gpt2_like(layers=layers, hidden=hidden, heads=4, vocab=256, positions=64, batch=batch, seq=seq)
        model = build(graph, recompute="full")
        evaluation = model.evaluate([0] * len(graph.ops))
        in_blocks = {i for instance in graph.blocks[0].instances for i in instance}
        kept = sum(row.memory.activations_bytes for row in evaluation.ops if row.index in in_blocks)
        assert kept == layers * batch * seq * hidden * 2
        recomputed = sum(float(model.op_details[i].recompute_s[0]) for i in in_blocks)
        assert recomputed > 0

    def test_saved_activation_bytes_respects_external_inputs(self):
        graph = single_matmul(64, 32, 16)
        op = graph.ops[0]
        space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
        settings = TrainingSettings()
        kept = saved_activation_bytes(op, space, tensors=graph.tensors, settings=settings, recomputed=True,
                                      external_inputs=(0,))
        dropped = saved_activation_bytes(op, space, tensors=graph.tensors, settings=settings, recomputed=True)
        assert kept.tolist() == [64 * 16 * 2] and dropped.tolist() == [0.0]
        np.testing.assert_array_equal(kept, saved_activation_bytes(op, space, tensors=graph.tensors, settings=settings))


class TestExecutionModelMemory:
    """Working set of recomputation and the logits' gradient, under an execution model."""

    LAYERS, HIDDEN, HEADS, BATCH, SEQ, VOCAB = 3, 64, 4, 2, 64, 256

    def model(self, **settings):
        graph = gpt2_like(layers=self.LAYERS, hidden=self.HIDDEN, heads=self.HEADS, vocab=self.VOCAB,
                          positions=self.SEQ, batch=self.BATCH, seq=self.SEQ)
        return build_cost_model(
            graph, cluster=make_cluster("h100-sxm", devices=1), settings=TrainingSettings(**settings),
            config_options=ConfigOptions(devices=1, devices_per_node=1),
        )

    def test_full_recompute_keeps_one_layer_working_set(self):
        none = self.model(engine="fused", attention="flash")
        full = self.model(engine="fused", attention="flash", recompute="full")
        graph = full.graph
        first, *others = graph.blocks[0].instances
        in_block = {i for instance in graph.blocks[0].instances for i in instance}
        act = lambda m, i: float(m.op_details[i].memory.activations_bytes[0])  # noqa: E731
        # the first layer keeps everything (it is re-run in backward with all its activations live)
        for i in first:
            assert act(full, i) == act(none, i)
        # the other layers keep only their checkpoint: the layer input, read by its first norm and
        # its residual add (b x s x hidden, bf16, each reader counts what it saves)
        checkpoint = self.BATCH * self.SEQ * self.HIDDEN * 2
        for instance in others:
            kept = sum(act(full, i) for i in instance)
            assert kept == checkpoint  # the ln_1 input; the residual Add saves nothing
        outside = sum(act(none, i) for i in range(len(graph.ops)) if i not in in_block)
        total = float(full.evaluate([0] * len(graph.ops)).memory.activations_bytes)
        assert total == outside + sum(act(none, i) for i in first) + (self.LAYERS - 1) * checkpoint

    def test_logits_and_their_fp32_gradient_are_counted(self):
        model = self.model(engine="fused", attention="flash")
        plain = self.model()
        head = len(model.graph.ops) - 1
        logits = self.BATCH * self.SEQ * self.VOCAB
        extra = float(model.op_details[head].memory.activations_bytes[0]) - float(
            plain.op_details[head].memory.activations_bytes[0]
        )
        assert extra == logits * (2 + 4)  # the bf16 logits and the fp32 dL/dlogits


class TestResidualSumMemory:
    """A residual ``Add`` keeps no operand; with a ReLU fused after it, one tensor of its output."""

    @staticmethod
    def residual(fused_pointwise: int):
        from planner.core.graph import IterDim, Op, Tensor, TensorAccess

        shape = (4, 8, 5, 5)
        names = ("b", "c", "h", "w")
        tensors = {n: Tensor(name=n, shape=shape, dtype="float32", role="activation") for n in ("x", "skip", "y")}
        op = Op(name="add", kind="elementwise", op_type="Add",
                dims=tuple(IterDim(name=d, size=s, kind="parallel") for d, s in zip(names, shape)),
                inputs=(TensorAccess(tensor="x", axes=names), TensorAccess(tensor="skip", axes=names)),
                outputs=(TensorAccess(tensor="y", axes=names),), flops=float(4 * 8 * 5 * 5),
                fused_pointwise=fused_pointwise)
        return op, tensors

    @pytest.mark.parametrize("fused_pointwise,expected_tensors", [(0, 0), (1, 1)])
    def test_saved_bytes(self, fused_pointwise, expected_tensors):
        op, tensors = self.residual(fused_pointwise)
        space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
        kept = saved_activation_bytes(op, space, tensors=tensors, settings=TrainingSettings())
        # bf16-mixed (the default) keeps activations in 2 bytes
        assert kept.tolist() == [expected_tensors * 4 * 8 * 5 * 5 * 2]
