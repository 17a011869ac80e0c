"""Losses split over the batch and the vocabulary (issue 25): SoftmaxCrossEntropyLoss,
NegativeLogLikelihoodLoss and a hand-written LogSoftmax -> GatherElements -> ReduceMean.

Graphs: ``x[N, H] @ W[H, V] -> logits[N, V] -> loss`` built with ``onnx.helper``, N tokens, V
classes. The vocab-parallel cross entropy's communication is Megatron's
(``megatron/core/tensor_parallel/cross_entropy.py``, ``_VocabParallelCrossEntropy.forward``): over
the class split's group, three all-reduces of one fp32 word per token (the logit max, the target
logit, the sum of exponentials) and none in backward, so a device holding T tokens moves
3 x T x 4 bytes through all-reduces per step.
"""

from __future__ import annotations

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

from objectives.cluster import make_cluster
from objectives.intra_op import CROSS_ENTROPY_ALL_REDUCES, STATS_WORD_BYTES, intra_op_terms
from objectives.memory import PROBABILITY_BYTES, saved_activation_bytes
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings
from planner.plan import PlanRequest, evaluate, load_graph, plan

TOKENS, HIDDEN, VOCAB = 2048, 256, 32000


def _lm_head(tokens: int, hidden: int, vocab: int):
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["batch", hidden])
    labels = helper.make_tensor_value_info("labels", TensorProto.INT64, ["batch"])
    weight = numpy_helper.from_array(np.zeros((hidden, vocab), np.float32), "lm_head.weight")
    matmul = helper.make_node("MatMul", ["x", "lm_head.weight"], ["logits"], name="lm_head")
    return x, labels, weight, matmul


def _save(tmp_path, name, nodes, inputs, outputs, initializers) -> str:
    model = helper.make_model(helper.make_graph(nodes, name, inputs, outputs, initializers),
                              opset_imports=[helper.make_opsetid("", 18)])
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, path)
    return str(path)


def cross_entropy_file(tmp_path, *, reduction="mean", log_prob=False, op_type="SoftmaxCrossEntropyLoss") -> str:
    x, labels, weight, matmul = _lm_head(TOKENS, HIDDEN, VOCAB)
    nodes = [matmul]
    scores = "logits"
    if op_type == "NegativeLogLikelihoodLoss":  # as torch's dynamo exporter writes F.cross_entropy
        nodes.append(helper.make_node("LogSoftmax", ["logits"], ["log_probs"], name="log_softmax", axis=1))
        scores = "log_probs"
    outs = ["loss", "log_prob"] if log_prob else ["loss"]
    nodes.append(helper.make_node(op_type, [scores, "labels"], outs, name="loss", reduction=reduction,
                                  ignore_index=-100))
    shape = ["batch"] if reduction == "none" else []
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, shape)]
    if log_prob:
        outputs.append(helper.make_tensor_value_info("log_prob", TensorProto.FLOAT, ["batch", VOCAB]))
    return _save(tmp_path, f"ce_{op_type}_{reduction}_{int(log_prob)}", nodes, [x, labels], outputs, [weight])


def gather_mean_file(tmp_path) -> str:
    """-mean(log_softmax(logits).gather(1, labels[:, None])), written out node by node."""
    x, labels, weight, matmul = _lm_head(TOKENS, HIDDEN, VOCAB)
    axes = numpy_helper.from_array(np.array([1], np.int64), "axes")
    nodes = [
        matmul,
        helper.make_node("LogSoftmax", ["logits"], ["log_probs"], name="log_softmax", axis=1),
        helper.make_node("Unsqueeze", ["labels", "axes"], ["labels_2d"], name="unsqueeze"),
        helper.make_node("GatherElements", ["log_probs", "labels_2d"], ["picked"], name="pick", axis=1),
        helper.make_node("Neg", ["picked"], ["nll"], name="neg"),
        helper.make_node("ReduceMean", ["nll"], ["loss"], name="mean", keepdims=0),
    ]
    outputs = [helper.make_tensor_value_info("loss", TensorProto.FLOAT, [])]
    return _save(tmp_path, "gather_mean", nodes, [x, labels], outputs, [weight, axes])


def _graph(path):
    return load_graph(path, {"batch": TOKENS})


def _op(graph, name):
    return graph.ops[graph.op_index(name)]


def _request(devices=8) -> PlanRequest:
    return PlanRequest(cluster=make_cluster("a100-80gb", devices=devices), method="dp")


