"""DeepSpeed AutoTP prices and exports DeBERTa-v2's own position projections split, as it runs them (issue 25).

Fixture: ``tests/data/deberta_unshared/`` (``make_deberta_unshared.py``): transformers'
``DebertaV2ForMaskedLM`` with ``share_att_key=False`` (``counts.json``: 2 layers, hidden 64, 4 heads of
16, 32 position buckets, so the relative-position table has ``2 x 32 = 64`` rows, ``pos_att_type`` p2c and
c2p). Each layer has ``pos_key_proj`` and ``pos_query_proj`` ``[64 -> 64]`` linears that project that table
into the attention's heads. deepspeed 0.19.8's AutoTP divides the attention module's
``num_attention_heads`` by ``tp`` (``module_inject/auto_tp.py``, ``update_mp_params``), so these run
column-parallel like ``key_proj`` and ``query_proj``; kept whole, the c2p ``bmm`` fails
(``tests/integration/test_deepspeed_autotp_deberta.py`` runs both on two gloo ranks). Before this test the
planner priced them whole on every rank and left them out of ``partition_config``.
"""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import numpy as np
import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from exporters.deepspeed.export import layer_specs
from importers.transformer import analyze_transformer
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

CASES = Path(__file__).resolve().parents[1] / "data" / "deberta_unshared"
FILES = ("deberta_unshared_dynamo_consts.onnx", "deberta_unshared_ts_consts.onnx")
SHARED = Path(__file__).resolve().parents[1] / "zoo" / "deberta_v2_dynamo_consts.onnx"
LAYER = "deberta.encoder.layer.{}.attention.self.{}.weight"


def _load(path: Path):
    graph = load_graph(path, {"batch": 16, "seq": 16})
    return graph, spaces_for(graph, 8)


def _projections(graph):
    model = analyze_transformer(graph)
    return [i for block in model.attention for i in block.position_proj]


@pytest.mark.parametrize("name", FILES)
def test_the_position_projections_are_priced_column_parallel(name):
    graph, spaces = _load(CASES / name)
    masks = deepspeed_masks(graph, spaces, dp=4, tp=2)
    assert masks is not None
    projections = _projections(graph)
    # 2 layers x (pos_key_proj, pos_query_proj), found by their module paths
    assert sorted(graph.ops[i].module_path.rsplit(".", 1)[1] for i in projections) == ["pos_key_proj"] * 2 + ["pos_query_proj"] * 2
    for i in projections:
        op, space = graph.ops[i], spaces[i]
        # the table [64 rows, 64 hidden] x [64, 4 heads x 16]: 2 x 64 x 64 x 64 = 524,288 multiply-adds
        # plus the bias add, 64 x 64 = 4,096 -> 528,384 FLOPs whole
        assert op.flops == 2 * 64 * 64 * 64 + 64 * 64 == 528_384
        rows = np.flatnonzero(masks[i])
        factors = {tuple((d, int(f)) for d, f in zip(space.dim_names, space.factors[r]) if f > 1) for r in rows}
        # every allowed row splits the heads x head_dim output 2 ways (2 heads of 16 = 32 columns per tp
        # rank) and nothing else: the table has no batch dim, so each of the 4 dp ranks holds a copy
        assert factors == {(("n", 2),)}, factors
        assert op.dim("n").size // 2 == 32


@pytest.mark.parametrize("name", FILES)
def test_partition_config_splits_them_by_columns(name):
    graph, spaces = _load(CASES / name)
    plan = make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=4, tp=2)), cluster=make_cluster(1, 8))
    specs = export_deepspeed(plan)["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
    names = [LAYER.format(layer, linear) for layer in (0, 1)
             for linear in ("query_proj", "key_proj", "value_proj", "pos_key_proj", "pos_query_proj")]
    column = [p for s in specs if s["partition_type"] == "column" for p in s["patterns"]]
    row = [p for s in specs if s["partition_type"] == "row" for p in s["patterns"]]
    assert all(any(re.match(p, n) for p in column) for n in names)
    # q, k, v, pos_key, pos_query, intermediate: 6 column patterns over both layers; 2 row (attention
    # output, output dense); the MLM head's transform and decoder match none (replicated)
    assert (len(column), len(row)) == (6, 2)
    for whole in ("cls.predictions.transform.dense.weight", "cls.predictions.decoder.weight"):
        assert not any(re.match(p, whole) for s in specs for p in s["patterns"])


def test_shared_position_projections_add_no_pattern():
    # share_att_key=True (the zoo's DeBERTa): the positions go through query_proj and key_proj, whose
    # patterns are already there: 4 column (q, k, v, intermediate), 2 row, as before
    graph, spaces = _load(SHARED)
    plan = make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=4, tp=2)), cluster=make_cluster(1, 8))
    specs = export_deepspeed(plan)["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
    patterns = [p for s in specs for p in s["patterns"]]
    assert len(patterns) == 6 and not any("pos_" in p for p in patterns)


def test_a_position_projection_autotp_cannot_name_is_refused():
    graph, _ = _load(CASES / FILES[0])
    projections = set(_projections(graph))
    nameless = dataclasses.replace(
        graph, ops=tuple(dataclasses.replace(op, module_path=None) if i in projections else op
                         for i, op in enumerate(graph.ops)))
    with pytest.raises(UnsupportedExport) as refused:
        layer_specs(nameless, analyze_transformer(nameless))
    message = str(refused.value)
    assert "\n" not in message and "position projection" in message and "module path" in message
