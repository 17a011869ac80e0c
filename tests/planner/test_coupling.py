"""What the search does with a batch-coupled model (planner/coupling.py), through the CLI: a contrastive loss
keeps one micro-batch per step unless --allow-batch-split, BatchNorm is noted, a GNN's node dim is refused for
micro-batching and planned as one step otherwise."""

from __future__ import annotations

import json

import pytest

from tests.importers.batch_coupling_models import bn_cnn, clip_model, gnn_model, mean_loss_mlp, save
from tests.planner.cli_helpers import run_cli

GNN_DIMS = ["--dim", "num_nodes=400", "--dim", "num_edges=1600"]


@pytest.fixture(scope="module")
def models(tmp_path_factory):
    directory = tmp_path_factory.mktemp("coupled")
    return {
        "clip": save(clip_model(), directory, "clip"),
        "cnn": save(bn_cnn(), directory, "cnn"),
        "mlp": save(mean_loss_mlp(), directory, "mlp"),
        "gnn": save(gnn_model(), directory, "gnn"),
    }


def _plan(path, *args: str) -> dict:
    return json.loads(run_cli(["plan", path, "-n", "8", "--dim", "batch=512", "--json", *args]).stdout)


class TestContrastiveLoss:
    def test_one_micro_batch_per_step(self, models):
        data = _plan(models["clip"])
        assert data["rows"] and {row["micro_batches"] for row in data["rows"]} == {1}
        # each data-parallel rank runs its share of the global batch at once
        assert all(row["micro_batch"] * row["dp"] == 512 for row in data["rows"])

    def test_the_note_names_the_op_and_what_was_done(self, models):
        notes = [n for n in _plan(models["clip"])["search"]["notes"] if n.startswith("batch-coupled")]
        assert len(notes) == 1
        assert "logits_per_text" in notes[0] and "one micro-batch per step" in notes[0]
        assert "--allow-batch-split" in notes[0] and "--gather-with-grad" in notes[0]

    def test_allow_batch_split_lifts_it(self, models):
        data = _plan(models["clip"], "--allow-batch-split", "--collapse", "0")
        # on 8 devices at batch 512 the leanest rows run many micro-batches (activations shrink with them; every row
        # holds ~308 MB of NCCL's buffers, so the default 1% collapse would merge them into a one-micro-batch row)
        assert max(row["micro_batches"] for row in data["rows"]) > 1
        assert any("trains a different objective" in n for n in data["search"]["notes"])

    def test_generic_pipeline_search_too(self, models):
        out = run_cli(["plan", models["clip"], "-n", "8", "--dim", "batch=512", "--global-batch", "512",
                       "--target", "generic", "--json"])  # fmt: skip
        data = json.loads(out.stdout)
        assert data["rows"] and {p["micro_batches"] for p in data["rows"]} == {1}
        assert any(n.startswith("batch-coupled") for n in data["search"]["notes"])

    def test_data_parallel_rows_compute_the_whole_batch_similarity(self, models, tmp_path):
        # dp=8: the 512 x 512 logits are split 8 ways over their two batch dims, not 8 local 64 x 64 blocks
        plan = tmp_path / "plan.json"
        run_cli(["plan", models["clip"], "-n", "8", "--dim", "batch=512", "--fix", "dp=8,pp=1", "--pick", "1",
                 "--export", "generic", "-o", plan, "-q"])  # fmt: skip
        op = next(op for op in json.loads(plan.read_text())["ops"] if op["name"] == "logits_per_text")
        sizes = {d["name"]: d["size"] for d in op["dims"]}
        factors = {d["name"]: d["factor"] for d in op["dims"]}
        assert sizes["m"] == sizes["n"] == 512
        assert factors["m"] * factors["n"] == 8


class TestBatchNorm:
    def test_noted_and_not_restricted(self, models):
        data = _plan(models["cnn"])
        notes = [n for n in data["search"]["notes"] if n.startswith("batch-coupled")]
        assert len(notes) == 1 and "2 BatchNorm" in notes[0] and "per data-parallel rank" in notes[0]
        assert max(row["micro_batches"] for row in data["rows"]) > 1


class TestOrdinaryLoss:
    def test_no_note(self, models):
        assert not any(n.startswith("batch-coupled") for n in _plan(models["mlp"])["search"]["notes"])


class TestGraphNeuralNetwork:
    @pytest.mark.parametrize("extra", [["--global-batch", "400"], ["--fix", "mb=50"], ["--micro-batch", "50"],
                                       ["--global-batch", "400", "--target", "generic"], ["--fix", "dp=2"]])
    def test_micro_batching_nodes_is_refused(self, models, extra):
        result = run_cli(["plan", models["gnn"], "-n", "8", *GNN_DIMS, *extra], expected_exit_code=2)
        message = result.stderr.strip()
        assert message.count("\n") == 0 and "Traceback" not in message
        assert "'num_nodes' is not a sample dim" in message and "edge_index" in message

    def test_estimate_is_refused(self, models):
        result = run_cli(["estimate", models["gnn"], "-n", "8", "--dim", "num_edges=1600", "--tp", "1", "--pp", "1",
                          "--micro-batch", "50", "--global-batch", "400"], expected_exit_code=2)  # fmt: skip
        assert "'num_nodes' is not a sample dim" in result.stderr

    def test_default_plans_the_whole_graph_as_one_step(self, models):
        result = run_cli(["plan", models["gnn"], "-n", "8", *GNN_DIMS])
        assert "not a sample dim" in result.stderr and "whole graph as one sample per step" in result.stderr
        assert "picked #1" in result.stdout and "global batch 1" in result.stdout  # the launchable table

    @pytest.mark.parametrize("target", ["deepspeed", "generic"])
    def test_whole_graph_rows_are_one_pass_without_data_parallelism(self, models, target, tmp_path):
        data = json.loads(run_cli(["plan", models["gnn"], "-n", "8", *GNN_DIMS, "--target", target, "--json"]).stdout)
        assert data["global_batch"] == 1 and data["rows"]
        for row in data["rows"]:  # the graph is one sample: no data parallelism, no micro-batches
            assert row["degrees"]["dp"] == 1 and row["micro_batches"] == 1 and row["micro_batch"] == 1
        plan = tmp_path / "plan.json"
        run_cli(["plan", models["gnn"], "-n", "8", *GNN_DIMS, "--target", target, "--export", target, "-o", str(plan)])
        assert plan.exists()