class TestImport:
    def test_softmax_cross_entropy_offers_batch_and_vocab_splits(self, tmp_path):
        graph = _graph(cross_entropy_file(tmp_path))
        assert not graph.warnings  # no longer opaque
        loss = _op(graph, "loss")
        assert loss.kind == "softmax"
        assert [(d.name, d.size, d.kind, d.is_batch) for d in loss.dims] == [
            ("n", TOKENS, "parallel", True), ("c", VOCAB, "normalized", False)]
        assert [a.axes for a in loss.inputs] == [(("n",), ("c",)), (("n",),)]
        assert [a.axes for a in loss.outputs] == [()]  # the mean: a scalar
        space = enumerate_configs(loss, ConfigOptions(devices=8, devices_per_node=8))
        splits = {tuple(row) for row in space.factors.tolist()}
        assert {(8, 1), (1, 8), (2, 4), (1, 1)} <= splits  # batch, vocab, both, replicated

    def test_reduction_none_and_log_prob_are_split_like_their_operands(self, tmp_path):
        loss = _op(_graph(cross_entropy_file(tmp_path, reduction="none", log_prob=True)), "loss")
        assert [a.axes for a in loss.outputs] == [(("n",),), (("n",), ("c",))]

    def test_nll_after_log_softmax_splits_the_classes_as_a_reduction(self, tmp_path):
        graph = _graph(cross_entropy_file(tmp_path, op_type="NegativeLogLikelihoodLoss"))
        assert not graph.warnings
        loss = _op(graph, "loss")
        assert (loss.kind, [(d.name, d.kind) for d in loss.dims]) == ("reduce", [("n", "parallel"), ("c", "reduction")])

    def test_hand_written_pick_splits_the_vocabulary(self, tmp_path):
        graph = _graph(gather_mean_file(tmp_path))
        pick = next(op for op in graph.ops if op.op_type == "GatherElements")
        assert ("c", VOCAB, "reduction") in [(d.name, d.size, d.kind) for d in pick.dims]


class TestCommunication:
    def _terms(self, tmp_path, factors, **kwargs):
        graph = _graph(cross_entropy_file(tmp_path, **kwargs))
        loss = _op(graph, "loss")
        space = enumerate_configs(loss, ConfigOptions(devices=8, devices_per_node=8))
        row = next(r for r, f in enumerate(space.factors.tolist()) if tuple(f) == factors)
        terms = intra_op_terms(loss, space, tensors=graph.tensors, settings=TrainingSettings())
        moving = [t for t in terms if t.intra_size[row] * t.inter_size[row] > 1]
        return moving, row

    def test_vocab_split_is_three_per_token_all_reduces(self, tmp_path):
        # n split 2 ways, c 4 ways: each device holds T = 2048 / 2 tokens; over the 4 class ranks
        # Megatron all-reduces max, target logit and sum-exp: 3 x T x 4 bytes, forward only.
        moving, row = self._terms(tmp_path, (2, 4))
        stats = [t for t in moving if t.kind == "norm_stats"]
        assert len(stats) == 1 and stats[0].collective == "all_reduce"
        tokens = TOKENS // 2
        assert stats[0].count * stats[0].num_bytes[row] == 3 * tokens * 4
        assert (stats[0].count, STATS_WORD_BYTES, CROSS_ENTROPY_ALL_REDUCES) == (3.0, 4, 3)
        assert stats[0].intra_size[row] == 4  # the class split's group, not the batch's
        # the mean loss: a partial scalar over the batch split (2), not over the classes
        partial = [t for t in moving if t.kind == "partial_sum"]
        assert len(partial) == 1 and partial[0].num_bytes[row] == 2 and partial[0].intra_size[row] == 2  # bf16
        assert not [t for t in moving if t.kind == "input_grad"]

    def test_batch_split_of_a_mean_all_reduces_one_scalar(self, tmp_path):
        moving, row = self._terms(tmp_path, (8, 1))
        assert [(t.kind, t.num_bytes[row], t.intra_size[row]) for t in moving] == [("partial_sum", 2, 8)]

    def test_batch_split_of_reduction_none_needs_nothing(self, tmp_path):
        moving, _ = self._terms(tmp_path, (8, 1), reduction="none")
        assert moving == []

    def test_saved_probabilities_are_fp32_shards(self, tmp_path):
        graph = _graph(cross_entropy_file(tmp_path))
        loss = _op(graph, "loss")
        space = enumerate_configs(loss, ConfigOptions(devices=8, devices_per_node=8))
        saved = saved_activation_bytes(loss, space, tensors=graph.tensors, settings=TrainingSettings())
        expected = TOKENS * VOCAB * PROBABILITY_BYTES / space.factors.prod(axis=1)
        np.testing.assert_allclose(saved, expected)


class TestPlan:
    def test_best_plan_splits_the_loss_and_beats_keeping_it_whole(self, tmp_path):
        graph = _graph(cross_entropy_file(tmp_path))
        request = _request(8)
        result = plan(graph, request, with_targets=False)
        best = result.best.strategy
        index = graph.op_index("loss")
        factors = result.spaces[index].factors[best.choice[index]]
        assert factors.prod() > 1  # the loss is split
        # the same plan with the loss kept whole (what the opaque op forced), run once or on every device
        whole = {name: dict(split) for name, split in best.splits.items()}
        whole["loss"] = {}
        kept = [
            evaluate(graph, request, whole, inter_splits=best.inter_splits, replicas={**best.replicas, "loss": copies})
            for copies in (1, 8)
        ]
        assert best.time_s < min(k.time_s for k in kept)
        assert best.memory_bytes < min(k.memory_bytes for k in kept)

    @pytest.mark.parametrize("maker", ["nll", "gather"])
    def test_decomposed_losses_split_too(self, tmp_path, maker):
        path = (cross_entropy_file(tmp_path, op_type="NegativeLogLikelihoodLoss") if maker == "nll"
                else gather_mean_file(tmp_path))
        graph = _graph(path)
        result = plan(graph, _request(8), with_targets=False)
        best = result.best.strategy
        for i, op in enumerate(graph.ops):
            if op.op_type in ("LogSoftmax", "NegativeLogLikelihoodLoss", "GatherElements"):
                assert result.spaces[i].factors[best.choice[i]].prod() > 1, op.name
