"""A graph moved to another batch size (``importers.rebatch``) has the transformer structure of the graph it was
moved from, so ``planner.pipeline.GraphLoader`` lets ``analyze_transformer`` answer for it with that graph's
analysis (``importers.transformer.analyzed_alike``; issue 22, eleventh round) instead of finding it again per
micro-batch size.

The oracle is the recognition itself, run afresh (``_analyze``, no cache) on each moved graph: equal to the
analysis of the graph it was moved from, at batch sizes that equal the model's heads, head dim, hidden size,
sequence and vocabulary (where a size-matching rule would confuse a batch dim with them), on decoders, an
encoder, an encoder-decoder, an MoE and a vision transformer; and a refusal (an RNN) stays a refusal."""

from __future__ import annotations

from pathlib import Path

import pytest

import importers.transformer as transformer
from exporters._common import UnsupportedExport
from planner.pipeline import graph_loader

DATA = Path(__file__).resolve().parents[1] / "data"
EXAMPLES = Path(__file__).resolve().parents[2] / "examples"
CASES = [
    (EXAMPLES / "gpt2.onnx", {"seq": 1024}, (2, 12, 64, 768, 1024, 1025, 3)),
    (EXAMPLES / "llama.onnx", {"seq": 512}, (2, 4, 8, 32, 512, 6)),
    (EXAMPLES / "bert.onnx", {"seq": 128}, (2, 12, 64, 128, 768, 5)),
    (DATA / "gpt2_tiny.onnx", {"seq": 128}, (2, 4, 16, 64, 128, 3)),
    (DATA / "mixtral_tiny.onnx", {"seq": 64}, (2, 4, 8, 64, 3)),
    (DATA / "t5_tiny.onnx", {"seq": 32, "tgt_seq": 16}, (2, 4, 16, 32, 3)),
    (DATA / "vit_tiny.onnx", {}, (2, 4, 16, 3)),
]


def _fresh(graph):
    try:
        return transformer._analyze(graph)
    except UnsupportedExport as refused:
        return ("refused", refused.reason)


@pytest.mark.parametrize("path, dims, sizes", CASES, ids=[c[0].stem for c in CASES])
def test_a_moved_graphs_analysis_is_the_one_found_afresh(path, dims, sizes):
    loader = graph_loader(path, dims)
    graphs = [loader(b) for b in sizes]
    if not loader._linear:
        pytest.skip(f"{path.name} is imported at each batch (not rebatched)")
    first = _fresh(graphs[0])
    moved = [g for g in graphs[2:]]  # graphs[1] is imported (the linearity check), the rest moved
    assert moved and all(g is not graphs[0] for g in moved)
    for graph in moved:
        assert _fresh(graph) == first  # the oracle: the recognition on the moved graph itself
        if isinstance(first, tuple):
            with pytest.raises(UnsupportedExport):
                transformer.analyze_transformer(graph)
        else:
            assert transformer.analyze_transformer(graph) == first


def test_the_loader_finds_the_structure_once_per_imported_graph(monkeypatch):
    calls = []
    real = transformer._analyze
    monkeypatch.setattr(transformer, "_analyze", lambda graph: calls.append(graph) or real(graph))
    loader = graph_loader(DATA / "gpt2_tiny.onnx", {"seq": 128})
    sizes = (2, 4, 8, 16, 32, 64, 3, 6, 12, 24, 48, 96, 5, 10, 20, 40, 80, 7, 14, 28)  # more than the cache's 16
    for _ in range(2):
        for b in sizes:
            transformer.analyze_transformer(loader(b))
    assert loader._linear
    # batch 2's graph at most (none where the importer's graph cache hands back one analysed before); 4's
    # (imported, equal to 2's moved) and the moved ones are answered with it
    assert [g.dim_bindings["batch"] for g in calls] in ([2], [])
    assert all(transformer.analyze_transformer(loader(b)) is transformer.analyze_transformer(loader(2)) for b in sizes)
