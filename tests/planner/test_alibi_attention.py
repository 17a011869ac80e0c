"""ALiBi models are priced as their launchers run them: with the attention scores materialised.

No launcher the planner exports to runs ALiBi in a flash kernel (transformers 5.24's ``BloomAttention``
adds the bias with ``baddbmm`` and has no SDPA path; Megatron-DeepSpeed trained BLOOM with a fused
softmax over explicit scores; Megatron-LM and torchtitan refuse ALiBi), so every launcher's default
attention on such a model is ``explicit`` (:func:`objectives.execution.model_attention`) and
``--attention flash`` still overrides it. The oracle for the default is the same search with the
attention given explicitly: the rows must be the same plans at the same seconds and bytes.

Fixture: the zoo's ``bloom_ts_bare.onnx`` (transformers' ``BloomForCausalLM``, 2 layers, hidden 64,
4 heads; ``tests/zoo/make_zoo.py``) and, for a model without ALiBi, ``tests/data/gpt2_tiny.onnx``.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.targets import TARGETS
from objectives.cluster import make_cluster
from objectives.execution import default_execution
from planner.launchable import launch_frontier
from planner.launcher_options import launcher_execution
from planner.pipeline import PipelineOptions, graph_loader
from planner.plan import PlanRequest

ROOT = Path(__file__).resolve().parents[2]
BLOOM = ROOT / "tests" / "zoo" / "bloom_ts_bare.onnx"
GPT2 = ROOT / "tests" / "data" / "gpt2_tiny.onnx"


def _rows(path: Path, attention: str | None, seq: int = 256) -> list[tuple]:
    loader = graph_loader(path, {"seq": seq})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=4, devices_per_node=4))
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=8), attention=attention,
                               headroom=False, collapse=0.0)
    return [(row.summary, row.targets, row.execution, row.time_s, row.memory_bytes) for row in frontier.rows]


@pytest.fixture(scope="module")
def bloom_default():
    return _rows(BLOOM, None)


def test_an_alibi_models_rows_are_priced_with_explicit_scores(bloom_default):
    assert bloom_default
    assert {row[2].attention for row in bloom_default} == {"explicit"}
    # the DTensor rows keep their launcher's eager kernels, DeepSpeed's its fused ones
    engines = {target: row[2].engine for row in bloom_default for target in row[1]}
    assert engines.get("dtensor", "eager") == "eager" and engines.get("deepspeed", "fused") == "fused"


def test_the_default_is_the_explicit_override(bloom_default):
    assert bloom_default == _rows(BLOOM, "explicit")


def test_flash_still_overrides_and_prices_otherwise(bloom_default):
    flash = _rows(BLOOM, "flash")
    assert {row[2].attention for row in flash} == {"flash"}
    # at 256 tokens the explicit scores (8 x 4 heads x 256 x 256 per core) outweigh what flash keeps:
    # the leanest explicit plan holds more than the leanest flash plan
    assert min(row[4] for row in bloom_default) > min(row[4] for row in flash)


def test_a_model_without_alibi_keeps_each_launchers_attention():
    default = _rows(GPT2, None, seq=128)  # its position table's 128 rows
    assert {row[2].attention for row in default if "meshtf" not in row[1]} == {"flash"}
    graph = graph_loader(GPT2, {"seq": 128})(8)
    for launcher, target in TARGETS.items():
        assert launcher_execution(launcher, graph, None, None) == default_execution(target.execution)


@pytest.mark.parametrize("launcher, expected", [("deepspeed", ("fused", "explicit")), ("dtensor", ("eager", "explicit")),
                                                ("meshtf", ("fused", "explicit"))])
def test_each_launchers_execution_for_an_alibi_graph(launcher, expected):
    graph = graph_loader(BLOOM, {"seq": 64})(8)
    execution = launcher_execution(launcher, graph, None, None)
    assert (execution.engine, execution.attention) == expected
    assert launcher_execution(launcher, graph, None, "flash").attention == "flash"
    assert launcher_execution(launcher, graph, "roofline", None) is None
