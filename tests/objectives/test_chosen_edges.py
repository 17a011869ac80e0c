"""Edges priced at a fixed choice (issue 22, ninth round): :func:`objectives.tables.chosen_edges` and the
``rows``/``cols`` of :func:`objectives.redistribution.redistribution_time_s` and
:func:`objectives.sequence_split.sequence_split_table` give, to the bit, the cells of the whole tables a
build prices (:func:`objectives.tables.with_edges`), which are the oracle: same seconds, no table built.

16 devices on nodes of 4, so the node-crossing branch of the tables is taken; an execution model (NCCL
priced collectives, the sequence-split rule's call overheads) with tensor-parallel overlap, so the
overlapped edges are read through too.
"""

from __future__ import annotations

import numpy as np
import pytest

from objectives._common import element_bytes
from objectives.cluster import make_cluster
from objectives.parameters import ParameterView
from objectives.redistribution import redistribution_time_s
from objectives.sequence_split import sequence_split_table
from objectives.tables import build_cost_model, chosen_edges, with_edges
from planner.core.configs import ConfigOptions
from planner.core.settings import TrainingSettings
from tests.objectives.graphs import gpt2_like

DEVICES, PER_NODE = 16, 4


@pytest.fixture(scope="module")
def models():
    """``(bare, whole)``: a GPT-2-like layer's model built without its edge tables, and with them."""
    graph = gpt2_like(layers=1, hidden=256, heads=4, vocab=512, positions=64, batch=16, seq=64)
    settings = TrainingSettings(engine="fused", attention="flash", tp_comm_overlap=True)
    bare = build_cost_model(graph, cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=PER_NODE),
                            settings=settings, config_options=ConfigOptions(devices=DEVICES, devices_per_node=PER_NODE),
                            price_edges=False)
    return bare, with_edges(bare)


def _cells(whole, picks: np.ndarray) -> np.ndarray:
    return np.array([e.time_s[picks[e.u], picks[e.v]] for e in whole.tables.edges])


def _index(graph, name: str) -> int:
    return next(i for i, op in enumerate(graph.ops) if op.name == name)


def _config(model, op: int, **splits: int) -> int:
    space = model.tables.configs[op]
    want = np.array([splits.get(name, 1) for name in space.dim_names])
    return int(np.flatnonzero(np.all(space.factors == want, axis=1) & (space.replica_counts == 1))[0])


def test_random_choices_read_the_whole_tables_cells(models):
    bare, whole = models
    assert not bare.edges_priced and whole.edges_priced
    rng = np.random.default_rng(7)
    for _ in range(12):
        picks = np.array([rng.integers(space.size) for space in bare.tables.configs])
        producers, consumers, seconds = chosen_edges(bare, picks)
        assert producers.tolist() == [e.u for e in whole.tables.edges]
        assert consumers.tolist() == [e.v for e in whole.tables.edges]
        np.testing.assert_array_equal(seconds, _cells(whole, picks))
    # a model with its tables is read, not priced again
    np.testing.assert_array_equal(chosen_edges(whole, picks)[2], _cells(whole, picks))


def test_a_sequence_parallel_boundary_is_its_reduce_scatter(models):
    """The row-parallel projection (reduction split 4 ways) into the sequence-split residual add, the pair the
    sequence-split rule re-prices (reduce-scatter + all-gather less the op's all-reduce: NCCL's extra call,
    test_sequence_split), not the plain re-layout's cell: read at the choice as in the whole table."""
    bare, whole = models
    graph = bare.graph
    u, v = _index(graph, "h.0.attn.c_proj"), _index(graph, "h.0.add_1")
    picks = np.zeros(len(graph.ops), dtype=np.int64)
    picks[u], picks[v] = _config(bare, u, k=4), _config(bare, v, s=4)
    producers, consumers, seconds = chosen_edges(bare, picks)
    np.testing.assert_array_equal(seconds, _cells(whole, picks))
    edge = int(np.flatnonzero((producers == u) & (consumers == v))[0])
    tensor = graph.tensors["h.0.attn.c_proj.out"]
    access_v = next(a for a in graph.ops[v].inputs if a.tensor == tensor.name)
    cell = dict(producer=graph.ops[u], producer_space=bare.tables.configs[u], producer_access=graph.ops[u].outputs[0],
                consumer=graph.ops[v], consumer_space=bare.tables.configs[v], consumer_access=access_v,
                cluster=bare.cluster, rows=picks[[u]], cols=picks[[v]])
    plain = redistribution_time_s(tensor.shape, element_bytes(tensor, bare.settings), **cell)
    ruled = sequence_split_table(plain.copy(), tensor.shape, tensor=tensor, tensors=ParameterView(graph),
                                 settings=bare.settings, nccl=True, **cell)
    assert plain[0, 0] > 0.0 and ruled[0, 0] > 0.0 and ruled[0, 0] != plain[0, 0]
    assert seconds[edge] > 0.0


def test_rows_and_columns_are_the_whole_tables_entries(models):
    """Every tensor edge between two ops, at scattered configurations (repeats, any order, node-crossing
    and not): the narrowed table is ``whole[np.ix_(rows, cols)]``, before and after the sequence-split rule."""
    bare, _ = models
    graph = bare.graph
    tensors = ParameterView(graph)
    rng = np.random.default_rng(3)
    checked = 0
    for v, consumer in enumerate(graph.ops):
        for access_v in consumer.inputs:
            u = next((i for i, op in enumerate(graph.ops) if any(a.tensor == access_v.tensor for a in op.outputs)), None)
            if u is None:
                continue
            producer, tensor = graph.ops[u], graph.tensors[access_v.tensor]
            edge = dict(producer=producer, producer_space=bare.tables.configs[u], producer_access=producer.outputs[0],
                        consumer=consumer, consumer_space=bare.tables.configs[v], consumer_access=access_v,
                        cluster=bare.cluster)
            rows = rng.integers(bare.tables.configs[u].size, size=5)
            cols = rng.integers(bare.tables.configs[v].size, size=4)
            for narrowed in (dict(), dict(rows=rows, cols=cols)):
                table = redistribution_time_s(tensor.shape, element_bytes(tensor, bare.settings), **edge, **narrowed)
                table = sequence_split_table(table, tensor.shape, tensor=tensor, tensors=tensors, settings=bare.settings,
                                             nccl=True, **edge, **narrowed)
                if not narrowed:
                    whole = table
            np.testing.assert_array_equal(table, whole[np.ix_(rows, cols)])
            checked += 1
    assert checked >= 10
