"""A lookup reads only the rows it gathers: roofline bytes of an embedding, by hand."""

from __future__ import annotations

import numpy as np

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
