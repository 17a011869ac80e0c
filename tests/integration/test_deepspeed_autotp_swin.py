"""DeepSpeed's own AutoTP matcher on the Swin export (issues 22, 25; ``bench/export_sweep.py``).

The ``dp=4 x tp=2`` DeepSpeed plan of ``tests/zoo/swin_dynamo_consts.onnx`` keeps stage 1's MLPs
replicated; its ``partition_config`` is read by deepspeed 0.19.8's ``AutoTPConfig.from_dict`` and
every ``nn.Linear`` of transformers' ``SwinForImageClassification`` (the zoo's config, rebuilt) is
looked up with ``find_matching_spec`` (what ``AutoTP._replace_with_config`` does): the linears it
partitions, and how, are exactly the plan's.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from exporters.deepspeed import deepspeed_masks, export_deepspeed
from importers.transformer import analyze_transformer
from planner.plan import load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

pytestmark = pytest.mark.integration

ZOO = Path(__file__).resolve().parents[1] / "zoo"
_KIND = {"qkv": "column", "fc1": "column", "out-proj": "row", "fc2": "row"}


def test_deepspeed_partitions_exactly_the_planned_swin_linears():
    torch = pytest.importorskip("torch")
    transformers = pytest.importorskip("transformers")
    autotp = pytest.importorskip("deepspeed.module_inject.autotp_config")
    graph = load_graph(ZOO / "swin_dynamo_consts.onnx", {"batch": 16})
    spaces = spaces_for(graph, 8)
    plan = make_input(graph, spaces, first_rows(deepspeed_masks(graph, spaces, dp=4, tp=2)), cluster=make_cluster(1, 8))
    config = autotp.AutoTPConfig.from_dict(export_deepspeed(plan)["ds_config"]["tensor_parallel"]["partition_config"])

    entry = json.loads((ZOO / "zoo.json").read_text())["files"]["swin_dynamo_consts.onnx"]
    settings = {k: v for k, v in entry["config"].items() if not k.startswith("example_")}
    model = transformers.SwinForImageClassification(transformers.SwinConfig(**settings))
    linears = [name for name, module in model.named_modules() if isinstance(module, torch.nn.Linear)]
    found = {}
    for name in linears:
        spec = config.find_matching_spec(name + ".weight")
        found[name] = None if spec is None else spec.partition_type.value
    planned = {op.module_path: _KIND.get(role) for op, role in zip(graph.ops, analyze_transformer(graph).roles)
               if op.module_path in found}
    # 26 linears (2 stages x 2 blocks x 6, the patch merger, the classifier), the ONNX file's module
    # paths the same names; 14 column (12 q/k/v, stage 0's 2 fc1) and 6 row (4 o_proj, stage 0's 2 fc2)
    assert len(found) == 26 and set(planned) == set(found), sorted(set(found) ^ set(planned))
    assert found == planned
    assert sum(kind == "column" for kind in found.values()) == 14 and sum(kind == "row" for kind in found.values()) == 6
