"""The search lists ``dp x cp x tp`` plans (issue 24, long context; task h31c): a linear layer then splits its
batch, sequence and weight dims and the attention core its batch, query sequence and heads, 3 split dims, where the
search's spaces hold 2 (``PipelineCostCache.max_split_dims``); under a launcher that runs context parallelism, a long
sequence's ops also get those configurations of 3 (``ConfigOptions.context_dims``).

Oracles: the widened space against a filter of the unrestricted space of 3 split dims written here from the rule
(a batch dim, exactly one sequence dim, the rest inside a node, no copies across nodes); every point of the search
pinned to Megatron-LM's ``dp=2 x cp=2 x tp=2`` re-priced by ``planner.estimate`` to the bit; and a brute force over
every Megatron-LM layout of the stage's 8 devices (``dp x cp x tp`` with ``dp`` dividing the batch, ``cp`` as
Megatron-LM allows, with and without sequence parallelism), each priced by ``planner.estimate``, whose fastest is
``dp=2 x cp=2 x tp=2`` on the tiny Llama at 16,384 tokens: the search's fastest point is that one, at its seconds.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters._target import context_degrees
from objectives.cluster import make_cluster
from objectives.tables import launcher_options
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.degrees import Pins
from planner.estimate import estimate
from planner.launcher_options import context_split, pinned_options, pinned_rules
from planner.pipeline import PipelineCostCache, PipelineOptions, graph_loader
from planner.search.pipeline import search_pipeline

LLAMA = Path(__file__).resolve().parents[1] / "data" / "llama_tiny.onnx"
SEQ = 16384
DEVICES = 8
GLOBAL_BATCH = 2
FIXED = dict(pp=1, zero=1, recompute="none", mb=1)


def _cache(seq: int = SEQ, launchers=("megatron",)) -> PipelineCostCache:
    cluster = make_cluster("h100-sxm", devices=DEVICES, devices_per_node=DEVICES)
    return PipelineCostCache(graph_loader(LLAMA, {"seq": seq}), cluster=cluster, context=context_split(list(launchers)))


def _copies(space) -> list[int]:
    """Per row, the nodes its redundant copies cross (1: none; a heavy op has no copies)."""
    return [1] * space.size if space.inter_replicas is None else space.inter_replicas.tolist()


def _rule_rows(op, space, named) -> set[tuple]:
    """The configurations of ``space`` (unrestricted, 3 split dims) the rule keeps, row by row."""
    kept = set()
    for factors, inter, copies in zip(space.factors.tolist(), space.inter_factors.tolist(), _copies(space)):
        split = [f > 1 for f in factors]
        if sum(split) <= 2:
            kept.add((tuple(factors), tuple(inter), copies))
            continue
        sequence = [i for i, d in enumerate(op.dims) if not d.is_batch and d.kind == "parallel" and d.splittable
                    and (op.name, d.name) in named]
        if (any(split[i] for i, d in enumerate(op.dims) if d.is_batch) and sum(split[i] for i in sequence) == 1
                and copies == 1 and all(inter[i] == 1 for i, d in enumerate(op.dims)
                                        if not d.is_batch and i not in sequence)):
            kept.add((tuple(factors), tuple(inter), copies))
    return kept


def test_the_widened_space_is_the_rules_filter_of_the_unrestricted_one():
    """On 2 nodes of 8, 4 samples of 16,384 tokens, each op's space holds its configurations of at most 2 split dims and those
    of 3 the rule keeps, no other: the unrestricted space of 3, filtered row by row here. At 1,024 tokens (no cp) the
    cache adds none."""
    cache = _cache()
    named = cache.context_splits(4)
    graph = cache.graph(4)
    assert named and {graph.ops[graph.op_index(op)].dim(dim).size for op, dim in named} == {SEQ}
    assert _cache(1024).context_splits(4) == frozenset()
    wide = launcher_options(ConfigOptions(devices=16, devices_per_node=8, max_split_dims=2, context_dims=named))
    every = launcher_options(ConfigOptions(devices=16, devices_per_node=8, max_split_dims=3))
    widened = 0
    for op in graph.ops:
        space = enumerate_configs(op, wide)
        rows = set(zip(map(tuple, space.factors.tolist()), map(tuple, space.inter_factors.tolist()), _copies(space)))
        assert len(rows) == space.size
        assert rows == _rule_rows(op, enumerate_configs(op, every), named), op.name
        widened += int(np.count_nonzero((space.factors > 1).sum(axis=1) == 3))
    assert widened > 0


def test_each_searched_dp_cp_tp_point_reprices_to_the_bit():
    """The search over the default cache (2 split dims, widened), pinned to Megatron-LM's dp=2 x cp=2 x tp=2, lists
    points (before: none, the layout's masks found no configuration), and ``planner.estimate`` of each point's
    settings from a plain loader gives its seconds and bytes exactly."""
    cache = _cache(4096)
    pins = Pins(dp=2, cp=2, tp=2, pp=1, mb=1)
    result = search_pipeline(cache, options=pinned_options(PipelineOptions(global_batch=4), pins),
                             rules=pinned_rules("megatron", pins))
    assert len(result.points) >= 3
    loader = graph_loader(LLAMA, {"seq": 4096})
    for point in result.points:
        common = dict(cluster=cache.cluster, tp=2, cp=2, pp=1, micro_batch=1, global_batch=4, zero=point.zero_stage,
                      recompute=point.recompute, sequence_shard_saved=point.sequence_shard_saved,
                      fused_swiglu=point.fused_swiglu)
        priced = [(e.time_s, e.memory_bytes) for sp in (False, True)
                  if (e := estimate(loader, sequence_parallel=sp, **common)).valid]
        assert (point.time_s, point.memory_bytes) in priced, point.summary


def _oracle() -> list[tuple[float, int, int, int, bool]]:
    """Every Megatron-LM layout of the 8 devices at ZeRO-1, no recomputation, one sample a micro-batch, priced by
    ``planner.estimate``: ``(seconds, dp, cp, tp, sequence parallel)``, fastest first."""
    loader = graph_loader(LLAMA, {"seq": SEQ})
    cluster = make_cluster("h100-sxm", devices=DEVICES, devices_per_node=DEVICES)
    priced = []
    for dp in (d for d in range(1, DEVICES + 1) if DEVICES % d == 0 and GLOBAL_BATCH % d == 0):
        for cp in context_degrees(SEQ, DEVICES // dp):
            tp = DEVICES // dp // cp
            for sp in (False, True) if tp > 1 else (False,):
                found = estimate(loader, cluster=cluster, tp=tp, cp=cp, dp=dp, pp=1, micro_batch=1,
                                 global_batch=GLOBAL_BATCH, zero=1, recompute="none", sequence_parallel=sp,
                                 target="megatron")
                if found.valid:
                    priced.append((found.time_s, dp, cp, tp, sp))
    return sorted(priced)


def test_the_frontier_holds_the_brute_forces_fastest_dp_cp_tp_plan():
    """The brute force's fastest layout is dp=2 x cp=2 x tp=2 (ahead of dp=2 x tp=4, which the search found
    fastest before); Megatron-LM's search at the same settings finds it first, at its seconds to the bit."""
    oracle = _oracle()
    seconds, dp, cp, tp, _ = oracle[0]
    assert (dp, cp, tp) == (2, 2, 2)
    assert any(row[1:4] == (2, 1, 4) for row in oracle[1:])
    pins = Pins(**FIXED)
    result = search_pipeline(_cache(), options=pinned_options(PipelineOptions(global_batch=GLOBAL_BATCH), pins),
                             rules=pinned_rules("megatron", pins))
    assert min(point.time_s for point in result.points) == seconds  # no other layout prices these seconds


