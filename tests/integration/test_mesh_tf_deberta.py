"""Mesh-TF layouts of a DeBERTa-v2 that transformers builds with its own position projections (issue 25
leftovers; exporters/mesh_tf/export.py, ``_term_classes``).

The zoo's DeBERTa-v2 files share the content projections with the position table (``share_att_key``:
``query_proj`` and ``key_proj`` project it too, so its columns are the attention's ``heads``;
tests/exporters/test_mesh_tf_deberta.py). Here ``share_att_key=False``: transformers 5.24's
``DisentangledSelfAttention`` then builds ``pos_key_proj`` (c2p) and ``pos_query_proj`` (p2c), linears of
their own, and 6 heads of 8 channels over ``position_buckets`` 16 (``pos_ebd_size``, so 32 relative
positions). The model is exported with TorchScript (graph and weights; the weights are perturbed first,
since the exporter folds equal initializers, such as freshly zeroed biases, into one tensor).
"""

from __future__ import annotations

import numpy as np
import pytest

from exporters.deepspeed import deepspeed_masks
from exporters.mesh_tf import default_layouts, dimension_names, export_mesh_tf, mesh_tf_masks
from importers.transformer import analyze_transformer
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

pytestmark = pytest.mark.integration

CONFIG = dict(num_hidden_layers=2, hidden_size=48, num_attention_heads=6, intermediate_size=96, vocab_size=1000,
              relative_attention=True, pos_att_type=["p2c", "c2p"], norm_rel_ebd="layer_norm", share_att_key=False,
              position_biased_input=False, max_relative_positions=-1, type_vocab_size=0,
              max_position_embeddings=128, position_buckets=16)
BATCH, SEQ = 4, 16


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    torch.manual_seed(0)
    model = transformers.DebertaV2ForMaskedLM(transformers.DebertaV2Config(**CONFIG)).eval()
    with torch.no_grad():
        for parameter in model.parameters():
            parameter.add_(torch.randn_like(parameter) * 0.02)
    path = tmp_path_factory.mktemp("deberta") / "deberta_v2_own_pos_proj.onnx"
    ids = torch.randint(3, CONFIG["vocab_size"], (2, SEQ))
    axes = {"input_ids": {0: "batch", 1: "seq"}, "logits": {0: "batch", 1: "seq"}}
    torch.onnx.export(model, (ids,), str(path), input_names=["input_ids"], output_names=["logits"],
                      dynamic_axes=axes, dynamo=False, opset_version=17)
    graph = load_graph(path, {"batch": BATCH, "seq": SEQ})
    return model, graph, analyze_transformer(graph), spaces_for(graph, 4)


def test_the_terms_name_what_the_module_computes(built):
    model, graph, found, _ = built
    attention = model.deberta.encoder.layer[0].attention.self
    assert not attention.share_att_key and hasattr(attention, "pos_key_proj") and hasattr(attention, "pos_query_proj")
    assert (found.num_attention_heads, found.head_dim) == (attention.num_attention_heads, attention.attention_head_size)
    classes, names = dimension_names(graph)
    for block in found.attention:
        assert len(block.position_scores) == len(attention.pos_att_type) == 2
        for term in block.position_scores:
            sizes = {names[classes.of[term][d.name]]: d.size for d in graph.ops[term].dims}
            assert sizes == {"batch": BATCH, "heads": attention.num_attention_heads, "length": SEQ,
                             "relative_position": 2 * attention.pos_ebd_size, "d_kv": attention.attention_head_size}
        for proj in block.position_proj:
            named = {d.name: names[classes.of[proj][d.name]] for d in graph.ops[proj].dims}
            # [2k, hidden] x its own [hidden, heads x d_kv] weight: the columns are not the content
            # projections' (no tensor joins them), so they get a name of their own, which heads:m leaves whole
            assert named["m"] == "relative_position" and named["k"] == "d_model"
            assert named["n"] not in ("heads", "d_model") and graph.ops[proj].dim("n").size == attention.all_head_size


def test_layouts_and_the_tp_plan_agree(built):
    _, graph, found, spaces = built
    # 4 devices: heads 6, d_ff 96, vocabulary 1000 divide 2 (and 4 but for the heads); batch 4
    layouts = {";".join(f"{k}:{v}" for k, v in mesh.items()): sorted(layout) for mesh, layout in default_layouts(graph, devices=4)
               if mesh_tf_masks(graph, spaces, mesh_shape=mesh, layout=layout) is not None}
    assert layouts == {"m:4": ["d_ff", "vocab"], "b:2;m:2": ["batch", "d_ff", "heads", "vocab"], "b:4": ["batch"]}
    ours = mesh_tf_masks(graph, spaces, mesh_shape={"b": 2, "m": 2}, layout={"batch": "b", "heads": "m", "d_ff": "m", "vocab": "m"})
    theirs = deepspeed_masks(graph, spaces, dp=2, tp=2)
    # DeepSpeed's AutoTP splits the position projections by columns, as it must once it divides the module's
    # heads (tests/integration/test_deepspeed_autotp_deberta.py); the layout leaves their own-named columns
    # whole: 2 layers x (pos_key_proj, pos_query_proj and the Tile after each) differ, with the vocabulary ops
    # (the projections read weights of their own, counted as parameters: their role is qkv, the Tiles' glue)
    differ = [found.roles[i] for i, (a, b) in enumerate(zip(ours, theirs)) if not np.array_equal(a, b)]
    assert sorted(differ) == ["attention-glue"] * 4 + ["embedding", "lm-head"] + ["qkv"] * 4
    # the rows both admit, the layout's own elsewhere: the layout, with the vocabulary split
    both = [a & b if (a & b).any() else a for a, b in zip(ours, theirs)]
    out = export_mesh_tf(make_input(graph, spaces, first_rows(both), cluster=make_cluster(1, 4)))
    assert (out["mesh_shape"], out["layout"]) == ("b:2;m:2", "batch:b;d_ff:m;heads:m;vocab:m")
