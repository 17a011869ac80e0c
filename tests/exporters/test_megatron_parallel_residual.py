"""Issue 25: parallel attention and MLP (``x + attn(norm(x)) + mlp(norm(x))``: GPT-J, GPT-NeoX, Falcon,
Phi) is found in the graph (importers/layer_features.py ``parallel_sublayers``) and the Megatron export
refuses it in one line, where it used to export a sequential GPT (megatron-core 0.16.1's
TransformerLayer runs attention, then the MLP on its output).

Fixtures: the zoo (``tests/zoo/make_zoo.py``): Falcon (``parallel_attn=True``), GPT-NeoX
(``use_parallel_residual``, transformers' default) and Phi are parallel; GPT-2, Llama, Mistral, Qwen2,
Mixtral and BLOOM are sequential.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

ZOO = Path(__file__).resolve().parents[1] / "zoo"
DIMS = {"batch": 16, "seq": 16}
STYLES = ["dynamo_bare", "ts_bare", "dynamo_consts", "ts_consts"]


@pytest.mark.parametrize("style", STYLES)
@pytest.mark.parametrize(("arch", "parallel"), [
    ("falcon", True), ("gpt_neox", True), ("phi", True),
    ("gpt2", False), ("llama", False), ("mistral", False), ("qwen2", False), ("mixtral", False), ("bloom", False),
])
def test_parallel_sublayers(arch, parallel, style):
    assert analyze_transformer(load_graph(ZOO / f"{arch}_{style}.onnx", DIMS)).features.parallel_residual is parallel


@pytest.mark.parametrize("arch", ["falcon", "gpt_neox", "phi"])
def test_megatron_refuses_in_one_line(arch):
    graph = load_graph(ZOO / f"{arch}_ts_bare.onnx", DIMS)
    with pytest.raises(UnsupportedExport) as info:
        megatron_family(graph, analyze_transformer(graph))
    reason = str(info.value)
    assert "\n" not in reason and "in parallel" in reason and "runs them in sequence" in reason
    # the family's own refusal ends with the generic plan; exporters.export names the launchers that run
    # the plan instead (exporters.elsewhere, tests/exporters/test_refusal_suffix.py)
    assert reason.endswith("; export as the generic plan")
