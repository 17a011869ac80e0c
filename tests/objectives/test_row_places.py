"""A row's ZeRO synchronisation found with its places kept (issue 22, twelfth round):
``objectives.pipeline_arrays._row_sync_s`` finds each row's places in DeepSpeed's ZeRO-3 trace once
(``_row_places``) and keeps the op's part of the priced-terms key (``_sync_op_key``) with the parts. Checked to the
bit against the per-op loop it replaced (written out below: every op's place built and looked up one after the
other), on every row of GPT-2 tiny under DeepSpeed's rule with the reuse distance and the last bucket placing the
layers apart, with and without recomputation, and under the pricing's own rule at every ZeRO stage."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from objectives.cluster import make_cluster
from objectives.deepspeed_zero3 import PERSISTENT, gathers_per_micro_batch
from objectives.pipeline_arrays import (_gradient_tails, _op_sync_s, _output_ops, _row_members, _row_sync_s,
                                        _submodule_orders, _sync_key, _sync_op_key)
from objectives.pipeline_cost import PipelineCostCache
from planner.core.settings import ZERO_SYNC_STAGES, TrainingSettings, Zero3Gather
from planner.pipeline import graph_loader

TINY = Path(__file__).resolve().parents[1] / "data" / "gpt2_tiny.onnx"
DEVICES, BATCH = 16, 16
# gathers every weight over 1,000 elements; layer 0's attention projection gathered again in backward, layer 1's
# kept (reuse distance 1e5); the last bucket holds layer 0's QKV and the embeddings: the two layers' places differ
RULE = Zero3Gather(prefetch_bucket=1_000_000, max_live=10_000, max_reuse_distance=100_000, persistence_threshold=1_000,
                   reduce_bucket=87_500)


def _per_op_loop(model, parts, key, index, *, settings, cluster, memo, priced_sync, heads, orders) -> tuple:
    """The row's seconds one op after the other, as ``_row_sync_s`` found them before its places were kept."""
    detail = model.op_details[index]
    recomputed = bool(np.any(detail.recompute_s > 0.0))
    base = (index, settings.zero_stage, recomputed, settings.recompute if detail.grad_sync_unhidden_s is not None else None,
            settings.zero_sync if settings.zero_stage in ZERO_SYNC_STAGES else None)
    members = (index,) if orders is None else _row_members(parts)[key]
    priced = []
    for op in members:
        place = None
        if orders is not None:
            order = orders.get(op, PERSISTENT)
            place = (settings.zero3_gather, order.elements, order.previous, order.following,
                     gathers_per_micro_batch(order, settings.zero3_gather, recomputed=recomputed),
                     _gradient_tails(parts, settings, model.graph).get(op), parts.owned[op], op in heads)
        memo_key = (*base, place)
        if memo_key not in memo:
            memo[memo_key] = _op_sync_s(model, parts, op, detail, settings=settings, cluster=cluster,
                                        priced_sync=priced_sync, digests=memo, graph_output=op in heads, orders=orders)
        priced.append(memo[memo_key])
    if len(priced) == 1:
        return priced[0]
    return tuple(sum(column) / len(priced) for column in zip(*priced))


def _rows(zero: int, recompute: str, rule: Zero3Gather | None):
    cluster = make_cluster("a100-80gb", devices=DEVICES, devices_per_node=8)
    cache = PipelineCostCache(graph_loader(TINY, {"seq": 128}), cluster=cluster,
                              settings=TrainingSettings(engine="fused", attention="flash"))
    cache.arrays(DEVICES, BATCH, zero, recompute, edges=False, zero3_gather=rule)  # builds the model and its parts
    model = cache.model(DEVICES, BATCH, 0, recompute, edges=False)
    parts = cache._parts[(DEVICES, BATCH, recompute)]
    settings = dataclasses.replace(model.settings, zero_stage=zero, zero3_gather=rule if zero >= 3 else None)
    return model, parts, settings, cluster


@pytest.mark.parametrize("zero, recompute, rule", [(3, "none", RULE), (3, "full", RULE), (3, "selective", RULE),
                                                   (3, "none", None), (2, "full", None), (1, "none", None),
                                                   (0, "selective", None)])
def test_every_row_equals_the_per_op_loop_to_the_bit(zero, recompute, rule):
    model, parts, settings, cluster = _rows(zero, recompute, rule)
    heads, orders = _output_ops(model.graph, settings), _submodule_orders(model, parts, settings)
    assert (orders is not None) == (rule is not None)
    common = dict(settings=settings, cluster=cluster, heads=heads, orders=orders)
    kept, loop, averaged = ({}, {}), ({}, {}), 0
    for key, index in parts.first_op.items():
        for _ in range(2):  # the second time from the memos and the kept places
            mine = _row_sync_s(model, parts, key, index, memo=kept[0], priced_sync=kept[1], **common)
            theirs = _per_op_loop(model, parts, key, index, memo=loop[0], priced_sync=loop[1], **common)
            assert len(mine) == 4  # forward, backward, per step, the step's first forward
            for a, b in zip(mine, theirs):
                assert a.tobytes() == b.tobytes()
        averaged += len(_row_members(parts)[key]) > 1 and orders is not None
    if rule is not None and recompute != "full":  # (full recomputation gives each op of GPT-2 tiny its own row)
        assert averaged  # some rows stand for both layers' ops: their mean was compared
        places = [v for k, v in parts.shared.items() if k[0] == "row places"]
        assert any(len(distinct) > 1 for _, distinct in places)  # the two layers sit at different places


def test_the_op_part_of_the_key_is_the_key_s_own():
    model, parts, settings, _ = _rows(1, "none", None)
    for index, op in enumerate(model.graph.ops):
        space, owned = model.tables.configs[index], parts.owned[index]
        for recomputed in (False, True):
            whole = _sync_key(op, space, parts.tensors, owned, settings, recomputed=recomputed, executed=True,
                              digests={})
            split = _sync_key(op, space, parts.tensors, owned, settings, recomputed=recomputed, executed=True,
                              digests={}, op_key=_sync_op_key(op, space, parts.tensors, owned, {}))
            assert whole == split
