"""Issue 25 follow-up: a BERT-shaped stack whose norms are RMSNorm is refused by the Megatron export.

megatron-core 0.16.1's ``BertLMHead`` builds its norm as Apex's ``FusedLayerNorm`` wherever Apex is
installed (``models/bert/bert_lm_head.py:10-11``), which asserts ``normalization == "LayerNorm"``
(``fusions/fused_layer_norm.py:66-68``): ``--normalization RMSNorm`` would fail when the model is built
(tests/integration/test_megatron_bert_rmsnorm.py checks both against megatron-core itself).

The fixture is ``tests/exporters/data/megatron_bert_tiny.onnx`` (the BERT megatron-core builds, which
exports) with each ``LayerNormalization`` (6: two per layer of 2, the final norm, the LM head's)
rewritten as transformers' RMSNorm decomposition, ``x / sqrt(mean(x^2) + eps) * w``, its bias dropped.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import helper, numpy_helper

from exporters.megatron.families import megatron_family
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from tests.exporters.test_megatron_families import DATA, DIMS
from planner.plan import load_graph


def _rms_bert(tmp_path: Path) -> Path:
    """``megatron_bert_tiny.onnx`` with RMSNorms (module docstring)."""
    model = onnx.load(str(DATA / "megatron_bert_tiny.onnx"), load_external_data=False)
    nodes, dropped = [], set()
    axes = numpy_helper.from_array(np.array([-1], np.int64), "rms.axes")
    two = numpy_helper.from_array(np.array(2.0, np.float32), "rms.two")
    for node in model.graph.node:
        if node.op_type != "LayerNormalization":
            nodes.append(node)
            continue
        (x, weight, bias), (y,), n = node.input, node.output, node.name
        eps = numpy_helper.from_array(np.array(1e-6, np.float32), f"{n}.eps")
        model.graph.initializer.append(eps)
        dropped.add(bias)
        nodes += [
            helper.make_node("Pow", [x, two.name], [f"{n}.sq"], name=f"{n}.pow"),
            helper.make_node("ReduceMean", [f"{n}.sq", axes.name], [f"{n}.ms"], name=f"{n}.mean", keepdims=1),
            helper.make_node("Add", [f"{n}.ms", eps.name], [f"{n}.var"], name=f"{n}.add"),
            helper.make_node("Sqrt", [f"{n}.var"], [f"{n}.rms"], name=f"{n}.sqrt"),
            helper.make_node("Div", [x, f"{n}.rms"], [f"{n}.normed"], name=f"{n}.div"),
            helper.make_node("Mul", [f"{n}.normed", weight], [y], name=f"{n}.scale"),
        ]
    kept = [t for t in model.graph.initializer if t.name not in dropped]
    del model.graph.initializer[:]
    model.graph.initializer.extend(kept + [axes, two])
    del model.graph.node[:]
    model.graph.node.extend(nodes)
    path = tmp_path / "megatron_bert_rms_tiny.onnx"
    onnx.save(model, str(path))
    return path


@pytest.fixture(scope="module")
def rms_bert(tmp_path_factory):
    return load_graph(_rms_bert(tmp_path_factory.mktemp("rms")), DIMS)


def test_the_fixture_is_the_bert_with_rmsnorm(rms_bert):
    # 177,576 parameters of the LayerNorm BERT less the 6 norms' biases of 64: 177,192
    assert rms_bert.parameter_count == 177_576 - 6 * 64
    model = analyze_transformer(rms_bert)
    assert (model.normalization, model.num_layers, model.features.attention_mask) == ("RMSNorm", 2, "bidirectional")


def test_megatron_refuses_it_in_one_line_naming_why(rms_bert):
    with pytest.raises(UnsupportedExport) as caught:
        megatron_family(rms_bert, analyze_transformer(rms_bert))
    message = str(caught.value)
    assert "\n" not in message and message.startswith("Megatron-LM's BERT (pretrain_bert.py) would train a different")
    # the one clause (the others, "; "-joined, all pass: 6 norms = 2 x 2 layers + 2, the head's bias...)
    clauses = message.split("would train a different model: ")[1].split("; ")
    assert clauses[1:] == ["export as the generic plan"]  # exporters.export names the launchers that run the plan
    assert clauses[0].startswith("its norms are RMSNorm") and "FusedLayerNorm" in clauses[0]
