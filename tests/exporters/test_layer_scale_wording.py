"""What each launcher says of a LayerScale is accurate (issue 25, task H2, item 6).

BEiT (``layer_scale_init_value > 0``) multiplies each attention output by ``lambda_1`` and each MLP output by
``lambda_2``, learned vectors of the hidden size, before the residual adds. torchtitan refused it as "it
scales the attention output by a factor (Granite's multipliers)": a constant's words for a learned
parameter, and silent on the MLP's. Megatron-LM's and torchtitan's clauses now name a learned per-channel
scale on both sub-layers (:func:`exporters._common.stream_scale_sites`), while Granite's constant multipliers
keep theirs; DeepSpeed, Mesh-TF and DTensor train the model's own modules, LayerScale included, and export it.
Oracles: torch's parameters (``tests/exporters/make_layer_scale_cases.py`` prints four ``lambda`` vectors of
64, 80,266 parameters in all) and the ONNX files' initializers.
"""

from __future__ import annotations

from pathlib import Path

import onnx
import pytest

from exporters import export
from exporters._common import stream_scale_sites
from exporters.megatron.families import family_refusals as megatron_refusals
from planner.core.errors import UnsupportedExport
from planner.pricing import load_graph
from importers.transformer import analyze_transformer
from tests.exporters.graphs import make_input, spaces_for

ROOT = Path(__file__).resolve().parents[2]
CASES = ROOT / "tests" / "exporters" / "data" / "layer_scale_cases"
GRANITE = ROOT / "tests" / "exporters" / "data" / "granite_tiny.onnx"
LEARNED = ("it multiplies each attention and each MLP output by a learned per-channel vector before the residual "
           "add (LayerScale, as BEiT's lambda_1 and lambda_2)")


@pytest.fixture(scope="module", params=["beit_ts_bare", "beit_dynamo_bare"])
def beit(request):
    path = CASES / f"{request.param}.onnx"
    scales = [t for t in onnx.load(str(path), load_external_data=False).graph.initializer if ".lambda_" in t.name]
    assert sorted(t.name for t in scales) == [f"beit.layers.{i}.lambda_{j}" for i in (0, 1) for j in (1, 2)]
    assert all(tuple(t.dims) == (64,) for t in scales)
    graph = load_graph(path, {"batch": 2})
    assert graph.parameter_count == 80_266  # torch's count: the four vectors are counted
    return graph


def test_the_scales_read_as_learned_on_both_sub_layers(beit):
    assert stream_scale_sites(analyze_transformer(beit), beit) == ((), ("attention", "MLP"))


def test_torchtitan_and_megatron_name_a_learned_scale(beit):
    plan = make_input(beit, spaces_for(beit, 1), [0] * len(beit.ops))
    with pytest.raises(UnsupportedExport) as refused:
        export("torchtitan", plan)
    reason = refused.value.reason
    assert LEARNED + ", the family's layers have no such parameter" in reason
    assert "Granite" not in reason and "by a factor" not in reason
    # Megatron-LM refuses BEiT first for its missing LM head; its family clause, asked directly, says the same
    clauses = megatron_refusals(analyze_transformer(beit), "bert", beit)
    assert LEARNED + " and Megatron-LM's BERT layers have no such parameter" in clauses
    assert not any("by a factor" in clause for clause in clauses)


def test_the_launchers_that_train_the_model_as_written_export_it(beit):
    plan = make_input(beit, spaces_for(beit, 1), [0] * len(beit.ops))
    for name in ("deepspeed", "meshtf", "dtensor"):
        assert export(name, plan)["target"] == name


def test_constant_multipliers_keep_their_words():
    graph = load_graph(GRANITE, {"batch": 2, "seq": 16})
    model = analyze_transformer(graph)
    assert stream_scale_sites(model, graph) == (("embedding", "attention output", "logits"), ())
    assert any("by a factor (Granite's multipliers" in clause for clause in megatron_refusals(model, "gpt", graph))
