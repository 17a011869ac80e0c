"""Ops that read across the samples of the batch (importers/batch_coupling.py), on small graphs whose
coupling is known by construction (tests/importers/batch_coupling_models.py) and on models with none."""

from __future__ import annotations

from pathlib import Path

import pytest

from importers import import_model
from importers.rebatch import rebatch
from tests.importers.batch_coupling_models import bn_cnn, clip_model, gnn_model, mean_loss_mlp, save

DATA = Path(__file__).resolve().parents[1] / "data"


def _couplings(tmp_path: Path, model, name: str, dims: dict[str, int]) -> list[tuple[str, str]]:
    graph = import_model(save(model, tmp_path, name), dims)
    return [(c.op, c.kind) for c in graph.batch_coupled]


class TestSimilarity:
    def test_clip_logits_are_the_one_coupled_op(self, tmp_path):
        # logits_per_text = text_emb @ image_emb^T is batch x batch; the towers and the losses after it are not flagged
        assert _couplings(tmp_path, clip_model(), "clip", {"batch": 64}) == [("logits_per_text", "similarity")]

    def test_the_reason_says_what_it_is(self, tmp_path):
        graph = import_model(save(clip_model(), tmp_path, "clip"), {"batch": 64})
        assert "batch x batch" in graph.batch_coupled[0].reason

    def test_kept_when_the_graph_is_moved_to_another_batch(self, tmp_path):
        # the pipeline search moves the imported graph to each micro-batch (importers/rebatch.py)
        graph = import_model(save(clip_model(), tmp_path, "clip"), {"batch": 64})
        moved = rebatch(graph, batch_dim="batch", batch=128)
        assert moved is not None and moved.batch_coupled == graph.batch_coupled


class TestBatchNorm:
    @pytest.mark.parametrize("training_mode", [1, 0])
    def test_every_batchnorm_is_flagged(self, tmp_path, training_mode):
        # training_mode=0 is an inference export of the same layers: training still uses batch statistics
        found = _couplings(tmp_path, bn_cnn(training_mode, blocks=2), f"cnn{training_mode}", {"batch": 8})
        assert found == [("layer0.bn", "batch_norm"), ("layer1.bn", "batch_norm")]


class TestNotCoupled:
    def test_a_mean_loss_over_the_batch_is_not_flagged(self, tmp_path):
        # ReduceMean over the batch is the ordinary loss: data parallelism and accumulation reproduce it
        assert _couplings(tmp_path, mean_loss_mlp(), "mlp", {"batch": 16}) == []

    @pytest.mark.parametrize("name", ["gpt2_tiny", "bert_tiny_ts", "mixtral_tiny", "t5_tiny", "vit_tiny"])
    def test_transformers_have_none(self, name):
        # attention's Q @ K^T shares one batch dim; embedding lookups and MoE dispatch index by the samples' own ids
        dims = {"batch": 6, "seq": 16, "tgt_seq": 8} if name == "t5_tiny" else {"batch": 6, "seq": 16}
        graph = import_model(DATA / f"{name}.onnx", {k: v for k, v in dims.items() if name != "vit_tiny" or k == "batch"})
        assert graph.batch_coupled == ()


class TestIndexed:
    def test_gnn_node_dim_is_indexed_by_edge_index(self, tmp_path):
        found = _couplings(tmp_path, gnn_model(), "gnn", {"num_nodes": 50, "num_edges": 200})
        assert found == [("conv.gather_src", "indexed"), ("conv.aggregate", "indexed")]

    def test_the_reason_names_the_dim_and_the_index_input(self, tmp_path):
        graph = import_model(save(gnn_model(), tmp_path, "gnn"), {"num_nodes": 50, "num_edges": 200})
        reason = graph.batch_coupled[0].reason
        assert "'num_nodes'" in reason and "edge_index[2, num_edges]" in reason

    def test_gnn_with_a_batch_of_one_node_is_not_told(self, tmp_path):
        # at one node no axis tells the dim apart: nothing to split either
        assert _couplings(tmp_path, gnn_model(), "gnn", {"num_nodes": 1, "num_edges": 4}) == []
