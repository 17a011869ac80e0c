"""The importer on the real exported models in examples/ and tests/data/ (skipped when absent).

Parameter counts are compared with ``sum(p.numel() for p in model.parameters())`` of the torch model,
recorded in each folder's ``models.json`` when the files were exported.
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from importers import import_model
from importers.summary import summarize
from tests.importers.graph_checks import check_graph

ROOT = Path(__file__).resolve().parents[2]
FOLDERS = (ROOT / "examples", ROOT / "tests" / "data")


def _entries() -> list[tuple[str, Path, dict]]:
    entries = []
    for folder in FOLDERS:
        index = folder / "models.json"
        if not index.exists():
            continue
        for key, info in json.loads(index.read_text()).items():
            entries.append((key, folder / info["file"], info))
    return entries


ENTRIES = _entries()


def _dims(info: dict) -> dict[str, int]:
    """Small dims; sequence lengths at the export's example values (TorchScript exports bake them)."""
    config = info.get("config", {})
    values = {"batch": 2, "seq": config.get("example_seq", 16), "tgt_seq": config.get("example_tgt_seq", 16)}
    return {name: values.get(name, 8) for name in info.get("dims", [])}


@pytest.mark.parametrize("key,path,info", ENTRIES, ids=[e[0] for e in ENTRIES])
def test_imports_with_exact_parameter_count(key, path, info):
    if not path.exists():
        pytest.skip(f"{path} not generated")
    graph = import_model(path, _dims(info))
    assert check_graph(graph) == []
    expected = info["param_count"]
    maybe_tied = [w for w in graph.warnings if "may be a transposed copy of the tied embedding" in w]
    if maybe_tied:
        # A TorchScript export without values: its tied LM head's transposed copy is counted, with a
        # note, since an untied head looks the same (issue 15). torch counts the shared table once.
        assert len(maybe_tied) == 1 and info["exporter"] == "torchscript" and info["weights"] == "stripped"
        expected += info["config"]["vocab"] * info["config"]["hidden"]
    assert graph.parameter_count == expected
    assert graph.opaque_ops == ()
    assert graph.raw_node_count == info.get("node_count", graph.raw_node_count)
    assert all(op.node is not None for op in graph.ops)
    # every op that reads a graph input's batch axis has a batch dim; the output keeps it
    assert any(d.is_batch for d in graph.ops[-1].dims)
    summary = summarize(graph)
    assert summary.parameter_count == expected and summary.coarse_op_count == len(graph.ops)


def _load(name: str, dims: dict[str, int]):
    for key, path, info in ENTRIES:
        if key == name and path.exists():
            return import_model(path, dims), info
    pytest.skip(f"{name} not generated")


class TestGPT2:
    def test_forward_flops_match_the_analytic_count(self):
        batch, seq = 8, 1024
        graph, info = _load("gpt2", {"batch": batch, "seq": seq})
        config = info["config"]
        layers, hidden, vocab = config["layers"], config["hidden"], config["vocab"]
        ffn, positions = config["intermediate"], config["max_positions"]
        # Parameters outside the embeddings: per layer c_attn (h x 3h + 3h), c_proj (h x h + h),
        # c_fc (h x 4h + 4h), mlp c_proj (4h x h + h), two LayerNorms (4h); plus ln_f (2h).
        per_layer = (hidden * 3 * hidden + 3 * hidden) + (hidden * hidden + hidden)
        per_layer += (hidden * ffn + ffn) + (ffn * hidden + hidden) + 4 * hidden
        non_embedding = layers * per_layer + 2 * hidden
        assert non_embedding + vocab * hidden + positions * hidden == graph.parameter_count
        tokens = batch * seq
        # 2 FLOPs per weight per token; attention scores and weighted sum, 2 * b * s^2 * h each per
        # layer; the tied LM head, 2 * tokens * h * vocab. Biases, norms, softmax and GELU add < 1%.
        analytic = 2 * non_embedding * tokens + 2 * 2 * layers * batch * seq**2 * hidden + 2 * tokens * hidden * vocab
        assert graph.forward_flops() == pytest.approx(analytic, rel=0.01)
        assert graph.forward_flops() > analytic  # the extras are all positive

    def test_twelve_identical_layers_of_ten_to_sixteen_ops(self):
        graph, _ = _load("gpt2", {"batch": 2, "seq": 128})
        (layers,) = graph.blocks
        assert layers.name == "transformer.h" and len(layers.instances) == 12
        per_layer = len(layers.instances[0])
        assert 10 <= per_layer <= 16
        kinds = Counter(graph.ops[i].kind for i in layers.instances[0])
        # 2 LayerNorms, 4 projections + 2 attention products, 1 softmax, GELU, 2 residual adds, the qkv split
        assert kinds["norm"] == 2 and kinds["matmul"] == 6 and kinds["softmax"] == 1
        first = graph.ops[layers.instances[0][1]]  # c_attn over [batch*seq, hidden]
        assert [(d.name, d.is_batch) for d in first.dims][:2] == [("m_0", True), ("m_1", False)]

    def test_coarse_ops_far_fewer_than_nodes(self):
        graph, info = _load("gpt2", {"batch": 2, "seq": 128})
        assert graph.raw_node_count == info["node_count"]
        assert len(graph.ops) < graph.raw_node_count / 3


@pytest.mark.parametrize(
    "name,group,count",
    [("bert", "bert.encoder.layer", 12), ("llama", "model.layers", 8), ("vit_tiny", "vit.layers", 2),
     ("nn_transformer_ts", "transformer.encoder.layers", 6)],
)
def test_transformer_layers_found(name, group, count):
    info = next((i for k, _, i in ENTRIES if k == name), None)
    if info is None:
        pytest.skip(f"{name} not generated")
    graph, _ = _load(name, _dims(info))
    assert any(b.name == group and len(b.instances) == count for b in graph.blocks)


def test_llama_rms_norms_are_single_ops():
    graph, info = _load("llama", {"batch": 2, "seq": 32})
    norms = [op for op in graph.ops if op.kind == "norm"]
    assert len(norms) == 2 * info["config"]["layers"] + 1
    assert all(op.dims[-1].kind == "normalized" and op.fused_pointwise == 0 for op in norms)


def test_resnet_stages_and_folded_batchnorm():
    graph, info = _load("resnet", {"batch": 2})
    assert [(b.name, len(b.instances)) for b in graph.blocks] == [
        ("layer1[1-2]", 2), ("layer2[1-3]", 3), ("layer3[1-5]", 5), ("layer4[1-2]", 2)
    ]
    assert any("BatchNormalization" in w for w in graph.warnings)
    convs = [op for op in graph.ops if op.kind == "conv"]
    assert len(convs) == 53 and all(d.is_batch for op in convs for d in op.dims if d.name == "b")


def test_baked_sequence_lengths_are_reported():
    info = next((i for k, _, i in ENTRIES if k == "nn_transformer_ts"), None)
    if info is None:
        pytest.skip("nn_transformer_ts not generated")
    config = info["config"]
    if config.get("example_seq") == 16:
        pytest.skip("exported at the length this test binds")
    graph, _ = _load("nn_transformer_ts", {"batch": 2, "seq": 16, "tgt_seq": 16})
    assert any("baked" in w for w in graph.warnings)
    assert check_graph(graph) == []
