"""Mesh-TensorFlow and DeBERTa-v2's disentangled attention (issue 25 leftovers, exporters/mesh_tf/export.py).

The zoo's four DeBERTa-v2 files (``DebertaV2ForMaskedLM``, ``tests/zoo/make_zoo.py::deberta_v2``; the
DebertaV2Config in ``tests/zoo/zoo.json``: 2 layers, hidden 64, 4 heads of 16, FFN 128, vocabulary 1000,
``position_buckets`` 32, ``pos_att_type`` c2p and p2c, ``share_att_key``). transformers 5.24's
``DisentangledSelfAttention`` computes each position term as ``bmm(query_layer, pos_key_layer^T)`` (c2p)
or ``bmm(key_layer, pos_query_layer^T)`` (p2c) with the projected table repeated over the batch, ``[b h,
2k, d]``, ``2k = 2 * position_buckets = 64`` relative positions. A Mesh-TF model splits a term's heads
with the attention's (its ``heads`` dim is the projection's), so the layout ``heads:m`` must lay them out.

Before: every term held ``heads`` twice (its head dim and, through the repeat, its head-size reduction)
and the repeat's folded ``b h`` axis was named ``batch`` though unsplittable, so at 8 devices only the
``m:8`` layout (heads left whole) was expressible and the DeepSpeed dp=2 x tp=4 plan's export was refused
("two dims named 'heads'").
"""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed import deepspeed_masks
from exporters.mesh_tf import default_layouts, dimension_names, export_mesh_tf, mesh_tf_masks
from exporters.mesh_tf.rules import rule
from importers.transformer import analyze_transformer
from planner.core.settings import TrainingSettings
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

ZOO = Path(__file__).resolve().parents[1] / "zoo"
FILES = ("deberta_v2_ts_bare", "deberta_v2_ts_consts", "deberta_v2_dynamo_bare", "deberta_v2_dynamo_consts")
CONFIG = json.loads((ZOO / "zoo.json").read_text())["files"]["deberta_v2_ts_bare.onnx"]["config"]
BATCH, SEQ = 8, 32
LAYOUT = {"batch": "b", "heads": "m", "d_ff": "m", "vocab": "m"}


@pytest.fixture(scope="module", params=FILES)
def deberta(request):
    graph = load_graph(ZOO / f"{request.param}.onnx", {"batch": BATCH, "seq": SEQ})
    return request.param, graph, analyze_transformer(graph), spaces_for(graph, 8)


def _names(graph, op_index):
    classes, names = dimension_names(graph)
    return {d.name: names[classes.of[op_index][d.name]] for d in graph.ops[op_index].dims}


def test_the_config_these_numbers_assume():
    assert (CONFIG["hidden_size"], CONFIG["num_attention_heads"], CONFIG["position_buckets"]) == (64, 4, 32)
    assert (CONFIG["intermediate_size"], CONFIG["vocab_size"], CONFIG["share_att_key"]) == (128, 1000, True)


def test_position_terms_carry_the_attentions_heads(deberta):
    name, graph, model, _ = deberta
    heads, head_size, span = 4, 64 // 4, 2 * 32
    for block in model.attention:
        score = _names(graph, block.score)
        for term in block.position_scores:
            named = _names(graph, term)
            sizes = {names: graph.ops[term].dim(d).size for d, names in named.items()}
            # one name per dim: [b, heads, s, 2k] reduced over the head size, as the score's [b, heads, s, s] over d_kv
            assert Counter(named.values()) == Counter(["batch", "heads", "length", "relative_position", "d_kv"]), name
            assert sizes == {"batch": BATCH, "heads": heads, "length": SEQ, "relative_position": span, "d_kv": head_size}
            assert {score[d] for d in score if score[d] in ("heads", "d_kv")} == {"heads", "d_kv"}
        for proj in block.position_proj:
            named = _names(graph, proj)
            # the table [2k, hidden] times the shared Q or K weight: its 64 columns are the 4 heads x 16
            assert sorted(named.values()) == ["d_model", "heads", "relative_position"], name
            assert {d: graph.ops[proj].dim(d).size for d, n in named.items() if n == "heads"} == {"n": heads * head_size}


def test_the_repeat_over_the_batch_is_its_own_name(deberta):
    # [b h, 2k, d]: the folded axis is b x h = 8 x 4 = 32 copies of the table, which no plan splits
    name, graph, model, _ = deberta
    copies = [(i, d) for i in range(len(graph.ops)) for d, n in _names(graph, i).items() if n == "position_copies"]
    assert len(copies) == 2 * 2, name  # 2 layers x (c2p, p2c)
    assert {graph.ops[i].dim(d).size for i, d in copies} == {BATCH * 4}
    assert not any(graph.ops[i].dim(d).splittable for i, d in copies)


