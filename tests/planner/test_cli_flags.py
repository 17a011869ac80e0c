"""The command-line surface is frozen here, so every new command or option is a deliberate change."""

from __future__ import annotations

import typer.main

from planner.cli import app

EXPECTED = {
    "inspect": ["--dim", "--json"],
    "plan": [
        "--attention", "--capacity-factor", "--chunks", "--cluster", "--collapse", "--cost", "--device", "--devices",
        "--devices-per-node", "--dim", "--dtype", "--engine", "--epsilon", "--export", "--fix", "--force", "--global-batch", "--json", "--max-memory", "--mem-limit", "--method", "--micro-batch",
        "--optimizer", "--output", "--pick", "--plot", "--pp",
        "--profile-db", "--quiet", "--recompute", "--schedule", "--seed", "--target", "--time-limit", "--top", "--zero", "-n", "-o",
        "-q",
        "--tokens", "--samples", "--price-per-gpu-hour",  # issue 24 item 7: what a run costs (planner/run_cost.py)
        "--allow-batch-split",  # issue 25: micro-batch a contrastive loss anyway (planner/coupling.py)
        "--no-overlap",  # issue 23 part 2: price and export communication un-overlapped
    ],
    "profile": [
        "--devices", "--devices-per-node", "--dim", "--json", "--max-shards", "--profile-db", "--provider",
        "--quiet", "--repeats", "-n", "-q",
    ],
    "explain": ["--all", "--json", "--model", "--top"],
    "compare": ["--json", "--model", "--top"],
    "export": ["--force", "--format", "--model", "--output", "-f", "-o"],
    "devices": ["--json"],
    "calibrate": [
        "--cluster", "--device", "--fit", "--force", "--holdout", "--holdout-every", "--json", "--models-dir",
        "--output", "--rounds", "-o",
    ],
    "estimate": [
        "--attention", "--chunks", "--cluster", "--cp", "--device", "--devices", "--devices-per-node", "--dim", "--dp",
        "--dtype", "--engine", "--global-batch", "--json", "--mem-limit", "--micro-batch", "--no-rank", "--pp", "--quiet", "--rank",
        "--recompute", "--schedule", "--sequence-parallel", "--stage-layers", "--tp", "--zero", "-n", "-q",
        "--no-overlap",
        "--target", "--cuda-graphs", "--no-cuda-graphs",  # issue 23 item 1: a launcher's priced settings (18934a2)
        "--p2p-overlap", "--no-p2p-overlap",  # issue 23: Megatron-LM's overlap_p2p_comm, as --target runs it (h30b)
    ],
}


def test_no_new_cli_options():
    command = typer.main.get_command(app)
    found = {
        name: sorted(
            option for param in sub.params for option in (*param.opts, *param.secondary_opts) if option.startswith("-")
        )
        for name, sub in command.commands.items()
    }
    assert found == {name: sorted(options) for name, options in EXPECTED.items()}


def test_every_command_help_has_an_example():
    command = typer.main.get_command(app)
    for name, sub in command.commands.items():
        if name == "devices":
            continue
        text = (sub.help or "") + (sub.epilog or "")
        assert "planner " + name in text or "Example" in text, name
