"""Each launcher refuses a model without attention in its own words (issue 25, task H2, item 2).

The importer's refusal ("... so it is not a transformer: Megatron-LM and DeepSpeed tensor parallelism
cannot run it; export it as the generic plan or with --target deepspeed at tp=1") reached torchtitan's
users word for word, naming two other launchers and not what torchtitan trains. Each launcher now keeps
the finding and says what it needs: Megatron-LM a transformer or Mamba model class, torchtitan one of
its model families (read from :data:`exporters.torchtitan.families.FAMILIES`), DeepSpeed's AutoTP
projections to shard (a split refusal, fixed at tp = 1). The oracles: the launchers a suffix names are
those whose exporter runs the plan (:func:`exporters.runnable_targets`), and DeepSpeed's suggested
``tp = 1`` plan of the same model exports.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from exporters import export, runnable_targets
from exporters.deepspeed.zero_sync import zero_sync
from exporters.torchtitan.families import FAMILIES
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.pricing import load_graph
from tests.exporters.graphs import make_input, spaces_for

ZOO = Path(__file__).resolve().parents[2] / "tests" / "zoo"
MODELS = [("convnext_ts_bare.onnx", {"batch": 4}), ("lstm_lm_ts_bare.onnx", {"batch": 4, "seq": 16}),
          ("resnet_dynamo_bare.onnx", {"batch": 4})]
SUFFIX = re.compile(r"; export (?:with --target (.+?),? or )?as the generic plan$")


def _reason(target: str, plan) -> str:
    with pytest.raises(UnsupportedExport) as refused:
        export(target, plan)
    return refused.value.reason


def _split(graph, spaces, *, batch: bool) -> list[int]:
    """Each op split 2 ways: along its batch dim (``batch``), else along its first even model dim."""
    choice = []
    for op, space in zip(graph.ops, spaces):
        dims = [d for d in op.dims if d.is_batch == batch and d.splittable and d.size % 2 == 0]
        choice.append(space.index_of({dims[0].name: 2}) if dims else 0)
    return choice


@pytest.mark.parametrize("name, dims", MODELS, ids=[m[0].split(".")[0] for m in MODELS])
def test_each_launcher_says_what_it_needs(name, dims):
    graph = load_graph(ZOO / name, dims)
    plan = make_input(graph, spaces_for(graph, 1), [0] * len(graph.ops))
    finding = f"model '{graph.name}' has no attention (matmul -> softmax -> matmul), so it is not a transformer"
    runs = set(runnable_targets(plan)) - {"generic"}
    assert runs == {"deepspeed", "meshtf", "dtensor"}  # data parallelism of any model
    megatron, torchtitan = _reason("megatron", plan), _reason("torchtitan", plan)
    assert megatron != torchtitan
    for reason, refusing in ((megatron, "megatron"), (torchtitan, "torchtitan")):
        assert reason.startswith(finding) and "\n" not in reason
        found = SUFFIX.search(reason)
        assert found and set(re.split(r", | or ", found.group(1))) == runs - {refusing}
    assert "has no Mamba mixer: Megatron-LM has no model class that trains it" in megatron
    body = SUFFIX.sub("", torchtitan)
    assert body.endswith(f"({', '.join(FAMILIES)}) are decoder-only transformers")
    assert "Megatron" not in body and "DeepSpeed" not in body


@pytest.mark.parametrize("name, dims", MODELS[:2], ids=[m[0].split(".")[0] for m in MODELS[:2]])
def test_deepspeed_refuses_the_split_and_runs_its_fix(name, dims):
    graph = load_graph(ZOO / name, dims)
    two = spaces_for(graph, 2)
    reason = _reason("deepspeed", make_input(graph, two, _split(graph, two, batch=False)))
    assert reason.endswith("DeepSpeed's AutoTP shards attention and MLP projections and finds none to split tp=2 "
                           "ways; plan with --fix tp=1 (ZeRO data parallelism runs it)")
    assert "Megatron" not in reason
    # the fix: dp=2, tp=1, priced as DeepSpeed runs ZeRO-0 (its all-reduce after the backward; it refuses a plan priced otherwise)
    settings = TrainingSettings(zero_sync=zero_sync(zero_stage=0, precision="bf16-mixed"))
    document = export("deepspeed", make_input(graph, two, _split(graph, two, batch=True), settings=settings))
    assert document["target"] == "deepspeed"
