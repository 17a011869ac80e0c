"""A parameter repeated once per sample is batched (issue 25, task H6, item 2: DETR's decoder heads).

DETR's decoder starts from its learned queries repeated per image, ``query_position_embeddings.weight.unsqueeze(0)
.repeat(batch, 1, 1)`` (transformers 5.24 ``DetrModel.forward``), which TorchScript writes as ``Tile(table,
Concat(Unsqueeze(Gather(Shape(pixel_values), 0)), 1, 1))``. The batch marks followed the inputs' data only, so the
decoder's first self-attention, which reads nothing but those queries (its hidden state starts as zeros), had no
batch dim and took ``batch x heads`` = 8 for its heads; ``importers.shape_batch.tiled_batch_axes`` reads the repeat
count off ``Shape(pixel_values)[0]`` and marks the axis. SigLIP's pooling head repeats its probe the same way.

Oracles: ``counts.json`` (the config: 4 heads in every attention, torch's parameter count) and torch's own
parameters of the same model (``tests/importers/make_importer_sweep_cases.py``'s config, named_parameters()):
the 2,244 of ``bbox_predictor`` (3 linears 32-32-32-4 with biases) are not in the file, whose only output is the
logits (the exporter prunes the box head), and the 8 frozen BatchNorms' folded scale and shift are buffers in torch
(``DetrFrozenBatchNorm2d``), which the file cannot tell from a learned affine: counted and warned in one line.
"""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from importers.transformer import analyze_transformer
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
SWEEP = ROOT / "tests" / "data" / "importer_sweep_cases"
DETR = SWEEP / "detr_ts_bare.onnx"
CONFIG = json.loads((SWEEP / "counts.json").read_text())["detr_ts"]


@pytest.fixture(scope="module")
def detr():
    return load_graph(DETR, {"batch": 2})


def test_every_attention_reads_the_configs_heads(detr):
    model = analyze_transformer(detr)
    heads = {CONFIG["config"]["encoder_attention_heads"], CONFIG["config"]["decoder_attention_heads"]}
    assert heads == {4}
    assert [block.heads for block in model.attention] == [4] * 6  # 2 encoder, 2 x 2 decoder (self, cross)
    assert not any("heads" in note for note in model.irregular)


def test_the_tiled_queries_carry_the_batch(detr):
    tile = next(op for op in detr.ops if op.node_types == ("Tile",))
    (batch,) = [d for d in tile.dims if d.is_batch]
    assert batch.size == 2 and tile.outputs[0].axes[0] == (batch.name,)  # the repeat count: pixel_values' batch
    q_proj = detr.op_index("/model/decoder/layers.0/self_attn/q_proj/MatMul")
    assert [d.size for d in detr.ops[q_proj].dims if d.is_batch] == [2]


def test_count_is_torchs_less_the_pruned_box_head(detr):
    d = CONFIG["config"]["d_model"]
    box_head = (d * d + d) * 2 + (4 * d + 4)  # bbox_predictor: Linear(d, d), Linear(d, d), Linear(d, 4)
    assert box_head == 2244
    # the 8 frozen BatchNorms' scale and shift the exporter folded (torch: buffers), counted and warned; equal
    # constants of a fresh model are merged (the shared-vector warning), so 16 + 4 + 8 + 32 channels, x 2, once
    (frozen,) = [w for w in detr.warnings if "match a frozen BatchNorm folded from its buffers" in w]
    folded = int(re.search(r"they are counted \(([\d,]+) parameters\)", frozen).group(1).replace(",", ""))
    assert folded == 2 * (16 + 4 + 8 + 32) == 120 and frozen.startswith("8 per-channel scale and shift")
    assert detr.parameter_count == CONFIG["param_count"] - box_head + folded  # 50,730 - 2,244 + 120 = 48,606


def test_a_model_without_frozen_norms_is_not_warned():
    graph = load_graph(ROOT / "tests" / "data" / "pooling_cases" / "siglip_ts_bare.onnx", {"batch": 2})
    assert not any("frozen BatchNorm" in w for w in graph.warnings)  # its patch Conv has a bias of its own


def test_siglip_probe_is_batched():
    graph = load_graph(ROOT / "tests" / "data" / "pooling_cases" / "siglip_ts_bare.onnx", {"batch": 2})
    tile = graph.ops[graph.op_index("/vision_model/head/Tile")]
    assert [d.size for d in tile.dims if d.is_batch] == [2]
