"""torchtitan's expert parallelism (issues 24 item 6, 25): the planner's ``ep`` rows that torchtitan 0.3.0
runs as priced export ``parallelism.expert_parallel_degree``; the others are refused in one line.

The fixture is ``qwen3_moe_tiny`` (2 MoE layers of E = 4 experts, top 2; hidden H = 128, expert FFN
F = 64: ``gate_up_proj`` ``[E, 2F, H]`` = ``[4, 128, 128]``, ``down_proj`` ``[E, H, F]`` = ``[4, 128, 64]``)
on 4 devices, batch 8, sequence 16. The numbers asserted are worked out by hand from torchtitan's
rules (``exporters/torchtitan/experts.py`` cites them): ``efsdp = dp_shard x cp x tp / ep``, each rank
holding ``E / ep`` experts sharded ``efsdp`` ways, a ring reduce-scatter of ``1 / ep`` of the bytes
over ``efsdp`` ranks.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest

from exporters import export, runnable_targets
from exporters.targets import runnable_targets_of
from exporters.torchtitan import parse_torchtitan_overrides, torchtitan_masks, torchtitan_violations
from exporters.torchtitan.experts import expert_parallel_refusal
from importers.transformer import analyze_transformer, moe_summary
from planner.core.errors import UnsupportedExport
from planner.core.settings import TrainingSettings
from planner.plan import PlanRequest, build_model, load_graph
from tests.exporters.graphs import first_rows, make_cluster, make_input, spaces_for

QWEN3_MOE = Path(__file__).resolve().parent / "data" / "qwen3_moe_tiny.onnx"
DIMS = {"batch": 8, "seq": 16}


@pytest.fixture(scope="module")
def graph():
    return load_graph(QWEN3_MOE, DIMS)


def _export(graph, settings: TrainingSettings, *, dp: int = 4, tp: int = 1) -> dict:
    spaces = spaces_for(graph, dp * tp)
    choice = first_rows(torchtitan_masks(graph, spaces, dp=dp, tp=tp))
    return export("torchtitan", make_input(graph, spaces, choice, cluster=make_cluster(1, dp * tp), settings=settings))


def test_ep_rows_export_the_expert_parallel_degree(graph):
    out = _export(graph, TrainingSettings(zero_stage=3, expert_parallel=2))
    # FSDP2 over the 4 ranks, ep = 2 of them per expert group; local batch 8 / 4 = 2; the standard all-to-all
    # dispatcher syncs with the host, so no CUDA graph (trainer.py's _validate_cuda_graphs)
    assert out["overrides"] == [
        "--parallelism.data_parallel_replicate_degree", "1", "--parallelism.data_parallel_shard_degree", "4",
        "--parallelism.tensor_parallel_degree", "1", "--parallelism.no_enable_sequence_parallel",
        "--parallelism.pipeline_parallel_degree", "1", "--parallelism.context_parallel_degree", "1",
        "--parallelism.expert_parallel_degree", "2", "--training.disable_cuda_graphs",
        "--training.local_batch_size", "2", "--training.global_batch_size", "8", "--training.seq_len", "16",
        "--training.mixed_precision_param", "bfloat16", "--compile.enable", "activation-checkpoint:none",
    ]
    assert out["degrees"] == {"dp": 4, "dp_replicate": 1, "dp_shard": 4, "tp": 1, "pp": 1, "cp": 1, "ep": 2,
                              "sequence_parallel": False}
    assert out["world_size"] == 4
    # every MoE export says its degree, 1 included (no preset's leaks in); CUDA graphs stay allowed at ep = 1 (priced so)
    plain = parse_torchtitan_overrides(_export(graph, TrainingSettings(zero_stage=3, cuda_graphs=True))["overrides"])
    assert plain["parallelism.expert_parallel_degree"] == 1 and not plain["training.disable_cuda_graphs"]
    whole = parse_torchtitan_overrides(_export(graph, TrainingSettings(zero_stage=3, expert_parallel=4))["overrides"])
    assert whole["parallelism.expert_parallel_degree"] == 4  # efsdp = 4 / 4 = 1: one whole expert per rank


@pytest.mark.parametrize(("settings", "dp", "tp", "message"), [
    (TrainingSettings(zero_stage=3, expert_parallel=2), 2, 2, "takes the tp=2 ranks first"),
    (TrainingSettings(zero_stage=0, expert_parallel=2), 4, 1, "ZeRO-0 runs dp as data_parallel_replicate_degree"),
    (TrainingSettings(zero_stage=3, expert_parallel=2, dp_shard=2), 4, 1, "over dp_replicate=2"),
    (TrainingSettings(zero_stage=3, expert_parallel=4), 2, 1, "ep=4 does not divide dp x cp = 2"),
])
def test_rows_torchtitan_runs_otherwise_are_refused(graph, settings, dp, tp, message):
    with pytest.raises(UnsupportedExport, match=message):
        _export(graph, settings, dp=dp, tp=tp)


def test_uneven_expert_shards_are_refused(graph):
    """FSDP2 pads an uneven shard (fsdp.py: ``Shard(0)`` of the local experts, ``Shard(1)`` when
    ``efsdp x ep`` exceeds the experts), which the planner does not price."""
    model, moe = analyze_transformer(graph), moe_summary(graph)
    settings = TrainingSettings(zero_stage=3, expert_parallel=2)
    # 12 experts, dp = 8: efsdp = 8 / 2 = 4, efsdp x ep = 8 <= 12, so dim 0: 6 local experts over 4 ranks
    twelve = dataclasses.replace(moe, num_experts=12)
    assert "6 local experts (of 12, ep=2) do not split evenly over efsdp=4" in expert_parallel_refusal(
        settings, twelve, model, dp=8, cp=1, tp=1)
    # 4 experts, dp = 6: efsdp = 3, efsdp x ep = 6 > 4, so dim 1: F = 64 is not a multiple of 3
    assert "expert FFN size (64) does not split evenly over efsdp=3" in expert_parallel_refusal(
        settings, moe, model, dp=6, cp=1, tp=1)
    # dp = 8: efsdp = 4, 8 > 4 experts, dim 1: F = 64 and H = 128 both split 4 ways
    assert expert_parallel_refusal(settings, moe, model, dp=8, cp=1, tp=1) is None
    assert "routes no token" in expert_parallel_refusal(settings, None, model, dp=4, cp=1, tp=1)


def test_torchtitans_own_rules_on_the_degree():
    base = ["--parallelism.data_parallel_shard_degree", "4", "--parallelism.no_enable_sequence_parallel"]
    assert torchtitan_violations([*base, "--parallelism.expert_parallel_degree", "2",
                                  "--training.disable_cuda_graphs"], world_size=4) == []
    # 3 does not divide dp_shard x cp x tp = 4: the sparse mesh (pp, dp_replicate, efsdp, ep) does not tile the world
    assert torchtitan_violations([*base, "--parallelism.expert_parallel_degree", "3",
                                  "--training.disable_cuda_graphs"], world_size=4) == [
        "expert_parallel_degree (3) must divide dp_shard x cp x tp (4), the ranks it borrows"]
    assert torchtitan_violations([*base, "--parallelism.expert_parallel_degree", "2"], world_size=4) == [
        "CUDA graphs do not support the standard expert-parallel token dispatcher: set --training.disable_cuda_graphs"]


def test_the_priced_expert_states_are_torchtitans(graph):
    """At ZeRO-3 the planner keeps the expert states sharded over the dp = 4 ranks whatever ep is; torchtitan
    holds E / ep experts sharded efsdp = 4 / ep ways: (E / ep) / (4 / ep) = E / 4 experts' worth per rank. The
    gradient sync runs over efsdp ranks on 1 / ep of the bytes: a ring's (n - 1) / n of it, so ep = 2 moves
    (1/2)(1/2) / (3/4) = 1/3 of the ep = 1 bytes and ep = 4 (efsdp = 1) none."""
    cluster = make_cluster(1, 4)
    expected = {"gate_up_proj": 4 * 128 * 128 // 4, "down_proj": 4 * 128 * 64 // 4}  # elements per rank
    sync = {}
    for ep in (1, 2, 4):
        settings = TrainingSettings(zero_stage=3, expert_parallel=ep)
        model = build_model(graph, PlanRequest(cluster=cluster, settings=settings))
        choice = first_rows(torchtitan_masks(graph, model.tables.configs, dp=4, tp=1))
        seen = 0
        for index, op in enumerate(graph.ops):
            weight = next((a.tensor for a in op.inputs if a.tensor.endswith(tuple(expected))), None)
            if weight is None:
                continue
            memory, row = model.op_details[index].memory, choice[index]
            elements = expected[weight.rsplit(".", 1)[1]]
            # bf16 parameter and gradient, fp32 master and Adam's two moments (4 + 4 + 4 bytes)
            assert (memory.params_bytes[row], memory.grads_bytes[row], memory.optimizer_bytes[row]) == (
                2 * elements, 2 * elements, 12 * elements), (ep, op.name)
            sync[ep, op.name] = sum(float(a[row]) for a in model.op_details[index].grad_sync_s.values())
            seen += 1
        assert seen == 4  # two layers, two expert products each
    for (ep, name), seconds in sync.items():
        assert seconds == pytest.approx({1: 1.0, 2: 1 / 3, 4: 0.0}[ep] * sync[1, name]), (ep, name)
        assert sync[1, name] > 0


def test_the_rules_answer_as_the_exporter(graph):
    """``TARGET.allows`` / ``stage_rule`` (exporters.torchtitan.rules) equal the exporter on the MoE rows."""
    rng = np.random.default_rng(24)
    for devices in (4, 8):
        cluster = make_cluster(1, devices)
        for settings in (TrainingSettings(zero_stage=3, expert_parallel=2),
                         TrainingSettings(zero_stage=3, expert_parallel=4),
                         TrainingSettings(zero_stage=0, expert_parallel=2),
                         TrainingSettings(zero_stage=3, expert_parallel=2, dp_shard=2)):
            spaces = build_model(graph, PlanRequest(cluster=cluster, settings=settings)).tables.configs
            choices = [first_rows(torchtitan_masks(graph, spaces, dp=dp, tp=devices // dp))
                       for dp in (devices, devices // 2)]
            choices += [tuple(int(rng.integers(s.size)) for s in spaces) for _ in range(3)]
            column = runnable_targets_of(graph, spaces, cluster, settings, choices)
            for choice, names in zip(choices, column):
                expected = runnable_targets(make_input(graph, spaces, choice, cluster=cluster, settings=settings))
                assert ("torchtitan" in names) == ("torchtitan" in expected), (devices, settings, choice)
    # the ZeRO-3 ep = 2 row at dp = 4 runs; at dp = 2 x tp = 2 it does not
    settings = TrainingSettings(zero_stage=3, expert_parallel=2)
    spaces = build_model(graph, PlanRequest(cluster=make_cluster(1, 4), settings=settings)).tables.configs
    rows = [first_rows(torchtitan_masks(graph, spaces, dp=dp, tp=4 // dp)) for dp in (4, 2)]
    column = runnable_targets_of(graph, spaces, make_cluster(1, 4), settings, rows)
    assert ["torchtitan" in names for names in column] == [True, False]
