"""``--fix cp=N`` at a sequence too short for it (issue 25, a new user's sweep: "megatron runs cp 1 on this
model" without the rule): the one-line error names the rule and the shortest ``--dim seq`` that allows the
pinned degree, as the other pins name theirs.

Oracles, by hand from the rule Megatron-LM's and torchtitan's families are searched under
(``exporters._target.context_degrees``: each of the ``cp`` ranks keeps at least 1,024 tokens, and the
sequence cuts into ``2 cp`` equal chunks for the causal load balance): at 64 tokens, cp=2 leaves 32 per rank
and needs 2 x 1,024 = 2,048; at 2,050 tokens each rank keeps 1,025 but 2,050 is not a multiple of 4. The
same graphs' families (the launcher's own rules) confirm that cp=2 is searched at 2,048 and not at 2,046
or 2,050.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from exporters.targets import TARGETS
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.launch_messages import _short_context, _ulysses_short_context
from planner.pipeline import graph_loader
from tests.planner.cli_helpers import error_line, run_cli

ROOT = Path(__file__).resolve().parents[2]
ZOO_LLAMA = ROOT / "tests" / "zoo" / "llama_dynamo_consts.onnx"


def _graph(seq: int):
    return graph_loader(ZOO_LLAMA, {"batch": 16, "seq": seq})(16)


def _megatron_cps(graph) -> set[int]:
    """The ``cp`` of every family Megatron-LM's rules list on 8 devices at ``pp = 1``."""
    spaces = [enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8)) for op in graph.ops]
    return {f.cp for f in TARGETS["megatron"].pipeline_families(graph, spaces, devices=8, devices_per_node=8, pp=1)}


def test_a_short_sequence_names_the_tokens_per_rank_rule():
    result = run_cli(["plan", ZOO_LLAMA, "-n", 8, "--dim", "batch=16", "--dim", "seq=64", "--target", "megatron",
                      "--fix", "cp=2"], expected_exit_code=2)
    assert error_line(result) == (
        "error: 8 devices: megatron runs cp 1 on this model at 8 devices (cp=2: each rank would keep 32 of its 64 "
        "tokens, and context parallelism is searched from 1,024 tokens per rank: plan with --dim seq=2048 or "
        "longer); --fix cp=2 leaves none: drop it or use --fix cp=1")


@pytest.mark.parametrize("seq, why", [
    (2048, None),
    (2046, "each rank would keep 1,023 of its 2,046 tokens, and context parallelism is searched from 1,024 tokens "
           "per rank: plan with --dim seq=2048 or longer"),
    (2050, "its 2,050 tokens do not cut into 4 equal chunks (the causal load balance of context parallelism): "
           "plan with --dim seq a multiple of 4"),
])
def test_the_reason_is_given_exactly_where_the_launcher_searches_no_cp(seq, why):
    graph = _graph(seq)
    assert (2 in _megatron_cps(graph)) == (why is None)
    assert _short_context(graph, 2) == why
    # DeepSpeed-Ulysses asks the tokens per rank only: 1,025 at 2,050 is enough
    assert _ulysses_short_context(graph, 2) == (why if seq < 2048 else None)
