"""A model without repeated blocks, planned for one launcher on devices spanning nodes (issue 25, h24e).

``launchable._with_smaller_mesh`` adds the pipelines of ``N / 8`` devices to an ``N``-device frontier. A
model with no repeated blocks (the bundled MLP; transformers' MobileViT, whose transformer blocks all differ
in width) has no pipeline: its stage-size search refused (``the model has no repeated blocks (layers) to cut
into pipeline stages; pass --pp 1 or leave --pp out``, exit 2) although no ``--pp`` was passed, for every
``--target`` at 16 devices or more. Now the smaller mesh's pipeline sizes hold a layer per stage, as the
pipeline search's own rule says, so none is searched and the frontier is the one-stage search's.
"""

from __future__ import annotations

import json
from pathlib import Path

from tests.planner.cli_helpers import run_cli

MLP = Path(__file__).resolve().parents[2] / "examples" / "mlp.onnx"
ARGS = ["plan", MLP, "--dim", "batch=64", "-n", "16", "--target", "deepspeed", "--json", "--quiet"]


def test_a_model_without_layers_plans_on_two_nodes():
    plan = json.loads(run_cli(ARGS).stdout)
    # pinned to one stage, the search takes no smaller-mesh detour (a pin is the user's plan): the oracle
    pinned = json.loads(run_cli([*ARGS, "--fix", "pp=1"]).stdout)
    assert plan["rows"] and all(row["pp"] == 1 for row in plan["rows"])
    fastest = min(row["step_time_s"] for row in plan["rows"] if row["fits"])
    assert fastest == min(row["step_time_s"] for row in pinned["rows"] if row["fits"])
    assert len(plan["rows"]) == len(pinned["rows"])
