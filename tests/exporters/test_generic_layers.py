"""The generic plan counts layers only where the model has them (issue 25, task H2, item 5).

Every row of the launchable table is a pipeline point (``pp = 1`` included), and the generic plan wrote its
``pipeline`` section with ``"num_layers": 0, "layers_per_stage": [0]`` for a model without repeated blocks
(an LSTM, a CNN), as if its one stage ran nothing. Those fields are now absent there; a transformer's are
its blocks, counted here from the ONNX file's own initializer names (``transformer.h.<i>.``).
"""

from __future__ import annotations

import re
from pathlib import Path

import onnx
import pytest

from exporters.generic import plan_from_dict
from objectives.cluster import make_cluster
from planner.launchable import export_row, launch_frontier
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
LSTM = ROOT / "tests" / "zoo" / "lstm_lm_ts_bare.onnx"
GPT2 = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


def _generic(path: Path, dims: dict[str, int], global_batch: int) -> dict:
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4, devices_per_node=4))
    frontier = launch_frontier(graph_loader(path, dims), request, options=PipelineOptions(global_batch=global_batch),
                               launchers=("generic",))
    return export_row(frontier, 0, "generic")


def test_a_model_without_repeated_blocks_writes_no_layer_count():
    model = onnx.load(str(LSTM), load_external_data=False)
    assert any(node.op_type == "LSTM" for node in model.graph.node)  # one recurrent op, no blocks
    document = _generic(LSTM, {"seq": 16}, 16)
    section = document["pipeline"]
    assert section["pp"] == 1
    assert "num_layers" not in section and "layers_per_stage" not in section
    assert [stage["layers"] for stage in section["stages"]] == [[0, 0]]  # the empty range
    assert plan_from_dict(document).pipeline.pp == 1  # it reads back


def test_a_transformer_counts_its_blocks():
    model = onnx.load(str(GPT2), load_external_data=False)
    blocks = {int(m.group(1)) for t in model.graph.initializer if (m := re.search(r"\.h\.(\d+)\.", t.name))}
    document = _generic(GPT2, {"seq": 32}, 8)
    section = document["pipeline"]
    assert section["num_layers"] == len(blocks) and sum(section["layers_per_stage"]) == len(blocks)


@pytest.mark.parametrize("layers", [0, 2])
def test_the_schema_takes_the_section_with_and_without_layers(layers):
    document = _generic(GPT2 if layers else LSTM, {"seq": 32 if layers else 16}, 8)
    assert ("num_layers" in document["pipeline"]) == bool(layers)
    plan_from_dict(document)
