"""The graph bench/fidelity.py builds for ``kind: nemotron`` (NeMo's Nemotron layer), read by the importer
as the fidelity rows price it: a two-layer twin of the bench's own build (``NemotronForCausalLM`` on
FakeTensors, graph only), hidden 2,048 as the rows' widths are. At a hidden of 256 the build shows an artefact:
``examples/make_examples.py``'s stand-in values are consecutive integers, so the folded ``weight + 1`` equals the
norm bias's stand-in and the exporter's merging of equal small initializers joins them (5 x 256 parameters
short); at 2,048, as at every row's width, they are not merged and the count is exact.

Rebuild (integration environment, no download)::

    .venv-integration/bin/python bench/fidelity.py --build-worker '[{"kind": "nemotron", "layers": 2,
        "hidden": 2048, "heads": 16, "kv_heads": 4, "ffn": 4096, "vocab": 512, "seq": 128,
        "out": "tests/data/nemotron_bench_twin/nemotron_l2_h2048.onnx"}]'
"""

from __future__ import annotations

from pathlib import Path

import pytest

from importers import import_model
from importers.rotary import rotary_frequencies
from importers.zero_centred import folded_norm_scales

TWIN = Path(__file__).resolve().parents[1] / "data" / "nemotron_bench_twin" / "nemotron_l2_h2048.onnx"
HIDDEN, HEADS, KV_HEADS, FFN, VOCAB, LAYERS = 2048, 16, 4, 4096, 512, 2
BATCH, SEQ = 2, 128


@pytest.fixture(scope="module")
def graph():
    return import_model(TWIN, {"batch": BATCH, "seq": SEQ})


def test_parameters_are_nemotrons_by_hand(graph) -> None:
    head = HIDDEN // HEADS
    attention = HIDDEN * HIDDEN * 2 + HIDDEN * KV_HEADS * head * 2  # q, o; k, v (4 KV heads of 128)
    mlp = 2 * HIDDEN * FFN  # up and down, no gate, no biases
    norms = 2 * 2 * HIDDEN  # LayerNorm1P weight and bias, two per layer
    expected = 2 * VOCAB * HIDDEN + LAYERS * (attention + mlp + norms) + 2 * HIDDEN  # untied head, final norm
    assert graph.parameter_count == expected == 56_643_584


def test_squared_relu_is_the_up_projections_epilogue(graph) -> None:
    """relu2 exports as Relu then Pow(x, 2) after up_proj: both fold into that product (no op of their own), so
    the only elementwise ops left are the two residual adds per layer; the product's FLOPs are its 2 m n k
    plus one per output element for each folded node."""
    ups = [op for op in graph.ops if any("relu" in n for n in op.onnx_nodes)]
    assert len(ups) == LAYERS and all(op.kind == "matmul" for op in ups)
    for op in ups:
        assert [n.split("_")[1] for n in op.onnx_nodes[1:]] == ["relu", "pow"]
        assert op.flops == 2 * BATCH * SEQ * HIDDEN * FFN + 2 * BATCH * SEQ * FFN
    assert sum(op.kind == "elementwise" for op in graph.ops) == 2 * LAYERS


def test_partial_rotary_slices_half_of_each_head(graph) -> None:
    """rotary_percent 0.5: q and k are cut into the rotated first half of each head (64 of 128 channels) and
    the passed half; rotate_half then halves the rotated part (32). The graph-only file keeps no inv_freq."""
    widths = sorted({op.dims[-1].size for op in graph.ops if op.kind == "slice"})
    assert widths == [HIDDEN // HEADS // 4, HIDDEN // HEADS // 2]
    assert rotary_frequencies(TWIN) is None


def test_layernorm1p_scales_read_as_folded_constants(graph) -> None:
    """The exporter folds ``weight + 1`` into constants it names (``add_*``): the importer counts them as the
    scales (parameters exact above) and lists them as folded, so a launcher built from flags can say it cannot
    tell LayerNorm1P (``--apply-layernorm-1p``) from a plain LayerNorm."""
    norms = [op for op in graph.ops if op.kind == "norm"]
    assert len(norms) == 2 * LAYERS + 1
    assert len(folded_norm_scales(graph)) == 2 * LAYERS + 1
