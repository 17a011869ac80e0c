"""DeepSpeed-Ulysses context parallelism (issue 24 item 1, the third way cp runs): its families, the
all-to-all they are priced with, its refusals, its export and DeepSpeed's rules for it."""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest

from exporters import export
from exporters.deepspeed.rules import families
from exporters.deepspeed.ulysses import ulysses_degrees, ulysses_masks, ulysses_problem
from exporters.deepspeed.validate import deepspeed_violations
from importers import import_model
from objectives.cluster import make_cluster
from objectives.redistribution import redistribution
from objectives.tables import launcher_options
from planner.core.configs import ConfigOptions, enumerate_configs
from planner.core.degrees import Pins
from planner.core.errors import UnsupportedExport
from tests.exporters.test_context_parallel import tiny_llama

ROOT = Path(__file__).resolve().parents[2]
SEQ, BATCH, DEVICES = 4096, 4, 8
CORE = ("attention-score", "softmax", "attention-value")


@pytest.fixture(scope="module")
def llama():
    """The tiny Llama (2 layers, 8 heads, 4 K/V groups of head size 8) at 4,096 tokens on one node of 8."""
    return tiny_llama(SEQ, BATCH, DEVICES)


def _split(space, mask, names) -> set[tuple[int, ...]]:
    columns = [space.dim_names.index(n) for n in names]
    return {tuple(int(space.factors[row, c]) for c in columns) for row in np.flatnonzero(mask)}


def test_the_core_splits_heads_and_the_rest_the_sequence(llama):
    graph, spaces, model = llama
    dp, cp = 2, 4
    result = ulysses_masks(graph, spaces, dp=dp, cp=cp, devices_per_node=DEVICES)
    assert result.masks is not None, result.reason
    cores = 0
    for index, (op, space, mask) in enumerate(zip(graph.ops, spaces, result.masks)):
        role = model.roles[index]
        seq = [d.name for d in op.dims if not d.is_batch and model.classes.of[index][d.name] == model.seq_class]
        batch = [d.name for d in op.dims if d.is_batch]
        if role in CORE:
            # whole sequences (query and key) on every rank, cp of the heads each
            assert seq and _split(space, mask, seq) == {(1,) * len(seq)}, op.name
            heads = [d.name for d in op.dims if model.classes.of[index][d.name] not in (model.seq_class, None)
                     and not d.is_batch and d.kind == "parallel" and d.size in (model.num_attention_heads, model.num_query_groups)]
            assert heads and {int(np.prod(f)) for f in _split(space, mask, heads)} == {cp}, op.name
            cores += 1
        elif role in ("qkv", "out-proj", "fc1", "fc2", "norm"):
            assert _split(space, mask, seq[:1]) == {(cp,)}, op.name
        if batch:
            assert {int(np.prod(f)) for f in _split(space, mask, batch)} == {dp}, op.name
    assert cores == 3 * model.num_layers


