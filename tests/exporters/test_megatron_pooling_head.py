"""An attention-pooling head is no encoder-decoder (issue 25, a second sweep of unseen architectures).

SigLIP's vision tower ends in ``SiglipMultiheadAttentionPoolingHead``: a learned probe, repeated over the
batch, attends over the patch tokens. Its queries and keys read different tensors, which made the
Megatron exporter take it for T5's cross-attention and refuse SigLIP with a page of T5 clauses ("its
decoder self-attention is bidirectional", "its encoder reads no token embedding"). The probe is a
parameter (``vision_model.head.probe``; ``val_N`` in the dynamo file) that no decoder stack produces.

Fixtures: ``tests/data/pooling_cases`` (``tests/importers/make_pooling_cases.py``: ``SiglipModel``, two
towers of 2 layers, one pooling head); BART is the control that keeps its cross-attentions.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.megatron.families import megatron_family
from exporters.megatron.t5 import _reads_a_probe, t5_stack
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph

ROOT = Path(__file__).resolve().parents[2]
POOLING = ROOT / "tests" / "data" / "pooling_cases"


@pytest.mark.parametrize("exporter", ["ts", "dynamo"])
def test_siglip_pooling_head_reads_a_probe_and_is_no_cross_attention(exporter):
    graph = load_graph(POOLING / f"siglip_{exporter}_bare.onnx", {"batch": 4})
    model = analyze_transformer(graph)
    # 2 vision layers + 2 text layers + the pooling head (SiglipConfig above)
    assert len(model.attention) == 5
    assert sum(_reads_a_probe(graph, block) for block in model.attention) == 1
    assert t5_stack(graph, model) is None
    with pytest.raises(UnsupportedExport) as info:
        megatron_family(graph, model)
    reason = str(info.value)
    assert "encoder-decoder" not in reason and "T5" not in reason
    assert "without an LM head" in reason


def test_an_encoder_decoder_keeps_its_cross_attentions():
    graph = load_graph(ROOT / "tests" / "zoo" / "bart_ts_bare.onnx", {"batch": 2, "seq": 16, "tgt_seq": 16})
    model = analyze_transformer(graph)
    stack = t5_stack(graph, model)
    assert stack is not None and len(stack.decoder_cross) == 2  # BART of 2 decoder layers (make_zoo.py)
    assert not any(_reads_a_probe(graph, block) for block in model.attention)