def test_every_default_layout_at_8_devices_is_expressible(deberta):
    # dp x mp = 8; heads (4) divide m = 2 and 4, not 8; d_ff 128 and vocabulary 1000 divide 2, 4 and 8
    name, graph, _, spaces = deberta
    found = {(";".join(f"{k}:{v}" for k, v in mesh.items()), ";".join(sorted(layout)))
             for mesh, layout in default_layouts(graph, devices=8)
             if mesh_tf_masks(graph, spaces, mesh_shape=mesh, layout=layout) is not None}
    assert found == {("m:8", "d_ff;vocab"), ("b:2;m:4", "batch;d_ff;heads;vocab"),
                     ("b:4;m:2", "batch;d_ff;heads;vocab"), ("b:8", "batch")}, name


def test_the_layout_splits_what_deepspeed_autotp_prices(deberta):
    """b:2;m:4 admits exactly the configurations of DeepSpeed's dp=2 x tp=4 family (whose linears
    tests/integration/test_deberta_attention.py checks against deepspeed 0.19.8's own matcher) on every
    op but the two vocabulary ones, which AutoTP keeps whole and vocab:m splits."""
    name, graph, model, spaces = deberta
    ours = mesh_tf_masks(graph, spaces, mesh_shape={"b": 2, "m": 4}, layout=LAYOUT)
    theirs = deepspeed_masks(graph, spaces, dp=2, tp=4)
    differ = [model.roles[i] for i, (a, b) in enumerate(zip(ours, theirs)) if not np.array_equal(a, b)]
    assert sorted(differ) == ["embedding", "lm-head"], name
    rows = first_rows(ours)
    for block in model.attention:
        for term in block.position_scores:
            split = spaces[term].describe(rows[term])
            # 8 samples / 2 x 4 heads / 4: each device scores 4 samples x 1 head against the 64 positions
            assert dict(zip(spaces[term].dim_names, spaces[term].factors[rows[term]].tolist())) == {
                "b0_0": 2, "b0_1": 4, "m": 1, "n": 1, "k": 1}, (name, split)
        for proj in block.position_proj:
            # 64 columns / 4 = 16: one head of 16 channels per device, as the Q and K projections
            factors = dict(zip(spaces[proj].dim_names, spaces[proj].factors[rows[proj]].tolist()))
            assert factors == {"m": 1, "n": 4, "k": 1}, name


def test_export_of_a_heads_split_plan(deberta):
    name, graph, _, spaces = deberta
    settings = TrainingSettings()
    choice = first_rows(mesh_tf_masks(graph, spaces, mesh_shape={"b": 2, "m": 4}, layout=LAYOUT))
    assert rule(graph, spaces, make_cluster(1, 8), settings)(choice)
    out = export_mesh_tf(make_input(graph, spaces, choice, cluster=make_cluster(1, 8)))
    assert (out["mesh_shape"], out["layout"], out["devices"]) == ("b:2;m:4", "batch:b;d_ff:m;heads:m;vocab:m", 8)
    dims = out["dimensions"]
    # heads: the score's 4, the repeat's 16 channels per head (the op graph folds its heads into b h), the
    # projections' 4 x 16 = 64 columns; all three divide by m = 4
    assert dims["heads"]["sizes"] == [4, 16, 64] and dims["heads"]["mesh_dim"] == "m"
    assert (dims["d_kv"]["sizes"], dims["d_kv"]["mesh_dim"]) == ([16], None)
    assert (dims["relative_position"]["sizes"], dims["relative_position"]["mesh_dim"]) == ([64], None)
    assert (dims["position_copies"]["sizes"], dims["position_copies"]["mesh_dim"]) == ([BATCH * 4], None)


def test_deepspeeds_tp_plan_exports_to_mesh_tf(deberta):
    # the dp=2 x tp=4 plan leaves the vocabulary whole: the same mesh, without vocab:m (it was refused before)
    name, graph, _, spaces = deberta
    choice = first_rows(deepspeed_masks(graph, spaces, dp=2, tp=4))
    out = export_mesh_tf(make_input(graph, spaces, choice, cluster=make_cluster(1, 8)))
    assert (out["mesh_shape"], out["layout"]) == ("b:2;m:4", "batch:b;d_ff:m;heads:m"), name