def test_the_all_to_all_equals_the_hand_count(llama):
    """Per device, forward, the query's re-layout from a sequence split to a heads split receives
    all of its new tile but the 1/cp it already holds: (1 - 1/cp) x B/dp x heads/cp x seq x head_dim
    elements (Jacobs et al. 2023, section 3.1: an all-to-all of the local Q)."""
    graph, spaces, model = llama
    dp, cp = 2, 4
    result = ulysses_masks(graph, spaces, dp=dp, cp=cp, devices_per_node=DEVICES)
    cluster = make_cluster("a100-80gb", devices=DEVICES, devices_per_node=DEVICES)
    score_index = model.roles.index("attention-score")
    score = graph.ops[score_index]
    query = score.inputs[0]
    producer_index = next(i for i, op in enumerate(graph.ops) if any(a.tensor == query.tensor for a in op.outputs))
    producer = graph.ops[producer_index]
    moved = redistribution(
        graph.tensors[query.tensor].shape, 2, producer=producer, producer_space=spaces[producer_index],
        producer_access=next(a for a in producer.outputs if a.tensor == query.tensor),
        consumer=score, consumer_space=spaces[score_index], consumer_access=query, cluster=cluster,
    )
    u = np.flatnonzero(result.masks[producer_index])[0]
    v = np.flatnonzero(result.masks[score_index])[0]
    hand = (1 - 1 / cp) * (BATCH // dp) * (model.num_attention_heads // cp) * SEQ * model.head_dim
    assert float(moved.forward_elements[u, v]) == pytest.approx(hand)
    assert float(moved.backward_elements[u, v]) == pytest.approx(hand)  # the gradient goes back the same way


class _Model:
    """The sizes :func:`ulysses_problem` reads."""

    def __init__(self, heads: int, kv: int, seq: int) -> None:
        self.num_attention_heads, self.num_query_groups, self.seq_length = heads, kv, seq


def test_refusals_follow_deepspeeds_rules(llama):
    graph, spaces, model = llama
    assert ulysses_problem(model, 4) is None
    assert ulysses_problem(_Model(8, 3, 4096), 2) == "Ulysses sequence-parallel size 2 and the 3 KV heads must divide one another"
    assert ulysses_problem(_Model(8, 8, 4098), 4) == "Ulysses sequence-parallel size 4 must divide the sequence length 4098"
    assert ulysses_problem(_Model(8, 2, 4096), 8) is None  # 2 KV heads replicated 4 times (kv_replication_factor)
    with pytest.raises(UnsupportedExport, match="must divide the 8 attention heads"):
        ulysses_masks(graph, spaces, dp=1, cp=3, devices_per_node=DEVICES)
    # 8 ranks would keep 512 tokens each, below CP_MIN_TOKENS: not searched
    assert ulysses_degrees(model, 4) == [4] and ulysses_degrees(model, 8) == []


def test_mixture_of_experts_is_refused():
    graph = import_model(ROOT / "tests" / "data" / "mixtral_tiny.onnx", {"batch": 2, "seq": 16})
    options = launcher_options(ConfigOptions(devices=2, devices_per_node=2))
    with pytest.raises(UnsupportedExport, match="Mixture-of-Experts"):
        ulysses_masks(graph, [enumerate_configs(op, options) for op in graph.ops], dp=1, cp=2, devices_per_node=2)


def test_families_add_ulysses_beside_autotp(llama):
    graph, spaces, _ = llama
    found = {f.label: f for f in families(graph, spaces, devices=DEVICES, devices_per_node=DEVICES, pp=1)}
    ulysses = {label: f for label, f in found.items() if "ulysses" in label}
    assert {(f.dp, f.cp) for f in ulysses.values()} == {(1, 2), (2, 2), (4, 2), (1, 4), (2, 4)}
    assert all(f.tp == 1 for f in ulysses.values())
    # none with a pipeline
    assert not [f for f in families(graph, spaces, devices=4, devices_per_node=DEVICES, pp=2) if f.cp > 1]


def test_validator_applies_deepspeeds_sequence_parallel_rules():
    base = {"train_batch_size": 8, "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1}
    # 8 ranks, Ulysses over 2: DeepSpeedConfig checks the batch against 4 data-parallel ranks
    assert deepspeed_violations({**base, "sequence_parallel_size": 2}, world_size=8, num_attention_heads=8, num_kv_heads=4) == []
    problems = deepspeed_violations({**base, "sequence_parallel_size": 2}, world_size=16, num_attention_heads=6, num_kv_heads=4)
    assert "Attention head count 6 is not divisible by SP size 2" not in problems  # 6 % 2 == 0
    assert any("world size (8)" in p for p in problems)
    assert deepspeed_violations({**base, "sequence_parallel_size": 4}, world_size=16, num_attention_heads=6, num_kv_heads=4)[0] == (
        "Attention head count 6 is not divisible by SP size 4")
    assert deepspeed_violations({**base, "sequence_parallel_size": 0}, world_size=4)[0] == (
        "sequence_parallel_size must be a positive integer (got 0)")


def test_the_pinned_frontier_exports_every_row():
    """Ulysses at cp = 2 on 8 devices: the rows are DeepSpeed's (ZeRO-3 included, which AutoTP's tp
    would refuse) and each exports with ``sequence_parallel_size`` and the ALST setup."""
    from planner.launchable import launch_frontier, row_plan_input
    from planner.pipeline import PipelineOptions, graph_loader
    from planner.plan import PlanRequest

    loader = graph_loader(ROOT / "tests" / "data" / "llama_tiny.onnx", {"seq": SEQ})
    request = PlanRequest(cluster=make_cluster("a100-80gb", devices=DEVICES, devices_per_node=DEVICES))
    found = launch_frontier(loader, request, options=PipelineOptions(global_batch=BATCH), launchers=("deepspeed",),
                            pins=Pins(cp=2))
    assert found.rows and any(row.point.zero_stage == 3 for row in found.rows)
    for row in found.rows:
        assert row.degrees.cp == 2 and row.degrees.tp == 1 and "ulysses" in row.layout
        out = export("deepspeed", row_plan_input(row))
        assert out["degrees"] == {"dp": row.degrees.dp, "cp": 2, "tp": 1, "pp": 1}
        assert out["ds_config"]["sequence_parallel_size"] == 2
        # the gradients reduce in bf16 as priced, not in the key's fp32 default (twice the bytes)
        assert row_plan_input(row).settings.precision == "bf16-mixed"
        assert out["ds_config"]["seq_parallel_communication_data_type"] == "bf16"
        assert "register_with_transformers" in out["ulysses"]["code"]
        # the batch counts the data-parallel ranks only (world / cp)
        config = out["ds_config"]
        assert config["train_batch_size"] == config["train_micro_batch_size_per_gpu"] * config["gradient_accumulation_steps"] * row.degrees.dp
