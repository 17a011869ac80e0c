"""DeepSpeed AutoTP name patterns that shard exactly the planned linears (issues 22, 25).

Found by ``bench/export_sweep.py`` on the zoo at 8 devices: every Swin file had rows ``dp=4 x tp=2``
listed for DeepSpeed that its exporter refused ("the AutoTP pattern ...layers\\.\\d+\\.blocks\\.\\d+\\.mlp
\\.fc1... would also shard swin.encoder.layers.1.blocks.0.mlp.fc1.weight"): the model analysis splits
stage 0's MLPs and keeps stage 1's replicated, and one pattern with every layer index generalised
reached both. DeepSpeed matches a spec by ``re.match`` on the parameter name
(deepspeed 0.19.8 ``module_inject/autotp_config.py``, ``TPLayerSpec.matches``) and leaves a Linear
no spec matches as it is (``module_inject/auto_tp.py``, "rely only on explicit specs and skip
unmatched layers"), so a pattern keeping stage 0's index literal runs the priced plan.

Fixture: ``tests/zoo/swin_dynamo_consts.onnx`` (``SwinForImageClassification``, ``zoo.json``:
``depths [2, 2]``, ``num_heads [2, 4]``, ``embed_dim 32``).
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from exporters.deepspeed.export import _narrowed
from importers.transformer import analyze_transformer, weight_access
from planner.core.errors import UnsupportedExport
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

SWIN = Path(__file__).resolve().parents[1] / "zoo" / "swin_dynamo_consts.onnx"
LAYER = "swin.encoder.layers.{}.blocks.{}."


@pytest.fixture(scope="module")
def swin():
    graph = load_graph(SWIN, {"batch": 16})
    return graph, spaces_for(graph, 8)


def _linear_weights(graph) -> set[str]:
    """Every linear's weight as torch names it: the module path the dynamo export records, + ``.weight``
    (the file's own weight names are the exporter's ``val_N``)."""
    return {op.module_path + ".weight" for op in graph.ops if op.kind == "matmul" and weight_access(graph, op) is not None}


def _matched(specs, names, kind) -> set[str]:
    """The names DeepSpeed would partition as ``kind``: ``re.match`` of any pattern (TPLayerSpec.matches)."""
    return {n for n in names for s in specs if s["partition_type"] == kind and any(re.match(p, n) for p in s["patterns"])}


class TestSwin:
    def test_the_tp2_row_exports_with_patterns_that_keep_stage_1s_mlps_whole(self, swin):
        graph, spaces = swin
        masks = deepspeed_masks(graph, spaces, dp=4, tp=2)
        assert masks is not None  # the listing: DeepSpeed runs dp=4 x tp=2 on this Swin
        plan = make_input(graph, spaces, first_rows(masks), cluster=make_cluster(1, 8))
        document = export_deepspeed(plan)  # refused before: the generalised fc1 pattern reached stage 1
        specs = document["ds_config"]["tensor_parallel"]["partition_config"]["layer_specs"]
        names = _linear_weights(graph)
        # by hand from the config: 2 stages x 2 blocks x (q, k, v) column, x o_proj row; stage 0's
        # 2 blocks' fc1 column and fc2 row; stage 1's MLPs, the patch merger and the classifier whole
        column = {LAYER.format(s, b) + f"attention.{p}_proj.weight" for s in (0, 1) for b in (0, 1) for p in "qkv"}
        column |= {LAYER.format(0, b) + "mlp.fc1.weight" for b in (0, 1)}
        row = {LAYER.format(s, b) + "attention.o_proj.weight" for s in (0, 1) for b in (0, 1)}
        row |= {LAYER.format(0, b) + "mlp.fc2.weight" for b in (0, 1)}
        assert len(column) == 14 and len(row) == 6
        assert _matched(specs, names, "column") == column
        assert _matched(specs, names, "row") == row
        assert {LAYER.format(1, b) + f"mlp.fc{i}.weight" for b in (0, 1) for i in (1, 2)} <= names - column - row

    def test_stage_1s_mlps_are_planned_replicated(self, swin):
        """The premise: the analysis gives stage 1's MLP linears no tensor-parallel role."""
        graph, _ = swin
        model = analyze_transformer(graph)
        roles = {op.module_path + ".weight": role for op, role in zip(graph.ops, model.roles) if role in ("fc1", "linear")}
        assert roles[LAYER.format(0, 0) + "mlp.fc1.weight"] == "fc1"
        assert roles[LAYER.format(1, 0) + "mlp.fc1.weight"] == "linear"


class TestNarrowed:
    def test_the_most_general_pattern_that_misses_the_replicated_names(self):
        replicated = {"m.layers.1.blocks.0.fc1.weight": "linear", "m.layers.1.blocks.1.fc1.weight": "linear"}
        pattern = _narrowed("m.layers.0.blocks.1.fc1.weight", replicated)
        assert pattern == r"^m\.layers\.0\.blocks\.\d+\.fc1\.weight$"
        assert re.match(pattern, "m.layers.0.blocks.7.fc1.weight") and not re.match(pattern, "m.layers.1.blocks.1.fc1.weight")

    def test_nothing_to_miss_keeps_every_index_general(self):
        assert _narrowed("m.layers.3.fc1.weight", {"head.weight": "lm-head"}) == r"^m\.layers\.\d+\.fc1\.weight$"

    def test_one_weight_split_and_replicated_is_refused(self):
        with pytest.raises(UnsupportedExport, match="also keeps replicated"):
            _narrowed("m.layers.0.fc1.weight", {"m.layers.0.fc1.weight": "linear"})