def test_a_saved_dp_cp_tp_row_reprices_and_exports(tmp_path):
    """A row of the launchable search pinned to dp=2 x cp=2 x tp=2, saved as the generic plan, prices again to its
    seconds and bytes exactly (``planner.repriced``: spaces that hold its 3 split dims; before, a KeyError on the
    first such op), and Megatron-LM's and torchtitan's exports carry the three degrees."""
    import json

    import exporters
    from planner.launchable import launch_frontier, row_plan_input
    from planner.plan import PlanRequest
    from planner.repriced import reprice_saved

    loader = graph_loader(LLAMA, {"seq": 4096})
    request = PlanRequest(cluster=make_cluster("h100-sxm", devices=DEVICES, devices_per_node=DEVICES), time_limit_s=1e6)
    frontier = launch_frontier(loader, request, options=PipelineOptions(global_batch=4), headroom=False, collapse=0.0,
                               pins=Pins(dp=2, cp=2, tp=2, cuda_graphs="off"), launchers=("megatron", "torchtitan"))
    assert frontier.rows
    for index, row in enumerate(frontier.rows):
        assert (row.degrees.dp, row.degrees.cp, row.degrees.tp) == (2, 2, 2)
        document = exporters.export("generic", row_plan_input(row))
        document["model"]["source_path"] = str(LLAMA)
        saved = tmp_path / f"row{index}.json"
        saved.write_text(json.dumps(document))
        again = reprice_saved(saved)
        assert (again.point.time_s, again.point.memory_bytes) == (row.time_s, row.memory_bytes), row.summary
        launcher = row.targets[0]
        out = exporters.export(launcher, row_plan_input(row))
        assert (out["degrees"]["dp"], out["degrees"]["cp"], out["degrees"]["tp"]) == (2, 2, 2), launcher


