"""DTensor table families (issue 25): a DLRM's embedding tables sharded row- or column-wise over the dp
ranks, the rest data-parallel; the masks, the exported ``table_plan`` and parameter shards, and the
refusals (``nn.EmbeddingBag``, ZeRO-3). The plan is run on gloo in tests/integration/test_dtensor_tables.py.

Fixtures: ``tests/data/dlrm_embedding/dlrm_emb_bare.onnx`` (``tests/integration/make_dlrm_embedding.py``:
``nn.Embedding`` tables of 400,000 / 100,000 / 50,000 rows of 64, 20 indices per sample) and
``tests/data/dlrm_cases/dlrm_dynamo_bare.onnx`` (the same model with ``nn.EmbeddingBag``).
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import numpy as np
import pytest

from exporters.dtensor import DtensorFamily, dtensor_families, dtensor_masks, export_dtensor
from exporters.dtensor.rules import allows
from exporters.dtensor.tables import table_masks
from exporters._target import Family
from importers import import_model
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for
from tests.planner.cli_helpers import run_cli

DATA = Path(__file__).resolve().parents[1] / "data"
EMBEDDING = DATA / "dlrm_embedding" / "dlrm_emb_bare.onnx"
BAGS = DATA / "dlrm_cases" / "dlrm_dynamo_bare.onnx"
BATCH = 64
ROWS = (400_000, 100_000, 50_000)
WIDTH = 64
FP32 = TrainingSettings(precision="fp32", optimizer="adam")


@pytest.fixture(scope="module")
def dlrm():
    graph = import_model(EMBEDDING, {"batch": BATCH})
    return graph, spaces_for(graph, 8)


def _tables(graph):
    return [i for i, op in enumerate(graph.ops) if op.kind == "embedding"]


def test_families_at_8_devices_include_both_table_styles_at_every_dp_above_1(dlrm):
    graph, _ = dlrm
    labels = {f.label for f in dtensor_families(graph, devices=8)}
    assert labels == {"dp=1 x tp=1", "dp=2 x tp=1", "dp=4 x tp=1", "dp=8 x tp=1"} | {
        f"dp={dp} {style} tables" for dp in (2, 4, 8) for style in ("rowwise", "colwise")
    }


@pytest.mark.parametrize(("style", "dim"), [("rowwise", "v"), ("colwise", "d")])
def test_masks_split_each_table_by_its_style_and_everything_else_by_the_batch(dlrm, style, dim):
    graph, spaces = dlrm
    masks = dtensor_masks(graph, spaces, dp=8, tp=1, tables=style)
    assert masks is not None
    tables = _tables(graph)
    assert len(tables) == 3
    for index, (op, space, mask) in enumerate(zip(graph.ops, spaces, masks)):
        allowed = {tuple(sorted(space.describe(int(r)).items())) for r in np.flatnonzero(mask)}
        if index in tables:
            assert allowed == {((dim, 8),)}, op.name  # the table's rows or width, 8 ways, nothing else
        else:
            batch = [d.name for d in op.dims if d.is_batch]
            assert allowed == ({((batch[0], 8),)} if batch else {()}), op.name


def test_embedding_bags_get_no_table_family_and_the_export_says_why():
    graph = import_model(BAGS, {"batch": BATCH})
    spaces = spaces_for(graph, 8)
    assert {f.label for f in dtensor_families(graph, devices=8)} == {f"dp={dp} x tp=1" for dp in (1, 2, 4, 8)}
    assert dtensor_masks(graph, spaces, dp=8, tp=1, tables="colwise") is None
    choice = list(first_rows(dtensor_masks(graph, spaces, dp=8, tp=1)))
    index = next(i for i, op in enumerate(graph.ops) if op.op_type.startswith("EmbeddingBag"))
    choice[index] = spaces[index].index_of({"d": 8})  # a table split column-wise, as --target generic picks
    with pytest.raises(UnsupportedExport, match=r"nn\.EmbeddingBag, which DTensor \(torch 2\.13\) cannot shard"):
        export_dtensor(make_input(graph, spaces, choice, settings=FP32, cluster=make_cluster(1, 8)))


def _export(graph, spaces, style, settings=FP32):
    masks = dtensor_masks(graph, spaces, dp=8, tp=1, tables=style)
    return export_dtensor(make_input(graph, spaces, first_rows(masks), settings=settings, cluster=make_cluster(1, 8)))


@pytest.mark.parametrize(("style", "placement", "local"), [
    ("rowwise", "shard(0)", [[r // 8, WIDTH] for r in ROWS]),  # 50,000 / 12,500 / 6,250 rows each
    ("colwise", "shard(1)", [[r, WIDTH // 8] for r in ROWS]),  # every row, 8 of its 64 columns
])
def test_export_writes_the_table_plan_and_the_shards(dlrm, style, placement, local):
    graph, spaces = dlrm
    plan = _export(graph, spaces, style)
    assert plan["mesh"] == {"shape": [8, 1], "dim_names": ["dp", "tp"]}
    assert plan["degrees"]["tables"] == style and plan["tp_plan"] == {} and plan["fsdp"] is None
    section = plan["table_plan"]
    assert section["mesh_dim"] == "dp" and section["size"] == 8 and section["gradient_scale"] == 0.125
    assert section["modules"] == {
        f"tables.{t}": {"style": style, "input_layouts": [["replicate"]], "output_layouts": [["shard", 0]], "use_local_output": True}
        for t in range(3)
    }
    for t in range(3):
        entry = plan["params"][f"tables.{t}.weight"]
        assert entry["shape"] == [ROWS[t], WIDTH] and entry["local_shape"] == local[t]
        assert entry["placements"] == {"dp": placement, "tp": "replicate"}
    dense = plan["params"]["top.0.weight"]  # Linear(64 + 6 pairs, 512): data-parallel, whole
    assert dense["local_shape"] == dense["shape"] == [512, 70] and dense["placements"] == {"dp": "replicate", "tp": "replicate"}
    assert plan["data_parallel"]["gradient_sync"] == "all_reduce_mean"
    assert any("gradient_scale" in note for note in plan["notes"])


def test_zero_3_is_refused_for_a_table_family(dlrm):
    graph, spaces = dlrm
    zero3 = TrainingSettings(precision="fp32", optimizer="adam", zero_stage=3)
    with pytest.raises(UnsupportedExport, match="runs ZeRO-0 only"):
        _export(graph, spaces, "rowwise", zero3)
    family = Family(label=DtensorFamily(dp=8, tp=1, tables="rowwise").label, tp=1, dp=8, masks=())
    assert not allows(family, zero3, make_cluster(1, 8), graph)
    assert allows(family, FP32, make_cluster(1, 8), graph)


def test_plan_lists_the_colwise_table_row_and_exports_it(tmp_path):
    """``planner plan dlrm_emb_bare.onnx -n 8 --dim batch=2048 --target dtensor --fix zero=0``: the tables sharded
    column-wise beat data parallelism on the planner's prices, with the memory of a table shard. ZeRO-0 pinned: since
    c12540c DTensor's ZeRO-3 runs bf16 modules without autocast and its dp=8 row is priced 1% faster (3.03 against
    3.06 ms), a table family runs ZeRO-0 only."""
    out = tmp_path / "plan.json"
    result = run_cli(["plan", EMBEDDING, "-n", "8", "--dim", "batch=2048", "--target", "dtensor", "--fix", "zero=0",
                      "--json", "--export", "dtensor", "-o", out])
    row = json.loads(result.stdout)["rows"][0]
    assert row["layout"] == "dp=8 colwise tables" and row["targets"] == ["dtensor"] and row["zero_stage"] == 0
    assert row["speedup_vs_dp"] > 1
    # by hand: an eighth of the 35,200,000 table parameters and the 322,881 of the MLPs on each device,
    # bf16 weights (2 B) and fp32 master + Adam moments (12 B)
    local = sum(ROWS) * WIDTH // 8 + 35_522_881 - sum(ROWS) * WIDTH
    assert local == 4_722_881
    assert row["memory_breakdown_bytes"]["params"] == 2 * local and row["memory_breakdown_bytes"]["optimizer"] == 12 * local
    plan = json.loads(out.read_text())
    assert plan["degrees"]["tables"] == "colwise" and set(plan["table_plan"]["modules"]) == {"tables.0", "tables.1", "tables.2"}


def test_a_table_that_is_not_an_embedding_modules_weight_gets_no_table_family(dlrm):
    """A lookup whose table is not ``<its module>.weight`` (a raw parameter indexed in a parent
    module's forward) is no nn.Embedding the styles could shard: no table family, and the reason."""
    graph, spaces = dlrm
    index = next(i for i, op in enumerate(graph.ops) if op.kind == "embedding")
    ops = list(graph.ops)
    ops[index] = dataclasses.replace(ops[index], module_path="")  # as the root module's own lookup
    moved = dataclasses.replace(graph, ops=tuple(ops))
    assert {f.label for f in dtensor_families(moved, devices=8)} == {f"dp={dp} x tp=1" for dp in (1, 2, 4, 8)}
    assert "outside an nn.Embedding holding it as `weight`" in table_masks(moved, spaces, dp=8, style="rowwise").reason
