"""A lookup reads only the rows it gathers: roofline bytes of an embedding and an embedding bag, by hand."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from importers import import_model
from objectives.compute import forward_bytes
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like


def test_embedding_reads_gathered_rows_not_the_table():
    graph = gpt2_like(batch=2, seq=8, layers=1)
    op = next(o for o in graph.ops if o.name == "wte_lookup")
    space = enumerate_configs(op, ConfigOptions(devices=1, devices_per_node=1))
    settings = TrainingSettings(precision="fp32")
    # Replicated: int64 ids (2*8*8 B) + gathered rows (2*8*768*4 B, far below the 50257-row table)
    # + written output (2*8*768*4 B).
    expected = 2 * 8 * 8 + 2 * (2 * 8 * 768 * 4)
    assert np.isclose(forward_bytes(op, space, tensors=graph.tensors, settings=settings)[0], expected)


DLRM = Path(__file__).resolve().parents[1] / "data" / "dlrm_cases" / "dlrm_ts_bare.onnx"


def test_embedding_bag_reads_every_index_row_not_one_per_bag():
    """The 400,000 x 64 sum table of the DLRM fixture at batch 32: 20 indices per bag
    (``tests/importers/make_dlrm_cases.py``'s POOLING), so nnz = 640."""
    graph = import_model(DLRM, {"batch": 32})
    op = next(o for o in graph.ops if o.op_type == "EmbeddingBagSum" and graph.tensors[o.inputs[0].tensor].shape[0] == 400_000)
    space = enumerate_configs(op, ConfigOptions(devices=8, devices_per_node=8))
    settings = TrainingSettings(precision="fp32")
    got = forward_bytes(op, space, tensors=graph.tensors, settings=settings)
    # replicated: int64 indices 640*8 + int64 offsets 32*8 + 640 gathered rows of 64 fp32 (not the
    # 32 pooled rows the output holds) + the output 32*64*4
    replicated = 640 * 8 + 32 * 8 + 640 * 64 * 4 + 32 * 64 * 4
    assert got[space.index_of({})] == replicated == 177_408  # 5,120 + 256 + 163,840 + 8,192
    # width split 8 ways (column-wise): every index, 8 of the 64 columns
    assert got[space.index_of({"d": 8})] == 640 * 8 + 32 * 8 + 640 * 8 * 4 + 32 * 8 * 4
    # batch split 8 ways: 80 indices of 4 bags on each device, whole rows
    assert got[space.index_of({"b": 8})] == 80 * 8 + 4 * 8 + 80 * 64 * 4 + 4 * 64 * 4
    # rows split 8 ways (row-wise): each rank looks all 640 indices up (masked ones read row 0) and
    # writes a partial sum of every bag
    assert got[space.index_of({"v": 8})] == replicated