def test_a_weight_dim_as_long_as_the_sequence_keeps_the_ops_dp_cp_tp_rows():
    """The sequence dim is the one context parallelism names, not any dim of its length (h31r): the bundled Llama at
    2,816 tokens, its MLP width, on 16 devices (2 nodes of 8). Its up-projection then has a weight dim as long as the
    sequence; were that dim taken for a second sequence dim, no row of 3 split dims would be "exactly one sequence
    dim" and the op would lose its dp x cp x tp rows (it did: 32 of 171 ops at this length). Each op the cache names
    holds rows splitting its batch, its sequence and one more dim, as the same op does at 4,096 tokens."""
    llama = Path(__file__).resolve().parents[2] / "examples" / "llama.onnx"
    cluster = make_cluster("h100-sxm", devices=16, devices_per_node=8)
    for seq in (2816, 4096):
        cache = PipelineCostCache(graph_loader(llama, {"seq": seq}), cluster=cluster, context=context_split(["megatron"]))
        graph, named = cache.graph(2), cache.context_splits(2)
        wide = launcher_options(ConfigOptions(devices=16, devices_per_node=8, max_split_dims=2, context_dims=named))
        linears = [op for op in graph.ops if any((op.name, d.name) in named for d in op.dims)
                   and any(not d.is_batch and d.size == 2816 and (op.name, d.name) not in named for d in op.dims)]
        assert linears, seq  # the MLP's up/gate projections: a weight dim of 2,816
        for op in linears:
            space = enumerate_configs(op, wide)
            assert np.count_nonzero((space.factors > 1).sum(axis=1) == 3) > 0, (seq, op.name)


def test_ops_of_equal_sizes_get_the_space_of_their_own_sequence_dim():
    """Configuration spaces are kept by the ops' dim sizes (``planner.core.configs._ENUMERATED``): two ops of equal
    sizes whose named sequence dims differ (here one at ``m``, one at ``n``, one with none) must each get their own
    widened space, whichever is enumerated first, the same as each enumerated alone from an empty memo."""
    from planner.core import configs
    from planner.core.graph import IterDim, Op

    def op(name: str) -> Op:
        return Op(name=name, kind="matmul", op_type="MatMul", inputs=(), outputs=(), flops=0.0,
                  dims=(IterDim(name="b", size=8, is_batch=True), IterDim(name="m", size=4096),
                        IterDim(name="n", size=4096), IterDim(name="k", size=1024, kind="reduction")))

    ops = [op("seq_m"), op("seq_n"), op("none")]
    options = ConfigOptions(devices=8, devices_per_node=8, max_split_dims=2,
                            context_dims=frozenset({("seq_m", "m"), ("seq_n", "n")}))

    def rows(one: Op) -> set[tuple[int, ...]]:
        return set(map(tuple, enumerate_configs(one, options).factors.tolist()))

    alone = {}
    for one in ops:
        configs._ENUMERATED.clear()
        alone[one.name] = rows(one)
    assert alone["seq_m"] != alone["seq_n"] and alone["none"] < alone["seq_m"]  # each its own widening
    for order in (ops, ops[::-1]):
        configs._ENUMERATED.clear()
        assert {one.name: rows(one) for one in order} == alone
