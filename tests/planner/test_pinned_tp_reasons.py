"""``--fix tp=N`` that no launcher runs (issue 25, a new user's sweep): the one-line error lists only the
tensor-parallel degrees the search can place on this cluster (inside a node: the launchers' families span
every world size, so Megatron-LM's rules alone list tp 16 on two nodes of 8), and says why the pinned one
is not among them where the model's widths tell (its attention heads or its MLP width do not split N ways).

Oracles, from the model's config apart from the code under test: ``examples/models.json`` (Llama example:
16 heads, FFN 2816) and ``tests/zoo/zoo.json`` (the zoo's Llama: 4 heads); the degrees Megatron-LM runs
are those dividing the heads and the FFN width (megatron-core's ``divide`` of both by the tp size), at most
a node's devices.
"""

from __future__ import annotations

import json
from pathlib import Path

from exporters.targets import TARGETS
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.pipeline import graph_loader
from tests.planner.cli_helpers import error_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
LLAMA = ROOT / "examples" / "llama.onnx"
ZOO_LLAMA = ROOT / "tests" / "zoo" / "llama_dynamo_consts.onnx"
DIMS = ["--dim", "batch=16", "--dim", "seq=16"]
PER_NODE = 8  # the default --devices-per-node


def _megatron_tps(devices: int, model: Path) -> list[int]:
    """The ``tp`` of every family Megatron-LM's rules list on the model at ``pp = 1`` (every world size
    dividing ``devices``), before the search keeps tensor parallelism inside a node."""
    graph = graph_loader(model, {"batch": 16, "seq": 16})(16)
    spaces = [enumerate_configs(op, ConfigOptions(devices=devices, devices_per_node=devices)) for op in graph.ops]
    families = TARGETS["megatron"].pipeline_families(graph, spaces, devices=devices, devices_per_node=devices, pp=1)
    return sorted({f.tp for f in families})


def _example_config() -> dict:
    return json.loads((ROOT / "examples" / "models.json").read_text())["llama"]["config"]


def _words(values: list[int]) -> str:
    return ", ".join(map(str, values[:-1])) + f" or {values[-1]}"


def test_the_listed_degrees_fit_a_node_and_the_pinned_one_says_why():
    config = _example_config()
    heads, ffn = config["heads"], config["intermediate"]
    assert 16 in _megatron_tps(16, LLAMA)  # Megatron-LM's rules alone list tp 16 on 16 devices
    runs = [tp for tp in range(1, PER_NODE + 1) if heads % tp == 0 and ffn % tp == 0]
    assert runs == [1, 2, 4, 8]
    result = run_cli(["plan", LLAMA, "-n", 16, *DIMS, "--target", "megatron", "--fix", "tp=3"], expected_exit_code=2)
    assert error_line(result) == (
        f"error: 16 devices: megatron runs tp {_words(runs)} on this model at 16 devices, {PER_NODE} per node "
        f"(tp=3: its {heads} attention heads do not split 3 ways); --fix tp=3 leaves none: drop it or use --fix tp=2")


def test_a_node_of_sixteen_names_the_heads_sixteen_does_not_split():
    config = json.loads((ROOT / "tests" / "zoo" / "zoo.json").read_text())["files"][ZOO_LLAMA.name]["config"]
    heads, ffn = config["num_attention_heads"], config["intermediate_size"]
    runs = [tp for tp in range(1, 17) if heads % tp == 0 and ffn % tp == 0]
    result = run_cli(["plan", ZOO_LLAMA, "-n", 16, "--devices-per-node", 16, *DIMS, "--target", "megatron",
                      "--fix", "tp=16"], expected_exit_code=2)
    assert error_line(result) == (
        f"error: 16 devices: megatron runs tp {_words(runs)} on this model at 16 devices (tp=16: its {heads} attention "
        f"heads do not split 16 ways); --fix tp=16 leaves none: drop it or use --fix tp={runs[-1]}")
