"""A traced data-dependent loop (``NonZero``) says the file may lack the weights of iterations its example
never took (issue 25, h24e).

transformers' ``SwitchTransformersForConditionalGeneration`` (2 + 2 layers, d_model 64, 4 experts every second
layer), exported by TorchScript on 16 encoder and 8 decoder tokens, holds 7 of its 8 experts: no decoder token
was routed to expert 3, so its ``wi``/``wo`` (2 x 64 x 128 = 16,384 elements) are not in the file and the
importer counted 16,384 fewer than torch's 327,680 with no warning saying why (the tied LM head's +64,000 was
warned). The NonZero warning now says it. Here a hand-built trace of the same shape: a router, the tokens sent
to expert 0 gathered by ``NonZero``, expert 0's matmul; expert 1 absent, as TorchScript drops it.
"""

from __future__ import annotations

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

from importers import import_model

HIDDEN, EXPERTS = 8, 2


def _traced_expert_loop(path) -> None:
    x = helper.make_tensor_value_info("x", TensorProto.FLOAT, ["tokens", HIDDEN])
    y = helper.make_tensor_value_info("y", TensorProto.FLOAT, None)
    inits = [
        numpy_helper.from_array(np.ones((HIDDEN, EXPERTS), np.float32), "router.weight"),
        numpy_helper.from_array(np.ones((HIDDEN, HIDDEN), np.float32), "experts.expert_0.wi.weight"),
        numpy_helper.from_array(np.array(0, np.int64), "expert_id"),
        numpy_helper.from_array(np.array([0], np.int64), "axis0"),
    ]
    nodes = [
        helper.make_node("MatMul", ["x", "router.weight"], ["logits"], name="router/MatMul"),
        helper.make_node("ArgMax", ["logits"], ["choice"], name="router/ArgMax", axis=1, keepdims=0),
        helper.make_node("Equal", ["choice", "expert_id"], ["mask"], name="experts/Equal"),
        helper.make_node("NonZero", ["mask"], ["where"], name="experts/NonZero"),
        helper.make_node("Squeeze", ["where", "axis0"], ["rows"], name="experts/Squeeze"),
        helper.make_node("Gather", ["x", "rows"], ["routed"], name="experts/Gather", axis=0),
        helper.make_node("MatMul", ["routed", "experts.expert_0.wi.weight"], ["y"], name="experts/expert_0/wi/MatMul"),
    ]
    graph = helper.make_graph(nodes, "switch_like", [x], [y], initializer=inits)
    onnx.save(helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)]), str(path))


def test_a_traced_expert_loop_says_weights_may_be_missing(tmp_path):
    path = tmp_path / "expert_loop.onnx"
    _traced_expert_loop(path)
    graph = import_model(path, {"tokens": 16})
    # the file holds the router (8 x 2) and expert 0 (8 x 8); the module it was traced from also has expert 1
    assert graph.parameter_count == HIDDEN * EXPERTS + HIDDEN * HIDDEN == 80
    nonzero = [w for w in graph.warnings if "op type 'NonZero'" in w]
    assert len(nonzero) == 1
    assert "holds only the iterations its example took" in nonzero[0]
    assert "an expert no example token reached" in nonzero[0]
